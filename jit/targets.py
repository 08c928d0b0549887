"""Compile targets, and the target-only driver that lets Triton compile for a GPU this machine lacks.

Triton asks its *active driver* for the target, device and stream before it compiles. A machine
with no GPU has no driver, so ``JITFunction.warmup`` fails with "0 active drivers". Installing an
object that only answers those three questions is enough for Triton's real binder, key and compiler
to run. ``target_driver`` is the one place that installs it, and it restores the previous driver on
every exit path (``driver.reset_active()`` itself fails on a GPU-less machine).
"""

from __future__ import annotations

import contextlib
import itertools
import threading
from dataclasses import dataclass

from triton.backends.compiler import GPUTarget
from triton.runtime.driver import driver


class UnknownTargetError(ValueError):
    pass


@dataclass(frozen=True)
class Target:
    name: str
    backend: str  # "cuda" or "hip"
    arch: int | str
    warp_size: int

    @property
    def gpu_target(self) -> GPUTarget:
        return GPUTarget(self.backend, self.arch, self.warp_size)

    @property
    def is_nvidia(self) -> bool:
        return self.backend == "cuda"

    @property
    def binary_ext(self) -> str:
        return "cubin" if self.is_nvidia else "hsaco"


TARGETS: dict[str, Target] = {
    t.name: t
    for t in (
        Target("sm80", "cuda", 80, 32),
        Target("sm86", "cuda", 86, 32),
        Target("sm89", "cuda", 89, 32),
        Target("sm90", "cuda", 90, 32),
        Target("sm100", "cuda", 100, 32),
        Target("sm120", "cuda", 120, 32),
        Target("gfx90a", "hip", "gfx90a", 64),
        Target("gfx942", "hip", "gfx942", 64),
        Target("gfx950", "hip", "gfx950", 64),
    )
}


def target_from_gpu_target(gpu: GPUTarget) -> Target:
    if gpu.backend == "cuda":
        name = f"sm{gpu.arch}"
    else:
        name = str(gpu.arch).split(":")[0]
    known = TARGETS.get(name)
    return known if known is not None else Target(name, gpu.backend, gpu.arch, gpu.warp_size)


def local_target() -> Target | None:
    """The target of the GPU in this machine, or None when there is none."""
    try:
        import torch

        if not torch.cuda.is_available():
            return None
        return target_from_gpu_target(driver.active.get_current_target())
    except Exception:
        return None


def resolve_target(name: str | None) -> Target:
    """``sm90`` / ``gfx942`` / ... / ``local``; None means the local GPU. Errors list the choices."""
    if name in (None, "local"):
        target = local_target()
        if target is None:
            raise UnknownTargetError(
                f"no GPU on this machine: pass --target, one of {', '.join(TARGETS)}"
            )
        return target
    target = TARGETS.get(name)
    if target is None:
        raise UnknownTargetError(f"unknown target {name!r}: choose one of {', '.join(TARGETS)}, local")
    return target


def resolve_targets(names: str | None) -> list[Target]:
    """A comma-separated list of targets (``sm90,gfx942``), deduplicated in order."""
    parts = [None] if names is None else [p.strip() for p in names.split(",") if p.strip()]
    seen: dict[str, Target] = {}
    for part in parts or [None]:
        target = resolve_target(part)
        seen.setdefault(target.name, target)
    return list(seen.values())


class TargetOnlyDriver:
    """Answers what Triton's compile path asks a driver; launches nothing.

    Each instance reports a device of its own, so the per-device caches Triton keeps on every
    ``JITFunction`` (binder, in-memory kernels) start empty: a trace under it sees every key.
    """

    _ids = itertools.count()

    def __init__(self, target: Target):
        self.target = target
        self.device = f"tritonwarm:{target.name}:{next(self._ids)}"

    def get_current_target(self) -> GPUTarget:
        return self.target.gpu_target

    def get_current_device(self):
        return self.device

    def get_current_stream(self, device=None):
        return 0

    def is_active(self) -> bool:
        return True


_driver_lock = threading.RLock()


@contextlib.contextmanager
def target_driver(target: Target):
    """Make Triton compile for ``target`` inside the block, whatever GPU (if any) this machine has."""
    fake = TargetOnlyDriver(target)
    with _driver_lock:
        previous = driver._active
        driver.set_active(fake)
        try:
            yield fake
        finally:
            driver._active = previous
