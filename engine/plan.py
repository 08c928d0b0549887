"""The warm-up plan an engine config needs, derived by running the engine's own step on meta tensors.

No spec describes the engine: ``engine_plan`` builds one step per Triton class of the step's runtime
scalars (tokens in the step, requests in the step) and runs ``Engine.execute`` on it under
``capture(target)``; Triton's binder gives the keys. Everything else that picks a variant (dtype,
geometry, block size, which layers have a residual or a dense MLP) is fixed by the config and
reached by every step. ``tritonwarm.jit.pipeline.warmup.warm(plan, cache_dir)`` then warms exactly that.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

from ..jit import Target, class_reps, resolve_target
from ..jit.cache import Manifest, UnreadableEntry, entry_files
from ..jit.cache.remote import fetch_from_fleet, serving_reads_the_fleet
from ..jit.core.dispatch_record import read_record
from ..jit.pipeline.check import check
from ..jit.pipeline.plan import Plan, trace_rows
from ..jit.pipeline.resources import over_limit_line
from ..jit.serving.c_launchers import warm_c_launchers
from ..jit.serving.miss import WarmedNeighbours
from ..jit.serving.monitor import JitPolicyError
from .config import EngineConfig, load_engine_config
from .engine import Engine
from .model import plan_token_counts
from .platform_defaults import for_target
from .scheduler import Request, ScheduledBatch, Sequence

log = logging.getLogger("tritonwarm")
IMPORT_PATH = "tritonwarm.engine.ops"  # defines every kernel the engine launches


def engine_plan(config: str | Path | EngineConfig, target: str | Target) -> Plan:
    """Every variant the engine of ``config`` launches on ``target``; nothing is compiled."""
    source = config if isinstance(config, (str, Path)) else None
    target = resolve_target(target) if isinstance(target, str) else target
    config = for_target(load_engine_config(config), target)  # the target's capture sizes, where unset
    engine = Engine(config, "triton", "meta")
    name = config.model.name
    steps = ((f"engine:{name} {label}", lambda batch=batch: engine.execute(batch))
             for label, batch in representative_steps(config))
    plan, _ = trace_rows(target, IMPORT_PATH, steps)
    if source is not None:
        plan.sources["engine_configs"] = [engine_config_source(source)]
    return plan


def engine_config_source(config: str | Path) -> str:
    """How the plan records where an engine config came from: a preset's name, or the file's absolute path."""
    return str(Path(config).resolve()) if Path(config).is_file() else str(config)


def engine_plan_json(config: str, target_name: str) -> dict:
    """``engine_plan`` for a worker process (``jit.pipeline.pool.worker_pool``): arguments and result as data."""
    return engine_plan(config, target_name).to_json()


def representative_steps(config: EngineConfig):
    """``(label, ScheduledBatch)`` for each class pair of (tokens in the step, requests in it).

    A step of T tokens and B requests: B - 1 requests decode one token each (at a block boundary,
    so they allocate a block) and one prefills the other T - B + 1 prompt tokens. Block ids are
    arbitrary: on meta tensors nothing is read.
    """
    bs = config.block_size
    # Triton's classes of the token count, and the counts where a tile table picks another variant
    token_counts = sorted(set(class_reps(1, config.max_num_tokens).values()) | set(plan_token_counts(config)))
    request_counts = sorted(set(class_reps(1, config.max_batch_size).values()))
    pairs = [(t, b) for t in token_counts for b in request_counts if b <= t]
    # each captured decode size is a step of its own (graph capture at start-up launches exactly it);
    # a config left to its platform's sizes is resolved for the target first (``engine_plan``)
    pairs += [(b, b) for b in config.cuda_graph_batch_sizes or () if (b, b) not in pairs]
    next_block = iter(range(10**9))
    for tokens, requests in pairs:
        work, new_blocks = [], []
        for i in range(requests):
            decoding = i < requests - 1 or tokens == requests
            prompt = [1] * (bs if decoding else tokens - requests + 1)
            seq = Sequence(Request(i, prompt, max_tokens=2), bs)
            if decoding:
                seq.tokens.append(1)
                seq.num_computed = bs
            count = seq.num_pending
            num_blocks = -(-(seq.num_computed + count) // bs)
            seq.block_table = [next(next_block) % config.num_blocks for _ in range(num_blocks)]
            new_blocks += seq.block_table[seq.num_computed // bs:]
            work.append((seq, count))
        kind = "decode" if tokens == requests else "mixed" if requests > 1 else "prefill"
        yield f"{kind} tokens={tokens} batch={requests}", ScheduledBatch(0, work, new_blocks)


def startup_check(config: EngineConfig, target: Target, cache_dir: Path, policy: str) -> list[dict]:
    """The engine's plan against the cache: under ``error`` refuse to start if anything is missing."""
    the_plan = engine_plan(config, target)
    if the_plan.errors:
        raise RuntimeError(f"the engine cannot be traced for {target.name}: {the_plan.errors[0]}")
    if serving_reads_the_fleet():
        _fetch_from_fleet(the_plan, cache_dir)
    report = check(the_plan, cache_dir)
    problems = report.missing + report.corrupt
    message = None
    if problems:
        kernels = sorted({p["kernel"].rsplit(".", 1)[-1] for p in problems})
        message = (f"engine start refused: the {target.name} cache {cache_dir} lacks {len(problems)} of the "
                   f"{report.planned} variants this engine launches ({', '.join(kernels)}); "
                   + _first_reason(report, target))
    elif report.over_limits:  # the GPU refuses to load them: the first step that launches one crashes
        message = (f"engine start refused: {len(report.over_limits)} of the {report.planned} variants this engine "
                   f"launches on {target.name} are over its launch limits: "
                   f"{over_limit_line(target.name, report.over_limits[0])}")
    elif report.missing_c_launchers:  # Triton would run gcc at its first launch (and fail on a read-only cache)
        message = (f"engine start refused: the {target.name} cache {cache_dir} lacks "
                   f"{len(report.missing_c_launchers)} of Triton's C launchers this engine needs: "
                   f"{report.c_launcher_fix}")
    if message:
        if policy == "error":
            raise JitPolicyError(message)
        if policy == "warn":
            log.warning(message)
    return problems


def _fetch_from_fleet(the_plan: Plan, cache_dir: Path) -> None:
    """The plan's entries from the shared cache into the local one, before judging it (what the first
    lookups would fetch, once per machine); where Triton builds a C launcher per signature (3.6), those
    too, for this Python, as ``bundle install`` does: the first request then builds nothing."""
    fetched = [v for v in the_plan.variants.values() if fetch_from_fleet(cache_dir, v.entry_dir, v.entry_name)]
    report = warm_c_launchers(fetched, the_plan.target, cache_dir)
    if report is not None and (report.failed or report.skipped):
        log.warning(f"C launchers for the entries fetched from the shared cache: {report.summary()}")


def _first_reason(report, target: Target) -> str:
    """The first cause that misses many variants at once (another environment, target or kernel code,
    files removed), where ``check`` found one; else the fix for a cache not warmed for this engine."""
    if report.reasons:
        more = len(report.reasons) - 1
        return f"why: {report.reasons[0]}" + (
            f" (and {more} more: `tritonwarm check --engine-config CONFIG --target {target.name}`)" if more else "")
    return f"run `tritonwarm warmup --engine-config CONFIG --target {target.name}`"


# --------------------------------------------------------------------------- dispatch record check


@dataclass
class TraceReport:
    target: str
    launched: int  # distinct variants in the record
    misses: list[dict] = field(default_factory=list)  # launched, not in the cache when launched
    unused: list[dict] = field(default_factory=list)  # warmed for the target, never launched
    warmed_since: list[dict] = field(default_factory=list)  # missed when recorded, warmed into the cache since

    @property
    def ok(self) -> bool:
        return not self.misses

    def to_json(self) -> dict:
        return {**self.__dict__, "ok": self.ok}


def check_trace(record_path: str | Path, cache_dir: str | Path, target: str | None = None) -> TraceReport:
    """A dispatch record (``engine run --record FILE``) against the cache's manifest for its target."""
    lines = read_record(record_path)
    targets = {line["target"] for line in lines}
    if target is None and len(targets) > 1:
        raise ValueError(f"{record_path} holds several targets ({', '.join(sorted(targets))}): pass --target")
    target = target or (targets.pop() if targets else None)
    if target is None:
        raise ValueError(f"{record_path} is empty: no launch was recorded")
    launched = [line for line in lines if line["target"] == target]
    report = TraceReport(target, len(launched))
    recorded = Manifest(Path(cache_dir), target).read()
    neighbours = WarmedNeighbours.of_cache(cache_dir, target, recorded=recorded)
    for line in launched:
        if not line["hit"]:
            miss = {"id": line["variant"], "kernel": line["kernel"], "args": line["args"],
                    "first": line.get("first"), "launches": line.get("launches", 0)}
            if line["cache_hash"] in recorded and _present(Path(cache_dir), recorded[line["cache_hash"]]):
                report.warmed_since.append(miss)  # the manifest says a warm-up put it there: served next time
                continue
            reason = neighbours.why(line)
            report.misses.append({**miss, "why": reason.line if reason else None,
                                  "cause": reason.kind if reason else None})
    used = {line["cache_hash"] for line in launched}
    for cache_hash, entry in sorted(recorded.items()):
        if cache_hash not in used and _present(Path(cache_dir), entry):
            report.unused.append({"id": entry["id"], "kernel": entry["kernel"], "rows": entry.get("rows", [])})
    return report


def _present(cache_dir: Path, entry: dict) -> bool:
    try:
        return entry_files(cache_dir, entry["entry_dir"], entry["entry_name"]) is not None
    except UnreadableEntry:
        return False


def format_trace_report(report: TraceReport, verbose: bool = False) -> list[str]:
    """The summary, then one line per cause with its count and at most three kernels named;
    ``verbose`` lists every variant instead."""
    from ..output import examples, fold, plural

    lines = [f"{report.target}: {'ok' if report.ok else 'MISSES'}: {plural(report.launched, 'variant')} launched, "
             f"{len(report.misses)} missed the cache, {len(report.unused)} warmed but never used"
             + (f", {len(report.warmed_since)} missed when recorded and warmed since" if report.warmed_since else "")]
    if verbose:
        for m in report.misses:
            args = " ".join(f"{k}:{v}" for k, v in m["args"].items())
            lines.append(f"  miss    {m['id']}  {_short(m['kernel'])}{_first_at(m)}  {args}")
            if m.get("why"):
                lines.append(f"          {m['why']}")
        for w in report.warmed_since:
            lines.append(f"  warmed  {w['id']}  {_short(w['kernel'])}  (missed when recorded, warmed since)")
        for u in report.unused:
            lines.append(f"  unused  {u['id']}  {_short(u['kernel'])}")
        return lines
    for cause, misses in fold(report.misses, lambda m: m.get("cause") or "not warmed").items():
        first = min(misses, key=lambda m: (m.get("first") or {}).get("step", float("inf")))
        why = first.get("why") or ("not in the cache: warm the plan recorded on the server (`tritonwarm record "
                                   "--trace`), or specs that launch them")
        lines.append(f"  missed: {plural(len(misses), 'variant')} ({cause}) of "
                     f"{examples(_short(m['kernel']) for m in misses)}{_first_at(first)}: {why}")
    if report.warmed_since:
        lines.append(f"  warmed since: {plural(len(report.warmed_since), 'variant')} of "
                     f"{examples(_short(w['kernel']) for w in report.warmed_since)} missed when recorded and are in "
                     "the cache now")
    if report.unused:
        lines.append(f"  never used: {plural(len(report.unused), 'warmed variant')} of "
                     f"{examples(_short(u['kernel']) for u in report.unused)}: `tritonwarm prune --unused RECORD` "
                     "removes them")
    if report.misses or report.unused or report.warmed_since:
        lines.append("  (--verbose lists each variant)")
    return lines


def _short(kernel: str) -> str:
    return kernel.rsplit(".", 1)[-1]


def _first_at(miss: dict) -> str:
    first = miss.get("first") or {}
    return f" first at step {first['step']} (batch={first['requests']}, tokens={first['tokens']})" if first else ""
