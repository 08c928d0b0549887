"""``JitKernel``: one Triton kernel plus its launch spec, the single source of truth for a launch.

A launch spec is a plain function from runtime inputs (tensors, ints, floats) to a ``Launch``: grid,
kernel arguments, constexprs and options. Calling a ``JitKernel`` always runs its launch spec; what
happens next depends on the mode the call is made in, and only that last step differs:

- normal: launch on the GPU (or in Triton's interpreter for CPU tensors / ``TRITON_INTERPRET=1``);
- inside ``fake_launches(capture, target)``: hand the launch to Triton's own binder with
  ``warmup=True`` under the target-only driver, so Triton computes the key (and compiles, if the
  capture lets it) exactly as the runtime would — this is how warm-up and tracing run.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import threading
import types
import weakref
from collections.abc import Callable
from typing import Any

import torch
from triton import knobs
from triton.runtime.driver import driver
from triton.runtime.jit import JITFunction

from .dispatch import FastDispatch, LaunchMemo, current_device
from .hooks import adoption
from .interpreter import interpreter_fixes
from .specialization import as_kernel_arg
from .targets import Target, target_driver

# TRITONWARM_FAST_DISPATCH=0 sends every launch through Triton's own JITFunction.run.
FAST_DISPATCH = os.environ.get("TRITONWARM_FAST_DISPATCH", "1") != "0"
# Triton reads TRITON_INTERPRET when ``@triton.jit`` runs; read here once too (an environment lookup
# per launch costs more than the rest of a memoized launch).
_INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"


class Launch:
    """Everything Triton needs for one launch, as the launch spec decided it.

    ``args`` are the runtime arguments in the kernel's parameter order (constexprs excluded);
    ``options`` any Triton option besides ``num_warps`` / ``num_stages``. A plain slotted class:
    one is built per launch, so its construction cost is on the hot path.
    """

    __slots__ = ("grid", "args", "constexprs", "num_warps", "num_stages", "options")

    def __init__(self, grid: tuple, args: tuple, constexprs: dict[str, Any] | None = None,
                 num_warps: int | None = None, num_stages: int | None = None, options: dict[str, Any] | None = None):
        self.grid = grid
        self.args = args
        self.constexprs = constexprs if constexprs is not None else {}
        self.num_warps = num_warps
        self.num_stages = num_stages
        self.options = options if options is not None else {}

    def kwargs(self) -> dict[str, Any]:
        kwargs = dict(self.constexprs)
        if self.num_warps is not None:
            kwargs["num_warps"] = self.num_warps
        if self.num_stages is not None:
            kwargs["num_stages"] = self.num_stages
        kwargs.update(self.options)
        return kwargs

    def __repr__(self) -> str:
        return (f"Launch(grid={self.grid}, args={self.args}, constexprs={self.constexprs}, "
                f"num_warps={self.num_warps}, num_stages={self.num_stages}, options={self.options})")


class FakeLaunchSink:
    """Receives each fake launch made inside ``fake_launches``. See ``trace.Capture``."""

    def launch(self, kernel: JitKernel, launch: Launch, target: Target) -> None:  # pragma: no cover
        raise NotImplementedError


_fake_mode: contextvars.ContextVar[tuple[FakeLaunchSink, Target] | None] = contextvars.ContextVar(
    "tritonwarm_fake_mode", default=None
)


@contextlib.contextmanager
def fake_launches(sink: FakeLaunchSink, target: Target):
    """Inside this block every ``JitKernel`` call goes to ``sink`` instead of the GPU, for ``target``."""
    with target_driver(target) as fake_driver:
        token = _fake_mode.set((sink, target))
        try:
            yield fake_driver
        finally:
            _fake_mode.reset(token)
            for kernel in JitKernel.registry():
                kernel.jit_function.device_caches.pop(fake_driver.device, None)


# Whoever watches real launches (a DispatchMonitor while serving) gets ``count_launch(kernel)``.
launch_observer: contextvars.ContextVar[Any] = contextvars.ContextVar("tritonwarm_launch_observer", default=None)


def in_fake_mode() -> bool:
    """True inside ``fake_launches``: launchers can skip host-side work that needs real data."""
    return _fake_mode.get() is not None


LaunchSpec = Callable[..., Launch]


class JitKernel:
    """A ``@triton.jit`` function and the launch spec that turns runtime inputs into its launch."""

    _registry: weakref.WeakValueDictionary[str, JitKernel] = weakref.WeakValueDictionary()
    _registry_lock = threading.Lock()

    def __init__(self, kernel, launch_spec: LaunchSpec, *, name: str | None = None, memoize: bool = False,
                 shared_estimate: Callable[[Launch, Target], int] | None = None):
        """``memoize``: the launch spec reads nothing but its inputs' dtypes, shapes, strides, devices
        and scalar values (no data, no data pointer beyond alignment, no global state), and passes
        input tensors to the kernel as they are; its launch is then bound once per input key
        (``dispatch.LaunchMemo``) and later calls skip the spec.
        ``shared_estimate``: the shared memory (bytes) one program of a launch needs on a target, as
        the launch spec estimates it to pick a tile that fits; recorded with each traced variant, to
        be compared with what the compiled binary says (``jit.pipeline.resources``)."""
        # ``@triton.autotune`` / ``@triton.heuristics`` (any stack of them) launch through the stack;
        # the JITFunction at its bottom is what compiles.
        stacks = adoption()
        self.stack = kernel if stacks.is_stack(kernel) else None
        if self.stack is not None:
            kernel = stacks.base_jit_function(kernel) or _interpreted_base(kernel)
        fn = kernel.fn if hasattr(kernel, "fn") else kernel
        self.fn = fn
        self.launch_spec = launch_spec
        self.shared_estimate = shared_estimate
        self.name = name or f"{fn.__module__}.{fn.__qualname__}"
        # Whatever TRITON_INTERPRET said at import, keep a compiling JITFunction for warm-up and
        # GPU launches; the interpreter is built on demand from the same Python function.
        if isinstance(kernel, JITFunction):
            self.jit_function = kernel
        else:
            self.jit_function = JITFunction(
                fn,
                do_not_specialize=getattr(kernel, "kwargs", {}).get("do_not_specialize"),
                do_not_specialize_on_alignment=getattr(kernel, "kwargs", {}).get("do_not_specialize_on_alignment"),
            )
        self._interpreted = None
        self.fast = FastDispatch(self.jit_function) if self.stack is None else None
        self.memo = LaunchMemo(self.fast) if memoize and self.fast is not None and FAST_DISPATCH else None
        with self._registry_lock:
            self._registry[self.name] = self

    @classmethod
    def registry(cls) -> list[JitKernel]:
        with cls._registry_lock:
            return list(cls._registry.values())

    @classmethod
    def lookup(cls, name: str) -> JitKernel | None:
        with cls._registry_lock:
            return cls._registry.get(name)

    @property
    def param_names(self) -> list[str]:
        return [p.name for p in self.jit_function.params]

    @property
    def constexpr_names(self) -> set[str]:
        return {p.name for p in self.jit_function.params if p.is_constexpr}

    def __repr__(self) -> str:
        return f"JitKernel({self.name})"

    # ------------------------------------------------------------------ launching

    def __call__(self, *inputs, **kw_inputs):
        """Run the launch spec, then launch (or, inside ``fake_launches``, hand it to the sink)."""
        if self.memo is not None and not kw_inputs and _fake_mode.get() is None:
            done, result = self._memoized_call(inputs)
            if done:
                return result
        launch = self.launch_spec(*inputs, **kw_inputs)
        if launch is None:  # the spec decided there is nothing to do (e.g. zero rows)
            return None
        mode = _fake_mode.get()
        if mode is not None:
            sink, target = mode
            return sink.launch(self, launch, target)
        return self.launch(launch)

    def _memoized_call(self, inputs: tuple) -> tuple[bool, Any]:
        """A real launch through the memo: (True, result), or (False, None) to take the plain path
        (launch hooks, the interpreter, no driver, an input the memo does not key)."""
        hooks = knobs.runtime.launch_enter_hook
        if _INTERPRET or getattr(hooks, "calls", hooks):
            return False, None
        memo = self.memo
        try:
            active = driver.active
            device = current_device(active)
            key = memo.key(inputs, device)
            replay = memo.entries.get(key) if key is not None else None
        except (RuntimeError, TypeError):  # no driver here (CPU tensors: the interpreter); an unhashable input
            return False, None
        if replay is not None:
            observer = launch_observer.get()
            if observer is not None:
                observer.count_launch(self)
            return True, replay(inputs, active.get_current_stream(device))
        if key is None:
            return False, None
        launch = self.launch_spec(*inputs)
        if launch is None:
            return True, None
        kernel = self.launch(launch)
        if not _wants_interpreter(launch.args):
            memo.remember(key, inputs, launch)
        return True, kernel

    def launch(self, launch: Launch):
        """Launch ``launch`` for real: the GPU, or Triton's interpreter for CPU tensors."""
        observer = launch_observer.get()
        if observer is not None:
            observer.count_launch(self)
        if _wants_interpreter(launch.args):
            kwargs = launch.kwargs()
            if self.stack is not None:
                kwargs.update(adoption().interpreter_meta(self.stack, launch.args, kwargs))
                kwargs = {k: v for k, v in kwargs.items() if k in self.constexpr_names or k == "num_warps"}
            runtime_names = [p.name for p in self.jit_function.params if not p.is_constexpr]
            named = {**dict(zip(runtime_names, launch.args, strict=False)), **kwargs}
            grid = launch.grid(named) if callable(launch.grid) else launch.grid
            return self._interpreter()[grid](*launch.args, **kwargs)
        if self.stack is not None:  # Triton's own autotuner / heuristics, then JITFunction.run
            return self.stack.run(*launch.args, grid=launch.grid, warmup=False, **launch.kwargs())
        if not FAST_DISPATCH:
            return self.jit_function.run(*launch.args, grid=launch.grid, warmup=False, **launch.kwargs())
        return self.fast.launch(launch)

    def fake_run(self, launch: Launch):
        """Triton's own ``run(warmup=True)`` on fake arguments: binder → key → compile hook → compile."""
        if self.stack is not None:  # heuristics evaluated, every pruned config traced (``hooks.Adoption``)
            return adoption().fake_run(self.stack, launch)
        args = tuple(as_kernel_arg(a) for a in launch.args)
        return self.jit_function.run(*args, grid=launch.grid, warmup=True, **launch.kwargs())

    def _interpreter(self):
        if self._interpreted is None:
            from triton.runtime.interpreter import InterpretedFunction

            self._interpreted = _InterpreterWithHelpers(InterpretedFunction(self.fn))
        return self._interpreted


def _interpreted_base(kernel):
    """With ``TRITON_INTERPRET=1`` at import the stack ends in an interpreted function: compile its source."""
    seen = 0
    while hasattr(kernel, "fn") and not callable(getattr(kernel, "__code__", None)) and seen < 16:
        kernel, seen = kernel.fn, seen + 1
    return kernel


def _wants_interpreter(args) -> bool:
    if _INTERPRET:
        return True
    for arg in args:
        if isinstance(arg, torch.Tensor):
            return arg.is_cpu
    return False


_INTERPRETED_TWINS: dict = {}


def _scoped_interpreted_function(fn):
    """An interpreted device function that undoes its language patches when it returns.

    Triton's own ``InterpretedFunction.__call__`` patches ``triton.language`` for the interpreter and
    never restores it, which would break every later compile in the same process.
    """
    from triton.runtime.errors import InterpreterError
    from triton.runtime.interpreter import InterpretedFunction, _patch_lang

    class ScopedInterpretedFunction(InterpretedFunction):
        def __call__(self, *args, **kwargs):
            scope = _patch_lang(self.fn)
            try:
                return self.rewrite()(*args, **kwargs)
            except InterpreterError:
                raise
            except Exception as e:
                raise InterpreterError(repr(e)) from e
            finally:
                scope.restore()

    return ScopedInterpretedFunction(fn)


class _InterpreterWithHelpers:
    """Run an interpreted kernel whose module also holds compiled ``@triton.jit`` helpers.

    With ``TRITON_INTERPRET`` unset at import, helpers are ``JITFunction`` objects that refuse to be
    called from Python; for the duration of an interpreted launch the kernel's globals see
    interpreted twins instead. (With ``TRITON_INTERPRET=1`` at import nothing needs swapping.)
    """

    _lock = threading.Lock()

    def __init__(self, interpreted):
        self.interpreted = interpreted

    def __getitem__(self, grid):
        def run(*args, **kwargs):
            with self._lock, _interpreted_helpers(self.interpreted.fn.__globals__), interpreter_fixes():
                return self.interpreted[grid](*args, **kwargs)

        return run


@contextlib.contextmanager
def _interpreted_helpers(namespace: dict):
    """Swap every ``JITFunction`` reachable from ``namespace`` (``tl.sum`` included) for its
    interpreted twin, then put the originals back."""
    with contextlib.suppress(ImportError):  # imported lazily by Triton; it must see the originals
        import triton.experimental.gluon  # noqa: F401

    swapped = {}
    pending = [namespace]
    seen = set()
    while pending:
        ns = pending.pop()
        if id(ns) in seen:
            continue
        seen.add(id(ns))
        for name, value in list(ns.items()):
            if isinstance(value, JITFunction):
                swapped[(id(ns), name)] = (ns, name, value)
                # keyed by identity: hashing a JITFunction computes its cache key, which walks
                # its callees, some of which may already be swapped at this point
                if id(value) not in _INTERPRETED_TWINS:
                    _INTERPRETED_TWINS[id(value)] = (value, _scoped_interpreted_function(value.fn))
                ns[name] = _INTERPRETED_TWINS[id(value)][1]
                pending.append(value.fn.__globals__)
            elif isinstance(value, types.ModuleType) and value.__name__.startswith("triton.language"):
                pending.append(vars(value))
    try:
        yield
    finally:
        for ns, name, value in swapped.values():
            ns[name] = value
