"""Cold start vs warm start of the engine: start-up plus the first batch, empty cache vs warmed cache.

Both are measured in the same run, on the same seeded workload (every request arrives at once and
generates one token, so the run ends when the first batch has its first tokens):

- on a CPU (or with ``--dry-run``): the engine's dry run for ``--target`` (meta tensors, fake
  launches), plus, for the empty cache, compiling for real every variant it missed, which is what
  the first batch on that GPU would wait for. The difference is the compile seconds warming avoids.
- on a GPU: time to first token of a real run in a fresh process (Triton's in-memory caches start
  empty), with ``TRITON_CACHE_DIR`` an empty directory vs one warmed by ``engine_plan``.

    python bench/cold_start.py --config deepseek-v2-lite --target sm90 --requests 8
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(__file__))
from _common import table  # noqa: E402


def workload(config, requests: int, seed: int):
    from tritonwarm.engine.runner import make_workload

    return [dataclasses.replace(r, arrival_step=0) for r in make_workload(config, requests, 1, seed=seed)]


def dry_run_start(config, target, requests, cache_dir: Path, plan) -> dict:
    """Engine start + first batch as a dry run, then the compiles a real first batch would wait for."""
    from tritonwarm.engine.runner import serve
    from tritonwarm.jit.pipeline.compile import compile_variant

    t0 = time.perf_counter()
    report = serve(config, requests, policy="off", dry_run_target=target.name, cache_dir=cache_dir)
    traced = time.perf_counter() - t0
    t1 = time.perf_counter()
    for dispatch in report.monitor.misses:
        compile_variant(plan.variants[dispatch.cache_hash], target, cache_dir)
    compile_seconds = time.perf_counter() - t1
    return {"seconds": traced + compile_seconds, "compiles": len(report.monitor.misses),
            "compile_seconds": compile_seconds, "tokens": report.result.generated_tokens}


def gpu_start(args, cache_dir: Path) -> dict:
    """Time to first token in a fresh process whose Triton reads ``cache_dir``."""
    env = dict(os.environ, TRITON_CACHE_DIR=str(cache_dir), TRITONWARM_CACHE_DIR=str(cache_dir))
    cmd = [sys.executable, __file__, "--child", "--config", args.config, "--requests", str(args.requests),
           "--seed", str(args.seed)]
    out = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def child(args) -> None:
    from tritonwarm.engine.config import load_engine_config
    from tritonwarm.engine.runner import serve

    t0 = time.perf_counter()
    config = load_engine_config(args.config)
    report = serve(config, workload(config, args.requests, args.seed), policy="warn")
    result, monitor = report.result, report.monitor
    start = time.perf_counter() - t0 - result.seconds
    print(json.dumps({"seconds": start + (result.first_token_seconds or result.seconds),
                      "compiles": monitor.compiles, "compile_seconds": monitor.compile_seconds,
                      "tokens": result.generated_tokens}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="deepseek-v2-lite")
    parser.add_argument("--target", default="sm90", help="the dry run's target (CPU mode)")
    parser.add_argument("--requests", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dry-run", action="store_true", help="dry-run mode even on a GPU machine")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(args)

    import torch
    from tritonwarm.engine.config import load_engine_config
    from tritonwarm.engine.plan import engine_plan
    from tritonwarm.jit import resolve_target
    from tritonwarm.jit.pipeline.warmup import warm

    config = load_engine_config(args.config)
    on_gpu = torch.cuda.is_available() and not args.dry_run
    target = resolve_target("local" if on_gpu else args.target)
    requests = workload(config, args.requests, args.seed)
    with tempfile.TemporaryDirectory() as empty, tempfile.TemporaryDirectory() as warmed:
        plan = engine_plan(config, target)
        warm_result = warm(plan, Path(warmed))  # deploy time: not part of either measurement
        if on_gpu:
            rows = {"empty": gpu_start(args, Path(empty)), "warmed": gpu_start(args, Path(warmed))}
        else:
            rows = {"empty": dry_run_start(config, target, requests, Path(empty), plan),
                    "warmed": dry_run_start(config, target, requests, Path(warmed), plan)}
    mode = "time to first token (GPU)" if on_gpu else "dry run + the compiles the first batch waits for"
    prompt_tokens = sum(len(r.prompt) for r in requests)
    ratio = rows["empty"]["seconds"] / max(rows["warmed"]["seconds"], 1e-9)
    table(f"Cold vs warm start, {config.model.name} on {target.name}: {len(requests)} requests, {prompt_tokens} "
          f"prompt tokens; {mode}; warm-up at deploy time: {warm_result.planned} variants, "
          f"{warm_result.seconds:.1f} s (not counted)",
          ["cache", "start + first batch (s)", "compiles", "compile s", "cold / warm"],
          [[name, f"{row['seconds']:.2f}", row["compiles"], f"{row['compile_seconds']:.2f}",
            f"{ratio:.1f}x" if name == "empty" else "1.0x"] for name, row in rows.items()],
          " ".join(["python", "bench/cold_start.py", *sys.argv[1:]]))

if __name__ == "__main__":
    main()
