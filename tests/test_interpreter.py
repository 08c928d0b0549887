"""CPU tensors run in Triton's interpreter with helper functions, and with its bugs fixed for the
launch (bf16 tl.dot, bf16 arithmetic and conversions, a loaded value as a range() bound); compiling
afterwards in the same process still works."""

import pytest
import torch
import triton
import triton.language as tl
from tritonwarm.jit import TARGETS, JitKernel, Launch, fake_tensor, trace_call


@triton.jit
def _double(x):
    return x * 2


@triton.jit
def dot_loop_kernel(a_ptr, b_ptr, n_ptr, out_ptr, N: tl.constexpr):
    rows = tl.arange(0, 16)
    cols = tl.arange(0, N)
    acc = tl.zeros([16, 16], tl.float32)
    count = tl.load(n_ptr)
    for _ in range(0, count):  # a loaded value as the bound
        a = tl.load(a_ptr + rows[:, None] * N + cols[None, :])
        b = tl.load(b_ptr + cols[:, None] * 16 + rows[None, :])
        acc += tl.dot(a, b, input_precision="ieee")  # bf16 operands
    tl.store(out_ptr + rows[:, None] * 16 + rows[None, :], _double(acc))


def launch_spec(a, b, n, out):
    return Launch(grid=(1,), args=(a, b, n, out), constexprs={"N": a.shape[1]})


dot_loop = JitKernel(dot_loop_kernel, launch_spec)


def test_bf16_dot_helper_and_loaded_range_bound():
    g = torch.Generator().manual_seed(0)
    a = torch.randn(16, 32, generator=g).to(torch.bfloat16)
    b = torch.randn(32, 16, generator=g).to(torch.bfloat16)
    out = torch.empty(16, 16)
    dot_loop(a, b, torch.tensor([3], dtype=torch.int32), out)
    expected = 2 * 3 * (a.float() @ b.float())
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-4)


@pytest.mark.slow
def test_compiling_after_interpreting_in_one_process(compile_call):
    test_bf16_dot_helper_and_loaded_range_bound()
    [(variant, _)] = compile_call("sm90", dot_loop, fake_tensor((16, 32), torch.bfloat16),
                                  fake_tensor((32, 16), torch.bfloat16), fake_tensor((1,), torch.int32),
                                  fake_tensor((16, 16), torch.float32))
    assert variant.args["a_ptr"] == "*bf16 aligned" and variant.args["N"] == "=32"
    # and the interpreter's language patches are gone: a trace sees real Triton again
    assert trace_call(TARGETS["gfx942"], dot_loop, fake_tensor((16, 32), torch.bfloat16),
                      fake_tensor((32, 16), torch.bfloat16), fake_tensor((1,), torch.int32),
                      fake_tensor((16, 16), torch.float32))


@triton.jit
def bf16_ops_kernel(a_ptr, b_ptr, c_ptr, f_ptr, out_ptr, cmp_ptr, widened_ptr, N: tl.constexpr):
    i = tl.arange(0, N)
    a, b, c = tl.load(a_ptr + i), tl.load(b_ptr + i), tl.load(c_ptr + i)
    results = (a + b, a - b, a * b, a / b, tl.fma(a, b, c), tl.minimum(a, b), tl.maximum(a, b),
               tl.maximum(a, b, propagate_nan=tl.PropagateNan.ALL), -a, tl.load(f_ptr + i).to(tl.bfloat16))
    for k in tl.static_range(len(results)):
        tl.store(out_ptr + k * N + i, results[k])
    tl.store(cmp_ptr + i, (a < b).to(tl.int8))
    tl.store(cmp_ptr + N + i, (a == b).to(tl.int8))
    tl.store(cmp_ptr + 2 * N + i, (a != b).to(tl.int8))
    tl.store(cmp_ptr + 3 * N + i, (a >= b).to(tl.int8))
    tl.store(widened_ptr + i, a.to(tl.float32))


bf16_ops = JitKernel(bf16_ops_kernel, lambda a, b, c, f, out, cmp, widened: Launch(
    grid=(1,), args=(a, b, c, f, out, cmp, widened), constexprs={"N": a.numel()}))


def test_bf16_arithmetic_rounds_once_as_the_gpu_does():
    """The interpreter keeps bf16 as uint16 and computed on the bit patterns as integers (1.0 * 2**97
    gave 0). Fixed, each op is the exact result rounded once to bf16 (to nearest even), which is what
    torch's CPU bf16 ops give for one operation, on every bf16 value as ``a`` (NaN, inf, subnormals)."""
    g = torch.Generator().manual_seed(3)
    n = 1 << 16
    a = torch.arange(n, dtype=torch.int32).to(torch.int16).view(torch.bfloat16)
    b = torch.randint(-(1 << 15), 1 << 15, (n,), generator=g, dtype=torch.int16).view(torch.bfloat16)
    c = torch.randint(-(1 << 15), 1 << 15, (n,), generator=g, dtype=torch.int16).view(torch.bfloat16)
    # fp32 values for the conversion: ties, subnormals and NaN among them (every 7th: a bf16 tie)
    f = (torch.randint(-(1 << 31), 1 << 31, (n,), generator=g, dtype=torch.int64).to(torch.int32)
         | torch.where(torch.arange(n) % 7 == 0, 0x8000, 0).to(torch.int32)).view(torch.float32)
    out = torch.empty(10, n, dtype=torch.bfloat16)
    cmp = torch.empty(4, n, dtype=torch.int8)
    widened = torch.empty(n)
    bf16_ops(a, b, c, f, out, cmp, widened)
    fma = (a.double() * b.double() + c.double()).float().to(torch.bfloat16)
    expected = (a + b, a - b, a * b, a / b, fma, torch.fmin(a, b), torch.fmax(a, b), torch.maximum(a, b), -a,
                f.to(torch.bfloat16))
    names = ("add", "sub", "mul", "div", "fma", "min", "max", "max keeping NaN", "neg", "fp32 to bf16")
    # a signaling NaN: the GPU's min / max ignore it as any NaN (PTX), torch's CPU fmin does not
    signaling = _signaling_nan(a) | _signaling_nan(b)
    for name, got, want in zip(names, out, expected, strict=True):
        keep = ~signaling if name in ("min", "max") else torch.ones(n, dtype=torch.bool)
        got, want = got[keep], want[keep]
        assert torch.equal(got.isnan(), want.isnan()), name
        assert torch.equal(got[~want.isnan()].float(), want[~want.isnan()].float()), name
    for got, want in zip(cmp.bool(), (a < b, a == b, a != b, a >= b), strict=True):  # NaN: only != holds
        assert torch.equal(got, want)
    assert torch.equal(widened.isnan(), a.isnan()) and torch.equal(widened[~a.isnan()], a.float()[~a.isnan()])


def _signaling_nan(x: torch.Tensor) -> torch.Tensor:
    return x.isnan() & ((x.view(torch.int16) & 0x40) == 0)
