"""Quantized DS-MLA KV caches (fp8_ds_mla, nvfp4_ds_mla): byte layouts, the write kernel bit for bit
against references built on torch's float8_e4m3fn and an independent E2M1 table, the in-register
dequantization bit for bit, decode attention within tolerance, block zeroing on the real layouts,
custom ops, warm-up spec rows and their runtime keys."""

from pathlib import Path

import pytest
import torch
import triton
import triton.language as tl
from tritonwarm.jit import TARGETS, JitKernel, Launch
from tritonwarm.jit.core.kernel import fake_launches
from tritonwarm.jit.core.specialization import cpu_twin
from tritonwarm.jit.core.trace import Capture
from tritonwarm.jit.pipeline.specs import load_specs
from tritonwarm.kernels.fp4 import _unpack_reference, nvfp4_quantize_reference
from tritonwarm.kernels.mla_kv_quant import (
    _dequantized_latent,
    _entry_fields,
    _key_f16,
    mla_kv_dequantize_reference,
    mla_kv_quantize_reference,
    mla_kv_write_reference,
    quantized_mla_decode_attention_reference,
)
from tritonwarm.launchers.kv_block_zero import kv_block_zero
from tritonwarm.launchers.kv_cache_formats import (
    KV_CACHE_DTYPES,
    QUANTIZED_DS_MLA_FORMATS,
    QuantizedMLALayout,
    kv_bytes_per_token,
    kv_format,
)
from tritonwarm.launchers.mla_kv_quant import (
    mla_kv_cache_write,
    quantized_mla_decode_attention,
    quantized_mla_decode_metadata,
)

SPEC_DIR = Path(__file__).resolve().parents[1] / "warmup_specs"
FORMATS = list(QUANTIZED_DS_MLA_FORMATS)
SMALL = dict(kv_lora_rank=128, rope_dim=16)  # the smallest latent fp8_ds_mla tiles: one 128-value tile
E2M1_TABLE = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


# --------------------------------------------------------------------------- layouts


def test_deepseek_byte_layouts_and_bytes_per_token():
    fp8, nvfp4 = kv_format("fp8_ds_mla"), kv_format("nvfp4_ds_mla")
    assert fp8.fields() == {"latent": (0, 512), "scales": (512, 528), "rope": (528, 656)}
    assert fp8.entry_bytes == 656 and fp8.scale_group == 128
    assert nvfp4.fields() == {"latent": (0, 256), "scales": (256, 288), "rope": (288, 416),
                              "global_scale": (416, 420), "padding": (420, 432)}
    assert nvfp4.entry_bytes == 432 and nvfp4.scale_group == 16
    assert kv_bytes_per_token("auto", 512, 64, torch.bfloat16) == 1152
    assert [kv_bytes_per_token(f, 512, 64, torch.bfloat16) for f in FORMATS] == [656, 432]
    assert KV_CACHE_DTYPES == ("auto", "fp8_ds_mla", "nvfp4_ds_mla")


@pytest.mark.parametrize("name", FORMATS)
@pytest.mark.parametrize("rank, rope", [(512, 64), (128, 16), (256, 64)])
def test_fields_tile_the_entry_in_16_byte_rows(name, rank, rope):
    fmt = kv_format(name, rank, rope)
    ranges = sorted(fmt.fields().values())
    assert ranges[0][0] == 0 and ranges[-1][1] == fmt.entry_bytes and fmt.entry_bytes % 16 == 0
    assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:], strict=False))  # no gap, no overlap
    fields = fmt.fields()  # each field aligned for its element type (fp32 scales, bf16 rope, fp32 global scale)
    assert fields["scales"][0] % (4 if name == "fp8_ds_mla" else 1) == 0 and fields["rope"][0] % 2 == 0
    assert fields.get("global_scale", (0, 0))[0] % 4 == 0


@pytest.mark.parametrize("name, rank, rope, words", [
    ("fp8_ds_mla", 32, 16, "fp8_ds_mla needs kv_lora_rank a power of two of at least 128, got 32"),
    ("nvfp4_ds_mla", 384, 64, "power of two of at least 16, got 384"),
    ("nvfp4_ds_mla", 512, 7, "even, positive rope_dim, got 7"),
    ("int4", 512, 64, "unknown quantized MLA KV cache format 'int4'"),
])
def test_bad_geometry_is_named(name, rank, rope, words):
    with pytest.raises(ValueError, match=words):
        kv_format(name, rank, rope)


# --------------------------------------------------------------------------- write, bit for bit


def _write(name, latent, rope, block_size=4):
    fmt = kv_format(name, latent.shape[1], rope.shape[1])
    layout = QuantizedMLALayout(fmt, -(-latent.shape[0] // block_size) + 1, block_size)
    cache = layout.allocate()
    slots = torch.arange(latent.shape[0]) + block_size  # block 0 stays untouched
    mla_kv_cache_write(cache, slots, latent, rope, name)
    entries = cache.view(-1, fmt.entry_bytes)[block_size:block_size + latent.shape[0]]
    assert not cache[0].any()
    return fmt, entries


def _special_latent(rank):
    """Rows that probe the rules: ties, saturation, subnormals, signed zeros, zero and non-finite tiles."""
    g = torch.Generator().manual_seed(7)
    rows = [torch.randn(rank, generator=g) * 10.0 ** float(e) for e in (-30, -3, 0, 2, 30)]
    ties = torch.randn(rank, generator=g)
    ties[:8] = torch.tensor([448.0, 1.0625, 1.1875, -1.0625, 2.0**-10, 3 * 2.0**-10, -2.0**-11, -0.0])
    rows.append(ties)  # amax 448: scale 1, these are E4M3 midpoints
    rows.append(torch.zeros(rank))
    signed_zeros = torch.zeros(rank)
    signed_zeros[::2] = -0.0
    signed_zeros[5] = -1e-30  # rounds to zero: no negative zero code
    signed_zeros[9] = 3.0
    rows.append(signed_zeros)
    for bad in (float("inf"), float("-inf"), float("nan")):
        row = torch.randn(rank, generator=g)
        row[rank - 3] = bad
        rows.append(row)
    return torch.stack(rows)


@pytest.mark.parametrize("name", FORMATS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_write_matches_the_reference_bit_for_bit(name, dtype):
    latent = _special_latent(SMALL["kv_lora_rank"]).to(dtype)
    rope = torch.randn(latent.shape[0], SMALL["rope_dim"]).to(dtype)
    rope[0, :3] = torch.tensor([float("nan"), -0.0, 1.00390625])  # bf16 tie: 1 + 2**-8 -> 1.0
    fmt, entries = _write(name, latent, rope)
    expected = mla_kv_quantize_reference(latent, rope, fmt)
    assert torch.equal(entries, expected), (entries != expected).nonzero()[:5]
    start, stop = fmt.fields()["rope"]
    stored = entries[:, start:stop].contiguous().view(torch.int16)
    assert stored[0, 0] == 0x7FC0 and stored[0, 1] == -0x8000 and stored[0, 2] == 0x3F80  # NaN, -0.0, 1.0
    assert torch.equal(stored[1:], rope[1:].float().to(torch.bfloat16).view(torch.int16))


def test_fp8_codes_are_torch_float8_with_saturation_and_no_negative_zero():
    latent = _special_latent(128)
    fmt, entries = _write("fp8_ds_mla", latent, torch.zeros(latent.shape[0], 16))
    codes, scales = entries[:, :128], entries[:, 128:132].contiguous().view(torch.float32)[:, 0]
    finite = torch.isfinite(latent).all(dim=1)
    amax = latent.abs().amax(dim=1)
    assert torch.equal(scales[finite], amax[finite] / torch.full_like(amax[finite], 448.0))
    assert scales[~finite].isnan().all() and not codes[~finite].any()  # a non-finite tile: NaN scale, codes 0
    inverse = torch.where(scales == 0, 0.0, 1.0 / scales)
    torch_codes = (latent * inverse[:, None]).clamp(-448, 448).to(torch.float8_e4m3fn).view(torch.uint8)
    torch_codes = torch.where(torch_codes == 0x80, 0, torch_codes)
    assert torch.equal(codes[finite], torch_codes[finite])
    assert not (codes == 0x80).any()
    ties = codes[5, :8].tolist()  # the midpoints row: scale exactly 1
    assert ties == [0x7E, 0x38, 0x3A, 0xB8, 0x00, 0x02, 0x00, 0x00]  # 448, 1.0, 1.25, -1.0, 0, 2**-8, 0, 0


def _nearest_e2m1_code(value: float) -> int:
    """Independent E2M1 rounding: the nearest table value, a tie to the even code; sign only if nonzero."""
    magnitude = min(abs(value), 6.0)
    distances = [abs(magnitude - v) for v in E2M1_TABLE]
    best = min(distances)
    code = min(i for i, d in enumerate(distances) if d == best and (distances.count(best) == 1 or i % 2 == 0))
    return code | (8 if value < 0 and code else 0)


def test_nvfp4_codes_follow_the_library_rule_and_an_independent_e2m1_table():
    g = torch.Generator().manual_seed(3)
    latent = torch.randn(4, 128, generator=g) * torch.pow(2.0, torch.randint(-8, 9, (4, 8, 1), generator=g)
                                                           .float()).repeat_interleave(16, dim=1).squeeze(-1)
    latent[0, :16] = torch.tensor([6, -0.25, 0.75, 1.25, -1.75, 2.5, 3.5, 5, 0, -0.0, 1e-20, 4, 3, 2, 1, 0.5])
    fmt, entries = _write("nvfp4_ds_mla", latent, torch.zeros(4, 16))
    packed, scale_codes = entries[:, :64], entries[:, 64:72]
    gs = entries[:, 104:108].contiguous().view(torch.float32)[:, 0]
    amax = latent.abs().amax(dim=1)
    assert torch.equal(gs, torch.full_like(amax, 2688.0) / amax)
    for row in range(4):  # the library's NVFP4 recipe with this token's global scale: the same bytes
        ref_packed, ref_scales = nvfp4_quantize_reference(latent[row:row + 1], gs[row])
        assert torch.equal(packed[row:row + 1], ref_packed) and torch.equal(scale_codes[row:row + 1],
                                                                              ref_scales.view(torch.uint8))
    codes = torch.stack([packed & 0xF, packed >> 4], dim=-1).flatten(1)
    block_scale = scale_codes.view(torch.float8_e4m3fn).float()
    out_scale = 1.0 / (block_scale * (1.0 / gs)[:, None])
    scaled = latent * out_scale.repeat_interleave(16, dim=1)
    expected = torch.tensor([[_nearest_e2m1_code(v) for v in row] for row in scaled.tolist()], dtype=torch.uint8)
    assert torch.equal(codes, expected)
    assert not (codes == 8).any()


@pytest.mark.parametrize("name", FORMATS)
def test_zero_tokens_write_all_zero_bytes_and_dequantize_to_zero(name):
    fmt, entries = _write(name, torch.zeros(2, 128), torch.zeros(2, 16))
    assert not entries.any()
    assert torch.equal(mla_kv_dequantize_reference(entries, fmt), torch.zeros(2, 144))


@triton.jit
def _dequantize_kernel(cache_ptr, out_ptr, n_tokens, KV_FORMAT: tl.constexpr, ENTRY_BYTES: tl.constexpr,
                       LATENT_DIM: tl.constexpr, SCALE_GROUP: tl.constexpr, SCALE_OFFSET: tl.constexpr,
                       GLOBAL_SCALE_OFFSET: tl.constexpr, BLOCK_N: tl.constexpr):
    n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = n < n_tokens
    values = _dequantized_latent(cache_ptr + n.to(tl.int64) * ENTRY_BYTES, mask, KV_FORMAT, LATENT_DIM, SCALE_GROUP,
                                 SCALE_OFFSET, GLOBAL_SCALE_OFFSET, BLOCK_N)
    tl.store(out_ptr + n[:, None] * LATENT_DIM + tl.arange(0, LATENT_DIM)[None, :], values, mask=mask[:, None])


_dequantize = JitKernel(_dequantize_kernel, lambda entries, out, fmt: Launch(
    grid=(triton.cdiv(entries.shape[0], 16),), args=(entries, out, entries.shape[0]),
    constexprs=dict(KV_FORMAT=fmt.name, ENTRY_BYTES=fmt.entry_bytes, LATENT_DIM=fmt.kv_lora_rank,
                    SCALE_GROUP=fmt.scale_group, SCALE_OFFSET=fmt.scale_offset,
                    GLOBAL_SCALE_OFFSET=max(fmt.global_scale_offset, 0), BLOCK_N=16)))


@pytest.mark.parametrize("name", FORMATS)
def test_the_decode_kernels_dequantization_matches_the_reference_bit_for_bit(name):
    latent = _special_latent(128)
    fmt, entries = _write(name, latent, torch.zeros(latent.shape[0], 16))
    entries = torch.cat([entries, torch.zeros(1, fmt.entry_bytes, dtype=torch.uint8)])  # and a zeroed slot
    out = torch.empty(entries.shape[0], 128)
    _dequantize(entries.contiguous(), out, fmt)
    expected = mla_kv_dequantize_reference(entries, fmt)[:, :128]
    assert torch.equal(out.view(torch.int32), expected.view(torch.int32)) or torch.equal(
        out.nan_to_num(7.0), expected.nan_to_num(7.0)), (out - expected).abs().nan_to_num(99).max()
    assert torch.equal(out[-1], torch.zeros(128))  # the all-zero entry is zeros, never 0 / 0
    finite = torch.isfinite(latent).all(dim=1)
    assert out[~torch.cat([finite, torch.tensor([True])])].isnan().all()
    # quantization error of the finite rows: within half a code step of each format's element grid
    rel = (out[:-1][finite] - latent[finite]).abs().amax(dim=1) / latent[finite].abs().amax(dim=1).clamp_min(1e-38)
    assert (rel <= (1 / 16 if name == "fp8_ds_mla" else 0.5)).all(), rel


@triton.jit
def _key_tile_kernel(cache_ptr, k_ptr, column_ptr, KV_FORMAT: tl.constexpr, ENTRY_BYTES: tl.constexpr,
                     LATENT_DIM: tl.constexpr, SCALE_OFFSET: tl.constexpr, GLOBAL_SCALE_OFFSET: tl.constexpr,
                     BLOCK_N: tl.constexpr):
    n = tl.arange(0, BLOCK_N)
    codes, scales, global_scale, _ = _entry_fields(cache_ptr + n[:, None].to(tl.int64) * ENTRY_BYTES,
                                                   n[:, None] < BLOCK_N, KV_FORMAT, LATENT_DIM, SCALE_OFFSET,
                                                   GLOBAL_SCALE_OFFSET, 0, 1, 16)
    k, column = _key_f16(codes, scales, global_scale, KV_FORMAT, LATENT_DIM, BLOCK_N)
    tl.store(k_ptr + n[:, None] * LATENT_DIM + tl.arange(0, LATENT_DIM)[None, :], k)
    tl.store(column_ptr + n, column)


_key_tile = JitKernel(_key_tile_kernel, lambda entries, k, column, fmt: Launch(
    grid=(1,), args=(entries, k, column),
    constexprs=dict(KV_FORMAT=fmt.name, ENTRY_BYTES=fmt.entry_bytes, LATENT_DIM=fmt.kv_lora_rank,
                    SCALE_OFFSET=fmt.scale_offset, GLOBAL_SCALE_OFFSET=max(fmt.global_scale_offset, 0),
                    BLOCK_N=entries.shape[0])))


@pytest.mark.parametrize("name", FORMATS)
def test_the_f16_key_tile_times_its_column_factor_is_the_dequantized_latent(name):
    """The fast decode's key tile: nvfp4 ``e2m1 * block scale * 2**-14`` exactly in f16 (in paired
    order: codes 0, 4, 1, 5, 2, 6, 3, 7 of each 8) and ``1 / global scale`` per token; fp8 ``code *
    (scale / S)`` rounded once to f16 and S, the token's largest scale."""
    latent = _special_latent(128)
    fmt, entries = _write(name, latent, torch.zeros(latent.shape[0], 16))
    entries = torch.cat([entries, torch.zeros(16 - entries.shape[0], fmt.entry_bytes, dtype=torch.uint8)])
    k, column = torch.empty(16, 128, dtype=torch.float16), torch.empty(16)
    _key_tile(entries.contiguous(), k, column, fmt)
    fields = fmt.fields()
    expected = mla_kv_dequantize_reference(entries, fmt)[:, :128]
    if name == "nvfp4_ds_mla":
        values = _unpack_reference(entries[:, slice(*fields["latent"])]).float()
        block_scale = entries[:, slice(*fields["scales"])].contiguous().view(torch.float8_e4m3fn).float()
        exact = values * block_scale.repeat_interleave(16, dim=1) * 2.0**-14
        gs = entries[:, slice(*fields["global_scale"])].contiguous().view(torch.float32)[:, 0]
        # f16 holds every product. (A non-finite token's scale code 0x7F is NaN on a GPU; Triton's
        # interpreter decodes E4M3 0x7F as 480. Its 1 / NaN global scale makes the token NaN either way.)
        j = torch.arange(128)
        paired = (j & ~7) | ((j >> 1) & 3) | ((j & 1) << 2)  # the latent dimension at each column
        assert torch.equal(k.float()[~gs.isnan()], exact[:, paired][~gs.isnan()])
        torch.testing.assert_close(column, torch.where(gs == 0, 0.0, 1.0 / torch.where(gs == 0, 1.0, gs)),
                                   rtol=2**-22, atol=0, equal_nan=True)
        dequantized = torch.empty(16, 128)
        dequantized[:, paired] = k.float() * (column[:, None] * 16384.0)
    else:
        dequantized = k.float() * column[:, None]
    assert torch.equal(dequantized.isnan(), expected.isnan())
    finite = ~expected.isnan()
    row_amax = expected.nan_to_num(0).abs().amax(dim=1, keepdim=True)
    bound = (2.0**-10 if name == "fp8_ds_mla" else 2.0**-20) * row_amax
    assert ((dequantized - expected).abs() <= bound)[finite].all()
    assert not dequantized[-1].any()  # the zero entry


# --------------------------------------------------------------------------- decode attention

# The reference attends over the same dequantized keys, unrounded; what remains is summation order, q
# and the probabilities as f16 into the MMAs (bf16 q: exactly), and the output's rounding.
TOL = {torch.float32: 2e-5, torch.bfloat16: 1.6e-2, torch.float16: 4e-3}


def _filled_cache(name, lengths, block_size=16, rank=128, rope=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    fmt = kv_format(name, rank, rope)
    blocks_per = [-(-n // block_size) for n in lengths]
    layout = QuantizedMLALayout(fmt, sum(blocks_per) + 2, block_size)
    cache = layout.allocate()
    ids = torch.randperm(layout.num_blocks, generator=g)[:sum(blocks_per)].tolist()
    width = max(max(blocks_per), 1)
    table = torch.zeros(len(lengths), width, dtype=torch.int32)
    slots = []
    for r, n in enumerate(lengths):
        mine = [ids.pop() for _ in range(blocks_per[r])]
        table[r, :len(mine)] = torch.tensor(mine, dtype=torch.int32)
        slots += [mine[p // block_size] * block_size + p % block_size for p in range(n)]
    latent = torch.randn(len(slots), rank, generator=g) * 2
    mla_kv_cache_write(cache, torch.tensor(slots, dtype=torch.int64), latent, torch.randn(len(slots), rope,
                                                                                      generator=g), name)
    return fmt, cache, table


@pytest.mark.parametrize("name", FORMATS)
@pytest.mark.parametrize("dtype, block_size", [(torch.float32, 16), (torch.bfloat16, 16), (torch.bfloat16, 8),
                                               (torch.float16, 16)])
def test_decode_attention_within_tolerance_of_the_dequantized_reference(name, dtype, block_size):
    """16-token pages hold whole tiles (one block id a tile); 8-token pages make a tile span pages."""
    lengths = [0, 5, 37]  # an empty request, one partial tile, several tiles over three blocks
    fmt, cache, table = _filled_cache(name, lengths, block_size=block_size)
    q = torch.randn(len(lengths), 4, fmt.key_dim).to(dtype)
    seq_lens = torch.tensor(lengths, dtype=torch.int32)
    out = quantized_mla_decode_attention(q, cache, table, seq_lens, 0.1, name, fmt.kv_lora_rank)
    expected = quantized_mla_decode_attention_reference(q, cache, table, seq_lens, 0.1, fmt, round_keys=False)
    assert out.dtype == dtype and out.shape == (3, 4, 128)
    torch.testing.assert_close(out, expected, atol=TOL[dtype], rtol=TOL[dtype])
    assert not out[0].any()
    metadata = quantized_mla_decode_metadata(seq_lens, table, 4, block_size, name)
    assert metadata[0] is None and metadata[1].shape == (4,)
    assert torch.equal(quantized_mla_decode_attention(q, cache, table, seq_lens, 0.1, name, 128, metadata), out)


@pytest.mark.slow
@pytest.mark.parametrize("name", FORMATS)
def test_decode_attention_at_deepseek_geometry(name):
    """512 + 64 on 64-token pages: four fp8 scale tiles a token, 64 nvfp4 code words in paired order."""
    fmt, cache, table = _filled_cache(name, [70, 3], block_size=64, rank=512, rope=64, seed=11)
    q = torch.randn(2, 16, fmt.key_dim).to(torch.bfloat16)
    seq_lens = torch.tensor([70, 3], dtype=torch.int32)
    out = quantized_mla_decode_attention(q, cache, table, seq_lens, 0.07, name, 512)
    expected = quantized_mla_decode_attention_reference(q, cache, table, seq_lens, 0.07, fmt, round_keys=False)
    torch.testing.assert_close(out, expected, atol=TOL[torch.bfloat16], rtol=TOL[torch.bfloat16])


@pytest.mark.parametrize("name", FORMATS)
def test_decode_attention_over_heads_of_any_magnitude_and_zeroed_slots(name):
    """bf16 q runs as f16 scaled per head by a power of two: heads from 2**-60 to 2**20 keep their
    accuracy; a request over a never-written block (all-zero entries: zero keys) matches too."""
    fmt, cache, table = _filled_cache(name, [20, 30], seed=3)
    zero_block = cache.shape[0] - 1  # _filled_cache leaves two blocks unused
    assert not cache[zero_block].any()
    table = torch.cat([table, torch.full((1, table.shape[1]), zero_block, dtype=torch.int32)])
    table[2, 0] = table[0, 0]  # its first block written, the next one all zeros
    seq_lens = torch.tensor([20, 30, 32], dtype=torch.int32)
    q = torch.randn(3, 4, fmt.key_dim) * torch.tensor([2.0**-60, 1.0, 2.0**20, 2.0**-8])[None, :, None]
    q = q.to(torch.bfloat16)
    out = quantized_mla_decode_attention(q, cache, table, seq_lens, 0.1, name, fmt.kv_lora_rank)
    expected = quantized_mla_decode_attention_reference(q, cache, table, seq_lens, 0.1, fmt, round_keys=False)
    torch.testing.assert_close(out, expected, atol=TOL[torch.bfloat16], rtol=TOL[torch.bfloat16])


@pytest.mark.parametrize("name", FORMATS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_non_finite_token_makes_its_request_nan_and_no_other(name, dtype):
    fmt, cache, table = _filled_cache(name, [9, 9], seed=5)
    latent = torch.randn(1, 128)
    latent[0, 3] = float("inf")
    slot = int(table[1, 0]) * 16 + 4
    mla_kv_cache_write(cache, torch.tensor([slot]), latent, torch.randn(1, 16), name)
    q = torch.randn(2, 4, fmt.key_dim).to(dtype)
    seq_lens = torch.tensor([9, 9], dtype=torch.int32)
    out = quantized_mla_decode_attention(q, cache, table, seq_lens, 0.1, name, fmt.kv_lora_rank)
    expected = quantized_mla_decode_attention_reference(q, cache, table, seq_lens, 0.1, fmt, round_keys=False)
    assert out[1].isnan().all() and expected[1].isnan().all()
    torch.testing.assert_close(out[0], expected[0], atol=TOL[dtype], rtol=TOL[dtype])


def test_bad_inputs_are_named():
    fmt, cache, table = _filled_cache("fp8_ds_mla", [3])
    q = torch.randn(1, 4, 144)
    with pytest.raises(ValueError, match="a fp8_ds_mla cache is uint8"):
        quantized_mla_decode_attention(q, cache.float(), table, torch.tensor([3], dtype=torch.int32), 0.1,
                                       "fp8_ds_mla", 128)
    with pytest.raises(ValueError, match="not the nvfp4_ds_mla layout's"):
        quantized_mla_decode_attention(q, cache, table, torch.tensor([3], dtype=torch.int32), 0.1, "nvfp4_ds_mla", 128)
    with pytest.raises(ValueError, match="slots must be int32 or int64"):
        mla_kv_cache_write(cache, torch.zeros(1), torch.zeros(1, 128), torch.zeros(1, 16), "fp8_ds_mla")


# --------------------------------------------------------------------------- zeroing on the real layouts


@pytest.mark.parametrize("name", FORMATS)
def test_kv_block_zero_clears_exactly_the_blocks_of_the_engine_cache(name):
    """The engine's all-layer cache of each format, every byte written nonzero, three blocks zeroed:
    the zero bytes are exactly those blocks' ranges in every layer (from the layout objects), each
    token of them dequantizes to zeros, and nothing else moved."""
    from tritonwarm.engine.config import engine_config_from_dict
    from tritonwarm.engine.kv import KVCache

    config = engine_config_from_dict({"model": {"preset": "tiny", "kv_lora_rank": 128}, "preset": "tiny",
                                      "num_blocks": 6, "block_size": 4, "kv_cache_dtype": name})
    kv = KVCache(config, "cpu")
    layout = kv.layout
    assert isinstance(layout, QuantizedMLALayout) and kv.tensor.dtype == torch.uint8
    kv.tensor.copy_(torch.randint(1, 256, kv.tensor.shape, dtype=torch.uint8))
    before = kv.tensor.clone()
    zeroed = [4, 0, 2]
    kv_block_zero(kv.tensor, torch.tensor(zeroed + [-1], dtype=torch.int32))
    for i, layer in enumerate(kv.layers):
        flat, old = layer.contiguous().view(-1), before[:, i].contiguous().view(-1)
        expected_zero = torch.zeros_like(flat, dtype=torch.bool)
        for block in zeroed:
            start, stop = layout.block_byte_range(block)
            expected_zero[start:stop] = True
            first, _ = layout.token_byte_range(block, 0, "latent")
            _, last = layout.token_byte_range(block, layout.block_size - 1, "padding" if "padding" in
                                              layout.format.fields() else "rope")
            assert (first, last) == (start, stop)
        assert torch.equal(flat == 0, expected_zero | (old == 0))
        assert torch.equal(flat[~expected_zero], old[~expected_zero])
        dequantized = mla_kv_dequantize_reference(layer[zeroed, :, 0], layout.format)
        assert torch.equal(dequantized, torch.zeros_like(dequantized))


# --------------------------------------------------------------------------- ops, specs, keys


@pytest.mark.parametrize("name", FORMATS)
def test_custom_ops(name):
    fmt, cache, table = _filled_cache(name, [5, 9], block_size=8)
    slots = torch.tensor([3, 17], dtype=torch.int64)
    latent, rope = torch.randn(2, 128), torch.randn(2, 16)
    torch.library.opcheck(torch.ops.tritonwarm.mla_kv_cache_write.default, (cache.clone(), slots, latent, rope, name))
    written, expected = cache.clone(), cache.clone()
    torch.ops.tritonwarm.mla_kv_cache_write(written, slots, latent, rope, name)
    mla_kv_write_reference(expected, fmt, slots, latent, rope)
    assert torch.equal(written, expected)
    q = torch.randn(2, 4, 144)
    seq_lens = torch.tensor([5, 9], dtype=torch.int32)
    attention = torch.ops.tritonwarm.quantized_mla_decode_attention.default
    torch.library.opcheck(attention, (q, cache, table, seq_lens, 0.1, name, 128))
    assert torch.equal(attention(q, cache, table, seq_lens, 0.1, name, 128),
                       quantized_mla_decode_attention(q, cache, table, seq_lens, 0.1, name, 128))


def _quantized_specs():
    """The shipped rows of the quantized caches: their write and decode, and kv_block_zero's uint8 rows."""
    return [s for s in load_specs([SPEC_DIR]) if "mla_kv_quant" in s.kernel_path
            or ("kv_block_zero" in s.kernel_path and "fp8_ds_mla" in s.description)]


def test_spec_rows_cover_every_format_of_the_set_with_its_entry_bytes():
    specs = [s for s in load_specs([SPEC_DIR]) if "mla_kv_quant" in s.kernel_path]
    assert {s.kernel_path.rsplit(":", 1)[1] for s in specs} == {"mla_kv_cache_write", "quantized_mla_decode_attention"}
    for spec in specs:
        rows = spec.rows()
        assert {r.values["kv_cache_dtype"] for r in rows} == set(QUANTIZED_DS_MLA_FORMATS), spec.kernel_path
        for row in rows:
            assert row.values["entry_bytes"] == kv_format(row.values["kv_cache_dtype"]).entry_bytes


@pytest.mark.parametrize("target_name", ["sm90", "sm100", "gfx942"])
def test_the_shipped_kv_block_zero_rows_cover_every_formats_cache(target_name):
    """One uint8 kv_block_zero row stands for the set: each format's real per-layer cache launches a
    variant the shipped specs plan."""
    from tritonwarm.jit import fake_tensor, trace_call
    from tritonwarm.jit.pipeline.plan import plan

    target = TARGETS[target_name]
    planned = set(plan([s for s in load_specs([SPEC_DIR]) if "kv_block_zero" in s.kernel_path], target).variants)
    for name in QUANTIZED_DS_MLA_FORMATS:
        layout = QuantizedMLALayout(kv_format(name), 4096, 64)
        [variant] = trace_call(target, kv_block_zero, fake_tensor(layout.shape, torch.uint8),
                               fake_tensor((7,), torch.int32))
        assert variant.cache_hash in planned, name


def _keys(spec, target, args, kwargs):
    cap = Capture()
    with fake_launches(cap, target):
        spec.launcher(*args, **kwargs)
    return {(v.kernel, v.key) for v in cap.variants.values()}


@pytest.mark.parametrize("target_name", ["sm90", "sm100", "gfx942"])
def test_spec_rows_warm_the_keys_real_tensors_get(target_name):
    target = TARGETS[target_name]
    rows = 0
    for spec in _quantized_specs():
        if not spec.applies_to(target):
            continue
        for row in spec.rows():
            args, kwargs = spec.call_arguments(row.values)
            warmed = _keys(spec, target, args, kwargs)
            assert warmed and warmed == _keys(spec, target, cpu_twin(args), cpu_twin(kwargs)), row.label
            rows += 1
    assert rows >= 10


# --------------------------------------------------------------------------- declared tiles


def test_the_shipped_tile_table_parses_and_names_a_bad_entry():
    from tritonwarm.launchers.mla_kv_quant import TILES_FILE, load_quantized_tiles, parse_quantized_tiles

    table = load_quantized_tiles()
    assert {"default", "cuda", "cuda:90", "hip"} <= set(table)
    assert all(set(entry) == set(QUANTIZED_DS_MLA_FORMATS) for entry in table.values())
    import json

    data = json.loads(TILES_FILE.read_text())
    data["cuda:90"]["nvfp4_ds_mla"]["block_n"] = 48
    with pytest.raises(ValueError, match=r"cuda:90\.nvfp4_ds_mla\.block_n: invalid value 48"):
        parse_quantized_tiles(data, "t.json")
    data["cuda:90"]["nvfp4_ds_mla"]["block_n"] = 64
    del data["hip"]["fp8_ds_mla"]
    with pytest.raises(ValueError, match="hip: needs exactly the formats"):
        parse_quantized_tiles(data, "t.json")


@pytest.mark.parametrize("target_name, block_n, barrier, fp8_cvt", [
    ("sm90", 64, True, True), ("sm80", 32, True, False), ("sm120", 32, True, True), ("gfx942", 16, False, True)])
def test_each_target_launches_its_declared_tiles(target_name, block_n, barrier, fp8_cvt):
    """The sm90 entry, NVIDIA's backend entry (E4M3 by integer ops before sm89), AMD's; the opaque
    copy of the key tile is NVIDIA's only."""
    from tritonwarm.jit import fake_tensor, trace_call

    args = (fake_tensor((8, 16, 576), torch.bfloat16), fake_tensor((4096, 64, 1, 432), torch.uint8),
            fake_tensor((8, 2048), torch.int32), fake_tensor((8,), torch.int32), 0.07, "nvfp4_ds_mla", 512)
    variants = trace_call(TARGETS[target_name], quantized_mla_decode_attention, *args)
    [split] = [v for v in variants if "split" in v.kernel]
    assert (split.args["BLOCK_N"], split.args["KEY_BARRIER"], split.args["FP8_CVT"]) == \
        (f"={block_n}", f"={barrier}", f"={fp8_cvt}")


# --------------------------------------------------------------------------- benchmark


BENCH = Path(__file__).resolve().parents[1] / "bench"


def test_gpu_all_runs_the_kv_formats_step(tmp_path):
    import os
    import subprocess

    python = tmp_path / "python"
    python.write_text('#!/usr/bin/env bash\necho "ran: $*"\n')
    python.chmod(0o755)
    proc = subprocess.run(["bash", str(BENCH / "gpu_all.sh"), str(tmp_path / "out"), "kvformats"],
                          env={**os.environ, "PYTHON": str(python)}, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and "== kvformats: exit 0" in proc.stdout, proc.stdout + proc.stderr
    assert "bench/kv_formats.py --tiles 3 --budget 90 --json" in (tmp_path / "out" / "kvformats.log").read_text()
    assert "kvformats" in (BENCH / "gpu_all.sh").read_text().split("steps=(env", 1)[1].split(")", 1)[0]


@pytest.mark.slow
def test_the_benchmark_runs_each_format_on_the_cpu():
    import os
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[2]
    proc = subprocess.run([sys.executable, str(BENCH / "kv_formats.py"), "--tiles", "2"], capture_output=True,
                          text=True, timeout=900,
                          env={**os.environ, "PYTHONPATH": f"{root}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    for name in ("auto", "fp8_ds_mla", "nvfp4_ds_mla"):
        assert f"{name}: decode and write ran on the CPU" in proc.stdout
    assert "tile candidates: 4 ran on the CPU (interpreter) and matched the shipped settings, 0 failed" in proc.stdout


@pytest.mark.slow
def test_the_spec_rows_compile_and_check_for_sm100(tmp_path):
    """sm90 and gfx942 compile every shipped row in tests/test_shipped_specs.py; Blackwell here."""
    from tritonwarm.jit.pipeline.check import check
    from tritonwarm.jit.pipeline.plan import plan
    from tritonwarm.jit.pipeline.warmup import warm

    target = TARGETS["sm100"]
    the_plan = plan(_quantized_specs(), target)
    assert not the_plan.unreachable and not the_plan.errors and not the_plan.redundant
    result = warm(the_plan, tmp_path, jobs=2)
    assert result.failed == 0 and result.compiled == len(the_plan.variants) >= 9, result.failures
    assert check(plan(_quantized_specs(), target), tmp_path).ok
