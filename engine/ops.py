"""The one table of ops the model calls, with two implementations of each.

``triton`` dispatches through the launchers (GPU, Triton's interpreter on CPU, or fake launches
while tracing); ``reference`` calls the kernels' plain PyTorch references. The model code is the
same for both, so a token-level comparison of the two modes tests the kernels, not two models.
Each op has one calling convention here; where a reference returns copies instead of updating in
place, the model always uses the returned tensors. Importing this module defines every kernel the
engine launches (warm-up plans name it as their ``import_path``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from ..kernels.activation import silu_and_mul_reference
from ..kernels.fused_moe import fused_moe_reference
from ..kernels.kv_block_zero import kv_block_zero_reference
from ..kernels.mla_kv_quant import mla_kv_write_reference, quantized_mla_decode_attention_reference
from ..kernels.moe_routing import moe_topk_routing_reference
from ..kernels.paged_attention import paged_decode_attention_reference
from ..kernels.rms_norm import rms_norm_reference
from ..kernels.rotary import rotary_embedding_reference
from ..launchers.activation import silu_and_mul
from ..launchers.fused_moe import fused_moe
from ..launchers.kv_block_zero import kv_block_zero
from ..launchers.kv_cache import KVCacheLayout
from ..launchers.kv_cache_formats import kv_format
from ..launchers.mla_kv_quant import mla_kv_cache_write, quantized_mla_decode_attention, quantized_mla_decode_metadata
from ..launchers.moe_routing import moe_topk_routing
from ..launchers.paged_attention import paged_decode_attention, paged_decode_metadata
from ..launchers.rms_norm import rms_norm
from ..launchers.rotary import rotary_embedding


@dataclass(frozen=True)
class Ops:
    name: str
    rms_norm: Callable  # (x, weight, eps, residual=None) -> normed | (normed, x + residual)
    silu_and_mul: Callable  # (x [.., 2d]) -> [.., d]
    rotary_embedding: Callable  # (positions, q, k, cos_sin_cache, is_neox) -> (q, k) rotated
    moe_topk_routing: Callable  # (logits, top_k, scoring, renormalize, groups, topk_group, bias) -> (w, ids)
    fused_moe: Callable  # (h, w_gate_up, w_down, topk_weights, topk_ids, tile_table) -> routed experts' sum
    decode_metadata: Callable  # (seq_lens, block_table, num_heads, num_kv_heads, key_dim, block_size) -> splits
    paged_attention: Callable  # (q, kv_cache, block_table, seq_lens, scale, metadata, v_head_dim) -> out
    kv_block_zero: Callable  # (kv_cache, block_ids) -> None, in place
    # quantized DS-MLA caches (launchers/kv_cache_formats.py)
    mla_kv_write: Callable  # (kv_cache, slots, latent, rope, kv_cache_dtype) -> None, in place
    quantized_decode_metadata: Callable  # (seq_lens, block_table, num_heads, block_size, kv_cache_dtype) -> splits
    quantized_mla_attention: Callable  # (q, kv_cache, block_table, seq_lens, scale, kv_cache_dtype, rank, metadata)


def _reference_decode_metadata(seq_lens, block_table, num_heads, num_kv_heads, key_dim, block_size):
    return None  # the reference attends over each request's tokens in one softmax: no splits


def _reference_paged_attention(q, kv_cache, block_table, seq_lens, scale, metadata=None, v_head_dim=None):
    # The reference needs no split schedule: it attends over each request's tokens in one softmax.
    layout = KVCacheLayout.infer(kv_cache, q.shape[-1], v_head_dim)
    return paged_decode_attention_reference(q, kv_cache, block_table, seq_lens, scale, layout)


def _reference_fused_moe(hidden, w_gate_up, w_down, topk_weights, topk_ids, tile_table=None):
    # The reference has no tiles: one expert at a time, rounding where the kernels round.
    return fused_moe_reference(hidden, w_gate_up, w_down, topk_weights, topk_ids)


def _reference_kv_block_zero(kv_cache, block_ids):
    kv_cache.copy_(kv_block_zero_reference(kv_cache, block_ids))


def _reference_mla_kv_write(kv_cache, slots, latent, rope, kv_cache_dtype):
    mla_kv_write_reference(kv_cache, kv_format(kv_cache_dtype, latent.shape[1], rope.shape[1]), slots, latent, rope)


def _reference_quantized_decode_metadata(seq_lens, block_table, num_heads, block_size, kv_cache_dtype):
    return None  # one softmax per request: no splits


def _reference_quantized_mla_attention(q, kv_cache, block_table, seq_lens, scale, kv_cache_dtype, kv_lora_rank,
                                       metadata=None):
    fmt = kv_format(kv_cache_dtype, kv_lora_rank, q.shape[-1] - kv_lora_rank)
    return quantized_mla_decode_attention_reference(q, kv_cache, block_table, seq_lens, scale, fmt)


TRITON = Ops("triton", rms_norm, silu_and_mul, rotary_embedding, moe_topk_routing, fused_moe,
             paged_decode_metadata, paged_decode_attention, kv_block_zero,
             mla_kv_cache_write, quantized_mla_decode_metadata, quantized_mla_decode_attention)

REFERENCE = Ops("reference", rms_norm_reference, silu_and_mul_reference, rotary_embedding_reference,
                moe_topk_routing_reference, _reference_fused_moe, _reference_decode_metadata,
                _reference_paged_attention, _reference_kv_block_zero,
                _reference_mla_kv_write, _reference_quantized_decode_metadata, _reference_quantized_mla_attention)

OPS = {"triton": TRITON, "reference": REFERENCE}


def get_ops(mode: str) -> Ops:
    if mode not in OPS:
        raise ValueError(f"unknown mode {mode!r}: choose one of {', '.join(OPS)}")
    return OPS[mode]


def as_int32(values, device) -> torch.Tensor:
    """Host-side step metadata (Python ints) as an int32 tensor on the model's device."""
    return torch.tensor(values, dtype=torch.int32, device=device)
