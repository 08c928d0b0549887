"""MoE top-k routing launcher: router logits in, ``(topk_weights, topk_ids)`` out; plus the
``tritonwarm::moe_topk_routing`` op. Selection rules are documented in ``kernels/moe_routing.py``."""

from __future__ import annotations

import torch

from ..jit import JitKernel, Launch
from ..kernels.moe_routing import moe_topk_routing_kernel
from ._host import cdiv, next_power_of_2
from ._op import custom_op

SCORINGS = ("softmax", "sigmoid")
ELEMENTS_PER_PROGRAM = 1024  # tokens x experts held in registers by one program (4 warps)


def moe_topk_routing_launch(router_logits: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor,
                            scoring: str, renormalize: bool, num_expert_group: int, topk_group: int,
                            correction_bias: torch.Tensor | None) -> Launch | None:
    num_tokens, num_experts = router_logits.shape
    top_k = topk_ids.shape[1]
    if num_tokens == 0:
        return None
    grouped = num_expert_group > 1
    block_e = next_power_of_2(num_experts)
    block_t = max(1, ELEMENTS_PER_PROGRAM // block_e)  # from the expert count only: never per batch
    # The token count only sizes the grid and masks the last block (do_not_specialize), so every
    # batch size shares one binary; expert count, top_k and groups are per-model constants.
    return Launch(
        grid=(cdiv(num_tokens, block_t),),
        args=(router_logits, correction_bias, topk_weights, topk_ids,
              num_tokens, num_experts, router_logits.stride(0), num_experts // num_expert_group),
        constexprs=dict(
            TOP_K=top_k, NUM_GROUPS=num_expert_group, TOPK_GROUP=topk_group,
            USE_SIGMOID=scoring == "sigmoid", HAS_BIAS=correction_bias is not None, GROUPED=grouped,
            RENORMALIZE=bool(renormalize), BLOCK_T=block_t, BLOCK_E=block_e,
            BLOCK_G=next_power_of_2(num_expert_group) if grouped else 1,
            BLOCK_K=next_power_of_2(top_k),
        ),
        num_warps=4,
    )


moe_topk_routing_jit = JitKernel(moe_topk_routing_kernel, moe_topk_routing_launch, memoize=True)


def moe_topk_routing(router_logits: torch.Tensor, top_k: int, scoring: str = "softmax", renormalize: bool = True,
                     num_expert_group: int | None = None, topk_group: int | None = None,
                     correction_bias: torch.Tensor | None = None):
    """Pick ``top_k`` experts per token: ``(topk_weights float32 [T, top_k], topk_ids int32 [T, top_k])``.

    ``router_logits`` is ``[T, E]`` (bf16, fp16 or fp32); scores are fp32. With ``num_expert_group``
    and ``topk_group``, only experts of the ``topk_group`` best groups are eligible (DeepSeek).
    """
    if router_logits.dim() != 2:
        raise ValueError(f"router_logits must be [num_tokens, num_experts], got {tuple(router_logits.shape)}")
    num_tokens, num_experts = router_logits.shape
    if scoring not in SCORINGS:
        raise ValueError(f"scoring must be one of {SCORINGS}, got {scoring!r}")
    if not 1 <= top_k <= num_experts:
        raise ValueError(f"top_k={top_k} must be in [1, {num_experts}]")
    num_expert_group, topk_group = check_groups(num_experts, top_k, num_expert_group, topk_group,
                                                 correction_bias is not None)
    if correction_bias is not None:
        if correction_bias.shape != (num_experts,):
            raise ValueError(f"correction_bias must be [{num_experts}], got {tuple(correction_bias.shape)}")
        correction_bias = correction_bias.to(torch.float32).contiguous()
    if router_logits.stride(-1) != 1:
        router_logits = router_logits.contiguous()
    topk_weights = torch.empty((num_tokens, top_k), dtype=torch.float32, device=router_logits.device)
    topk_ids = torch.empty((num_tokens, top_k), dtype=torch.int32, device=router_logits.device)
    moe_topk_routing_jit(router_logits, topk_weights, topk_ids, scoring, renormalize,
                         num_expert_group, topk_group, correction_bias)
    return topk_weights, topk_ids


def check_groups(num_experts, top_k, num_expert_group, topk_group, has_bias) -> tuple[int, int]:
    """Validate the grouping; no grouping is returned as one group (which keeps every expert)."""
    if (num_expert_group is None) != (topk_group is None):
        raise ValueError("num_expert_group and topk_group go together: give both or neither")
    if num_expert_group is None:
        return 1, 1
    if num_expert_group < 1 or num_experts % num_expert_group:
        raise ValueError(f"num_expert_group={num_expert_group} must divide num_experts={num_experts}")
    if not 1 <= topk_group <= num_expert_group:
        raise ValueError(f"topk_group={topk_group} must be in [1, {num_expert_group}]")
    group_size = num_experts // num_expert_group
    if top_k > topk_group * group_size:
        raise ValueError(f"top_k={top_k} exceeds the {topk_group * group_size} experts of the kept groups")
    if has_bias and num_expert_group > 1 and group_size < 2:
        raise ValueError("with correction_bias a group scores its two best experts: groups need >= 2 experts")
    return num_expert_group, topk_group


@custom_op("tritonwarm::moe_topk_routing", mutates_args=())
def _moe_topk_routing_op(router_logits: torch.Tensor, top_k: int, scoring: str = "softmax",
                         renormalize: bool = True, num_expert_group: int | None = None,
                         topk_group: int | None = None,
                         correction_bias: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    return moe_topk_routing(router_logits, top_k, scoring, renormalize, num_expert_group, topk_group,
                            correction_bias)


@_moe_topk_routing_op.register_fake
def _(router_logits, top_k, scoring="softmax", renormalize=True, num_expert_group=None, topk_group=None,
      correction_bias=None):
    num_tokens = router_logits.shape[0]
    return (router_logits.new_empty((num_tokens, top_k), dtype=torch.float32),
            router_logits.new_empty((num_tokens, top_k), dtype=torch.int32))
