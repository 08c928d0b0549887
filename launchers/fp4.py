"""MXFP4 / NVFP4 quantize and dequantize launchers: shapes and dtypes in, launch specs out.

Formats, rounding and the NaN / inf / zero-block conventions are documented in ``kernels/fp4.py``.
Every kernel takes a [rows, K] view (unit stride along K) and runs on a (rows, K chunks) grid.
"""

from __future__ import annotations

import torch

from ..jit import JitKernel, Launch
from ..kernels.fp4 import (
    MXFP4_BLOCK,
    NVFP4_BLOCK,
    mxfp4_dequantize_kernel,
    mxfp4_quantize_kernel,
    nvfp4_dequantize_kernel,
    nvfp4_quantize_kernel,
)
from ._host import cdiv, next_power_of_2
from ._op import custom_op

INPUT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
_ELEMENTS_PER_PROGRAM = 1024  # 8 elements per thread at 4 warps (dequantize), 16 at 2 (quantize)
# The quantize kernels are issue bound: rounding to E2M1 with integer arithmetic cost ~40 SASS
# instructions per element on sm90. The FP adder's rounding and 2 warps per program (per-thread
# setup paid over 16 elements) took the H200, 4096x7168 bf16 (bench/fp4_variants.py), from 28 % to
# 49 % (mxfp4) / 44 % (nvfp4) of copy bandwidth; 1 warp was faster there (52 % / 47 %) but ~1 us
# slower at 16 tokens, 4 warps the other way round. Now: the code is the minimum of three FMA lines
# ("lines", kernels/fp4.py: _e2m1_lines), and bf16 input reads element pairs as int32 (BF16_PAIRS);
# MXFP4 on bf16 pairs computes those lines in bf16 ("bf16_lines"), two elements per instruction.
# sm90 SASS per element, offline (bench/sass_count.py): mxfp4 25.5 -> 16.4, nvfp4 37.1 -> 28.1;
# not yet timed on a GPU.
_E2M1 = "lines"
_E2M1_MXFP4_BF16_PAIRS = "bf16_lines"  # NVFP4 rounds its products in fp32 first: bf16 would round again
_QUANTIZE_WARPS = 2


def _groups_per_program(n_groups: int, block: int) -> int:
    return min(_ELEMENTS_PER_PROGRAM // block, next_power_of_2(n_groups))


def _grid_launch(n_rows: int, n_groups: int, block: int, args: tuple, num_warps: int = 4,
                 **constexprs) -> Launch | None:
    # The token count only sizes the grid (rows are never passed), so every batch size shares one
    # binary; K, the group count and the row strides are per-model constants worth specializing.
    if n_rows == 0 or n_groups == 0:
        return None
    groups = _groups_per_program(n_groups, block)
    return Launch(grid=(n_rows, cdiv(n_groups, groups)), args=args + (n_groups,),
                  constexprs=dict(GROUPS=groups, **constexprs), num_warps=num_warps)


def _bf16_pairs(x) -> bool:
    """Whether bf16 ``x`` can be read as int32 pairs: 16-byte aligned (what dispatch keys tell apart;
    4 would do) with even row strides. Aligned rows are the one class the warm-up specs declare, so
    this adds no binary; fp16 / fp32 and offset views keep the per-element kernel."""
    return x.dtype == torch.bfloat16 and x.data_ptr() % 16 == 0 and (x.shape[0] <= 1 or x.stride(0) % 2 == 0)


def mxfp4_quantize_launch(x, packed, scales) -> Launch | None:
    pairs = _bf16_pairs(x)
    return _grid_launch(x.shape[0], x.shape[1] // MXFP4_BLOCK, MXFP4_BLOCK,
                        (x, packed, scales, x.stride(0), packed.stride(0), scales.stride(0)),
                        num_warps=_QUANTIZE_WARPS, BF16_PAIRS=pairs,
                        E2M1=_E2M1_MXFP4_BF16_PAIRS if pairs else _E2M1)


def mxfp4_dequantize_launch(packed, scales, out) -> Launch | None:
    return _grid_launch(out.shape[0], out.shape[1] // MXFP4_BLOCK, MXFP4_BLOCK,
                        (packed, scales, out, packed.stride(0), scales.stride(0), out.stride(0)))


def nvfp4_quantize_launch(x, global_scale, packed, scales) -> Launch | None:
    return _grid_launch(x.shape[0], x.shape[1] // NVFP4_BLOCK, NVFP4_BLOCK,
                        (x, global_scale, packed, scales, x.stride(0), packed.stride(0), scales.stride(0)),
                        num_warps=_QUANTIZE_WARPS, BF16_PAIRS=_bf16_pairs(x), E2M1=_E2M1)


def nvfp4_dequantize_launch(packed, scales, global_scale, out) -> Launch | None:
    return _grid_launch(out.shape[0], out.shape[1] // NVFP4_BLOCK, NVFP4_BLOCK,
                        (packed, scales, global_scale, out, packed.stride(0), scales.stride(0), out.stride(0)))


mxfp4_quantize_jit = JitKernel(mxfp4_quantize_kernel, mxfp4_quantize_launch, memoize=True)
mxfp4_dequantize_jit = JitKernel(mxfp4_dequantize_kernel, mxfp4_dequantize_launch, memoize=True)
nvfp4_quantize_jit = JitKernel(nvfp4_quantize_kernel, nvfp4_quantize_launch, memoize=True)
nvfp4_dequantize_jit = JitKernel(nvfp4_dequantize_kernel, nvfp4_dequantize_launch, memoize=True)


# --------------------------------------------------------------------------- shape checks

def _rows(x: torch.Tensor, block: int, name: str) -> torch.Tensor:
    """``x`` as [rows, K] with a unit stride along K, after checking dtype and K % block."""
    if x.dtype not in INPUT_DTYPES:
        raise TypeError(f"{name} input must be bfloat16, float16 or float32, got {x.dtype}")
    if x.dim() == 0 or x.shape[-1] % block != 0:
        raise ValueError(f"{name} needs the last dim to be a multiple of {block}, got shape {tuple(x.shape)}")
    x2 = x.reshape(-1, x.shape[-1])
    return x2 if x2.stride(-1) == 1 else x2.contiguous()


def _packed_rows(packed: torch.Tensor, scales: torch.Tensor, block: int, name: str):
    if packed.dtype != torch.uint8:
        raise TypeError(f"{name}: packed must be uint8, got {packed.dtype}")
    k = packed.shape[-1] * 2 if packed.dim() else 0
    if packed.dim() == 0 or k % block != 0:
        raise ValueError(f"{name}: packed last dim must be a multiple of {block // 2}, got {tuple(packed.shape)}")
    if scales.shape != packed.shape[:-1] + (k // block,):
        raise ValueError(f"{name}: scales shape {tuple(scales.shape)} does not match packed {tuple(packed.shape)}")
    packed2 = packed.reshape(-1, k // 2)
    scales2 = scales.reshape(-1, k // block)
    return (packed2 if packed2.stride(-1) == 1 else packed2.contiguous(),
            scales2 if scales2.stride(-1) == 1 else scales2.contiguous(), k)


def _check_global_scale(global_scale: torch.Tensor) -> torch.Tensor:
    if global_scale.dtype != torch.float32 or global_scale.numel() != 1 or global_scale.dim() > 1:
        raise ValueError("global_scale must be a 0-d or [1] float32 tensor")
    return global_scale


def _check_out_dtype(dtype: torch.dtype) -> None:
    if dtype not in INPUT_DTYPES:
        raise TypeError(f"dequantize dtype must be bfloat16, float16 or float32, got {dtype}")


# --------------------------------------------------------------------------- public API

def mxfp4_quantize(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """OCP MXFP4: ``(packed uint8 [..., K/2], E8M0 scales uint8 [..., K/32])``; K % 32 == 0."""
    x2 = _rows(x, MXFP4_BLOCK, "mxfp4_quantize")
    k = x2.shape[1]
    packed = torch.empty((x2.shape[0], k // 2), dtype=torch.uint8, device=x.device)
    scales = torch.empty((x2.shape[0], k // MXFP4_BLOCK), dtype=torch.uint8, device=x.device)
    mxfp4_quantize_jit(x2, packed, scales)
    lead = tuple(x.shape[:-1])
    return packed.view(lead + (k // 2,)), scales.view(lead + (k // MXFP4_BLOCK,))


def mxfp4_dequantize(packed: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """MXFP4 back to ``dtype`` ([..., K]); exact (every MXFP4 value is representable) unless it
    overflows or underflows ``dtype``."""
    _check_out_dtype(dtype)
    if scales.dtype != torch.uint8:
        raise TypeError(f"mxfp4_dequantize: scales must be uint8 (E8M0), got {scales.dtype}")
    packed2, scales2, k = _packed_rows(packed, scales, MXFP4_BLOCK, "mxfp4_dequantize")
    out = torch.empty((packed2.shape[0], k), dtype=dtype, device=packed.device)
    mxfp4_dequantize_jit(packed2, scales2, out)
    return out.view(tuple(packed.shape[:-1]) + (k,))


def nvfp4_quantize(x: torch.Tensor, global_scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """NVFP4: ``(packed uint8 [..., K/2], scales float8_e4m3fn [..., K/16])``; K % 16 == 0.

    ``global_scale`` (0-d or [1] fp32, usually 448 * 6 / amax(x)) multiplies x into the FP8 scale range.
    """
    x2 = _rows(x, NVFP4_BLOCK, "nvfp4_quantize")
    _check_global_scale(global_scale)
    k = x2.shape[1]
    packed = torch.empty((x2.shape[0], k // 2), dtype=torch.uint8, device=x.device)
    scale_bits = torch.empty((x2.shape[0], k // NVFP4_BLOCK), dtype=torch.uint8, device=x.device)
    nvfp4_quantize_jit(x2, global_scale, packed, scale_bits)
    lead = tuple(x.shape[:-1])
    return packed.view(lead + (k // 2,)), scale_bits.view(lead + (k // NVFP4_BLOCK,)).view(torch.float8_e4m3fn)


def nvfp4_dequantize(packed: torch.Tensor, scales: torch.Tensor, global_scale: torch.Tensor,
                     dtype: torch.dtype) -> torch.Tensor:
    """NVFP4 back to ``dtype`` ([..., K]): e2m1 * (scale / global_scale), rounded once to ``dtype``."""
    _check_out_dtype(dtype)
    _check_global_scale(global_scale)
    if scales.dtype not in (torch.float8_e4m3fn, torch.uint8):
        raise TypeError(f"nvfp4_dequantize: scales must be float8_e4m3fn, got {scales.dtype}")
    packed2, scales2, k = _packed_rows(packed, scales.view(torch.uint8), NVFP4_BLOCK, "nvfp4_dequantize")
    out = torch.empty((packed2.shape[0], k), dtype=dtype, device=packed.device)
    nvfp4_dequantize_jit(packed2, scales2, global_scale, out)
    return out.view(tuple(packed.shape[:-1]) + (k,))


# --------------------------------------------------------------------------- custom ops

@custom_op("tritonwarm::mxfp4_quantize", mutates_args=())
def _mxfp4_quantize_op(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    packed, scales = mxfp4_quantize(x)
    return packed, scales


@_mxfp4_quantize_op.register_fake
def _(x):
    k = x.shape[-1]
    return (x.new_empty(x.shape[:-1] + (k // 2,), dtype=torch.uint8),
            x.new_empty(x.shape[:-1] + (k // MXFP4_BLOCK,), dtype=torch.uint8))


@custom_op("tritonwarm::mxfp4_dequantize", mutates_args=())
def _mxfp4_dequantize_op(packed: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return mxfp4_dequantize(packed, scales, dtype)


@_mxfp4_dequantize_op.register_fake
def _(packed, scales, dtype):
    return packed.new_empty(packed.shape[:-1] + (packed.shape[-1] * 2,), dtype=dtype)


@custom_op("tritonwarm::nvfp4_quantize", mutates_args=())
def _nvfp4_quantize_op(x: torch.Tensor, global_scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    packed, scales = nvfp4_quantize(x, global_scale)
    return packed, scales


@_nvfp4_quantize_op.register_fake
def _(x, global_scale):
    k = x.shape[-1]
    return (x.new_empty(x.shape[:-1] + (k // 2,), dtype=torch.uint8),
            x.new_empty(x.shape[:-1] + (k // NVFP4_BLOCK,), dtype=torch.float8_e4m3fn))


@custom_op("tritonwarm::nvfp4_dequantize", mutates_args=())
def _nvfp4_dequantize_op(packed: torch.Tensor, scales: torch.Tensor, global_scale: torch.Tensor,
                         dtype: torch.dtype) -> torch.Tensor:
    return nvfp4_dequantize(packed, scales, global_scale, dtype)


@_nvfp4_dequantize_op.register_fake
def _(packed, scales, global_scale, dtype):
    return packed.new_empty(packed.shape[:-1] + (packed.shape[-1] * 2,), dtype=dtype)
