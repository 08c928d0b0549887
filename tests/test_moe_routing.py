import math
from pathlib import Path

import pytest
import torch
from tritonwarm.jit import TARGETS, capture, class_reps, fake_tensor, trace_call
from tritonwarm.kernels.moe_routing import moe_topk_routing_reference
from tritonwarm.launchers.moe_routing import moe_topk_routing

NAN, INF = float("nan"), float("inf")

# name: (num_experts, top_k, scoring, renormalize, num_expert_group, topk_group, has_bias)
CONFIGS = {
    "deepseek-v2-lite": (64, 6, "softmax", False, 1, 1, False),
    "deepseek-v3": (256, 8, "sigmoid", True, 8, 4, True),
    "mixtral": (8, 2, "softmax", True, None, None, False),
    "deepseek-v2": (160, 6, "softmax", True, 8, 3, False),  # groups of 20: not a power of two
    "qwen-moe": (60, 4, "softmax", True, None, None, False),
    "grouped-softmax-bias": (64, 6, "softmax", False, 4, 2, True),
    "sigmoid-no-groups": (160, 6, "sigmoid", True, None, None, True),
}


def make_inputs(name, num_tokens, dtype, seed, values=None):
    """Random logits (or logits drawn from ``values``: many exact ties) and a bias if the config has one."""
    num_experts, *_, has_bias = CONFIGS[name]
    g = torch.Generator().manual_seed(seed)
    if values is None:
        logits = torch.randn(num_tokens, num_experts, generator=g)
    else:
        logits = torch.tensor(values)[torch.randint(len(values), (num_tokens, num_experts), generator=g)]
    bias = None
    if has_bias:
        bias = torch.tensor([0.0, 0.25])[torch.randint(2, (num_experts,), generator=g)] if values else \
            torch.randn(num_experts, generator=g) * 0.1
    return logits.to(dtype), bias


def route_both(logits, top_k, scoring="softmax", renormalize=True, num_expert_group=None, topk_group=None, bias=None):
    got = moe_topk_routing(logits, top_k, scoring, renormalize, num_expert_group, topk_group, bias)
    want = moe_topk_routing_reference(logits, top_k, scoring, renormalize, num_expert_group, topk_group, bias)
    return got, want


def assert_routing_matches(got, want):
    (weights, ids), (want_weights, want_ids) = got, want
    assert ids.dtype == torch.int32 and weights.dtype == torch.float32
    torch.testing.assert_close(ids, want_ids, atol=0, rtol=0)
    # exp/sigmoid and the sums may differ from PyTorch's by an ulp or two; selection must not.
    torch.testing.assert_close(weights, want_weights, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("name", list(CONFIGS))
def test_matches_reference(name, dtype):
    _, top_k, scoring, renormalize, groups, topk_group, _ = CONFIGS[name]
    logits, bias = make_inputs(name, 37, dtype, seed=len(name))
    assert_routing_matches(*route_both(logits, top_k, scoring, renormalize, groups, topk_group, bias))


@pytest.mark.parametrize("name", list(CONFIGS))
def test_many_exact_ties(name):
    # Logits from four values (exact in bf16, no x/-x pair whose sigmoids sum to exactly 1) and a
    # two-valued bias: most rows have ties inside and across groups.
    _, top_k, scoring, renormalize, groups, topk_group, _ = CONFIGS[name]
    logits, bias = make_inputs(name, 40, torch.bfloat16, seed=7, values=[-1.5, 0.5, 1.0, 2.0])
    assert_routing_matches(*route_both(logits, top_k, scoring, renormalize, groups, topk_group, bias))


@pytest.mark.parametrize("scoring", ["softmax", "sigmoid"])
def test_all_equal_row_takes_lowest_indices(scoring):
    weights, ids = moe_topk_routing(torch.full((2, 60), 0.5), 4, scoring)
    assert ids.tolist() == [[0, 1, 2, 3]] * 2
    assert (weights == 0.25).all()
    weights, ids = moe_topk_routing(torch.full((1, 60), 0.5), 4, "softmax", renormalize=False)
    torch.testing.assert_close(weights, torch.full((1, 4), 1 / 60))


def test_tie_across_group_boundary_keeps_lower_group():
    logits = torch.tensor([[0.0, 0.0, 0.0, 5.0, 5.0, 0.0, 0.0, 0.0]])
    _, ids = moe_topk_routing(logits, 2)
    assert ids.tolist() == [[3, 4]]  # no groups: equal best scores, lower index first
    _, ids = moe_topk_routing(logits, 2, num_expert_group=2, topk_group=1)
    assert ids.tolist() == [[3, 0]]  # equal group scores: group 0 wins, then its lowest tied expert
    all_equal = torch.zeros(3, 16)
    _, ids = moe_topk_routing(all_equal, 8, "sigmoid", True, 4, 2, torch.zeros(16))
    assert ids.tolist() == [list(range(8))] * 3


def test_group_rule_max_without_bias_top2_sum_with_bias():
    # Group 0 has the single best expert; group 1 the better pair of experts.
    logits = torch.tensor([[3.0, -4.0, -4.0, -4.0, 2.0, 1.5, -4.0, -4.0]])
    _, ids = moe_topk_routing(logits, 1, "sigmoid", False, 2, 1)
    assert ids.tolist() == [[0]]
    _, ids = moe_topk_routing(logits, 1, "sigmoid", False, 2, 1, torch.zeros(8))
    assert ids.tolist() == [[4]]


def test_bias_selects_but_weights_are_unbiased():
    logits = torch.tensor([[2.0, 0.0, 0.0, -1.0]])
    weights, ids = moe_topk_routing(logits, 2, "sigmoid", False, correction_bias=torch.tensor([0.0, 1.0, 0.0, 2.0]))
    assert ids.tolist() == [[3, 1]]
    torch.testing.assert_close(weights, torch.sigmoid(torch.tensor([[-1.0, 0.0]])))


@pytest.mark.parametrize("scoring", ["softmax", "sigmoid"])
def test_nan_counts_as_minus_inf(scoring):
    logits = torch.tensor([
        [NAN, 1.0, NAN, 0.5, -INF, 0.0],
        [NAN] * 6,
        [-INF] * 6,
        [-INF, NAN, -INF, 2.0, NAN, -INF],
    ])
    weights, ids = moe_topk_routing(logits, 2, scoring)
    assert ids.tolist() == [[1, 3], [0, 1], [0, 1], [3, 0]]
    assert (weights[1:3] == 0).all()  # no positive score: nothing to renormalize
    assert weights[3].tolist() == [1.0, 0.0]
    assert torch.isfinite(weights).all()
    assert_routing_matches((weights, ids), moe_topk_routing_reference(logits, 2, scoring))


def test_single_token_top1_and_top_all():
    logits, _ = make_inputs("qwen-moe", 1, torch.float32, seed=3)
    assert_routing_matches(*route_both(logits, 1))
    weights, ids = moe_topk_routing(logits, 60, renormalize=False)
    assert sorted(ids[0].tolist()) == list(range(60))
    assert math.isclose(weights.sum().item(), 1.0, rel_tol=1e-5)
    assert_routing_matches((weights, ids), moe_topk_routing_reference(logits, 60, renormalize=False))
    logits, bias = make_inputs("deepseek-v3", 3, torch.float32, seed=4)
    assert_routing_matches(*route_both(logits, 256, "sigmoid", True, 8, 8, bias))


def test_strided_logits_and_zero_tokens():
    base = torch.randn(5, 80, generator=torch.Generator().manual_seed(5))
    assert_routing_matches(*route_both(base[:, :64], 6))
    weights, ids = moe_topk_routing(torch.empty(0, 64), 6)
    assert weights.shape == ids.shape == (0, 6)


@pytest.mark.parametrize("kwargs, message", [
    (dict(top_k=0), "top_k"),
    (dict(top_k=17), "top_k"),
    (dict(top_k=2, scoring="relu"), "scoring"),
    (dict(top_k=2, num_expert_group=4), "together"),
    (dict(top_k=2, num_expert_group=5, topk_group=1), "divide"),
    (dict(top_k=2, num_expert_group=4, topk_group=5), "topk_group"),
    (dict(top_k=5, num_expert_group=4, topk_group=1), "kept groups"),
    (dict(top_k=2, num_expert_group=16, topk_group=2, correction_bias=torch.zeros(16)), "two best"),
    (dict(top_k=2, correction_bias=torch.zeros(8)), "correction_bias"),
])
def test_rejects_bad_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        moe_topk_routing(torch.zeros(2, 16), **kwargs)


def test_opcheck():
    logits, bias = make_inputs("grouped-softmax-bias", 3, torch.bfloat16, seed=9)
    torch.library.opcheck(torch.ops.tritonwarm.moe_topk_routing.default, (logits, 6, "sigmoid", True, 4, 2, bias))
    torch.library.opcheck(torch.ops.tritonwarm.moe_topk_routing.default, (logits.float(), 2))


# --------------------------------------------------------------------------- warm-up and compile

# The combinations warmup_specs/moe_topk_routing.yaml declares: (config, logits dtypes).
SPEC_MODELS = [("deepseek-v2-lite", torch.bfloat16), ("deepseek-v2-lite", torch.float16),
               ("mixtral", torch.bfloat16), ("mixtral", torch.float16),
               ("deepseek-v3", torch.bfloat16), ("deepseek-v3", torch.float32)]


def fake_call_args(name, num_tokens, dtype):
    num_experts, top_k, scoring, renormalize, groups, topk_group, has_bias = CONFIGS[name]
    bias = fake_tensor((num_experts,), torch.float32) if has_bias else None
    return (fake_tensor((num_tokens, num_experts), dtype), top_k, scoring, renormalize, groups, topk_group, bias)


@pytest.mark.parametrize("name, dtype", SPEC_MODELS)
def test_spec_combination_is_one_variant_for_every_batch(name, dtype):
    keys = set()
    for num_tokens in [*class_reps(1, 16384).values(), 17, 1000, 16384]:
        [variant] = trace_call(TARGETS["sm90"], moe_topk_routing, *fake_call_args(name, num_tokens, dtype))
        keys.add(variant.key)
    assert len(keys) == 1


def test_spec_file_rows_trace():
    from tritonwarm.jit.pipeline import specs
    path = Path(__file__).resolve().parents[1] / "warmup_specs" / "moe_topk_routing.yaml"
    variants = set()
    for spec in specs.load_spec_file(path):
        for row in spec.rows():
            args, kwargs = spec.call_arguments(row.values)
            with capture(TARGETS["sm90"]) as cap:
                spec.launcher(*args, **kwargs)
            assert cap.launches == 1, row.label
            variants |= set(cap.variants)
    assert len(variants) == len(SPEC_MODELS)


@pytest.mark.slow
@pytest.mark.parametrize("target", ["sm90", "gfx942"])
@pytest.mark.parametrize("name, dtype", [("deepseek-v2-lite", torch.bfloat16), ("deepseek-v3", torch.float32),
                                         ("mixtral", torch.bfloat16)])
def test_compiles(compile_call, target, name, dtype):
    [(variant, _)] = compile_call(target, moe_topk_routing, *fake_call_args(name, 64, dtype))
    assert variant.args["num_tokens"] == "i32"  # do_not_specialize: no div-16 / ==1 variants
    assert variant.args["BLOCK_E"] == f"={1 << (CONFIGS[name][0] - 1).bit_length()}"
