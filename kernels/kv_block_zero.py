"""Zero whole blocks of a paged KV cache (see ``launchers/kv_cache.py``), and its PyTorch reference.

A freshly allocated block must not leak the previous owner's keys into a new request (masked rows
still feed ``0 * garbage`` into a dot, and NaN garbage survives that), so the engine clears blocks
when it hands them out.
"""

import torch
import triton
import triton.language as tl


@triton.jit
def kv_block_zero_kernel(cache_ptr, block_ids_ptr, block_stride, block_numel, BLOCK: tl.constexpr):
    # Grid: (number of block ids, chunks of BLOCK elements per block). A block is one contiguous
    # range of block_numel elements starting at block_id * block_stride.
    block_id = tl.load(block_ids_ptr + tl.program_id(0)).to(tl.int64)
    if block_id >= 0:  # negative ids are padding (a fixed-size id list under CUDA graphs)
        offsets = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        zeros = tl.zeros([BLOCK], dtype=cache_ptr.dtype.element_ty)
        tl.store(cache_ptr + block_id * block_stride + offsets, zeros, mask=offsets < block_numel)


def kv_block_zero_reference(kv_cache: torch.Tensor, block_ids: torch.Tensor) -> torch.Tensor:
    """A zeroed copy: every block named by a non-negative id cleared, everything else untouched."""
    out = kv_cache.clone()
    ids = block_ids.long()
    out[ids[ids >= 0]] = 0
    return out
