"""Rotary embedding launcher: shapes and strides in, launch spec out; plus the ``tritonwarm::rotary_embedding`` op."""

from __future__ import annotations

import torch

from ..jit import JitKernel, Launch
from ..kernels.rotary import rotary_embedding_kernel
from ._host import cdiv, next_power_of_2
from ._op import custom_op

PAIRS_PER_PROGRAM = 1024  # rotated pairs per program (HEAD_BLOCK * HALF_BLOCK): 2048 elements, 4 warps


def rotary_embedding_launch(positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor,
                            cos_sin_cache: torch.Tensor, is_neox: bool) -> Launch | None:
    num_tokens, num_heads, _ = q.shape
    num_kv_heads = k.shape[1]
    rot_half = cos_sin_cache.shape[-1] // 2
    if num_tokens == 0 or rot_half == 0:
        return None
    half_block = next_power_of_2(rot_half)
    head_block = min(next_power_of_2(max(num_heads, num_kv_heads)), max(1, PAIRS_PER_PROGRAM // half_block))
    num_warps = max(1, min(4, head_block * half_block // 128))
    # The token count only sizes the grid, so every batch size shares one binary. Head counts,
    # strides and rot_dim are per-model constants: specializing them (div-16, or 1) pays for itself.
    return Launch(
        grid=(num_tokens, cdiv(num_heads, head_block) + cdiv(num_kv_heads, head_block)),
        args=(positions, q, k, cos_sin_cache,
              q.stride(0), q.stride(1), k.stride(0), k.stride(1), cos_sin_cache.stride(0),
              num_heads, num_kv_heads, rot_half),
        constexprs=dict(IS_NEOX=bool(is_neox), HEAD_BLOCK=head_block, HALF_BLOCK=half_block),
        num_warps=num_warps,
    )


rotary_embedding_jit = JitKernel(rotary_embedding_kernel, rotary_embedding_launch, memoize=True)


def rotary_embedding(positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor,
                     cos_sin_cache: torch.Tensor, is_neox: bool = True):
    """Rotate the first ``cos_sin_cache.shape[-1]`` dims of every head of ``q`` and ``k``, in place.

    ``q`` is ``[tokens, heads, head_dim]``, ``k`` ``[tokens, kv_heads, head_dim]``; either may be a
    strided view (a slice of a fused projection, or the rope part ``q[..., nope:]`` of MLA) as long as
    each head's dims are contiguous. ``cos_sin_cache`` is ``[max_position, rot_dim]``, cos then sin.
    Returns ``(q, k)``, the same tensors.
    """
    if q.dim() != 3 or k.dim() != 3:
        raise ValueError(f"q and k must be [tokens, heads, head_dim], got {tuple(q.shape)} and {tuple(k.shape)}")
    num_tokens = q.shape[0]
    if k.shape[0] != num_tokens or positions.shape != (num_tokens,):
        raise ValueError(f"token counts differ: positions {tuple(positions.shape)}, q {tuple(q.shape)}, "
                         f"k {tuple(k.shape)}")
    if k.dtype != q.dtype:
        raise ValueError(f"q and k dtypes differ: {q.dtype} and {k.dtype}")
    rot_dim = cos_sin_cache.shape[-1]
    if cos_sin_cache.dim() != 2 or rot_dim % 2 or rot_dim > q.shape[-1] or rot_dim > k.shape[-1]:
        raise ValueError(f"cos_sin_cache {tuple(cos_sin_cache.shape)} does not fit heads of "
                         f"{q.shape[-1]} / {k.shape[-1]} dims")
    if q.stride(-1) != 1 or k.stride(-1) != 1:
        raise ValueError("q and k must have a unit stride within each head (they are updated in place)")
    if cos_sin_cache.stride(-1) != 1:
        cos_sin_cache = cos_sin_cache.contiguous()
    if positions.stride(0) != 1:
        positions = positions.contiguous()
    rotary_embedding_jit(positions, q, k, cos_sin_cache, is_neox)
    return q, k


@custom_op("tritonwarm::rotary_embedding", mutates_args=("q", "k"))
def _rotary_embedding_op(positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor,
                         cos_sin_cache: torch.Tensor, is_neox: bool = True) -> None:
    rotary_embedding(positions, q, k, cos_sin_cache, is_neox)


@_rotary_embedding_op.register_fake
def _(positions, q, k, cos_sin_cache, is_neox=True) -> None:
    return None
