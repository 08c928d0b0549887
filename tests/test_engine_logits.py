"""Teacher-forced logits: a run fed another run's tokens samples exactly those, its logits are compared
position by position, and the contract of docs/engine.md is judged from the comparisons (fp32: token
identity; bf16: within twice the reference's own bf16 error, argmax differences only on near-ties)."""

import dataclasses

import pytest
import torch
from tritonwarm.engine.config import ENGINES, MODELS, EngineConfig
from tritonwarm.engine.engine import Engine
from tritonwarm.engine.logits import (
    BF16_FACTOR,
    LogitComparison,
    LogitRecorder,
    ModesReport,
    compare_logits,
    compare_modes,
    contract_problems,
)
from tritonwarm.engine.runner import make_workload, serve

TINY = ENGINES["tiny"]


def test_a_forced_run_samples_the_given_tokens_and_records_every_position():
    requests = make_workload(TINY, 3, 4, seed=2, max_prompt=20)
    free = LogitRecorder()
    outputs = Engine(TINY, "reference", "cpu").run(requests, sampler=free).outputs
    assert set(free.logits) == {(r, i) for r, out in enumerate(outputs) for i in range(len(out))}
    assert all(int(free.logits[(r, i)].argmax()) == t for r, out in enumerate(outputs) for i, t in enumerate(out))
    # another run fed arbitrary tokens (none the stop token) generates exactly them
    forced_tokens = [[(7 * r + i) % 200 for i in range(4)] for r in range(3)]
    forced = LogitRecorder(forced_tokens)
    assert Engine(TINY, "reference", "cpu").run(requests, sampler=forced).outputs == forced_tokens
    assert forced.logits[(0, 0)].equal(free.logits[(0, 0)])  # the first position sees the same prompt
    assert not forced.logits[(0, 1)].equal(free.logits[(0, 1)])  # later ones see the forced tokens


def test_compare_logits_measures_error_agreement_and_the_margin_where_argmaxes_differ():
    reference = {(0, 0): torch.tensor([1.0, 3.0, 2.9]), (0, 1): torch.tensor([5.0, 0.0, -5.0]),
                 (1, 0): torch.tensor([0.0, 1.0, 0.0])}
    ours = {(0, 0): torch.tensor([1.0, 2.9, 3.0]), (0, 1): torch.tensor([5.25, 0.0, -5.0]),
            (2, 0): torch.tensor([9.0, 0.0, 0.0])}  # (1, 0) and (2, 0): only one run reached them
    c = compare_logits(ours, reference)
    assert c.positions == 2 and c.top1_agree == 1
    assert c.max_abs == pytest.approx(0.25)
    assert c.max_rel == pytest.approx(0.25 / 5.0)  # row (0, 1): 0.25 of its largest |logit|; row (0, 0): 0.1 / 3
    assert c.widest_disagreement == pytest.approx(0.1)  # the reference's 3.0 against 2.9
    assert c.to_json()["top1_rate"] == 0.5
    with pytest.raises(ValueError, match=r"position \(0, 0\)"):
        compare_logits({(0, 0): torch.zeros(4)}, {(0, 0): torch.zeros(3)})


def _report(exact_outputs=True, **comparisons):
    outputs = [[1, 2], [3, 4]]
    return ModesReport(outputs, outputs if exact_outputs else [[1, 2], [3, 5]], comparisons, 0, 5, [])


def test_the_contract_in_fp32_is_token_identity():
    same = LogitComparison(4, 1e-6, 1e-7, 4, 0.0)
    assert contract_problems(_report(**{"triton vs reference": same}), exact=True) == []
    problems = contract_problems(_report(False, **{"triton vs reference": LogitComparison(4, 0.5, 0.1, 3, 0.01)}),
                                 exact=True)
    assert problems == ["fp32: 1/2 requests token-identical to the reference",
                        "fp32: teacher-forced argmax agrees at 3/4 positions"]


def test_the_contract_in_bf16_is_twice_the_references_own_error():
    """Triton's distance to the fp32 model at most twice the bf16 reference's; its distance to the
    reference is then bounded by the triangle inequality, and its argmax differences by the margins."""
    floor = LogitComparison(4, 0.3, 0.02, 3, 0.05)
    as_good = LogitComparison(4, 0.6, 0.04, 3, 0.05)  # exactly 2 x: within
    assert BF16_FACTOR == 2.0
    assert contract_problems(_report(False, **{"triton vs reference": LogitComparison(4, 0.9, 0.06, 3, 0.5),
                                               "reference vs fp32": floor, "triton vs fp32": as_good}),
                             exact=False) == []
    worse = LogitComparison(4, 0.61, 0.04, 4, 0.0)
    (far,) = contract_problems(_report(**{"triton vs reference": LogitComparison(4, 0.2, 0.01, 4, 0.0),
                                          "reference vs fp32": floor, "triton vs fp32": worse}), False)
    assert far == "Triton's logits are 0.61 from the fp32 model, more than 2 x the bf16 reference's own error 0.3"
    # no floor measured: nothing to hold bf16 logits to
    assert contract_problems(_report(**{"triton vs reference": worse}), False) == []


def test_the_triangle_bound_holds_logit_by_logit():
    """What the contract derives: within 2E of the fp32 model and the reference within E of it, Triton is
    within 3E of the reference, and a differing argmax sits on a reference margin of at most 2 x that."""
    g = torch.Generator().manual_seed(0)
    fp32 = {(0, i): torch.randn(50, generator=g) * 5 for i in range(200)}
    reference = {k: v + (torch.rand(50, generator=g) * 2 - 1) * 0.1 for k, v in fp32.items()}
    triton = {k: v + (torch.rand(50, generator=g) * 2 - 1) * 0.2 for k, v in fp32.items()}
    e = compare_logits(reference, fp32).max_abs
    assert compare_logits(triton, fp32).max_abs <= 2 * e + 0.01
    ours = compare_logits(triton, reference)
    assert ours.max_abs <= compare_logits(triton, fp32).max_abs + e
    assert ours.top1_agree < ours.positions and ours.widest_disagreement <= 2 * ours.max_abs


def test_compare_modes_holds_for_tiny_in_fp32():
    report = compare_modes(TINY, make_workload(TINY, 2, 3, seed=4, max_prompt=24))
    assert report.problems == [] and report.identical_requests == 2
    ours = report.comparisons["triton vs reference"]
    assert set(report.comparisons) == {"triton vs reference"}  # fp32: no floor run
    assert ours.positions == 6 and ours.top1_agree == 6 and ours.max_abs < 1e-3


def test_the_floor_is_the_same_weights_computed_in_fp32():
    """``weights_dtype``: bf16 weights, fp32 arithmetic. The weights equal the bf16 engine's exactly
    (upcast), so what the floor measures is arithmetic alone."""
    model = dataclasses.replace(MODELS["tiny"], num_layers=1)
    bf16 = EngineConfig(model, max_batch_size=2, max_num_tokens=16, num_blocks=8, dtype=torch.bfloat16)
    rounded = Engine(bf16, "reference", "cpu")
    upcast = Engine(dataclasses.replace(bf16, dtype=torch.float32), "reference", "cpu", weights_dtype=torch.bfloat16)
    assert upcast.model.lm_head.dtype == torch.float32
    assert torch.equal(upcast.model.lm_head, rounded.model.lm_head.float())
    assert torch.equal(upcast.model.layers[0]["experts_down"], rounded.model.layers[0]["experts_down"].float())
    plain = Engine(dataclasses.replace(bf16, dtype=torch.float32), "reference", "cpu")
    assert not torch.equal(plain.model.lm_head, upcast.model.lm_head)  # fp32 draws, never rounded
    requests = make_workload(bf16, 2, 2, seed=1, max_prompt=8)
    low = LogitRecorder()
    outputs = serve(bf16, requests, mode="reference", sampler=low).result.outputs
    high = LogitRecorder(outputs)
    serve(dataclasses.replace(bf16, dtype=torch.float32), requests, mode="reference", weights_dtype=torch.bfloat16,
          sampler=high)
    floor = compare_logits(low.logits, high.logits)
    assert floor.positions == 4 and 0 < floor.max_abs < 0.1 * max(float(v.abs().max()) for v in high.logits.values())


@pytest.mark.slow
def test_engine_modes_prints_both_tables_and_the_verdict(tmp_path):
    """``bench/engine_modes.py`` on the CPU (tiny, fp32): the free-running table, the teacher-forced logit
    table, and the contract's verdict; its JSON carries the figures."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    bench = Path(__file__).resolve().parent.parent / "bench" / "engine_modes.py"
    out = tmp_path / "modes.json"
    proc = subprocess.run([sys.executable, str(bench), "--config", "tiny", "--requests", "2", "--max-tokens", "3",
                           "--max-prompt", "12", "--json", str(out)], capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    text = proc.stdout
    assert "Engine modes, tiny (float32), free-running: 2/2 requests token-identical" in text
    assert "| runs                | positions | max abs error |" in text
    assert "| triton vs reference | 6         |" in text and "| 6/6             |" in text
    assert text.rstrip().endswith("contract holds: fp32, token-identical")
    figures = json.loads(out.read_text())
    assert figures["problems"] == [] and figures["logits"]["triton vs reference"]["top1_rate"] == 1.0
