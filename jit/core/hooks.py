"""The core's openings for kernels it did not write; ``jit.adopt`` answers them from above.

The core traces and launches ``JitKernel`` s and knows nothing of other packages. Two things of
theirs reach it all the same:

- a ``@triton.autotune`` / ``@triton.heuristics`` stack, wrapped by a ``JitKernel`` or called by
  traced code: what it is built on, how it runs on fake inputs (every pruned config traced, nothing
  benchmarked) and in Triton's interpreter, and the block every trace runs in;
- a ``JITFunction`` that Triton's hook reports without a ``JitKernel`` around it (``capture: all``,
  serving): the object that names it.

``Adoption`` is what the core asks. ``jit.adopt`` installs its answers when it is imported, and the
package ``tritonwarm.jit`` imports it before any of its modules can run, so every process that can
trace has them. A trace without them would miss every kernel of another package without a word: a
core step that needs them while none are installed raises ``AdoptionMissing`` instead.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol


class KernelLike(Protocol):
    """What tracing, compiling and the serving monitor read of a kernel: a ``JitKernel`` has it, and
    so has the object ``Adoption.kernel_for`` gives for any other ``JITFunction``."""

    name: str  # module.qualname
    fn: Callable  # the Python function
    jit_function: Any  # the JITFunction that compiles

    @property
    def constexpr_names(self) -> set[str]: ...


class AdoptionMissing(RuntimeError):
    """A core step needs ``jit.adopt``'s answers and none are installed."""


@dataclass(frozen=True)
class Adoption:
    """The answers ``jit.adopt`` gives the core."""

    is_stack: Callable[[Any], bool]  # an Autotuner / Heuristics stack?
    base_jit_function: Callable[[Any], Any]  # the JITFunction at a stack's bottom (None: not found)
    fake_run: Callable[[Any, Any], Any]  # (stack, Launch): Triton's run(warmup=True), every pruned config
    interpreter_meta: Callable[[Any, tuple, dict], dict]  # (stack, args, kwargs): what it adds, interpreted
    autotuners: Callable[[Any], contextlib.AbstractContextManager]  # (state or None): every trace's block
    kernel_for: Callable[[Any], KernelLike]  # JITFunction -> its JitKernel, or a stand-in with its attributes
    choosing_among_configs: Callable[[], bool]  # is the compile request traced now one config of several?


_installed: Adoption | None = None


def install(answers: Adoption) -> None:
    """Called once, by ``jit.adopt`` as it is imported."""
    global _installed
    _installed = answers


def adoption() -> Adoption:
    """The installed answers; raises ``AdoptionMissing`` when there are none."""
    if _installed is None:
        raise AdoptionMissing("tritonwarm.jit.adopt is not installed in the core: a trace would miss every "
                              "kernel of another package; import tritonwarm.jit, which installs it")
    return _installed
