"""Tracing: run launchers on fake inputs and record the compile keys *Triton itself* computes.

Inside ``capture(target)`` every ``JitKernel`` call goes through Triton's real binder with
``warmup=True``; ``knobs.runtime.jit_cache_hook`` sees the key and the full compile request
(Triton's own serialized ``specialization_data``) and answers "skip", so nothing is compiled.
The recorded request is later compiled with Triton's own ``JITFunction.preload``, so the compiled
variant is byte for byte the one the runtime asks for.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import threading
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field, fields
from typing import Any

import triton.language as tl
from triton import knobs
from triton.runtime.jit import JITFunction

from .entry_names import entry_dir_name
from .hooks import KernelLike, adoption
from .kernel import FakeLaunchSink, JitKernel, Launch, fake_launches
from .targets import Target, target_device_answers


@dataclass
class Variant:
    """One compiled binary the runtime will ask for: a kernel, a target and Triton's key."""

    kernel: str  # JitKernel name (module.qualname)
    target: str
    key: str  # Triton's in-memory key, as Triton prints it
    specialization_data: str  # Triton's own serialized compile request (input of JITFunction.preload)
    args: dict[str, str]  # parameter -> readable class ("*bf16 aligned", "i32:div16", "=128")
    num_warps: int
    num_stages: int
    cache_hash: str  # sha256 of Triton's disk-cache key: the entry the runtime reads
    rows: list[str] = field(default_factory=list)  # spec rows that produce it
    import_path: str = ""  # module to import so that the kernel is defined (worker processes)
    entry_name: str = ""  # the kernel function's name: Triton names the entry's files after it
    jit_function: str = ""  # "module:qualname" of a kernel that is no JitKernel (captured by capture: all)
    constexpr_globals: dict[str, str] = field(default_factory=dict)  # module-level constexprs in Triton's hash
    autotuned: bool = False  # one config of an autotuner that chooses among several: over a limit, it is skipped
    shared_estimate: int | None = None  # shared memory (bytes) as its launch spec estimated it

    @property
    def variant_id(self) -> str:
        """Short, stable name for the CLI: the start of Triton's own disk-cache hash."""
        return self.cache_hash[:12]

    @property
    def entry_dir(self) -> str:
        """The entry folder's name in the cache directory (the manifest's ``entry_dir``)."""
        return entry_dir_name(self.cache_hash)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Variant:
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.variant_id,
            "kernel": self.kernel,
            "target": self.target,
            "key": self.key,
            "args": self.args,
            "num_warps": self.num_warps,
            "num_stages": self.num_stages,
            "cache_hash": self.cache_hash,
            "rows": self.rows,
            "import_path": self.import_path,
            "entry_name": self.entry_name,
            "jit_function": self.jit_function,
            "specialization_data": self.specialization_data,
            "constexpr_globals": self.constexpr_globals,
            "autotuned": self.autotuned,
            "shared_estimate": self.shared_estimate,
        }


_hook_lock = threading.RLock()


class Capture(FakeLaunchSink):
    """Collects the variants of every fake launch; deduplicated by (kernel, key).

    Launches made inside ``with cap.row(label):`` are credited to that row (``keys_of(label)``);
    ``import_path`` names the module a worker process imports so that the kernels are defined.
    """

    def __init__(self, import_path: str = ""):
        self.variants: dict[tuple[str, str], Variant] = {}
        self.current_row: str | None = None
        self.import_path = import_path
        self.row_keys: dict[str, set[str]] = {}  # row label -> cache hashes it launches
        self.launches = 0
        self.foreign: dict[int, JITFunction] = {}  # kernels reached by capture: all, by identity

    def any_kernel_hook(self, target: Target):
        """Triton's ``jit_cache_hook`` for ``capture: all``: record every compile request, compile nothing."""
        answers = adoption()

        def hook(*, key, fn, compile, **_):
            jit_function = fn.jit_function
            self.foreign[id(jit_function)] = jit_function
            self._record(answers.kernel_for(jit_function), target, compile, answers.choosing_among_configs())
            return True

        return hook

    @contextlib.contextmanager
    def row(self, label: str):
        """Credit the launches inside the block to the row ``label``."""
        previous, self.current_row = self.current_row, label
        try:
            yield
        finally:
            self.current_row = previous

    def keys_of(self, label: str) -> set[str]:
        """The cache hashes the row ``label`` launched (empty: it launched nothing)."""
        return self.row_keys.get(label, set())

    def launch(self, kernel: JitKernel, launch: Launch, target: Target) -> None:
        seen: list[tuple[dict, bool]] = []
        choosing_among_configs = adoption().choosing_among_configs

        def hook(*, key, fn, compile, **_):
            seen.append((compile, choosing_among_configs()))
            return True  # never compile while tracing

        with _hook_lock:
            previous = knobs.runtime.jit_cache_hook
            knobs.runtime.jit_cache_hook = hook
            try:
                kernel.fake_run(launch)
            finally:
                knobs.runtime.jit_cache_hook = previous
        self.launches += 1
        estimate = kernel.shared_estimate(launch, target) if kernel.shared_estimate is not None else None
        for request, autotuned in seen:
            self._record(kernel, target, request, autotuned, estimate)

    def _record(self, kernel: KernelLike, target: Target, request: dict, autotuned: bool = False,
                shared_estimate: int | None = None) -> None:
        key = str(request["key"])
        variant = self.variants.get((kernel.name, key))
        if variant is not None:
            variant.autotuned = variant.autotuned and autotuned  # launched directly too: it must launch
        else:
            _refuse_dtype_named_strings(kernel, request)  # once per variant, not on every launch of it
            variant = Variant(
                kernel=kernel.name,
                target=target.name,
                key=key,
                specialization_data=request["specialization_data"],
                args=readable_args(kernel, request),
                num_warps=int(request["num_warps"]),
                num_stages=int(request["num_stages"]),
                cache_hash=_memoized_disk_cache_hash(kernel, target, request, key),
                import_path=self.import_path,
                entry_name=kernel.fn.__name__,
                jit_function=getattr(kernel, "locator", ""),
                constexpr_globals=constexpr_globals(kernel.jit_function),
                autotuned=autotuned,
                shared_estimate=shared_estimate,
            )
            self.variants[(kernel.name, key)] = variant
        if self.current_row is not None:
            self.row_keys.setdefault(self.current_row, set()).add(variant.cache_hash)
            if self.current_row not in variant.rows:
                variant.rows.append(self.current_row)


@contextlib.contextmanager
def tracing(cap: Capture, target: Target, all_kernels: bool = False, autotune=None, meta_as_cuda: bool = False):
    """Fake launches into ``cap`` for ``target``: JitKernels always; with ``all_kernels`` every
    ``JITFunction`` the code reaches (direct ``kernel[grid](...)``, autotuners, heuristics, other
    packages' kernels), through Triton's own hook, with device questions answered for the target.
    ``meta_as_cuda`` (a dry-run record): the program's ``meta`` tensors are seen as the server's too.
    Autotuners reached inside follow ``autotune`` (a fresh state when None), which the block yields."""
    from .server_tensors import server_tensors

    autotuners = adoption().autotuners
    with contextlib.ExitStack() as stack:
        fake_driver = stack.enter_context(fake_launches(cap, target))
        state = stack.enter_context(autotuners(autotune))
        if all_kernels:
            stack.enter_context(target_device_answers(target))
            stack.enter_context(server_tensors("meta", meta_as_cuda))  # cuda allocations: as on the server
            stack.enter_context(_hook_lock)
            previous = knobs.runtime.jit_cache_hook
            knobs.runtime.jit_cache_hook = cap.any_kernel_hook(target)
            stack.callback(setattr, knobs.runtime, "jit_cache_hook", previous)
            stack.callback(lambda: [f.device_caches.pop(fake_driver.device, None) for f in cap.foreign.values()])
        yield state


@contextlib.contextmanager
def capture(target: Target, all_kernels: bool = False, import_path: str = ""):
    """``with capture(target) as cap: launcher(fake inputs)`` → ``cap.variants``."""
    cap = Capture(import_path)
    with tracing(cap, target, all_kernels):
        yield cap


def trace_call(target: Target, fn: Callable, *args, all_kernels: bool = False, **kwargs) -> list[Variant]:
    """The variants one call of a launcher (or a ``JitKernel``) needs on ``target``."""
    with capture(target, all_kernels) as cap:
        fn(*args, **kwargs)
    return list(cap.variants.values())


def constexpr_globals(jit_function: JITFunction) -> dict[str, str]:
    """The module-level ``tl.constexpr`` values a kernel and its ``@triton.jit`` helpers read, as Triton
    hashes them into every key of the kernel: ``{name: repr(value)}``. A value computed when the module
    is imported (from an environment variable, or the machine) is how one kernel source gets other
    keys on a build machine than on a server; recorded, a miss can name it."""
    jit_function.cache_key  # noqa: B018 (Triton collects the globals while it hashes the source)
    values: dict[str, set[str]] = {}
    for (name, _), (value, _) in getattr(jit_function, "used_global_vals", {}).items():
        if isinstance(value, tl.constexpr):
            values.setdefault(name, set()).add(repr(value.value)[:80])
    return {name: " | ".join(sorted(reprs)) for name, reprs in sorted(values.items())}


def readable_args(kernel: KernelLike, request: dict) -> dict[str, str]:
    """Each parameter's class as Triton specialized it, from Triton's own signature and attributes."""
    signature: dict[str, Any] = request["signature"]
    constants = {_path(k): v for k, v in request["constants"].items()}
    attrs = {_path(k): v for k, v in (request["configs"][0] if request["configs"] else {}).items()}
    constexpr_names = kernel.constexpr_names
    out = {}
    for index, (name, ty) in enumerate(signature.items()):
        divisible = any(a[0] == "tt.divisibility" for a in attrs.get(index, []))
        if ty == "constexpr":
            value = constants.get(index)
            value = getattr(value, "value", value)
            out[name] = f"={value}" if name in constexpr_names else ("one" if value == 1 else f"={value}")
        elif isinstance(ty, str) and ty.startswith("*"):
            out[name] = f"{ty} {'aligned' if divisible else 'unaligned'}"
        elif ty in ("i32", "i64", "u64"):
            out[name] = f"{ty}:div16" if divisible else ty
        else:
            out[name] = str(ty)
    return out


def _path(key):
    return key[0] if isinstance(key, tuple) and len(key) == 1 else key


_HASHES: dict[tuple, str] = {}
# What else a disk-cache hash depends on that a process can change while it runs (the serving
# environment's ptxas, ``cache/serving.py``): each a function of no argument, added by the module that
# changes it when it is imported, so a memoized hash is never one of another setting.
hash_inputs: list[Callable[[], Hashable]] = []


def _refuse_dtype_named_strings(kernel, request: dict) -> None:
    """A string constexpr that names a Triton dtype ("bf16", "fp32") cannot be warmed faithfully.

    Triton serializes a dtype constexpr as its name, so ``JITFunction.preload`` (what warm-up compiles
    with) reads the string back as a ``tl.dtype``: a different kernel (``"bf16" == E2M1`` is then
    false) compiled under the very cache hash the runtime computes for the string, which the runtime
    would load without a word. Refused here, by name, while tracing.
    """
    names = list(request["signature"])
    for key, value in request["constants"].items():
        if isinstance(value, str) and tl.dtype.is_dtype(value):
            index = key[0] if isinstance(key, tuple) else key
            name = names[index] if isinstance(index, int) and index < len(names) else index
            raise ValueError(f"{kernel.name}: constexpr {name}={value!r} names a Triton dtype; Triton's "
                             "preload (which warm-up compiles with) reads it back as that dtype, a different "
                             "kernel under the same cache hash: use another string")


def _memoized_disk_cache_hash(kernel: JitKernel, target: Target, request: dict, key: str) -> str:
    """Hashing Triton's source objects costs milliseconds, and a process sees the same requests again
    and again (every step of an engine dry run). Kernel sources do not change while it runs; the
    cache-invalidating environment, ``triton_key()`` and the ptxas text hashed (warming for another
    environment) can, so they are part of the memo key."""
    from triton._C.libtriton import get_cache_invalidating_env_vars
    from triton.runtime import cache as triton_cache

    memo = (kernel.name, target.name, key, tuple(sorted(get_cache_invalidating_env_vars().items())),
            triton_cache.triton_key(), knobs.runtime.add_stages_inspection_hook, tuple(f() for f in hash_inputs))
    if memo not in _HASHES:
        _HASHES[memo] = disk_cache_hash(kernel, target, request)
    return _HASHES[memo]


def disk_cache_hash(kernel: JitKernel, target: Target, request: dict) -> str:
    """The hash naming the disk-cache entry Triton will read or write for this compile request.

    Computed with Triton's own ``get_cache_key`` on the same source object ``_do_compile`` builds,
    and checked against ``CompiledKernel.hash`` by the tests; it depends on Triton's version, the
    backend (ptxas / arch), the options and the cache-invalidating environment variables, so a
    manifest entry whose hash differs from it is stale.
    """
    from triton._C.libtriton import get_cache_invalidating_env_vars
    from triton.compiler.compiler import ASTSource, make_backend
    from triton.runtime.cache import get_cache_key

    data = json.loads(request["specialization_data"])
    backend = make_backend(target.gpu_target)
    attrs = request["configs"][0] if request["configs"] else {}
    src = ASTSource(kernel.jit_function, request["signature"], request["constants"], attrs)
    options = {k: tuple(v) if isinstance(v, list) else v for k, v in data["options"].items()}
    options = backend.parse_options(options)
    options = backend.parse_options(dict(options.__dict__, **src.parse_options()))
    key = get_cache_key(src, backend, options, get_cache_invalidating_env_vars())
    if knobs.runtime.add_stages_inspection_hook is not None and _compile_keys_custom_pipelines():
        key += knobs.runtime.add_stages_inspection_hook()[0]  # a custom pass pipeline, as compile() adds it
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


def _compile_keys_custom_pipelines() -> bool:
    """Whether this Triton's ``compile()`` puts a custom pipeline's key (``add_stages_inspection_hook``)
    into the disk-cache key: Triton 3.7 and later do; 3.6 compiles the custom pipeline unkeyed."""
    from triton.compiler.compiler import compile as triton_compile

    return "add_stages_inspection_hook" in triton_compile.__code__.co_names
