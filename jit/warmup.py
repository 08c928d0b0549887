"""Warm-up: specs → plan (trace with Triton's keys) → compile what is missing → manifest; and check.

The path of a warm-up, top-down: ``plan`` runs every spec row through its launcher under a
``Capture`` (fake launches, nothing compiled), deduplicates the keys Triton computed, and verifies
collapsed axes; ``warm`` compiles each planned variant that Triton's cache lacks, one process at a
time per key, and records it in the manifest; ``check`` compares a plan with the cache.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import multiprocessing
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable

from .cache import Manifest, PlanStore, ensure_writable, cache_env, entry_dir, entry_files, file_sha256, triton_version, variant_lock
from .compile import compile_variant
from .kernel import fake_launches
from .resources import resource_usage
from .specs import Spec
from .targets import Target
from .trace import Capture, Variant


@dataclass
class Plan:
    target: Target
    variants: dict[str, Variant] = field(default_factory=dict)  # cache hash -> variant
    rows: int = 0
    unreachable: list[str] = field(default_factory=list)  # rows that launch nothing
    redundant: list[str] = field(default_factory=list)  # rows whose variants earlier rows already give
    errors: list[str] = field(default_factory=list)  # rows whose launcher raised on fake inputs
    collapse_errors: list[str] = field(default_factory=list)  # collapsed axes that change the variant

    def merge(self, other: "Plan") -> None:
        self.rows += other.rows
        for name in ("unreachable", "redundant", "errors", "collapse_errors"):
            getattr(self, name).extend(getattr(other, name))
        for variant in other.variants.values():
            known = self.variants.get(variant.cache_hash)
            if known is None:
                self.variants[variant.cache_hash] = Variant.from_json(variant.to_json())
            else:
                known.rows += [r for r in variant.rows if r not in known.rows]

    def to_json(self) -> dict:
        return {"rows": self.rows, "unreachable": self.unreachable, "redundant": self.redundant,
                "errors": self.errors, "collapse_errors": self.collapse_errors,
                "variants": [v.to_json() for v in self.variants.values()]}

    @classmethod
    def from_json(cls, target: Target, data: dict) -> "Plan":
        variants = [Variant.from_json(v) for v in data["variants"]]
        return cls(target, {v.cache_hash: v for v in variants}, data["rows"], data["unreachable"],
                   data["redundant"], data["errors"], data["collapse_errors"])


def plan(specs: Iterable[Spec], target: Target, *, verify_collapse: bool = True,
         cache_dir: Path | None = None) -> Plan:
    """Trace every row of every spec that applies to ``target``; nothing is compiled.

    With ``cache_dir``, a spec whose inputs did not change (its file, tritonwarm's code, its
    launcher's module, Triton's version and cache-invalidating environment, the target) is not
    traced again: its plan is read back from ``<cache_dir>/tritonwarm/plans``.
    """
    store = PlanStore(cache_dir) if cache_dir is not None else None
    result = Plan(target)
    for spec in specs:
        if not spec.applies_to(target):
            continue
        key = store.key(spec, target, verify_collapse) if store else None
        partial = store.load(key, target) if store else None
        if partial is None:
            partial = _plan_spec(spec, target, verify_collapse)
            if store:
                store.save(key, partial)
        result.merge(partial)
    return result


def _plan_spec(spec: Spec, target: Target, verify_collapse: bool) -> Plan:
    result = Plan(target)
    cap = Capture()
    cap.import_path = spec.kernel_path
    rows = spec.rows()
    result.rows = len(rows)
    with fake_launches(cap, target):
        for row in rows:
            cap.current_row = row.label
            try:
                _call(spec, row.values)
            except Exception as e:  # a launch spec that cannot run on fake inputs (vLLM #50176)
                result.errors.append(f"{row.label}: {type(e).__name__}: {e}")
    cap.current_row = None
    collapsed = {a.name for a in spec.collapsed_axes()}
    seen: list[tuple[dict, set[str]]] = []
    for row in rows:
        keys = cap.row_keys.get(row.label, set())
        if not keys and not any(e.startswith(row.label) for e in result.errors):
            result.unreachable.append(row.label)
        # Redundant: everything it launches comes from earlier rows that differ in a declared
        # (not collapsed) axis. Collapsed representatives often share a variant by design.
        fixed = {k: v for k, v in row.values.items() if k not in collapsed}
        others = set().union(*(k for f, k in seen if f != fixed))
        if keys and keys <= others:
            result.redundant.append(row.label)
        seen.append((fixed, keys))
    if verify_collapse:
        result.collapse_errors += _verify_collapse(spec, rows, cap, target)
    result.variants = {v.cache_hash: v for v in cap.variants.values()}
    return result


def _call(spec: Spec, values: dict):
    args, kwargs = spec.call_arguments(values)
    return spec.launcher(*args, **kwargs)


def _verify_collapse(spec: Spec, rows, cap: Capture, target: Target) -> list[str]:
    """Same class ⇒ same variants: trace other values of each collapsed axis and compare.

    This is what catches a runtime scalar that also picks a constexpr (vLLM #53567: a numel of
    4096 collapsed to 16 warmed BLOCK=16 while the runtime launched BLOCK=1024).
    """
    problems = []
    for axis in spec.collapsed_axes():
        for index, row in enumerate(rows):
            expected = cap.row_keys.get(row.label)
            if not expected:
                continue
            for sample in spec.collapse_samples(axis, row.values[axis.name], seed=index):
                probe = Capture()
                with fake_launches(probe, target):
                    probe.current_row = "probe"
                    try:
                        _call(spec, {**row.values, axis.name: sample})
                    except Exception:
                        continue  # reported for the row itself if it matters
                got = probe.row_keys.get("probe", set())
                if got != expected:
                    problems.append(
                        f"{spec.file}:{axis.line}: axes.{axis.name}: collapse: true is unsound: "
                        f"{axis.name}={sample} launches other variants than {axis.name}={row.values[axis.name]} "
                        f"({row.label}); it drives a constexpr or the kernel choice, so enumerate it"
                    )
                    break
            else:
                continue
            break
    return problems


# --------------------------------------------------------------------------- warming


@dataclass
class WarmResult:
    target: str
    cache_dir: str
    planned: int = 0
    compiled: int = 0
    cached: int = 0
    failed: int = 0
    repaired: int = 0  # entries found corrupt and recompiled
    seconds: float = 0.0
    failures: list[str] = field(default_factory=list)

    def to_json(self) -> dict:
        return dict(self.__dict__)


def warm(the_plan: Plan, cache_dir: Path, *, jobs: int = 1, binary_only: bool = False,
         progress: Callable[[Variant, str], None] | None = None) -> WarmResult:
    """Compile every planned variant the cache lacks (``jobs`` processes); record all in the manifest."""
    target = the_plan.target
    start = time.perf_counter()
    ensure_writable(cache_dir)
    result = WarmResult(target.name, str(cache_dir), planned=len(the_plan.variants))
    manifest = Manifest(cache_dir, target.name)
    recorded = manifest.read()
    version, env = triton_version(), cache_env()
    variants = list(the_plan.variants.values())
    for variant, outcome in _warm_all(variants, target, cache_dir, recorded, jobs, binary_only):
        if isinstance(outcome, BaseException):
            result.failed += 1
            result.failures.append(f"{variant.kernel} {variant.variant_id}: {type(outcome).__name__}: {outcome}")
            if progress:
                progress(variant, "failed")
            continue
        status, details = outcome
        result.compiled += status in ("compiled", "repaired")
        result.repaired += status == "repaired"
        result.cached += status == "cached"
        if details is not None:
            manifest.update({variant.cache_hash: _manifest_entry(variant, details, version, env)})
        if progress:
            progress(variant, status)
    result.seconds = round(time.perf_counter() - start, 3)
    return result


def _warm_all(variants: list[Variant], target: Target, cache_dir: Path, recorded: dict, jobs: int,
              binary_only: bool):
    """Yield ``(variant, (status, details) | exception)``; compiles in a process pool when jobs > 1.

    What is already cached and intact is decided here, without a lock or a worker; only the rest
    goes to the pool. Workers are forked, so each pays Triton's start-up once, not per variant.
    """
    todo = []
    for variant in variants:
        previous = recorded.get(variant.cache_hash)
        files = entry_files(cache_dir, variant.cache_dir_name, variant.entry_name)
        if files and _intact(files, previous):
            fresh = previous is None or not set(variant.rows) <= set(previous.get("rows", []))
            yield variant, ("cached", _details(target, files, None) if fresh else None)
        else:
            todo.append(variant)
    if jobs <= 1 or len(todo) <= 1:
        for variant in todo:
            try:
                yield variant, _warm_one(variant, target, cache_dir, recorded.get(variant.cache_hash), binary_only)
            except Exception as e:
                yield variant, e
        return
    context = multiprocessing.get_context("fork" if sys.platform == "linux" else "spawn")
    with concurrent.futures.ProcessPoolExecutor(max_workers=min(jobs, len(todo)), mp_context=context) as pool:
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


def _warm_one_in_worker(variant_json: dict, target_name: str, cache_dir: str, recorded: dict | None,
                        binary_only: bool):
    from .targets import TARGETS

    return _warm_one(Variant.from_json(variant_json), TARGETS[target_name], Path(cache_dir), recorded, binary_only)


def _warm_one(variant: Variant, target: Target, cache_dir: Path, recorded: dict | None, binary_only: bool = False):
    """Compile one variant unless the cache has it intact: ``(status, details)``."""
    with variant_lock(cache_dir, variant.cache_hash):
        files = entry_files(cache_dir, variant.cache_dir_name, variant.entry_name)
        if files and _intact(files, recorded):  # another process compiled it meanwhile
            return "cached", _details(target, files, None)
        corrupt = files is not None
        if corrupt:  # never let Triton load a damaged binary: remove the entry, then rebuild it
            shutil.rmtree(entry_dir(cache_dir, variant.cache_dir_name), ignore_errors=True)
        t0 = time.perf_counter()
        compiled = compile_variant(variant, target, cache_dir, binary_only=binary_only)
        seconds = round(time.perf_counter() - t0, 4)
        if compiled.hash != variant.cache_hash:
            raise RuntimeError(f"Triton compiled {compiled.hash[:12]}, planned {variant.variant_id}: "
                               "the environment changed between trace and compile")
        files = entry_files(cache_dir, variant.cache_dir_name, variant.entry_name)
        if files is None:
            raise RuntimeError(f"Triton wrote no complete cache entry under {cache_dir}")
        return ("repaired" if corrupt else "compiled"), _details(target, files, seconds)


def _details(target: Target, files: dict[str, str], seconds: float | None) -> dict:
    """What the manifest records about an entry's files (done where the entry was built)."""
    return {
        "files": {name: file_sha256(path) for name, path in sorted(files.items())},
        "resources": resource_usage(target, files),
        "compile_seconds": seconds,
    }


def _intact(files: dict[str, str], recorded: dict | None) -> bool:
    """Files match the content hashes the manifest recorded (when it recorded them)."""
    if not recorded or "files" not in recorded:
        return True
    for name, digest in recorded["files"].items():
        path = files.get(name)
        if path is None:
            return False
        try:
            if file_sha256(path) != digest:
                return False
        except OSError:
            return False
    return True


def _manifest_entry(variant: Variant, details: dict, version: str, env: dict) -> dict:
    entry = variant.to_json()
    entry.update(details, triton_version=version, env=env, entry_dir=variant.cache_dir_name)
    return entry


# --------------------------------------------------------------------------- checking


@dataclass
class CheckReport:
    target: str
    planned: int
    missing: list[dict] = field(default_factory=list)
    stale: list[dict] = field(default_factory=list)
    corrupt: list[dict] = field(default_factory=list)
    unreachable: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    collapse_errors: list[str] = field(default_factory=list)
    redundant: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not (self.missing or self.stale or self.corrupt or self.unreachable or self.errors
                    or self.collapse_errors)

    def to_json(self) -> dict:
        return {**self.__dict__, "ok": self.ok}


def check(the_plan: Plan, cache_dir: Path) -> CheckReport:
    """Plan vs cache: what serving would compile, what is stale or damaged, what the spec cannot reach."""
    target = the_plan.target
    report = CheckReport(target.name, len(the_plan.variants), unreachable=list(the_plan.unreachable),
                         errors=list(the_plan.errors), collapse_errors=list(the_plan.collapse_errors),
                         redundant=list(the_plan.redundant))
    recorded = Manifest(cache_dir, target.name).read()
    for variant in the_plan.variants.values():
        files = entry_files(cache_dir, variant.cache_dir_name, variant.entry_name)
        summary = {"id": variant.variant_id, "kernel": variant.kernel, "args": variant.args, "rows": variant.rows}
        if files is None:
            report.missing.append(summary)
        elif not _intact(files, recorded.get(variant.cache_hash)):
            report.corrupt.append(summary)
    version, env = triton_version(), cache_env()
    for cache_hash, entry in recorded.items():
        reasons = []
        if entry.get("triton_version") != version:
            reasons.append(f"Triton {entry.get('triton_version')} (now {version})")
        changed = sorted(k for k in set(env) | set(entry.get("env", {})) if env.get(k) != entry.get("env", {}).get(k))
        if changed:
            reasons.append("environment changed: " + ", ".join(changed))
        if reasons:
            report.stale.append({"id": cache_hash[:12], "kernel": entry.get("kernel"), "why": "; ".join(reasons)})
    return report


# --------------------------------------------------------------------------- inspecting


def list_variants(cache_dir: Path, *, target: str | None = None, kernel: str | None = None) -> list[dict]:
    from .cache import manifests

    rows = []
    for name, manifest in manifests(cache_dir).items():
        if target and name != target:
            continue
        for entry in manifest.read().values():
            if kernel and kernel not in entry["kernel"]:
                continue
            rows.append(entry)
    return sorted(rows, key=lambda e: (e["target"], e["kernel"], e["id"]))


def find_variant(cache_dir: Path, variant_id: str) -> dict:
    matches = [e for e in list_variants(cache_dir) if e["id"].startswith(variant_id) or e["cache_hash"] == variant_id]
    if not matches:
        raise LookupError(f"no warmed variant {variant_id!r} in {cache_dir} (see `tritonwarm list`)")
    if len(matches) > 1:
        raise LookupError(f"{variant_id!r} is ambiguous: " + ", ".join(f"{m['id']} ({m['target']})" for m in matches))
    return matches[0]


IR_KINDS = ("ttir", "ttgir", "llir", "ptx", "sass", "amdgcn")


def variant_ir(cache_dir: Path, entry: dict, ir: str) -> str:
    from .resources import sass

    folder = Path(cache_dir) / entry["entry_dir"]
    name = entry["entry_name"]
    if ir == "sass":
        cubin = folder / f"{name}.cubin"
        if not cubin.exists():
            raise LookupError(f"variant {entry['id']} has no cubin (target {entry['target']}): no SASS")
        return sass(cubin)
    path = folder / f"{name}.{ir}"
    if not path.exists():
        have = sorted(p.suffix[1:] for p in folder.glob(f"{name}.*") if p.suffix[1:] in IR_KINDS)
        raise LookupError(f"variant {entry['id']} has no {ir} (it has: {', '.join(have) or 'none'})")
    with contextlib.suppress(UnicodeDecodeError):
        return path.read_text()
    raise LookupError(f"{path.name} is binary")
