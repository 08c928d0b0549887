import math
import pathlib

import pytest
import torch
from tritonwarm.jit import TARGETS, fake_tensor
from tritonwarm.jit.pipeline.plan import plan
from tritonwarm.jit.pipeline.specs import load_specs
from tritonwarm.kernels.rotary import rotary_embedding_reference
from tritonwarm.launchers.rotary import rotary_embedding

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
SPEC = pathlib.Path(__file__).parent.parent / "warmup_specs" / "rotary_embedding.yaml"


def assert_rotated(actual, expected):
    """Same fp32 operations on both sides, each rounded once to the output dtype: every dtype, bf16
    included (the interpreter rounds to nearest even, as the GPU does), matches exactly."""
    torch.testing.assert_close(actual, expected, atol=0, rtol=0)


def make_inputs(tokens, heads, kv_heads, head_dim, rot_dim, dtype, seed, max_position=64):
    g = torch.Generator().manual_seed(seed)
    positions = torch.randint(0, max_position, (tokens,), generator=g)  # unsorted, may repeat
    q = torch.randn(tokens, heads, head_dim, generator=g).to(dtype)
    k = torch.randn(tokens, kv_heads, head_dim, generator=g).to(dtype)
    angles = torch.rand(max_position, rot_dim // 2, generator=g) * 2 * math.pi
    cos_sin_cache = torch.cat([angles.cos(), angles.sin()], dim=-1).to(dtype)
    return positions, q, k, cos_sin_cache


@pytest.mark.parametrize("is_neox", [True, False])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("tokens,heads,kv_heads,head_dim,rot_dim", [
    (1, 1, 1, 8, 8),       # one token
    (5, 3, 1, 16, 16),     # heads not a power of two, kv_heads < heads
    (4, 6, 2, 32, 12),     # rot_dim < head_dim (the rest stays), rot_dim / 2 not a power of two
    (2, 20, 4, 128, 128),  # 16-head blocks: q's second block is partial, k's is partial
])
def test_matches_reference(is_neox, dtype, tokens, heads, kv_heads, head_dim, rot_dim):
    positions, q, k, cache = make_inputs(tokens, heads, kv_heads, head_dim, rot_dim, dtype, seed=heads * 31 + rot_dim)
    expected_q, expected_k = rotary_embedding_reference(positions, q, k, cache, is_neox)
    out_q, out_k = rotary_embedding(positions, q, k, cache, is_neox)
    assert out_q is q and out_k is k
    assert_rotated(q, expected_q)
    assert_rotated(k, expected_k)


@pytest.mark.parametrize("is_neox", [True, False])
def test_reference_is_a_complex_rotation(is_neox):
    """The reference against an independent formulation: each pair times e^(i * angle)."""
    positions, q, k, cache = make_inputs(3, 2, 1, 8, 8, torch.float32, seed=7)
    expected_q, _ = rotary_embedding_reference(positions, q, k, cache, is_neox)
    cos, sin = cache[positions].chunk(2, dim=-1)
    turn = torch.complex(cos, sin)[:, None]  # [tokens, 1, rot_dim / 2]
    if is_neox:  # pair i is (x[i], x[i + 4])
        rotated = torch.complex(q[..., :4], q[..., 4:]) * turn
        expected = torch.cat([rotated.real, rotated.imag], dim=-1)
    else:  # pair i is (x[2i], x[2i + 1])
        rotated = torch.complex(q[..., 0::2], q[..., 1::2]) * turn
        expected = torch.stack([rotated.real, rotated.imag], dim=-1).flatten(-2)
    torch.testing.assert_close(expected_q, expected)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_mla_rope_part_views(dtype):
    """DeepSeek MLA shape (scaled down): q's rope dims are the *last* ones of each head, k_pe is a
    view into the latent projection; only those views change."""
    tokens, heads, nope, rope, kv_lora = 3, 5, 24, 16, 40
    positions, q_full, _, cache = make_inputs(tokens, heads, 1, nope + rope, rope, dtype, seed=11)
    latent = torch.randn(tokens, 1, kv_lora + rope, generator=torch.Generator().manual_seed(12)).to(dtype)
    q_pe, k_pe = q_full[..., nope:], latent[..., kv_lora:]  # head stride 40 > rot_dim 16
    q_before, latent_before = q_full.clone(), latent.clone()
    expected_q, expected_k = rotary_embedding_reference(positions, q_pe, k_pe, cache, is_neox=False)
    rotary_embedding(positions, q_pe, k_pe, cache, is_neox=False)
    assert_rotated(q_pe, expected_q)
    assert_rotated(k_pe, expected_k)
    assert torch.equal(q_full[..., :nope], q_before[..., :nope])
    assert torch.equal(latent[..., :kv_lora], latent_before[..., :kv_lora])


def test_views_of_fused_qkv():
    """q and k sliced out of one qkv projection: token stride (heads + 2 * kv_heads) * head_dim."""
    tokens, heads, kv_heads, head_dim = 4, 4, 2, 16
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * head_dim, generator=torch.Generator().manual_seed(13))
    q = qkv[:, : heads * head_dim].view(tokens, heads, head_dim)
    k = qkv[:, heads * head_dim : (heads + kv_heads) * head_dim].view(tokens, kv_heads, head_dim)
    positions, _, _, cache = make_inputs(tokens, 1, 1, head_dim, head_dim, torch.float32, seed=14)
    v_before = qkv[:, (heads + kv_heads) * head_dim :].clone()
    expected_q, expected_k = rotary_embedding_reference(positions, q, k, cache)
    rotary_embedding(positions, q, k, cache)
    assert_rotated(q, expected_q)
    assert_rotated(k, expected_k)
    assert torch.equal(qkv[:, (heads + kv_heads) * head_dim :], v_before)


def test_zero_tokens_launch_nothing():
    positions, q, k, cache = make_inputs(0, 2, 1, 8, 8, torch.float32, seed=0)
    assert rotary_embedding(positions, q, k, cache) == (q, k)


def test_bad_shapes_are_rejected():
    positions, q, k, cache = make_inputs(2, 2, 1, 16, 8, torch.float32, seed=0)
    with pytest.raises(ValueError, match="unit stride"):
        rotary_embedding(positions, q[..., ::2], k[..., ::2], cache)
    with pytest.raises(ValueError, match="token counts"):
        rotary_embedding(positions[:1], q, k, cache)
    with pytest.raises(ValueError, match="does not fit"):
        rotary_embedding(positions, q, k, torch.zeros(64, 34))  # wider than a head


def test_custom_op():
    positions, q, k, cache = make_inputs(3, 3, 1, 16, 8, torch.float32, seed=15)
    q_view = q[..., 4:12]  # a strided view, rotated in place through the op
    expected_q, expected_k = rotary_embedding_reference(positions, q_view, k, cache, False)
    torch.ops.tritonwarm.rotary_embedding(positions, q_view, k, cache, False)
    assert_rotated(q_view, expected_q)
    assert_rotated(k, expected_k)
    torch.library.opcheck(torch.ops.tritonwarm.rotary_embedding.default, (positions, q, k, cache, True))


@pytest.mark.slow
@pytest.mark.parametrize("target", ["sm90", "gfx942"])
@pytest.mark.parametrize("is_neox", [True, False])
def test_compiles(compile_call, target, is_neox):
    tokens = 8
    qkv = fake_tensor((tokens, 48 * 128), torch.bfloat16)
    q = qkv[:, : 32 * 128].view(tokens, 32, 128)
    k = qkv[:, 32 * 128 : 40 * 128].view(tokens, 8, 128)
    positions = fake_tensor((tokens,), torch.int64)
    cache = fake_tensor((4096, 128), torch.bfloat16)
    [(variant, _)] = compile_call(target, rotary_embedding, positions, q, k, cache, is_neox)
    assert variant.args["q_ptr"] == "*bf16 aligned"
    assert variant.args["q_token_stride"] == "i32:div16"
    assert variant.args["IS_NEOX"] == f"={is_neox}"


@pytest.mark.parametrize("target", ["sm90", "gfx942"])
def test_warmup_spec_plans_cleanly(target):
    """Every row launches, collapsed token counts never change the variant, few variants in all."""
    the_plan = plan(load_specs([SPEC]), TARGETS[target])
    assert not (the_plan.unreachable or the_plan.errors or the_plan.collapse_errors)
    # 2 models x 2 dtypes, one binary each
    assert len(the_plan.variants) == 4
