"""Import a library under a target's answers, once per target and process.

Libraries ask where they run while they are imported: whether a Triton driver is active (and
replace ``triton.jit`` with a placeholder when none is), the GPU's capability, a platform probe
that picks the autotune config list, a ``tl.constexpr`` global computed from the device, a buffer
allocated on ``cuda`` at module level. A module imported on the build machine as it is would keep
the build machine's answers (or fail); keys, config lists and stored autotune winners would then be
the build machine's, not the server's.

``import_for_target(name, target)`` imports ``name`` inside ``target_answers(target)`` (Triton's
target-only driver, torch's device questions answered for the target, ``cuda`` allocations as
``ServerTensor`` s). Every module imported while a target's driver answers belongs to that target,
whoever imported it: the spec's launcher module, a library that module imports, a module of a
recorded program's import root, another spec row. A later lookup for the same target reuses it and
never runs it again: some libraries refuse a second import in one process (vLLM registers an opaque
type and custom ops at import). A module imported outside any target (with this machine's answers) is
imported afresh for a target: its top-level package is dropped first, so a probe in a sibling module
runs again (inside tritonwarm itself, only that module). Turning to another target puts the first
target's modules aside, out of ``sys.modules``, and brings back the other's, so each target's modules
run once in a process; a target that never imported them imports them afresh, under its own answers.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.abc
import sys
import threading
import types

from ..core.targets import Target, target_device_answers, target_driver
from .scripts import load_script

# Never imported per target: what tritonwarm itself runs on.
_KEPT = {"tritonwarm", "triton", "torch", "numpy", "yaml", "_pytest", "pytest"}  # only their own modules
_RUNTIME = {"triton", "torch", "numpy", "yaml"}  # nor anything inside them
_lock = threading.RLock()
_origin: dict[str, str | None] = {}  # module -> the target whose driver answered when it was imported (None: none)
_aside: dict[str, dict[str, types.ModuleType]] = {}  # target -> its modules, while another target's are in use
_current: str | None = None  # the target whose modules are in sys.modules


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


class _Watcher(importlib.abc.MetaPathFinder):
    """Notes the target whose driver answers while each module is imported; finds nothing itself.
    tritonwarm's own modules are noted only when asked for by name (``import_for_target``)."""

    def find_spec(self, fullname, path, target=None):
        if fullname.split(".")[0] not in _KEPT and not _kept(fullname):
            active = current_target()
            _origin[fullname] = active.name if active is not None else None
        return None


def _watch() -> None:
    if not any(isinstance(finder, _Watcher) for finder in sys.meta_path):
        sys.meta_path.insert(0, _Watcher())


def _turn_to(target_name: str) -> None:
    """Put the modules of other targets aside and bring back ``target_name``'s."""
    global _current
    if _current == target_name:
        return
    for name in list(sys.modules):
        origin = _origin.get(name)
        if origin is not None and origin != target_name:
            _aside.setdefault(origin, {})[name] = sys.modules.pop(name)
    for name, module in _aside.pop(target_name, {}).items():
        if name not in sys.modules:
            sys.modules[name] = module
            _origin[name] = target_name
    _current = target_name


def import_for_target(module_name: str, target: Target | None):
    """``module_name`` as ``target``'s server imports it: the module imported under its answers before
    (by anyone), else imported now under them; with no target, a plain import."""
    if target is None or _kept(module_name):
        return importlib.import_module(module_name)
    with _lock:
        _watch()
        _turn_to(target.name)
        module = sys.modules.get(module_name)
        if module is not None and _origin.get(module_name) == target.name:
            return module
        if module is not None:  # imported with this machine's answers
            _drop(_library(module_name))
        with target_answers(target):
            module = importlib.import_module(module_name)
        _origin[module_name] = target.name  # (one of tritonwarm's own is the target's only when asked for)
        return module


def load_script_for_target(path: str, target: Target | None):
    """A program's main script (``scripts.load_script``) as ``target``'s server runs it: loaded once per
    target, under its answers, so the libraries it imports are that target's too."""
    if target is None:
        return load_script(path)
    with _lock:
        _watch()
        _turn_to(target.name)
        module = sys.modules.get(path)
        if module is not None and _origin.get(path) == target.name:
            return module
        sys.modules.pop(path, None)  # loaded with this machine's answers
        with target_answers(target):
            module = load_script(path)
        _origin[path] = target.name
        return module


def import_failure(module_name: str, target: Target | None, error: BaseException) -> str:
    """One line for a module whose own code failed as it was imported: the module, the target, the
    user's line, the error, and where another target imported its library first in this process (a
    library that refuses a second import), what to do."""
    from ...errors import describe_error
    from ..core.server_tensors import raised_at

    under = f" under {target.name}'s answers" if target is not None else ""
    at = raised_at(error)
    library = _library(module_name)
    before = sorted(name for name, modules in _aside.items()
                    if any(m == library or m.startswith(library + ".") for m in modules))
    hint = (f" ({library} was imported for {', '.join(before)} earlier in this process: a library that refuses a "
            "second import warms one target per process: run one warm-up per target)") if before else ""
    return f"importing {module_name}{under} failed{f' at {at}' if at else ''}: {describe_error(error)}{hint}"


def import_afresh(module_name: str):
    """``module_name`` run again under whatever answers are in force (a played server's); then the
    modules it replaced are put back, so that a warm-up's own stay as they were."""
    library = _library(module_name)
    with _lock:
        replaced = _drop(library)
        try:
            return importlib.import_module(module_name)
        finally:
            _drop(library)
            for name, (module, origin) in replaced.items():
                sys.modules[name] = module
                _origin[name] = origin


def _drop(library: str) -> dict[str, tuple[types.ModuleType, str | None]]:
    """Take ``library``'s modules out of ``sys.modules`` (the next import runs them again); returns
    them with the target each was imported under."""
    prefix = library + "."
    return {name: (sys.modules.pop(name), _origin.get(name))
            for name in [n for n in sys.modules if n == library or n.startswith(prefix)]}
