"""CPU tensors run in Triton's interpreter with helper functions, and with two interpreter bugs
fixed for the launch (bf16 tl.dot, a loaded value as a range() bound); compiling afterwards in the
same process still works."""

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
