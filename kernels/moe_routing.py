"""MoE router top-k selection (softmax or sigmoid scores, optional DeepSeek-style expert groups and
selection-only correction bias) as device code, and its PyTorch reference.

Selection rules, shared by the kernel and the reference:

- scores are computed in fp32; a NaN logit counts as -inf (score 0), so it is never preferred over a
  finite logit; a row whose logits are all -inf/NaN has all scores 0 (softmax would give 0/0);
- ``correction_bias`` is added to the scores for *selection only*; the returned weights are the
  unbiased scores of the selected experts (renormalized to sum to 1 when asked and the sum is > 0);
- groups: a group's score is its best expert score, or, when a correction bias is given
  (DeepSeek-V3's ``noaux_tc``), the sum of its two best biased scores; the ``topk_group`` best groups
  are kept and experts of the other groups are never selected;
- ties are deterministic: equal scores pick the lower expert index, equal group scores the lower
  group index, and ids come out by descending score, then ascending index (a *stable* sort).

Near ties: "equal" means equal as computed in fp32 on the device running it. Two scores a few ulps
apart can round to the same fp32 value on one device (or one library's ``exp``/``sigmoid``) and to
different values on another, so the order of two experts whose scores are within an fp32 ulp or two
may differ between the kernel, this reference on a CPU, and an fp64 computation; each is exact for
the fp32 scores it computed. (The tests compare ids exactly on seeded inputs, kernel and reference
both in fp32; a check against fp64 scores should count scores within an fp32 ulp as tied.)
"""

import torch
import triton
import triton.language as tl


@triton.jit(do_not_specialize=["num_tokens"])
def moe_topk_routing_kernel(
    logits_ptr, bias_ptr, weights_ptr, ids_ptr,
    num_tokens, num_experts, logits_row_stride, group_size,
    TOP_K: tl.constexpr, NUM_GROUPS: tl.constexpr, TOPK_GROUP: tl.constexpr,
    USE_SIGMOID: tl.constexpr, HAS_BIAS: tl.constexpr, GROUPED: tl.constexpr, RENORMALIZE: tl.constexpr,
    BLOCK_T: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_K: tl.constexpr,
):
    # BLOCK_T tokens per program, each with its whole expert row in registers. Every pick is an
    # arg-max with an explicit lowest-index tie-break over an "available" mask, so ties and -inf
    # scores never depend on reduction order. top_k and the group counts are per-model constants:
    # constexpr loop bounds (Triton 3.6's interpreter cannot loop up to a runtime int).
    rows = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    experts = tl.arange(0, BLOCK_E)
    available = (rows < num_tokens)[:, None] & (experts < num_experts)[None, :]
    x = tl.load(logits_ptr + rows.to(tl.int64)[:, None] * logits_row_stride + experts[None, :],
                mask=available, other=float("-inf")).to(tl.float32)
    x = tl.where(x != x, float("-inf"), x)  # NaN counts as -inf

    if USE_SIGMOID:
        scores = tl.sigmoid(x)
    else:
        row_max = tl.max(x, axis=1)
        row_max = tl.where(row_max == float("-inf"), 0.0, row_max)  # all -inf row: exp gives 0, not NaN
        exps = tl.exp(x - row_max[:, None])
        total = tl.sum(exps, axis=1)
        scores = exps / tl.where(total > 0, total, 1.0)[:, None]

    choice = scores
    if HAS_BIAS:
        bias = tl.load(bias_ptr + experts, mask=experts < num_experts, other=0.0)
        choice = scores + bias[None, :]

    if GROUPED:
        group_of = experts // group_size
        groups = tl.arange(0, BLOCK_G)
        group_scores = tl.full([BLOCK_T, BLOCK_G], float("-inf"), tl.float32)
        for g in range(NUM_GROUPS):
            in_group = available & (group_of == g)[None, :]
            values = tl.where(in_group, choice, float("-inf"))
            best = tl.max(values, axis=1)
            if HAS_BIAS:  # DeepSeek-V3 (noaux_tc): a group scores the sum of its two best biased scores
                first = tl.min(tl.where(in_group & (values == best[:, None]), experts[None, :], BLOCK_E), axis=1)
                second = tl.max(tl.where(experts[None, :] == first[:, None], float("-inf"), values), axis=1)
                best = best + second
            group_scores = tl.where(groups[None, :] == g, best[:, None], group_scores)
        groups_left = (rows >= 0)[:, None] & (groups < NUM_GROUPS)[None, :]
        in_kept_group = tl.zeros([BLOCK_T, BLOCK_E], dtype=tl.int1)
        for _ in range(TOPK_GROUP):
            candidates = tl.where(groups_left, group_scores, float("-inf"))
            top = tl.max(candidates, axis=1)
            pick = tl.min(tl.where(groups_left & (candidates == top[:, None]), groups[None, :], BLOCK_G), axis=1)
            groups_left = groups_left & (groups[None, :] != pick[:, None])
            in_kept_group = in_kept_group | (group_of[None, :] == pick[:, None])
        available = available & in_kept_group

    slots = tl.arange(0, BLOCK_K)
    topk_weights = tl.zeros([BLOCK_T, BLOCK_K], tl.float32)
    topk_ids = tl.zeros([BLOCK_T, BLOCK_K], tl.int32)
    for k in range(TOP_K):
        candidates = tl.where(available, choice, float("-inf"))
        top = tl.max(candidates, axis=1)
        pick = tl.min(tl.where(available & (candidates == top[:, None]), experts[None, :], BLOCK_E), axis=1)
        picked = experts[None, :] == pick[:, None]
        weight = tl.sum(tl.where(picked, scores, 0.0), axis=1)  # exactly the picked (unbiased) score
        available = available & ~picked
        topk_weights = tl.where(slots[None, :] == k, weight[:, None], topk_weights)
        topk_ids = tl.where(slots[None, :] == k, pick[:, None], topk_ids)

    if RENORMALIZE:
        weight_sum = tl.sum(topk_weights, axis=1)  # unused slots hold 0
        topk_weights = topk_weights / tl.where(weight_sum > 0, weight_sum, 1.0)[:, None]

    out_offsets = rows.to(tl.int64)[:, None] * TOP_K + slots[None, :]
    out_mask = (rows < num_tokens)[:, None] & (slots < TOP_K)[None, :]
    tl.store(weights_ptr + out_offsets, topk_weights, mask=out_mask)
    tl.store(ids_ptr + out_offsets, topk_ids, mask=out_mask)


def moe_topk_routing_reference(router_logits, top_k, scoring="softmax", renormalize=True,
                               num_expert_group=None, topk_group=None, correction_bias=None):
    """Plain PyTorch with the rules of the module docstring; every ranking is a stable sort."""
    logits = router_logits.float()
    logits = torch.where(torch.isnan(logits), float("-inf"), logits)
    if scoring == "softmax":
        scores = torch.nan_to_num(torch.softmax(logits, dim=-1), nan=0.0)  # all -inf row: 0/0 -> 0
    elif scoring == "sigmoid":
        scores = torch.sigmoid(logits)
    else:
        raise ValueError(f"unknown scoring {scoring!r}")
    choice = scores if correction_bias is None else scores + correction_bias.float()

    num_tokens, num_experts = scores.shape
    if num_expert_group is not None and num_expert_group > 1:
        group_size = num_experts // num_expert_group
        grouped = choice.view(num_tokens, num_expert_group, group_size)
        if correction_bias is not None:
            group_scores = torch.sort(grouped, dim=-1, descending=True, stable=True).values[..., :2].sum(dim=-1)
        else:
            group_scores = grouped.max(dim=-1).values
        kept = torch.sort(group_scores, dim=-1, descending=True, stable=True).indices[:, :topk_group]
        group_kept = torch.zeros(num_tokens, num_expert_group, dtype=torch.bool, device=logits.device)
        group_kept.scatter_(1, kept, True)
        choice = choice.masked_fill(~group_kept.repeat_interleave(group_size, dim=1), float("-inf"))

    topk_ids = torch.sort(choice, dim=-1, descending=True, stable=True).indices[:, :top_k]
    topk_weights = scores.gather(1, topk_ids)
    if renormalize:
        weight_sum = topk_weights.sum(dim=-1, keepdim=True)
        topk_weights = torch.where(weight_sum > 0, topk_weights / weight_sum, topk_weights)
    return topk_weights, topk_ids.to(torch.int32)
