"""Recording a real program: every Triton kernel it launches, as spec rows another target can replay.

``tritonwarm record -o PLAN -- python prog.py ARGS`` runs the program with Triton's ``jit_cache_hook``
installed process-wide (a ``sitecustomize`` on the child's path calls ``install_from_env``): on a GPU
the hook only watches (``--trace``: and looks each variant up in Triton's cache, as the serving
monitor does, for ``check --trace``); with ``--target T`` the program runs as a dry run on meta
tensors under the target-only driver, and nothing compiles. At exit each process appends what it saw
to the record, with the folders it imported from that a plain interpreter lacks.

Kernels of the program's main script are named by the script's path (``scripts.py``).

A recorded launch keeps what decides Triton's key and nothing of the recording machine: per
argument its class (pointer dtype and alignment, integer class, constexpr value) and the options the
program chose. ``replay`` turns such a row back into a launch on fake inputs, so
``tritonwarm warmup PLAN --target T`` traces it for any target with Triton's own binder.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import sys
import threading
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..core.specialization import fake_tensor
from .foreign import find_jit_function, locator
from .scripts import script_locator

OUT_ENV = "TRITONWARM_RECORD_OUT"
TARGET_ENV = "TRITONWARM_RECORD_TARGET"
TRACE_ENV = "TRITONWARM_RECORD_TRACE"  # set: also write the dispatch record (real launches only)
USER_PATH_ENV = "TRITONWARM_RECORD_PYTHONPATH"  # the program's own PYTHONPATH, before the recorder's folders

_TORCH_DTYPES = {
    "fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32, "fp64": torch.float64,
    "i8": torch.int8, "i16": torch.int16, "i32": torch.int32, "i64": torch.int64, "u8": torch.uint8,
    "u16": torch.uint16, "u32": torch.uint32, "u64": torch.uint64, "i1": torch.bool, "u1": torch.bool,
    "fp8e4nv": torch.float8_e4m3fn, "fp8e5": torch.float8_e5m2, "fp8e4b8": torch.float8_e4m3fnuz,
    "fp8e5b16": torch.float8_e5m2fnuz,
}
_INT_REPS = {("i32", True): 16, ("i32", False): 2, ("i64", True): 2**31 + 16, ("i64", False): 2**31 + 1,
             ("u64", True): 2**63, ("u64", False): 2**63 + 1}
# Options a launch may set; everything else in Triton's options follows from the target.
_LAUNCH_OPTIONS = ("num_warps", "num_stages", "num_ctas", "maxnreg", "enable_fp_fusion", "launch_cooperative_grid",
                   "waves_per_eu", "matrix_instr_nonkdim", "kpack", "schedule_hint")
_BACKENDS = ("cuda", "hip")  # the backends whose options a recorded launch may carry
_LARGE = 2**31 + 16  # elements: past the 2 GiB pointer range the HIP backend specializes on


def launch_row(specialization_data: str, where: str, target, key: str | None = None) -> dict:
    """Triton's serialized compile request for ``target`` (a ``GPUTarget``) and its in-memory ``key``
    → a replayable launch: ``{"kernel", "call"}``."""
    from triton.compiler.compiler import make_backend

    data = json.loads(specialization_data)
    constants = {tuple(k): v for k, v in zip(data["constant_keys"], data["constant_vals"], strict=True)}
    attrs = {tuple(k): v for k, v in zip(data["attrs_keys"], data["attrs_vals"], strict=True)}
    jit_function = find_jit_function(where)
    where = _importable(where, jit_function)
    params = jit_function.params
    args, constexprs = [], {}
    for index, (name, ty) in enumerate(data["signature"].items()):
        if (index,) not in constants and not isinstance(ty, str):
            raise ValueError(f"{where}: tuple argument {name!r} cannot be recorded")
        if ty == "constexpr":
            value = constants.get((index,))
            if params[index].is_constexpr:
                constexprs[name] = value
            else:
                args.append({"value": value})
            continue
        names = {a[0] for a in attrs.get((index,), [])}
        aligned = "tt.divisibility" in names
        if ty.startswith("*"):
            if ty[1:] not in _TORCH_DTYPES:
                raise ValueError(f"{where}: pointer type {ty!r} of {name!r} cannot be recorded")
            large = target.backend == "hip" and "tt.pointer_range" not in names
            args.append({"ptr": ty[1:], "aligned": aligned, **({"large": True} if large else {})})
        elif (ty, aligned) in _INT_REPS:
            args.append({"int": ty, "div16": aligned})
        elif ty in ("fp16", "bf16", "fp32", "fp64"):
            args.append({"float": ty})
        elif ty in ("i1", "u1"):
            args.append({"bool": True})
        else:
            raise ValueError(f"{where}: argument {name!r} of type {ty!r} cannot be recorded")
    options = _passed_options(key)
    if options is None:  # no key to read them from: the options that differ from the backend's defaults
        defaults = make_backend(target).parse_options({})
        options = {k: v for k, v in data["options"].items()
                   if k in _LAUNCH_OPTIONS and (k == "num_warps" or getattr(defaults, k, None) != v)}
    return {"kernel": where, "call": {"args": args, "constexprs": constexprs, "options": options,
                                      "backend": target.backend}}


def _importable(where: str, jit_function) -> str:
    """A kernel of the program's main script is named by the script's path: a warm-up loads it from
    there (``python -m package.module``: by the module's name)."""
    module_name, _, qualname = where.partition(":")
    if module_name != "__main__":
        return where
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    if spec is not None and spec.name not in ("__main__", None):
        return f"{spec.name}:{qualname}"
    return script_locator(jit_function.fn.__code__.co_filename, qualname)


def _passed_options(key: str | None) -> dict | None:
    """The options the launch passed (``num_stages=3`` from an autotune config, say), as Triton's
    in-memory key lists them after the argument classes; None when the key cannot be read."""
    import ast

    if not key or "]{" not in key:
        return None
    try:
        passed = ast.literal_eval(key[key.rindex("]{") + 1:])
    except (ValueError, SyntaxError):
        return None
    return {k: v for k, v in passed.items() if k in _LAUNCH_OPTIONS}


def _fake_arg(spec: dict):
    """The fake input of one recorded argument; a recorded class edited into one that does not exist
    is named, with the classes that do."""
    if "ptr" in spec:
        if spec["ptr"] not in _TORCH_DTYPES:
            raise ValueError(f"recorded pointer type {spec['ptr']!r} is not one of {', '.join(_TORCH_DTYPES)}")
        size = _LARGE if spec.get("large") else 64
        return fake_tensor((size,), _TORCH_DTYPES[spec["ptr"]], aligned=bool(spec.get("aligned")))
    if "int" in spec:
        rep = _INT_REPS.get((spec["int"], spec.get("div16")))
        if rep is None:
            raise ValueError(f"recorded integer class {spec['int']!r} (div16: {spec.get('div16')!r}) is not one of "
                             f"{', '.join(sorted({ty for ty, _ in _INT_REPS}))} with div16 true or false")
        return rep
    if "float" in spec:
        return 1.5
    if "bool" in spec:
        return True
    return _decode(spec["value"])


def _decode(value):
    import triton.language as tl

    if isinstance(value, str) and tl.dtype.is_dtype(value):
        return tl.dtype(value)
    if isinstance(value, dict) and "constexpr" in value:
        return value["constexpr"]
    if isinstance(value, dict) and "jit_function" in value:
        from .imports import current_target

        return find_jit_function(value["jit_function"], current_target())
    return tuple(value) if isinstance(value, list) else value


def replay(kernel: str, call: dict):
    """The launcher of a recorded plan: one recorded launch, made again on fake inputs (``capture: all``)."""
    from triton.runtime.driver import driver

    from ..core.targets import TargetOnlyDriver
    from .imports import current_target

    jit_function = find_jit_function(kernel, current_target())  # the module as the target's server imports it
    options = dict(call.get("options", {}))
    active = driver.active
    backend = active.target.backend if isinstance(active, TargetOnlyDriver) else None
    if call.get("backend", "cuda") not in _BACKENDS:
        raise ValueError(f"recorded backend {call['backend']!r} is not one of {', '.join(_BACKENDS)}")
    if backend is not None and backend != call.get("backend", backend):  # another backend: its own defaults
        options = {k: v for k, v in options.items() if k in ("num_warps", "num_ctas", "num_stages")}
    return jit_function.run(grid=(1,), warmup=True, **bound_by_name(jit_function, call), **options)


def bound_by_name(jit_function, call: dict) -> dict:
    """Every recorded argument by its parameter's name, as Triton's binder takes them: a row lists the
    runtime parameters in order and the constexprs by name, and a ``tl.constexpr`` between runtime
    parameters, a default or a keyword-only parameter then binds where the program bound it."""
    runtime = [p.name for p in jit_function.params if not p.is_constexpr]
    if len(call["args"]) != len(runtime):
        raise ValueError(f"{locator(jit_function)}: the plan records {len(call['args'])} runtime arguments, the "
                         f"kernel has {len(runtime)} runtime parameters: record the program again")
    bound = {name: _fake_arg(a) for name, a in zip(runtime, call["args"], strict=True)}
    bound.update({k: _decode(v) for k, v in call.get("constexprs", {}).items()})
    return bound


def write_plan(rows: list[dict], path: str | Path, command: list[str], target: str | None,
               roots: list[str] = ()) -> None:
    """The record as a spec file: one zipped row per distinct launch, replayed by ``replay``;
    ``roots``: the folders the program imported its modules from (``import_roots``)."""
    import yaml

    unique = list({json.dumps(r, sort_keys=True): r for r in rows}.values())
    unique.sort(key=lambda r: (r["kernel"], json.dumps(r["call"], sort_keys=True)))
    how = f"dry run for {target}" if target else "on this machine's GPU"
    header = (f"# Recorded by `tritonwarm record` ({how}): {' '.join(command)}\n"
              f"# {len(unique)} distinct launches. Warm them for any target: tritonwarm warmup THIS_FILE --target T\n")
    spec = {
        "launcher": "tritonwarm.jit.adopt.record:replay",
        "capture": "all",
        "description": f"launches recorded from: {' '.join(command)}",
        **({"import_roots": list(roots)} if roots else {}),
        "groups": {"launch": {"kernel": [r["kernel"] for r in unique], "call": [r["call"] for r in unique]}},
        "args": {"kernel": "$kernel", "call": "$call"},
    }
    Path(path).write_text(header + yaml.safe_dump(spec, sort_keys=False, width=200))


# --------------------------------------------------------------------------- inside the recorded process


class _Recorder:
    """What one recorded process saw: replayable rows, launches it could not record (each message
    once, with a count), the folders its modules import from, and (``trace``) the dispatch record."""

    def __init__(self, out: str, target_name: str | None, scratch: Path | None = None):
        self.out = out
        self.target_name = target_name
        self.scratch = scratch  # the recorder's own folder (its sitecustomize): never an import root
        self.rows: dict[str, dict] = {}
        self.errors: Counter[str] = Counter()
        self.capture = None
        self.monitor = None  # a DispatchMonitor: each variant launched, found in Triton's cache or not
        self.baseline = list(sys.path)  # before the program runs: what it adds is one of its import roots
        self._lock = threading.Lock()

    def add(self, specialization_data: str, where: str, target, key: str | None = None) -> None:
        try:
            row = launch_row(specialization_data, where, target, key)
        except (ValueError, LookupError) as e:  # their messages name the kernel
            with self._lock:
                self.errors[str(e)] += 1
            return
        except Exception as e:
            with self._lock:
                self.errors[f"{where}: {type(e).__name__}: {e}"] += 1
            return
        with self._lock:
            self.rows.setdefault(json.dumps(row, sort_keys=True), row)

    def flush(self) -> None:
        if self.capture is not None:
            from ..core.kernel import JitKernel
            from ..core.targets import TARGETS

            for variant in self.capture.variants.values():
                kernel = JitKernel.lookup(variant.kernel)
                where = variant.jit_function or (locator(kernel.jit_function) if kernel else "")
                self.add(variant.specialization_data, where, TARGETS[variant.target].gpu_target, variant.key)
        with open(self.out, "a") as f:
            for row in self.rows.values():
                f.write(json.dumps(row) + "\n")
            for error, count in self.errors.items():
                f.write(json.dumps({"error": error, "count": count}) + "\n")
            f.write(json.dumps({"roots": import_roots(self.baseline, self.scratch)}) + "\n")
            if self.monitor is not None:
                for line in self.monitor.dispatches.values():
                    f.write(json.dumps({"dispatch": line.to_json()}) + "\n")


def import_roots(baseline: list[str], scratch: Path | None = None) -> list[str]:
    """The folders this program imports from that a plain interpreter lacks: the script's folder, what
    it added to ``sys.path``, what its ``PYTHONPATH`` named; not the standard library, installed
    packages, tritonwarm's own folder or the recorder's ``scratch`` folder."""
    import site
    import sysconfig

    user_path = [p for p in os.environ.get(USER_PATH_ENV, "").split(os.pathsep) if p]
    standard = {sysconfig.get_paths().get(k) for k in ("stdlib", "platstdlib", "purelib", "platlib")}
    standard |= set(site.getsitepackages()) | {site.getusersitepackages()}
    standard = {os.path.realpath(p) for p in standard if p}
    skipped = {os.path.realpath(p) for p in (scratch, Path(__file__).resolve().parents[3]) if p}
    roots: list[str] = []
    for entry in [*sys.path, *user_path]:
        if entry in baseline and entry not in user_path:
            continue
        folder = os.path.realpath(entry or os.getcwd())
        if (not os.path.isdir(folder) or folder in skipped or folder in roots
                or any(folder == s or folder.startswith(s + os.sep) for s in standard)):
            continue
        roots.append(folder)
    return roots


@contextlib.contextmanager
def recording(out: str | Path, target_name: str | None = None, *, trace: bool = False, scratch: Path | None = None):
    """Record every Triton kernel launched inside the block into ``out`` (appended at the end).

    ``target_name``: a dry run on fake inputs for that target, nothing compiles. Otherwise real
    launches are watched (on a GPU: the serving process itself), and with ``trace`` each variant is
    also looked up in the cache Triton reads, as the serving monitor does: the dispatch record that
    ``check --trace`` compares with a warmed cache."""
    from triton import knobs

    recorder = _Recorder(str(out), target_name, scratch)
    with contextlib.ExitStack() as stack:
        if target_name is None:
            from triton.runtime.driver import driver

            from ..core.trace import _hook_lock

            if trace:
                from ..serving.monitor import DispatchMonitor

                recorder.monitor = DispatchMonitor(knobs.cache.dir, policy="off")
                stack.enter_context(recorder.monitor.serving())
            with _hook_lock:
                previous = knobs.runtime.jit_cache_hook

                def watch(*, key, fn, compile, **kwargs):
                    recorder.add(compile["specialization_data"], locator(fn.jit_function),
                                 driver.active.get_current_target(), str(key))
                    return previous(key=key, fn=fn, compile=compile, **kwargs) if previous else False

                knobs.runtime.jit_cache_hook = watch
            stack.callback(setattr, knobs.runtime, "jit_cache_hook", previous)
        else:
            from ..core.targets import TARGETS
            from ..core.trace import Capture, tracing

            recorder.capture = Capture()
            stack.enter_context(tracing(recorder.capture, TARGETS[target_name], all_kernels=True, meta_as_cuda=True))
        try:
            yield recorder
        finally:
            recorder.flush()


_installed = False


def install_from_env() -> None:
    """Called at start-up of a recorded process: record until it exits."""
    global _installed
    out = os.environ.get(OUT_ENV)
    if not out or _installed:
        return
    _installed = True
    stack = contextlib.ExitStack()
    stack.enter_context(recording(out, os.environ.get(TARGET_ENV) or None, trace=bool(os.environ.get(TRACE_ENV)),
                                  scratch=Path(out).parent))
    atexit.register(stack.close)


def read_record(path: str | Path) -> Recorded:
    """What the recorded processes wrote, merged: rows, folded errors, import roots, dispatch lines."""
    recorded = Recorded()
    if not Path(path).exists():
        return recorded
    for line in Path(path).read_text().splitlines():
        if not line.strip():
            continue
        item = json.loads(line)
        if "error" in item:
            recorded.errors[item["error"]] += item.get("count", 1)
        elif "roots" in item:
            recorded.roots += [r for r in item["roots"] if r not in recorded.roots]
        elif "dispatch" in item:
            recorded.add_dispatch(item["dispatch"])
        else:
            recorded.rows.append(item)
    return recorded


@dataclass
class Recorded:
    rows: list[dict] = field(default_factory=list)
    errors: Counter[str] = field(default_factory=Counter)
    roots: list[str] = field(default_factory=list)
    dispatches: dict[str, dict] = field(default_factory=dict)  # cache hash -> dispatch line

    def add_dispatch(self, line: dict) -> None:
        """The same variant seen by several processes: one line, launches summed, a miss in any is a miss."""
        known = self.dispatches.get(line["cache_hash"])
        if known is None:
            self.dispatches[line["cache_hash"]] = dict(line)
        else:
            known["launches"] = known.get("launches", 0) + line.get("launches", 0)
            known["hit"] = known["hit"] and line["hit"]
