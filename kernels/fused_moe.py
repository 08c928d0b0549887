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
  bytes, low nibble first, ``[E, N_total, K/32]`` E8M0 scales); each tile is decoded in registers
  to the activation's dtype (exact: every MXFP4 value is a bf16) before the ``tl.dot``.
- NVFP4 weights (``fused_moe_nvfp4_kernel``): ``nvfp4_quantize``'s packing along K (``[E, N_total, K/2]``
  bytes, ``[E, N_total, K/16]`` FP8 E4M3 scales) and one fp32 global scale per expert; each tile is
  ``e2m1 * (scale / global)`` in fp32, rounded once to the activation's dtype, as ``nvfp4_dequantize``.

Accumulation is fp32; each tile rounds once, when stored. Padding slots and dropped slots (expert
ids outside ``[0, E)``) are never written.
"""

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from .fp4 import _e2m1_decode, _e4m3_decode, mxfp4_dequantize_reference, nvfp4_dequantize_reference


@triton.jit
def _e8m0_decode(code):
    """fp32 ``2**(code - 127)`` from the bits (exact, no exp2): 0 is 2**-127 (an fp32 subnormal), 0xFF NaN."""
    bits = tl.where(code == 0, 0x00400000, code << 23)
    return tl.where(code == 255, float("nan"), bits.to(tl.float32, bitcast=True))


@triton.jit
def _mxfp4_tile(rows_ptr, scale_rows_ptr, row_ok, k_start, K,
                BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """A ``[BLOCK_K, BLOCK_N]`` fp32 tile of an MXFP4 weight: ``rows_ptr`` / ``scale_rows_ptr`` point
    at each column's packed row and scale row (``[BLOCK_N, 1]``)."""
    bytes_k = k_start // 2 + tl.arange(0, BLOCK_K // 2)
    packed = tl.load(rows_ptr + bytes_k[None, :], mask=row_ok[:, None] & (bytes_k < K // 2)[None, :],
                     other=0).to(tl.int32)
    values = tl.reshape(tl.join(_e2m1_decode(packed & 0xF), _e2m1_decode(packed >> 4)), (BLOCK_N, BLOCK_K))
    groups = k_start // 32 + tl.arange(0, BLOCK_K // 32)
    codes = tl.load(scale_rows_ptr + groups[None, :], mask=row_ok[:, None] & (groups < K // 32)[None, :],
                    other=127).to(tl.int32)
    scaled = tl.reshape(values, (BLOCK_N, BLOCK_K // 32, 32)) * _e8m0_decode(codes)[:, :, None]
    return tl.trans(tl.reshape(scaled, (BLOCK_N, BLOCK_K)))


@triton.jit
def _nvfp4_tile(rows_ptr, scale_rows_ptr, global_scale, row_ok, k_start, K,
                BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """A ``[BLOCK_K, BLOCK_N]`` fp32 tile of an NVFP4 weight: E2M1 times ``e4m3(scale) / global_scale``,
    the division IEEE-rounded as ``nvfp4_dequantize`` does, so the tile equals the dequantized weight."""
    bytes_k = k_start // 2 + tl.arange(0, BLOCK_K // 2)
    packed = tl.load(rows_ptr + bytes_k[None, :], mask=row_ok[:, None] & (bytes_k < K // 2)[None, :],
                     other=0).to(tl.int32)
    values = tl.reshape(tl.join(_e2m1_decode(packed & 0xF), _e2m1_decode(packed >> 4)), (BLOCK_N, BLOCK_K))
    groups = k_start // 16 + tl.arange(0, BLOCK_K // 16)
    codes = tl.load(scale_rows_ptr + groups[None, :], mask=row_ok[:, None] & (groups < K // 16)[None, :],
                    other=0).to(tl.int32)
    block_scale = tl.math.div_rn(_e4m3_decode(codes), tl.broadcast_to(global_scale, (BLOCK_N, BLOCK_K // 16)))
    scaled = tl.reshape(values, (BLOCK_N, BLOCK_K // 16, 16)) * block_scale[:, :, None]
    return tl.trans(tl.reshape(scaled, (BLOCK_N, BLOCK_K)))


@triton.jit
def _weight_tile(cols_ptr, rows_ptr, scale_rows_ptr, global_scale, n_ok, k, k_ok, k_start, K, dtype: tl.constexpr,
                 MXFP4_B: tl.constexpr, NVFP4_B: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """The ``[BLOCK_K, BLOCK_N]`` weight tile in ``dtype``: loaded (dense) or decoded in registers."""
    if MXFP4_B:
        return _mxfp4_tile(rows_ptr, scale_rows_ptr, n_ok, k_start, K, BLOCK_N, BLOCK_K).to(dtype)
    elif NVFP4_B:
        return _nvfp4_tile(rows_ptr, scale_rows_ptr, global_scale, n_ok, k_start, K, BLOCK_N, BLOCK_K).to(dtype)
    else:
        return tl.load(cols_ptr + k[:, None], mask=k_ok[:, None] & n_ok[None, :], other=0.0)


@triton.jit
def _fused_moe_tile(
    a_ptr, b_ptr, b_scale_ptr, b_global_scale_ptr, c_ptr, topk_weights_ptr, sorted_token_ids_ptr, expert_ids_ptr,
    num_tokens_post_padded_ptr, num_valid_slots, num_m_blocks, N, K, a_row_stride, b_expert_stride, b_row_stride,
    b_scale_expert_stride, b_scale_row_stride, c_row_stride,
    TOP_K: tl.constexpr, GATED: tl.constexpr, MUL_ROUTED_WEIGHT: tl.constexpr, MXFP4_B: tl.constexpr,
    NVFP4_B: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
):
    """One program's tile, shared by the dense/MXFP4 kernel and the NVFP4 kernel."""
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
        b_cols = b_ptr + expert * b_expert_stride + offs_n.to(tl.int64)[None, :] * b_row_stride
        b_rows = b_ptr + expert * b_expert_stride + offs_n.to(tl.int64)[:, None] * b_row_stride  # fp4: per column
        s_rows = b_scale_ptr + expert * b_scale_expert_stride + offs_n.to(tl.int64)[:, None] * b_scale_row_stride
        global_scale = 1.0
        if NVFP4_B:
            global_scale = tl.load(b_global_scale_ptr + expert)

        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        acc_up = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k_start in range(0, K, BLOCK_K):
            k = k_start + offs_k
            k_ok = k < K
            a = tl.load(a_rows + k[None, :], mask=slot_ok[:, None] & k_ok[None, :], other=0.0)
            b = _weight_tile(b_cols, b_rows, s_rows, global_scale, n_ok, k, k_ok, k_start, K, a.dtype,
                             MXFP4_B, NVFP4_B, BLOCK_N, BLOCK_K)
            acc = tl.dot(a, b, acc, input_precision="ieee")
            if GATED:
                b_up = _weight_tile(b_cols + N * b_row_stride, b_rows + N * b_row_stride,
                                    s_rows + N * b_scale_row_stride, global_scale, n_ok, k, k_ok, k_start, K,
                                    a.dtype, MXFP4_B, NVFP4_B, BLOCK_N, BLOCK_K)
                acc_up = tl.dot(a, b_up, acc_up, input_precision="ieee")

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
):
    """Dense (bf16/fp16/fp32) or MXFP4 weights."""
    _fused_moe_tile(a_ptr, b_ptr, b_scale_ptr, b_scale_ptr, c_ptr, topk_weights_ptr, sorted_token_ids_ptr,
                    expert_ids_ptr, num_tokens_post_padded_ptr, num_valid_slots, num_m_blocks, N, K, a_row_stride,
                    b_expert_stride, b_row_stride, b_scale_expert_stride, b_scale_row_stride, c_row_stride,
                    TOP_K, GATED, MUL_ROUTED_WEIGHT, MXFP4_B, False, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M)


@triton.jit(do_not_specialize=["num_valid_slots", "num_m_blocks"])
def fused_moe_nvfp4_kernel(
    a_ptr, b_ptr, b_scale_ptr, b_global_scale_ptr, c_ptr, topk_weights_ptr, sorted_token_ids_ptr, expert_ids_ptr,
    num_tokens_post_padded_ptr, num_valid_slots, num_m_blocks, N, K, a_row_stride, b_expert_stride, b_row_stride,
    b_scale_expert_stride, b_scale_row_stride, c_row_stride,
    TOP_K: tl.constexpr, GATED: tl.constexpr, MUL_ROUTED_WEIGHT: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
):
    """NVFP4 weights: its own kernel (one more pointer, the per-expert global scales), so the dense and
    MXFP4 variants keep their signature and keys."""
    _fused_moe_tile(a_ptr, b_ptr, b_scale_ptr, b_global_scale_ptr, c_ptr, topk_weights_ptr, sorted_token_ids_ptr,
                    expert_ids_ptr, num_tokens_post_padded_ptr, num_valid_slots, num_m_blocks, N, K, a_row_stride,
                    b_expert_stride, b_row_stride, b_scale_expert_stride, b_scale_row_stride, c_row_stride,
                    TOP_K, GATED, MUL_ROUTED_WEIGHT, False, True, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M)


def fused_moe_reference(hidden: torch.Tensor, w_gate_up: torch.Tensor, w_down: torch.Tensor,
                        topk_weights: torch.Tensor, topk_ids: torch.Tensor) -> torch.Tensor:
    """One expert at a time, rounding where the kernels round: ``silu(gate) * up`` in fp32, stored in
    ``hidden``'s dtype; the down projection times the routing weight in fp32, summed over the top-k
    slots of each token in fp32, returned in ``hidden``'s dtype. Ids outside ``[0, E)`` add nothing."""
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
        act = (F.silu(gate_up[:, :intermediate]) * gate_up[:, intermediate:]).to(hidden.dtype)
        per_slot[slots] = (act.float() @ w_down[expert].float().T) * flat_weights[slots, None]
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
    """NVFP4 expert weights (one global scale per expert) dequantized to ``hidden``'s dtype as
    ``nvfp4_dequantize`` rounds them, then ``fused_moe_reference``."""
    def dequantize(packed, scales, global_scales):
        return torch.stack([nvfp4_dequantize_reference(packed[e], scales[e], global_scales[e], hidden.dtype)
                            for e in range(packed.shape[0])])

    return fused_moe_reference(hidden, dequantize(w_gate_up_packed, w_gate_up_scales, w_gate_up_global_scales),
                               dequantize(w_down_packed, w_down_scales, w_down_global_scales), topk_weights, topk_ids)
