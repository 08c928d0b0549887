"""A DeepSeek-V2-style decoder on any device, ``meta`` included.

embedding → layers of [RMSNorm → MLA attention → RMSNorm → MoE (or a dense MLP)] → final norm →
logits. Every op the kernel library covers goes through ``self.ops`` (see ``ops.py``); projections and
expert matmuls are torch. Nothing here reads tensor values on the host, so the same forward runs on
meta tensors while tracing (warm-up plans, dry runs).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..launchers.fused_moe import TileTable, active_tile_table, load_tile_table
from ..launchers.kv_cache import KVCacheLayout
from ..launchers.mla_kv_quant import slots_of
from ..launchers.moe_align import path_token_counts
from .config import EngineConfig
from .ops import Ops


@dataclass
class StepInputs:
    """One step's tokens, flattened: row i is one token of some request (prefill or decode)."""

    input_ids: torch.Tensor  # int64 [T]
    positions: torch.Tensor  # int64 [T]: the token's position in its request
    seq_lens: torch.Tensor  # int32 [T]: position + 1 (each row attends causally to its request's cache)
    block_tables: torch.Tensor  # int32 [T, max_blocks]: the row's request's block table
    sample_rows: torch.Tensor  # int64 [S]: rows whose logits are needed (last token of a request)


class Model:
    def __init__(self, config: EngineConfig, weights: dict[str, torch.Tensor], ops: Ops, device):
        """``weights`` is consumed: the tensors fused into stacked ones are removed from it."""
        cfg = self.cfg = config.model
        self.config, self.ops, self.device = config, ops, torch.device(device)
        self.embed = weights["model.embed_tokens.weight"]
        self.norm = weights["model.norm.weight"]
        self.lm_head = weights["lm_head.weight"]
        self.layers = [_layer_weights(weights, cfg, i) for i in range(cfg.num_layers)]
        self.cos_sin_cache = _cos_sin_cache(config.max_model_len, cfg.qk_rope_head_dim, cfg.rope_theta, self.device)
        self.scale = 1.0 / math.sqrt(cfg.qk_nope_head_dim + cfg.qk_rope_head_dim)
        # None: each launch reads the table of the target it runs on (``active_tile_table``), so a
        # warm-up traced under sm90's driver and the engine on an H200 pick the same tiles.
        self.moe_tiles = load_tile_table(config.moe_tile_configs) if config.moe_tile_configs else None

    def forward(self, step: StepInputs, kv_caches: list[torch.Tensor]) -> torch.Tensor:
        """Logits (fp32) of ``step.sample_rows``; the step's latent KV is written to the caches."""
        ops, cfg = self.ops, self.cfg
        # One split metadata per step, shared by every layer's attention (one latent kv head).
        if self.config.kv_cache_dtype == "auto":
            metadata = ops.decode_metadata(step.seq_lens, step.block_tables, cfg.num_heads, 1,
                                           cfg.kv_lora_rank + cfg.qk_rope_head_dim, self.config.block_size)
        else:
            metadata = ops.quantized_decode_metadata(step.seq_lens, step.block_tables, cfg.num_heads,
                                                     self.config.block_size, self.config.kv_cache_dtype)
        x = F.embedding(step.input_ids, self.embed)
        residual = None
        for layer, kv_cache in zip(self.layers, kv_caches, strict=True):
            if residual is None:
                residual = x
                h = ops.rms_norm(x, layer["attn_norm"], cfg.rms_norm_eps)
            else:
                h, residual = ops.rms_norm(x, layer["attn_norm"], cfg.rms_norm_eps, residual)
            h = self.attention(layer, h, step, kv_cache, metadata)
            h, residual = ops.rms_norm(h, layer["mlp_norm"], cfg.rms_norm_eps, residual)
            x = self.moe(layer, h) if "router" in layer else self.mlp(h, layer["gate_up"], layer["down"])
        h, _ = ops.rms_norm(x[step.sample_rows], self.norm, cfg.rms_norm_eps, residual[step.sample_rows])
        return (h @ self.lm_head.T).float()

    def attention(self, w, h, step: StepInputs, kv_cache, metadata):
        """MLA in the absorbed form: queries move into the latent space, the cache holds
        ``[latent | k_pe]`` per token, and the latent output comes back through W_UV."""
        cfg, ops = self.cfg, self.ops
        tokens = h.shape[0]
        nope, rope, rank = cfg.qk_nope_head_dim, cfg.qk_rope_head_dim, cfg.kv_lora_rank
        q = (h @ w["q_proj"].T).view(tokens, cfg.num_heads, nope + rope)
        kv_a = h @ w["kv_a_proj"].T  # [T, rank + rope]
        latent = ops.rms_norm(kv_a[:, :rank], w["kv_a_norm"], cfg.rms_norm_eps)
        q_pe, k_pe = ops.rotary_embedding(step.positions, q[..., nope:], kv_a[:, None, rank:],
                                          self.cos_sin_cache, cfg.rope_is_neox)
        kv_dtype = self.config.kv_cache_dtype
        if kv_dtype == "auto":
            layout = KVCacheLayout.mla(kv_cache.shape[0], self.config.block_size, rank, rope)
            layout.write(kv_cache, step.block_tables, step.positions, torch.cat([latent[:, None], k_pe], dim=-1))
        else:  # quantized where it is stored: the same bytes in both modes (the write is bit-exact)
            slots = slots_of(step.block_tables, step.positions, self.config.block_size)
            ops.mla_kv_write(kv_cache, slots, latent, k_pe[:, 0], kv_dtype)
        q_latent = torch.einsum("thn,hnr->thr", q[..., :nope], w["w_uk"])
        q_full = torch.cat([q_latent, q_pe], dim=-1).contiguous()  # [T, heads, rank + rope]
        if kv_dtype == "auto":
            out = ops.paged_attention(q_full, kv_cache, step.block_tables, step.seq_lens, self.scale, metadata, rank)
        else:
            out = ops.quantized_mla_attention(q_full, kv_cache, step.block_tables, step.seq_lens, self.scale,
                                              kv_dtype, rank, metadata)
        out = torch.einsum("thr,hvr->thv", out, w["w_uv"]).reshape(tokens, cfg.num_heads * cfg.v_head_dim)
        return out @ w["o_proj"].T

    def mlp(self, h, gate_up, down):
        return self.ops.silu_and_mul(h @ gate_up.T) @ down.T

    def moe(self, w, h):
        """Routed experts through the fused MoE GEMM (one kernel for gate/up + SiLU-and-mul, one for
        down, over ``moe_align_block_size``'s layout), plus the shared experts."""
        cfg, ops = self.cfg, self.ops
        weights, ids = ops.moe_topk_routing(h @ w["router"].T, cfg.top_k, cfg.scoring, cfg.renormalize,
                                            cfg.num_expert_group, cfg.topk_group, w.get("router_bias"))
        routed = ops.fused_moe(h, w["experts_gate_up"], w["experts_down"], weights, ids, self.moe_tiles)
        if "gate_up" in w:
            routed = routed + self.mlp(h, w["gate_up"], w["down"])
        return routed


def engine_tile_table(config: EngineConfig) -> TileTable:
    """The fused MoE tile table the engine launches with: the config's ``moe_tile_configs`` where set,
    else the table of the target Triton's active driver compiles for (``default.json`` without one)."""
    return load_tile_table(config.moe_tile_configs) if config.moe_tile_configs else active_tile_table()


def plan_token_counts(config: EngineConfig) -> list[int]:
    """Token counts at which the model's launch choices change (besides Triton's scalar classes):
    one per entry of the fused MoE tile table, and either side of each change of the MoE alignment's
    path, up to the step's token budget. Call it under the driver of the target being planned (as
    ``engine_plan`` does): the table is that target's."""
    cfg = config.model
    if not cfg.num_experts:
        return []
    buckets = engine_tile_table(config).bucket_tokens(config.max_num_tokens)
    return sorted(set(buckets) | set(path_token_counts(cfg.top_k, cfg.num_experts, config.max_num_tokens)))


def _layer_weights(weights: dict[str, torch.Tensor], cfg, i: int) -> dict[str, torch.Tensor]:
    """The checkpoint's tensors of layer ``i`` in the shapes the forward uses (fused, stacked)."""
    p = f"model.layers.{i}."
    kv_b = weights[p + "self_attn.kv_b_proj.weight"].view(cfg.num_heads, cfg.qk_nope_head_dim + cfg.v_head_dim,
                                                        cfg.kv_lora_rank)
    layer = {
        "attn_norm": weights[p + "input_layernorm.weight"],
        "mlp_norm": weights[p + "post_attention_layernorm.weight"],
        "q_proj": weights[p + "self_attn.q_proj.weight"],
        "kv_a_proj": weights[p + "self_attn.kv_a_proj_with_mqa.weight"],
        "kv_a_norm": weights[p + "self_attn.kv_a_layernorm.weight"],
        "w_uk": kv_b[:, :cfg.qk_nope_head_dim],  # [heads, nope, rank]
        "w_uv": kv_b[:, cfg.qk_nope_head_dim:],  # [heads, v, rank]
        "o_proj": weights[p + "self_attn.o_proj.weight"],
    }
    dense = i < cfg.first_dense_layers
    # Fused tensors are copies: each original leaves ``weights`` as it is fused, so building holds one
    # layer's copies at a time, not a second model.
    if dense or cfg.num_shared_experts:
        mlp = p + ("mlp." if dense else "mlp.shared_experts.")
        layer["gate_up"] = torch.cat([weights.pop(mlp + "gate_proj.weight"), weights.pop(mlp + "up_proj.weight")])
        layer["down"] = weights[mlp + "down_proj.weight"]
    if not dense:
        experts = [f"{p}mlp.experts.{e}." for e in range(cfg.num_experts)]
        layer["router"] = weights[p + "mlp.gate.weight"]
        if cfg.correction_bias:
            layer["router_bias"] = weights[p + "mlp.gate.e_score_correction_bias"].float()
        layer["experts_gate_up"] = torch.stack(
            [torch.cat([weights.pop(e + "gate_proj.weight"), weights.pop(e + "up_proj.weight")]) for e in experts])
        layer["experts_down"] = torch.stack([weights.pop(e + "down_proj.weight") for e in experts])
    return layer


def _cos_sin_cache(max_position: int, rot_dim: int, theta: float, device) -> torch.Tensor:
    """``[max_position, rot_dim]`` fp32: cos of each frequency, then sin (the rotary kernels' layout)."""
    # Computed on the CPU (the same values on every device, meta included), then moved once.
    inv_freq = 1.0 / theta ** (torch.arange(0, rot_dim, 2, dtype=torch.float32, device="cpu") / rot_dim)
    angles = torch.outer(torch.arange(max_position, dtype=torch.float32, device="cpu"), inv_freq)
    return torch.cat([angles.cos(), angles.sin()], dim=-1).to(device)
