"""An in-house kernel as teams write them: ``@triton.autotune`` over block sizes and warps, pruned by the
row length, with ``@triton.heuristics`` deciding whether the row needs a mask. Adopting tritonwarm
takes the ``JitKernel`` line at the bottom; the kernel and its decorators stay as they are.

    PYTHONPATH=.. python -m tritonwarm warmup examples/inhouse_autotuned.yaml --target sm90,gfx942
    PYTHONPATH=.. python -m tritonwarm tune examples/inhouse_autotuned.yaml --target local   # on the GPU
    PYTHONPATH=.. python -m tritonwarm check examples/inhouse_autotuned.yaml --target sm90
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..jit import JitKernel, Launch


def _fits_the_row(configs, named_args, **kwargs):
    """Blocks much longer than a row only waste lanes: keep the ones up to the row's power of two."""
    limit = max(triton.next_power_of_2(int(named_args["n_cols"])), 64)
    return [c for c in configs if c.kwargs["BLOCK"] <= limit] or configs[:1]


@triton.autotune(
    configs=[
        triton.Config({"BLOCK": 64}, num_warps=1),
        triton.Config({"BLOCK": 256}, num_warps=2),
        triton.Config({"BLOCK": 1024}, num_warps=4),
        triton.Config({"BLOCK": 4096}, num_warps=8),
    ],
    key=["n_cols"],
    prune_configs_by={"early_config_prune": _fits_the_row},
    cache_results=True,
)
@triton.heuristics({"EVEN": lambda args: args["n_cols"] % args["BLOCK"] == 0})
@triton.jit
def scale_rows_kernel(x_ptr, scale_ptr, out_ptr, n_cols, x_stride, out_stride,
                      BLOCK: tl.constexpr, EVEN: tl.constexpr):
    row = tl.program_id(0)
    scale = tl.load(scale_ptr + row).to(tl.float32)
    for start in range(0, n_cols, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        if EVEN:
            x = tl.load(x_ptr + row * x_stride + cols).to(tl.float32)
            tl.store(out_ptr + row * out_stride + cols, (x * scale).to(out_ptr.dtype.element_ty))
        else:
            mask = cols < n_cols
            x = tl.load(x_ptr + row * x_stride + cols, mask=mask, other=0.0).to(tl.float32)
            tl.store(out_ptr + row * out_stride + cols, (x * scale).to(out_ptr.dtype.element_ty), mask=mask)


def scale_rows_launch(x: torch.Tensor, scale: torch.Tensor, out: torch.Tensor) -> Launch | None:
    """Grid and arguments only: the block and warps come from the autotuner, EVEN from the heuristic."""
    n_rows, n_cols = x.shape
    if n_rows == 0:
        return None
    return Launch(grid=(n_rows,), args=(x, scale, out, n_cols, x.stride(0), out.stride(0)))


scale_rows_jit = JitKernel(scale_rows_kernel, scale_rows_launch)


def scale_rows(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """``out[i, :] = x[i, :] * scale[i]``."""
    out = torch.empty_like(x)
    scale_rows_jit(x, scale, out)
    return out
