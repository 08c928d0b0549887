"""Fast dispatch: launch an already-compiled kernel directly when a call's specialization is known.

Triton's ``JITFunction.run`` re-binds every argument, re-reads several knobs, builds launch metadata
and looks the kernel up on every call (8–12 µs of Python, facebookexperimental/triton #1231). For a
launch whose *specialization signature* — each argument's class as Triton specializes it, the
constexprs and the options — was seen before, this cache hands the same ``CompiledKernel`` its
arguments directly. Anything unusual (a new class or dtype, an argument type not handled here,
launch hooks installed) goes through Triton's own path, which also fills the cache. The signature
uses the same classes Triton does (``specialization.py``, property-tested against Triton), and a
test checks on every kernel of the library that both paths pick the same compiled kernel.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from triton import knobs
from triton.runtime.driver import driver

_I32_MIN, _I32_MAX, _I64_MAX = -(2**31), 2**31 - 1, 2**63 - 1
_MISSING = object()
MEMO_ENTRIES = 4096  # bound launches kept per kernel


_DEVICE_QUERIES: dict = {}  # driver -> its current-device query, resolved once


def _resolve_device_query(active) -> Any:
    """``active.get_current_device`` minus the Python layers where it is torch's own query.

    Triton 3.6's CUDA and HIP drivers answer with ``torch.cuda.current_device``, which is Python
    (lazy init, then ``torch._C._cuda_getDevice``); that C function does the lazy init itself (bad
    fork check included), so calling it directly is the same answer without the Python. Triton 3.9
    answers with its own C function already.
    """
    query = active.get_current_device
    if query is getattr(torch.cuda, "current_device", None) and hasattr(torch._C, "_cuda_getDevice"):
        query = torch._C._cuda_getDevice
    if len(_DEVICE_QUERIES) >= 16:  # warm-up swaps in a target-only driver per target: stay bounded
        _DEVICE_QUERIES.clear()
    _DEVICE_QUERIES[active] = query
    return query


def current_device(active) -> Any:
    """The current device as ``active`` (Triton's active driver) names it: what every launch keys on."""
    return (_DEVICE_QUERIES.get(active) or _resolve_device_query(active))()


def _classifier(types: tuple, flags: list, hip: bool = False) -> Any:
    """Straight-line code computing the specialization of arguments of these exact types.

    Generated once per argument-type pattern (as Triton generates its binder), so the per-call
    cost is a few attribute reads and comparisons, with no loop and no per-argument calls.
    Returns None for a type the fast path does not handle.
    """
    terms = []
    for i, (kind, (specialize, align)) in enumerate(zip(types, flags, strict=True)):
        a = f"a[{i}]"
        if issubclass(kind, torch.Tensor):
            terms.append(f"{a}.dtype")
            if align:
                terms.append(f"{a}.data_ptr() & 15 == 0")
            if hip:  # HIP's buffer ops: a pointer-range attribute for storages of at most 2 GiB
                terms.append(f"{a}.untyped_storage().size() <= {_I32_MAX}")
        elif kind is int:
            width = f"(0 if {_I32_MIN} <= {a} <= {_I32_MAX} else 1 if {a} <= {_I64_MAX} else 2)"
            terms.append(f"(-1 if {a} == 1 else {width} * 2 + ({a} & 15 == 0))" if specialize else width)
        elif kind not in (float, bool, type(None)):
            return None
    namespace: dict = {}
    exec(f"def classify(a):\n    return ({', '.join(terms)}{',' if terms else ''})", namespace)  # noqa: S102
    return namespace["classify"]


class FastDispatch:
    """``signature → (CompiledKernel, constexpr values)`` for one ``JITFunction``."""

    def __init__(self, jit_function):
        self.jit_function = jit_function
        params = jit_function.params
        runtime = [p for p in params if not p.is_constexpr]
        constexprs = [p for p in params if p.is_constexpr]
        # Triton launches with every parameter in order; the direct call below appends the
        # constexprs after the runtime arguments, so it only applies when they come last.
        self.enabled = params == runtime + constexprs
        self.constexpr_params = constexprs
        self.flags = [(not p.do_not_specialize, not (p.do_not_specialize or p.do_not_specialize_on_alignment))
                      for p in runtime]
        self.cache: dict[Any, tuple] = {}
        self.classifiers: dict[tuple, Any] = {}
        self.hip_devices: dict[Any, bool] = {}  # device -> whether its backend is HIP

    def signature(self, launch, device=None) -> tuple | None:
        args = launch.args
        hip = self.hip_devices.get(device)
        if hip is None:
            hip = self.hip_devices[device] = driver.active.get_current_target().backend == "hip"
        types = tuple(map(type, args))
        classify = self.classifiers.get((types, hip), _MISSING)
        if classify is _MISSING:
            classify = self.classifiers[(types, hip)] = _classifier(types, self.flags, hip)
        if classify is None:
            return None  # tuples, descriptors, dtypes...: Triton's own path
        return (types, classify(args), tuple(launch.constexprs.items()), launch.num_warps, launch.num_stages,
                tuple(launch.options.items()) if launch.options else ())

    def launch(self, launch):
        """Launch directly when possible; otherwise through ``JITFunction.run`` (and remember)."""
        active = driver.active
        device = current_device(active)
        hooks = knobs.runtime.launch_enter_hook
        signature = None
        if self.enabled and not getattr(hooks, "calls", hooks):
            try:
                signature = (device, self.signature(launch, device))
                entry = self.cache.get(signature) if signature[1] is not None else None
            except TypeError:  # an unhashable constexpr or option
                signature, entry = None, None
            if entry is not None:
                kernel, constants = entry
                grid = launch.grid
                size = len(grid)
                kernel.run(grid[0], grid[1] if size > 1 else 1, grid[2] if size > 2 else 1,
                           active.get_current_stream(device), kernel.function, kernel.packed_metadata, None, None,
                           None, *launch.args, *constants)
                return kernel
        kernel = self.jit_function.run(*launch.args, grid=launch.grid, warmup=False, **launch.kwargs())
        if signature is not None and signature[1] is not None and hasattr(kernel, "packed_metadata"):
            constants = tuple(launch.constexprs.get(p.name, p.default) for p in self.constexpr_params)
            self.cache[signature] = (kernel, constants)
        return kernel

    def chosen_kernel(self, launch):
        """The kernel the fast path would launch for ``launch`` (None: it would defer to Triton)."""
        device = current_device(driver.active)
        signature = self.signature(launch, device)
        entry = self.cache.get((device, signature)) if signature else None
        return entry[0] if entry else None


def _input_keyer(types: tuple, hip: bool = False) -> Any:
    """Straight-line code computing everything a memoizable launch spec may read from its inputs.

    A tensor contributes its dtype, shape, strides, whether it is on the CPU (the interpreter's
    cue), its 16-byte alignment and, on HIP, its buffer-ops storage class; a scalar its exact value.
    That covers Triton's specialization of the tensors themselves, and every launch argument the spec
    derives from them is fixed by the key. Returns None for an input type not handled here.
    """
    terms = []
    for i, kind in enumerate(types):
        a = f"a[{i}]"
        if issubclass(kind, torch.Tensor):
            terms += [f"{a}.dtype", f"{a}.shape", f"{a}.stride()", f"{a}.is_cpu", f"{a}.data_ptr() & 15"]
            if hip:
                terms.append(f"{a}.untyped_storage().size() <= {_I32_MAX}")
        elif kind in (int, float, bool, str, type(None)):
            terms.append(a)
        else:
            return None
    namespace: dict = {}
    exec(f"def key(a):\n    return ({', '.join(terms)}{',' if terms else ''})", namespace)  # noqa: S102
    return namespace["key"]


class LaunchMemo:
    """``input key → bound launch`` for a launch spec that depends only on its inputs' metadata.

    The first call with a key runs the spec and launches through ``FastDispatch`` (Triton's own
    path the first time of a signature); once that has the compiled kernel, the memo keeps the
    kernel, the grid, and where each launch argument comes from: an input (tensors, by identity)
    or a constant the spec computed. Every later call with the same key is one key computation,
    one dict lookup and the driver launch: no spec, no ``Launch``, no signature. The kernel is the
    one the fast path (and so Triton) chose for the first call's signature, which the key fixes.
    """

    def __init__(self, fast: FastDispatch):
        self.fast = fast
        self.keyers: dict[tuple, Any] = {}
        self.entries: dict[Any, Any] = {}
        self.replays: dict[tuple, Any] = {}

    def key(self, inputs: tuple, device) -> Any:
        hip = self.fast.hip_devices.get(device)
        if hip is None:
            hip = self.fast.hip_devices[device] = driver.active.get_current_target().backend == "hip"
        types = tuple(map(type, inputs))
        keyer = self.keyers.get((types, hip), _MISSING)
        if keyer is _MISSING:
            keyer = self.keyers[(types, hip)] = _input_keyer(types, hip)
        return None if keyer is None else (device, types, keyer(inputs))

    def remember(self, key, inputs: tuple, launch) -> None:
        """After ``launch`` went through the fast path: bind it to ``key`` if it can be replayed."""
        grid = launch.grid
        if callable(grid) or not self.fast.enabled:
            return
        device = key[0]
        signature = self.fast.signature(launch, device)
        entry = self.fast.cache.get((device, signature)) if signature is not None else None
        if entry is None:
            return
        kernel, constants = entry
        ids = {id(x): i for i, x in enumerate(inputs) if isinstance(x, torch.Tensor)}
        sources = []
        for value in launch.args:
            if isinstance(value, torch.Tensor):
                if id(value) not in ids:
                    return  # a tensor the spec made (a view, a buffer): not replayable from the inputs
                sources.append(f"a[{ids[id(value)]}]")
            else:
                sources.append(f"c[{len(sources)}]")
        size = len(grid)
        dims = (grid[0], grid[1] if size > 1 else 1, grid[2] if size > 2 else 1)
        pattern = tuple(sources)
        replay = self.replays.get(pattern)
        if replay is None:  # generated once per argument pattern, shared by every key with that pattern
            namespace: dict = {}
            exec("def replay(k, g, c, constants, a, stream):\n"  # noqa: S102
                 "    k.run(g[0], g[1], g[2], stream, k.function, k.packed_metadata, None, None, None, "
                 f"{''.join(s + ', ' for s in sources)}*constants)\n"
                 "    return k", namespace)
            replay = self.replays[pattern] = namespace["replay"]
        if len(self.entries) >= MEMO_ENTRIES:  # many shapes (prefill token counts): start over, stay bounded
            self.entries.clear()
        # constants only: holding the first call's tensors would keep their memory alive
        held = tuple(None if isinstance(v, torch.Tensor) else v for v in launch.args)
        self.entries[key] = functools.partial(replay, kernel, dims, held, constants)
