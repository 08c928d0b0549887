"""The E2M1 roundings of the quantize kernels (the FMA lines they ship, the FP adder before them)
agree with the generic integer rounding on every bf16 value and on the fp32 neighbours of every E2M1
tie, so do the FP adder's E4M3 scale codes, and both quantize kernels give the same bytes with each
rounding, pairs read or not (Triton's interpreter)."""

import numpy as np
import pytest
import torch
import triton
import triton.language as tl
from tritonwarm.jit import JitKernel, Launch
from tritonwarm.kernels.fp4 import _e2m1_codes, _e2m1_lines, _minifloat_code, _minifloat_code_fast
from tritonwarm.launchers.fp4 import (
    mxfp4_quantize_jit,
    mxfp4_quantize_launch,
    nvfp4_quantize_jit,
    nvfp4_quantize_launch,
)


@triton.jit
def _both_roundings_kernel(x_ptr, fast_ptr, generic_ptr, n, BLOCK: tl.constexpr, E4M3: tl.constexpr,
                           E2M1: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < n
    x = tl.load(x_ptr + offs, mask=ok, other=0.0)
    if E4M3:
        fast = _minifloat_code_fast(x, MANTISSA_BITS=3, MIN_EXP=-6, MAX_VALUE=448.0, SIGN_SHIFT=7)
        generic = _minifloat_code(x, MANTISSA_BITS=3, MIN_EXP=-6, MAX_CODE=0x7E, SIGN_SHIFT=7)
    else:
        fast = _e2m1_codes(x, E2M1)
        generic = _minifloat_code(x, MANTISSA_BITS=1, MIN_EXP=0, MAX_CODE=7, SIGN_SHIFT=3)
    tl.store(fast_ptr + offs, fast, mask=ok)
    tl.store(generic_ptr + offs, generic, mask=ok)


@triton.jit
def _scaled_lines_kernel(x_ptr, out_ptr, n, scale, BLOCK: tl.constexpr):
    """``_e2m1_lines`` as the pair path uses it: a power-of-two scale folded into its FMAs."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < n
    x = tl.load(x_ptr + offs, mask=ok, other=0.0)
    tl.store(out_ptr + offs, _e2m1_lines(tl.abs(x), scale) & 7, mask=ok)


_BLOCK = 4096
both_roundings = JitKernel(_both_roundings_kernel, lambda x, fast, generic, e4m3, e2m1: Launch(
    grid=(triton.cdiv(x.numel(), _BLOCK),), args=(x, fast, generic, x.numel()),
    constexprs=dict(BLOCK=_BLOCK, E4M3=e4m3, E2M1=e2m1)))
scaled_lines = JitKernel(_scaled_lines_kernel, lambda x, out, scale: Launch(
    grid=(triton.cdiv(x.numel(), _BLOCK),), args=(x, out, x.numel(), scale), constexprs=dict(BLOCK=_BLOCK)))


def _hard_values(ties: list[float]) -> torch.Tensor:
    every_bf16 = torch.arange(-(1 << 15), 1 << 15, dtype=torch.int32).to(torch.int16).view(torch.bfloat16).float()
    finite_bf16 = every_bf16[torch.isfinite(every_bf16)]
    bits = torch.tensor(ties).view(torch.int32)[:, None] + torch.arange(-3, 4, dtype=torch.int32)
    neighbours = bits.flatten().view(torch.float32)
    specials = torch.tensor([0.0, float("inf"), 1e-45, 1.17e-38, 3.4e38, 1e30])
    values = torch.cat([finite_bf16, neighbours, specials, torch.rand(4096) * 8])
    return torch.cat([values, -values])


E2M1_TIES = [0.25, 0.5, 0.75, 1.0, 1.25, 1.75, 2.0, 2.5, 3.5, 4.0, 5.0, 6.0, 7.0, 8.0]
# E4M3: around the subnormal quanta, the normal range's first and last binades, the saturation point.
E4M3_TIES = [2.0**-10, 1.5 * 2.0**-9, 2.0**-6, 1.0625 * 2.0**-6, 1.0, 1.0625, 1.1875, 240.0, 416.0, 432.0, 448.0,
             464.0, 480.0]


@pytest.mark.parametrize("e4m3, e2m1", [(False, "lines"), (False, "adder"), (True, "adder")],
                         ids=["e2m1-lines", "e2m1-adder", "e4m3-adder"])
def test_fast_rounding_matches_generic_on_every_bf16_value_and_each_tie(e4m3, e2m1):
    x = _hard_values(E4M3_TIES if e4m3 else E2M1_TIES).contiguous()
    fast = torch.empty(x.numel(), dtype=torch.int32)
    generic = torch.empty_like(fast)
    with np.errstate(over="ignore", invalid="ignore"):
        both_roundings(x, fast, generic, e4m3, e2m1)
    differ = (fast != generic).nonzero().flatten()
    assert differ.numel() == 0, [(x[i].item(), fast[i].item(), generic[i].item()) for i in differ[:5]]
    sign, max_code = (0x80, 0x7E) if e4m3 else (8, 7)  # the sample reaches every code, both signs
    assert set(generic.unique().tolist()) == set(range(max_code + 1)) | {c | sign for c in range(1, max_code + 1)}


@pytest.mark.parametrize("exponent", [-3, 0, 5])
def test_lines_with_a_folded_scale_match_generic(exponent):
    """The block's power-of-two scale rides in the FMAs: the same magnitude codes as rounding the
    scaled value generically."""
    x = _hard_values(E2M1_TIES).contiguous() * 2.0**-exponent  # exact: powers of two, nothing leaves fp32
    scaled = x * 2.0**exponent
    lines = torch.empty(x.numel(), dtype=torch.int32)
    fast = torch.empty_like(lines)
    generic = torch.empty_like(lines)
    with np.errstate(over="ignore", invalid="ignore"):
        scaled_lines(x, lines, 2.0**exponent)
        both_roundings(scaled, fast, generic, False, "integer")
    finite = torch.isfinite(scaled)
    assert torch.equal(lines[finite], (generic & 7)[finite])


@pytest.mark.parametrize("fmt", ["mxfp4", "nvfp4"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_quantize_kernels_give_the_same_bytes_with_each_rounding(fmt, dtype):
    g = torch.Generator().manual_seed(7)
    x = (torch.randn(3, 512, generator=g) * torch.pow(2.0, torch.randint(-20, 20, (3, 512), generator=g).float()))
    x = x.to(dtype)
    block = 32 if fmt == "mxfp4" else 16
    outs = []
    for rounding in ("integer", "adder", "lines", "bf16_lines"):
        for pairs in (False, True) if dtype == torch.bfloat16 else (False,):
            if rounding == "bf16_lines" and not (fmt == "mxfp4" and pairs):  # bf16 arithmetic: MXFP4's bf16 pairs
                continue
            packed = torch.empty(3, 256, dtype=torch.uint8)
            scales = torch.empty(3, 512 // block, dtype=torch.uint8)
            if fmt == "mxfp4":
                launch = mxfp4_quantize_launch(x, packed, scales)
                jit = mxfp4_quantize_jit
            else:
                launch = nvfp4_quantize_launch(x, torch.tensor(448 * 6 / x.float().abs().max().item()), packed,
                                               scales)
                jit = nvfp4_quantize_jit
            launch.constexprs.update(E2M1=rounding, BF16_PAIRS=pairs)
            jit.launch(launch)
            outs.append((rounding, pairs, packed, scales))
    assert any(r == "bf16_lines" for r, *_ in outs) == (fmt == "mxfp4" and dtype == torch.bfloat16)
    _, _, packed0, scales0 = outs[0]
    differ = [(r, p) for r, p, packed, scales in outs
              if not (torch.equal(packed, packed0) and torch.equal(scales, scales0))]
    assert not differ


@pytest.mark.slow
@pytest.mark.parametrize("target", ["sm90", "gfx942"])
def test_quantize_binaries_keep_fp32_subnormals(compile_call, target):
    """``_e2m1_lines`` multiplies a block of MXFP4's largest values by a subnormal 2**-127: exact only
    where fp32 subnormals are not flushed to zero, in the binary the runtime launches."""
    from tritonwarm.jit import fake_tensor
    from tritonwarm.launchers.fp4 import mxfp4_quantize

    [(_, compiled)] = compile_call(target, mxfp4_quantize, fake_tensor((8, 4096), torch.bfloat16))
    if target == "sm90":
        ptx = compiled.asm["ptx"]
        assert ".ftz" not in ptx
        # the lines in bf16, two elements per instruction (bf16 arithmetic has no flush-to-zero mode)
        assert "fma.rn.bf16x2" in ptx
    else:  # 3: fp32 denormals kept on input and output
        assert ".amdhsa_float_denorm_mode_32 3" in compiled.asm["amdgcn"]


def test_bf16_arithmetic_is_refused_where_it_would_round_twice():
    """NVFP4 rounds each product to fp32 first (as vLLM does): the bf16 lines would round it again.
    And the bf16 lines compute on element pairs, which only the BF16_PAIRS reading gives."""
    x = torch.ones(2, 64, dtype=torch.bfloat16)
    packed = torch.empty(2, 32, dtype=torch.uint8)
    launch = nvfp4_quantize_launch(x, torch.tensor(1.0), packed, torch.empty(2, 4, dtype=torch.uint8))
    launch.constexprs["E2M1"] = "bf16_lines"
    with pytest.raises(Exception, match="round them twice"):
        nvfp4_quantize_jit.launch(launch)
    launch = mxfp4_quantize_launch(x, packed, torch.empty(2, 2, dtype=torch.uint8))
    launch.constexprs["BF16_PAIRS"] = False
    with pytest.raises(Exception, match="computes on bf16 pairs"):
        mxfp4_quantize_jit.launch(launch)
