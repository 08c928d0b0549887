"""``kv_block_zero``: clear blocks of a paged KV cache in place (layout: ``launchers/kv_cache.py``)."""

from __future__ import annotations

import torch

from ..jit import JitKernel, Launch
from ..kernels.kv_block_zero import kv_block_zero_kernel
from ._host import cdiv, next_power_of_2
from ._op import custom_op

MAX_CHUNK = 4096  # elements one program clears: 8 KiB of bf16, enough to keep a CTA's stores busy


def kv_block_zero_launch(kv_cache: torch.Tensor, block_ids: torch.Tensor) -> Launch | None:
    num_ids = block_ids.shape[0]
    block_numel = _block_numel(kv_cache)
    if num_ids == 0 or block_numel == 0:
        return None
    chunk = min(next_power_of_2(block_numel), MAX_CHUNK)
    # The id count only sizes the grid, so any number of freed blocks shares one binary; the block
    # stride and size are per-model constants, so their div-16 specialization pays for itself.
    return Launch(
        grid=(num_ids, cdiv(block_numel, chunk)),
        args=(kv_cache, block_ids, kv_cache.stride(0), block_numel),
        constexprs=dict(BLOCK=chunk),
        num_warps=4 if chunk >= 1024 else 1,
    )


def _block_numel(kv_cache: torch.Tensor) -> int:
    numel = 1
    for size in kv_cache.shape[1:]:
        numel *= size
    return numel


def _blocks_contiguous(kv_cache: torch.Tensor) -> bool:
    expected = 1
    for size, stride in reversed(list(zip(kv_cache.shape[1:], kv_cache.stride()[1:], strict=True))):
        if size != 1 and stride != expected:
            return False
        expected *= size
    return True


kv_block_zero_jit = JitKernel(kv_block_zero_kernel, kv_block_zero_launch, memoize=True)


def kv_block_zero(kv_cache: torch.Tensor, block_ids: torch.Tensor) -> None:
    """Zero the blocks ``block_ids`` (int32 ``[n]``; negative ids are skipped) of ``kv_cache`` in place.

    ``kv_cache`` is ``[num_blocks, ...]`` with each block contiguous (any ``KVCacheLayout`` tensor).
    Ids must be ``< num_blocks``: they are not bounds-checked on the device (that would need a sync).
    """
    if block_ids.dim() != 1 or block_ids.dtype != torch.int32:
        raise ValueError(f"block_ids must be int32 [n], got {block_ids.dtype} {tuple(block_ids.shape)}")
    if kv_cache.dim() < 2 or not _blocks_contiguous(kv_cache):
        raise ValueError("kv_cache must be [num_blocks, ...] with each block contiguous")
    kv_block_zero_jit(kv_cache, block_ids)


@custom_op("tritonwarm::kv_block_zero", mutates_args=("kv_cache",))
def _kv_block_zero_op(kv_cache: torch.Tensor, block_ids: torch.Tensor) -> None:
    kv_block_zero(kv_cache, block_ids)


@_kv_block_zero_op.register_fake
def _(kv_cache: torch.Tensor, block_ids: torch.Tensor) -> None:
    return None
