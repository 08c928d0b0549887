"""``tritonwarm warmup`` and ``tritonwarm check``: fill the cache from a plan, and prove it covers it."""

from __future__ import annotations

import concurrent.futures
import json
import os
import sys
import time
from pathlib import Path

from ..errors import printable
from ..output import EXAMPLES, examples, fold, fold_rows, plural, remember_notes, say
from .bundle import add_shard_args, shard_of, sharded
from .common import (
    SERVE_AT_HELP,
    UsageError,
    add_spec_args,
    format_args,
    note_where_triton_reads,
    plan_all,
    plan_with_engine,
    prepare,
    progress_bar,
    read_cache_dir,
    serve_at_arg,
    short_kernel,
    target_name,
)
from .env import add_for_args, keyed_for


def add_parsers(sub) -> None:
    w = sub.add_parser("warmup", help="compile every variant the specs plan into Triton's cache")
    add_spec_args(w)
    w.add_argument("--jobs", "-j", type=int, default=os.cpu_count() or 1,
                   help="compile in this many processes (default: the machine's cores)")
    w.add_argument("--binary-only", action="store_true",
                   help="keep only what the runtime loads (cubin/hsaco + metadata), not the IR")
    w.add_argument("--replan", action="store_true",
                   help="trace every spec again even where its inputs did not change")
    w.add_argument("--no-verify-collapse", action="store_true",
                   help="skip the extra traces that prove each collapsed axis sound")
    w.add_argument("--push", metavar="URL",
                   help="then push every planned entry to a shared Redis cache: redis://HOST:PORT[/DB]")
    add_shard_args(w)
    add_for_args(w)
    w.set_defaults(func=cmd_warmup)

    c = sub.add_parser("check", help="plan vs cache: missing variants and why, corrupt ones; unreachable rows")
    add_spec_args(c)
    c.add_argument("--trace", metavar="RECORD",
                   help="instead: a dispatch record (engine run --record) vs the cache: runtime misses and "
                        "warmed variants the workload never used")
    c.add_argument("--remote", metavar="URL",
                   help="instead: the plan vs a shared Redis cache (redis://HOST:PORT[/DB]): missing, corrupt")
    c.add_argument("--serve-at", metavar="PATH",
                   help=SERVE_AT_HELP + ": check the cache as a server that mounts it at PATH reads it")
    c.add_argument("--same-machine", action="store_true",
                   help="a copy of a cache served on this machine, beside the folder it was copied from: entries "
                        "whose files are read from that folder are a note, not a problem")
    c.add_argument("--plain", action="store_true",
                   help="also ask Triton alone: a Python process that imports no tritonwarm module but the kernels' "
                        "rebuilds each planned variant's compile request from the cache's records and counts "
                        "Triton's own cache hits (`plain Triton: N/N hits`); no GPU needed, nothing compiled")
    add_for_args(c)
    c.add_argument("--verbose", "-v", action="store_true",
                   help="one line per missing, corrupt or unreachable variant or row, per row without a stored "
                        "autotune winner, and per row that adds no variant of its own")
    c.set_defaults(func=cmd_check)



@keyed_for
def cmd_warmup(args) -> int:
    if args.jobs < 1:
        raise UsageError(f"--jobs must be at least 1, got {args.jobs}")
    from ..jit.cache import check_cache_dir, refuse_if_served_elsewhere
    from ..jit.cache.env import cache_manager_problem
    from ..jit.cache.marks import warmup_mark
    from ..jit.cache.overlay import refuse_if_overlaid
    from ..jit.pipeline.pool import worker_pool
    from ..jit.pipeline.warmup import warm

    shard = shard_of(args)
    specs, targets, cache_dir = prepare(args)
    check_cache_dir(cache_dir, for_writing=True)
    refuse_if_served_elsewhere(cache_dir)  # before planning, which can take a while
    refuse_if_overlaid(cache_dir)
    manager = cache_manager_problem()
    if manager:  # Triton would write every entry through it, or fail at the first one
        raise UsageError(f"{manager[1]}: the warm-up fills {cache_dir}: unset it for the warm-up")
    store = _remote_store(args.push) if args.push else None  # a bad URL fails before compiling anything
    problems, pushes = [], []
    with warmup_mark(cache_dir), worker_pool(args.jobs, targets) as pool:  # tracing and compiling share the workers
        started = time.perf_counter()
        plans = plan_all(args, specs, targets, pool, verify_collapse=not args.no_verify_collapse,
                         cache_dir=None if args.replan else cache_dir)
        trace_seconds = round(time.perf_counter() - started, 3)
        plans = {name: sharded(shard, the_plan) for name, the_plan in plans.items()}
        started = time.perf_counter()

        def warm_target(target):
            with progress_bar(len(plans[target.name].variants), f"warming {target.name}", quiet=args.json) as tick:
                return warm(plans[target.name], cache_dir, jobs=args.jobs, binary_only=args.binary_only,
                            progress=tick, pool=pool)

        if pool is None or len(targets) == 1 or not pool.started:  # (forking is left to this thread)
            results = [warm_target(target) for target in targets]
        else:  # every target's compiles queue at once: no worker waits for the last compile of a target
            with concurrent.futures.ThreadPoolExecutor(len(targets)) as threads:
                futures = [threads.submit(warm_target, target) for target in targets]
                try:
                    results = [future.result() for future in futures]
                except BaseException:  # a full disk, Ctrl-C: what has not started is not compiled
                    pool.shutdown(wait=False, cancel_futures=True)
                    raise
        compile_seconds = round(time.perf_counter() - started, 3)
    for target, result in zip(targets, results, strict=True):
        the_plan = plans[target.name]
        problems += the_plan.errors + the_plan.collapse_errors + fold_failures(result.failures)
        problems += [p for p in _store_pinned_winners(specs, target, cache_dir) if p not in problems]
        if result.manifest_set_aside:
            print(f"{target.name}: the manifest was damaged (kept as {result.manifest_set_aside}); rebuilt "
                  "from the entries that verify", file=sys.stderr)
        if not args.json:
            failed = plural(result.failed, "variant") + (f" and {plural(len(the_plan.failed_rows), 'row')}"
                                                          if the_plan.failed_rows else "")
            say(f"{target.name}: ", f"{plural(result.planned, 'variant')} planned from {plural(the_plan.rows, 'row')}: "
                f"{result.compiled} compiled, {result.cached} already cached, {failed} failed "
                f"in {result.seconds:.1f} s")
            if result.c_launchers:
                print(f"{target.name}: {result.c_launchers['summary']}")
            if result.pruned:
                from ..jit.pipeline.resources import pruned_line

                say(f"{target.name}: ", pruned_line(target.name, result.pruned))
        if store is not None:
            pushes.append(_push(args, the_plan, cache_dir, store))
            problems += [f"{target.name} {v}: not in the local cache, not pushed" for v in pushes[-1].not_local]
    totals = {k: sum(getattr(r, k) for r in results) for k in ("planned", "compiled", "cached", "failed")}
    totals["failed_rows"] = sum(len(plans[t.name].failed_rows) for t in targets)
    totals["seconds"] = compile_seconds  # the compile phase's wall time (targets overlap in the pool)
    totals["trace_seconds"] = trace_seconds
    if args.json:
        print(json.dumps({**totals, "cache_dir": str(cache_dir), "targets": [r.to_json() for r in results],
                          "pushed": [p.to_json() for p in pushes], "problems": problems}, indent=1))
    else:
        print(f"cache: {cache_dir}")
        for line in fold_rows(problems):
            say("problem: ", line, file=sys.stderr)
    remember_notes(Path(cache_dir) / "tritonwarm")  # its notes, said for the folder it warmed
    return 1 if problems else 0


def fold_failures(failures: list[str]) -> list[str]:
    """Compile failures (``kernel id: error``), one line per error with how many variants it failed and
    of which kernels: a module that cannot be imported again fails every variant alike."""
    def error(line: str) -> str:  # a line of another form (a C launcher's) is its own cause
        variant, _, message = line.partition(": ")
        return message if len(variant.split(" ")) == 2 and not line.startswith("C launcher") else line

    lines = []
    for message, same in fold(failures, error).items():
        if len(same) == 1:
            lines += same
            continue
        kernels = examples(short_kernel(line.split(" ", 1)[0]) for line in same)
        lines.append(f"{len(same)} variants ({kernels}) failed to compile: {message}")
    return lines


def _store_pinned_winners(specs, target, cache_dir) -> list[str]:
    """Rows that pin an autotune config (``config:``) get it stored as Triton's winner with the binaries."""
    if not any(spec.config is not None for spec in specs):
        return []
    from ..jit.adopt.winners import pin_winners

    return pin_winners(specs, target, cache_dir).errors


@keyed_for
def cmd_check(args) -> int:
    from ..jit.cache import check_cache_dir
    from ..jit.pipeline.check import check

    if args.serve_at and (args.trace or args.remote):
        raise UsageError("--serve-at checks the cache folder as a server mounting it elsewhere reads it: "
                         "not with --trace or --remote")
    if args.plain and (args.serve_at or args.trace or args.remote or _keyed_for_a_server(args)):
        raise UsageError("--plain runs Triton on this machine, in its environment, over the folder where it is: "
                         "not with --serve-at, --trace, --remote, --for or --for-wheel (check it on the server)")
    if args.trace:
        if args.specs or args.engine_config or args.remote:
            raise UsageError("--trace checks what a dispatch record launched against the cache: "
                             "it takes no specs, --engine-config or --remote")
        return _check_trace(args)
    if args.remote:
        return _check_remote(args)
    from ..jit.adopt.winners import probe_winners

    specs, targets, cache_dir = prepare(args)
    note = check_cache_dir(cache_dir, for_writing=False)
    serve_at = serve_at_arg(args.serve_at, cache_dir)
    plans = [plan_with_engine(args, specs, t) for t in targets]
    reports = [check(p, cache_dir, serve_at=serve_at, same_machine=args.same_machine) for p in plans]
    for report, target in zip(reports, targets, strict=True):
        report.unknown_winners += probe_winners(specs, target, cache_dir).unknown
    plain = None
    if args.plain:
        from ..jit.pipeline.plain_check import plain_check

        plain = plain_check(plans, cache_dir)
    ok = all(r.ok for r in reports) and (plain is None or plain.ok)
    if args.json:
        print(json.dumps({"ok": ok, "cache_dir": str(cache_dir), "serve_at": str(serve_at) if serve_at else None,
                          "targets": [r.to_json() for r in reports],
                          **({"plain": plain.to_json()} if plain else {})}, indent=1))
    else:
        say("cache: ", f"{cache_dir}" + (f" ({note})" if note else "") +
            (f", read as a server that mounts it at {serve_at} reads it" if serve_at else ""))
        if serve_at is None:  # this machine is not that server
            note_where_triton_reads(cache_dir)
        for r in reports:
            _print_check(r, args.verbose)
        for line in plain.lines() if plain else []:
            say("", line)
        if plain and args.verbose:
            for m in plain.compiles + plain.errors + plain.other_hashes:
                say("  plain  ", f"{m['id']}  {short_kernel(m['kernel'])}  {m['target']}"
                    + (f"  {m['why']}" if m.get("why") else ""))
    return 0 if ok else 1


def _keyed_for_a_server(args) -> bool:
    return bool(getattr(args, "for_env", None) or getattr(args, "for_wheel", None))


def _print_check(r, verbose: bool) -> None:
    """One line per cause, with its count and at most three examples; ``verbose`` adds a line per
    variant or row."""
    from ..jit.pipeline.resources import over_limit_line, pruned_line

    status = "ok" if r.ok else "PROBLEMS"
    unreadable = f"{len(r.unreadable)} unreadable, " if r.unreadable else ""
    over = f"{len(r.over_limits)} over limits, " if r.over_limits else ""
    repeat = f" ({len(r.redundant)} of them only repeat other rows' variants)" if r.redundant else ""
    say(f"{r.target}: ", f"{status}: {plural(r.planned, 'variant')} planned from {plural(r.rows, 'row')}{repeat}, "
        f"{len(r.missing)} missing, {len(r.corrupt)} corrupt, {unreadable}{over}{len(r.unreachable)} unreachable rows")
    if r.interrupted:
        say("  interrupted: ", r.interrupted)
    if r.manifest_problem:
        say("  manifest: ", r.manifest_problem)
    if r.bypassed:
        say("  runtime: ", r.bypassed)
    for line in r.reasons:
        say("  why: ", line)
    if verbose:
        for m in r.unreadable:
            say("  unreadable  ", f"{m['id']}  {short_kernel(m['kernel'])}  {m['why']}")
        for m in r.missing:
            say("  missing  ", f"{m['id']}  {short_kernel(m['kernel'])}  {format_args(m['args'])}")
            if m.get("why"):
                say("           ", m["why"])
        for m in r.corrupt:
            say("  corrupt  ", f"{m['id']}  {short_kernel(m['kernel'])}" + (f"  ({m['why']})" if m.get("why") else ""))
        for m in r.read_elsewhere:
            say("  elsewhere  ", f"{m['id']}  {short_kernel(m['kernel'])}  files in {m['folder']}")
        for m in r.over_limits:
            say("  over limit  ", over_limit_line(r.target, m))
    else:
        for line in summarise_rows(r):
            say("  ", line)
    if r.pruned:
        say("  ", pruned_line(r.target, r.pruned))
    if r.from_fleet:
        say("  ", f"{len(r.from_fleet)} not in the local cache but in the shared cache, intact: Triton fetches "
                  "each at its first lookup (`engine run` at start-up)")
    for other in r.other_environments:
        say("  ", f"also {other['entries']} entries of another environment ({other['id'] or 'unrecorded'}), never "
                  "read by this runtime" + ("" if r.missing else f": {other['differences'][0]}"))
    if r.missing_c_launchers:
        say("  ", f"{len(r.missing_c_launchers)} C launchers missing (Triton would build them at first launch): "
                  f"{r.c_launcher_fix}")
    if r.driver_utilities:
        say("  warning: ", r.driver_utilities)
    if verbose or len(r.unreachable) <= EXAMPLES:
        for row in r.unreachable:
            say("  unreachable row: ", f"{row} launches no kernel")
    else:
        say("  ", f"{len(r.unreachable)} unreachable rows launch no kernel: {examples(r.unreachable)} (--verbose "
                  "lists them)")
    for line in r.errors + r.collapse_errors if verbose else fold_rows(r.errors + r.collapse_errors):
        say("  error: ", line)
    if verbose:
        for line in r.unknown_winners:
            say("  winner unknown: ", line)
    else:
        for line in fold_unknown_winners(r.unknown_winners):
            say("  winner unknown: ", line)
    for line in r.notes:
        say("  note: ", line)
    if verbose:
        for row in r.redundant:
            say("  repeats other rows: ", f"{row} (other rows launch every variant it launches)")


def fold_unknown_winners(lines: list[str]) -> list[str]:
    """Autotuned calls serving would benchmark (``row: kernel: cause``): one line per kernel and cause,
    with how many rows and what stores their winners."""
    from ..jit.adopt.autotune import NO_WINNER, UNKNOWN_WINNER_CAUSES

    def kernel_and_cause(line: str) -> tuple[str, str]:
        cause = next((c for c in UNKNOWN_WINNER_CAUSES if line.endswith(c)), "")
        return line[:len(line) - len(cause)].rstrip(": ").rpartition(": ")[2], cause

    folded = []
    for (kernel, cause), rows in fold(lines, kernel_and_cause).items():
        if not cause:  # not a line of the usual form: as it is
            folded += rows
            continue
        labels = [line[:len(line) - len(cause)].rstrip(": ").rpartition(": ")[0] for line in rows]
        first = f", first {labels[0]}" if labels[0] else ""
        todo = ("serving benchmarks it: store the winners with `tritonwarm tune SPEC --target local` on a GPU of "
                "this target, or pin a config per row (config: in the spec) and warm up" if cause == NO_WINNER
                else cause)
        folded.append(f"{short_kernel(kernel)}: {plural(len(rows), 'row')}{first}: "
                      + ("no stored winner: " if cause == NO_WINNER else "") + todo)
    return folded


def summarise_rows(r) -> list[str]:
    """The variants behind the counts, one line per cause (what ``--verbose`` lists one by one)."""
    lines = []
    causes: dict[str, list[dict]] = {}
    for m in r.missing:
        causes.setdefault(m.get("cause") or "not warmed", []).append(m)
    for cause, rows in causes.items():
        named = examples(sorted({short_kernel(m["kernel"]) for m in rows}))
        lines.append(f"missing: {len(rows)} ({cause}): {named}: {MISSING_ADVICE.get(cause, rows[0].get('why') or '')}"
                     .rstrip(": ") + " (--verbose lists each)")
    damaged = [m for m in r.corrupt if not m.get("why")]
    if damaged:
        lines.append(f"corrupt: {len(damaged)} (files that do not match the manifest): `tritonwarm warmup` "
                     "replaces them (--verbose lists each)")
    for why in sorted({m["why"] for m in r.corrupt if m.get("why")}):
        count = sum(1 for m in r.corrupt if m.get("why") == why)
        lines.append(f"corrupt: {count} ({why}): `tritonwarm warmup` replaces them (--verbose lists each)")
    if r.unreadable:
        lines.append(f"unreadable: {len(r.unreadable)}: {r.unreadable[0]['why']} (--verbose lists each)")
    lines += over_limit_lines(r.target, r.over_limits)
    return lines


def over_limit_lines(target: str, rows: list[dict]) -> list[str]:
    """One line per kernel and resource over the target's limits: the count and the largest need."""
    groups: dict[tuple[str, str], list[tuple[dict, dict]]] = {}
    for row in rows:
        for need in row["needs"]:
            groups.setdefault((short_kernel(row["kernel"]), need["resource"]), []).append((need, row))
    lines = []
    for (kernel, resource), found in groups.items():
        need, row = max(found, key=lambda pair: pair[0]["need"])
        lines.append(f"over limits: {len(found)} ({kernel}): {resource} up to {need['need']:,} {need['unit']} > "
                     f"{need['limit']:,} on {target} ({row['id']}: {row['set_by']}): the GPU refuses to load "
                     f"{'them' if len(found) > 1 else 'it'}: smaller tiles or fewer stages (--verbose lists each)")
    return lines


MISSING_ADVICE = {
    "not warmed": "warm up with these specs (`tritonwarm warmup`)",
    "kernel not warmed": "no variant of the kernel is warmed for this environment: warm a spec that launches it",
    "other class": "a class of their arguments was not warmed: warm a spec row that launches it",
    "compile failed": "the warm-up could not compile them: the why line above says why",
    **dict.fromkeys(("copied", "files gone", "other options", "other code", "other module constants"),
                    "the why line above says why"),
}


def _check_trace(args) -> int:
    from ..engine.plan import check_trace, format_trace_report

    target = target_name(args)
    cache_dir = read_cache_dir(args)  # a missing one: every launch reads as a miss
    report = check_trace(Path(args.trace), cache_dir, target)
    if args.json:
        print(json.dumps(report.to_json(), indent=1))
    else:
        for line in format_trace_report(report, verbose=args.verbose):
            say("", line)
    return 0 if report.ok else 1


def _remote_store(url: str):
    """The shared cache at ``url``, answering now; an unusable URL is bad input (one line, exit 2)."""
    from ..jit.cache.remote import RedisStore, RemoteCacheError, RemoteUnavailable

    store = RedisStore(url)
    try:
        store.ping()
    except RemoteUnavailable as e:
        raise RemoteCacheError(f"cannot reach {e}") from None
    return store


def _push(args, the_plan, cache_dir, store):
    from ..jit.cache.remote import push

    report = push(the_plan.variants.values(), cache_dir, store, the_plan.target.name)
    if not args.json:
        print(f"{report.target}: pushed to {report.url}: {len(report.pushed)} pushed, {len(report.present)} "
              f"already there, {len(report.not_local)} not in the local cache")
    return report


def _check_remote(args) -> int:
    from ..jit.cache.remote import check_remote

    specs, targets, _ = prepare(args)
    store = _remote_store(args.remote)
    reports = [check_remote(plan_with_engine(args, specs, t).variants.values(), store, t.name) for t in targets]
    ok = all(r.ok for r in reports)
    if args.json:
        print(json.dumps({"ok": ok, "targets": [r.to_json() for r in reports]}, indent=1))
        return 0 if ok else 1
    for r in reports:
        trust = f"authenticated with fleet key {r.key_id}" if r.key_id else \
            "unauthenticated: no fleet key (TRITONWARM_REDIS_KEY or TRITONWARM_REDIS_KEY_FILE)"
        say(f"{r.target}: ", f"{'ok' if r.ok else 'PROBLEMS'}: {r.url}: {plural(r.planned, 'variant')} planned, "
            f"{len(r.present)} present, {len(r.missing)} missing, {len(r.corrupt)} corrupt"
            + (f", {len(r.forged)} forged" if r.key_id else "") + f"; {trust}")
        for state in ("missing", "corrupt", "forged"):
            if args.verbose:
                for m in getattr(r, state):
                    say(f"  {state:<8} ", f"{m['id']}  {short_kernel(m['kernel'])}  {format_args(m['args'])}" +
                        (f"  ({printable(m['why'])})" if m.get("why") else ""))
                continue
            for why, rows in fold(getattr(r, state), lambda m: m.get("why") or "").items():
                kernels = examples(short_kernel(m["kernel"]) for m in rows)
                fix = "pushes" if state == "missing" else "replaces"
                say(f"  {state}: ", f"{plural(len(rows), 'variant')} of {kernels}" + (f" ({why})" if why else "")
                    + f": `tritonwarm warmup --push URL` {fix} them (--verbose lists each)")
    return 0 if ok else 1
