"""Import a library under a target's answers, and never reuse it for a target whose answers differ.

Libraries ask where they run while they are imported: whether a Triton driver is active (and
replace ``triton.jit`` with a placeholder when none is), the GPU's capability, a platform probe
that picks the autotune config list, a ``tl.constexpr`` global computed from the device, a buffer
allocated on ``cuda`` at module level. A module imported on the build machine as it is would keep
the build machine's answers (or fail); keys, config lists and stored autotune winners would then be
the build machine's, not the server's.

``import_for_target(name, target)`` imports ``name`` inside ``target_answers(target)`` (Triton's
target-only driver, torch's device questions answered for the target, ``cuda`` allocations as
``ServerTensor`` s). A library imported before, outside a target or for another one, is imported
afresh: its modules are dropped from ``sys.modules`` first (the whole top-level package, so a probe
in a sibling module runs again; for a module inside tritonwarm itself, only that module).
"""

from __future__ import annotations

import contextlib
import importlib
import sys
import threading

from ..core.targets import Target, target_device_answers, target_driver

# Never dropped: what tritonwarm itself runs on.
_KEPT = {"tritonwarm", "triton", "torch", "numpy", "yaml", "_pytest", "pytest"}  # only their own modules
_RUNTIME = {"triton", "torch", "numpy", "yaml"}  # nor anything inside them
_imported_for: dict[str, str] = {}  # library (see _library) -> the target it was last imported under
_lock = threading.RLock()


@contextlib.contextmanager
def target_answers(target: Target, backing: str = "meta"):
    """What a module sees of the machine inside the block: ``target``'s driver and device answers,
    and tensors allocated on ``cuda`` as ``ServerTensor`` s on ``backing`` (``meta`` while warming)."""
    from ..core.server_tensors import server_tensors

    with target_driver(target) as driver, target_device_answers(target), server_tensors(backing):
        yield driver


def current_target() -> Target | None:
    """The target whose target-only driver is active (warm-up, check), or None (a real GPU, none)."""
    from triton.runtime.driver import driver

    from ..core.targets import TargetOnlyDriver

    active = driver.__dict__.get("_active")
    return active.target if isinstance(active, TargetOnlyDriver) else None


def _library(module_name: str) -> str:
    """The unit imported afresh: the top-level package, or the module itself inside a kept package."""
    root = module_name.split(".")[0]
    return module_name if root in _KEPT else root


def _kept(module_name: str) -> bool:
    """Modules never imported afresh: the standard library, what tritonwarm runs on, tritonwarm's root."""
    root = module_name.split(".")[0]
    return module_name in _KEPT or root in _RUNTIME or root in getattr(sys, "stdlib_module_names", ())


def import_for_target(module_name: str, target: Target | None):
    """``module_name`` imported under ``target``'s answers (afresh when it was imported otherwise);
    with no target, a plain import."""
    if target is None or _kept(module_name):
        return importlib.import_module(module_name)
    library = _library(module_name)
    with _lock:
        if _imported_for.get(library) == target.name and module_name in sys.modules:
            return sys.modules[module_name]
        _forget(library)
        with target_answers(target):
            module = importlib.import_module(module_name)
        _imported_for[library] = target.name
        return module


def import_afresh(module_name: str):
    """``module_name`` run again under whatever answers are in force (a played server's), then
    forgotten, so that warm-up's next ``import_for_target`` imports its own copy."""
    library = _library(module_name)
    with _lock:
        _forget(library)
        try:
            return importlib.import_module(module_name)
        finally:
            _forget(library)


def _forget(library: str) -> None:
    """Drop ``library``'s modules so the next import runs them again (``foreign.find_jit_function`` no
    longer answers with their kernels)."""
    prefix = library + "."
    for name in [n for n in sys.modules if n == library or n.startswith(prefix)]:
        del sys.modules[name]
    _imported_for.pop(library, None)
