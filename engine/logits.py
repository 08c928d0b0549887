"""Teacher-forced logits: two runs fed the same tokens, their logits compared position by position.

Free-running greedy decoding compares tokens, and in bf16 one flipped near-tie makes every later
token differ, whatever the kernels do after it. With teacher forcing every run samples the tokens of
one run (the reference's), so each generated position sees the same inputs in every run, and what
differs is only how each run computes: per position, the largest absolute error, the error relative
to the row's largest logit, whether the argmax agrees, and, where it does not, the reference's
margin between its two best logits (a disagreement on a near-tie is rounding; on a wide margin, a
bug). docs/engine.md states the tolerances.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace

import torch

Position = tuple[int, int]  # (request id, index of the generated token)


class LogitRecorder:
    """A sampler for ``Engine.run``: records each sampled row's logits (fp32, on the CPU) and picks
    the token of ``forced`` (request id order) at that position, or the argmax where none is given."""

    def __init__(self, forced: list[list[int]] | None = None):
        self.forced = forced
        self.logits: dict[Position, torch.Tensor] = {}

    def __call__(self, request_ids: list[int], indices: list[int], logits: torch.Tensor) -> list[int]:
        rows = logits.detach().float().cpu()  # a copy: a graph's output buffer is overwritten next step
        tokens = []
        for request_id, index, row in zip(request_ids, indices, rows, strict=True):
            self.logits[(request_id, index)] = row
            forced = self.forced[request_id] if self.forced is not None else ()
            tokens.append(forced[index] if index < len(forced) else int(row.argmax()))
        return tokens


@dataclass(frozen=True)
class LogitComparison:
    positions: int  # generated positions compared (both runs sampled them)
    max_abs: float  # largest |ours - reference| over every logit of every position
    max_rel: float  # largest, over positions, of max |ours - reference| / max |reference|
    top1_agree: int  # positions whose argmax is the same
    widest_disagreement: float  # the reference's top-1 minus top-2 logit, largest where the argmaxes differ (0: none)

    @property
    def top1_rate(self) -> float:
        return self.top1_agree / self.positions if self.positions else 1.0

    def to_json(self) -> dict:
        return {**asdict(self), "top1_rate": self.top1_rate}


def compare_logits(ours: dict[Position, torch.Tensor], reference: dict[Position, torch.Tensor]) -> LogitComparison:
    """Every position both runs sampled; a position only one of them reached (a run that stopped
    early) is not compared."""
    common = sorted(ours.keys() & reference.keys())
    max_abs = max_rel = widest = 0.0
    agree = 0
    for position in common:
        a, b = ours[position].double(), reference[position].double()
        if a.shape != b.shape:
            raise ValueError(f"position {position}: logits of {tuple(a.shape)} against {tuple(b.shape)}")
        error = float((a - b).abs().max())
        max_abs = max(max_abs, error)
        max_rel = max(max_rel, error / max(float(b.abs().max()), 1e-30))
        if int(a.argmax()) == int(b.argmax()):
            agree += 1
        else:
            top2 = b.topk(2).values if b.numel() > 1 else b.repeat(2)
            widest = max(widest, float(top2[0] - top2[1]))
    return LogitComparison(len(common), max_abs, max_rel, agree, widest)


# The contract for bf16 (docs/engine.md). E: the largest logit error of the bf16 reference against the
# same weights in fp32, measured in the same run. Triton rounds where bf16 arithmetic rounds, in
# another order (and its attention rounds softmax probabilities to bf16 before the value product), so
# its own error is of E's size: it must stay within BF16_FACTOR * E of the fp32 model. Its distance to
# the reference then follows by the triangle inequality: at most (BF16_FACTOR + 1) * E. A kernel that
# accumulated in bf16 or computed something else (a routing tie broken otherwise) exceeds it.
BF16_FACTOR = 2.0


@dataclass
class ModesReport:
    """Both modes on one workload: free-running tokens, and teacher-forced logits compared."""

    reference_outputs: list[list[int]]
    triton_outputs: list[list[int]]
    comparisons: dict[str, LogitComparison]  # "triton vs reference", and "... vs fp32" for a config in bf16/fp16
    triton_compiles: int
    triton_cache_hits: int
    problems: list[str]  # where the contract does not hold; empty when it does

    @property
    def identical_requests(self) -> int:
        return sum(a == b for a, b in zip(self.triton_outputs, self.reference_outputs, strict=True))


def compare_modes(config, requests, *, policy: str = "off", cache_dir=None, floor: bool = True) -> ModesReport:
    """Run ``requests`` in the reference mode (greedy, logits recorded), in Triton mode free-running
    (its tokens, compiles and cache hits) and teacher-forced on the reference's tokens; for a config
    not in fp32, with ``floor``, the reference once more in fp32 with the same weights, teacher-forced:
    the size of bf16 rounding's own effect. One engine at a time (``serve`` drops each)."""
    from .runner import serve

    reference = LogitRecorder()
    reference_outputs = serve(config, requests, mode="reference", sampler=reference).result.outputs
    free = serve(config, requests, mode="triton", policy=policy, cache_dir=cache_dir)
    forced = LogitRecorder(reference_outputs)
    serve(config, requests, mode="triton", policy=policy, cache_dir=cache_dir, sampler=forced)
    comparisons = {"triton vs reference": compare_logits(forced.logits, reference.logits)}
    exact = config.dtype == torch.float32
    if floor and not exact:
        fp32 = LogitRecorder(reference_outputs)
        serve(replace(config, dtype=torch.float32), requests, mode="reference", sampler=fp32,
              weights_dtype=config.dtype)
        comparisons["reference vs fp32"] = compare_logits(reference.logits, fp32.logits)
        comparisons["triton vs fp32"] = compare_logits(forced.logits, fp32.logits)
    report = ModesReport(reference_outputs, free.result.outputs, comparisons, free.serve_compiles,
                         free.monitor.hits, [])
    report.problems = contract_problems(report, exact)
    return report


def contract_problems(report: ModesReport, exact: bool) -> list[str]:
    """fp32: token-identical and every teacher-forced argmax the same. Otherwise, with E the bf16
    reference's own error: Triton within ``BF16_FACTOR * E`` of the fp32 model. Then, logit by logit,
    it lies within ``(BF16_FACTOR + 1) * E`` of the reference, and where an argmax differs the
    reference's margin is at most twice that: a near-tie."""
    if exact:
        ours = report.comparisons["triton vs reference"]
        problems = []
        if report.identical_requests != len(report.reference_outputs):
            problems.append(f"fp32: {report.identical_requests}/{len(report.reference_outputs)} requests "
                            "token-identical to the reference")
        if ours.top1_agree != ours.positions:
            problems.append(f"fp32: teacher-forced argmax agrees at {ours.top1_agree}/{ours.positions} positions")
        return problems
    floor = report.comparisons.get("reference vs fp32")
    if floor is None:
        return []  # no measure of bf16's own error in this run: nothing to hold the logits to
    problems = []
    accuracy = report.comparisons["triton vs fp32"].max_abs
    if accuracy > BF16_FACTOR * floor.max_abs:
        problems.append(f"Triton's logits are {accuracy:.4g} from the fp32 model, more than {BF16_FACTOR:g} x the "
                        f"bf16 reference's own error {floor.max_abs:.4g}")
    return problems
