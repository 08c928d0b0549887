"""Planning: run every spec row through its launcher on fake inputs and keep the keys Triton computed.

``plan`` traces each spec under a ``Capture`` (fake launches, nothing compiled), deduplicates the
variants, and verifies collapsed axes: a collapsed value of the same class must launch the same
variants (vLLM #53567). Nothing here compiles or writes the cache, except the plan store.
"""

from __future__ import annotations

import contextlib
import copy
import os
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import Executor, Future
from dataclasses import dataclass, field
from pathlib import Path

from ...errors import describe_error
from ...output import examples
from ..cache import PlanStore
from ..cache.plans import package_fingerprint
from ..core.kernel import JitKernel
from ..core.targets import Target
from ..core.trace import Capture, Variant, tracing
from .specs import LauncherImportedPerTarget, Spec, arguments_problem


@dataclass
class Plan:
    target: Target
    variants: dict[str, Variant] = field(default_factory=dict)  # cache hash -> variant
    rows: int = 0
    unreachable: list[str] = field(default_factory=list)  # rows that launch nothing
    redundant: list[str] = field(default_factory=list)  # rows whose variants earlier rows already give
    errors: list[str] = field(default_factory=list)  # why rows failed: one line per cause, with its count
    collapse_errors: list[str] = field(default_factory=list)  # collapsed axes that change the variant
    # what planned it: spec files and engine configs, recorded by warm-up so prune can re-plan them
    sources: dict[str, list[str]] = field(default_factory=lambda: {"specs": [], "engine_configs": []})
    notes: list[str] = field(default_factory=list)  # what tracing had to approximate (autotune pruning)
    environment_read: dict[str, str | None] = field(default_factory=dict)  # variables launchers read, values
    failed_rows: list[str] = field(default_factory=list)  # rows whose launcher raised on fake inputs

    def merge(self, other: Plan) -> None:
        self.rows += other.rows
        self.environment_read.update(other.environment_read)
        for name in ("unreachable", "redundant", "errors", "failed_rows", "collapse_errors", "notes"):
            getattr(self, name).extend(getattr(other, name))
        for kind, names in other.sources.items():
            self.sources[kind] = sorted(set(self.sources.get(kind, [])) | set(names))
        for variant in other.variants.values():
            known = self.variants.get(variant.cache_hash)
            if known is None:
                self.variants[variant.cache_hash] = Variant.from_json(copy.deepcopy(variant.to_json()))
            else:
                known.rows += [r for r in variant.rows if r not in known.rows]
                known.autotuned = known.autotuned and variant.autotuned

    def to_json(self) -> dict:
        return {"rows": self.rows, "unreachable": self.unreachable, "redundant": self.redundant,
                "errors": self.errors, "failed_rows": self.failed_rows, "collapse_errors": self.collapse_errors,
                "notes": self.notes,
                "environment_read": self.environment_read, "variants": [v.to_json() for v in self.variants.values()]}

    @classmethod
    def from_json(cls, target: Target, data: dict) -> Plan:
        variants = [Variant.from_json(v) for v in data["variants"]]
        return cls(target, {v.cache_hash: v for v in variants}, data["rows"], data["unreachable"],
                   data["redundant"], data["errors"], data["collapse_errors"], notes=data.get("notes", []),
                   environment_read=dict(data.get("environment_read", {})), failed_rows=data.get("failed_rows", []))


def plan(specs: Iterable[Spec], target: Target, *, verify_collapse: bool = True,
         cache_dir: Path | None = None, pool: Executor | None = None) -> Plan:
    """Trace every row of every spec that applies to ``target``; nothing is compiled.

    With ``cache_dir``, a spec whose inputs did not change (its file, tritonwarm's code, its
    launcher's package, the source of every kernel it traced, the environment variables its trace
    read, Triton's version and cache-invalidating environment, the target) is not traced again: its
    plan is read back from the plan store. With
    ``pool`` (``jit.pipeline.pool.worker_pool``), the specs are traced in its worker processes.
    """
    return plan_targets(specs, [target], verify_collapse=verify_collapse, cache_dir=cache_dir, pool=pool)[target.name]


def plan_targets(specs: Iterable[Spec], targets: Iterable[Target], *, verify_collapse: bool = True,
                 cache_dir: Path | None = None, pool: Executor | None = None) -> dict[str, Plan]:
    """``plan`` for several targets at once: every (spec, target) not in the plan store is traced,
    in ``pool`` when given, and each target's plan merges its specs in their order."""
    specs, targets = list(specs), list(targets)
    store = PlanStore(cache_dir) if cache_dir is not None else None
    parts: dict[tuple[str, int], tuple[Plan | Future, str | None]] = {}
    sources: dict[str, set[str]] = {target.name: set() for target in targets}
    for target in targets:
        for i, spec in enumerate(specs):
            if not spec.applies_to(target):
                continue
            key = store.key(spec, target, verify_collapse) if store else None
            sources[target.name].add(str(Path(spec.file).resolve()))
            partial = stored_plan(store, key, target) if store else None
            if partial is not None:
                key = None  # read back from the store: nothing to save
            elif pool is not None:
                partial = pool.submit(_plan_spec_in_worker, str(spec.file), spec.index, target.name, verify_collapse)
            else:
                partial = _plan_spec(spec, target, verify_collapse)
            parts[(target.name, i)] = (partial, key)
    plans = {}
    for target in targets:
        result = Plan(target)
        result.sources["specs"] = sorted(sources[target.name])
        for i in range(len(specs)):
            partial, key = parts.get((target.name, i), (None, None))
            if isinstance(partial, Future):
                partial = Plan.from_json(target, partial.result())
            if key is not None and storable(partial):  # traced just now: remember it
                store.save(key, partial.to_json(), kernel_source_keys(partial))
            if partial is not None:
                result.merge(partial)
                if specs[i].partial:  # not part of the stored plan: said on every warm-up and check
                    result.errors.append(f"{specs[i].file}: a partial plan ({specs[i].partial}): it lacks launches "
                                         "the program makes; record the program again")
        plans[target.name] = result
    return plans


def _plan_spec_in_worker(file: str, index: int, target_name: str, verify_collapse: bool) -> dict:
    from ..core.targets import TARGETS
    from .specs import load_spec_file

    spec = load_spec_file(file)[index]
    return _plan_spec(spec, TARGETS[target_name], verify_collapse).to_json()


def storable(the_plan: Plan) -> bool:
    """A trace that failed (a launcher that raised, a module not importable) is never remembered: what
    fixes it (PYTHONPATH, an installed package, a file beside the spec) is no input of the store's key,
    and the next warm-up must trace again."""
    return not the_plan.errors


def stored_plan(store: PlanStore, key: str, target: Target) -> Plan | None:
    """The stored plan, if it is intact and every kernel it traced still has the same source."""
    stored = store.load(key)
    if stored is None:
        return None
    data, kernels = stored
    if any(_source_key(name) != source_key for name, source_key in kernels.items()):
        return None  # a kernel (or a @triton.jit function it calls) was edited
    read = data.get("environment_read") if isinstance(data, dict) else None
    if not isinstance(read, dict) or any(not isinstance(name, str) or os.environ.get(name) != value
                                         for name, value in read.items()):
        return None  # a variable its launchers read has another value (or a plan stored before they were recorded)
    try:
        return Plan.from_json(target, data)
    except (KeyError, TypeError, ValueError):
        return None


def kernel_source_keys(the_plan: Plan) -> dict[str, str]:
    """Triton's source key of each kernel the plan traced: it changes with the kernel's source, its
    first line, and the ``@triton.jit`` functions and constexpr globals it uses. For a kernel of code
    tritonwarm did not write, the fingerprint of its package's files: a stored plan is data, and
    reading one imports nothing (importing belongs to tracing and compiling, once per target)."""
    keys = {}
    for variant in the_plan.variants.values():
        name = variant.jit_function or variant.kernel  # "module:qualname" for a kernel of capture: all
        if name not in keys:
            keys[name] = _source_key(name)
    return keys


def _source_key(kernel_name: str) -> str | None:
    if ":" in kernel_name:
        return "files:" + package_fingerprint(kernel_name.rpartition(":")[0])
    kernel = JitKernel.lookup(kernel_name)
    return kernel.jit_function.cache_key if kernel is not None else None


def trace_rows(target: Target, import_path: str, rows: Iterable[tuple[str, Callable[[], object]]], *,
               all_kernels: bool = False) -> tuple[Plan, Capture]:
    """The tracing protocol specs and engines share: run each ``(label, call)`` on fake inputs for
    ``target`` and keep what Triton's binder computed; a call that raises is an error of its row, a
    row that launches nothing is unreachable. With ``all_kernels`` every Triton kernel the calls reach
    is traced (``capture: all``), not only JitKernels. Nothing is compiled."""
    result = Plan(target)
    cap = Capture(import_path)
    failures: dict[str, list[str]] = {}  # the error's message -> the rows that raised it
    with tracing(cap, target, all_kernels) as autotune:
        for label, call in rows:
            result.rows += 1
            autotune.row = label
            with cap.row(label):
                try:
                    call()
                except Exception as e:  # a launch spec that cannot run on fake inputs (vLLM #50176)
                    failures.setdefault(describe_error(e), []).append(label)
                    continue
            if not cap.keys_of(label):
                result.unreachable.append(label)
    for message, labels in failures.items():  # a wrong argument fails every row alike: said once, counted
        result.failed_rows += labels
        which = labels[0] if len(labels) == 1 else f"{len(labels)} rows ({examples(labels, 1)})"
        result.errors.append(f"{which}: the launcher failed on fake inputs: {message}")
    result.notes += autotune.notes
    result.errors += autotune.errors
    result.variants = {v.cache_hash: v for v in cap.variants.values()}
    return result, cap


def _plan_spec(spec: Spec, target: Target, verify_collapse: bool) -> Plan:
    with environment_reads() as read:
        result = _trace_spec(spec, target, verify_collapse)
    result.environment_read = dict(read)
    return result


def _trace_spec(spec: Spec, target: Target, verify_collapse: bool) -> Plan:
    rows = spec.rows()
    result, cap = trace_rows(target, spec.kernel_path,
                             ((row.label, lambda values=row.values: _call(spec, values)) for row in rows),
                             all_kernels=spec.capture_all)
    if rows and not result.variants and not result.errors:
        # Specs are code, run like an imported module: a launcher that launches no Triton kernel
        # (one that runs a shell command, say) is a mistake, and both warmup and check say so.
        result.errors.append(f"{spec.file}: kernel: {spec.kernel_path} launched no Triton kernel in any of its "
                             f"{len(rows)} rows: it must call tritonwarm JitKernels")
    collapsed = {a.name for a in spec.collapsed_axes()}
    seen: list[tuple[dict, set[str]]] = []
    for row in rows:
        keys = cap.keys_of(row.label)
        # Redundant: everything it launches comes from earlier rows that differ in a declared
        # (not collapsed) axis. Collapsed representatives often share a variant by design.
        fixed = {k: v for k, v in row.values.items() if k not in collapsed}
        others = set().union(*(k for f, k in seen if f != fixed))
        if keys and keys <= others:
            result.redundant.append(row.label)
        seen.append((fixed, keys))
    if verify_collapse:
        result.collapse_errors += _verify_collapse(spec, rows, cap, target)
    return result


_readers: list[dict[str, str | None]] = []
_readers_lock = threading.Lock()
_ENVIRON = type(os.environ)  # os._Environ: os.environ[...], .get, os.getenv and `in` all read through it
_environ_getitem = _ENVIRON.__getitem__


# pragma: no mutate start
# (installed as os.environ's __getitem__: a wrapper around these that reads the environment, as
# mutmut's trampoline does, would call itself without end)
def _recorded_getitem(environ, name):
    try:
        value = _environ_getitem(environ, name)
    except KeyError:
        _remember(name, None)
        raise
    _remember(name, value)
    return value


def _remember(name, value: str | None) -> None:
    for read in list(_readers):
        read.setdefault(str(name), value)
# pragma: no mutate end


@contextlib.contextmanager
def environment_reads():
    """``{name: value or None}`` of every environment variable read (``os.environ``, ``os.getenv``)
    inside the block: what a launch spec decided from besides its code. A stored plan is only reused
    while they hold the same values."""
    read: dict[str, str | None] = {}
    with _readers_lock:
        _readers.append(read)
        _ENVIRON.__getitem__ = _recorded_getitem
    try:
        yield read
    finally:
        with _readers_lock:
            _readers[:] = [other for other in _readers if other is not read]  # by identity: {} == {}
            if not _readers:
                _ENVIRON.__getitem__ = _environ_getitem


def _call(spec: Spec, values: dict):
    from ..adopt.autotune import current_state, pin_error

    args, kwargs = spec.call_arguments(values)
    state = current_state()
    try:
        state.pinned = spec.pinned_config(values)  # validated where an autotuner prunes (``autotune._fake_run``)
    except Exception as e:
        state.pinned = None
        state.errors.append(pin_error(state.row, e))
    launcher = spec.launcher.resolve() if isinstance(spec.launcher, LauncherImportedPerTarget) else spec.launcher
    try:
        return launcher(*args, **kwargs)
    except TypeError as e:
        problem = arguments_problem(launcher, args, kwargs)
        if problem:  # the spec's arguments do not fit: said with the launcher's parameters
            raise TypeError(problem) from e
        raise



def _verify_collapse(spec: Spec, rows, cap: Capture, target: Target) -> list[str]:
    """Same class ⇒ same variants: trace other values of each collapsed axis and compare.

    This is what catches a runtime scalar that also picks a constexpr (vLLM #53567: a numel of
    4096 collapsed to 16 warmed BLOCK=16 while the runtime launched BLOCK=1024). Where it fails, the
    values between are bisected for where the variants change, and the split of the range there is
    the advice (Liger's RMSNorm changes kernels at 32,768 rows).
    """
    problems = []
    for axis in spec.collapsed_axes():
        for index, row in enumerate(rows):
            expected = cap.keys_of(row.label)
            if not expected:
                continue
            value = row.values[axis.name]
            for sample in spec.collapse_samples(axis, value, seed=index):
                got = _keys_at(spec, target, row.values, axis.name, sample)
                if got is None:
                    continue  # reported for the row itself if it matters
                if got != expected:
                    same, other = _where_variants_change(spec, target, row.values, axis.name, value, sample, expected)
                    problems.append(_unsound_collapse(spec, axis, row, sample, min(same, other), max(same, other)))
                    break
            else:
                continue
            break
    return problems


def _keys_at(spec: Spec, target: Target, values: dict, name: str, value: int) -> set[str] | None:
    """The variants a row launches with ``name`` set to ``value``; None when the launcher raises."""
    probe = Capture()
    with tracing(probe, target, spec.capture_all), probe.row("probe"):
        try:
            _call(spec, {**values, name: value})
        except Exception:
            return None
    return probe.keys_of("probe")


def _where_variants_change(spec: Spec, target: Target, values: dict, name: str, same: int, other: int,
                           expected: set[str]) -> tuple[int, int]:
    """Bisect between ``same`` (launches ``expected``) and ``other`` (launches something else) over
    values of their specialization class: the closest pair of the class, one of each kind."""
    from ..core.specialization import scalar_class

    cls = scalar_class(same)
    step = 16 if cls.endswith("div16") else 1
    while abs(other - same) > step:
        middle = same + (other - same) // 2
        middle -= (middle - same) % step  # a multiple of 16 stays one
        if step == 1 and middle % 16 == 0:  # not of the class: the value beside it is
            middle += 1 if middle + 1 != other else -1
        if middle in (same, other) or scalar_class(middle) != cls:
            break
        keys = _keys_at(spec, target, values, name, middle)
        if keys == expected:
            same = middle
        else:
            other = middle
    return same, other


def _unsound_collapse(spec: Spec, axis, row, sample: int, below: int, above: int) -> str:
    lo, hi = axis.collapsed_range
    name, value = axis.name, row.values[axis.name]
    return (f"{spec.file}:{axis.line}: axes.{name}: collapse: true is unsound: {name}={sample} launches other "
            f"variants than {name}={value} ({row.label}): the launcher picks a constexpr or a kernel by it; the "
            f"variants change between {name}={below} and {name}={above}: split the range there, in two spec documents "
            f"(--- between them): {name}: {{range: [{lo}, {above - 1}], collapse: true}} and "
            f"{{range: [{above}, {hi}], collapse: true}}")
