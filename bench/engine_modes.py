"""Token identity of the engine's two modes on this machine: the Triton kernels against their
PyTorch references, same config, weights, workload and greedy sampling.

    python bench/engine_modes.py [--config tiny] [--requests 4] [--max-tokens 8] [--json PATH]

Each mode runs in its own process through ``tritonwarm engine run --json`` (the Triton mode under
``--jit-policy`` as given, so on a warmed cache it also shows that serving compiled nothing). The
table gives, per request, how many generated tokens agree before the first difference.
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
from _common import save_json, table, tritonwarm  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default="tiny")
    p.add_argument("--requests", type=int, default=4)
    p.add_argument("--max-tokens", type=int, default=8)
    p.add_argument("--jit-policy", default="warn", choices=("off", "warn", "error"))
    p.add_argument("--json", metavar="PATH", help="also write both runs' outputs here")
    args = p.parse_args()
    common = ["engine", "run", "--json", "--config", args.config, "--requests", str(args.requests),
              "--max-tokens", str(args.max_tokens)]
    runs = {}
    for mode in ("triton", "reference"):
        wall, runs[mode] = tritonwarm(*common, "--mode", mode, "--jit-policy", args.jit_policy)
        runs[mode]["wall_s"] = wall
    rows, same = [], 0
    for index, (ours, ref) in enumerate(zip(runs["triton"]["outputs"], runs["reference"]["outputs"], strict=True)):
        agree = next((i for i, (a, b) in enumerate(zip(ours, ref, strict=True)) if a != b), len(ref))
        same += ours == ref
        rows.append([index, len(ref), agree, "identical" if ours == ref else f"first difference at {agree}"])
    triton_run = runs["triton"]
    table(f"Engine modes, {args.config}: {same}/{len(rows)} requests token-identical; Triton mode compiled "
          f"{triton_run['serve_compiles']} variants while serving ({triton_run['cache_hits']} cache hits)",
          ["request", "tokens", "agreeing prefix", "result"], rows,
          f"python bench/engine_modes.py --config {args.config} --requests {args.requests} "
          f"--max-tokens {args.max_tokens} --jit-policy {args.jit_policy}")
    save_json(args.json, {"identical_requests": same, "requests": len(rows), "runs": runs})
    if same != len(rows):
        sys.exit(1)


if __name__ == "__main__":
    main()
