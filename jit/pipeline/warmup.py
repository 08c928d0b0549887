"""Warming: compile each planned variant Triton's cache lacks, one process at a time per key, and
record it in the manifest.

The path of a warm-up, top-down: ``plan.plan`` traces the specs; ``warm`` decides what is already
cached and intact, compiles the rest (in a process pool for ``jobs > 1``) with Triton's own
``JITFunction.preload``, and records every entry's files and content hashes in the manifest.
"""

from __future__ import annotations

import concurrent.futures
import multiprocessing
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass, field
from pathlib import Path

from ...errors import describe_error
from ..cache import (
    CacheError,
    Manifest,
    ManifestDamaged,
    cache_env,
    disk_full,
    ensure_writable,
    entry_files,
    entry_path,
    file_sha256,
    files_match_record,
    refuse_if_served_elsewhere,
    remove_stale_temporaries,
    triton_version,
    variant_lock,
)
from ..cache.env import current_fingerprint, fingerprint_id
from ..cache.failures import record_compiles
from ..cache.layout import UnreadableEntry
from ..cache.overlay import refuse_if_overlaid
from ..cache.sources import PlanSources
from ..core.targets import Target
from ..core.trace import Variant
from ..serving.c_launchers import warm_c_launchers
from .compile import compile_variant
from .plan import Plan
from .pool import prime_key_material
from .resources import over_limit_line, over_limit_row, over_limits, resource_usage


@dataclass
class WarmResult:
    target: str
    cache_dir: str
    planned: int = 0
    compiled: int = 0
    cached: int = 0
    failed: int = 0
    repaired: int = 0  # entries found corrupt and recompiled
    verified: int = 0  # entries no manifest recorded, kept after a fresh compile gave the same bytes
    seconds: float = 0.0
    manifest_set_aside: str | None = None  # a damaged manifest, moved aside and rebuilt
    failures: list[str] = field(default_factory=list)
    over_limits: list[dict] = field(default_factory=list)  # variants the target's GPU refuses to load (failed)
    pruned: list[dict] = field(default_factory=list)  # autotune configs over a limit: Triton's autotuner skips them
    c_launchers: dict | None = None  # Triton's C launchers built for the warmed variants (c_launchers.py)

    def to_json(self) -> dict:
        return dict(self.__dict__)


def warm(the_plan: Plan, cache_dir: Path, *, jobs: int = 1, binary_only: bool = False,
         progress: Callable[[Variant, str], None] | None = None, pool: Executor | None = None) -> WarmResult:
    """Compile every planned variant the cache lacks (``jobs`` processes, or the workers of ``pool``,
    a ``jit.pipeline.pool.worker_pool`` shared with tracing); record all in the manifest."""
    target = the_plan.target
    start = time.perf_counter()
    ensure_writable(cache_dir)
    refuse_if_served_elsewhere(cache_dir)
    refuse_if_overlaid(cache_dir)
    remove_stale_temporaries(cache_dir)  # what a previous run that hit a full disk left behind
    result = WarmResult(target.name, str(cache_dir), planned=len(the_plan.variants))
    manifest = Manifest(cache_dir, target.name)
    try:
        recorded = manifest.read()
    except ManifestDamaged:  # rebuilt from the entries that verify: none of its records is trusted
        aside = manifest.set_aside_damaged()
        result.manifest_set_aside = str(aside) if aside else None
        recorded = manifest.read()
    version, env = triton_version(), cache_env()
    fingerprint = current_fingerprint()  # the serving environment's under --for
    environment = fingerprint_id(fingerprint)
    environments = {environment: fingerprint}
    variants, warmed, failed = list(the_plan.variants.values()), [], {}
    outcomes = _warm_all(variants, target, cache_dir, recorded, jobs, binary_only, pool)
    for variant, outcome in outcomes:
        if disk_full(outcome):  # every further compile would fail the same way: stop at the first
            outcomes.close()  # now, not when the exception is gone: what has not started is cancelled
            where = getattr(outcome, "filename", None) or cache_dir
            raise CacheError(f"disk full: no space left on device writing {where}; free space and warm again "
                             "(the next warm-up removes what this one left)")
        if isinstance(outcome, BaseException):
            result.failed += 1
            if not isinstance(outcome, UnreadableEntry):  # a compile that failed: check says so, and why
                failed[variant.cache_hash] = {"kernel": variant.kernel, "rows": variant.rows[:3],
                                              "error": describe_error(outcome)}
            result.failures.append(f"{_rows_of(variant)}{variant.kernel} {variant.variant_id}: "
                                   f"{describe_error(outcome)}")
            if progress:
                progress(variant, "failed")
            continue
        status, details = outcome
        usage = details["resources"] if details is not None else _recorded_usage(recorded, variant, target, cache_dir)
        excess = over_limits(target, usage, variant.num_warps)
        refused = bool(excess) and not variant.autotuned  # an autotuner skips such a config; a launch crashes
        if excess:
            (result.over_limits if refused else result.pruned).append(over_limit_row(variant.to_json(), excess))
        if refused:  # compiled and kept (check names it), but a failed row: the server cannot load it
            result.failed += 1
            result.failures.append(over_limit_line(target.name, result.over_limits[-1]))
        else:
            warmed.append(variant)
            result.compiled += status in ("compiled", "repaired")
            result.repaired += status == "repaired"
            result.cached += status in ("cached", "verified")
            result.verified += status == "verified"
        if details is not None:
            entry = _manifest_entry(variant, details, version, env)
            entry["environment"] = environment
            manifest.update({variant.cache_hash: entry}, environments=environments)
        if progress:
            progress(variant, "over limit" if refused else status)
    manifest.compact()  # one rewrite per warm-up, not one per variant
    record_compiles(cache_dir, target.name, failed, (v.cache_hash for v in warmed))
    PlanSources(cache_dir, target.name).add(**the_plan.sources)
    c_launchers = warm_c_launchers(warmed, target, cache_dir, jobs=jobs)
    if c_launchers is not None:
        result.c_launchers = c_launchers.to_json()
        result.failures += [f"C launcher {line}" for line in c_launchers.failed]
    result.seconds = round(time.perf_counter() - start, 3)
    return result


def _rows_of(variant: Variant) -> str:
    """The spec row a variant was planned from, as a failure names it (``row: ``; empty for none)."""
    if not variant.rows:
        return ""
    more = f" and {len(variant.rows) - 1} more rows" if len(variant.rows) > 1 else ""
    return f"{variant.rows[0]}{more}: "


def _warm_all(variants: list[Variant], target: Target, cache_dir: Path, recorded: dict, jobs: int,
              binary_only: bool, shared_pool: Executor | None = None):
    """Yield ``(variant, (status, details) | exception)``; compiles in a process pool when jobs > 1.

    What is already cached and intact is decided here, without a lock or a worker; only the rest
    goes to the pool. Workers are forked, so each pays Triton's start-up once, not per variant.
    """
    todo = []
    for variant in variants:
        previous = recorded.get(variant.cache_hash)
        try:
            files = entry_files(cache_dir, variant.entry_dir, variant.entry_name)
        except UnreadableEntry as e:
            yield variant, e
            continue
        if files and previous is not None and files_match_record(files, previous):
            fresh = not set(variant.rows) <= set(previous.get("rows", []))  # rows the record lacks
            yield variant, ("cached", _details(target, files, None) if fresh else None)
        else:
            todo.append(variant)
    if (jobs <= 1 and shared_pool is None) or len(todo) <= 1:
        for variant in todo:
            try:
                yield variant, _warm_one(variant, target, cache_dir, recorded.get(variant.cache_hash), binary_only)
            except Exception as e:
                yield variant, e
        return
    if shared_pool is not None:
        pool = shared_pool
    else:
        prime_key_material([target])  # computed once here, inherited by every forked worker
        context = multiprocessing.get_context("fork" if sys.platform == "linux" else "spawn")
        pool = concurrent.futures.ProcessPoolExecutor(max_workers=min(jobs, len(todo)), mp_context=context)
    futures = {}
    try:
        futures = {
            pool.submit(_warm_one_in_worker, v.to_json(), target.name, str(cache_dir), recorded.get(v.cache_hash),
                        binary_only): v
            for v in todo
        }
        for future in concurrent.futures.as_completed(futures):
            try:
                yield futures[future], future.result()
            except Exception as e:
                yield futures[future], e
    finally:  # the caller stopped early (a full disk): compile nothing more
        for future in futures:
            future.cancel()
        if pool is not shared_pool:
            pool.shutdown(wait=True, cancel_futures=True)


def _warm_one_in_worker(variant_json: dict, target_name: str, cache_dir: str, recorded: dict | None,
                        binary_only: bool):
    from ..core.targets import TARGETS

    return _warm_one(Variant.from_json(variant_json), TARGETS[target_name], Path(cache_dir), recorded, binary_only)


def _warm_one(variant: Variant, target: Target, cache_dir: Path, recorded: dict | None, binary_only: bool = False):
    """Compile one variant unless the cache has it intact: ``(status, details)``."""
    with variant_lock(cache_dir, variant.cache_hash):
        files = entry_files(cache_dir, variant.entry_dir, variant.entry_name)
        if files and recorded is None:  # recorded meanwhile by another warm-up?
            recorded = _current_record(cache_dir, target, variant.cache_hash)
        if files and recorded is not None and files_match_record(files, recorded):
            return "cached", _details(target, files, None)  # another process compiled it meanwhile
        if files and recorded is None and _same_as_fresh_compile(variant, target, cache_dir, files, binary_only):
            return "verified", _details(target, files, None)
        folder = entry_path(cache_dir, variant.entry_dir)
        stray = folder.exists() and not folder.is_dir()  # a file where the entry's folder belongs
        corrupt = files is not None or stray
        if stray:
            folder.unlink()
        elif corrupt:  # never let Triton load a damaged binary: remove the entry, then rebuild it
            shutil.rmtree(folder, ignore_errors=True)
        t0 = time.perf_counter()
        compiled = compile_variant(variant, target, cache_dir, binary_only=binary_only)
        seconds = round(time.perf_counter() - t0, 4)
        if compiled.hash != variant.cache_hash:
            raise RuntimeError(f"Triton compiled {compiled.hash[:12]}, planned {variant.variant_id}: "
                               "the environment changed between trace and compile")
        files = entry_files(cache_dir, variant.entry_dir, variant.entry_name)
        if files is None:
            raise RuntimeError(f"Triton wrote no complete cache entry under {cache_dir}")
        return ("repaired" if corrupt else "compiled"), _details(target, files, seconds)


def _recorded_usage(recorded: dict, variant: Variant, target: Target, cache_dir: Path) -> dict | None:
    """What an entry found cached and intact uses: as its record says, else read from its files."""
    usage = (recorded.get(variant.cache_hash) or {}).get("resources")
    if isinstance(usage, dict):
        return usage
    try:
        files = entry_files(cache_dir, variant.entry_dir, variant.entry_name)
    except UnreadableEntry:
        return None
    return resource_usage(target, files) if files else None


def _current_record(cache_dir: Path, target: Target, cache_hash: str) -> dict | None:
    try:
        return Manifest(cache_dir, target.name).read().get(cache_hash)
    except CacheError:
        return None


def _same_as_fresh_compile(variant: Variant, target: Target, cache_dir: Path, files: dict[str, str],
                           binary_only: bool) -> bool:
    """An entry no manifest records (a lost or damaged manifest) is trusted only if compiling the same
    request afresh, into a scratch folder, gives the same bytes (Triton's compile is deterministic)."""
    scratch = Path(tempfile.mkdtemp(prefix="verify-", dir=Path(cache_dir) / "tritonwarm"))
    try:
        compile_variant(variant, target, scratch, binary_only=binary_only)
        fresh = entry_files(scratch, variant.entry_dir, variant.entry_name) or {}
        named = {Path(p).name: p for p in files.values()}
        fresh_named = {Path(p).name: p for p in fresh.values()}
        if set(named) != set(fresh_named):
            return False
        return all(file_sha256(named[n]) == file_sha256(fresh_named[n]) for n in named)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _details(target: Target, files: dict[str, str], seconds: float | None) -> dict:
    """What the manifest records about an entry's files (done where the entry was built)."""
    return {
        "files": {name: file_sha256(path) for name, path in sorted(files.items())},
        "resources": resource_usage(target, files),
        "compile_seconds": seconds,
    }


def _manifest_entry(variant: Variant, details: dict, version: str, env: dict) -> dict:
    entry = variant.to_json()
    entry.update(details, triton_version=version, env=env, entry_dir=variant.entry_dir)
    return entry
