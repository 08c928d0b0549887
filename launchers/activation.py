"""SiLU-and-mul launcher: shapes and dtypes in, launch spec out; plus the ``tritonwarm::silu_and_mul`` op."""

from __future__ import annotations

import torch

from ..jit import JitKernel, Launch
from ..kernels.activation import silu_and_mul_kernel
from ._host import cdiv, next_power_of_2
from ._op import custom_op

MAX_BLOCK = 1024  # output columns per program: 8 bf16 (16 bytes) per thread at 4 warps


def silu_and_mul_launch(x: torch.Tensor, out: torch.Tensor) -> Launch | None:
    n_rows, d = out.shape
    if n_rows == 0 or d == 0:
        return None
    # Every engine size (1408, 10944, 14336) is >= MAX_BLOCK, so they share one BLOCK; only toy
    # sizes get a smaller one.
    block = min(MAX_BLOCK, next_power_of_2(d))
    num_warps = max(1, min(4, block // 256))
    # The row count only sizes the grid, so every batch size shares one binary. The row strides
    # and d are per-model constants: specializing them (div-16) lets the `up` half load vectorize.
    return Launch(
        grid=(n_rows, cdiv(d, block)),
        args=(x, out, x.stride(0), out.stride(0), d),
        constexprs=dict(BLOCK=block),
        num_warps=num_warps,
    )


silu_and_mul_jit = JitKernel(silu_and_mul_kernel, silu_and_mul_launch, memoize=True)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """``silu(x[..., :d]) * x[..., d:]`` for ``x`` of shape ``[..., 2*d]``, fp32 math, ``x``'s dtype out."""
    two_d = x.shape[-1]
    if two_d % 2:
        raise ValueError(f"last dim {two_d} of x is odd: expected [..., 2*d]")
    d = two_d // 2
    two_dims = x.dim() == 2
    x2 = x if two_dims else x.reshape(-1, two_d)  # strided rows stay a view: the kernel takes the row stride
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    out = x2.new_empty((x2.shape[0], d))
    silu_and_mul_jit(x2, out)
    return out if two_dims else out.view(*x.shape[:-1], d)


# The launcher itself is the op's kernel: no wrapper frame on the op's path.
_silu_and_mul_op = custom_op("tritonwarm::silu_and_mul", mutates_args=())(silu_and_mul)


@_silu_and_mul_op.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return x.new_empty((*x.shape[:-1], x.shape[-1] // 2))
