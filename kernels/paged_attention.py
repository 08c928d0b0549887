"""Split-KV paged decode attention (one query token per request) and its PyTorch reference.

Two kernels, scheduled by ``kernels/mla_metadata.py``:

1. ``paged_decode_attention_split_kernel``: program (part, kv head, head tile) walks the block
   range its part owns (possibly several requests) and, per request, writes one *partial* result:
   the softmax-normalized output over those blocks and its log-sum-exp (base 2), in fp32, into the
   request's split slot.
   ``paged_decode_attention_grid_split_kernel`` is the schedule-free alternative (the same number of
   splits for every request, chosen on the host; one program per (request, split)); the declared
   settings pick one of the two per target (``launchers/paged_attention_tiles.json``).
2. ``paged_decode_attention_combine_kernel``: program (request, head) merges the request's
   partials by their log-sum-exp into the final output.

The KV cache layout is ``launchers/kv_cache.py``'s: keys and values are read through two views of
the same tensor, so GQA (packed ``[K | V]`` entries, ``HEADS_PER_KV`` query heads per kv head) and
MLA (one latent kv head; the value is the first ``VALUE_DIM`` dims of the key) are the same code.
A key wider than a power of two (MLA's 512 + 64) is processed as a main chunk plus a tail chunk so no
tile is padded to 1024.

A key that is not finite makes the output of the heads that read it NaN, as in the reference (its
split's NaN log-sum-exp propagates through the combine); a request of length 0 gives zeros.
"""

import torch
import triton
import triton.language as tl


@triton.jit
def _attend_tokens(q, q_tail, key_ptr, value_ptr, table_row, token_lo, token_hi,
                   cache_block_stride, cache_token_stride, head_offset, scale_log2,
                   PAGE_SIZE: tl.constexpr, KEY_DIM: tl.constexpr, VALUE_DIM: tl.constexpr,
                   BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
                   BLOCK_D_TAIL: tl.constexpr, BLOCK_DV: tl.constexpr, VALUE_IS_KEY: tl.constexpr,
                   TABLE_AHEAD: tl.constexpr = False):
    """Online softmax over tokens [token_lo, token_hi) of one request: (row_max, row_sum, acc), base 2.

    The whole tiles from ``token_lo`` run in the loop with no token mask; the last, partial tile (if
    any) runs in a second loop of at most one step, masked. The mask's compares and selects were
    over a quarter of the sm90 MLA loop's instructions.

    ``VALUE_IS_KEY`` (MLA, value = the key's first VALUE_DIM == BLOCK_D dims): the value tile IS the
    loaded key tile, so no second load is issued at all (without it the re-read hits cache but still
    costs load instructions and registers).

    ``TABLE_AHEAD``: each step loads the *next* tile's block ids into a loop-carried register. Loaded
    in the same step, block ids -> K/V addresses is a chain of two loads inside one iteration, and
    Triton's pipeliner then gives the K/V loads only ``(num_stages - 1) // 2`` buffers of lookahead;
    carried over, the K/V addresses are known one step early and the pipeliner may go deeper.

    A page of whole tiles (``PAGE_SIZE % BLOCK_N == 0``, MLA's 64-token pages): ``token_lo`` is then a
    multiple of BLOCK_N (a page boundary in the schedule kernel, whole tiles in the grid kernel), so
    each tile is consecutive slots of one page. Its block id is one scalar, and its addresses are one
    scalar base plus offsets that stay fixed for the whole loop. Per-token ids and addresses took
    half the sm90 loop's instructions (MLA, BLOCK_N 64: 64 row addresses per tile).
    """
    row_max = tl.full([BLOCK_H], float("-inf"), tl.float32)
    row_sum = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_DV], tl.float32)
    n = tl.arange(0, BLOCK_N)
    ids = 0  # the carried block id(s) of the next tile, with TABLE_AHEAD
    if TABLE_AHEAD:
        if PAGE_SIZE % BLOCK_N == 0:
            ids = tl.load(table_row + token_lo // PAGE_SIZE, mask=token_lo < token_hi, other=0)
        else:
            ids = tl.load(table_row + (token_lo + n) // PAGE_SIZE, mask=token_lo + n < token_hi, other=0)
    whole_hi = token_lo + (token_hi - token_lo) // BLOCK_N * BLOCK_N
    for token_start in range(token_lo, whole_hi, BLOCK_N):
        row_max, row_sum, acc, ids = _attend_tile(
            q, q_tail, key_ptr, value_ptr, table_row, token_start, token_hi, ids, row_max, row_sum, acc,
            cache_block_stride, cache_token_stride, head_offset, scale_log2,
            PAGE_SIZE, KEY_DIM, VALUE_DIM, BLOCK_N, BLOCK_D, BLOCK_D_TAIL, BLOCK_DV, VALUE_IS_KEY, TABLE_AHEAD,
            False)
    # The partial tile, as a loop of at most one step: pipelined through the same shared memory. (As an
    # `if` after the loop, its tile went through registers: 255 of them on sm90.)
    for token_start in range(whole_hi, token_hi, BLOCK_N):
        row_max, row_sum, acc, ids = _attend_tile(
            q, q_tail, key_ptr, value_ptr, table_row, token_start, token_hi, ids, row_max, row_sum, acc,
            cache_block_stride, cache_token_stride, head_offset, scale_log2,
            PAGE_SIZE, KEY_DIM, VALUE_DIM, BLOCK_N, BLOCK_D, BLOCK_D_TAIL, BLOCK_DV, VALUE_IS_KEY, TABLE_AHEAD,
            True)
    return row_max, row_sum, acc


@triton.jit
def _normalized(acc, row_max, row_sum):
    """A split's output and log-sum-exp (base 2). row_sum is 0 only for a split with no tokens (lse
    -inf: the combine skips it); a NaN (a non-finite key) stays NaN in both, which the combine
    propagates (a -inf lse would drop the split silently)."""
    safe_sum = tl.where(row_sum == 0.0, 1.0, row_sum)
    return acc / safe_sum[:, None], tl.where(row_sum == 0.0, float("-inf"), row_max + tl.log2(safe_sum))


@triton.jit
def _attend_tile(q, q_tail, key_ptr, value_ptr, table_row, token_start, token_hi, ids, row_max, row_sum, acc,
                 cache_block_stride, cache_token_stride, head_offset, scale_log2,
                 PAGE_SIZE: tl.constexpr, KEY_DIM: tl.constexpr, VALUE_DIM: tl.constexpr,
                 BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_D_TAIL: tl.constexpr,
                 BLOCK_DV: tl.constexpr, VALUE_IS_KEY: tl.constexpr, TABLE_AHEAD: tl.constexpr,
                 PARTIAL: tl.constexpr):
    """One BLOCK_N tile from ``token_start`` into the online softmax; only a ``PARTIAL`` tile masks
    tokens at ``token_hi``. Returns (row_max, row_sum, acc, the next tile's carried ids)."""
    n = tl.arange(0, BLOCK_N)
    d = tl.arange(0, BLOCK_D)
    dv = tl.arange(0, BLOCK_DV)
    tokens = token_start + n
    if PAGE_SIZE % BLOCK_N == 0:  # one page's consecutive slots: one id, one base, fixed offsets
        if TABLE_AHEAD:
            block_id = ids
            ahead = token_start + BLOCK_N
            ids = tl.load(table_row + ahead // PAGE_SIZE, mask=ahead < token_hi, other=0)
        else:
            block_id = tl.load(table_row + token_start // PAGE_SIZE)
        base = block_id.to(tl.int64) * cache_block_stride + (token_start % PAGE_SIZE) * cache_token_stride \
            + head_offset
        key_rows = key_ptr + base + n[:, None] * cache_token_stride
        value_rows = value_ptr + base + n[:, None] * cache_token_stride
    else:
        if TABLE_AHEAD:
            block_ids = ids
            ahead = tokens + BLOCK_N
            ids = tl.load(table_row + ahead // PAGE_SIZE, mask=ahead < token_hi, other=0)
        else:
            block_ids = tl.load(table_row + tokens // PAGE_SIZE, mask=tokens < token_hi, other=0)
        rows = block_ids.to(tl.int64) * cache_block_stride + (tokens % PAGE_SIZE) * cache_token_stride \
            + head_offset
        key_rows = key_ptr + rows[:, None]
        value_rows = value_ptr + rows[:, None]
    if PARTIAL:
        token_mask = tokens < token_hi
    else:
        token_mask = n < BLOCK_N  # all true: folded away
    k = tl.load(key_rows + d[None, :], mask=token_mask[:, None] & (d[None, :] < KEY_DIM), other=0.0)
    scores = tl.dot(q, tl.trans(k), input_precision="ieee")
    if BLOCK_D_TAIL > 0:
        d_tail = BLOCK_D + tl.arange(0, BLOCK_D_TAIL)
        k_tail = tl.load(key_rows + d_tail[None, :], mask=token_mask[:, None] & (d_tail[None, :] < KEY_DIM),
                         other=0.0)
        scores += tl.dot(q_tail, tl.trans(k_tail), input_precision="ieee")
    scores = scores * scale_log2
    if PARTIAL:
        scores = tl.where(token_mask[None, :], scores, float("-inf"))
    new_max = tl.maximum(row_max, tl.max(scores, axis=1))
    # Every tile holds at least one real token, but keep -inf - -inf (NaN) impossible anyway.
    safe_max = tl.where(new_max == float("-inf"), 0.0, new_max)
    rescale = tl.exp2(row_max - safe_max)
    probs = tl.exp2(scores - safe_max[:, None])
    row_sum = row_sum * rescale + tl.sum(probs, axis=1)
    if VALUE_IS_KEY:
        v = k
    else:
        # For MLA the value view aliases the key's first VALUE_DIM dims: this re-read hits cache.
        v = tl.load(value_rows + dv[None, :], mask=token_mask[:, None] & (dv[None, :] < VALUE_DIM), other=0.0)
    acc = tl.dot(probs.to(v.dtype), v, acc * rescale[:, None], input_precision="ieee")
    return new_max, row_sum, acc, ids


@triton.jit(do_not_specialize=["block_table_stride"])
def paged_decode_attention_split_kernel(
    q_ptr, key_ptr, value_ptr, block_table_ptr, seq_lens_ptr, schedule_ptr, num_splits_ptr,
    partial_out_ptr, partial_lse_ptr,
    q_batch_stride, q_head_stride,
    cache_block_stride, cache_token_stride, cache_head_stride,
    block_table_stride,
    partial_split_stride, partial_head_stride, lse_split_stride,
    scale_log2,
    SCHEDULE_WIDTH: tl.constexpr, PAGE_SIZE: tl.constexpr, HEADS_PER_KV: tl.constexpr,
    KEY_DIM: tl.constexpr, VALUE_DIM: tl.constexpr,
    BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr, BLOCK_D_TAIL: tl.constexpr, BLOCK_DV: tl.constexpr,
    VALUE_IS_KEY: tl.constexpr = False, TABLE_AHEAD: tl.constexpr = False,
):
    # The hot token loop is a for loop: it compiles to far fewer registers than a while loop
    # (MLA on sm90: 162 vs 255 plus a stack frame).
    part = tl.program_id(0)
    kv_head = tl.program_id(1)
    schedule = schedule_ptr + part * SCHEDULE_WIDTH
    # int64 loop variables: request and split offsets cannot overflow.
    begin_req = tl.load(schedule + 0).to(tl.int64)
    begin_block = tl.load(schedule + 1)
    end_req = tl.load(schedule + 2).to(tl.int64)  # inclusive; -1 when the part has no work
    end_block = tl.load(schedule + 3)
    begin_split = tl.load(schedule + 4)

    group_row = tl.program_id(2) * BLOCK_H + tl.arange(0, BLOCK_H)
    head_mask = group_row < HEADS_PER_KV
    heads = kv_head * HEADS_PER_KV + group_row
    d = tl.arange(0, BLOCK_D)
    d_mask = d < KEY_DIM
    dv = tl.arange(0, BLOCK_DV)
    dv_mask = dv < VALUE_DIM
    if BLOCK_D_TAIL > 0:
        d_tail = BLOCK_D + tl.arange(0, BLOCK_D_TAIL)
        d_tail_mask = d_tail < KEY_DIM
    head_offset = kv_head.to(tl.int64) * cache_head_stride

    request = begin_req
    while request <= end_req:
        seq_len = tl.load(seq_lens_ptr + request)
        block_lo = tl.where(request == begin_req, begin_block, 0)
        block_hi = tl.where(request == end_req, end_block, (seq_len + PAGE_SIZE - 1) // PAGE_SIZE)
        split = (tl.load(num_splits_ptr + request) + tl.where(request == begin_req, begin_split, 0)).to(tl.int64)
        token_lo = block_lo * PAGE_SIZE
        token_hi = tl.minimum(block_hi * PAGE_SIZE, seq_len)

        q_rows = q_ptr + request * q_batch_stride + heads[:, None] * q_head_stride
        q = tl.load(q_rows + d[None, :], mask=head_mask[:, None] & d_mask[None, :], other=0.0)
        if BLOCK_D_TAIL > 0:
            q_tail = tl.load(q_rows + d_tail[None, :], mask=head_mask[:, None] & d_tail_mask[None, :], other=0.0)
        else:
            q_tail = q  # unused
        table_row = block_table_ptr + request * block_table_stride

        row_max, row_sum, acc = _attend_tokens(
            q, q_tail, key_ptr, value_ptr, table_row, token_lo, token_hi,
            cache_block_stride, cache_token_stride, head_offset, scale_log2,
            PAGE_SIZE, KEY_DIM, VALUE_DIM, BLOCK_H, BLOCK_N, BLOCK_D, BLOCK_D_TAIL, BLOCK_DV, VALUE_IS_KEY,
            TABLE_AHEAD)

        # A request inside the range with no blocks (seq_len 0) has no split slot: write nothing.
        # (One vector comparison, not scalar & vector, which the interpreter turns into an int32 mask.)
        live_heads = group_row < tl.where(token_hi > token_lo, HEADS_PER_KV, 0)
        out, lse = _normalized(acc, row_max, row_sum)
        partial_rows = partial_out_ptr + split * partial_split_stride + heads[:, None] * partial_head_stride
        tl.store(partial_rows + dv[None, :], out, mask=live_heads[:, None] & dv_mask[None, :])
        tl.store(partial_lse_ptr + split * lse_split_stride + heads, lse, mask=live_heads)
        request += 1


@triton.jit(do_not_specialize=["block_table_stride", "num_splits"])
def paged_decode_attention_grid_split_kernel(
    q_ptr, key_ptr, value_ptr, block_table_ptr, seq_lens_ptr,
    partial_out_ptr, partial_lse_ptr,
    q_batch_stride, q_head_stride,
    cache_block_stride, cache_token_stride, cache_head_stride,
    block_table_stride,
    partial_split_stride, partial_head_stride, lse_split_stride,
    scale_log2, num_splits,
    PAGE_SIZE: tl.constexpr, HEADS_PER_KV: tl.constexpr,
    KEY_DIM: tl.constexpr, VALUE_DIM: tl.constexpr,
    BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr, BLOCK_D_TAIL: tl.constexpr, BLOCK_DV: tl.constexpr,
    VALUE_IS_KEY: tl.constexpr = False, TABLE_AHEAD: tl.constexpr = False,
):
    """The schedule-free alternative: program (request * num_splits + split, kv head, head tile).

    Every request is cut into ``num_splits`` equal token ranges (whole BLOCK_N tiles; a range past
    the end writes only lse -inf, no partial row: the combine skips it), chosen on the host from the
    batch.
    One token loop per program and no outer request loop, so nothing stands between the software
    pipeliner and the loads; split slot ``request * num_splits + split`` (``num_splits`` prefix sums
    ``r * num_splits`` for the combine kernel).
    """
    slot = tl.program_id(0).to(tl.int64)
    kv_head = tl.program_id(1)
    request = slot // num_splits
    split = slot % num_splits
    group_row = tl.program_id(2) * BLOCK_H + tl.arange(0, BLOCK_H)
    head_mask = group_row < HEADS_PER_KV
    heads = kv_head * HEADS_PER_KV + group_row
    d = tl.arange(0, BLOCK_D)
    dv = tl.arange(0, BLOCK_DV)
    dv_mask = dv < VALUE_DIM

    seq_len = tl.load(seq_lens_ptr + request)
    tiles_per_split = ((seq_len + BLOCK_N - 1) // BLOCK_N + num_splits - 1) // num_splits
    token_lo = tl.minimum(split * tiles_per_split * BLOCK_N, seq_len)
    token_hi = tl.minimum(token_lo + tiles_per_split * BLOCK_N, seq_len)

    q_rows = q_ptr + request * q_batch_stride + heads[:, None] * q_head_stride
    q = tl.load(q_rows + d[None, :], mask=head_mask[:, None] & (d[None, :] < KEY_DIM), other=0.0)
    if BLOCK_D_TAIL > 0:
        d_tail = BLOCK_D + tl.arange(0, BLOCK_D_TAIL)
        q_tail = tl.load(q_rows + d_tail[None, :], mask=head_mask[:, None] & (d_tail[None, :] < KEY_DIM), other=0.0)
    else:
        q_tail = q  # unused
    row_max, row_sum, acc = _attend_tokens(
        q, q_tail, key_ptr, value_ptr, block_table_ptr + request * block_table_stride, token_lo, token_hi,
        cache_block_stride, cache_token_stride, kv_head.to(tl.int64) * cache_head_stride, scale_log2,
        PAGE_SIZE, KEY_DIM, VALUE_DIM, BLOCK_H, BLOCK_N, BLOCK_D, BLOCK_D_TAIL, BLOCK_DV, VALUE_IS_KEY,
        TABLE_AHEAD)

    out, lse = _normalized(acc, row_max, row_sum)
    # An empty split stores no partial row (no write traffic); its lse -inf tells the combine to skip it.
    live_heads = group_row < tl.where(token_hi > token_lo, HEADS_PER_KV, 0)
    partial_rows = partial_out_ptr + slot * partial_split_stride + heads[:, None] * partial_head_stride
    tl.store(partial_rows + dv[None, :], out, mask=live_heads[:, None] & dv_mask[None, :])
    tl.store(partial_lse_ptr + slot * lse_split_stride + heads, lse, mask=head_mask)


@triton.jit
def paged_decode_attention_combine_kernel(
    partial_out_ptr, partial_lse_ptr, num_splits_ptr, out_ptr,
    partial_split_stride, partial_head_stride, lse_split_stride,
    out_batch_stride, out_head_stride,
    VALUE_DIM: tl.constexpr, BLOCK_DV: tl.constexpr, BLOCK_S: tl.constexpr,
):
    # Program (request, head), BLOCK_S splits per step: their lse values and partial rows are loaded
    # as one tile, so the loads of a step are independent (a split at a time was a chain of
    # dependent loads: ~0.11 us per split on the H200, 16 us for 128 splits). A request with no
    # split (seq_len 0) gets zeros, not 0/0. A split with lse -inf (the grid kernel's splits past a
    # request's end) has weight 0 and its partial row is not read (never written; reading it would
    # cost memory traffic for nothing). A NaN lse gives NaN weights: it propagates.
    request = tl.program_id(0)
    head = tl.program_id(1)
    dv = tl.arange(0, BLOCK_DV)
    dv_mask = dv < VALUE_DIM
    lanes = tl.arange(0, BLOCK_S)
    split_lo = tl.load(num_splits_ptr + request).to(tl.int64)  # int64: split offsets cannot overflow
    split_hi = tl.load(num_splits_ptr + request + 1).to(tl.int64)

    running_max = float("-inf")
    running_sum = 0.0
    acc = tl.zeros([BLOCK_DV], tl.float32)
    first = split_lo
    while first < split_hi:
        splits = first + lanes
        lse = tl.load(partial_lse_ptr + splits * lse_split_stride + head, mask=splits < split_hi,
                      other=float("-inf"))
        live = lse > float("-inf")
        rows = partial_out_ptr + splits[:, None] * partial_split_stride + head * partial_head_stride
        part_out = tl.load(rows + dv[None, :], mask=live[:, None] & dv_mask[None, :], other=0.0)
        new_max = tl.maximum(running_max, tl.max(lse, axis=0))
        safe_max = tl.where(new_max == float("-inf"), 0.0, new_max)  # all -inf so far: weights 0, not NaN
        rescale = tl.exp2(running_max - safe_max)
        weights = tl.exp2(lse - safe_max)
        acc = acc * rescale + tl.sum(weights[:, None] * part_out, axis=0)
        running_sum = running_sum * rescale + tl.sum(weights, axis=0)
        running_max = new_max
        first += BLOCK_S
    out = acc / tl.where(running_sum > 0.0, running_sum, 1.0)
    out_row = out_ptr + request * out_batch_stride + head * out_head_stride
    tl.store(out_row + dv, out.to(out_ptr.dtype.element_ty), mask=dv_mask)


def paged_decode_attention_reference(q, kv_cache, block_table, seq_lens, scale, layout):
    """Gather each request's keys and values token by token, then plain softmax attention in fp32.

    ``layout`` is the cache's ``KVCacheLayout``. A request of length 0 attends to nothing: zeros.
    """
    batch, num_heads, _ = q.shape
    heads_per_kv = num_heads // layout.num_kv_heads
    keys, values = layout.keys(kv_cache).float(), layout.values(kv_cache).float()
    out = torch.zeros(batch, num_heads, layout.value_dim, dtype=torch.float32, device=q.device)
    for request in range(batch):
        length = int(seq_lens[request])
        if length == 0:
            continue
        positions = torch.arange(length, device=q.device)
        blocks = block_table[request, positions // layout.block_size].long()
        rows = positions % layout.block_size
        k = keys[blocks, rows]  # [length, num_kv_heads, key_dim]
        v = values[blocks, rows]
        for head in range(num_heads):
            kv_head = head // heads_per_kv
            scores = (k[:, kv_head] @ q[request, head].float()) * scale
            out[request, head] = torch.softmax(scores, dim=0) @ v[:, kv_head]
    return out.to(q.dtype)
