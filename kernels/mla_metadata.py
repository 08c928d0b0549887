"""Split-KV schedule of a paged decode (FlashMLA's ``get_mla_metadata`` is the model), and its reference.

Work is counted in KV blocks. Request ``r`` has ``n_r = ceil(seq_len_r / block_size)`` blocks and
costs ``units_r = n_r + overhead`` work units (``overhead``: the fixed cost of one more split: load
the queries, write a partial result, merge it), or 0 units when it is empty. Lay the requests' units
end to end (``unit_start_r`` = units before ``r``) and cut that line into ``num_parts`` equal pieces
of ``payload = ceil(total_units / num_parts) + overhead`` units. The whole schedule is one rule:

    block j of request r belongs to part  (unit_start_r + overhead + j) // payload

so every part owns a contiguous range of the concatenated block sequence (parts past the end own
nothing), a part's share of a request's overhead never counts as owning a block, and a request
touched by k parts gets k *splits* (partial results), merged by the attention combine kernel.
``num_heads`` does not enter the cost: every block of every request costs the same per head, and a
part processes all heads of its blocks, so heads scale all costs alike and never move a cut.

Outputs (all int32, computed on the device, no host sync):

- ``schedule [num_parts, 8]``: per part ``(begin_req, begin_block, end_req, end_block,
  begin_split, 0, 0, 0)``: the part owns blocks ``[begin_block, ...)`` of ``begin_req``, all blocks
  of the requests in between, and blocks ``[..., end_block)`` (exclusive) of ``end_req``
  (``end_req`` inclusive). ``begin_split`` is the index of this part's split among ``begin_req``'s
  splits (later requests in the part always get split 0). A part with no work has ``end_req = -1 <
  begin_req = 0``.
- ``num_splits [batch + 1]``: prefix sums: request ``r``'s splits are partial-result slots
  ``num_splits[r] .. num_splits[r+1]-1``; ``num_splits[batch]`` (at most ``batch + num_parts - 1``)
  slots in all. An empty request (seq_len 0) has no split.
"""

import torch
import triton
import triton.language as tl


@triton.jit(do_not_specialize=["batch", "num_parts"])
def mla_decode_metadata_kernel(
    seq_lens_ptr, schedule_ptr, num_splits_ptr,
    batch, num_parts, block_size, overhead,
    SCHEDULE_WIDTH: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_P: tl.constexpr,
):
    # batch and num_parts change with every step / GPU: they only bound loops, never specialized.
    # The loops are while loops because Triton 3.6's interpreter cannot range() to a runtime int.
    # Program i schedules parts [i*BLOCK_P, (i+1)*BLOCK_P); each pass re-reads seq_lens in chunks of
    # BLOCK_B requests, and cross-request positions come from masked [BLOCK_P, BLOCK_B] sums.
    pid = tl.program_id(0)
    req = tl.arange(0, BLOCK_B)

    # Pass 1: total work, hence the payload of one part.
    total_units = 0
    total_blocks = 0
    start = 0
    while start < batch:
        seq_lens = tl.load(seq_lens_ptr + start + req, mask=start + req < batch, other=0)
        blocks = (tl.maximum(seq_lens, 0) + block_size - 1) // block_size
        total_blocks += tl.sum(blocks, axis=0)
        total_units += tl.sum(tl.where(blocks > 0, blocks + overhead, 0), axis=0)
        start += BLOCK_B
    payload = tl.maximum((total_units + num_parts - 1) // num_parts + overhead, 1)

    # Pass 2: each part's cuts on the unit line, moved to the block line. A cut at unit c inside
    # request r lands on block clamp(c - unit_start_r - overhead, 0) of r (a cut in r's overhead
    # lands on r's first block); requests ending at or before c are those wholly before the cut.
    part = pid * BLOCK_P + tl.arange(0, BLOCK_P)
    cut_lo = part * payload
    cut_hi = cut_lo + payload
    lo_units_before = tl.zeros([BLOCK_P], tl.int32)
    lo_blocks_before = tl.zeros([BLOCK_P], tl.int32)
    hi_units_before = tl.zeros([BLOCK_P], tl.int32)
    hi_blocks_before = tl.zeros([BLOCK_P], tl.int32)
    units_carry = 0
    start = 0
    while start < batch:
        seq_lens = tl.load(seq_lens_ptr + start + req, mask=start + req < batch, other=0)
        blocks = (tl.maximum(seq_lens, 0) + block_size - 1) // block_size
        units = tl.where(blocks > 0, blocks + overhead, 0)
        unit_end = units_carry + tl.cumsum(units, axis=0)
        before_lo = unit_end[None, :] <= cut_lo[:, None]
        before_hi = unit_end[None, :] <= cut_hi[:, None]
        lo_units_before += tl.sum(tl.where(before_lo, units[None, :], 0), axis=1)
        lo_blocks_before += tl.sum(tl.where(before_lo, blocks[None, :], 0), axis=1)
        hi_units_before += tl.sum(tl.where(before_hi, units[None, :], 0), axis=1)
        hi_blocks_before += tl.sum(tl.where(before_hi, blocks[None, :], 0), axis=1)
        units_carry += tl.sum(units, axis=0)
        start += BLOCK_B
    first = tl.minimum(lo_blocks_before + tl.maximum(cut_lo - lo_units_before - overhead, 0), total_blocks)
    stop = tl.minimum(hi_blocks_before + tl.maximum(cut_hi - hi_units_before - overhead, 0), total_blocks)
    last = tl.maximum(stop - 1, 0)

    # Pass 3: which request holds the part's first and last block (requests ending at or before a
    # block are those before the one holding it).
    first_req = tl.zeros([BLOCK_P], tl.int32)
    first_blocks_before = tl.zeros([BLOCK_P], tl.int32)
    first_units_before = tl.zeros([BLOCK_P], tl.int32)
    last_req = tl.zeros([BLOCK_P], tl.int32)
    last_blocks_before = tl.zeros([BLOCK_P], tl.int32)
    blocks_carry = 0
    start = 0
    while start < batch:
        valid = start + req < batch
        seq_lens = tl.load(seq_lens_ptr + start + req, mask=valid, other=0)
        blocks = (tl.maximum(seq_lens, 0) + block_size - 1) // block_size
        units = tl.where(blocks > 0, blocks + overhead, 0)
        block_end = blocks_carry + tl.cumsum(blocks, axis=0)
        before_first = (block_end[None, :] <= first[:, None]) & valid[None, :]
        before_last = (block_end[None, :] <= last[:, None]) & valid[None, :]
        first_req += tl.sum(before_first.to(tl.int32), axis=1)
        first_blocks_before += tl.sum(tl.where(before_first, blocks[None, :], 0), axis=1)
        first_units_before += tl.sum(tl.where(before_first, units[None, :], 0), axis=1)
        last_req += tl.sum(before_last.to(tl.int32), axis=1)
        last_blocks_before += tl.sum(tl.where(before_last, blocks[None, :], 0), axis=1)
        blocks_carry += tl.sum(blocks, axis=0)
        start += BLOCK_B

    has_work = stop > first
    # Parts before this one that own blocks of first_req: cuts inside its blocks, up to this part.
    begin_split = tl.maximum(part - (first_units_before + overhead) // payload, 0)
    row = schedule_ptr + part * SCHEDULE_WIDTH
    in_range = part < num_parts
    tl.store(row + 0, tl.where(has_work, first_req, 0), mask=in_range)
    tl.store(row + 1, tl.where(has_work, first - first_blocks_before, 0), mask=in_range)
    tl.store(row + 2, tl.where(has_work, last_req, -1), mask=in_range)
    tl.store(row + 3, tl.where(has_work, stop - last_blocks_before, 0), mask=in_range)
    tl.store(row + 4, tl.where(has_work, begin_split, 0), mask=in_range)
    for column in tl.static_range(5, SCHEDULE_WIDTH):
        tl.store(row + column, tl.zeros([BLOCK_P], tl.int32), mask=in_range)

    # num_splits prefix sums (program 0): request r is split by every cut strictly inside its
    # blocks, i.e. multiples of payload in (unit_start_r + overhead, unit_end_r).
    if pid == 0:
        tl.store(num_splits_ptr, 0)
        units_carry = 0
        splits_carry = 0
        start = 0
        while start < batch:
            valid = start + req < batch
            seq_lens = tl.load(seq_lens_ptr + start + req, mask=valid, other=0)
            blocks = (tl.maximum(seq_lens, 0) + block_size - 1) // block_size
            units = tl.where(blocks > 0, blocks + overhead, 0)
            unit_end = units_carry + tl.cumsum(units, axis=0)
            unit_start = unit_end - units
            splits = tl.where(blocks > 0, 1 + (unit_end - 1) // payload - (unit_start + overhead) // payload, 0)
            tl.store(num_splits_ptr + 1 + start + req, splits_carry + tl.cumsum(splits, axis=0), mask=valid)
            units_carry += tl.sum(units, axis=0)
            splits_carry += tl.sum(splits, axis=0)
            start += BLOCK_B


def mla_decode_metadata_reference(seq_lens: torch.Tensor, num_parts: int, block_size: int,
                                  overhead: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The schedule straight from its definition: assign every block to its part, then read off
    each part's first and last block and count each request's parts."""
    lengths = [max(int(n), 0) for n in seq_lens.tolist()]
    blocks = [-(-n // block_size) for n in lengths]
    units = [n + overhead if n else 0 for n in blocks]
    payload = max(-(-sum(units) // num_parts) + overhead, 1)

    owned = [[] for _ in range(num_parts)]  # (request, block) of each part, in order
    unit_start = 0
    for request, n in enumerate(blocks):
        for block in range(n):
            owned[(unit_start + overhead + block) // payload].append((request, block))
        unit_start += units[request]

    schedule = torch.zeros(num_parts, 8, dtype=torch.int32, device="cpu")  # filled on the host, moved once
    splits = [0] * len(lengths)
    for part, work in enumerate(owned):
        if not work:
            schedule[part, 2] = -1
            continue
        (first_req, first_block), (last_req, last_block) = work[0], work[-1]
        schedule[part, :5] = torch.tensor([first_req, first_block, last_req, last_block + 1, splits[first_req]],
                                          device="cpu")
        for request in sorted({r for r, _ in work}):
            splits[request] += 1
    num_splits = torch.tensor([0] + splits, dtype=torch.int32, device="cpu").cumsum(0).to(torch.int32)
    return schedule.to(seq_lens.device), num_splits.to(seq_lens.device)
