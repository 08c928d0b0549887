"""The ``tritonwarm`` command: argument parsing and printing only; the work is in ``tritonwarm.jit``.

Exit codes: 0 ok, 1 a check found a problem, 2 bad input (one line on stderr, no traceback;
set ``TRITONWARM_DEBUG=1`` to see one).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import traceback
from pathlib import Path

SHIPPED_SPECS = Path(__file__).resolve().parent / "warmup_specs"


class UsageError(Exception):
    """Bad input: reported in one line, exit code 2."""


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return args.func(args)
    except KeyboardInterrupt:
        print("tritonwarm: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `tritonwarm list | head`: the reader left; say nothing more
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except Exception as e:  # every error a user can cause ends here, as one line
        if os.environ.get("TRITONWARM_DEBUG"):
            traceback.print_exc()
        print(f"tritonwarm: error: {_one_line(e)}", file=sys.stderr)
        return 2


def _one_line(e: Exception) -> str:
    """The error's own message on one line; its type only where the message says too little."""
    if isinstance(e, KeyError) and e.args:
        text = str(e.args[0])  # str(KeyError) wraps the message in quotes
    elif isinstance(e, (LookupError, ValueError, OSError, RuntimeError)) and str(e):
        text = str(e)
    else:
        text = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
    return " ".join(text.split())


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tritonwarm", description="Warm Triton's compile cache ahead of time.")
    sub = p.add_subparsers(metavar="COMMAND")

    w = sub.add_parser("warmup", help="compile every variant the specs plan into Triton's cache")
    _spec_args(w)
    w.add_argument("--jobs", "-j", type=int, default=os.cpu_count() or 1,
                   help="compile in this many processes (default: the machine's cores)")
    w.add_argument("--binary-only", action="store_true",
                   help="keep only what the runtime loads (cubin/hsaco + metadata), not the IR")
    w.add_argument("--replan", action="store_true",
                   help="trace every spec again even where its inputs did not change")
    w.add_argument("--no-verify-collapse", action="store_true",
                   help="skip the extra traces that prove each collapsed axis sound")
    w.set_defaults(func=cmd_warmup)

    c = sub.add_parser("check", help="plan vs cache: missing, stale, corrupt variants; unreachable rows")
    _spec_args(c)
    c.add_argument("--trace", metavar="RECORD",
                   help="instead: a dispatch record (engine run --record) vs the cache: runtime misses and "
                        "warmed variants the workload never used")
    c.set_defaults(func=cmd_check)

    ls = sub.add_parser("list", help="one row per warmed variant")
    ls.add_argument("--kernel", help="only kernels whose name contains this")
    ls.add_argument("--target", help="only this target")
    _cache_args(ls)
    ls.set_defaults(func=cmd_list)

    sh = sub.add_parser("show", help="one warmed variant in full, or its IR")
    sh.add_argument("variant", help="variant id (a prefix of it works) from `tritonwarm list`")
    from .jit.warmup import IR_KINDS

    sh.add_argument("--ir", choices=IR_KINDS, help="print this intermediate representation")
    _cache_args(sh)
    sh.set_defaults(func=cmd_show)

    du = sub.add_parser("du", help="disk use per kernel and target")
    _cache_args(du)
    du.set_defaults(func=cmd_du)

    pr = sub.add_parser("prune", help="remove variants no spec plans, a record never used, or of other Tritons")
    pr.add_argument("specs", nargs="*", metavar="SPEC_OR_DIR", help="specs for --unplanned (default: shipped)")
    pr.add_argument("--target", help="only this target")
    pr.add_argument("--unplanned", action="store_true", help="variants none of the specs plans")
    pr.add_argument("--unused", metavar="RECORD", help="variants this dispatch record (JSONL) never launched")
    pr.add_argument("--other-versions", action="store_true", help="entries compiled by another Triton version")
    pr.add_argument("--dry-run", action="store_true", help="list what would go, remove nothing")
    _cache_args(pr)
    pr.set_defaults(func=cmd_prune)

    from .engine.cli import add_engine_parser

    add_engine_parser(sub)

    t = sub.add_parser("targets", help="the targets tritonwarm compiles for")
    t.add_argument("--json", action="store_true")
    t.set_defaults(func=cmd_targets)
    return p


def _cache_args(p):
    p.add_argument("--cache-dir", help="cache directory (default: $TRITONWARM_CACHE_DIR, $TRITON_CACHE_DIR, "
                                       "or the user cache dir)")
    p.add_argument("--json", action="store_true", help="machine-readable output")


def _spec_args(p):
    p.add_argument("specs", nargs="*", metavar="SPEC_OR_DIR",
                   help="YAML specs or directories of them (default: the shipped warmup_specs/, unless "
                        "--engine-config is given)")
    p.add_argument("--engine-config", metavar="CONFIG",
                   help="also (or, without specs, only) what this engine config launches: a preset "
                        "(tiny, deepseek-v2-lite) or a YAML/JSON file")
    p.add_argument("--target", help="comma-separated: sm80, sm90, sm100, sm120, gfx942, gfx950, ... or local "
                                    "(default: this machine's GPU)")
    _cache_args(p)


# --------------------------------------------------------------------------- commands


def _prepare(args):
    from .jit.cache import resolve_cache_dir
    from .jit.specs import load_specs
    from .jit.targets import resolve_targets

    if os.environ.get("TRITON_INTERPRET") == "1":
        raise UsageError("TRITON_INTERPRET=1 is set: nothing compiles under the interpreter; unset it to warm up")
    targets = resolve_targets(args.target)
    if args.engine_config:
        from .engine.config import load_engine_config

        load_engine_config(args.engine_config)  # bad input fails here, before anything is traced
    specs = load_specs(args.specs) if args.specs else [] if args.engine_config else load_specs([SHIPPED_SPECS])
    return specs, targets, resolve_cache_dir(args.cache_dir)


def _plan(args, specs, target, **kwargs):
    """The specs' plan, plus the engine config's when one is given."""
    from .jit.warmup import plan

    the_plan = plan(specs, target, **kwargs)
    if args.engine_config:
        from .engine.plan import engine_plan

        the_plan.merge(engine_plan(args.engine_config, target))
    return the_plan


def cmd_warmup(args) -> int:
    from .jit.warmup import warm

    specs, targets, cache_dir = _prepare(args)
    if args.jobs < 1:
        raise UsageError(f"--jobs must be at least 1, got {args.jobs}")
    results, problems = [], []
    for target in targets:
        the_plan = _plan(args, specs, target, verify_collapse=not args.no_verify_collapse,
                         cache_dir=None if args.replan else cache_dir)
        problems += the_plan.errors + the_plan.collapse_errors
        with _progress(len(the_plan.variants), f"warming {target.name}", quiet=args.json) as tick:
            result = warm(the_plan, cache_dir, jobs=args.jobs, binary_only=args.binary_only, progress=tick)
        results.append(result)
        problems += result.failures
        if not args.json:
            print(f"{target.name}: {result.planned} planned from {the_plan.rows} rows: "
                  f"{result.compiled} compiled, {result.cached} already cached, {result.failed} failed "
                  f"in {result.seconds:.1f} s")
    totals = {k: sum(getattr(r, k) for r in results) for k in ("planned", "compiled", "cached", "failed")}
    totals["seconds"] = round(sum(r.seconds for r in results), 3)
    if args.json:
        print(json.dumps({**totals, "cache_dir": str(cache_dir), "targets": [r.to_json() for r in results],
                          "problems": problems}, indent=1))
    else:
        print(f"cache: {cache_dir}")
        for line in problems:
            print(f"problem: {line}", file=sys.stderr)
    return 1 if problems else 0


def cmd_check(args) -> int:
    from .jit.warmup import check

    if args.trace:
        return _check_trace(args)
    specs, targets, cache_dir = _prepare(args)
    reports = [check(_plan(args, specs, t), cache_dir) for t in targets]
    if args.json:
        print(json.dumps({"ok": all(r.ok for r in reports), "cache_dir": str(cache_dir),
                          "targets": [r.to_json() for r in reports]}, indent=1))
    else:
        for r in reports:
            status = "ok" if r.ok else "PROBLEMS"
            print(f"{r.target}: {status}: {r.planned} planned, {len(r.missing)} missing, {len(r.stale)} stale, "
                  f"{len(r.corrupt)} corrupt, {len(r.unreachable)} unreachable rows, "
                  f"{len(r.redundant)} redundant rows")
            for m in r.missing:
                print(f"  missing  {m['id']}  {_short(m['kernel'])}  {_args(m['args'])}")
            for m in r.corrupt:
                print(f"  corrupt  {m['id']}  {_short(m['kernel'])}")
            for m in r.stale:
                print(f"  stale    {m['id']}  {_short(m['kernel'] or '?')}  {m['why']}")
            for row in r.unreachable:
                print(f"  unreachable row: {row} launches no kernel")
            for line in r.errors + r.collapse_errors:
                print(f"  error: {line}")
    return 0 if all(r.ok for r in reports) else 1


def _check_trace(args) -> int:
    from .engine.plan import check_trace, format_trace_report
    from .jit.cache import resolve_cache_dir
    from .jit.targets import resolve_target

    target = resolve_target(args.target).name if args.target else None
    report = check_trace(Path(args.trace), resolve_cache_dir(args.cache_dir), target)
    if args.json:
        print(json.dumps(report.to_json(), indent=1))
    else:
        print("\n".join(format_trace_report(report)))
    return 0 if report.ok else 1


def cmd_list(args) -> int:
    from .jit.cache import resolve_cache_dir
    from .jit.warmup import list_variants

    cache_dir = resolve_cache_dir(args.cache_dir)
    rows = list_variants(cache_dir, target=args.target, kernel=args.kernel)
    if args.json:
        print(json.dumps([_public(r) for r in rows], indent=1))
        return 0
    if not rows:
        print(f"no warmed variants in {cache_dir}")
        return 0
    table = [("ID", "TARGET", "KERNEL", "WARPS", "STAGES", "REGS", "SPILL", "SHARED", "ARGS")]
    for r in rows:
        res = r.get("resources") or {}
        table.append((r["id"], r["target"], _short(r["kernel"]), str(r["num_warps"]), str(r["num_stages"]),
                      str(res.get("registers", "-")), str(res.get("local", "-")), str(res.get("shared", "-")),
                      _args(r["args"])))
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]) - 1)]
    for row in table:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths)) + "  " + row[-1])
    return 0


def cmd_show(args) -> int:
    from .jit.cache import resolve_cache_dir
    from .jit.warmup import find_variant, variant_ir

    cache_dir = resolve_cache_dir(args.cache_dir)
    entry = find_variant(cache_dir, args.variant)
    if args.ir:
        print(variant_ir(cache_dir, entry, args.ir))
        return 0
    if args.json:
        print(json.dumps(_public(entry), indent=1))
        return 0
    print(f"variant   {entry['id']}  ({entry['target']})")
    print(f"kernel    {entry['kernel']}")
    print(f"options   num_warps={entry['num_warps']} num_stages={entry['num_stages']}")
    for name, cls in entry["args"].items():
        print(f"  {name:<24} {cls}")
    if entry.get("resources"):
        print("resources " + ", ".join(f"{k}={v}" for k, v in entry["resources"].items()))
    print(f"triton    {entry['triton_version']}, compiled in {entry.get('compile_seconds')} s")
    print(f"entry     {Path(cache_dir) / entry['entry_dir']}")
    print(f"key       {entry['key']}")
    print("rows:")
    for row in entry["rows"]:
        print(f"  {row}")
    return 0


def cmd_du(args) -> int:
    from .jit.cache import resolve_cache_dir
    from .jit.disk import disk_usage

    cache_dir = resolve_cache_dir(args.cache_dir)
    usage = disk_usage(cache_dir)
    if args.json:
        print(json.dumps({"cache_dir": str(cache_dir), **usage}, indent=1))
        return 0
    print(f"{'TARGET':<8} {'KERNEL':<40} {'VARIANTS':>8} {'SIZE':>10}")
    for row in usage["kernels"]:
        print(f"{row['target']:<8} {_short(row['kernel']):<40} {row['variants']:>8} {_mib(row['bytes']):>10}")
    if usage["unmanaged"]["entries"]:
        print(f"{'-':<8} {'(Triton entries no manifest lists)':<40} {usage['unmanaged']['entries']:>8} "
              f"{_mib(usage['unmanaged']['bytes']):>10}")
    print(f"total {_mib(usage['total_bytes'])} in {cache_dir}")
    return 0


def cmd_prune(args) -> int:
    from .jit.cache import manifests, resolve_cache_dir
    from .jit.disk import prune_candidates, remove, used_hashes
    from .jit.specs import load_specs
    from .jit.targets import TARGETS
    from .jit.warmup import plan

    if not (args.unplanned or args.unused or args.other_versions):
        raise UsageError("say what to prune: --unplanned, --unused RECORD and/or --other-versions")
    cache_dir = resolve_cache_dir(args.cache_dir)
    planned = None
    if args.unplanned:
        specs = load_specs(args.specs or [SHIPPED_SPECS])
        names = [args.target] if args.target else [n for n in manifests(cache_dir) if n in TARGETS]
        planned = {n: set(plan(specs, TARGETS[n], verify_collapse=False).variants) for n in names}
    used = used_hashes(Path(args.unused)) if args.unused else None
    doomed = prune_candidates(cache_dir, target=args.target, planned=planned, used=used,
                              other_versions=args.other_versions)
    if not args.dry_run:
        remove(cache_dir, doomed)
    if args.json:
        print(json.dumps({"dry_run": args.dry_run, "removed": doomed,
                          "bytes": sum(d["bytes"] for d in doomed)}, indent=1))
        return 0
    verb = "would remove" if args.dry_run else "removed"
    for d in doomed:
        print(f"{verb}  {d['id']}  {d['target']:<7} {_short(d['kernel'])}  ({d['why']})")
    print(f"{verb} {len(doomed)} variants, {_mib(sum(d['bytes'] for d in doomed))}")
    return 0


def _mib(n: int) -> str:
    return f"{n / 2**20:.2f} MiB"


def cmd_targets(args) -> int:
    from .jit.targets import TARGETS, local_target

    local = local_target()
    rows = [{"name": t.name, "backend": t.backend, "arch": t.arch, "warp_size": t.warp_size,
             "local": local is not None and local.name == t.name} for t in TARGETS.values()]
    if args.json:
        print(json.dumps(rows, indent=1))
    else:
        for r in rows:
            print(f"{r['name']:<8} {r['backend']:<5} {r['arch']}{'  (this machine)' if r['local'] else ''}")
    return 0


# --------------------------------------------------------------------------- printing helpers


def _short(kernel: str) -> str:
    return kernel.rsplit(".", 1)[-1]


def _args(args: dict) -> str:
    """Compact: ``x_ptr:*bf16 n:i32:div16 BLOCK=4096``; only unaligned pointers are marked."""
    parts = []
    for name, cls in args.items():
        if cls.startswith("="):
            parts.append(f"{name}{cls}")
        else:
            parts.append(f"{name}:{cls.replace(' aligned', '').replace(' unaligned', '@unaligned')}")
    return " ".join(parts)


def _public(entry: dict) -> dict:
    return {k: v for k, v in entry.items() if k != "specialization_data"}


class _progress:
    """A tqdm bar on a terminal; silent otherwise (logs and --json stay clean)."""

    def __init__(self, total: int, desc: str, quiet: bool):
        self.bar = None
        if not quiet and sys.stderr.isatty():
            from tqdm import tqdm

            self.bar = tqdm(total=total, desc=desc, unit="variant", file=sys.stderr, leave=False)

    def __enter__(self):
        def tick(variant, outcome):
            if self.bar is not None:
                self.bar.set_postfix_str(f"{_short(variant.kernel)} {outcome}", refresh=False)
                self.bar.update(1)

        return tick

    def __exit__(self, *exc):
        if self.bar is not None:
            self.bar.close()
