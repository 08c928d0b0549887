"""The tritonwarm contract: kernels with a launch spec, specialization classes, tracing, targets,
the warm-up cache."""

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
