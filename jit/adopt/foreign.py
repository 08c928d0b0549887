"""Kernels that are no ``JitKernel``: a plain ``@triton.jit`` function of any package, found again by name.

``capture: all`` and ``record`` see such kernels only through Triton's hook; compiling their variants
later (in another process, for another target) needs the ``JITFunction`` back. It is located by
``module:qualname`` of its Python function, which a ``Variant`` records.
"""

from __future__ import annotations

import sys
import threading

from triton.runtime.jit import JITFunction

from .scripts import is_script_locator

_seen: dict[str, JITFunction] = {}  # locator -> kernel, for kernels defined where import cannot reach
_seen_lock = threading.Lock()


class ForeignKernel:
    """What tracing and compiling need of a kernel: the same attributes a ``JitKernel`` offers."""

    def __init__(self, jit_function: JITFunction):
        self.jit_function = jit_function
        self.fn = jit_function.fn
        self.locator = locator(jit_function)
        self.name = f"{self.fn.__module__}.{self.fn.__qualname__}"

    @property
    def constexpr_names(self) -> set[str]:
        return {p.name for p in self.jit_function.params if p.is_constexpr}

    @property
    def param_names(self) -> list[str]:
        return [p.name for p in self.jit_function.params]

    def __repr__(self) -> str:
        return f"ForeignKernel({self.locator})"


def locator(jit_function: JITFunction) -> str:
    return f"{jit_function.fn.__module__}:{jit_function.fn.__qualname__}"


def kernel_for(jit_function: JITFunction):
    """The ``JitKernel`` built on ``jit_function`` if there is one, else a ``ForeignKernel``."""
    from ..core.kernel import JitKernel

    for kernel in JitKernel.registry():
        if kernel.jit_function is jit_function:
            return kernel
    with _seen_lock:
        _seen.setdefault(locator(jit_function), jit_function)
    return ForeignKernel(jit_function)


def _still_defined(jit_function: JITFunction) -> bool:
    """Whether a kernel seen before is its module's today: not one of a module since dropped from
    ``sys.modules`` or imported afresh (``imports.py``)."""
    module = sys.modules.get(jit_function.fn.__module__)
    return module is not None and vars(module) is jit_function.fn.__globals__


def find_jit_function(where: str, target=None) -> JITFunction:
    """``module:qualname`` → the ``JITFunction`` (unwrapping ``@triton.autotune`` / ``@triton.heuristics``).

    With ``target`` the module is imported under that target's answers (``imports.import_for_target``,
    afresh if it was imported otherwise): its kernel is the one that target's serving process defines.
    Without, a kernel already seen in this process, else a plain import (a running program's own)."""
    from .autotune import base_jit_function
    from .imports import import_failure, import_for_target, load_script_for_target

    module_name, _, qualname = where.rpartition(":")  # a script's path may hold a colon
    with _seen_lock:
        known = _seen.get(where)
    if known is not None and target is None and _still_defined(known):
        return known
    if is_script_locator(module_name):  # defined in a program's main script (``record``)
        try:
            module = load_script_for_target(module_name, target)
        except (OSError, SyntaxError) as e:
            raise LookupError(f"kernel {where}: cannot load the script {module_name}: {e}") from None
    else:
        try:
            module = import_for_target(module_name, target)
        except ImportError as e:
            if known is not None:  # a kernel seen in this process that import cannot reach
                return known
            raise LookupError(f"kernel {where}: cannot import {module_name!r}: {e}") from None
        except Exception as e:  # the module's own code failed as it was imported: say where
            raise LookupError(f"kernel {where}: {import_failure(module_name, target, e)}") from e
    obj = module
    for part in qualname.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            break
    candidates = [obj] if obj is not None else []
    candidates += list(vars(module).values())  # a kernel bound under another name
    for candidate in candidates:
        found = candidate if isinstance(candidate, JITFunction) else base_jit_function(candidate)
        if found is not None and found.fn.__qualname__ == qualname and found.fn.__module__ == module_name:
            return found
    skipped = getattr(module, "__tritonwarm_skipped__", [])
    raise LookupError(f"kernel {where}: {module_name!r} defines no @triton.jit function {qualname!r} "
                      "at module level" + (f" (statements that failed when it was loaded: {'; '.join(skipped)})"
                                           if skipped else ""))
