"""Kernels you did not write: ``@triton.autotune`` / ``@triton.heuristics`` stacks (``autotune``) and their
stored winners (``winners``), ``JITFunction``s reached without a ``JitKernel`` (``foreign``), and
recording a whole program's launches as a replayable plan (``record``).

Importing this package plugs it into the core's hooks (``core/hooks.py``); ``tritonwarm.jit`` does."""

from ..core import hooks
from . import autotune, foreign

hooks.install(hooks.Adoption(
    is_stack=autotune.is_stack,
    base_jit_function=autotune.base_jit_function,
    fake_run=autotune.fake_run,
    interpreter_meta=autotune.resolve_for_interpreter,
    autotuners=autotune.autotuners,
    kernel_for=foreign.kernel_for,
    choosing_among_configs=autotune.choosing_among_configs,
))
