"""The tritonwarm contract (kernels with a launch spec, specialization classes, tracing, targets) and
the warm-up built on it, in five layers, each importing only those below it. ``core/``: the contract,
fast dispatch. ``cache/``: what lies on disk and how it travels. ``serving/``: what a serving process
meets (the monitor of its compiles, why a variant misses, the C launchers it builds). ``adopt/``:
kernels tritonwarm did not write (autotuned stacks, other packages' kernels, recorded programs).
``pipeline/``: specs, plan, compile, warm-up, check, shard. Where an upper layer acts inside a lower
one (an autotuned stack in a trace, the serving ptxas in a memoized key), the lower one offers a hook
(``core/hooks.py``; ``hash_inputs`` in ``core/trace.py``) that the upper one fills when imported;
importing this package imports ``adopt/``, so the hooks are in place before anything traces."""

from . import adopt  # noqa: F401 (plugs the adoption machinery into the core's hooks)
from .core.kernel import JitKernel, Launch, fake_launches, in_fake_mode
from .core.specialization import (
    POINTER_CLASSES,
    SCALAR_CLASSES,
    class_reps,
    fake_tensor,
    pointer_class,
    scalar_class,
    scalar_rep,
)
from .core.targets import TARGETS, Target, resolve_target, resolve_targets, target_driver
from .core.trace import Variant, capture, trace_call

__all__ = [
    "JitKernel", "Launch", "fake_launches", "in_fake_mode",
    "POINTER_CLASSES", "SCALAR_CLASSES", "class_reps", "fake_tensor", "pointer_class", "scalar_class", "scalar_rep",
    "TARGETS", "Target", "resolve_target", "resolve_targets", "target_driver",
    "Variant", "capture", "trace_call",
]
