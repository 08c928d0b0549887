"""``moe_align_block_size`` launcher: routed expert ids in, the fused-MoE GEMM's block layout out;
plus the ``tritonwarm::moe_align_block_size`` op. Output layout is documented in ``kernels/moe_align.py``."""

from __future__ import annotations

import torch

from ..jit import JitKernel, Launch
from ..kernels.moe_align import (
    moe_align_count_kernel,
    moe_align_expert_scan_kernel,
    moe_align_place_kernel,
    moe_align_scan_kernel,
    moe_align_scatter_kernel,
    moe_align_segment_scatter_kernel,
    moe_align_single_kernel,
)
from ._host import cdiv, next_power_of_2
from ._op import custom_op

ONE_HOT_ELEMENTS = 8192  # slots x experts compared at once by one program
MAX_TILE = 1024

# Which path runs, by the routed slot count (numel) and the tile count it makes: a single program up
# to SINGLE_MAX_NUMEL slots (one launch); count -> place while every place program's read of the
# whole [num_tiles, num_experts] count table stays small; count -> expert scan -> segment scatter
# beyond that (three launches, no program reads more than its own count-table slice).
SINGLE_MAX_NUMEL = 1024
PLACE_ONE_HOT_ELEMENTS = 16384
PLACE_NUM_WARPS = 8
# Place cost grows with the table each of its programs reads: on the H200 place took 11.3 µs at
# 4096 x top-6 / 64 experts (96 tiles) and 36.1 µs at 16384 x top-6 (384 tiles), while the scatter
# that does the same one-hot work per tile without the table read took 4.1 and 8.2 µs. The expert
# scan path (count + a one-step scan + that scatter plus its share of the fills) takes over from
# 128 tiles at 64 experts; the exact crossover is not yet measured on a GPU.
PLACE_MAX_TABLE = 1 << 13  # num_tiles * num_experts (place tiling)
# The expert scan: SCAN_EXPERTS count-table columns per program, SCAN_TILES_PER_STEP rows per step,
# so 64 experts scan in 8 programs and 16K x top-6 slots (768 tiles) in one step each.
SCAN_EXPERTS = 8
SCAN_TILES_PER_STEP = 1024


def _tiling(numel: int, num_experts: int, one_hot: int = ONE_HOT_ELEMENTS) -> tuple[int, int, int]:
    """(tile, block_e, num_tiles): the tile size follows the expert count only, never the batch."""
    block_e = next_power_of_2(num_experts)
    tile = max(16, min(MAX_TILE, one_hot // block_e))
    return tile, block_e, cdiv(numel, tile)


# numel (and num_tiles, max_blocks, which follow it) varies every step: it sizes grids and buffers and
# bounds loops, and is do_not_specialize in every kernel, so all batch sizes share one binary each.
def moe_align_count_launch(flat_ids, tile_counts, num_experts: int, one_hot: int = ONE_HOT_ELEMENTS,
                           num_warps: int = 4) -> Launch | None:
    numel = flat_ids.numel()
    tile, block_e, num_tiles = _tiling(numel, num_experts, one_hot)
    if num_tiles == 0:
        return None
    return Launch(grid=(num_tiles,), args=(flat_ids, tile_counts, numel, num_experts),
                  constexprs=dict(TILE=tile, BLOCK_E=block_e), num_warps=num_warps)


def moe_align_scan_launch(flat_ids, tile_counts, tile_starts, expert_ids, num_tokens_post_padded,
                          num_experts: int, block_size: int) -> Launch:
    # One program, always launched (with no ids it still writes the -1 block experts and 0 tokens).
    tile, block_e, num_tiles = _tiling(flat_ids.numel(), num_experts)
    per_step = max(1, ONE_HOT_ELEMENTS // block_e)
    return Launch(grid=(1,),
                  args=(tile_counts, tile_starts, expert_ids, num_tokens_post_padded,
                        num_tiles, num_experts, block_size, expert_ids.numel()),
                  constexprs=dict(TILES_PER_STEP=per_step, BLOCKS_PER_STEP=per_step, BLOCK_E=block_e),
                  num_warps=4)


def moe_align_scatter_launch(flat_ids, tile_starts, sorted_token_ids, num_experts: int) -> Launch | None:
    numel = flat_ids.numel()
    tile, block_e, num_tiles = _tiling(numel, num_experts)
    if num_tiles == 0:
        return None
    return Launch(grid=(num_tiles,), args=(flat_ids, tile_starts, sorted_token_ids, numel, num_experts),
                  constexprs=dict(TILE=tile, BLOCK_E=block_e), num_warps=4)


def moe_align_place_launch(flat_ids, tile_counts, sorted_token_ids, expert_ids, num_tokens_post_padded,
                           num_experts: int, block_size: int, one_hot: int = PLACE_ONE_HOT_ELEMENTS,
                           num_warps: int = PLACE_NUM_WARPS) -> Launch:
    numel = flat_ids.numel()
    tile, block_e, num_tiles = _tiling(numel, num_experts, one_hot)
    return Launch(grid=(num_tiles,),
                  args=(flat_ids, tile_counts, sorted_token_ids, expert_ids, num_tokens_post_padded,
                        numel, num_tiles, num_experts, block_size, sorted_token_ids.numel(), expert_ids.numel()),
                  constexprs=dict(TILE=tile, BLOCK_E=block_e),
                  num_warps=num_warps)


def moe_align_single_launch(flat_ids, sorted_token_ids, expert_ids, num_tokens_post_padded,
                            num_experts: int, block_size: int, one_hot: int = ONE_HOT_ELEMENTS,
                            num_warps: int = 4) -> Launch:
    tile, block_e, _ = _tiling(flat_ids.numel(), num_experts, one_hot)
    return Launch(grid=(1,),
                  args=(flat_ids, sorted_token_ids, expert_ids, num_tokens_post_padded, flat_ids.numel(),
                        num_experts, block_size, sorted_token_ids.numel(), expert_ids.numel()),
                  constexprs=dict(TILE=tile, BLOCK_E=block_e),
                  num_warps=num_warps)


def moe_align_expert_scan_launch(tile_counts, tile_starts, expert_totals, num_experts: int) -> Launch:
    return Launch(grid=(cdiv(num_experts, SCAN_EXPERTS),),
                  args=(tile_counts, tile_starts, expert_totals, tile_counts.shape[0], num_experts),
                  constexprs=dict(EXPERTS=SCAN_EXPERTS, TILES_PER_STEP=SCAN_TILES_PER_STEP), num_warps=8)


def moe_align_segment_scatter_launch(flat_ids, tile_starts, expert_totals, sorted_token_ids, expert_ids,
                                     num_tokens_post_padded, num_experts: int, block_size: int) -> Launch:
    numel = flat_ids.numel()
    tile, block_e, num_tiles = _tiling(numel, num_experts)
    return Launch(grid=(num_tiles,),
                  args=(flat_ids, tile_starts, expert_totals, sorted_token_ids, expert_ids, num_tokens_post_padded,
                        numel, num_experts, block_size, sorted_token_ids.numel(), expert_ids.numel()),
                  constexprs=dict(TILE=tile, BLOCK_E=block_e), num_warps=4)


moe_align_count_jit = JitKernel(moe_align_count_kernel, moe_align_count_launch)
moe_align_scan_jit = JitKernel(moe_align_scan_kernel, moe_align_scan_launch)
moe_align_scatter_jit = JitKernel(moe_align_scatter_kernel, moe_align_scatter_launch)
moe_align_place_jit = JitKernel(moe_align_place_kernel, moe_align_place_launch)
moe_align_single_jit = JitKernel(moe_align_single_kernel, moe_align_single_launch)
moe_align_expert_scan_jit = JitKernel(moe_align_expert_scan_kernel, moe_align_expert_scan_launch)
moe_align_segment_scatter_jit = JitKernel(moe_align_segment_scatter_kernel, moe_align_segment_scatter_launch)


def _flat_ids(topk_ids: torch.Tensor, num_experts: int, block_size: int) -> torch.Tensor:
    if topk_ids.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"topk_ids must be int32 or int64, got {topk_ids.dtype}")
    if num_experts < 1 or block_size < 1:
        raise ValueError(f"num_experts={num_experts} and block_size={block_size} must be positive")
    flat_ids = topk_ids.reshape(-1)
    if flat_ids.numel() and flat_ids.stride(0) != 1:
        flat_ids = flat_ids.contiguous()
    return flat_ids


def _outputs(numel: int, num_experts: int, block_size: int, device) -> tuple[torch.Tensor, ...]:
    max_padded = numel + num_experts * (block_size - 1)
    return (torch.empty((max_padded,), dtype=torch.int32, device=device),
            torch.empty((cdiv(max_padded, block_size),), dtype=torch.int32, device=device),
            torch.empty((1,), dtype=torch.int32, device=device))


def align_single(flat_ids, num_experts: int, block_size: int, one_hot: int = ONE_HOT_ELEMENTS, num_warps: int = 4):
    """One launch, one program: every output written by the kernel."""
    out = _outputs(flat_ids.numel(), num_experts, block_size, flat_ids.device)
    moe_align_single_jit(flat_ids, *out, num_experts, block_size, one_hot=one_hot, num_warps=num_warps)
    return out


def align_count_place(flat_ids, num_experts: int, block_size: int, one_hot: int = PLACE_ONE_HOT_ELEMENTS,
                      num_warps: int = PLACE_NUM_WARPS):
    """Two launches (needs at least one id): per-tile counts, then every output from the count table."""
    out = _outputs(flat_ids.numel(), num_experts, block_size, flat_ids.device)
    _, _, num_tiles = _tiling(flat_ids.numel(), num_experts, one_hot)
    tile_counts = torch.empty((num_tiles, num_experts), dtype=torch.int32, device=flat_ids.device)
    moe_align_count_jit(flat_ids, tile_counts, num_experts, one_hot=one_hot, num_warps=num_warps)
    moe_align_place_jit(flat_ids, tile_counts, *out, num_experts, block_size, one_hot=one_hot, num_warps=num_warps)
    return out


def align_expert_scan(flat_ids, num_experts: int, block_size: int):
    """Count -> expert scan -> segment scatter (needs at least one id): any size, every output written
    by the kernels, no program that walks the whole count table or the whole block list alone."""
    device = flat_ids.device
    out = _outputs(flat_ids.numel(), num_experts, block_size, device)
    _, _, num_tiles = _tiling(flat_ids.numel(), num_experts)
    tile_counts = torch.empty((num_tiles, num_experts), dtype=torch.int32, device=device)
    tile_starts = torch.empty((num_tiles, num_experts), dtype=torch.int32, device=device)
    expert_totals = torch.empty((num_experts,), dtype=torch.int32, device=device)
    moe_align_count_jit(flat_ids, tile_counts, num_experts)
    moe_align_expert_scan_jit(tile_counts, tile_starts, expert_totals, num_experts)
    moe_align_segment_scatter_jit(flat_ids, tile_starts, expert_totals, *out, num_experts, block_size)
    return out


def align_three_kernels(flat_ids, num_experts: int, block_size: int):
    """Count -> one-program scan -> scatter, the sentinel filled on the host side: any size. The older
    large-size path (its one-program scan walks every tile and every block serially); no size picks it
    any more, ``bench/moe_align_variants.py`` keeps it as a baseline."""
    device = flat_ids.device
    numel = flat_ids.numel()
    max_padded = numel + num_experts * (block_size - 1)
    # Padding and the tail hold the sentinel: the scatter only writes real slots.
    sorted_token_ids = torch.full((max_padded,), numel, dtype=torch.int32, device=device)
    expert_ids = torch.empty((cdiv(max_padded, block_size),), dtype=torch.int32, device=device)
    num_tokens_post_padded = torch.empty((1,), dtype=torch.int32, device=device)
    _, _, num_tiles = _tiling(numel, num_experts)
    tile_counts = torch.empty((num_tiles, num_experts), dtype=torch.int32, device=device)
    tile_starts = torch.empty((num_tiles, num_experts), dtype=torch.int32, device=device)
    moe_align_count_jit(flat_ids, tile_counts, num_experts)
    moe_align_scan_jit(flat_ids, tile_counts, tile_starts, expert_ids, num_tokens_post_padded,
                       num_experts, block_size)
    moe_align_scatter_jit(flat_ids, tile_starts, sorted_token_ids, num_experts)
    return sorted_token_ids, expert_ids, num_tokens_post_padded


def align_path(numel: int, num_experts: int) -> str:
    """The declared rule: 'single', 'count_place' or 'expert_scan' for this many slots."""
    if numel <= SINGLE_MAX_NUMEL:
        return "single"
    _, _, num_tiles = _tiling(numel, num_experts, PLACE_ONE_HOT_ELEMENTS)
    return "count_place" if num_tiles * num_experts <= PLACE_MAX_TABLE else "expert_scan"


def path_token_counts(top_k: int, num_experts: int, max_tokens: int) -> list[int]:
    """Token counts on either side of each change of path, up to ``max_tokens``: a plan that traces a
    range of token counts by class representatives adds these to reach every path."""
    counts, previous = [], align_path(top_k, num_experts)
    for tokens in range(2, max_tokens + 1):
        path = align_path(tokens * top_k, num_experts)
        if path != previous:
            counts += [tokens - 1, tokens]
            previous = path
    return counts


def moe_align_block_size(topk_ids: torch.Tensor, num_experts: int, block_size: int):
    """Group the routed (token, k) slots by expert, each expert padded to ``block_size`` slots.

    Returns ``(sorted_token_ids int32 [numel + E*(block_size-1)], expert_ids int32 [cdiv(that,
    block_size)], num_tokens_post_padded int32 [1])``, every size from shapes only.
    """
    flat_ids = _flat_ids(topk_ids, num_experts, block_size)
    path = align_path(flat_ids.numel(), num_experts)
    if path == "single":
        return align_single(flat_ids, num_experts, block_size)
    if path == "count_place":
        return align_count_place(flat_ids, num_experts, block_size)
    return align_expert_scan(flat_ids, num_experts, block_size)


@custom_op("tritonwarm::moe_align_block_size", mutates_args=())
def _moe_align_block_size_op(topk_ids: torch.Tensor, num_experts: int,
                             block_size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return moe_align_block_size(topk_ids, num_experts, block_size)


@_moe_align_block_size_op.register_fake
def _(topk_ids, num_experts, block_size):
    max_padded = topk_ids.numel() + num_experts * (block_size - 1)
    return (topk_ids.new_empty((max_padded,), dtype=torch.int32),
            topk_ids.new_empty(((max_padded + block_size - 1) // block_size,), dtype=torch.int32),
            topk_ids.new_empty((1,), dtype=torch.int32))
