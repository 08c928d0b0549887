"""A third-party-style module, as libraries ship Triton code: host functions that pick block sizes from the
device (``torch.cuda.get_device_properties``, an ``is_hip()`` check) and launch ``kernel[grid](...)``
themselves, one kernel autotuned, one with heuristics. tritonwarm warms it without a rewrite: a spec
names ``softmax`` / ``add_bias_gelu`` with ``capture: all`` (see ``thirdparty_ops.yaml``).

    PYTHONPATH=.. python -m tritonwarm warmup examples/thirdparty_ops.yaml --target sm90,gfx942
    PYTHONPATH=.. python -m tritonwarm check examples/thirdparty_ops.yaml --target sm90,gfx942
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


def is_hip() -> bool:
    return torch.version.hip is not None


@triton.jit
def softmax_kernel(out_ptr, in_ptr, in_stride, out_stride, n_rows, n_cols, BLOCK: tl.constexpr):
    start = tl.program_id(0)
    for row in range(start, n_rows, tl.num_programs(0)):
        cols = tl.arange(0, BLOCK)
        mask = cols < n_cols
        x = tl.load(in_ptr + row * in_stride + cols, mask=mask, other=-float("inf")).to(tl.float32)
        x = x - tl.max(x, axis=0)
        e = tl.exp(x)
        tl.store(out_ptr + row * out_stride + cols, (e / tl.sum(e, axis=0)).to(out_ptr.dtype.element_ty), mask=mask)


def softmax(x: torch.Tensor) -> torch.Tensor:
    """Row softmax; a persistent grid sized from the device's SM count, warps from the backend."""
    n_rows, n_cols = x.shape
    out = torch.empty_like(x)
    block = triton.next_power_of_2(n_cols)
    num_warps = 8 if block >= 2048 else 4
    if is_hip():
        num_warps = min(num_warps * 2, 16)  # 64-wide wavefronts
    sms = torch.cuda.get_device_properties(x.device).multi_processor_count
    grid = (min(n_rows, sms * 2),)
    softmax_kernel[grid](out, x, x.stride(0), out.stride(0), n_rows, n_cols, BLOCK=block, num_warps=num_warps)
    return out


@triton.autotune(configs=[triton.Config({"BLOCK": 256}, num_warps=2), triton.Config({"BLOCK": 1024}, num_warps=4)],
                 key=["n"])
@triton.heuristics({"EVEN": lambda args: args["n"] % args["BLOCK"] == 0})
@triton.jit
def bias_gelu_kernel(x_ptr, bias_ptr, out_ptr, n, width, BLOCK: tl.constexpr, EVEN: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = None if EVEN else offs < n
    x = tl.load(x_ptr + offs, mask=mask).to(tl.float32) + tl.load(bias_ptr + offs % width, mask=mask).to(tl.float32)
    y = 0.5 * x * (1 + tl.erf(x * 0.7071067811865476))
    tl.store(out_ptr + offs, y.to(out_ptr.dtype.element_ty), mask=mask)


def add_bias_gelu(x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    out = torch.empty_like(x)
    n = x.numel()
    bias_gelu_kernel[lambda meta: (triton.cdiv(n, meta["BLOCK"]),)](x, bias, out, n, bias.numel())
    return out


def mlp_block(x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """What a model layer does: two library calls."""
    return softmax(add_bias_gelu(x, bias))
