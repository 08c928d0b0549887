"""An incremental warm-up of a fully warmed cache: how long "nothing to do" takes.

    python bench/noop_warmup.py [--targets sm90,gfx942,sm100] [--repeat 5]

Warms the shipped specs once, then times no-op warm-ups: in-process (load specs, plan from the plan
store, verify every entry's files against the manifest's content hashes) and as a whole command
(including Python, torch and Triton start-up). Re-tracing everything (``--replan``) is the baseline.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(__file__))
from _common import table, tritonwarm  # noqa: E402


def in_process(cache: Path, targets: str, replan: bool) -> tuple[float, int]:
    from tritonwarm.cli import SHIPPED_SPECS
    from tritonwarm.jit.core.targets import resolve_targets
    from tritonwarm.jit.pipeline.plan import plan
    from tritonwarm.jit.pipeline.specs import load_specs
    from tritonwarm.jit.pipeline.warmup import warm

    start = time.perf_counter()
    variants = 0
    specs = load_specs([SHIPPED_SPECS])
    for target in resolve_targets(targets):
        result = warm(plan(specs, target, cache_dir=None if replan else cache), cache)
        assert result.compiled == 0 and result.failed == 0, result
        variants += result.planned
    return time.perf_counter() - start, variants


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--targets", default="sm90,gfx942,sm100")
    p.add_argument("--repeat", type=int, default=5)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        cache = Path(tmp)
        tritonwarm("warmup", "--target", args.targets, "--cache-dir", str(cache), "--json")
        in_process(cache, args.targets, replan=False)  # imports and first-call costs, not measured
        noop = min(in_process(cache, args.targets, replan=False) for _ in range(args.repeat))
        replan = min(in_process(cache, args.targets, replan=True) for _ in range(max(1, args.repeat // 2)))
        wall = min(tritonwarm("warmup", "--target", args.targets, "--cache-dir", str(cache), "--json")[0]
                   for _ in range(max(1, args.repeat // 2)))
    n = noop[1]
    table(f"No-op warm-up of a warmed cache ({n} variants, {args.targets})",
          ["what", "total", "per variant", "vs re-tracing"],
          [["in-process, plans from the plan store", f"{noop[0] * 1000:.0f} ms", f"{noop[0] / n * 1000:.2f} ms",
            f"{noop[0] / replan[0]:.2f}x"],
           ["in-process, re-tracing every spec (--replan)", f"{replan[0] * 1000:.0f} ms",
            f"{replan[0] / n * 1000:.2f} ms", "1.00x"],
           ["whole command (python -m tritonwarm warmup)", f"{wall:.2f} s", f"{wall / n * 1000:.1f} ms", "-"]],
          f"python bench/noop_warmup.py --targets {args.targets} --repeat {args.repeat}")


if __name__ == "__main__":
    main()
