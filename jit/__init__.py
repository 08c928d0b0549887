"""The tritonwarm contract (kernels with a launch spec, specialization classes, tracing, targets) and
the warm-up built on it, in five layers, each importing only those below it. ``core/``: the contract,
fast dispatch. ``cache/``: what lies on disk and how it travels. ``serving/``: what a serving process
meets (the monitor of its compiles, why a variant misses, the C launchers it builds). ``adopt/``:
kernels tritonwarm did not write (autotuned stacks, other packages' kernels, recorded programs).
``pipeline/``: specs, plan, compile, warm-up, check, shard. Where an upper layer acts inside a lower
one (an autotuned stack in a trace, the serving ptxas in a memoized key), the lower one offers a hook
(``core/hooks.py``; ``hash_inputs`` in ``core/trace.py``) that the upper one fills when imported;
importing this package imports ``adopt/``, so the hooks are in place before anything traces."""

import importlib

from . import adopt  # noqa: F401 (plugs the adoption machinery into the core's hooks)

# The contract's names, imported at first use: ``torch`` comes with them, and a command that only
# reads the cache (list, du, bundle verify/install/merge, check --trace) never needs it.
_EXPORTS = {
    ".core.kernel": ["JitKernel", "Launch", "fake_launches", "in_fake_mode"],
    ".core.specialization": ["POINTER_CLASSES", "SCALAR_CLASSES", "class_reps", "fake_tensor", "pointer_class",
                             "scalar_class", "scalar_rep"],
    ".core.targets": ["TARGETS", "Target", "resolve_target", "resolve_targets", "target_driver"],
    ".core.trace": ["Variant", "capture", "trace_call"],
}
_MODULE_OF = {name: module for module, names in _EXPORTS.items() for name in names}
__all__ = list(_MODULE_OF)


def __getattr__(name: str):
    if name not in _MODULE_OF:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_MODULE_OF[name], __name__), name)
    globals()[name] = value
    return value
