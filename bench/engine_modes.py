"""The engine's two modes on this machine: the Triton kernels against their PyTorch references, same
config, weights, workload and greedy sampling.

    python bench/engine_modes.py [--config tiny] [--requests 4] [--max-tokens 8] [--max-prompt N]
                                 [--jit-policy warn] [--no-floor] [--json PATH]

Two tables. Free-running, per request: how many generated tokens agree before the first difference
(the Triton run under ``--jit-policy``, so on a warmed cache it also shows that serving compiled
nothing). Teacher-forced (every run fed the reference's tokens), per pair of runs: the largest
absolute and relative logit error, top-1 agreement, and the reference's widest top-1 margin where
the argmaxes differ. For a config in bf16 the reference runs once more in fp32 with the same weights
(the floor: what bf16 rounding alone does); ``--no-floor`` skips it. The exit status is 1 when the
contract of docs/engine.md does not hold (fp32: token identity; bf16: Triton within 2x the
floor of the fp32 model).
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
from _common import save_json, table  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default="tiny")
    p.add_argument("--requests", type=int, default=4)
    p.add_argument("--max-tokens", type=int, default=8)
    p.add_argument("--max-prompt", type=int, help="longest prompt (default: past the step's token budget, "
                                                  "so long prompts are prefilled in chunks)")
    p.add_argument("--jit-policy", default="warn", choices=("off", "warn", "error"))
    p.add_argument("--no-floor", action="store_true", help="skip the fp32 reference run of a bf16 config")
    p.add_argument("--json", metavar="PATH", help="also write the outputs and figures here")
    args = p.parse_args()
    from tritonwarm.engine.config import load_engine_config
    from tritonwarm.engine.logits import BF16_FACTOR, compare_modes
    from tritonwarm.engine.runner import make_workload

    config = load_engine_config(args.config)
    requests = make_workload(config, args.requests, args.max_tokens, seed=0, max_prompt=args.max_prompt)
    report = compare_modes(config, requests, policy=args.jit_policy, floor=not args.no_floor)
    command = (f"python bench/engine_modes.py --config {args.config} --requests {args.requests} --max-tokens "
               f"{args.max_tokens}" + (f" --max-prompt {args.max_prompt}" if args.max_prompt else "")
               + f" --jit-policy {args.jit_policy}" + (" --no-floor" if args.no_floor else ""))
    rows = []
    for index, (ours, ref) in enumerate(zip(report.triton_outputs, report.reference_outputs, strict=True)):
        agree = next((i for i, (a, b) in enumerate(zip(ours, ref, strict=False)) if a != b), min(len(ours), len(ref)))
        rows.append([index, len(ref), agree, "identical" if ours == ref else f"first difference at {agree}"])
    table(f"Engine modes, {args.config} ({str(config.dtype).removeprefix('torch.')}), free-running: "
          f"{report.identical_requests}/{len(rows)} requests token-identical; Triton mode compiled "
          f"{report.triton_compiles} variants while serving ({report.triton_cache_hits} cache hits)",
          ["request", "tokens", "agreeing prefix", "result"], rows, command)
    logit_rows = [[name, c.positions, f"{c.max_abs:.4g}", f"{c.max_rel:.3g}", f"{c.top1_agree}/{c.positions}",
                   f"{c.widest_disagreement:.4g}" if c.top1_agree < c.positions else "-"]
                  for name, c in report.comparisons.items()]
    table("Teacher-forced logits (every run fed the reference's tokens)",
          ["runs", "positions", "max abs error", "max rel error", "top-1 agreement", "widest margin at a difference"],
          logit_rows, command)
    floor = report.comparisons.get("reference vs fp32")
    if report.problems:
        print("\ncontract does NOT hold: " + "; ".join(report.problems))
    elif floor is not None:
        ours, accuracy = report.comparisons["triton vs reference"], report.comparisons["triton vs fp32"]
        print(f"\ncontract holds: Triton is {accuracy.max_abs:.4g} from the fp32 model, within {BF16_FACTOR:g} x the "
              f"bf16 reference's own error E = {floor.max_abs:.4g}; so {ours.max_abs:.4g} from the reference "
              f"(<= {BF16_FACTOR + 1:g} E)")
    elif config.dtype.itemsize == 4:
        print("\ncontract holds: fp32, token-identical")
    else:
        print("\nno floor measured (--no-floor): the bf16 contract was not checked")
    save_json(args.json, {"config": args.config, "identical_requests": report.identical_requests,
                          "requests": len(rows), "triton_outputs": report.triton_outputs,
                          "reference_outputs": report.reference_outputs,
                          "logits": {k: c.to_json() for k, c in report.comparisons.items()},
                          "serve_compiles": report.triton_compiles, "problems": report.problems})
    if report.problems:
        sys.exit(1)


if __name__ == "__main__":
    main()
