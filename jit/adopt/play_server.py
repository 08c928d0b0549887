"""Play the serving process on a machine without its GPU: which cache entries would it ask for, and hit?

The judge of warm-up for code tritonwarm did not write. Inside ``playing_server(target, cache_dir)``
the machine answers as a ``target`` server does (Triton's driver, torch's device questions, tensors
on ``cuda``), modules are imported afresh under those answers (``served.import_module``), and host
code runs on *real* CPU tensors dressed as the server's (``served.tensor``): its data pointers,
storage sizes and values are real. Every Triton launch goes through Triton's own binder and key;
Triton's ``jit_cache_hook`` stops it there (nothing compiles, nothing launches) and the entry Triton
would read is looked up in ``cache_dir`` with Triton's own cache manager. An autotuner that would
benchmark (no stored winner it reads) is a miss too.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from triton import knobs


@dataclass
class ServedLaunch:
    kernel: str  # module.qualname
    key: str  # Triton's in-memory key
    cache_hash: str  # the disk-cache entry Triton reads for it
    hit: bool


@dataclass
class Served:
    """What the played server launched; ``misses`` are what it would compile (or benchmark) at serving time."""

    target: Any
    cache_dir: Any
    launches: list[ServedLaunch] = field(default_factory=list)
    benchmarks: list[str] = field(default_factory=list)  # autotuned calls with no winner the server reads

    @property
    def misses(self) -> list[str]:
        return [f"{x.kernel} {x.cache_hash[:12]}" for x in self.launches if not x.hit] + self.benchmarks

    def import_module(self, name: str):
        """``name`` imported afresh under the target's answers, as the server's process imports it."""
        from .imports import import_afresh

        return import_afresh(name)

    def tensor(self, value):
        """A real CPU tensor (lists, dicts walked) as host code on the server sees it: on ``cuda``."""
        from ..core.server_tensors import as_server_tensor

        return as_server_tensor(value)

    def call(self, fn: Callable, *args, **kwargs):
        """``fn(*args, **kwargs)``; an autotuner that wanted to benchmark is recorded as a miss."""
        from ..core.targets import NoBenchmarkError

        try:
            return fn(*args, **kwargs)
        except NoBenchmarkError:
            self.benchmarks.append(f"{getattr(fn, '__qualname__', fn)}: an autotuner benchmarks")
            return None


@contextlib.contextmanager
def playing_server(target, cache_dir):
    """``with playing_server(target, cache_dir) as served:`` import, call, then read ``served.misses``."""
    from triton.runtime.cache import get_cache_manager

    from ..cache.triton_dir import triton_cache_dir
    from ..core.trace import _hook_lock, disk_cache_hash
    from .foreign import kernel_for
    from .imports import target_answers

    served = Served(target, cache_dir)
    seen = {}

    def hook(*, key, fn, compile, **_):
        jit_function = fn.jit_function
        seen[id(jit_function)] = jit_function
        cache_hash = disk_cache_hash(kernel_for(jit_function), target, compile)
        name = jit_function.fn.__name__
        group = get_cache_manager(cache_hash).get_group(f"{name}.json") or {}
        served.launches.append(ServedLaunch(f"{jit_function.fn.__module__}.{jit_function.fn.__qualname__}",
                                            str(key), cache_hash, f"{name}.json" in group))
        return True  # found or not: nothing compiles, nothing launches

    with _hook_lock, target_answers(target, backing="cpu") as driver, triton_cache_dir(cache_dir):
        previous = knobs.runtime.jit_cache_hook
        knobs.runtime.jit_cache_hook = hook
        try:
            yield served
        finally:
            knobs.runtime.jit_cache_hook = previous
            for jit_function in seen.values():
                jit_function.device_caches.pop(driver.device, None)
