"""Warm-up throughput for the shipped specs: serial vs a process pool, and compile time per kernel.

    python bench/warmup_throughput.py [--targets sm90,gfx942] [--jobs 2] [--repeat 2]

Each run starts from an empty cache and re-traces (``--replan``), so runs are comparable; serial
and parallel runs alternate, and the table reports the best of each (min is the least noisy).
"""

from __future__ import annotations

import argparse
import collections
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(__file__))
from _common import table, tritonwarm  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--targets", default="sm90,gfx942")
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--repeat", type=int, default=2)
    args = p.parse_args()
    runs = collections.defaultdict(list)
    last = None
    for _ in range(args.repeat):
        for jobs in (1, args.jobs):
            with tempfile.TemporaryDirectory() as cache:
                wall, out = tritonwarm("warmup", "--target", args.targets, "--cache-dir", cache, "--jobs", str(jobs),
                                       "--replan", "--json")
                assert out["failed"] == 0 and out["compiled"] == out["planned"], out
                runs[jobs].append((wall, out["seconds"], out["planned"]))
                if jobs == 1:
                    _, last = tritonwarm("list", "--cache-dir", cache, "--json")
    serial, parallel = min(runs[1]), min(runs[args.jobs])
    variants = serial[2]
    table("Warm-up throughput, shipped specs, empty cache each run",
          ["jobs", "variants", "command wall (s)", "compile phase (s)", "variants / s (compile phase)", "speed-up"],
          [[1, variants, f"{serial[0]:.1f}", f"{serial[1]:.1f}", f"{variants / serial[1]:.1f}", "1.00x"],
           [args.jobs, variants, f"{parallel[0]:.1f}", f"{parallel[1]:.1f}", f"{variants / parallel[1]:.1f}",
            f"{serial[1] / parallel[1]:.2f}x (wall {serial[0] / parallel[0]:.2f}x)"]],
          f"python bench/warmup_throughput.py --targets {args.targets} --jobs {args.jobs} --repeat {args.repeat}")
    per_kernel = collections.defaultdict(list)
    for entry in last:
        per_kernel[(entry["target"], entry["kernel"].rsplit(".", 1)[-1])].append(entry["compile_seconds"] or 0.0)
    rows = [[t, k, len(v), f"{1000 * sum(v) / len(v):.0f}", f"{1000 * max(v):.0f}"]
            for (t, k), v in sorted(per_kernel.items())]
    table("Compile time per variant, by kernel (serial run)", ["target", "kernel", "variants", "mean ms", "max ms"],
          rows, "python bench/warmup_throughput.py")


if __name__ == "__main__":
    main()
