"""``moe_align_block_size`` device code (vLLM semantics, deterministic), and its PyTorch reference.

The flat (token, k) slots of ``topk_ids`` are grouped by expert in ascending expert order, slots of
one expert in ascending flat index; each expert's segment is padded to a multiple of ``block_size``.
Outputs have the worst-case size ``numel + num_experts * (block_size - 1)`` so that nothing depends
on the data: ``sorted_token_ids`` holds ``numel`` (the sentinel) in padding and past
``num_tokens_post_padded``; ``expert_ids`` holds -1 for blocks past it. Ids outside
``[0, num_experts)`` (e.g. -1 for experts of another expert-parallel rank) are dropped.

No atomics anywhere, so the result never depends on scheduling. Three paths (the launcher picks one
by the slot count): a single program (few ids); count -> place (each place program reads the whole
count table); count -> expert scan -> segment scatter (any size): the scan's programs each own a slice
of experts and scan their columns of the count table down the tiles (independent of each other), and
each scatter program derives the expert segments from the E per-expert totals and writes its share of
the padding, the tail and the block experts. The first three kernels below (count -> one-program scan
-> scatter, sentinel filled on the host) are the older large-size path, kept as a benchmark baseline.
"""

import torch
import triton
import triton.language as tl


@triton.jit(do_not_specialize=["numel"])
def moe_align_count_kernel(
    topk_ids_ptr, tile_counts_ptr, numel, num_experts,
    TILE: tl.constexpr, BLOCK_E: tl.constexpr,
):
    # tile_counts[tile, e] = how many ids of this tile are e (zeros included).
    tile = tl.program_id(0)
    slots = tile * TILE + tl.arange(0, TILE)
    experts = tl.arange(0, BLOCK_E)
    ids = tl.load(topk_ids_ptr + slots, mask=slots < numel, other=-1).to(tl.int32)
    counts = tl.sum((ids[:, None] == experts[None, :]).to(tl.int32), axis=0)
    tl.store(tile_counts_ptr + tile * num_experts + experts, counts, mask=experts < num_experts)


@triton.jit(do_not_specialize=["num_tiles", "max_blocks"])
def moe_align_scan_kernel(
    tile_counts_ptr, tile_starts_ptr, expert_ids_ptr, num_tokens_post_padded_ptr,
    num_tiles, num_experts, block_size, max_blocks,
    TILES_PER_STEP: tl.constexpr, BLOCKS_PER_STEP: tl.constexpr, BLOCK_E: tl.constexpr,
):
    # One program. Pass 1: per-expert totals -> padded segment [start, end) per expert. Pass 2: the
    # position where each tile's slots of each expert begin = expert start + same-expert slots in
    # earlier tiles (an exclusive scan down the tiles). Then each block's expert (or -1).
    experts = tl.arange(0, BLOCK_E)
    expert_ok = experts < num_experts
    step_tiles = tl.arange(0, TILES_PER_STEP)
    totals = tl.zeros([BLOCK_E], tl.int32)
    first = 0
    while first < num_tiles:  # `while`, not range(): Triton 3.6's interpreter cannot range to a runtime int
        tiles = first + step_tiles
        offsets = tiles[:, None] * num_experts + experts[None, :]
        mask = (tiles < num_tiles)[:, None] & expert_ok[None, :]
        totals += tl.sum(tl.load(tile_counts_ptr + offsets, mask=mask, other=0), axis=0)
        first += TILES_PER_STEP
    padded = (totals + block_size - 1) // block_size * block_size
    ends = tl.cumsum(padded, axis=0)
    starts = ends - padded
    total_padded = tl.sum(padded, axis=0)
    tl.store(num_tokens_post_padded_ptr, total_padded)

    _scan_columns(tile_counts_ptr, tile_starts_ptr, starts, experts, expert_ok, num_tiles, num_experts,
                  TILES_PER_STEP)

    # Block b starts at b * block_size; its expert is the number of experts whose segment ends at
    # or before that (empty segments end where they start, so they are skipped).
    step_blocks = tl.arange(0, BLOCKS_PER_STEP)
    first = 0
    while first < max_blocks:
        blocks = first + step_blocks
        block_start = blocks * block_size
        owner = tl.sum(((ends[None, :] <= block_start[:, None]) & expert_ok[None, :]).to(tl.int32), axis=1)
        owner = tl.where(block_start < total_padded, owner, -1)
        tl.store(expert_ids_ptr + blocks, owner, mask=blocks < max_blocks)
        first += BLOCKS_PER_STEP


@triton.jit(do_not_specialize=["numel"])
def moe_align_scatter_kernel(
    topk_ids_ptr, tile_starts_ptr, sorted_token_ids_ptr, numel, num_experts,
    TILE: tl.constexpr, BLOCK_E: tl.constexpr,
):
    # A slot goes to its tile's start for its expert plus the number of same-expert slots before it
    # in the tile (exclusive running count over a one-hot [slot, expert] matrix).
    tile = tl.program_id(0)
    lanes = tl.arange(0, TILE)
    slots = tile * TILE + lanes
    experts = tl.arange(0, BLOCK_E)
    ids = tl.load(topk_ids_ptr + slots, mask=slots < numel, other=-1).to(tl.int32)
    valid = (ids >= 0) & (ids < num_experts)
    one_hot = (ids[:, None] == experts[None, :]).to(tl.int32)
    rank = tl.sum((tl.cumsum(one_hot, axis=0) - one_hot) * one_hot, axis=1)
    start = tl.load(tile_starts_ptr + tile * num_experts + ids, mask=valid, other=0)
    tl.store(sorted_token_ids_ptr + start + rank, slots, mask=valid)


# --------------------------------------------------------------------------- fewer launches
# The three-kernel path pays three launches, a host fill and a one-program scan. Two shorter paths:
# count -> place (each place program derives the expert offsets and its own tile's starting
# positions from the whole tile-count table, which is small, and writes its share of the sentinel
# padding, the tail and the block experts, so no scan launch and no host fill), and a single program
# that does everything in two passes over the ids (decode sizes: one launch). Both stay atomic-free.


@triton.jit
def _segments(totals, block_size):
    # Per-expert padded segment [starts, ends) and the padded total.
    padded = (totals + block_size - 1) // block_size * block_size
    ends = tl.cumsum(padded, axis=0)
    return ends - padded, ends, tl.sum(padded, axis=0)


@triton.jit
def _fill_expert_padding(sorted_token_ids_ptr, starts, totals, ends, owned, sentinel, block_size):
    # Sentinel in [starts + totals, ends) of the owned experts (fewer than block_size slots each), 16
    # columns at a time: a loop over the runtime block_size, so no binary per block size.
    pad = tl.arange(0, 16)
    first = 0
    while first < block_size:
        positions = (starts + totals)[:, None] + first + pad[None, :]
        tl.store(sorted_token_ids_ptr + positions, tl.zeros_like(positions) + sentinel,
                 mask=owned[:, None] & (positions < ends[:, None]))
        first += 16


@triton.jit
def _fill_range(out_ptr, lo, hi, value, STEP: tl.constexpr):
    lanes = tl.arange(0, STEP)
    first = lo
    while first < hi:
        positions = first + lanes
        tl.store(out_ptr + positions, tl.zeros_like(positions) + value, mask=positions < hi)
        first += STEP


@triton.jit
def _block_experts(expert_ids_ptr, ends, expert_ok, total_padded, block_size, lo, hi, STEP: tl.constexpr):
    # Block b's expert: how many experts' segments end at or before b * block_size; -1 past the end.
    lanes = tl.arange(0, STEP)
    first = lo
    while first < hi:
        blocks = first + lanes
        block_start = blocks * block_size
        owner = tl.sum(((ends[None, :] <= block_start[:, None]) & expert_ok[None, :]).to(tl.int32), axis=1)
        tl.store(expert_ids_ptr + blocks, tl.where(block_start < total_padded, owner, -1), mask=blocks < hi)
        first += STEP


@triton.jit(do_not_specialize=["numel", "num_tiles", "max_padded", "max_blocks"])
def moe_align_place_kernel(
    topk_ids_ptr, tile_counts_ptr, sorted_token_ids_ptr, expert_ids_ptr, num_tokens_post_padded_ptr,
    numel, num_tiles, num_experts, block_size, max_padded, max_blocks,
    TILE: tl.constexpr, BLOCK_E: tl.constexpr,
):
    # One program per tile of ids (the count kernel's tiles). Every program reads the whole count
    # table: totals over all tiles, and the same-expert slots of the tiles before its own.
    tile = tl.program_id(0)
    programs = tl.num_programs(0)
    experts = tl.arange(0, BLOCK_E)
    expert_ok = experts < num_experts
    rows = tl.arange(0, TILE)
    totals = tl.zeros([BLOCK_E], tl.int32)
    before = tl.zeros([BLOCK_E], tl.int32)
    first = 0
    while first < num_tiles:
        tiles = first + rows
        counts = tl.load(tile_counts_ptr + tiles[:, None] * num_experts + experts[None, :],
                         mask=(tiles < num_tiles)[:, None] & expert_ok[None, :], other=0)
        totals += tl.sum(counts, axis=0)
        before += tl.sum(tl.where((tiles < tile)[:, None], counts, 0), axis=0)
        first += TILE
    starts, ends, total_padded = _segments(totals, block_size)

    slots = tile * TILE + rows
    ids = tl.load(topk_ids_ptr + slots, mask=slots < numel, other=-1).to(tl.int32)
    one_hot = (ids[:, None] == experts[None, :]).to(tl.int32)
    # position = expert start + earlier tiles' slots + same-expert slots earlier in this tile,
    # picked out of the [slot, expert] matrix by the one-hot row (no gather needed).
    base = (starts + before)[None, :] + tl.cumsum(one_hot, axis=0) - one_hot
    position = tl.sum(one_hot * base, axis=1)
    tl.store(sorted_token_ids_ptr + position, slots, mask=(ids >= 0) & (ids < num_experts))

    _write_share(sorted_token_ids_ptr, expert_ids_ptr, num_tokens_post_padded_ptr, starts, totals, ends,
                 total_padded, expert_ok, experts, numel, block_size, max_padded, max_blocks, tile, programs, TILE)


@triton.jit
def _write_share(sorted_token_ids_ptr, expert_ids_ptr, num_tokens_post_padded_ptr, starts, totals, ends,
                 total_padded, expert_ok, experts, numel, block_size, max_padded, max_blocks, program, programs,
                 STEP: tl.constexpr):
    # Program ``program`` of ``programs``: the sentinel padding of experts e with e % programs ==
    # program, an equal slice of the tail past total_padded, an equal slice of the block experts.
    _fill_expert_padding(sorted_token_ids_ptr, starts, totals, ends, expert_ok & (experts % programs == program),
                         numel, block_size)
    tail = (max_padded - total_padded + programs - 1) // programs
    lo = total_padded + program * tail
    _fill_range(sorted_token_ids_ptr, lo, tl.minimum(lo + tail, max_padded), numel, STEP)
    share = (max_blocks + programs - 1) // programs
    _block_experts(expert_ids_ptr, ends, expert_ok, total_padded, block_size, program * share,
                   tl.minimum(program * share + share, max_blocks), STEP)
    if program == 0:
        tl.store(num_tokens_post_padded_ptr, total_padded)


# --------------------------------------------------------------------------- any size, no serial scan


@triton.jit(do_not_specialize=["num_tiles"])
def moe_align_expert_scan_kernel(
    tile_counts_ptr, tile_starts_ptr, expert_totals_ptr, num_tiles, num_experts,
    EXPERTS: tl.constexpr, TILES_PER_STEP: tl.constexpr,
):
    # Program p scans the count-table columns of experts [p * EXPERTS, (p + 1) * EXPERTS) down the
    # tiles: where each tile's slots of an expert begin inside that expert's segment (an exclusive
    # running sum), and the expert's total. Columns are independent, so programs never wait on each other.
    experts = tl.program_id(0) * EXPERTS + tl.arange(0, EXPERTS)
    expert_ok = experts < num_experts
    totals = _scan_columns(tile_counts_ptr, tile_starts_ptr, tl.zeros([EXPERTS], tl.int32), experts, expert_ok,
                           num_tiles, num_experts, TILES_PER_STEP)
    tl.store(expert_totals_ptr + experts, totals, mask=expert_ok)


@triton.jit
def _scan_columns(tile_counts_ptr, tile_starts_ptr, start, experts, expert_ok, num_tiles, num_experts,
                  TILES_PER_STEP: tl.constexpr):
    """Down the tiles of the count table's ``experts`` columns: where each tile's slots of an expert
    begin (``start`` plus the same expert's slots in earlier tiles, an exclusive running sum) into
    ``tile_starts``. Returns ``start`` plus each expert's total."""
    rows = tl.arange(0, TILES_PER_STEP)
    running = start
    first = 0
    while first < num_tiles:  # `while`, not range(): Triton 3.6's interpreter cannot range to a runtime int
        tiles = first + rows
        offsets = tiles[:, None] * num_experts + experts[None, :]
        mask = (tiles < num_tiles)[:, None] & expert_ok[None, :]
        counts = tl.load(tile_counts_ptr + offsets, mask=mask, other=0)
        tl.store(tile_starts_ptr + offsets, running[None, :] + tl.cumsum(counts, axis=0) - counts, mask=mask)
        running += tl.sum(counts, axis=0)
        first += TILES_PER_STEP
    return running


@triton.jit(do_not_specialize=["numel", "max_padded", "max_blocks"])
def moe_align_segment_scatter_kernel(
    topk_ids_ptr, tile_starts_ptr, expert_totals_ptr, sorted_token_ids_ptr, expert_ids_ptr,
    num_tokens_post_padded_ptr, numel, num_experts, block_size, max_padded, max_blocks,
    TILE: tl.constexpr, BLOCK_E: tl.constexpr,
):
    # One program per tile of ids (the count kernel's tiles). It reads E totals (not the count
    # table): expert segment start + the tile's start inside the segment + rank inside the tile.
    tile = tl.program_id(0)
    experts = tl.arange(0, BLOCK_E)
    expert_ok = experts < num_experts
    totals = tl.load(expert_totals_ptr + experts, mask=expert_ok, other=0)
    starts, ends, total_padded = _segments(totals, block_size)
    slots = tile * TILE + tl.arange(0, TILE)
    ids = tl.load(topk_ids_ptr + slots, mask=slots < numel, other=-1).to(tl.int32)
    valid = (ids >= 0) & (ids < num_experts)
    one_hot = (ids[:, None] == experts[None, :]).to(tl.int32)
    within = tl.load(tile_starts_ptr + tile * num_experts + ids, mask=valid, other=0)
    position = tl.sum(one_hot * (starts[None, :] + tl.cumsum(one_hot, axis=0) - one_hot), axis=1) + within
    tl.store(sorted_token_ids_ptr + position, slots, mask=valid)
    _write_share(sorted_token_ids_ptr, expert_ids_ptr, num_tokens_post_padded_ptr, starts, totals, ends,
                 total_padded, expert_ok, experts, numel, block_size, max_padded, max_blocks, tile,
                 tl.num_programs(0), TILE)


@triton.jit(do_not_specialize=["numel", "max_padded", "max_blocks"])
def moe_align_single_kernel(
    topk_ids_ptr, sorted_token_ids_ptr, expert_ids_ptr, num_tokens_post_padded_ptr,
    numel, num_experts, block_size, max_padded, max_blocks,
    TILE: tl.constexpr, BLOCK_E: tl.constexpr,
):
    # One program, two passes over the ids in chunks of TILE: totals, then positions with a running
    # per-expert count carried from chunk to chunk. For few ids, where one launch is the whole cost.
    experts = tl.arange(0, BLOCK_E)
    expert_ok = experts < num_experts
    lanes = tl.arange(0, TILE)
    totals = tl.zeros([BLOCK_E], tl.int32)
    first = 0
    while first < numel:
        ids = tl.load(topk_ids_ptr + first + lanes, mask=first + lanes < numel, other=-1).to(tl.int32)
        # ids in [num_experts, BLOCK_E) must not count (they are dropped)
        totals += tl.sum(((ids[:, None] == experts[None, :]) & expert_ok[None, :]).to(tl.int32), axis=0)
        first += TILE
    starts, ends, total_padded = _segments(totals, block_size)
    tl.store(num_tokens_post_padded_ptr, total_padded)

    running = starts
    first = 0
    while first < numel:
        slots = first + lanes
        ids = tl.load(topk_ids_ptr + slots, mask=slots < numel, other=-1).to(tl.int32)
        one_hot = (ids[:, None] == experts[None, :]).to(tl.int32)
        position = tl.sum(one_hot * (running[None, :] + tl.cumsum(one_hot, axis=0) - one_hot), axis=1)
        tl.store(sorted_token_ids_ptr + position, slots, mask=(ids >= 0) & (ids < num_experts))
        running += tl.sum(one_hot, axis=0)
        first += TILE

    _fill_expert_padding(sorted_token_ids_ptr, starts, totals, ends, expert_ok, numel, block_size)
    _fill_range(sorted_token_ids_ptr, total_padded, max_padded, numel, TILE)
    _block_experts(expert_ids_ptr, ends, expert_ok, total_padded, block_size, 0, max_blocks, TILE)


def moe_align_block_size_reference(topk_ids, num_experts, block_size):
    """Plain PyTorch, one expert at a time: ``(sorted_token_ids, expert_ids, num_tokens_post_padded)``."""
    flat = topk_ids.reshape(-1)
    numel = flat.numel()
    max_padded = numel + num_experts * (block_size - 1)
    device = topk_ids.device
    sorted_token_ids = torch.full((max_padded,), numel, dtype=torch.int32, device=device)
    expert_ids = torch.full((-(-max_padded // block_size),), -1, dtype=torch.int32, device=device)
    position = 0
    for expert in range(num_experts):
        slots = torch.nonzero(flat == expert).flatten()  # ascending flat index
        sorted_token_ids[position:position + len(slots)] = slots.to(torch.int32)
        num_blocks = -(-len(slots) // block_size)
        expert_ids[position // block_size:position // block_size + num_blocks] = expert
        position += num_blocks * block_size
    return sorted_token_ids, expert_ids, torch.tensor([position], dtype=torch.int32, device=device)
