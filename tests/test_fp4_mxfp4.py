"""MXFP4 quantize / dequantize: bit-exact against the spec-level reference, spec examples with
hand-computed codes, adversarial blocks, the NaN / inf / zero conventions, compile and warm-up spec."""

from pathlib import Path

import pytest
import torch
import yaml
from tritonwarm.jit import TARGETS, class_reps, fake_tensor, trace_call
from tritonwarm.kernels.fp4 import mxfp4_dequantize_reference, mxfp4_quantize_reference
from tritonwarm.launchers.fp4 import mxfp4_dequantize, mxfp4_quantize

DTYPES = [torch.float32, torch.bfloat16, torch.float16]
SPEC_FILE = Path(__file__).resolve().parents[1] / "warmup_specs" / "mxfp4.yaml"


def quantize_and_compare(x):
    packed, scales = mxfp4_quantize(x)
    ref_packed, ref_scales = mxfp4_quantize_reference(x)
    assert packed.dtype == torch.uint8 and scales.dtype == torch.uint8
    assert packed.shape == x.shape[:-1] + (x.shape[-1] // 2,)
    assert scales.shape == x.shape[:-1] + (x.shape[-1] // 32,)
    assert torch.equal(scales, ref_scales), (scales != ref_scales).nonzero()[:5]
    assert torch.equal(packed, ref_packed), (packed != ref_packed).nonzero()[:5]
    return packed, scales


def unpack_codes(packed):
    return torch.stack([packed & 0xF, packed >> 4], dim=-1).flatten(-2)


def random_blocks(rows, k, dtype, seed, spread=12):
    """Normal samples with a random power-of-two scale per 32-block, so blocks get different scales."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, k // 32, 32, generator=g)
    exponents = torch.randint(-spread, spread + 1, (rows, k // 32, 1), generator=g)
    return (x * torch.pow(2.0, exponents.float())).reshape(rows, k).to(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 32), (3, 96), (2, 3, 64), (2, 1056), (1, 2048)])
def test_random_inputs_bit_exact(dtype, shape):
    rows = 1
    for s in shape[:-1]:
        rows *= s
    x = random_blocks(rows, shape[-1], dtype, seed=sum(shape)).reshape(shape)
    quantize_and_compare(x)


# One block with the shared exponent 0 (amax 7.9: floor(log2) = 2 = emax of E2M1), and the code the
# spec's round-to-nearest-even with saturation gives each element, worked out by hand.
SPEC_BLOCK = [
    (4.0, 0x6), (0.25, 0x0), (0.75, 0x2), (1.25, 0x2), (1.75, 0x4), (2.5, 0x4), (3.5, 0x6), (5.0, 0x6),
    (0.3, 0x1), (5.5, 0x7), (6.0, 0x7), (7.0, 0x7), (-0.25, 0x0), (-0.75, 0xA), (-1.25, 0xA), (-1.75, 0xC),
    (-2.5, 0xC), (-3.5, 0xE), (-5.0, 0xE), (-0.0, 0x0), (0.0, 0x0), (0.5, 0x1), (1.0, 0x2), (1.5, 0x3),
    (2.0, 0x4), (3.0, 0x5), (-4.0, 0xE), (-6.0, 0xF), (-7.9, 0xF), (0.1, 0x0), (-0.1, 0x0), (0.2, 0x0),
]


@pytest.mark.parametrize("dtype,exponents", [
    (torch.float32, [-127, -100, -3, 0, 7, 100, 125]),
    (torch.bfloat16, [-120, -3, 0, 7, 100, 125]),
    (torch.float16, [-10, -3, 0, 7, 12]),
])
def test_spec_block_gets_hand_computed_codes_at_every_scale(dtype, exponents):
    values = torch.tensor([v for v, _ in SPEC_BLOCK], dtype=torch.float64)
    codes = torch.tensor([c for _, c in SPEC_BLOCK], dtype=torch.uint8)
    x = torch.stack([values * 2.0**e for e in exponents]).to(dtype)
    packed, scales = quantize_and_compare(x)
    assert scales.flatten().tolist() == [127 + e for e in exponents]
    for row in range(len(exponents)):
        assert unpack_codes(packed[row]).tolist() == codes.tolist()
    assert packed[0, 0].item() == 0x06  # elements 0 and 1: low nibble first


def adversarial_blocks(dtype, seed=0):
    """Blocks built to break a sloppy implementation, as [n_blocks, 32]."""
    g = torch.Generator().manual_seed(seed)
    finfo = torch.finfo(dtype)
    lo_exp, hi_exp = (-20, 12) if dtype == torch.float16 else (-120, 120)
    halfway = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0], dtype=torch.float64)
    blocks = []

    def signs(n):
        return torch.where(torch.rand(n, generator=g) < 0.5, -1.0, 1.0).double()

    for e in torch.linspace(lo_exp, hi_exp, 9).round().long().tolist():
        scale = 2.0**e
        # Elements exactly halfway between E2M1 codes, with the block max at a power of two (4 * scale)
        # or at 6 * scale / 7.5 * scale (still the same shared exponent).
        for block_max in (4.0, 6.0, 7.5):
            picks = halfway[torch.randint(0, 7, (31,), generator=g)] * signs(31)
            blocks.append(torch.cat([torch.tensor([block_max]), picks]) * scale)
        # The block max exactly at a power of two, and one representable step below it.
        top = torch.tensor(8.0 * scale, dtype=dtype)
        below = torch.nextafter(top.float(), torch.tensor(0.0)).to(dtype)
        if below == top:  # bf16 / fp16: step down in the input dtype
            below = (top.float() * (1 - finfo.eps / 2)).to(dtype)
        for block_max in (top, below):
            body = torch.rand(31, generator=g, dtype=torch.float64) * 8 * scale * signs(31)
            blocks.append(torch.cat([block_max.double().reshape(1), body]))
    blocks.append(torch.zeros(32, dtype=torch.float64))  # all zero
    blocks.append(torch.full((32,), -0.0, dtype=torch.float64))  # all negative zero
    tiny = finfo.smallest_normal
    blocks.append(torch.rand(32, generator=g, dtype=torch.float64) * tiny * signs(32))  # input subnormals
    blocks.append(torch.cat([torch.tensor([tiny * 2]), torch.rand(31, generator=g).double() * tiny]) * signs(32))
    blocks.append(torch.full((32,), tiny / 2**3))
    huge = torch.rand(32, generator=g, dtype=torch.float64) * 0.5 * finfo.max + 0.5 * finfo.max
    blocks.append(huge * signs(32))
    blocks.append(torch.cat([torch.tensor([finfo.max]), -huge[:31]]))
    mixed = torch.randn(32, generator=g, dtype=torch.float64)
    mixed[::3] = -0.0
    blocks.append(mixed)
    if len(blocks) % 2:
        blocks.append(torch.full((32,), -3.0))
    return torch.stack(blocks).to(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_adversarial_blocks_bit_exact(dtype):
    x = adversarial_blocks(dtype)
    packed, scales = quantize_and_compare(x.reshape(-1, 64))  # two blocks per row
    codes = unpack_codes(packed).reshape(-1, 32)
    zero_blocks = (x == 0).all(dim=-1)
    assert zero_blocks.sum() == 2
    # All-zero blocks, -0.0 included: scale byte 0x00 (2**-127), every code +0.
    assert (scales.flatten()[zero_blocks] == 0).all() and (codes[zero_blocks] == 0).all()
    # No negative zero anywhere: code 0x8 never appears.
    assert not (codes == 0x8).any()


def test_non_finite_blocks_get_nan_scale_and_dequantize_to_nan():
    x = random_blocks(2, 128, torch.bfloat16, seed=3)
    x[0, 5] = float("nan")
    x[0, 40] = float("inf")
    x[1, 70] = float("-inf")
    packed, scales = quantize_and_compare(x)
    assert scales.tolist()[0][:2] == [0xFF, 0xFF] and scales[1, 2] == 0xFF
    assert (scales != 0xFF).sum() == 5
    codes = unpack_codes(packed).reshape(2, 4, 32)
    assert (codes[scales == 0xFF] == 0).all()
    out = mxfp4_dequantize(packed, scales, torch.bfloat16).reshape(2, 4, 32)
    assert torch.isnan(out[scales == 0xFF]).all()
    assert not torch.isnan(out[scales != 0xFF]).any()


@pytest.mark.parametrize("dtype", DTYPES)
def test_round_trip_error_is_within_half_a_code_step(dtype):
    x = random_blocks(4, 256, dtype, seed=11, spread=4)
    packed, scales = mxfp4_quantize(x)
    out = mxfp4_dequantize(packed, scales, torch.float32).double()
    scale = torch.pow(2.0, scales.double() - 127).repeat_interleave(32, dim=-1)
    v = x.double().abs() / scale  # the element in units of its block scale
    # Half the distance between neighbouring E2M1 values (0.25 below 2, 0.5 in [2, 4), 1 in [4, 6]),
    # or the saturation loss above 6 (v < 8 since 2**shared_exp > amax / 8).
    allowed = torch.where(v <= 6, torch.clamp(v / 4, min=0.25), v - 6) * scale
    assert (v < 8).all()
    assert ((out - x.double()).abs() <= allowed).all()
    assert (out - x.double()).abs().max() > 0  # it is lossy: the bound is what is being tested


@pytest.mark.filterwarnings("ignore:overflow encountered")  # 6 * 2**127 is inf in fp32, as it should be
@pytest.mark.parametrize("dtype", DTYPES)
def test_dequantize_exact_for_every_code_and_scale_byte(dtype):
    packed = torch.arange(256, dtype=torch.uint8).repeat(16, 1)  # [16, 256]: every byte in every row
    scales = torch.arange(256, dtype=torch.uint8).reshape(16, 16)  # every E8M0 byte, 0xFF included
    out = mxfp4_dequantize(packed, scales, dtype)
    assert out.shape == (16, 512) and out.dtype == dtype
    # Every MXFP4 value is a power of two times {0.5, 1, 1.5}: exact in every dtype's range.
    torch.testing.assert_close(out, mxfp4_dequantize_reference(packed, scales, dtype), atol=0, rtol=0,
                               equal_nan=True)
    # Spot checks from the spec. Scale byte 127 (2**0) sits in row 7, group 15, whose bytes are
    # 240..255: low nibbles 0..15 at even positions, high nibble 0xF (-6) at odd ones.
    block = out[7, 15 * 32:16 * 32].float()
    signed_values = [0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6]
    assert block[0::2].tolist() == signed_values and (block[1::2] == -6).all()
    if dtype == torch.float32:
        assert out[0, 2].item() == 2.0**-128  # byte 0x01 (0.5) under scale byte 0x00 (2**-127)
    assert torch.isnan(out[15, 15 * 32:]).all()  # scale byte 0xFF


def test_dequantize_round_trips_quantize_codes():
    x = random_blocks(3, 64, torch.float32, seed=5)
    packed, scales = mxfp4_quantize(x)
    again = mxfp4_quantize(mxfp4_dequantize(packed, scales, torch.float32))
    assert torch.equal(again[0], packed) and torch.equal(again[1], scales)


def test_strided_rows_and_leading_dims():
    base = random_blocks(4, 96, torch.bfloat16, seed=6)
    x = base[:, 32:96]  # row stride 96 > K = 64
    packed, scales = quantize_and_compare(x)
    expected = mxfp4_quantize(x.contiguous())
    assert torch.equal(packed, expected[0]) and torch.equal(scales, expected[1])
    out = mxfp4_dequantize(packed.reshape(2, 2, 32), scales.reshape(2, 2, 2), torch.bfloat16)
    assert out.shape == (2, 2, 64)


def test_zero_rows_launch_nothing():
    packed, scales = mxfp4_quantize(torch.empty(0, 64))
    assert packed.shape == (0, 32) and scales.shape == (0, 2)
    assert mxfp4_dequantize(packed, scales, torch.float16).shape == (0, 64)


def test_bad_inputs_raise():
    with pytest.raises(ValueError, match="multiple of 32"):
        mxfp4_quantize(torch.zeros(2, 48))
    with pytest.raises(TypeError):
        mxfp4_quantize(torch.zeros(2, 64, dtype=torch.int32))
    with pytest.raises(ValueError, match="scales shape"):
        mxfp4_dequantize(torch.zeros(2, 32, dtype=torch.uint8), torch.zeros(2, 3, dtype=torch.uint8), torch.float32)
    with pytest.raises(TypeError):
        mxfp4_dequantize(torch.zeros(2, 32, dtype=torch.uint8), torch.zeros(2, 2, dtype=torch.uint8), torch.int8)


def test_custom_ops():
    x = random_blocks(2, 64, torch.bfloat16, seed=7)
    torch.library.opcheck(torch.ops.tritonwarm.mxfp4_quantize.default, (x,))
    packed, scales = torch.ops.tritonwarm.mxfp4_quantize(x)
    assert torch.equal(packed, mxfp4_quantize(x)[0])
    torch.library.opcheck(torch.ops.tritonwarm.mxfp4_dequantize.default, (packed, scales, torch.float16))


@pytest.mark.slow
@pytest.mark.parametrize("target", ["sm90", "gfx942"])
def test_compiles(compile_call, target):
    x = fake_tensor((8, 4096), torch.bfloat16)
    [(variant, _)] = compile_call(target, mxfp4_quantize, x)
    assert variant.args["x_ptr"] == "*bf16 aligned" and variant.args["GROUPS"] == "=32"
    packed = fake_tensor((8, 2048), torch.uint8)
    scales = fake_tensor((8, 128), torch.uint8)
    [(variant, _)] = compile_call(target, mxfp4_dequantize, packed, scales, torch.float16)
    assert variant.args["out_ptr"] == "*fp16 aligned"


def test_warmup_spec_rows_launch_one_variant_per_dtype():
    """Every combination the spec declares, traced by hand; tokens collapse to one variant."""
    quantize_doc, dequantize_doc = yaml.safe_load_all(SPEC_FILE.read_text())
    assert quantize_doc["kernel"] == "tritonwarm.launchers.fp4:mxfp4_quantize"
    assert dequantize_doc["kernel"] == "tritonwarm.launchers.fp4:mxfp4_dequantize"
    for doc in (quantize_doc, dequantize_doc):
        assert doc["targets"] == ["cuda", "hip"]
        assert doc["axes"]["dtype"] == ["bfloat16", "float16"]
        assert doc["axes"]["k"] == [2048, 4096, 7168, 14336]
        assert doc["axes"]["num_tokens"] == {"range": [1, 16384], "collapse": True}
    # Class representatives plus other members of the same classes (the collapse must hold for them).
    tokens = sorted(set(class_reps(1, 16384).values()) | {3, 255, 4096, 16384})
    for target in (TARGETS["sm90"], TARGETS["gfx942"]):
        quantize_keys, dequantize_keys = set(), set()
        for dtype in (torch.bfloat16, torch.float16):
            for k in (2048, 4096, 7168, 14336):
                for n in tokens:
                    variants = trace_call(target, mxfp4_quantize, fake_tensor((n, k), dtype))
                    assert len(variants) == 1
                    quantize_keys |= {(dtype, v.key) for v in variants}
                    variants = trace_call(target, mxfp4_dequantize, fake_tensor((n, k // 2), torch.uint8),
                                          fake_tensor((n, k // 32), torch.uint8), dtype)
                    assert len(variants) == 1
                    dequantize_keys |= {(dtype, v.key) for v in variants}
        assert len(quantize_keys) == 2 and len(dequantize_keys) == 2  # one per dtype


@pytest.mark.parametrize("shift", [0, 7])
@pytest.mark.parametrize("rounding", ["bf16_lines", "lines"])
def test_bf16_pair_reading_gives_the_per_element_kernels_bytes_for_every_bf16_value(shift, rounding):
    """The bf16 fast path (int32 pairs; the FMA lines in bf16 as shipped, or in fp32) against the
    per-element kernel with the integer rounding, on every bf16 bit pattern
    (NaN and inf blocks, subnormals, ties) in blocks mixed two ways."""
    from tritonwarm.launchers.fp4 import mxfp4_quantize_jit, mxfp4_quantize_launch

    bits = torch.arange(1 << 16, dtype=torch.int32).roll(shift * 4099).to(torch.int16)
    x = bits.view(torch.bfloat16).reshape(64, 1024)
    outs = []
    for pairs in (False, True):
        packed = torch.empty(64, 512, dtype=torch.uint8)
        scales = torch.empty(64, 32, dtype=torch.uint8)
        launch = mxfp4_quantize_launch(x, packed, scales)
        # what an aligned bf16 input gets
        assert launch.constexprs["BF16_PAIRS"] is True and launch.constexprs["E2M1"] == "bf16_lines"
        launch.constexprs.update(BF16_PAIRS=pairs, E2M1=rounding)
        if not pairs:  # the kernel as first shipped: per-element reads, integer rounding
            launch.constexprs["E2M1"] = "integer"
        mxfp4_quantize_jit.launch(launch)
        outs.append((packed, scales))
    assert torch.equal(outs[0][0], outs[1][0]) and torch.equal(outs[0][1], outs[1][1])


def test_offset_and_other_dtype_views_keep_the_per_element_kernel():
    from tritonwarm.launchers.fp4 import mxfp4_quantize_launch

    def pairs(x):
        out = torch.empty(x.shape[0], x.shape[1] // 2, dtype=torch.uint8)
        return mxfp4_quantize_launch(x, out, torch.empty(x.shape[0], x.shape[1] // 32, dtype=torch.uint8)
                                     ).constexprs["BF16_PAIRS"]

    base = torch.zeros(4 * 64 + 1, dtype=torch.bfloat16)
    assert pairs(base[:256].view(4, 64)) and not pairs(base[1:].view(4, 64))
    assert not pairs(torch.zeros(4, 64, dtype=torch.float16))
    assert not pairs(torch.zeros(4, 97, dtype=torch.bfloat16)[:, :64])  # odd row stride
