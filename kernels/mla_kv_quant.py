"""Quantized DS-MLA KV caches: the write kernel, the decode attention that dequantizes in registers,
and their plain-PyTorch references. Byte layouts: ``launchers/kv_cache_formats.py`` (``MLAKVFormat``).

Quantizing one token (fp32 arithmetic, operation by operation; the helpers are ``kernels/fp4.py``'s):

``fp8_ds_mla``, per tile of 128 latent values (the NVFP4 kernel's scale rule with E4M3's max, 448):
  scale    = amax / 448                               (IEEE division)
  elements = e4m3_rne(x * rcp(scale)), saturating to ±448, rcp(0) = 0
  dequant  = e4m3 * scale
  - zero tile: scale 0, codes 0 (dequantizes to 0); a tile holding NaN or ±inf: scale NaN, codes 0
    (every value of the tile dequantizes to NaN, as a NaN MX scale does).

``nvfp4_ds_mla``: the library's NVFP4 rule with the token's own global scale:
  gs        = 448 * 6 / amax(token latent)             (IEEE division; at most 2**126; 0 for a zero token)
  scale     = e4m3_rne(min(gs * (amax16 * fp32(1/6)), 448))
  out_scale = rcp(scale * rcp(gs))
  elements  = e2m1_rne(x * out_scale), saturating to ±6
  dequant   = e2m1 * (scale / gs), 0 where gs is 0 (the all-zero entry: a zeroed slot, a zero token)
  - a token whose latent holds NaN or ±inf: gs NaN, block scales 0x7F (NaN), codes 0: NaN.

Both: the RoPE part is stored as bf16 (round to nearest even, NaN kept), and an element that rounds
to zero gets code 0, never the negative zero code (0x80 / 0x8).

Decode attention is ``kernels/paged_attention.py``'s grid split kernel (program per request and
split, online softmax over ``BLOCK_N``-token tiles, partials merged by its combine kernel) with the
key tile dequantized in registers: latent codes times their scales in fp32, then rounded once to
q's dtype for the dot (as a bf16 cache holds bf16 keys); the value is the same dequantized latent.
"""

import torch
import triton
import triton.language as tl

from .fp4 import (
    _FP32_ONE_SIXTH_BITS,
    _e2m1_codes_reference,
    _e2m1_decode,
    _e4m3_decode,
    _minifloat_code,
    _pack_pairs,
    _reciprocal_or_zero,
    _to_fp32,
    _unpack_reference,
)

E4M3_MAX = 448.0
NVFP4_TOKEN_SCALE = 448.0 * 6.0  # the global scale that puts the token's largest block scale at 448
MAX_GLOBAL_SCALE = 2.0**126  # keeps gs and 1 / gs normal fp32 (binds only below amax 3.2e-35)
FP8_FORMAT = "fp8_ds_mla"
NVFP4_FORMAT = "nvfp4_ds_mla"


# --------------------------------------------------------------------------- write (quantize)

@triton.jit
def _bf16_bits(x):
    """bf16 bits (int32, 0..0xFFFF) of fp32 ``x``, rounded to nearest even; NaN -> 0x7FC0. Integer
    code: the interpreter's bf16 cast does not round to nearest even everywhere."""
    bits = x.to(tl.int32, bitcast=True)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) & 0xFFFF
    return tl.where(x != x, 0x7FC0, rounded)


@triton.jit(do_not_specialize=["block_stride"])
def mla_kv_quantize_write_kernel(
    cache_ptr, latent_ptr, rope_ptr, slots_ptr,
    block_stride, latent_row_stride, rope_row_stride,
    KV_FORMAT: tl.constexpr, PAGE_SIZE: tl.constexpr, ENTRY_BYTES: tl.constexpr,
    LATENT_DIM: tl.constexpr, ROPE_DIM: tl.constexpr, BLOCK_ROPE: tl.constexpr,
    SCALE_GROUP: tl.constexpr, SCALE_OFFSET: tl.constexpr, ROPE_OFFSET: tl.constexpr,
    GLOBAL_SCALE_OFFSET: tl.constexpr,
):
    # Program t writes token t into slot slots[t] = block * PAGE_SIZE + row (negative: padding, skipped).
    token = tl.program_id(0).to(tl.int64)
    slot = tl.load(slots_ptr + token).to(tl.int64)
    if slot >= 0:
        entry = cache_ptr + (slot // PAGE_SIZE) * block_stride + (slot % PAGE_SIZE) * ENTRY_BYTES
        groups = tl.arange(0, LATENT_DIM // SCALE_GROUP)
        cols = groups[:, None] * SCALE_GROUP + tl.arange(0, SCALE_GROUP)[None, :]
        x = _to_fp32(tl.load(latent_ptr + token * latent_row_stride + cols))
        amax_bits = tl.max(x.to(tl.int32, bitcast=True) & 0x7FFFFFFF, axis=1)  # per group; NaN kept
        if KV_FORMAT == "fp8_ds_mla":
            non_finite = amax_bits >= 0x7F800000
            amax = amax_bits.to(tl.float32, bitcast=True)
            scale = tl.math.div_rn(amax, tl.full(amax.shape, 448.0, tl.float32))
            codes = _minifloat_code(x * _reciprocal_or_zero(scale)[:, None], MANTISSA_BITS=3, MIN_EXP=-6,
                                    MAX_CODE=0x7E, SIGN_SHIFT=7)
            codes = tl.where(non_finite[:, None], 0, codes)
            tl.store(entry + cols, codes.to(tl.uint8))
            scale_bits = tl.where(non_finite, 0x7FC00000, scale.to(tl.int32, bitcast=True))
            tl.store((entry + SCALE_OFFSET).to(tl.pointer_type(tl.int32)) + groups, scale_bits)
        else:
            token_amax_bits = tl.max(amax_bits, axis=0)
            non_finite = token_amax_bits >= 0x7F800000
            token_amax = token_amax_bits.to(tl.float32, bitcast=True)
            safe_amax = tl.where(token_amax == 0, 1.0, token_amax)
            global_scale = tl.minimum(tl.math.div_rn(tl.full((), 2688.0, tl.float32), safe_amax),
                                      85070591730234615865843651857942052864.0)  # 2**126
            global_scale = tl.where(token_amax == 0, 0.0, global_scale)
            one_sixth = tl.full((), _FP32_ONE_SIXTH_BITS, tl.int32).to(tl.float32, bitcast=True)
            block_scale = global_scale * (amax_bits.to(tl.float32, bitcast=True) * one_sixth)
            scale_code = _minifloat_code(block_scale, MANTISSA_BITS=3, MIN_EXP=-6, MAX_CODE=0x7E, SIGN_SHIFT=7)
            out_scale = _reciprocal_or_zero(_e4m3_decode(scale_code) * _reciprocal_or_zero(global_scale))
            codes = _minifloat_code(x * out_scale[:, None], MANTISSA_BITS=1, MIN_EXP=0, MAX_CODE=7, SIGN_SHIFT=3)
            codes = tl.where(non_finite, 0, codes)
            scale_code = tl.where(non_finite, 0x7F, scale_code)
            packed = _pack_pairs(codes, LATENT_DIM // SCALE_GROUP, SCALE_GROUP)
            pairs = groups[:, None] * (SCALE_GROUP // 2) + tl.arange(0, SCALE_GROUP // 2)[None, :]
            tl.store(entry + pairs, packed)
            tl.store(entry + SCALE_OFFSET + groups, scale_code.to(tl.uint8))
            gs_bits = tl.where(non_finite, 0x7FC00000, global_scale.to(tl.int32, bitcast=True))
            tl.store((entry + GLOBAL_SCALE_OFFSET).to(tl.pointer_type(tl.int32)), gs_bits)
        r = tl.arange(0, BLOCK_ROPE)
        rope = _to_fp32(tl.load(rope_ptr + token * rope_row_stride + r, mask=r < ROPE_DIM, other=0.0))
        tl.store((entry + ROPE_OFFSET).to(tl.pointer_type(tl.int16)) + r, _bf16_bits(rope).to(tl.int16),
                 mask=r < ROPE_DIM)


# --------------------------------------------------------------------------- decode attention

@triton.jit
def _entry_fields(rows, mask, KV_FORMAT: tl.constexpr, LATENT_DIM: tl.constexpr, SCALE_OFFSET: tl.constexpr,
                  GLOBAL_SCALE_OFFSET: tl.constexpr, ROPE_OFFSET: tl.constexpr, ROPE_DIM: tl.constexpr,
                  BLOCK_ROPE: tl.constexpr):
    """The raw fields of the entries at ``rows`` ([BLOCK_N, 1] uint8 pointers; ``mask`` [BLOCK_N, 1]:
    masked entries read as zeros, the zero entry). Each field is one 2-D load, contiguous along its
    row and 16-byte aligned: 128-bit loads. Returns (codes, scales, global scale, RoPE bits):

    - fp8_ds_mla: codes uint8 [N, R], scales fp32 [N, R/128], global scale unused (zeros [N, 1]);
    - nvfp4_ds_mla: codes int32 [N, R/8] (8 E2M1 codes a word, code k of the word in bits 4k..4k+3:
      the byte order of the entry), scale codes uint8 [N, R/16], global scale fp32 [N, 1].
    """
    r = tl.arange(0, BLOCK_ROPE)
    rope = tl.load((rows + ROPE_OFFSET).to(tl.pointer_type(tl.int16)) + r[None, :], mask=mask & (r[None, :] < ROPE_DIM),
                   other=0)
    if KV_FORMAT == "fp8_ds_mla":
        codes = tl.load(rows + tl.arange(0, LATENT_DIM)[None, :], mask=mask, other=0)
        groups = tl.arange(0, LATENT_DIM // 128)
        scales = tl.load((rows + SCALE_OFFSET).to(tl.pointer_type(tl.float32)) + groups[None, :], mask=mask, other=0.0)
        global_scale = tl.zeros(mask.shape, tl.float32)
    else:
        codes = tl.load(rows.to(tl.pointer_type(tl.int32)) + tl.arange(0, LATENT_DIM // 8)[None, :], mask=mask, other=0)
        scales = tl.load(rows + SCALE_OFFSET + tl.arange(0, LATENT_DIM // 16)[None, :], mask=mask, other=0)
        global_scale = tl.load((rows + GLOBAL_SCALE_OFFSET).to(tl.pointer_type(tl.float32)), mask=mask, other=0.0)
    return codes, scales, global_scale, rope


@triton.jit
def _f16_halves(pairs):
    low = pairs.to(tl.int16).to(tl.float16, bitcast=True)
    high = (pairs >> 16).to(tl.int16).to(tl.float16, bitcast=True)
    return low, high


@triton.jit
def _e2m1_f16(words, BLOCK_N: tl.constexpr, WORDS: tl.constexpr):
    """[N, WORDS] int32 of E2M1 codes (code k of a word in bits 4k..4k+3) -> [N, 8 * WORDS] f16 of
    ``value * 2**-14``, exactly, in *paired* order: position j of each word's 8 holds code
    ``PAIRED[j] = j // 2 + 4 * (j % 2)`` (0, 4, 1, 5, 2, 6, 3, 7).

    Each f16's bits are the code's high byte: magnitude bits into the exponent's low bits and the
    mantissa's top bit (code 1, 0.5, lands on the f16 subnormal 2**-15), sign into bit 15. Bit
    operations on whole words: ``even``'s bytes are those high bytes for codes 0, 2, 4, 6, ``odd``'s
    for 1, 3, 5, 7, and masking alternate bytes of either gives two f16 at once. Codes k and k + 4
    share a register, hence the order: any other costs a byte shuffle per pair. The caller reads q's
    latent and writes the output in the same order."""
    even = ((words << 1) & 0x0E0E0E0E) | ((words << 4) & -0x7F7F7F80)  # 0x80808080
    odd = ((words >> 3) & 0x0E0E0E0E) | (words & -0x7F7F7F80)
    c0, c4 = _f16_halves((even << 8) & -0xFF0100)  # 0xFF00FF00
    c2, c6 = _f16_halves(even & -0xFF0100)
    c1, c5 = _f16_halves((odd << 8) & -0xFF0100)
    c3, c7 = _f16_halves(odd & -0xFF0100)
    low = tl.join(tl.join(c0, c2), tl.join(c1, c3))  # [c0, c1, c2, c3]: join's new axis is the fastest
    high = tl.join(tl.join(c4, c6), tl.join(c5, c7))
    return tl.reshape(tl.join(low, high), (BLOCK_N, WORDS * 8))


@triton.jit
def _latent_order(LATENT_DIM: tl.constexpr, PAIRED: tl.constexpr):
    """The latent dimension held at each position of a key tile: natural, or ``_e2m1_f16``'s paired order."""
    j = tl.arange(0, LATENT_DIM)
    if PAIRED:
        return (j & ~7) | ((j >> 1) & 3) | ((j & 1) << 2)
    else:
        return j


@triton.jit
def _e4m3_f16(codes, FP8_CVT: tl.constexpr):
    """E4M3FN codes (uint8) as f16, exactly: the hardware conversion where Triton has the type (sm89+,
    AMD, the interpreter), else the integer decode."""
    if FP8_CVT:
        return codes.to(tl.float8e4nv, bitcast=True).to(tl.float16)
    else:
        return _e4m3_decode(codes.to(tl.int32)).to(tl.float16)


@triton.jit
def _key_f16(codes, scales, global_scale, KV_FORMAT: tl.constexpr, LATENT_DIM: tl.constexpr, BLOCK_N: tl.constexpr,
             FP8_CVT: tl.constexpr = True):
    """The key tile as f16 ``k`` [N, R] and a per-token factor ``column`` [N] (fp32): the dequantized
    latent is ``k * column * key unit`` (1 for fp8_ds_mla, 2**14 for nvfp4_ds_mla). The factors go
    into the scores and the probabilities ([heads, N] tiles), not into each of the R values of a token.

    - fp8_ds_mla: ``column`` = the token's largest tile scale S, and ``k = code * (scale / S)``: the
      code is exact in f16, the ratio <= 1 rounded once to f16 (2**-11: finer than bf16's 2**-8).
    - nvfp4_ds_mla: ``column = 1 / global scale`` (0 for the zero entry), and ``k = e2m1 * scale *
      2**-14`` exactly: two minifloats' product has 6 significant bits, and the 2**-14 keeps every
      product (down to 2**-24) inside f16. Its columns are in ``_e2m1_f16``'s paired order.
    """
    if KV_FORMAT == "fp8_ds_mla":
        GROUPS: tl.constexpr = LATENT_DIM // 128
        # at least 2**-100: a tile of only zero (or subnormal-scale) tokens keeps a finite reciprocal
        column = tl.maximum(tl.max(scales, axis=1), 7.888609052210118e-31)
        ratio = (scales * (1.0 / column)[:, None]).to(tl.float16)
        values = tl.reshape(_e4m3_f16(codes, FP8_CVT), (BLOCK_N, GROUPS, 128))
        k = tl.reshape(values * ratio[:, :, None], (BLOCK_N, LATENT_DIM))
    else:
        GROUPS: tl.constexpr = LATENT_DIM // 16
        block_scale = _e4m3_f16(scales, FP8_CVT)
        values = tl.reshape(_e2m1_f16(codes, BLOCK_N, LATENT_DIM // 8), (BLOCK_N, GROUPS, 16))
        k = tl.reshape(values * block_scale[:, :, None], (BLOCK_N, LATENT_DIM))
        global_scale = tl.reshape(global_scale, (BLOCK_N,))
        column = tl.where(global_scale == 0.0, 0.0, 1.0 / tl.where(global_scale == 0.0, 1.0, global_scale))
    return k, column


@triton.jit
def _key_f32(codes, scales, global_scale, KV_FORMAT: tl.constexpr, LATENT_DIM: tl.constexpr, BLOCK_N: tl.constexpr):
    """The dequantized latent [N, R] in fp32, exactly ``mla_kv_dequantize_reference``'s values."""
    if KV_FORMAT == "fp8_ds_mla":
        GROUPS: tl.constexpr = LATENT_DIM // 128
        values = tl.reshape(_e4m3_decode(codes.to(tl.int32)), (BLOCK_N, GROUPS, 128))
        latent = values * scales[:, :, None]
    else:
        GROUPS: tl.constexpr = LATENT_DIM // 16
        shifts = tl.arange(0, 8) * 4
        values = _e2m1_decode((codes[:, :, None] >> shifts[None, None, :]) & 0xF)  # [N, R/8, 8]
        global_scale = tl.broadcast_to(global_scale, (BLOCK_N, GROUPS))
        empty = global_scale == 0.0
        block_scale = tl.math.div_rn(_e4m3_decode(scales.to(tl.int32)), tl.where(empty, 1.0, global_scale))
        block_scale = tl.where(empty, 0.0, block_scale)
        latent = tl.reshape(values, (BLOCK_N, GROUPS, 16)) * block_scale[:, :, None]
    return tl.reshape(latent, (BLOCK_N, LATENT_DIM))


@triton.jit
def _dequantized_latent(rows, token_mask, KV_FORMAT: tl.constexpr, LATENT_DIM: tl.constexpr,
                        SCALE_GROUP: tl.constexpr, SCALE_OFFSET: tl.constexpr, GLOBAL_SCALE_OFFSET: tl.constexpr,
                        BLOCK_N: tl.constexpr):
    """[BLOCK_N, LATENT_DIM] fp32 latent of the tokens whose entries start at ``rows`` ([BLOCK_N] uint8
    pointers); masked tokens read as zeros."""
    codes, scales, global_scale, _ = _entry_fields(rows[:, None], token_mask[:, None], KV_FORMAT, LATENT_DIM,
                                                   SCALE_OFFSET, GLOBAL_SCALE_OFFSET, 0, 1, 16)
    return _key_f32(codes, scales, global_scale, KV_FORMAT, LATENT_DIM, BLOCK_N)


@triton.jit
def _attend_quantized_tile(q, q_rope, row_scale, scale_log2, cache_ptr, table_row, token_start, token_hi,
                           cache_block_stride, row_max, row_sum, acc, acc_scale,
                           KV_FORMAT: tl.constexpr, PAGE_SIZE: tl.constexpr, ENTRY_BYTES: tl.constexpr,
                           LATENT_DIM: tl.constexpr, ROPE_DIM: tl.constexpr, BLOCK_ROPE: tl.constexpr,
                           SCALE_OFFSET: tl.constexpr, ROPE_OFFSET: tl.constexpr, GLOBAL_SCALE_OFFSET: tl.constexpr,
                           BLOCK_N: tl.constexpr, KEY_BARRIER: tl.constexpr, FP8_CVT: tl.constexpr,
                           PARTIAL: tl.constexpr):
    """One BLOCK_N-token tile into the online softmax (base 2). Returns (row_max, row_sum, acc, acc_scale):
    the output so far is ``acc * acc_scale * key unit / row_sum`` (fp32 q: ``acc / row_sum``)."""
    n = tl.arange(0, BLOCK_N)
    tokens = token_start + n
    if PAGE_SIZE % BLOCK_N == 0:  # a tile is consecutive slots of one page: one block id, fixed offsets
        block_id = tl.load(table_row + token_start // PAGE_SIZE)
        rows = cache_ptr + block_id.to(tl.int64) * cache_block_stride \
            + ((token_start % PAGE_SIZE) + n[:, None]) * ENTRY_BYTES
    else:
        block_ids = tl.load(table_row + tokens // PAGE_SIZE, mask=tokens < token_hi, other=0)
        rows = cache_ptr + (block_ids.to(tl.int64) * cache_block_stride + (tokens % PAGE_SIZE) * ENTRY_BYTES)[:, None]
    if PARTIAL:
        token_mask = tokens < token_hi
    else:
        token_mask = n < BLOCK_N  # all true: folded away
    codes, scales, global_scale, rope_bits = _entry_fields(rows, token_mask[:, None], KV_FORMAT, LATENT_DIM,
                                                           SCALE_OFFSET, GLOBAL_SCALE_OFFSET, ROPE_OFFSET, ROPE_DIM,
                                                           BLOCK_ROPE)
    if q_rope.dtype == tl.bfloat16:
        k_rope = rope_bits.to(tl.bfloat16, bitcast=True)
    else:  # rounded to q's dtype, as a cache of q's dtype would hold it
        k_rope = _to_fp32(rope_bits.to(tl.bfloat16, bitcast=True)).to(q_rope.dtype)
    if q.dtype == tl.float32:  # exact fp32 keys, fp32 products (the reference's arithmetic)
        k = _key_f32(codes, scales, global_scale, KV_FORMAT, LATENT_DIM, BLOCK_N)
        scores = tl.dot(q, tl.trans(k), input_precision="ieee")
        scores = tl.dot(q_rope, tl.trans(k_rope), scores, input_precision="ieee") * scale_log2
        column = tl.full([BLOCK_N], 1.0, tl.float32)
        tile_scale = 1.0
    else:
        k, column = _key_f16(codes, scales, global_scale, KV_FORMAT, LATENT_DIM, BLOCK_N, FP8_CVT)
        if KEY_BARRIER:
            # An opaque copy: Triton would otherwise redo the dequantization above once per dot operand
            # layout (and pick the 8-bit operand layout for q); this way the f16 tile is made once and
            # both dots read it from shared memory.
            k = tl.inline_asm_elementwise("mov.b32 $0, $1;", "=r,r", [k], dtype=tl.float16, is_pure=False, pack=2)
        scores = tl.dot(q, tl.trans(k)) * (row_scale[:, None] * column[None, :])
        scores = tl.dot(q_rope, tl.trans(k_rope), scores) * scale_log2
        # probabilities times each token's factor, over the tile's largest factor: in [0, 1] for f16
        tile_scale = tl.maximum(tl.max(column, axis=0), 7.888609052210118e-31)
    if PARTIAL:
        scores = tl.where(token_mask[None, :], scores, float("-inf"))
    new_max = tl.maximum(row_max, tl.max(scores, axis=1))
    safe_max = tl.where(new_max == float("-inf"), 0.0, new_max)
    rescale = tl.exp2(row_max - safe_max)
    probs = tl.exp2(scores - safe_max[:, None])
    row_sum = row_sum * rescale + tl.sum(probs, axis=1)
    if q.dtype == tl.float32:
        acc = tl.dot(probs, k, acc * rescale[:, None], input_precision="ieee")
    else:
        weights = (probs * (column * (1.0 / tile_scale))[None, :]).to(tl.float16)
        acc = tl.dot(weights, k, acc * (rescale * (acc_scale / tile_scale))[:, None])
    return new_max, row_sum, acc, tile_scale


@triton.jit(do_not_specialize=["block_table_stride", "num_splits"])
def quantized_mla_decode_split_kernel(
    q_ptr, cache_ptr, block_table_ptr, seq_lens_ptr, partial_out_ptr, partial_lse_ptr,
    q_batch_stride, q_head_stride, cache_block_stride, block_table_stride,
    partial_split_stride, partial_head_stride, lse_split_stride,
    scale_log2, num_splits,
    KV_FORMAT: tl.constexpr, PAGE_SIZE: tl.constexpr, ENTRY_BYTES: tl.constexpr, NUM_HEADS: tl.constexpr,
    LATENT_DIM: tl.constexpr, ROPE_DIM: tl.constexpr, BLOCK_ROPE: tl.constexpr,
    SCALE_GROUP: tl.constexpr, SCALE_OFFSET: tl.constexpr, ROPE_OFFSET: tl.constexpr,
    GLOBAL_SCALE_OFFSET: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr,
    KEY_BARRIER: tl.constexpr = False, FP8_CVT: tl.constexpr = True,
):
    """Program (request * num_splits + split, head tile): one partial (output, base-2 lse) per split,
    as ``paged_decode_attention_grid_split_kernel`` writes them (a split past the request's end
    writes lse -inf only).

    bf16 / fp16 q: the latent part of the scores and the value product run as f16 MMAs on the tile
    ``_key_f16`` dequantizes once, with q's latent scaled per head by a power of two into f16's range
    (exact for a bf16 q: f16 has more mantissa bits) and the factors undone on [heads, N] tiles. The
    RoPE part reads the stored bf16 directly. fp32 q: fp32 keys and products throughout.
    """
    slot = tl.program_id(0).to(tl.int64)
    request = slot // num_splits
    split = slot % num_splits
    heads = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    head_mask = heads < NUM_HEADS
    r = tl.arange(0, BLOCK_ROPE)

    seq_len = tl.load(seq_lens_ptr + request)
    tiles_per_split = ((seq_len + BLOCK_N - 1) // BLOCK_N + num_splits - 1) // num_splits
    token_lo = tl.minimum(split * tiles_per_split * BLOCK_N, seq_len)
    token_hi = tl.minimum(token_lo + tiles_per_split * BLOCK_N, seq_len)

    # the latent dimension at each column of the key tile (nvfp4's f16 tile is in paired order):
    # q is read, and the output written, in that order
    latent = _latent_order(LATENT_DIM, KV_FORMAT == "nvfp4_ds_mla" and q_ptr.dtype.element_ty != tl.float32)
    q_rows = q_ptr + request * q_batch_stride + heads[:, None] * q_head_stride
    q = tl.load(q_rows + latent[None, :], mask=head_mask[:, None], other=0.0)
    q_rope = tl.load(q_rows + LATENT_DIM + r[None, :], mask=head_mask[:, None] & (r[None, :] < ROPE_DIM), other=0.0)
    KEY_UNIT: tl.constexpr = 1.0 if KV_FORMAT == "fp8_ds_mla" else 16384.0  # see _key_f16
    row_scale = tl.full([BLOCK_H], KEY_UNIT, tl.float32)
    if q.dtype == tl.bfloat16:
        # 2**(14 - e) per head, e = the exponent of the head's largest |q|: that value lands in [2**14, 2**15)
        q_amax = tl.max(tl.abs(_to_fp32(q)), axis=1)
        exponent = tl.minimum(tl.maximum(((q_amax.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127, -100), 113)
        q = (_to_fp32(q) * ((127 + 14 - exponent) << 23).to(tl.float32, bitcast=True)[:, None]).to(tl.float16)
        row_scale = ((127 - 14 + exponent) << 23).to(tl.float32, bitcast=True) * KEY_UNIT
    table_row = block_table_ptr + request * block_table_stride

    row_max = tl.full([BLOCK_H], float("-inf"), tl.float32)
    row_sum = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_H, LATENT_DIM], tl.float32)
    acc_scale = 1.0
    # whole tiles unmasked, then the partial tile (at most one step), masked
    whole_hi = token_lo + (token_hi - token_lo) // BLOCK_N * BLOCK_N
    for token_start in range(token_lo, whole_hi, BLOCK_N):
        row_max, row_sum, acc, acc_scale = _attend_quantized_tile(
            q, q_rope, row_scale, scale_log2, cache_ptr, table_row, token_start, token_hi, cache_block_stride,
            row_max, row_sum, acc, acc_scale, KV_FORMAT, PAGE_SIZE, ENTRY_BYTES, LATENT_DIM, ROPE_DIM, BLOCK_ROPE,
            SCALE_OFFSET, ROPE_OFFSET, GLOBAL_SCALE_OFFSET, BLOCK_N, KEY_BARRIER, FP8_CVT, False)
    for token_start in range(whole_hi, token_hi, BLOCK_N):
        row_max, row_sum, acc, acc_scale = _attend_quantized_tile(
            q, q_rope, row_scale, scale_log2, cache_ptr, table_row, token_start, token_hi, cache_block_stride,
            row_max, row_sum, acc, acc_scale, KV_FORMAT, PAGE_SIZE, ENTRY_BYTES, LATENT_DIM, ROPE_DIM, BLOCK_ROPE,
            SCALE_OFFSET, ROPE_OFFSET, GLOBAL_SCALE_OFFSET, BLOCK_N, KEY_BARRIER, FP8_CVT, True)

    # row_sum is 0 only for a split with no tokens; a NaN (a non-finite key) stays NaN, in the output
    # and in the lse, which the combine propagates
    safe_sum = tl.where(row_sum == 0.0, 1.0, row_sum)
    if q.dtype == tl.float32:
        out = acc / safe_sum[:, None]
    else:  # in this order: no intermediate overflows where the output itself does not
        out = acc * (1.0 / safe_sum)[:, None] * KEY_UNIT * acc_scale
    lse = tl.where(row_sum == 0.0, float("-inf"), row_max + tl.log2(safe_sum))
    live_heads = heads < tl.where(token_hi > token_lo, NUM_HEADS, 0)
    partial_rows = partial_out_ptr + slot * partial_split_stride + heads[:, None] * partial_head_stride
    tl.store(partial_rows + latent[None, :], out, mask=live_heads[:, None])
    tl.store(partial_lse_ptr + slot * lse_split_stride + heads, lse, mask=head_mask)


# --------------------------------------------------------------------------- references

def _bytes_of(x: torch.Tensor) -> torch.Tensor:
    """[..., n] of a fixed-width dtype -> [..., n * itemsize] uint8 (native byte order, as the GPU stores)."""
    return x.contiguous().view(torch.uint8)


def _reciprocal(y: torch.Tensor) -> torch.Tensor:
    return torch.where(y == 0, torch.zeros_like(y), 1.0 / y)


def _fp8_latent_reference(latent: torch.Tensor, fmt) -> tuple[torch.Tensor, torch.Tensor]:
    """(codes uint8 [T, R], scales fp32 [T, R/128]) with torch's own float8_e4m3fn rounding."""
    tiles = latent.float().reshape(latent.shape[0], -1, fmt.scale_group)
    amax = tiles.abs().amax(dim=-1)
    non_finite = ~torch.isfinite(amax)
    scale = amax / torch.full_like(amax, E4M3_MAX)  # tensor by tensor: IEEE division, never a reciprocal
    scaled = (tiles * _reciprocal(scale).unsqueeze(-1)).clamp(-E4M3_MAX, E4M3_MAX)  # saturate, then RNE
    codes = scaled.to(torch.float8_e4m3fn).view(torch.uint8)
    codes = torch.where((codes == 0x80) | non_finite.unsqueeze(-1), 0, codes)  # no negative zero
    scale = torch.where(non_finite, float("nan"), scale)
    return codes.flatten(1), scale


def _nvfp4_latent_reference(latent: torch.Tensor, fmt):
    """(packed uint8 [T, R/2], scale codes uint8 [T, R/16], global scales fp32 [T]): ``nvfp4_quantize_reference``'s
    rule per token, with the token's global scale."""
    blocks = latent.float().reshape(latent.shape[0], -1, fmt.scale_group)
    amax = blocks.abs().amax(dim=-1)
    token_amax = amax.amax(dim=-1)
    non_finite = ~torch.isfinite(token_amax)
    # tensor by tensor: torch computes ``scalar / tensor`` as ``tensor.reciprocal() * scalar`` (two roundings)
    gs = (torch.full_like(token_amax, NVFP4_TOKEN_SCALE) / torch.where(token_amax == 0, 1.0, token_amax))
    gs = gs.clamp(max=MAX_GLOBAL_SCALE)
    gs = torch.where(token_amax == 0, 0.0, gs)
    one_sixth = torch.tensor(1 / 6, dtype=torch.float32, device=amax.device)
    block_scale = gs.unsqueeze(-1) * (amax * one_sixth)
    scale_fp8 = block_scale.clamp(max=E4M3_MAX).to(torch.float8_e4m3fn)
    out_scale = _reciprocal(scale_fp8.float() * _reciprocal(gs).unsqueeze(-1))
    codes = _e2m1_codes_reference(blocks * out_scale.unsqueeze(-1))
    codes = torch.where(non_finite[:, None, None], 0, codes).flatten(1).to(torch.uint8)
    packed = codes[:, 0::2] | (codes[:, 1::2] << 4)
    scale_codes = torch.where(non_finite.unsqueeze(-1), 0x7F, scale_fp8.view(torch.uint8).int()).to(torch.uint8)
    gs = torch.where(non_finite, float("nan"), gs)
    return packed, scale_codes, gs


def mla_kv_quantize_reference(latent: torch.Tensor, rope: torch.Tensor, fmt) -> torch.Tensor:
    """The ``fmt.entry_bytes`` entries (uint8 ``[T, entry_bytes]``) of tokens ``latent [T, R]``, ``rope [T, P]``."""
    tokens = latent.shape[0]
    entries = torch.zeros(tokens, fmt.entry_bytes, dtype=torch.uint8, device=latent.device)
    fields = fmt.fields()
    if fmt.name == FP8_FORMAT:
        codes, scales = _fp8_latent_reference(latent, fmt)
        parts = {"latent": codes, "scales": _bytes_of(scales)}
    else:
        packed, scale_codes, gs = _nvfp4_latent_reference(latent, fmt)
        parts = {"latent": packed, "scales": scale_codes, "global_scale": _bytes_of(gs.unsqueeze(-1))}
    # NaN as the canonical 0x7FC0 (torch's own conversion gives another NaN pattern on some devices)
    rope_bits = torch.where(rope.isnan(), 0x7FC0, rope.float().to(torch.bfloat16).view(torch.int16).int())
    parts["rope"] = _bytes_of(rope_bits.to(torch.int16))
    for name, data in parts.items():
        start, stop = fields[name]
        entries[:, start:stop] = data
    return entries


def mla_kv_dequantize_reference(entries: torch.Tensor, fmt) -> torch.Tensor:
    """fp32 ``[..., R + P]`` (``[latent | rope]``) of uint8 entries ``[..., entry_bytes]``."""
    fields = fmt.fields()

    def field(name):
        start, stop = fields[name]
        return entries[..., start:stop].contiguous()

    rope = field("rope").view(torch.bfloat16).float()
    if fmt.name == FP8_FORMAT:
        codes = field("latent").view(torch.float8_e4m3fn).float().unflatten(-1, (-1, fmt.scale_group))
        latent = (codes * field("scales").view(torch.float32).unsqueeze(-1)).flatten(-2)
    else:
        values = _unpack_reference(field("latent")).float().unflatten(-1, (-1, fmt.scale_group))
        gs = field("global_scale").view(torch.float32)
        block_scale = field("scales").view(torch.float8_e4m3fn).float() / torch.where(gs == 0, 1.0, gs)
        block_scale = torch.where(gs == 0, 0.0, block_scale)
        latent = (values * block_scale.unsqueeze(-1)).flatten(-2)
    return torch.cat([latent, rope], dim=-1)


def mla_kv_write_reference(kv_cache: torch.Tensor, fmt, slots: torch.Tensor, latent: torch.Tensor,
                           rope: torch.Tensor) -> None:
    """``mla_kv_quantize_reference``'s entries into ``kv_cache [blocks, block_size, 1, entry_bytes]`` at
    ``slots`` (block * block_size + row; negative: skipped), in place."""
    entries = mla_kv_quantize_reference(latent, rope, fmt)
    slots = slots.long()
    keep = slots >= 0
    block_size = kv_cache.shape[1]
    kv_cache[slots[keep] // block_size, slots[keep] % block_size, 0] = entries[keep]


def quantized_mla_decode_attention_reference(q, kv_cache, block_table, seq_lens, scale, fmt, round_keys=True):
    """Plain softmax attention over the dequantized cache: each token's ``[latent | rope]`` from
    ``mla_kv_dequantize_reference``, rounded to q's dtype as a cache of that dtype would hold it
    (``round_keys=False``: the dequantized values as they are), then fp32 math. The value is the
    dequantized latent. Returns ``[batch, heads, R]`` in q's dtype."""
    num_blocks, block_size = kv_cache.shape[:2]
    keys = mla_kv_dequantize_reference(kv_cache[:, :, 0], fmt)  # [blocks, bs, R + P]
    if round_keys:
        keys = keys.to(q.dtype).float()
    batch, num_heads, _ = q.shape
    out = torch.zeros(batch, num_heads, fmt.kv_lora_rank, dtype=torch.float32, device=q.device)
    for request in range(batch):
        length = int(seq_lens[request])
        if length == 0:
            continue
        positions = torch.arange(length, device=q.device)
        k = keys[block_table[request, positions // block_size].long(), positions % block_size]  # [L, R + P]
        probs = torch.softmax((q[request].float() @ k.T) * scale, dim=-1)  # [heads, L]
        out[request] = probs @ k[:, :fmt.kv_lora_rank]
    return out.to(q.dtype)
