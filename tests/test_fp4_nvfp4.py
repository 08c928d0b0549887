"""NVFP4 quantize / dequantize: bit-exact against vLLM's reference recipe, hand-computed codes,
adversarial blocks (E4M3 and E2M1 ties, scale underflow, saturation), NaN / inf, compile, warm-up spec."""

from pathlib import Path

import pytest
import torch
import yaml
from tritonwarm.jit import TARGETS, class_reps, fake_tensor, trace_call
from tritonwarm.kernels.fp4 import nvfp4_dequantize_reference, nvfp4_quantize_reference
from tritonwarm.launchers.fp4 import nvfp4_dequantize, nvfp4_quantize

DTYPES = [torch.float32, torch.bfloat16, torch.float16]
SPEC_FILE = Path(__file__).resolve().parents[1] / "warmup_specs" / "nvfp4.yaml"
ONE_SIXTH = torch.tensor(1 / 6, dtype=torch.float32)


def quantize_and_compare(x, global_scale):
    packed, scales = nvfp4_quantize(x, global_scale)
    ref_packed, ref_scales = nvfp4_quantize_reference(x, global_scale)
    assert packed.dtype == torch.uint8 and scales.dtype == torch.float8_e4m3fn
    assert packed.shape == x.shape[:-1] + (x.shape[-1] // 2,)
    assert scales.shape == x.shape[:-1] + (x.shape[-1] // 16,)
    scale_bytes, ref_scale_bytes = scales.view(torch.uint8), ref_scales.view(torch.uint8)
    assert torch.equal(scale_bytes, ref_scale_bytes), (scale_bytes != ref_scale_bytes).nonzero()[:5]
    assert torch.equal(packed, ref_packed), (packed != ref_packed).nonzero()[:5]
    return packed, scale_bytes


def unpack_codes(packed):
    return torch.stack([packed & 0xF, packed >> 4], dim=-1).flatten(-2)


def usual_global_scale(x):
    """The caller's usual choice: the tensor's amax maps to E4M3 max * E2M1 max."""
    return (448.0 * 6.0 / x.float().abs().amax()).reshape(())


def random_blocks(rows, k, dtype, seed, spread=6):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, k // 16, 16, generator=g)
    exponents = torch.randint(-spread, spread + 1, (rows, k // 16, 1), generator=g)
    return (x * torch.pow(2.0, exponents.float())).reshape(rows, k).to(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 16), (3, 48), (2, 3, 64), (2, 1040), (1, 2048)])
def test_random_inputs_bit_exact(dtype, shape):
    rows = 1
    for s in shape[:-1]:
        rows *= s
    x = random_blocks(rows, shape[-1], dtype, seed=sum(shape)).reshape(shape)
    quantize_and_compare(x, usual_global_scale(x))
    quantize_and_compare(x, usual_global_scale(x).reshape(1) * 0.37)  # [1]-shaped, blocks saturate less


# amax 6 with global scale 1: scale = 1 * (6 * fp32(1/6)) rounds to exactly 1.0 (E4M3 0x38) and the
# elements are quantized as they are; codes worked out by hand (round half to even, saturating at 6).
SPEC_BLOCK = [
    (6.0, 0x7), (0.25, 0x0), (0.75, 0x2), (1.25, 0x2), (1.75, 0x4), (2.5, 0x4), (3.5, 0x6), (5.0, 0x6),
    (-0.25, 0x0), (-0.75, 0xA), (-1.75, 0xC), (-5.0, 0xE), (-0.0, 0x0), (0.3, 0x1), (5.5, 0x7), (-3.0, 0xD),
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("x_exp,gs_exp,scale_byte", [
    (0, 0, 0x38),  # scale 1.0
    (0, -9, 0x01),  # scale 2**-9: E4M3's smallest subnormal
    (0, -6, 0x08),  # scale 2**-6: its smallest normal
    (0, 8, 0x78),  # scale 256
    (-12, 12, 0x38),  # the global scale brings a small block back to scale 1
])
def test_spec_block_gets_hand_computed_codes(dtype, x_exp, gs_exp, scale_byte):
    x = (torch.tensor([v for v, _ in SPEC_BLOCK], dtype=torch.float64) * 2.0**x_exp).to(dtype).reshape(1, 16)
    packed, scales = quantize_and_compare(x, torch.tensor(2.0**gs_exp))
    assert scales.item() == scale_byte
    assert unpack_codes(packed[0]).tolist() == [c for _, c in SPEC_BLOCK]
    assert packed[0, 0].item() == 0x07  # elements 0 and 1: low nibble first


def e4m3_tie_blocks(g):
    """Blocks whose amax puts scale = amax * fp32(1/6) (global scale 1) on or next to an E4M3 tie."""
    values = torch.arange(127, dtype=torch.uint8).view(torch.float8_e4m3fn).double()  # +0 .. 448
    midpoints = ((values[:-1] + values[1:]) / 2).float()
    amaxes = []
    for step in (-2, -1, 0, 1, 2):
        a = (midpoints.double() * 6).float()
        for _ in range(abs(step)):
            a = torch.nextafter(a, torch.full_like(a, float("inf") if step > 0 else 0.0))
        amaxes.append(a)
    amax = torch.cat(amaxes)
    exact_ties = ((amax * ONE_SIXTH).unsqueeze(-1) == midpoints).any(dim=-1)
    body = (torch.rand(len(amax), 15, generator=g) * 2 - 1) * amax.unsqueeze(-1)
    return torch.cat([amax.unsqueeze(-1), body], dim=-1), int(exact_ties.sum())


def e2m1_tie_blocks(g):
    """amax 6 * 2**k makes the scale exactly 2**k (global scale 1), so halfway elements are exact ties."""
    halfway = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])
    blocks = []
    for k in range(-9, 9):
        picks = halfway[torch.randint(0, 7, (15,), generator=g)] * torch.where(torch.rand(15, generator=g) < 0.5, -1, 1)
        blocks.append(torch.cat([torch.tensor([6.0]), picks]) * 2.0**k)
    return torch.stack(blocks)


@pytest.mark.parametrize("dtype", DTYPES)
def test_adversarial_blocks_bit_exact(dtype):
    g = torch.Generator().manual_seed(0)
    finfo = torch.finfo(dtype)
    tie_blocks, n_exact_ties = e4m3_tie_blocks(g)
    if dtype == torch.float32:
        assert n_exact_ties > 50  # the blocks really hit E4M3 ties
    underflow = 6 * 2.0**-10  # scale = 2**-10, halfway between 0 and E4M3's smallest 2**-9: rounds to 0
    signs = torch.where(torch.rand(16, generator=g) < 0.5, -1.0, 1.0)
    special = {  # name -> (block, expected scale byte or None)
        "scale on the 0 / 2**-9 tie": (torch.full((16,), underflow), 0x00),
        "scale just above the tie": (torch.full((16,), -underflow * (1 + 2**-7)), 0x01),
        "scale below the tie": (torch.rand(16, generator=g) * underflow * 0.9, 0x00),
        "zeros": (torch.zeros(16), 0x00),
        "negative zeros": (torch.full((16,), -0.0), 0x00),
        "input subnormals": (torch.rand(16, generator=g) * finfo.smallest_normal * signs, None),
        "near the dtype max": (torch.rand(16, generator=g) * finfo.max * signs, 0x7E),
        "dtype max": (torch.full((16,), finfo.max), 0x7E),
        "scale saturates": (torch.randn(16, generator=g) * 3000, 0x7E),
        "mixed signs": (torch.randn(16, generator=g) * signs, None),
    }
    blocks = [tie_blocks, e2m1_tie_blocks(g), torch.stack([b for b, _ in special.values()])]
    x = torch.cat(blocks).to(dtype)
    x = torch.cat([x, torch.zeros((-len(x)) % 64, 16, dtype=dtype)]).reshape(-1, 1024)  # few, wide rows
    packed, scales = quantize_and_compare(x, torch.tensor(1.0))
    scales, codes = scales.flatten(), unpack_codes(packed).reshape(-1, 16)
    first_special = len(tie_blocks) + 18
    for i, (name, (_, expected)) in enumerate(special.items()):
        if expected is not None:
            assert scales[first_special + i] == expected, name
    # A block whose scale underflows to 0 has only +0 codes: it dequantizes to zeros.
    assert (codes[scales == 0] == 0).all()
    assert not (codes == 0x8).any()  # no negative zero
    out = nvfp4_dequantize(packed, scales.view(torch.float8_e4m3fn).reshape(-1, 64), torch.tensor(1.0), torch.float32)
    assert (out.reshape(-1, 16)[scales == 0] == 0).all()


def test_nan_block_gets_nan_scale_inf_block_saturates():
    x = random_blocks(2, 64, torch.bfloat16, seed=3)
    x[0, 5] = float("nan")
    x[1, 20] = float("inf")
    x[1, 40] = float("-inf")
    global_scale = torch.tensor(448 * 6 / 8.0)
    packed, scales = quantize_and_compare(x, global_scale)
    codes = unpack_codes(packed).reshape(2, 4, 16)
    assert scales[0, 0] == 0x7F and (codes[0, 0] == 0).all()  # NaN block: E4M3 NaN, +0 codes
    # inf blocks, as vLLM: the scale saturates to 448 and the infinities to the E2M1 max.
    assert scales[1, 1] == 0x7E and codes[1, 1, 4] == 0x7
    assert scales[1, 2] == 0x7E and codes[1, 2, 8] == 0xF
    out = nvfp4_dequantize(packed, scales.view(torch.float8_e4m3fn), global_scale, torch.bfloat16).reshape(2, 4, 16)
    assert torch.isnan(out[0, 0]).all() and not torch.isnan(out[0, 1:]).any() and not torch.isnan(out[1]).any()


@pytest.mark.parametrize("dtype", DTYPES)
def test_round_trip_error_is_within_half_a_code_step(dtype):
    x = random_blocks(4, 256, dtype, seed=11)
    global_scale = usual_global_scale(x)
    packed, scales = nvfp4_quantize(x, global_scale)
    out = nvfp4_dequantize(packed, scales, global_scale, torch.float32).double()
    block_scale = (scales.float() / global_scale).double().repeat_interleave(16, dim=-1)  # what dequantize uses
    v = x.double().abs() / block_scale
    # With the usual global scale the E4M3 scale rounding leaves elements within 6 * (1 + 2**-4).
    assert (v <= 6 * (1 + 2**-4) * (1 + 1e-6)).all()
    # Half a code step (or the saturation loss), plus fp32 rounding of scale / global_scale and of
    # e2m1 * that in dequantize.
    allowed = torch.where(v <= 6, torch.clamp(v / 4, min=0.25), v - 6) * block_scale + 1e-6 * x.double().abs()
    assert ((out - x.double()).abs() <= allowed).all()
    assert (out - x.double()).abs().max() > 0


@pytest.mark.parametrize("dtype", DTYPES)
def test_dequantize_matches_reference_for_every_code_and_scale_byte(dtype):
    packed = torch.arange(256, dtype=torch.uint8).repeat(32, 1)  # [32, 256]: every byte in every row
    scales = torch.arange(256, dtype=torch.uint8).reshape(8, 32).repeat(4, 1)  # [32, 32]: every E4M3 byte
    global_scale = torch.tensor([0.37])
    out = nvfp4_dequantize(packed, scales.view(torch.float8_e4m3fn), global_scale, dtype)
    assert out.shape == (32, 512) and out.dtype == dtype
    expected = nvfp4_dequantize_reference(packed, scales, global_scale, dtype)
    # fp32 and fp16 must match exactly. Triton's interpreter rounds fp32 -> bf16 toward zero (the GPU
    # rounds to nearest even), so allow one bf16 ulp there.
    rtol = 2**-7 if dtype == torch.bfloat16 else 0
    torch.testing.assert_close(out, expected, atol=0, rtol=rtol, equal_nan=True)
    # Spot check: byte 0x38 is scale 1.0, so that group is e2m1 / 0.37; bytes 0x7F / 0xFF are NaN.
    row, group = divmod(0x38, 32)
    block = out[row, group * 16:(group + 1) * 16].float()
    low_codes = torch.arange(16 * group, 16 * group + 8) & 0xF
    e2m1 = torch.tensor([0, 0.5, 1, 1.5, 2, 3, 4, 6] * 2) * torch.tensor([1.0] * 8 + [-1.0] * 8)
    torch.testing.assert_close(block[0::2], (e2m1[low_codes] * (1.0 / global_scale)).to(dtype).float(),
                               atol=0, rtol=rtol)
    assert torch.isnan(out[3, 31 * 16:]).all() and torch.isnan(out[7, 31 * 16:]).all()


def test_strided_rows_and_leading_dims():
    base = random_blocks(4, 96, torch.float16, seed=6)
    x = base[:, 32:96]  # row stride 96 > K = 64
    global_scale = usual_global_scale(x)
    packed, scales = quantize_and_compare(x, global_scale)
    expected = nvfp4_quantize(x.contiguous(), global_scale)
    assert torch.equal(packed, expected[0]) and torch.equal(scales, expected[1].view(torch.uint8))
    out = nvfp4_dequantize(packed.reshape(2, 2, 32), scales.view(torch.float8_e4m3fn).reshape(2, 2, 4),
                           global_scale, torch.float16)
    assert out.shape == (2, 2, 64)


def test_zero_rows_launch_nothing():
    packed, scales = nvfp4_quantize(torch.empty(0, 32), torch.tensor(1.0))
    assert packed.shape == (0, 16) and scales.shape == (0, 2)
    assert nvfp4_dequantize(packed, scales, torch.tensor(1.0), torch.bfloat16).shape == (0, 32)


def test_bad_inputs_raise():
    with pytest.raises(ValueError, match="multiple of 16"):
        nvfp4_quantize(torch.zeros(2, 24), torch.tensor(1.0))
    with pytest.raises(ValueError, match="global_scale"):
        nvfp4_quantize(torch.zeros(2, 32), torch.tensor([1.0, 2.0]))
    with pytest.raises(ValueError, match="global_scale"):
        nvfp4_quantize(torch.zeros(2, 32), torch.tensor(1.0, dtype=torch.float64))
    with pytest.raises(ValueError, match="scales shape"):
        nvfp4_dequantize(torch.zeros(2, 16, dtype=torch.uint8), torch.zeros(2, 3, dtype=torch.float8_e4m3fn),
                         torch.tensor(1.0), torch.float32)


def test_custom_ops():
    x = random_blocks(2, 64, torch.bfloat16, seed=7)
    global_scale = usual_global_scale(x)
    torch.library.opcheck(torch.ops.tritonwarm.nvfp4_quantize.default, (x, global_scale))
    packed, scales = torch.ops.tritonwarm.nvfp4_quantize(x, global_scale)
    assert scales.dtype == torch.float8_e4m3fn and torch.equal(packed, nvfp4_quantize(x, global_scale)[0])
    dequantize = torch.ops.tritonwarm.nvfp4_dequantize.default
    torch.library.opcheck(dequantize, (packed, scales.view(torch.uint8), global_scale, torch.bfloat16))
    # torch's schema check compares every input before and after with allclose, which has no float8
    # kernel on CPU: with float8 scales, run the other checks.
    checks = ("test_autograd_registration", "test_faketensor", "test_aot_dispatch_static", "test_aot_dispatch_dynamic")
    torch.library.opcheck(dequantize, (packed, scales, global_scale, torch.bfloat16), test_utils=checks)
    assert torch.equal(dequantize(packed, scales, global_scale, torch.bfloat16),
                       nvfp4_dequantize(packed, scales, global_scale, torch.bfloat16))


@pytest.mark.slow
@pytest.mark.parametrize("target", ["sm90", "gfx942"])
def test_compiles(compile_call, target):
    x = fake_tensor((8, 4096), torch.bfloat16)
    global_scale = fake_tensor((), torch.float32)
    [(variant, _)] = compile_call(target, nvfp4_quantize, x, global_scale)
    assert variant.args["x_ptr"] == "*bf16 aligned" and variant.args["GROUPS"] == "=64"
    packed = fake_tensor((8, 2048), torch.uint8)
    scales = fake_tensor((8, 256), torch.float8_e4m3fn)
    [(variant, _)] = compile_call(target, nvfp4_dequantize, packed, scales, global_scale, torch.bfloat16)
    assert variant.args["out_ptr"] == "*bf16 aligned"


def test_warmup_spec_rows_launch_one_variant_per_dtype():
    """Every combination the spec declares, traced by hand; tokens collapse to one variant."""
    quantize_doc, dequantize_doc = yaml.safe_load_all(SPEC_FILE.read_text())
    assert quantize_doc["kernel"] == "tritonwarm.launchers.fp4:nvfp4_quantize"
    assert dequantize_doc["kernel"] == "tritonwarm.launchers.fp4:nvfp4_dequantize"
    for doc in (quantize_doc, dequantize_doc):
        assert doc["targets"] == ["cuda"]
        assert doc["axes"]["dtype"] == ["bfloat16", "float16"]
        assert doc["axes"]["k"] == [2048, 4096, 7168, 14336]
        assert doc["axes"]["num_tokens"] == {"range": [1, 16384], "collapse": True}
    tokens = sorted(set(class_reps(1, 16384).values()) | {3, 255, 4096, 16384})
    global_scale = fake_tensor((), torch.float32)
    quantize_keys, dequantize_keys = set(), set()
    for dtype in (torch.bfloat16, torch.float16):
        for k in (2048, 4096, 7168, 14336):
            for n in tokens:
                variants = trace_call(TARGETS["sm90"], nvfp4_quantize, fake_tensor((n, k), dtype), global_scale)
                assert len(variants) == 1
                quantize_keys |= {(dtype, v.key) for v in variants}
                variants = trace_call(TARGETS["sm90"], nvfp4_dequantize, fake_tensor((n, k // 2), torch.uint8),
                                      fake_tensor((n, k // 16), torch.float8_e4m3fn), global_scale, dtype)
                assert len(variants) == 1
                dequantize_keys |= {(dtype, v.key) for v in variants}
    assert len(quantize_keys) == 2 and len(dequantize_keys) == 2  # one per dtype


@pytest.mark.parametrize("shift", [0, 7])
@pytest.mark.parametrize("global_scale", [1.0, 448 * 6 / 3e38, 2.0**40])
def test_bf16_pair_reading_gives_the_per_element_kernels_bytes_for_every_bf16_value(shift, global_scale):
    """The bf16 fast path (int32 pairs, the shipped rounding) against the per-element kernel with the
    integer rounding, on every bf16 bit pattern
    (NaN and inf blocks, subnormals, ties), at global scales that reach both ends of E4M3."""
    from tritonwarm.launchers.fp4 import nvfp4_quantize_jit, nvfp4_quantize_launch

    bits = torch.arange(1 << 16, dtype=torch.int32).roll(shift * 4099).to(torch.int16)
    x = bits.view(torch.bfloat16).reshape(64, 1024)
    gs = torch.tensor(global_scale, dtype=torch.float32)
    outs = []
    for pairs in (False, True):
        packed = torch.empty(64, 512, dtype=torch.uint8)
        scales = torch.empty(64, 64, dtype=torch.uint8)
        launch = nvfp4_quantize_launch(x, gs, packed, scales)
        assert launch.constexprs["BF16_PAIRS"] is True  # what an aligned bf16 input gets
        launch.constexprs["BF16_PAIRS"] = pairs
        if not pairs:  # the kernel as first shipped: per-element reads, integer rounding
            launch.constexprs["E2M1"] = "integer"
        nvfp4_quantize_jit.launch(launch)
        outs.append((packed, scales))
    assert torch.equal(outs[0][0], outs[1][0]) and torch.equal(outs[0][1], outs[1][1])
