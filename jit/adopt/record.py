"""Recording a real program: every Triton kernel it launches, as spec rows another target can replay.

``tritonwarm record -o PLAN -- python prog.py ARGS`` runs the program with Triton's ``jit_cache_hook``
installed process-wide (a ``sitecustomize`` on the child's path calls ``install_from_env``): on a GPU
the hook only watches; with ``--target T`` the program runs as a dry run on meta tensors under the
target-only driver, and nothing compiles. At exit each process appends what it saw to the record.

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
import threading
from pathlib import Path
from typing import Any

import torch

from ..specialization import fake_tensor
from .foreign import find_jit_function, locator

OUT_ENV = "TRITONWARM_RECORD_OUT"
TARGET_ENV = "TRITONWARM_RECORD_TARGET"

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

    if where.startswith("__main__:"):
        raise ValueError(f"{where}: defined in the program's main script, which no other process can import: "
                         "move the kernel into a module")
    data = json.loads(specialization_data)
    constants = {tuple(k): v for k, v in zip(data["constant_keys"], data["constant_vals"], strict=True)}
    attrs = {tuple(k): v for k, v in zip(data["attrs_keys"], data["attrs_vals"], strict=True)}
    jit_function = find_jit_function(where)
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
        return find_jit_function(value["jit_function"])
    return tuple(value) if isinstance(value, list) else value


def replay(kernel: str, call: dict):
    """The launcher of a recorded plan: one recorded launch, made again on fake inputs (``capture: all``)."""
    from triton.runtime.driver import driver

    from ..targets import TargetOnlyDriver

    jit_function = find_jit_function(kernel)
    options = dict(call.get("options", {}))
    active = driver.active
    backend = active.target.backend if isinstance(active, TargetOnlyDriver) else None
    if call.get("backend", "cuda") not in _BACKENDS:
        raise ValueError(f"recorded backend {call['backend']!r} is not one of {', '.join(_BACKENDS)}")
    if backend is not None and backend != call.get("backend", backend):  # another backend: its own defaults
        options = {k: v for k, v in options.items() if k in ("num_warps", "num_ctas", "num_stages")}
    args = [_fake_arg(a) for a in call["args"]]
    constexprs = {k: _decode(v) for k, v in call.get("constexprs", {}).items()}
    return jit_function.run(*args, grid=(1,), warmup=True, **constexprs, **options)


def write_plan(rows: list[dict], path: str | Path, command: list[str], target: str | None) -> None:
    """The record as a spec file: one zipped row per distinct launch, replayed by ``replay``."""
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
        "groups": {"launch": {"kernel": [r["kernel"] for r in unique], "call": [r["call"] for r in unique]}},
        "args": {"kernel": "$kernel", "call": "$call"},
    }
    Path(path).write_text(header + yaml.safe_dump(spec, sort_keys=False, width=200))


# --------------------------------------------------------------------------- inside the recorded process


class _Recorder:
    def __init__(self, out: str, target_name: str | None):
        self.out = out
        self.target_name = target_name
        self.rows: dict[str, dict] = {}
        self.errors: list[str] = []
        self.capture = None
        self._lock = threading.Lock()

    def add(self, specialization_data: str, where: str, target, key: str | None = None) -> None:
        try:
            row = launch_row(specialization_data, where, target, key)
        except Exception as e:
            self.errors.append(f"{where}: {e}")
            return
        with self._lock:
            self.rows.setdefault(json.dumps(row, sort_keys=True), row)

    def flush(self) -> None:
        if self.capture is not None:
            from ..kernel import JitKernel
            from ..targets import TARGETS

            for variant in self.capture.variants.values():
                kernel = JitKernel.lookup(variant.kernel)
                where = variant.jit_function or (locator(kernel.jit_function) if kernel else "")
                self.add(variant.specialization_data, where, TARGETS[variant.target].gpu_target, variant.key)
        with open(self.out, "a") as f:
            for row in self.rows.values():
                f.write(json.dumps(row) + "\n")
            for error in self.errors:
                f.write(json.dumps({"error": error}) + "\n")


_installed = False


def install_from_env() -> None:
    """Called at start-up of a recorded process: install the hook (and for a dry run, the target)."""
    global _installed
    out = os.environ.get(OUT_ENV)
    if not out or _installed:
        return
    _installed = True
    from triton import knobs

    target_name = os.environ.get(TARGET_ENV) or None
    recorder = _Recorder(out, target_name)
    if target_name is None:
        from triton.runtime.driver import driver

        def watch(*, key, fn, compile, **_):
            recorder.add(compile["specialization_data"], locator(fn.jit_function), driver.active.get_current_target(),
                         str(key))
            return False

        knobs.runtime.jit_cache_hook = watch
    else:
        from ..targets import TARGETS
        from ..trace import Capture, tracing

        recorder.capture = Capture()
        stack = contextlib.ExitStack()
        stack.enter_context(tracing(recorder.capture, TARGETS[target_name], all_kernels=True))
        atexit.register(stack.close)
    atexit.register(recorder.flush)  # runs before the stack closes: atexit is last-in, first-out


def read_record(path: str | Path) -> tuple[list[dict], list[str]]:
    rows: list[dict[str, Any]] = []
    errors: list[str] = []
    if not Path(path).exists():
        return rows, errors
    for line in Path(path).read_text().splitlines():
        if line.strip():
            item = json.loads(line)
            (errors.append(item["error"]) if "error" in item else rows.append(item))
    return rows, errors
