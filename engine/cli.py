"""``tritonwarm engine run``: serve a seeded workload and print what was generated and compiled.

Exit codes: 0 ok, 1 a jit-policy violation (the message names the kernel and its variant), 2 bad
input (plain exceptions; ``tritonwarm.cli.main`` prints them as one line).
"""

from __future__ import annotations

import argparse
import json
import sys

# The parser is built for every command (and --help): these mirror jit.serving.monitor.POLICIES and
# engine.ops.OPS (tested equal) so that building it imports neither torch nor Triton.
POLICIES = ("off", "warn", "error")
MODES = ("reference", "triton")
MAX_REQUESTS = 100_000


def add_engine_parser(subparsers) -> None:
    engine = subparsers.add_parser("engine", help="the serving engine built on the kernels")
    sub = engine.add_subparsers(metavar="ENGINE_COMMAND")
    run = sub.add_parser("run", help="serve a seeded workload of requests",
                         formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    run.add_argument("--config", default="tiny", help="preset (tiny, deepseek-v2-lite) or a YAML/JSON config file")
    run.add_argument("--requests", type=int, default=8, help="number of requests in the workload")
    run.add_argument("--max-tokens", type=int, default=8, help="tokens to generate per request")
    run.add_argument("--seed", type=int, default=0, help="workload seed (prompts, lengths, arrival steps)")
    run.add_argument("--mode", choices=MODES, default="triton",
                     help="triton: the kernels; reference: their PyTorch references")
    run.add_argument("--weights", help="safetensors file or directory (default: seeded random weights)")
    run.add_argument("--jit-policy", choices=POLICIES, default="warn",
                     help="a kernel variant missing from the cache: off, warn (log it), error (refuse)")
    run.add_argument("--dry-run", action="store_true",
                     help="meta tensors and fake launches for --target: prove the cache covers the workload")
    run.add_argument("--target", help="the dry run's target (sm90, gfx942, ...)")
    run.add_argument("--cache-dir", help="cache directory (default: $TRITONWARM_CACHE_DIR, else the folder Triton "
                                         "reads: $TRITON_CACHE_DIR, else Triton's default ~/.triton/cache)")
    run.add_argument("--record", metavar="FILE", help="write the dispatch record (JSONL) here")
    run.add_argument("--metrics", metavar="FILE", help="write Prometheus metrics (text format) here")
    run.add_argument("--kv-memory-gib", type=float, metavar="GIB",
                     help="also report how many tokens a KV cache of this many GiB holds in the config's format")
    run.add_argument("--json", action="store_true", help="machine-readable output")
    run.set_defaults(func=cmd_engine_run)
    engine.set_defaults(func=lambda args: engine.print_help() or 2)


def _check_paths(args) -> None:
    """Before anything is served: the weights exist (a dry run reads none, but names the same files),
    and the record and metrics files can be written where they are asked for."""
    from pathlib import Path

    if args.weights and not Path(args.weights).exists():
        raise ValueError(f"--weights {args.weights}: no such file or directory")
    for flag, name in (("--record", args.record), ("--metrics", args.metrics)):
        if not name:
            continue
        path = Path(name)
        if path.is_dir():
            raise ValueError(f"{flag} {name}: is a directory; name a file")
        if not path.parent.is_dir():
            raise ValueError(f"{flag} {name}: {path.parent} is not a directory")


def cmd_engine_run(args) -> int:
    from ..jit.serving.monitor import JitPolicyError
    from .config import load_engine_config
    from .metrics import EngineMetrics
    from .runner import make_workload, serve

    if args.dry_run != bool(args.target):
        raise ValueError("--dry-run and --target go together: a dry run traces for a named target")
    if args.requests < 1 or args.max_tokens < 1:
        raise ValueError("--requests and --max-tokens must be at least 1")
    if args.requests > MAX_REQUESTS:
        raise ValueError(f"--requests {args.requests}: at most {MAX_REQUESTS} (a seeded test workload, "
                         "generated up front)")
    if args.kv_memory_gib is not None and not 0 < args.kv_memory_gib <= 2**20:
        raise ValueError(f"--kv-memory-gib {args.kv_memory_gib}: a size in GiB, more than 0 and at most 2**20")
    _check_paths(args)
    from ..jit.cache.layout import old_default_note

    note = old_default_note(args.cache_dir)
    if note:
        print(f"tritonwarm: {note}", file=sys.stderr)
    config = load_engine_config(args.config)
    requests = make_workload(config, args.requests, args.max_tokens, seed=args.seed)
    from ..jit.cache.layout import resolve_cache_dir
    from ..output import notes_now

    notes_now(resolve_cache_dir(args.cache_dir) / "tritonwarm")  # the input is good: the notes, before the result
    try:
        report = serve(config, requests, mode=args.mode, policy=args.jit_policy,
                       dry_run_target=args.target if args.dry_run else None, cache_dir=args.cache_dir,
                       weights_path=args.weights)
    except JitPolicyError as e:
        print(f"tritonwarm: jit policy error: {' '.join(str(e).split())}", file=sys.stderr)
        return 1
    if args.record:
        report.write_record(args.record)
    if args.metrics:
        metrics = EngineMetrics()
        metrics.observe(report)
        metrics.write(args.metrics)
    result, monitor = report.result, report.monitor
    summary = {
        "config": config.model.name, "mode": args.mode, "target": report.target, "dry_run": report.dry_run,
        "requests": len(requests), "generated_tokens": result.generated_tokens, "steps": result.steps,
        "preemptions": result.preemptions, "seconds": round(result.seconds, 3),
        "tokens_per_second": round(result.generated_tokens / result.seconds, 2) if result.seconds else None,
        "serve_compiles": report.serve_compiles, "serve_compile_seconds": round(monitor.compile_seconds, 3),
        "cache_hits": monitor.hits, "cache_misses": len(monitor.misses),
        "startup_missing": len(report.startup_missing),
        "launches": dict(sorted((k.rsplit(".", 1)[-1], v) for k, v in monitor.launches.items())),
        **kv_cache_summary(config, args.kv_memory_gib),
        "peak_gpu_allocated_bytes": report.peak_gpu_allocated, "peak_gpu_reserved_bytes": report.peak_gpu_reserved,
    }
    if args.json:
        print(json.dumps({"outputs": result.outputs, **summary}, indent=1))
    else:
        for request, output in zip(requests, result.outputs, strict=True):
            print(f"request {request.request_id}: prompt {len(request.prompt)} tokens, arrived at step "
                  f"{request.arrival_step}: {output}")
        fake = " (fake tokens: dry run)" if report.dry_run else ""
        print(f"{summary['generated_tokens']} tokens{fake} in {summary['steps']} steps "
              f"({summary['preemptions']} preemptions), {summary['seconds']} s "
              f"({summary['tokens_per_second']} tokens/s); compiles at serving time: {summary['serve_compiles']} "
              f"({summary['serve_compile_seconds']} s); cache hits {summary['cache_hits']}, "
              f"misses {summary['cache_misses']}")
        print(format_kv_cache_summary(summary))
        if summary["peak_gpu_allocated_bytes"] is not None:
            print(format_gpu_peak(summary))
    return 0


def kv_cache_summary(config, memory_gib: float | None = None) -> dict:
    """The KV cache's format, bytes per token (one layer and all layers) and the tokens it holds: the
    config's ``num_blocks`` and, with ``memory_gib``, a cache of that size."""
    from .kv import kv_cache_bytes_per_token, kv_cache_tokens

    per_token = kv_cache_bytes_per_token(config)
    out = {"kv_cache_dtype": config.kv_cache_dtype, "kv_bytes_per_token_layer": per_token // config.model.num_layers,
           "kv_bytes_per_token": per_token, "kv_cache_tokens": config.num_blocks * config.block_size,
           "kv_cache_bytes": config.num_blocks * config.block_size * per_token}
    if memory_gib is not None:
        out["kv_memory_gib"] = memory_gib
        out["kv_tokens_at_memory"] = kv_cache_tokens(config, int(memory_gib * 2**30))
    return out


def format_kv_cache_summary(summary: dict) -> str:
    from ..output import mib

    line = (f"KV cache {summary['kv_cache_dtype']}: {summary['kv_bytes_per_token_layer']} bytes per token and layer, "
            f"{summary['kv_bytes_per_token']} bytes per token in all layers; {summary['kv_cache_tokens']} tokens in "
            f"{mib(summary['kv_cache_bytes'])}")
    if "kv_tokens_at_memory" in summary:
        line += f"; {summary['kv_memory_gib']:g} GiB hold {summary['kv_tokens_at_memory']} tokens"
    return line


def format_gpu_peak(summary: dict) -> str:
    """The run's peak GPU memory: weights, KV cache, CUDA graphs and activations, from start-up on."""
    return (f"peak GPU memory: {summary['peak_gpu_allocated_bytes'] / 2**20:.1f} MiB allocated by PyTorch "
            f"({summary['peak_gpu_reserved_bytes'] / 2**20:.1f} MiB reserved)")
