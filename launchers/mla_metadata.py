"""``mla_decode_metadata``: the split-KV schedule of a paged decode, computed on the device.

The schedule's definition and output tensors are documented in ``kernels/mla_metadata.py``.
"""

from __future__ import annotations

import torch

from ..jit import JitKernel, Launch
from ..kernels.mla_metadata import mla_decode_metadata_kernel
from ._host import cdiv
from ._op import custom_op

SCHEDULE_WIDTH = 8  # int32 columns per part (5 used): 32-byte rows, as FlashMLA pads its metadata
# FlashMLA's cost of one more split: about five 64-token blocks of attention. Kept in tokens so
# other block sizes charge the same work.
SPLIT_OVERHEAD_TOKENS = 320
REQUESTS_PER_CHUNK = 64  # BLOCK_B: requests read per step of each pass
PARTS_PER_PROGRAM = 32  # BLOCK_P: parts one program schedules ([32, 64] int32 tiles per step)


def split_overhead_blocks(block_size: int) -> int:
    """The fixed cost of a split, in blocks of ``block_size`` tokens (at least one)."""
    return max(1, cdiv(SPLIT_OVERHEAD_TOKENS, block_size))


def mla_decode_metadata_launch(seq_lens: torch.Tensor, schedule: torch.Tensor, num_splits: torch.Tensor,
                               block_size: int) -> Launch:
    num_parts = schedule.shape[0]
    # Launched even for an empty batch: the schedule and num_splits[0] must still be written.
    # batch and num_parts are do_not_specialize in the kernel (the batch changes every step);
    # block_size and the overhead are per-model constants.
    return Launch(
        grid=(cdiv(num_parts, PARTS_PER_PROGRAM),),
        args=(seq_lens, schedule, num_splits, seq_lens.shape[0], num_parts, block_size,
              split_overhead_blocks(block_size)),
        constexprs=dict(SCHEDULE_WIDTH=SCHEDULE_WIDTH, BLOCK_B=REQUESTS_PER_CHUNK, BLOCK_P=PARTS_PER_PROGRAM),
        num_warps=4,
    )


mla_decode_metadata_jit = JitKernel(mla_decode_metadata_kernel, mla_decode_metadata_launch)


def mla_decode_metadata(seq_lens: torch.Tensor, num_heads: int, block_size: int, num_sm_parts: int):
    """The split-KV schedule for requests of ``seq_lens`` (int32 ``[batch]``; 0 allowed: no work).

    Returns ``(schedule int32 [num_sm_parts, 8], num_splits int32 [batch + 1])``. ``num_heads``
    is validated but does not change the schedule (see ``kernels/mla_metadata.py``).
    """
    if seq_lens.dim() != 1 or seq_lens.dtype != torch.int32:
        raise ValueError(f"seq_lens must be int32 [batch], got {seq_lens.dtype} {tuple(seq_lens.shape)}")
    for name, value in (("num_heads", num_heads), ("block_size", block_size), ("num_sm_parts", num_sm_parts)):
        if value <= 0:
            raise ValueError(f"{name} must be positive, got {value}")
    schedule = torch.empty(num_sm_parts, SCHEDULE_WIDTH, dtype=torch.int32, device=seq_lens.device)
    num_splits = torch.empty(seq_lens.shape[0] + 1, dtype=torch.int32, device=seq_lens.device)
    mla_decode_metadata_jit(seq_lens, schedule, num_splits, block_size)
    return schedule, num_splits


@custom_op("tritonwarm::mla_decode_metadata", mutates_args=())
def _mla_decode_metadata_op(seq_lens: torch.Tensor, num_heads: int, block_size: int,
                            num_sm_parts: int) -> tuple[torch.Tensor, torch.Tensor]:
    return mla_decode_metadata(seq_lens, num_heads, block_size, num_sm_parts)


@_mla_decode_metadata_op.register_fake
def _(seq_lens, num_heads, block_size, num_sm_parts):
    schedule = seq_lens.new_empty(num_sm_parts, SCHEDULE_WIDTH)
    return schedule, seq_lens.new_empty(seq_lens.shape[0] + 1)
