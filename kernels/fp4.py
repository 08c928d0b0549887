"""MXFP4 and NVFP4 quantize / dequantize device code, and their PyTorch references.

Both formats store FP4 E2M1 elements (±{0, 0.5, 1, 1.5, 2, 3, 4, 6}) two per byte, low nibble first
(element 2i in bits 0-3, element 2i+1 in bits 4-7), with one scale per block along the last dim:

MXFP4 (OCP Microscaling Formats v1.0): blocks of 32, E8M0 scale byte (2**(byte - 127), 0xFF = NaN).
  shared_exp = floor(log2(amax)) - 2 (emax of E2M1), clamped to E8M0's [-127, 127] (only the lower
  bound can bind: fp32 amax < 2**128);
  elements = rne_e2m1(x / 2**shared_exp), saturating to ±6, E2M1's subnormal 0.5 included.
  - All-zero block: amax = 0 clamps to shared_exp = -127, scale byte 0x00, codes 0: dequantizes to 0.
  - Block holding NaN or ±inf: scale byte 0xFF (NaN) and all element codes 0; per the MX spec a NaN
    scale makes every element of the block NaN on dequantize.

NVFP4 (vLLM's ``ref_nvfp4_quant`` / its CUDA kernel): blocks of 16, FP8 E4M3 scale, fp32 global scale
``gs`` (the caller's choice, usually 448 * 6 / amax(tensor)). In fp32, operation by operation:
  scale     = e4m3_rne(min(gs * (amax * fp32(1/6)), 448))        (saturating, as vLLM clamps first)
  out_scale = rcp(scale * rcp(gs)) with rcp(y) = 0 if y == 0 else 1 / y   (IEEE division)
  elements  = rne_e2m1(x * out_scale), saturating to ±6
  dequant   = e2m1 * (scale / gs), rounded to the output dtype
  - A block whose scale rounds to 0 in E4M3 (amax * gs / 6 < 2**-10): scale byte 0x00, out_scale 0,
    all codes 0: the block dequantizes to zeros.
  - Block holding ±inf (no NaN): as vLLM, the scale saturates to 448 (0x7E) and ±inf elements to ±6.
  - Block holding NaN: scale byte 0x7F (E4M3 NaN), all element codes 0: dequantizes to NaN.

In both formats an element whose magnitude rounds to 0 gets code 0x0, never 0x8 (no negative zero).
The E4M3 and E2M1 rounding is integer arithmetic on the fp32 bits (one helper for both): Triton's
interpreter does not round its fp8 casts to nearest-even, and integer code means the same on every
target (E4M3FN and E2M1 conversions are not native everywhere).
"""

import torch
import triton
import triton.language as tl

MXFP4_BLOCK = 32
NVFP4_BLOCK = 16
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)  # magnitude codes 0..7
E8M0_NAN = 0xFF
E4M3_NAN = 0x7F
E4M3_MAX = 448.0
_FP32_ONE_SIXTH_BITS = tl.constexpr(0x3E2AAAAB)  # fp32(1/6), the E2M1 max's reciprocal vLLM multiplies by


# --------------------------------------------------------------------------- shared device helpers

@triton.jit
def _minifloat_code(value, MANTISSA_BITS: tl.constexpr, MIN_EXP: tl.constexpr, MAX_CODE: tl.constexpr,
                    SIGN_SHIFT: tl.constexpr):
    """Code of the minifloat nearest to fp32 ``value``: ties to even, magnitude saturating at MAX_CODE,
    sign at bit SIGN_SHIFT only for a nonzero magnitude (no negative zero). NaN is the caller's job.

    The minifloat has MANTISSA_BITS explicit mantissa bits and MIN_EXP as its smallest normal
    exponent (below it: subnormals with the same quantum). Its codes are ordered like its values,
    so code = (exponent steps above MIN_EXP) << MANTISSA_BITS + rounded significand, and a
    significand that rounds up to the next power of two carries into the exponent by itself.
    """
    bits = value.to(tl.int32, bitcast=True)
    exp = ((bits >> 23) & 0xFF) - 127  # zero / fp32 subnormal: -127, rounds to code 0 below
    significand = (bits & 0x7FFFFF) | 0x800000  # 24 bits, implicit one included
    # Bits to drop so that one unit of `kept` is the target's quantum at this exponent; past 25
    # every significand (< 2**24) is under half a quantum, so 25 stands for "all".
    drop = tl.minimum(23 - MANTISSA_BITS + tl.maximum(MIN_EXP - exp, 0), 25)
    kept = significand >> drop
    rest = significand - (kept << drop)
    half = 1 << (drop - 1)
    round_up = (rest > half) | ((rest == half) & ((kept & 1) == 1))
    kept = kept + round_up.to(tl.int32)
    code = tl.minimum(((tl.maximum(exp, MIN_EXP) - MIN_EXP) << MANTISSA_BITS) + kept, MAX_CODE)
    negative = (bits < 0) & (code != 0)
    return code | (negative.to(tl.int32) << SIGN_SHIFT)


@triton.jit
def _minifloat_code_fast(value, MANTISSA_BITS: tl.constexpr, MIN_EXP: tl.constexpr, MAX_VALUE: tl.constexpr,
                         SIGN_SHIFT: tl.constexpr):
    """The code ``_minifloat_code`` gives (ties to even, saturating at MAX_VALUE's code, no negative
    zero) in about a third of its integer work: the FP adder does the rounding.

    |value| (clamped to MAX_VALUE, which saturates alike) plus 2**(23 - MANTISSA_BITS + max(e, MIN_EXP)),
    e = floor(log2 |value|), has an ulp of exactly the minifloat's quantum at that magnitude, so the
    add rounds to nearest-even and its low bits count the quanta m (at most 2**(MANTISSA_BITS + 1));
    the code is m + 2**MANTISSA_BITS * (max(e, MIN_EXP) - MIN_EXP). The magnitude goes through its
    bits, so the add is never contracted into an FMA with the caller's multiply (NVFP4 rounds that
    product first). NaN is the caller's job.
    """
    bits = value.to(tl.int32, bitcast=True)
    magnitude = tl.minimum((bits & 0x7FFFFFFF).to(tl.float32, bitcast=True), MAX_VALUE)
    # 2**(23 - MANTISSA_BITS + max(e, MIN_EXP)): |value|'s exponent field, at least MIN_EXP's, shifted.
    magic_bits = (tl.maximum(magnitude.to(tl.int32, bitcast=True) & 0x7F800000, (MIN_EXP + 127) << 23)
                  + ((23 - MANTISSA_BITS) << 23))
    quanta = (magnitude + magic_bits.to(tl.float32, bitcast=True)).to(tl.int32, bitcast=True) - magic_bits
    code = quanta + (((magic_bits >> 23) - (127 + 23 - MANTISSA_BITS + MIN_EXP)) << MANTISSA_BITS)
    return tl.where((bits < 0) & (code != 0), code | (1 << SIGN_SHIFT), code)


@triton.jit
def _e2m1_lines(magnitude, scale):
    """E2M1 magnitude code of ``magnitude * scale`` (ties to even, saturating at 6) in bits 0-2 of the
    returned int32; bits 3-22 are zero, those from 23 up are not (mask or truncate them).
    ``magnitude`` >= 0, NaN is the caller's job; ``magnitude * scale`` must be exact: ``scale`` a
    power of two, or 1.0 for a product the caller rounded (passed through |.|, so it cannot
    contract into an FMA here).

    Counted in E2M1 quanta, the code of v is min(2v, v + 2, v / 2 + 4, 7): one line per binade (the
    quantum is 0.5 below 2, 1 up to 4, 2 from 4), the lines meet at v = 2 and v = 4, and the minimum
    picks the right one. Each line, halved, is one FMA whose addend holds 2**22, where the fp32 ulp
    is 0.5: the FMA's own rounding is the ties-to-even rounding to a whole code, and the code lands
    in the low mantissa bits. Rounding is monotonic, so the minimum of the rounded lines is the
    rounded minimum. Six FP instructions, no integer work. The multipliers are ``scale``, ``scale / 2``
    and ``scale / 4`` (never above ``scale``: MXFP4's 2**127 cannot overflow); for MXFP4's smallest,
    2**-125, the last is a subnormal, exact because Triton compiles fp32 without flush-to-zero (tested).
    """
    MAGIC: tl.constexpr = 4194304.0  # 2**22: the ulp of [2**22, 2**23) is 0.5
    below_two = magnitude * scale + MAGIC  # 2v codes
    two_to_four = magnitude * (scale * 0.5) + (MAGIC + 1.0)  # v + 2
    from_four = magnitude * (scale * 0.25) + (MAGIC + 2.0)  # v / 2 + 4
    lines = tl.minimum(tl.minimum(below_two, two_to_four), tl.minimum(from_four, MAGIC + 3.5))
    return lines.to(tl.int32, bitcast=True)


@triton.jit
def _bf16_constant(value: tl.constexpr):
    """A bf16 constant (folded by the compiler); Triton 3.6's interpreter has no bf16 ``tl.full``."""
    return tl.full((), value, tl.float32).to(tl.bfloat16)


@triton.jit
def _e2m1_lines_bf16(magnitude, scale, cap):
    """``_e2m1_lines`` in bf16 arithmetic, for bf16 ``magnitude`` >= 0 and a power-of-two fp32
    ``scale``: the code in bits 0-2 of the returned int16 (bits 3-6 zero, 7-15 not).

    bf16 keeps fp32's exponent range, so ``magnitude * scale`` is exact inside each FMA and every
    FMA rounds once, as in fp32. The addend is 64, where the bf16 ulp is 0.5: the same halved lines.
    What changes is the instruction: LLVM and ptxas pair two bf16 FMAs into one HFMA2.BF16, so two
    elements cost what one did. The multipliers are exact in bf16 (MXFP4's smallest, 2**-127, is a
    bf16 subnormal, which bf16 arithmetic keeps: it has no flush-to-zero mode). Not for a product
    the caller rounded (NVFP4): bf16 would round it again.
    ``cap`` is the bits of 67.5 (0x4287, the saturated code 7); those of 64.0 (0x4280) give code 0 to
    every element, NaN and inf included, at no cost per element.
    """
    # bf16 addends: a Python float would be an fp32 operand (and an fp32 FMA) to Triton 3.6
    below_two = tl.fma(magnitude, scale.to(tl.bfloat16), _bf16_constant(64.0))  # 64 + v: 2v codes
    two_to_four = tl.fma(magnitude, (scale * 0.5).to(tl.bfloat16), _bf16_constant(65.0))  # 64 + (v+2)/2
    from_four = tl.fma(magnitude, (scale * 0.25).to(tl.bfloat16), _bf16_constant(66.0))  # 64 + (v/2+4)/2
    # The minimum on the bit patterns: the lines are positive, so their bits order as their values,
    # NaN's above all (ignored, as a float minimum would); and Triton 3.6 would take a bf16 minimum
    # in fp32, two unpaired instructions.
    return tl.minimum(tl.minimum(below_two.to(tl.int16, bitcast=True), two_to_four.to(tl.int16, bitcast=True)),
                      tl.minimum(from_four.to(tl.int16, bitcast=True), cap))


@triton.jit
def _e2m1_codes(values, E2M1: tl.constexpr):
    """Signed E2M1 codes of fp32 ``values`` (int32, 0..15) by the rounding E2M1 names: "lines"
    (``_e2m1_lines``), "adder" (``_minifloat_code_fast``) or "integer" (``_minifloat_code``); all
    three are kept so that the speed of each can be measured against the others (same codes: tested)."""
    if E2M1 == "lines":
        code = _e2m1_lines(tl.abs(values), 1.0) & 7
        # the sign (bit 31 shifted to bit 3) only on a nonzero code: code + 7 has bit 3 iff code >= 1
        return code | ((code + 7) & (values.to(tl.int32, bitcast=True) >> 28) & 8)
    elif E2M1 == "adder":
        return _minifloat_code_fast(values, MANTISSA_BITS=1, MIN_EXP=0, MAX_VALUE=6.0, SIGN_SHIFT=3)
    else:
        return _minifloat_code(values, MANTISSA_BITS=1, MIN_EXP=0, MAX_CODE=7, SIGN_SHIFT=3)


@triton.jit
def _e2m1_decode(code):
    """fp32 value of the E2M1 ``code`` (int32, 0..15): 0x8 decodes to -0.0."""
    magnitude = code & 7
    # Normal codes (2..7): exponent field magnitude >> 1 (bias 1), mantissa bit magnitude & 1.
    normal_bits = (((magnitude >> 1) + 126) << 23) | ((magnitude & 1) << 22)
    value = tl.where(magnitude >= 2, normal_bits.to(tl.float32, bitcast=True), magnitude.to(tl.float32) * 0.5)
    return tl.where((code & 8) != 0, -value, value)


@triton.jit
def _e4m3_decode(code):
    """fp32 value of the E4M3FN ``code`` (int32, 0..255): 0x7F / 0xFF are NaN."""
    magnitude = code & 0x7F
    exp_field = magnitude >> 3
    mantissa = magnitude & 7
    normal_bits = ((exp_field + 120) << 23) | (mantissa << 20)  # exponent exp_field - 7, bias 127
    subnormal = mantissa.to(tl.float32) * 0.001953125  # mantissa * 2**-9, exact
    value = tl.where(exp_field == 0, subnormal, normal_bits.to(tl.float32, bitcast=True))
    value = tl.where(magnitude == 0x7F, float("nan"), value)
    return tl.where((code & 0x80) != 0, -value, value)


@triton.jit
def _reciprocal_or_zero(y):
    """vLLM's ``get_reciprocal``: 1 / y with IEEE rounding (not the approximate fp32 divide), 0 for 0."""
    is_zero = y == 0
    safe = tl.where(is_zero, 1.0, y)
    return tl.where(is_zero, 0.0, tl.math.div_rn(tl.full(safe.shape, 1.0, tl.float32), safe))


@triton.jit
def _to_fp32(x):
    """``x`` widened to fp32 exactly. bf16 goes through its bits: Triton's interpreter mis-converts
    bf16 subnormals (the GPU's conversion is the same shift)."""
    if x.dtype == tl.bfloat16:
        return (x.to(tl.int16, bitcast=True).to(tl.int32) << 16).to(tl.float32, bitcast=True)
    else:
        return x.to(tl.float32)


@triton.jit
def _narrow_exact(x, dtype: tl.constexpr):
    """fp32 ``x``, exactly representable in ``dtype``, narrowed to it; bf16 through its bits (the
    interpreter mis-converts bf16 subnormals; for a representable value the GPU's cvt is the same)."""
    if dtype == tl.bfloat16:
        return (x.to(tl.int32, bitcast=True) >> 16).to(tl.int16).to(tl.bfloat16, bitcast=True)
    else:
        return x.to(dtype)


@triton.jit
def _pack_pairs(codes, GROUPS: tl.constexpr, BLOCK: tl.constexpr):
    """[GROUPS, BLOCK] int32 codes -> [GROUPS, BLOCK // 2] bytes, element 2i in the low nibble."""
    low, high = tl.split(tl.reshape(codes, (GROUPS, BLOCK // 2, 2)))
    return (low | (high << 4)).to(tl.uint8)


@triton.jit
def _interleave(low, high, GROUPS: tl.constexpr, BLOCK: tl.constexpr):
    """Two [GROUPS, BLOCK // 2] halves -> [GROUPS, BLOCK], ``low`` at even positions (unpacking)."""
    return tl.reshape(tl.join(low, high), (GROUPS, BLOCK))


# --------------------------------------------------------------------------- MXFP4

@triton.jit
def _load_pair_words(x_ptr, row, x_row_stride, pair_cols, group_ok):
    """bf16 element pairs (4-byte aligned rows) read as int32 words: element 2i in the low half."""
    return tl.load((x_ptr + row * x_row_stride).to(tl.pointer_type(tl.int32)) + pair_cols,
                   mask=group_ok[:, None], other=0)


@triton.jit
def _e8m0_scale(amax_exp):
    """MXFP4's block scale from the biased exponent of the block's |max| (255: inf / NaN): whether
    the block is non-finite, the E8M0 byte to store (0xFF for a non-finite block) and the power of
    two 2**-shared_exp that scales its elements."""
    non_finite = amax_exp == 255
    # scale byte = shared_exp + 127 = floor(log2(amax)) - 2 + 127, clamped below at 0 (2**-127).
    scale_byte = tl.maximum(amax_exp - 2, 0)
    # 2**-shared_exp is a normal fp32 (biased exponent 254 - scale_byte in [2, 254]): exact scaling.
    inv_scale = ((254 - tl.minimum(scale_byte, 252)) << 23).to(tl.float32, bitcast=True)
    return non_finite, tl.where(non_finite, 0xFF, scale_byte), inv_scale


@triton.jit
def _load_bf16_pairs(x_ptr, row, x_row_stride, pair_cols, group_ok):
    """A [groups, pairs] tile of bf16 element pairs (4-byte aligned rows) read as int32: the words,
    the fp32 values of the even and the odd elements (widening bf16 is a shift / a mask) and each
    block's |max| bits. The pair's two codes then make the output byte in place, with no
    ``tl.split`` (which went through shared memory)."""
    words = _load_pair_words(x_ptr, row, x_row_stride, pair_cols, group_ok)
    low = words << 16  # element 2i's fp32 bits
    high = words & -65536  # element 2i + 1's
    amax_bits = tl.max(tl.maximum(low & 0x7FFFFFFF, high & 0x7FFFFFFF), axis=1)
    return words, low.to(tl.float32, bitcast=True), high.to(tl.float32, bitcast=True), amax_bits


@triton.jit
def _pair_bytes(words, low, high, scale, E2M1: tl.constexpr):
    """Output bytes (the low 8 bits of an int32) of bf16 pairs ``words``: the codes of ``low * scale``
    (even element, low nibble) and ``high * scale``. ``scale`` is exact to multiply by (a power of
    two, or 1.0 when the caller rounded the products itself), so "lines" folds it into its FMAs."""
    if E2M1 == "lines":
        codes = _e2m1_lines(tl.abs(low), scale) | (_e2m1_lines(tl.abs(high), scale) << 4)  # bits 0-2, 4-6
        nonzero = codes + 0x77  # bit 3 (7) set iff the low (high) code is not 0: no negative zero
        signs = ((words >> 12) & 0x08) | ((words >> 24) & 0x80)  # the elements' sign bits 15, 31 at 3, 7
        return codes | (nonzero & signs)
    else:
        return _e2m1_codes(low * scale, E2M1) | (_e2m1_codes(high * scale, E2M1) << 4)


@triton.jit
def _mxfp4_quantize_bf16x2(x_ptr, packed_ptr, scales_ptr, row, group, group_ok,
                           x_row_stride, packed_row_stride, scales_row_stride):
    """mxfp4_quantize_kernel for bf16 with the FMA lines in bf16 (``E2M1="bf16_lines"``; not "bf16",
    which Triton's preload would read back as a dtype): each int32 word is a pair of elements, and
    the FMAs on the low (high) halves of two words pair into one HFMA2.BF16. Same codes and scales."""
    pair_cols = group[:, None] * 16 + tl.arange(0, 16)[None, :]
    words = _load_pair_words(x_ptr, row, x_row_stride, pair_cols, group_ok)
    magnitudes = words & 0x7FFF7FFF  # both elements' |.| in one instruction
    low_bits = magnitudes.to(tl.int16)  # element 2i
    high_bits = (magnitudes >> 16).to(tl.int16)  # element 2i + 1
    # |max| as the integer max of the magnitudes' bits: exact, and NaN (above inf's bits) is kept
    amax_exp = tl.maximum(tl.max(low_bits, axis=1), tl.max(high_bits, axis=1)).to(tl.int32) >> 7  # 255: inf / NaN
    low, high = low_bits.to(tl.bfloat16, bitcast=True), high_bits.to(tl.bfloat16, bitcast=True)
    non_finite, scale_byte, inv_scale = _e8m0_scale(amax_exp)
    cap = tl.where(non_finite, 0x4280, 0x4287).to(tl.int16)[:, None]  # bf16 64 / 67.5: non-finite: codes 0
    # the byte in 16-bit lanes, as the FMAs left them: two words' bytes per instruction
    codes = ((_e2m1_lines_bf16(low, inv_scale[:, None], cap) & 7)
             | ((_e2m1_lines_bf16(high, inv_scale[:, None], cap) & 7) << 4))
    nonzero = codes + 0x77  # bit 3 (7) set iff the low (high) code is not 0: no negative zero
    signs = ((words.to(tl.int16) >> 12) & 0x08) | (((words >> 16).to(tl.int16) >> 8) & 0x80)  # bits 15, 31 at 3, 7
    packed = codes | (nonzero & signs)
    tl.store(packed_ptr + row * packed_row_stride + pair_cols, packed.to(tl.uint8), mask=group_ok[:, None])
    tl.store(scales_ptr + row * scales_row_stride + group, scale_byte.to(tl.uint8), mask=group_ok)


@triton.jit
def _mxfp4_quantize_bf16_pairs(x_ptr, packed_ptr, scales_ptr, row, group, group_ok,
                               x_row_stride, packed_row_stride, scales_row_stride, E2M1: tl.constexpr):
    """mxfp4_quantize_kernel for bf16 read as element pairs (``_load_bf16_pairs``). Same codes and scales."""
    pair_cols = group[:, None] * 16 + tl.arange(0, 16)[None, :]
    words, low, high, amax_bits = _load_bf16_pairs(x_ptr, row, x_row_stride, pair_cols, group_ok)
    non_finite, scale_byte, inv_scale = _e8m0_scale(amax_bits >> 23)
    packed = tl.where(non_finite[:, None], 0, _pair_bytes(words, low, high, inv_scale[:, None], E2M1))
    tl.store(packed_ptr + row * packed_row_stride + pair_cols, packed.to(tl.uint8), mask=group_ok[:, None])
    tl.store(scales_ptr + row * scales_row_stride + group, scale_byte.to(tl.uint8), mask=group_ok)


@triton.jit
def mxfp4_quantize_kernel(
    x_ptr, packed_ptr, scales_ptr,
    x_row_stride, packed_row_stride, scales_row_stride,
    n_groups,
    GROUPS: tl.constexpr,
    E2M1: tl.constexpr,
    BF16_PAIRS: tl.constexpr = False,
):
    # Program (row, chunk) quantizes GROUPS blocks of 32 of one row, loaded as a [GROUPS, 32] tile
    # (contiguous rows: wide loads). E2M1 names the rounding (``_e2m1_codes``), or "bf16_lines": the
    # FMA lines in bf16, which need the pairs read (``_mxfp4_quantize_bf16x2``).
    row = tl.program_id(0).to(tl.int64)
    group = tl.program_id(1) * GROUPS + tl.arange(0, GROUPS)
    group_ok = group < n_groups
    tl.static_assert(E2M1 != "bf16_lines" or BF16_PAIRS, "E2M1='bf16_lines' computes on bf16 pairs")
    if BF16_PAIRS and E2M1 == "bf16_lines":
        _mxfp4_quantize_bf16x2(x_ptr, packed_ptr, scales_ptr, row, group, group_ok,
                               x_row_stride, packed_row_stride, scales_row_stride)
        return
    if BF16_PAIRS:
        _mxfp4_quantize_bf16_pairs(x_ptr, packed_ptr, scales_ptr, row, group, group_ok,
                                   x_row_stride, packed_row_stride, scales_row_stride, E2M1)
        return
    cols = group[:, None] * 32 + tl.arange(0, 32)[None, :]
    x = _to_fp32(tl.load(x_ptr + row * x_row_stride + cols, mask=group_ok[:, None], other=0.0))

    # amax as the integer max of |x|'s bits: exact, and NaN (bits above inf's) cannot be dropped.
    amax_bits = tl.max(x.to(tl.int32, bitcast=True) & 0x7FFFFFFF, axis=1)
    # biased exponent: floor(log2(amax)) + 127 for normal amax; 255 for inf / NaN
    non_finite, scale_byte, inv_scale = _e8m0_scale(amax_bits >> 23)
    codes = _e2m1_codes(x * inv_scale[:, None], E2M1)
    codes = tl.where(non_finite[:, None], 0, codes)

    packed_cols = group[:, None] * 16 + tl.arange(0, 16)[None, :]
    tl.store(packed_ptr + row * packed_row_stride + packed_cols, _pack_pairs(codes, GROUPS, 32), mask=group_ok[:, None])
    tl.store(scales_ptr + row * scales_row_stride + group, scale_byte.to(tl.uint8), mask=group_ok)


@triton.jit
def mxfp4_dequantize_kernel(
    packed_ptr, scales_ptr, out_ptr,
    packed_row_stride, scales_row_stride, out_row_stride,
    n_groups,
    GROUPS: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    group = tl.program_id(1) * GROUPS + tl.arange(0, GROUPS)
    pair = tl.arange(0, 16)
    group_ok = group < n_groups
    packed = tl.load(packed_ptr + row * packed_row_stride + group[:, None] * 16 + pair[None, :],
                     mask=group_ok[:, None], other=0).to(tl.int32)
    scale_byte = tl.load(scales_ptr + row * scales_row_stride + group, mask=group_ok, other=0).to(tl.int32)
    # 2**(byte - 127) from its bits: byte 0 is the fp32 subnormal 2**-127, 0xFF is NaN.
    scale_bits = tl.where(scale_byte == 0, 0x400000, scale_byte << 23)
    scale_bits = tl.where(scale_byte == 0xFF, 0x7FC00000, scale_bits)
    scale = scale_bits.to(tl.float32, bitcast=True)[:, None]
    # An E2M1 value times a power of two is exact in fp32 (and in bf16 / fp16 unless out of range).
    values = _interleave(_e2m1_decode(packed & 0xF), _e2m1_decode(packed >> 4), GROUPS, 32) * scale
    cols = group[:, None] * 32 + tl.arange(0, 32)[None, :]
    tl.store(out_ptr + row * out_row_stride + cols, _narrow_exact(values, out_ptr.dtype.element_ty),
             mask=group_ok[:, None])


# --------------------------------------------------------------------------- NVFP4

@triton.jit
def nvfp4_quantize_kernel(
    x_ptr, global_scale_ptr, packed_ptr, scales_ptr,
    x_row_stride, packed_row_stride, scales_row_stride,
    n_groups,
    GROUPS: tl.constexpr,
    E2M1: tl.constexpr,
    BF16_PAIRS: tl.constexpr = False,
):
    # Same tiling as mxfp4_quantize_kernel, with blocks of 16; BF16_PAIRS as there (pairs read as int32).
    tl.static_assert(E2M1 != "bf16_lines", "NVFP4 rounds products in fp32: bf16_lines would round them twice")
    row = tl.program_id(0).to(tl.int64)
    group = tl.program_id(1) * GROUPS + tl.arange(0, GROUPS)
    group_ok = group < n_groups
    pair_cols = group[:, None] * 8 + tl.arange(0, 8)[None, :]
    if BF16_PAIRS:
        words, low, high, amax_bits = _load_bf16_pairs(x_ptr, row, x_row_stride, pair_cols, group_ok)
    else:
        cols = group[:, None] * 16 + tl.arange(0, 16)[None, :]
        x = _to_fp32(tl.load(x_ptr + row * x_row_stride + cols, mask=group_ok[:, None], other=0.0))
        amax_bits = tl.max(x.to(tl.int32, bitcast=True) & 0x7FFFFFFF, axis=1)
    global_scale = tl.load(global_scale_ptr)

    has_nan = amax_bits > 0x7F800000
    amax = amax_bits.to(tl.float32, bitcast=True)
    one_sixth = tl.full((), _FP32_ONE_SIXTH_BITS, tl.int32).to(tl.float32, bitcast=True)
    block_scale = global_scale * (amax * one_sixth)
    # E4M3FN: 3 mantissa bits, smallest normal exponent -6, saturating at 0x7E = 448 (as vLLM clamps).
    if E2M1 != "integer":
        scale_code = _minifloat_code_fast(block_scale, MANTISSA_BITS=3, MIN_EXP=-6, MAX_VALUE=448.0, SIGN_SHIFT=7)
    else:
        scale_code = _minifloat_code(block_scale, MANTISSA_BITS=3, MIN_EXP=-6, MAX_CODE=0x7E, SIGN_SHIFT=7)
    scale_is_nan = has_nan | (block_scale != block_scale)
    scale_code = tl.where(scale_is_nan, 0x7F, scale_code)
    out_scale = _reciprocal_or_zero(_e4m3_decode(scale_code) * _reciprocal_or_zero(global_scale))
    if BF16_PAIRS:
        # the products rounded to fp32 first, as vLLM rounds them: scale 1.0 into _pair_bytes
        packed = _pair_bytes(words, low * out_scale[:, None], high * out_scale[:, None], 1.0, E2M1)
        packed = tl.where(scale_is_nan[:, None], 0, packed).to(tl.uint8)
    else:
        codes = _e2m1_codes(x * out_scale[:, None], E2M1)
        codes = tl.where(scale_is_nan[:, None], 0, codes)
        packed = _pack_pairs(codes, GROUPS, 16)
    tl.store(packed_ptr + row * packed_row_stride + pair_cols, packed, mask=group_ok[:, None])
    tl.store(scales_ptr + row * scales_row_stride + group, scale_code.to(tl.uint8), mask=group_ok)


@triton.jit
def nvfp4_dequantize_kernel(
    packed_ptr, scales_ptr, global_scale_ptr, out_ptr,
    packed_row_stride, scales_row_stride, out_row_stride,
    n_groups,
    GROUPS: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    group = tl.program_id(1) * GROUPS + tl.arange(0, GROUPS)
    pair = tl.arange(0, 8)
    group_ok = group < n_groups
    packed = tl.load(packed_ptr + row * packed_row_stride + group[:, None] * 8 + pair[None, :],
                     mask=group_ok[:, None], other=0).to(tl.int32)
    scale_code = tl.load(scales_ptr + row * scales_row_stride + group, mask=group_ok, other=0).to(tl.int32)
    global_scale = tl.load(global_scale_ptr)
    block_scale = tl.math.div_rn(_e4m3_decode(scale_code), tl.broadcast_to(global_scale, (GROUPS,)))
    values = _interleave(_e2m1_decode(packed & 0xF), _e2m1_decode(packed >> 4), GROUPS, 16) * block_scale[:, None]
    cols = group[:, None] * 16 + tl.arange(0, 16)[None, :]
    tl.store(out_ptr + row * out_row_stride + cols, values.to(out_ptr.dtype.element_ty), mask=group_ok[:, None])


# --------------------------------------------------------------------------- references

# Round-to-nearest-even between adjacent E2M1 magnitudes, as decision points: (midpoint, whether the
# midpoint itself rounds up). A tie goes to the even code: 0.25 to 0 (code 0), 0.75 to 1.0 (code 2), ...
_E2M1_MIDPOINTS = ((0.25, False), (0.75, True), (1.25, False), (1.75, True), (2.5, False), (3.5, True), (5.0, False))


def _e2m1_codes_reference(scaled: torch.Tensor) -> torch.Tensor:
    """Signed E2M1 codes of ``scaled``: the code of a magnitude is the number of rounding midpoints it
    passes (ties to the even code), which saturates at 6 by itself; sign bit only on a nonzero code.
    float64 holds an fp32 value exactly, so ties are seen as ties."""
    magnitude = scaled.double().abs()
    code = torch.zeros(scaled.shape, dtype=torch.int64, device=scaled.device)
    for midpoint, tie_rounds_up in _E2M1_MIDPOINTS:
        code += (magnitude >= midpoint if tie_rounds_up else magnitude > midpoint).long()
    negative = torch.signbit(scaled) & (code != 0)
    return code | (negative.long() << 3)


def _pack_reference(codes: torch.Tensor) -> torch.Tensor:
    codes = codes.to(torch.uint8)
    return codes[..., 0::2] | (codes[..., 1::2] << 4)


def _unpack_reference(packed: torch.Tensor) -> torch.Tensor:
    """[..., K/2] bytes -> [..., K] float64 E2M1 values (code 0x8 -> -0.0)."""
    codes = torch.stack([packed & 0xF, packed >> 4], dim=-1).flatten(-2).long()
    values = torch.tensor(E2M1_VALUES, dtype=torch.float64, device=packed.device)[codes & 7]
    return torch.where(codes >= 8, -values, values)


def _exact_pow2(exponent: torch.Tensor) -> torch.Tensor:
    """float64 2**exponent (|exponent| < 1023) built from its bits: ``torch.pow(2.0, e)`` on CUDA is
    not always an exact power of two, which moves values off E2M1 ties."""
    return ((exponent.long() + 1023) << 52).view(torch.float64)


def mxfp4_quantize_reference(x: torch.Tensor):
    """Per the OCP MX v1.0 spec, block by block; see the module docstring for NaN / inf / zero."""
    blocks = x.float().reshape(*x.shape[:-1], -1, MXFP4_BLOCK)
    amax = blocks.abs().amax(dim=-1)
    _, frexp_exp = torch.frexp(amax)  # amax = m * 2**e with m in [0.5, 1): floor(log2(amax)) = e - 1
    shared_exp = (frexp_exp.long() - 1 - 2).clamp(-127, 127)
    shared_exp = torch.where(amax == 0, -127, shared_exp)
    non_finite = ~torch.isfinite(amax)
    scaled = blocks.double() * _exact_pow2(-shared_exp).unsqueeze(-1)  # exact in float64
    codes = _e2m1_codes_reference(scaled)
    codes = torch.where(non_finite.unsqueeze(-1), 0, codes)
    scales = torch.where(non_finite, E8M0_NAN, shared_exp + 127).to(torch.uint8)
    return _pack_reference(codes.flatten(-2)), scales


def mxfp4_dequantize_reference(packed: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype):
    values = _unpack_reference(packed).unflatten(-1, (-1, MXFP4_BLOCK))
    scale = torch.where(scales == E8M0_NAN, float("nan"), _exact_pow2(scales.long() - 127))
    return (values * scale.unsqueeze(-1)).flatten(-2).to(dtype)


def nvfp4_quantize_reference(x: torch.Tensor, global_scale: torch.Tensor):
    """vLLM's ``ref_nvfp4_quant``, op by op in fp32, with exact RNE E2M1 codes and defined NaN blocks."""
    global_scale = global_scale.float().reshape(())
    blocks = x.float().reshape(*x.shape[:-1], -1, NVFP4_BLOCK)
    amax = blocks.abs().amax(dim=-1)

    def reciprocal(y):
        return torch.where(y == 0, torch.zeros_like(y), 1.0 / y)

    block_scale = global_scale * (amax * torch.tensor(1 / 6, dtype=torch.float32, device=amax.device))
    scale_is_nan = torch.isnan(amax) | torch.isnan(block_scale)
    scale_fp8 = block_scale.clamp(max=E4M3_MAX).to(torch.float8_e4m3fn)
    scale_bytes = torch.where(scale_is_nan, E4M3_NAN, scale_fp8.view(torch.uint8).int()).to(torch.uint8)
    out_scale = reciprocal(scale_fp8.float() * reciprocal(global_scale))
    codes = _e2m1_codes_reference(blocks * out_scale.unsqueeze(-1))
    codes = torch.where(scale_is_nan.unsqueeze(-1), 0, codes)
    return _pack_reference(codes.flatten(-2)), scale_bytes.view(torch.float8_e4m3fn)


def nvfp4_dequantize_reference(packed: torch.Tensor, scales: torch.Tensor, global_scale: torch.Tensor,
                               dtype: torch.dtype):
    values = _unpack_reference(packed).float().unflatten(-1, (-1, NVFP4_BLOCK))
    block_scale = scales.view(torch.float8_e4m3fn).float() / global_scale.float().reshape(())
    return (values * block_scale.unsqueeze(-1)).flatten(-2).to(dtype)
