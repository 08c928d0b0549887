"""Warm-up throughput for the shipped specs: serial vs a process pool, the whole command's wall time
against its phases (start-up, tracing, compiling), and compile time per kernel.

    python bench/warmup_throughput.py [--targets sm90,sm100,gfx942,gfx950,sm80] [--jobs 2] [--repeat 1]

Each run starts from an empty cache and re-traces (``--replan``), so runs are comparable; serial
and parallel runs alternate, and the table reports the best of each (min is the least noisy).
Goals: at many jobs the wall time is at most 1.5x the compile phase (start-up and tracing do not
dominate), and ``--jobs 2`` is at least 1.6x faster than ``--jobs 1`` in wall time on 2 cores.
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
    p.add_argument("--targets", default="sm90,sm100,gfx942,gfx950,sm80")
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--repeat", type=int, default=1)
    args = p.parse_args()
    runs = collections.defaultdict(list)
    last = None
    for _ in range(args.repeat):
        for jobs in (1, args.jobs):
            with tempfile.TemporaryDirectory() as cache:
                wall, out = tritonwarm("warmup", "--target", args.targets, "--cache-dir", cache, "--jobs", str(jobs),
                                       "--replan", "--json")
                assert out["failed"] == 0 and out["compiled"] == out["planned"], out
                runs[jobs].append((wall, out["seconds"], out.get("trace_seconds", 0.0), out["planned"]))
                if jobs == 1:
                    _, last = tritonwarm("list", "--cache-dir", cache, "--json")
    serial, parallel = min(runs[1]), min(runs[args.jobs])
    variants = serial[3]
    command = f"python bench/warmup_throughput.py --targets {args.targets} --jobs {args.jobs} --repeat {args.repeat}"
    rows = []
    for jobs, (wall, compile_s, trace_s, _) in ((1, serial), (args.jobs, parallel)):
        rows.append([jobs, variants, f"{wall:.1f}", f"{trace_s:.1f}", f"{compile_s:.1f}",
                     f"{wall - trace_s - compile_s:.1f}", f"{wall / compile_s:.2f}", f"{variants / wall:.1f}",
                     f"{serial[0] / wall:.2f}x"])
    table(f"Warm-up throughput, shipped specs for {args.targets}, empty cache each run",
          ["jobs", "variants", "wall (s)", "tracing (s)", "compiling (s)", "start-up and rest (s)",
           "wall / compiling", "variants / s (wall)", "wall speed-up"], rows, command)
    print(f"\ngoal: wall <= 1.5x compiling at {args.jobs} jobs: {parallel[0] / parallel[1]:.2f}x "
          f"({'met' if parallel[0] <= 1.5 * parallel[1] else 'not met'}); --jobs {args.jobs} >= 1.6x faster than "
          f"--jobs 1 in wall time: {serial[0] / parallel[0]:.2f}x "
          f"({'met' if serial[0] >= 1.6 * parallel[0] else 'not met'}); {os.cpu_count()} cores")
    per_kernel = collections.defaultdict(list)
    for entry in last:
        per_kernel[(entry["target"], entry["kernel"].rsplit(".", 1)[-1])].append(entry["compile_seconds"] or 0.0)
    rows = [[t, k, len(v), f"{1000 * sum(v) / len(v):.0f}", f"{1000 * max(v):.0f}"]
            for (t, k), v in sorted(per_kernel.items())]
    table("Compile time per variant, by kernel (serial run)", ["target", "kernel", "variants", "mean ms", "max ms"],
          rows, "python bench/warmup_throughput.py")


if __name__ == "__main__":
    main()
