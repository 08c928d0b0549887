"""What each kernel's compiled variants use of their target's launch limits: the largest shared
memory and registers per kernel and target, against the limit, and how close the launch spec's
estimate came (the estimate is what picks a tile before compiling; the binary is the proof).

    python bench/launch_resources.py [--targets sm80,sm90,sm100,sm120,gfx942,gfx950] [--cache-dir DIR]
                                     [--all | --cache-only] [--json PATH]

Plans every shipped spec row, DeepSeek-V3's MLA decode rows (tests/resource_fixtures) and both
engine configs for each target, then compiles one variant per distinct tile (kernel, constexprs,
warps, stages, operand widths: what sets the shared memory; ``--all`` compiles every variant) into
``--cache-dir`` (a temporary folder by default; a warmed cache is reused, only what it lacks is
compiled). No GPU needed: every target compiles on this machine. Prints one row per kernel and
target and a last line with the number of variants over a limit (0 expected).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(__file__))
from _common import save_json, table  # noqa: E402

HERE = Path(__file__).resolve().parent
SPECS = [HERE.parent / "warmup_specs", HERE.parent / "tests" / "resource_fixtures" / "deepseek_v3_mla.yaml"]
TARGETS = "sm80,sm90,sm100,sm120,gfx942,gfx950"


def _tile(variant) -> tuple:
    """What sizes a variant's shared memory: its kernel, constexprs, options and operand widths."""
    constexprs = tuple(sorted((k, c) for k, c in variant.args.items() if c.startswith("=")))
    operands = tuple(sorted({c.split()[0] for c in variant.args.values() if c.startswith("*")}))
    return variant.kernel, constexprs, variant.num_warps, variant.num_stages, operands


def plan_target(target, every: bool):
    from tritonwarm.engine.config import ENGINES
    from tritonwarm.engine.plan import engine_plan
    from tritonwarm.jit.pipeline.plan import plan
    from tritonwarm.jit.pipeline.specs import load_specs

    the_plan = plan(load_specs([p for p in SPECS if p.exists()]), target, verify_collapse=False)
    for config in ("tiny", "deepseek-v2-lite"):
        lite = ENGINES[config]  # every layer launches what the dense ones and the first MoE one do
        layers = lite.model.first_dense_layers + 1
        the_plan.merge(engine_plan(dataclasses.replace(lite, model=dataclasses.replace(lite.model, num_layers=layers)),
                                   target))
    if not every:
        seen = {}
        for cache_hash, variant in the_plan.variants.items():
            seen.setdefault(_tile(variant), cache_hash)
        the_plan.variants = {h: the_plan.variants[h] for h in seen.values()}
    return the_plan


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--targets", default=TARGETS)
    parser.add_argument("--cache-dir", help="compile into (and reuse) this folder; default: a temporary one")
    parser.add_argument("--all", action="store_true", help="compile every variant, not one per tile")
    parser.add_argument("--cache-only", action="store_true",
                        help="plan and compile nothing: the table of what --cache-dir holds for the targets")
    parser.add_argument("--jobs", "-j", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--json", metavar="PATH")
    args = parser.parse_args()
    from tritonwarm.jit.cache import Manifest
    from tritonwarm.jit.core.targets import launch_limits, resolve_targets
    from tritonwarm.jit.core.tile_fit import shared_budget
    from tritonwarm.jit.pipeline.resources import over_limits
    from tritonwarm.jit.pipeline.warmup import warm

    cache_dir = Path(args.cache_dir or tempfile.mkdtemp(prefix="launch-resources-"))
    rows, data, over = [], [], 0
    for target in resolve_targets(args.targets):
        start = time.perf_counter()
        records = Manifest(cache_dir, target.name).read()
        if args.cache_only:
            variants = [(r, r.get("shared_estimate")) for r in records.values()]
            compiled, refused = 0, [r for r in records.values() if over_limits(target, r.get("resources"))]
        else:
            the_plan = plan_target(target, args.all)
            result = warm(the_plan, cache_dir, jobs=args.jobs)
            records = Manifest(cache_dir, target.name).read()
            variants = [(records.get(v.cache_hash) or {}, v.shared_estimate) for v in the_plan.variants.values()]
            compiled, refused = result.compiled, result.over_limits
        over += len(refused)
        limits = launch_limits(target)
        allowance = limits.shared - shared_budget(target)
        kernels: dict[str, dict] = {}
        for record, estimate in variants:
            usage = record.get("resources") or {}
            k = kernels.setdefault(record.get("kernel", "?").rsplit(".", 1)[-1],
                                   {"variants": 0, "shared": 0, "registers": 0, "estimate": None, "measured": None})
            k["variants"] += 1
            k["shared"] = max(k["shared"], usage.get("shared", 0))
            k["registers"] = max(k["registers"], usage.get("registers", 0))
            if estimate is not None and "shared" in usage:
                margin = estimate + allowance - usage["shared"]  # >= 0: the estimate covered it
                if k["estimate"] is None or margin < k["estimate"] - k["measured"]:
                    k["estimate"], k["measured"] = estimate + allowance, usage["shared"]
        for name, k in sorted(kernels.items()):
            estimate = "-" if k["estimate"] is None else f"{k['estimate']:,} for {k['measured']:,}"
            rows.append([target.name, name, k["variants"], f"{k['shared']:,}", f"{limits.shared:,}",
                         k["registers"] or "-", limits.registers_per_thread, estimate])
            data.append({"target": target.name, "kernel": name, **k, "shared_limit": limits.shared,
                         "registers_limit": limits.registers_per_thread})
        print(f"{target.name}: {len(variants)} variants, {compiled} compiled, {len(refused)} over a limit "
              f"({time.perf_counter() - start:.0f} s)", file=sys.stderr)
    table("Largest shared memory and registers per kernel and target (bytes per block; registers per thread: "
          "NVIDIA registers, AMD VGPRs + AGPRs); estimate: the tightest estimate + allowance, for what it bounds",
          ["target", "kernel", "variants", "shared", "limit", "regs", "limit", "tightest estimate"], rows,
          "python bench/launch_resources.py " + " ".join(sys.argv[1:]))
    print(f"\n{over} variants over a limit (cache: {cache_dir})")
    save_json(args.json, {"cache_dir": str(cache_dir), "over_limits": over, "kernels": data})


if __name__ == "__main__":
    main()
