"""The GPU lane, kernels: every public launcher on CUDA tensors against its PyTorch reference, at the
shapes of the models the library serves (DeepSeek-V2-Lite, DeepSeek-V3, Llama-3-8B). The tolerances
are the CPU tests' (the interpreter's): the contracts the kernels state, now held by the compiled code.

``python -m pytest -m gpu`` (docs/testing.md); without a GPU every test here is skipped.
"""

import gc
import math

import pytest
import torch
from tritonwarm.kernels.activation import silu_and_mul_reference
from tritonwarm.kernels.fp4 import (
    mxfp4_dequantize_reference,
    mxfp4_quantize_reference,
    nvfp4_dequantize_reference,
    nvfp4_quantize_reference,
)
from tritonwarm.kernels.fused_moe import fused_moe_mxfp4_reference, fused_moe_nvfp4_reference, fused_moe_reference
from tritonwarm.kernels.kv_block_zero import kv_block_zero_reference
from tritonwarm.kernels.mla_kv_quant import mla_kv_write_reference, quantized_mla_decode_attention_reference
from tritonwarm.kernels.mla_metadata import mla_decode_metadata_reference
from tritonwarm.kernels.moe_align import moe_align_block_size_reference
from tritonwarm.kernels.moe_routing import moe_topk_routing_reference
from tritonwarm.kernels.paged_attention import paged_decode_attention_reference
from tritonwarm.kernels.rms_norm import rms_norm_reference
from tritonwarm.kernels.rotary import rotary_embedding_reference
from tritonwarm.launchers import (
    KVCacheLayout,
    QuantizedMLALayout,
    fused_moe,
    fused_moe_mxfp4,
    fused_moe_nvfp4,
    kv_block_zero,
    kv_format,
    mla_decode_metadata,
    mla_kv_cache_write,
    moe_align_block_size,
    moe_topk_routing,
    mxfp4_dequantize,
    mxfp4_quantize,
    nvfp4_dequantize,
    nvfp4_quantize,
    paged_decode_attention,
    paged_decode_metadata,
    quantized_mla_decode_attention,
    quantized_mla_decode_metadata,
    rms_norm,
    rotary_embedding,
    silu_and_mul,
)
from tritonwarm.launchers.mla_metadata import split_overhead_blocks

pytestmark = pytest.mark.gpu
CUDA = "cuda"
BF16 = torch.bfloat16
TOKENS = (1, 61, 1024)  # a decode step, an odd batch, a prefill chunk

# The geometry each launcher sees in each model (config.json of each).
V2_LITE = dict(hidden=2048, heads=16, rank=512, rope=64, nope=128, experts=64, top_k=6, moe_inter=1408,
               dense_inter=10944, shared_inter=2 * 1408, routing=("softmax", False, None, None, False))
V3 = dict(hidden=7168, heads=128, rank=512, rope=64, nope=128, experts=256, top_k=8, moe_inter=2048,
          dense_inter=18432, shared_inter=2048, routing=("sigmoid", True, 8, 4, True))
LLAMA3_8B = dict(hidden=4096, heads=32, kv_heads=8, head_dim=128, inter=14336)
DEEPSEEK = {"deepseek-v2-lite": V2_LITE, "deepseek-v3": V3}


@pytest.fixture(autouse=True)
def _give_memory_back():
    """DeepSeek-V3's experts are 22 GiB in bf16: each test's tensors go back to the device before the
    next test (and the engine processes of the lane) allocate."""
    yield
    gc.collect()
    torch.cuda.empty_cache()


def rand(*shape, seed, dtype=BF16, scale=1.0):
    g = torch.Generator(device=CUDA).manual_seed(seed)
    return (torch.randn(*shape, generator=g, device=CUDA) * scale).to(dtype)


def exact(got, want):
    torch.testing.assert_close(got, want, atol=0, rtol=0)


# ----------------------------------------------------------------------------- per-token ops


@pytest.mark.parametrize("hidden", [2048, 7168, 4096, 512], ids=["v2-lite", "v3", "llama3-8b", "mla-latent"])
@pytest.mark.parametrize("tokens", TOKENS)
def test_rms_norm(hidden, tokens):
    x, w, residual = rand(tokens, hidden, seed=1), rand(hidden, seed=2), rand(tokens, hidden, seed=3)
    torch.testing.assert_close(rms_norm(x, w, 1e-6), rms_norm_reference(x, w, 1e-6), atol=1.6e-2, rtol=1.6e-2)
    want_out, want_residual = rms_norm_reference(x, w, 1e-6, residual.clone())
    out, got_residual = rms_norm(x, w, 1e-6, residual)
    exact(got_residual, want_residual)  # x + residual in fp32, rounded once on both sides
    torch.testing.assert_close(out, want_out, atol=1.6e-2, rtol=1.6e-2)


@pytest.mark.parametrize("width", [1408, 2816, 10944, 18432, 14336],
                         ids=["v2-lite-expert", "v2-lite-shared", "v2-lite-dense", "v3-dense", "llama3-8b"])
@pytest.mark.parametrize("tokens", TOKENS)
def test_silu_and_mul(width, tokens):
    x = rand(tokens, 2 * width, seed=4)
    torch.testing.assert_close(silu_and_mul(x), silu_and_mul_reference(x), atol=1e-5, rtol=2**-7)


@pytest.mark.parametrize("tokens", TOKENS)
def test_rotary_embedding_deepseek(tokens):
    """MLA's rotated part: the last 64 dims of each 192-wide query head and the shared k_pe, both views
    into wider tensors (as the engine passes them), interleaved pairs."""
    heads, nope, rope, rank = 16, 128, 64, 512
    positions = torch.randint(0, 4096, (tokens,), device=CUDA)
    q = rand(tokens, heads, nope + rope, seed=5)
    kv_a = rand(tokens, rank + rope, seed=6)
    cache = _cos_sin(4096, rope)
    want_q, want_k = rotary_embedding_reference(positions, q[..., nope:], kv_a[:, None, rank:], cache, False)
    got_q, got_k = rotary_embedding(positions, q[..., nope:], kv_a[:, None, rank:], cache, False)
    exact(got_q, want_q)
    exact(got_k, want_k)


@pytest.mark.parametrize("tokens", TOKENS)
def test_rotary_embedding_llama(tokens):
    m = LLAMA3_8B
    positions = torch.randint(0, 8192, (tokens,), device=CUDA)
    q, k = rand(tokens, m["heads"], m["head_dim"], seed=7), rand(tokens, m["kv_heads"], m["head_dim"], seed=8)
    cache = _cos_sin(8192, m["head_dim"], theta=500000.0)
    want = rotary_embedding_reference(positions, q, k, cache, True)
    got = rotary_embedding(positions, q.clone(), k.clone(), cache, True)
    exact(got[0], want[0])
    exact(got[1], want[1])


def _cos_sin(positions, rot_dim, theta=10000.0):
    inv_freq = 1.0 / theta ** (torch.arange(0, rot_dim, 2, dtype=torch.float32, device=CUDA) / rot_dim)
    angles = torch.outer(torch.arange(positions, dtype=torch.float32, device=CUDA), inv_freq)
    return torch.cat([angles.cos(), angles.sin()], dim=-1)


# ----------------------------------------------------------------------------- MoE


@pytest.mark.parametrize("model", DEEPSEEK)
@pytest.mark.parametrize("tokens", TOKENS)
def test_moe_topk_routing(model, tokens):
    m = DEEPSEEK[model]
    scoring, renormalize, groups, topk_group, has_bias = m["routing"]
    logits = rand(tokens, m["experts"], seed=9)
    bias = rand(m["experts"], seed=10, dtype=torch.float32, scale=0.1) if has_bias else None
    args = (logits, m["top_k"], scoring, renormalize, groups, topk_group, bias)
    weights, ids = moe_topk_routing(*args)
    want_weights, want_ids = moe_topk_routing_reference(*args)
    exact(ids, want_ids)
    torch.testing.assert_close(weights, want_weights, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("model", DEEPSEEK)
@pytest.mark.parametrize("tokens", (*TOKENS, 16384))
@pytest.mark.parametrize("block_size", [16, 64])
def test_moe_align_block_size(model, tokens, block_size):
    m = DEEPSEEK[model]
    g = torch.Generator(device=CUDA).manual_seed(11)
    ids = torch.rand(tokens, m["experts"], generator=g, device=CUDA).topk(m["top_k"], dim=-1).indices.int()
    for got, want in zip(moe_align_block_size(ids, m["experts"], block_size),
                         moe_align_block_size_reference(ids, m["experts"], block_size), strict=True):
        exact(got, want)


def _moe_inputs(m, tokens, seed):
    hidden, inter, experts = m["hidden"], m["moe_inter"], m["experts"]
    x = rand(tokens, hidden, seed=seed)
    w_gate_up = rand(experts, 2 * inter, hidden, seed=seed + 1, scale=hidden**-0.5)
    w_down = rand(experts, hidden, inter, seed=seed + 2, scale=inter**-0.5)
    g = torch.Generator(device=CUDA).manual_seed(seed + 3)
    ids = torch.rand(tokens, experts, generator=g, device=CUDA).topk(m["top_k"], dim=-1).indices.int()
    weights = torch.rand(tokens, m["top_k"], generator=g, device=CUDA)
    return x, w_gate_up, w_down, weights, ids


def _moe_close(got, want):
    # the fp32 sums run in another order: the bf16 activation between the GEMMs can differ by an ulp
    assert got.shape == want.shape and got.dtype == want.dtype
    torch.testing.assert_close(got.float(), want.float(), atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("model", DEEPSEEK)
@pytest.mark.parametrize("tokens", TOKENS)
def test_fused_moe(model, tokens):
    inputs = _moe_inputs(DEEPSEEK[model], tokens, seed=12)
    _moe_close(fused_moe(*inputs), fused_moe_reference(*inputs))


def _quantized_experts(w, fmt):
    """Each expert's weight in MXFP4, or NVFP4 with its own global scale (as checkpoints store them)."""
    if fmt == "mxfp4":
        return mxfp4_quantize(w)
    global_scales = (448.0 * 6.0 / w.float().abs().amax(dim=(1, 2))).float()
    pairs = [nvfp4_quantize(w[e], global_scales[e]) for e in range(w.shape[0])]
    return torch.stack([p for p, _ in pairs]), torch.stack([s for _, s in pairs]), global_scales


@pytest.mark.parametrize("model", DEEPSEEK)
@pytest.mark.parametrize("fmt", ["mxfp4", "nvfp4"])
@pytest.mark.parametrize("tokens", TOKENS)
def test_fused_moe_fp4(model, fmt, tokens):
    x, w_gate_up, w_down, weights, ids = _moe_inputs(DEEPSEEK[model], tokens, seed=13)
    inputs = (x, *_quantized_experts(w_gate_up, fmt), *_quantized_experts(w_down, fmt), weights, ids)
    del w_gate_up, w_down
    if fmt == "mxfp4":
        _moe_close(fused_moe_mxfp4(*inputs), fused_moe_mxfp4_reference(*inputs))
    else:
        _moe_close(fused_moe_nvfp4(*inputs), fused_moe_nvfp4_reference(*inputs))


@pytest.mark.parametrize("model", DEEPSEEK)
def test_fp4_quantize_and_dequantize_expert_weights(model):
    """One expert's gate/up weight (rows N = 2 * intermediate, K = hidden), bit-exact both ways."""
    m = DEEPSEEK[model]
    w = rand(2 * m["moe_inter"], m["hidden"], seed=14, scale=m["hidden"] ** -0.5)
    packed, scales = mxfp4_quantize(w)
    want_packed, want_scales = mxfp4_quantize_reference(w)
    exact(packed, want_packed)
    exact(scales, want_scales)
    exact(mxfp4_dequantize(packed, scales, BF16), mxfp4_dequantize_reference(packed, scales, BF16))
    global_scale = (448.0 * 6.0 / w.float().abs().amax()).float().reshape(1)
    packed, scales = nvfp4_quantize(w, global_scale)
    want_packed, want_scales = nvfp4_quantize_reference(w, global_scale)
    exact(packed, want_packed)
    exact(scales.view(torch.uint8), want_scales.view(torch.uint8))
    # exact on a GPU, which rounds fp32 -> bf16 to nearest even (the interpreter's CPU tests allow an ulp)
    exact(nvfp4_dequantize(packed, scales, global_scale, BF16), nvfp4_dequantize_reference(packed, scales, global_scale,
                                                                                            BF16))


# ----------------------------------------------------------------------------- attention and the KV cache


def _paged(layout, seq_lens, seed):
    """A cache of random entries and a block table giving each request distinct shuffled blocks."""
    g = torch.Generator(device=CUDA).manual_seed(seed)
    blocks = [-(-n // layout.block_size) for n in seq_lens]
    width = max(blocks) + 1
    order = torch.randperm(layout.num_blocks, generator=g, device=CUDA).int()
    table = torch.zeros(len(seq_lens), width, dtype=torch.int32, device=CUDA)
    used = 0
    for request, n in enumerate(blocks):
        table[request, :n] = order[used:used + n]
        used += n
    return table, torch.tensor(seq_lens, dtype=torch.int32, device=CUDA)


SEQ_LENS = {"batch 1": [4096], "batch 64": [(97 * i) % 4000 + 1 for i in range(64)]}


@pytest.mark.parametrize("batch", SEQ_LENS)
def test_paged_decode_attention_gqa_llama(batch):
    m, seq_lens = LLAMA3_8B, SEQ_LENS[batch]
    layout = KVCacheLayout.gqa(sum(-(-n // 16) for n in seq_lens) + 4, 16, m["kv_heads"], m["head_dim"])
    cache = rand(*layout.shape, seed=15)
    table, lens = _paged(layout, seq_lens, seed=16)
    q = rand(len(seq_lens), m["heads"], m["head_dim"], seed=17)
    scale = 1 / math.sqrt(m["head_dim"])
    metadata = paged_decode_metadata(lens, table, m["heads"], m["kv_heads"], m["head_dim"], 16)
    got = paged_decode_attention(q, cache, table, lens, scale, metadata)
    torch.testing.assert_close(got, paged_decode_attention_reference(q, cache, table, lens, scale, layout),
                               atol=1.6e-2, rtol=1.6e-2)


@pytest.mark.parametrize("heads", [16, 128, 40], ids=["v2-lite", "v3", "v3-tp-40-heads"])
@pytest.mark.parametrize("batch", SEQ_LENS)
def test_paged_decode_attention_mla(heads, batch):
    """The latent cache ``[latent 512 | rope 64]`` with 64-token blocks, the value its first 512 dims;
    128 heads take two head tiles."""
    seq_lens = SEQ_LENS[batch]
    layout = KVCacheLayout.mla(sum(-(-n // 64) for n in seq_lens) + 4, 64, 512, 64)
    cache = rand(*layout.shape, seed=18)
    table, lens = _paged(layout, seq_lens, seed=19)
    q = rand(len(seq_lens), heads, 576, seed=20, scale=0.1)
    scale = 1 / math.sqrt(192)
    metadata = paged_decode_metadata(lens, table, heads, 1, 576, 64)
    got = paged_decode_attention(q, cache, table, lens, scale, metadata, 512)
    torch.testing.assert_close(got, paged_decode_attention_reference(q, cache, table, lens, scale, layout),
                               atol=1.6e-2, rtol=1.6e-2)


@pytest.mark.parametrize("batch", SEQ_LENS)
def test_mla_decode_metadata(batch):
    lens = torch.tensor(SEQ_LENS[batch], dtype=torch.int32, device=CUDA)
    parts = torch.cuda.get_device_properties(0).multi_processor_count
    got = mla_decode_metadata(lens, 16, 64, parts)
    want = mla_decode_metadata_reference(lens, parts, 64, split_overhead_blocks(64))
    exact(got[0], want[0].to(got[0].device))
    exact(got[1], want[1].to(got[1].device))


@pytest.mark.parametrize("kv_cache_dtype", ["fp8_ds_mla", "nvfp4_ds_mla"])
@pytest.mark.parametrize("heads", [16, 128], ids=["v2-lite", "v3"])
@pytest.mark.parametrize("batch", SEQ_LENS)
def test_quantized_mla_kv_cache(kv_cache_dtype, heads, batch):
    """The cache write bit-exact against its reference, then decode attention over what it wrote."""
    seq_lens = SEQ_LENS[batch]
    fmt = kv_format(kv_cache_dtype, 512, 64)
    layout = QuantizedMLALayout(fmt, sum(-(-n // 64) for n in seq_lens) + 4, 64)
    table, lens = _paged(layout, seq_lens, seed=21)
    slots = torch.cat([table[r, torch.arange(n, device=CUDA) // 64].long() * 64 + torch.arange(n, device=CUDA) % 64
                       for r, n in enumerate(seq_lens)])
    latent, rope = rand(slots.numel(), 512, seed=22, scale=2.0), rand(slots.numel(), 64, seed=23)
    cache, want_cache = layout.allocate(CUDA), layout.allocate(CUDA)
    mla_kv_cache_write(cache, slots, latent, rope, kv_cache_dtype)
    mla_kv_write_reference(want_cache, fmt, slots, latent, rope)
    exact(cache, want_cache)
    q = rand(len(seq_lens), heads, 576, seed=24, scale=0.1)
    metadata = quantized_mla_decode_metadata(lens, table, heads, 64, kv_cache_dtype)
    got = quantized_mla_decode_attention(q, cache, table, lens, 0.07, kv_cache_dtype, 512, metadata)
    want = quantized_mla_decode_attention_reference(q, cache, table, lens, 0.07, fmt)
    torch.testing.assert_close(got, want, atol=1.6e-2, rtol=1.6e-2)


def test_kv_block_zero_on_the_engines_cache():
    """DeepSeek-V2-Lite's engine cache: every layer's block ``b`` one contiguous range."""
    cache = rand(64, 27, 64, 1, 576, seed=25)
    ids = torch.tensor([3, 17, -1, 63, 0], dtype=torch.int32, device=CUDA)
    want = kv_block_zero_reference(cache.clone(), ids)
    kv_block_zero(cache, ids)
    exact(cache, want)
