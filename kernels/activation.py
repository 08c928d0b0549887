"""SiLU-and-mul (the gated MLP activation) device code, and its PyTorch reference."""

import torch
import torch.nn.functional as F
import triton
import triton.language as tl


@triton.jit
def silu_and_mul_kernel(
    x_ptr, out_ptr,
    x_row_stride, out_row_stride, d,
    BLOCK: tl.constexpr,
):
    # Grid: (rows, column blocks of the output). Rows go on axis 0, the only one CUDA lets exceed
    # 65535 (MoE layers run num_tokens * top_k rows); a fixed BLOCK keeps one binary per dtype.
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < d
    gate_ptrs = x_ptr + row * x_row_stride + cols
    gate = tl.load(gate_ptrs, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(gate_ptrs + d, mask=mask, other=0.0).to(tl.float32)
    # x / (1 + exp(-x)) is torch's own formula: silu(-inf) = -inf / inf = nan, as torch gives,
    # and a large negative x gives -0 (exp overflows to inf), as torch gives.
    silu = gate / (1.0 + tl.exp(-gate))
    tl.store(out_ptr + row * out_row_stride + cols, (silu * up).to(out_ptr.dtype.element_ty), mask=mask)


def silu_and_mul_reference(x: torch.Tensor) -> torch.Tensor:
    """``silu(x[..., :d]) * x[..., d:]`` computed in fp32, returned in ``x``'s dtype."""
    d = x.shape[-1] // 2
    gate, up = x[..., :d].float(), x[..., d:].float()
    return (F.silu(gate) * up).to(x.dtype)
