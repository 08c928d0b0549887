"""Fused MoE expert GEMM device code, and its PyTorch reference.

Input is ``moe_align_block_size``'s layout: ``sorted_token_ids`` groups the flat (token, k) slots by
expert in blocks of ``BLOCK_M`` slots, each block one expert (``expert_ids``, -1 past
``num_tokens_post_padded``), padding slots hold the sentinel ``numel``. One program computes a
``BLOCK_M x BLOCK_N`` tile of one block: it gathers its rows of ``A`` (``slot // TOP_K``: the token's
hidden state for the first GEMM, the slot's own row for the second), multiplies by the block's
expert weight (``[E, N_total, K]``, nn.Linear layout) and writes the slot's output row.

- ``GATED``: the first GEMM of a SwiGLU expert. The weight holds ``gate`` rows ``[0, N)`` then ``up``
  rows ``[N, 2N)``; both accumulate side by side and the tile stores ``silu(gate) * up`` (fp32 math,
  torch's formula), so the ``2N``-wide intermediate never reaches memory.
- ``MUL_ROUTED_WEIGHT``: the second GEMM scales each slot's row by its routing weight (fp32).
- ``MXFP4_B``: the weight is OCP MXFP4 as ``mxfp4_quantize`` packs it along K (``[E, N_total, K/2]``
  bytes, low nibble first, ``[E, N_total, K/32]`` E8M0 scales).
- NVFP4 weights (``fused_moe_nvfp4_kernel``): ``nvfp4_quantize``'s packing along K (``[E, N_total, K/2]``
  bytes, ``[E, N_total, K/16]`` FP8 E4M3 scales) and one fp32 global scale per expert. The tile is
  ``e2m1 * e4m3`` (exact in bf16) times 2**-8, and the GEMM's fp32 result is multiplied by
  ``256 / global`` once: NVFP4's value ``e2m1 * e4m3 / global`` with one rounding fewer than
  dequantizing to the activation's dtype first.

FP4 tiles are decoded in registers, four bytes at a time (``_fp4_planes``): from an int32 word of
eight E2M1 nibbles, two shifts and two masks give the bf16 bit patterns of two elements at once
(nibbles ``p`` and ``p + 4`` in the word's halves). With E2M1's two exponent bits placed in bf16's two
lowest exponent bits, every code -- zero and the subnormal 0.5 included -- becomes exactly
``E2M1 * 2**-126``, so one bf16 multiply by ``scale * 2**126`` per pair finishes the element; an E8M0
scale is a bf16 exponent, built from its byte with integer adds. The K order this gives (within each
8 elements: ``0, 4, 1, 5, 2, 6, 3, 7``) is the order the tile's activation columns are read in
(``_fp4_k_order``); a dot product does not depend on the order of K.

Accumulation is fp32; each tile rounds once, when stored. Padding slots and dropped slots (expert
ids outside ``[0, E)``) are never written.
"""

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from .fp4 import _e4m3_decode, mxfp4_dequantize_reference, nvfp4_dequantize_reference

_SIGNS = tl.constexpr(-2147450880)  # 0x80008000: the sign bit of each bf16 half
_MAGNITUDES = tl.constexpr(0x01C001C0)  # bits 6..8 of each half: E2M1's exponent (2 bits) and mantissa
_TWO_POW_126 = tl.constexpr(8.507059173023462e37)


@triton.jit
def _e8m0_decode(code):
    """fp32 ``2**(code - 127)`` from the bits (exact, no exp2): 0 is 2**-127 (an fp32 subnormal), 0xFF NaN."""
    bits = tl.where(code == 0, 0x00400000, code << 23)
    return tl.where(code == 255, float("nan"), bits.to(tl.float32, bitcast=True))


@triton.jit
def _bf16_from_bits(bits):
    return bits.to(tl.int16).to(tl.bfloat16, bitcast=True)


@triton.jit
def _fp4_planes(words):
    """Four int32 "planes" of int32 words of packed E2M1 (element i of a word in bits 4i..4i+3):
    plane p holds elements p (low half) and p + 4 (high half) as bf16 bit patterns worth
    ``E2M1 * 2**-126``: sign at bit 15, the three magnitude bits at 6..8. Two shifts and two masks
    per plane, both halves at once; an arithmetic right shift only brings in bits the mask drops."""
    p0 = ((words << 12) & _SIGNS) | ((words << 6) & _MAGNITUDES)
    p1 = ((words << 8) & _SIGNS) | ((words << 2) & _MAGNITUDES)
    p2 = ((words << 4) & _SIGNS) | ((words >> 2) & _MAGNITUDES)
    p3 = (words & _SIGNS) | ((words >> 6) & _MAGNITUDES)
    return p0, p1, p2, p3


@triton.jit
def _fp4_plane_values(plane, scale, scale2, value_scale, dtype: tl.constexpr, BF16_BITS: tl.constexpr,
                      TWO_SCALES: tl.constexpr):
    """A plane's ``[rows, words, 2]`` weights in ``dtype`` (the pair of each word last).

    ``BF16_BITS`` (NVIDIA): each half IS a bf16 (a subnormal for code 0.5), times the bf16 ``scale``
    (and ``scale2`` with ``TWO_SCALES``), which already hold the 2**126: the two elements of a word
    share a scale, so each pair is one packed multiply. Otherwise (Triton's interpreter, which flushes
    bf16 subnormals, and AMD): the halves as fp32 bit patterns, times 2**126 and the fp32
    ``value_scale``; the same exact values."""
    if BF16_BITS:
        pairs = tl.join(plane.to(tl.int16), (plane >> 16).to(tl.int16)).to(tl.bfloat16, bitcast=True)
        pairs = pairs * scale[:, :, None]
        if TWO_SCALES:
            pairs = pairs * scale2[:, :, None]
        return pairs.to(dtype)
    else:
        pairs = tl.join(plane << 16, plane & -65536).to(tl.float32, bitcast=True)
        return (pairs * _TWO_POW_126 * value_scale[:, :, None]).to(dtype)


@triton.jit
def _fp4_k_order(a, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr):
    """The activation tile's columns in the K order of ``_fp4_tile``: within each 8, 0 4 1 5 2 6 3 7."""
    a = tl.reshape(a, (BLOCK_M, BLOCK_K // 8, 2, 2, 2))  # k = 8q + 4h + 2p1 + p0
    return tl.reshape(tl.permute(a, (0, 1, 3, 4, 2)), (BLOCK_M, BLOCK_K))  # -> 8q + 4p1 + 2p0 + h


@triton.jit
def _fp4_tile(word_rows_ptr, scale_rows_ptr, n_ok, k_start, K, dtype: tl.constexpr, NVFP4_B: tl.constexpr,
              BF16_BITS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """The ``[BLOCK_N, BLOCK_K]`` weight tile of an MXFP4 or NVFP4 weight (rows of N, K in
    ``_fp4_k_order``) in ``dtype``. ``word_rows_ptr``: each row's packed bytes as int32 words
    (``[BLOCK_N, 1]``); ``scale_rows_ptr``: its scale row. NVFP4 comes out times 2**-8 (see the module
    docstring). Rows past N and words past K load as zeros."""
    words_k = k_start // 8 + tl.arange(0, BLOCK_K // 8)
    words = tl.load(word_rows_ptr + words_k[None, :], mask=n_ok[:, None] & (words_k < K // 8)[None, :], other=0)
    GROUP: tl.constexpr = 16 if NVFP4_B else 32
    groups = k_start // GROUP + tl.arange(0, BLOCK_K // GROUP)
    codes = tl.load(scale_rows_ptr + groups[None, :], mask=n_ok[:, None] & (groups < K // GROUP)[None, :],
                    other=0).to(tl.int32)
    if NVFP4_B:
        # e4m3's bits in bf16's exponent and mantissa are worth e4m3 * 2**-120 (subnormals align too):
        # times 2**238 is e4m3 * 2**126 * 2**-8, which fits bf16 (448 * 2**118 < 2**127).
        e4m3_bits = ((codes & 0x80) << 8) | ((codes & 0x7F) << 4)
        scale = _bf16_from_bits(e4m3_bits) * _bf16_from_bits(tl.full((), 246 << 7, tl.int32))
        scale = scale * _bf16_from_bits(tl.full((), 246 << 7, tl.int32))
        scale = tl.where((codes & 0x7F) == 0x7F, float("nan"), scale).to(tl.bfloat16)
        scale2 = scale
        value_scale = _e4m3_decode(codes) * 0.00390625
    else:
        # 2**(e - 127) * 2**126 = 2**(e - 1), a bf16 up to e = 128; above, the rest in a second factor.
        scale = _bf16_from_bits((tl.minimum(codes, 128) + 126) << 7)
        scale2 = _bf16_from_bits(tl.where(codes == 255, 0x7FC0, (tl.maximum(codes, 128) - 1) << 7))
        value_scale = _e8m0_decode(codes)
    PER: tl.constexpr = GROUP // 8  # words per scale group
    scale = tl.reshape(tl.broadcast_to(scale[:, :, None], (BLOCK_N, BLOCK_K // GROUP, PER)), (BLOCK_N, BLOCK_K // 8))
    scale2 = tl.reshape(tl.broadcast_to(scale2[:, :, None], (BLOCK_N, BLOCK_K // GROUP, PER)), (BLOCK_N, BLOCK_K // 8))
    value_scale = tl.reshape(tl.broadcast_to(value_scale[:, :, None], (BLOCK_N, BLOCK_K // GROUP, PER)),
                             (BLOCK_N, BLOCK_K // 8))
    p0, p1, p2, p3 = _fp4_planes(words)
    two = not NVFP4_B
    v0 = _fp4_plane_values(p0, scale, scale2, value_scale, dtype, BF16_BITS, two)
    v1 = _fp4_plane_values(p1, scale, scale2, value_scale, dtype, BF16_BITS, two)
    v2 = _fp4_plane_values(p2, scale, scale2, value_scale, dtype, BF16_BITS, two)
    v3 = _fp4_plane_values(p3, scale, scale2, value_scale, dtype, BF16_BITS, two)
    tile = tl.join(tl.join(v0, v1), tl.join(v2, v3))  # [BLOCK_N, BLOCK_K / 8, h, p0, p1]
    return tl.reshape(tl.permute(tile, (0, 1, 4, 3, 2)), (BLOCK_N, BLOCK_K))  # k = 8q + 4p1 + 2p0 + h


@triton.jit
def _dot(a, b, acc, SWAP: tl.constexpr):
    """``acc + a @ b.T`` ([M, N]), or with ``SWAP`` its transpose ``acc + b @ a.T`` ([N, M])."""
    if SWAP:
        return tl.dot(b, tl.trans(a), acc, input_precision="ieee")
    else:
        return tl.dot(a, tl.trans(b), acc, input_precision="ieee")


@triton.jit
def _fused_moe_tile(
    a_ptr, b_ptr, b_scale_ptr, b_global_scale_ptr, c_ptr, topk_weights_ptr, sorted_token_ids_ptr, expert_ids_ptr,
    num_tokens_post_padded_ptr, num_valid_slots, num_m_blocks, N, K, a_row_stride, b_expert_stride, b_row_stride,
    b_scale_expert_stride, b_scale_row_stride, c_row_stride,
    TOP_K: tl.constexpr, GATED: tl.constexpr, MUL_ROUTED_WEIGHT: tl.constexpr, MXFP4_B: tl.constexpr,
    NVFP4_B: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr, SWAP: tl.constexpr, BF16_BITS: tl.constexpr,
):
    """One program's tile, shared by the dense/MXFP4 kernel and the NVFP4 kernel. ``SWAP`` computes
    the transposed tile (weights times activations: the weight tile is the MMA's first operand, so a
    16-token block still fills Hopper's 64-row warpgroup MMA); ``BF16_BITS``: see ``_fp4_plane_values``."""
    # Grouped order: GROUP_M row blocks share each column block of the weight while it is in L2.
    pid = tl.program_id(0)
    num_n_blocks = tl.cdiv(N, BLOCK_N)
    per_group = GROUP_M * num_n_blocks
    first_m = (pid // per_group) * GROUP_M
    group_rows = tl.minimum(num_m_blocks - first_m, GROUP_M)
    pid_m = first_m + (pid % per_group) % group_rows
    pid_n = (pid % per_group) // group_rows
    # a block past the experts' padded segments has nothing to compute
    if pid_m * BLOCK_M < tl.load(num_tokens_post_padded_ptr):
        expert = tl.load(expert_ids_ptr + pid_m).to(tl.int64)
        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        slots = tl.load(sorted_token_ids_ptr + offs_m)
        slot_ok = slots < num_valid_slots
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        n_ok = offs_n < N
        offs_k = tl.arange(0, BLOCK_K)
        a_rows = a_ptr + (slots // TOP_K).to(tl.int64)[:, None] * a_row_stride
        acc = tl.zeros((BLOCK_N, BLOCK_M) if SWAP else (BLOCK_M, BLOCK_N), dtype=tl.float32)
        acc_up = tl.zeros((BLOCK_N, BLOCK_M) if SWAP else (BLOCK_M, BLOCK_N), dtype=tl.float32)
        if MXFP4_B or NVFP4_B:
            # packed rows read as int32 words (K / 8 per row: the launcher checks the alignment)
            words = b_ptr.to(tl.pointer_type(tl.int32)) + expert * (b_expert_stride // 4)
            w_rows = words + offs_n.to(tl.int64)[:, None] * (b_row_stride // 4)
            s_rows = b_scale_ptr + expert * b_scale_expert_stride + offs_n.to(tl.int64)[:, None] * b_scale_row_stride
            for k_start in range(0, K, BLOCK_K):
                k = k_start + offs_k
                a = tl.load(a_rows + k[None, :], mask=slot_ok[:, None] & (k < K)[None, :], other=0.0)
                a = _fp4_k_order(a, BLOCK_M, BLOCK_K)
                b = _fp4_tile(w_rows, s_rows, n_ok, k_start, K, a.dtype, NVFP4_B, BF16_BITS, BLOCK_N, BLOCK_K)
                acc = _dot(a, b, acc, SWAP)
                if GATED:
                    b_up = _fp4_tile(w_rows + N * (b_row_stride // 4), s_rows + N * b_scale_row_stride, n_ok, k_start,
                                     K, a.dtype, NVFP4_B, BF16_BITS, BLOCK_N, BLOCK_K)
                    acc_up = _dot(a, b_up, acc_up, SWAP)
        else:
            b_cols = b_ptr + expert * b_expert_stride + offs_n.to(tl.int64)[None, :] * b_row_stride
            for k_start in range(0, K, BLOCK_K):
                k = k_start + offs_k
                k_ok = k < K
                a = tl.load(a_rows + k[None, :], mask=slot_ok[:, None] & k_ok[None, :], other=0.0)
                b = tl.load(b_cols + k[:, None], mask=k_ok[:, None] & n_ok[None, :], other=0.0)
                acc = tl.dot(a, b, acc, input_precision="ieee")
                if GATED:
                    b_up = tl.load(b_cols + N * b_row_stride + k[:, None], mask=k_ok[:, None] & n_ok[None, :],
                                   other=0.0)
                    acc_up = tl.dot(a, b_up, acc_up, input_precision="ieee")
        if SWAP:
            acc = tl.trans(acc)
            acc_up = tl.trans(acc_up)
        if NVFP4_B:  # the tiles were e2m1 * e4m3 * 2**-8: the expert's global scale, once
            rescale = tl.math.div_rn(256.0, tl.load(b_global_scale_ptr + expert))
            acc = acc * rescale
            acc_up = acc_up * rescale

        out = acc
        if GATED:
            out = acc / (1.0 + tl.exp(-acc)) * acc_up  # silu(gate) * up, torch's silu formula
        if MUL_ROUTED_WEIGHT:
            weight = tl.load(topk_weights_ptr + slots, mask=slot_ok, other=0.0).to(tl.float32)
            out = out * weight[:, None]
        c = c_ptr + slots.to(tl.int64)[:, None] * c_row_stride + offs_n[None, :]
        tl.store(c, out.to(c_ptr.dtype.element_ty), mask=slot_ok[:, None] & n_ok[None, :])


@triton.jit(do_not_specialize=["num_valid_slots", "num_m_blocks"])
def fused_moe_kernel(
    a_ptr, b_ptr, b_scale_ptr, c_ptr, topk_weights_ptr, sorted_token_ids_ptr, expert_ids_ptr,
    num_tokens_post_padded_ptr, num_valid_slots, num_m_blocks, N, K, a_row_stride, b_expert_stride, b_row_stride,
    b_scale_expert_stride, b_scale_row_stride, c_row_stride,
    TOP_K: tl.constexpr, GATED: tl.constexpr, MUL_ROUTED_WEIGHT: tl.constexpr, MXFP4_B: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    SWAP: tl.constexpr = False, BF16_BITS: tl.constexpr = False,
):
    """Dense (bf16/fp16/fp32) or MXFP4 weights."""
    _fused_moe_tile(a_ptr, b_ptr, b_scale_ptr, b_scale_ptr, c_ptr, topk_weights_ptr, sorted_token_ids_ptr,
                    expert_ids_ptr, num_tokens_post_padded_ptr, num_valid_slots, num_m_blocks, N, K, a_row_stride,
                    b_expert_stride, b_row_stride, b_scale_expert_stride, b_scale_row_stride, c_row_stride,
                    TOP_K, GATED, MUL_ROUTED_WEIGHT, MXFP4_B, False, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, SWAP,
                    BF16_BITS)


@triton.jit(do_not_specialize=["num_valid_slots", "num_m_blocks"])
def fused_moe_nvfp4_kernel(
    a_ptr, b_ptr, b_scale_ptr, b_global_scale_ptr, c_ptr, topk_weights_ptr, sorted_token_ids_ptr, expert_ids_ptr,
    num_tokens_post_padded_ptr, num_valid_slots, num_m_blocks, N, K, a_row_stride, b_expert_stride, b_row_stride,
    b_scale_expert_stride, b_scale_row_stride, c_row_stride,
    TOP_K: tl.constexpr, GATED: tl.constexpr, MUL_ROUTED_WEIGHT: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    SWAP: tl.constexpr = False, BF16_BITS: tl.constexpr = False,
):
    """NVFP4 weights: its own kernel (one more pointer, the per-expert global scales), so the dense and
    MXFP4 variants keep their signature and keys."""
    _fused_moe_tile(a_ptr, b_ptr, b_scale_ptr, b_global_scale_ptr, c_ptr, topk_weights_ptr, sorted_token_ids_ptr,
                    expert_ids_ptr, num_tokens_post_padded_ptr, num_valid_slots, num_m_blocks, N, K, a_row_stride,
                    b_expert_stride, b_row_stride, b_scale_expert_stride, b_scale_row_stride, c_row_stride,
                    TOP_K, GATED, MUL_ROUTED_WEIGHT, False, True, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, SWAP,
                    BF16_BITS)


def fused_moe_reference(hidden: torch.Tensor, w_gate_up: torch.Tensor, w_down: torch.Tensor,
                        topk_weights: torch.Tensor, topk_ids: torch.Tensor, gate_up_scales=None,
                        down_scales=None) -> torch.Tensor:
    """One expert at a time, rounding where the kernels round: ``silu(gate) * up`` in fp32, stored in
    ``hidden``'s dtype; the down projection times the routing weight in fp32, summed over the top-k
    slots of each token in fp32, returned in ``hidden``'s dtype. Ids outside ``[0, E)`` add nothing.
    ``gate_up_scales`` / ``down_scales`` ([E] fp32): each expert's GEMM result times its own."""
    num_tokens, hidden_size = hidden.shape
    top_k = topk_ids.shape[1]
    intermediate = w_down.shape[2]
    flat_ids = topk_ids.reshape(-1)
    flat_weights = topk_weights.reshape(-1).float()
    per_slot = torch.zeros(num_tokens * top_k, hidden_size, dtype=torch.float32, device=hidden.device)
    for expert in range(w_gate_up.shape[0]):
        slots = torch.nonzero(flat_ids == expert).flatten()
        if slots.numel() == 0:
            continue
        gate_up = hidden[slots // top_k].float() @ w_gate_up[expert].float().T
        if gate_up_scales is not None:
            gate_up = gate_up * gate_up_scales[expert].float()
        act = (F.silu(gate_up[:, :intermediate]) * gate_up[:, intermediate:]).to(hidden.dtype)
        down = act.float() @ w_down[expert].float().T
        if down_scales is not None:
            down = down * down_scales[expert].float()
        per_slot[slots] = down * flat_weights[slots, None]
    return per_slot.view(num_tokens, top_k, hidden_size).sum(dim=1).to(hidden.dtype)


def fused_moe_mxfp4_reference(hidden, w_gate_up_packed, w_gate_up_scales, w_down_packed, w_down_scales,
                              topk_weights, topk_ids):
    """MXFP4 expert weights dequantized (exactly) to ``hidden``'s dtype, then ``fused_moe_reference``."""
    dtype = hidden.dtype
    w_gate_up = mxfp4_dequantize_reference(w_gate_up_packed, w_gate_up_scales, dtype)
    w_down = mxfp4_dequantize_reference(w_down_packed, w_down_scales, dtype)
    return fused_moe_reference(hidden, w_gate_up, w_down, topk_weights, topk_ids)


def fused_moe_nvfp4_reference(hidden, w_gate_up_packed, w_gate_up_scales, w_gate_up_global_scales, w_down_packed,
                              w_down_scales, w_down_global_scales, topk_weights, topk_ids):
    """NVFP4 expert weights as the kernel applies them: ``e2m1 * e4m3`` (exact), and each GEMM's fp32
    result times ``1 / global`` of its expert, then ``fused_moe_reference``."""
    def unscaled(packed, scales):
        ones = torch.ones((), dtype=torch.float32, device=packed.device)
        return nvfp4_dequantize_reference(packed, scales, ones, torch.float32)

    return fused_moe_reference(hidden, unscaled(w_gate_up_packed, w_gate_up_scales),
                               unscaled(w_down_packed, w_down_scales), topk_weights, topk_ids,
                               1.0 / w_gate_up_global_scales.float(), 1.0 / w_down_global_scales.float())
