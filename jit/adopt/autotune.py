"""Triton's ``@triton.autotune`` during a fake launch: trace every pruned config, probe, pin or tune the winner.

Outside a fake launch nothing here changes Triton. Inside one (``autotune_mode(...)``), Triton's own
``Autotuner.run`` is replaced for the duration of the block by a version that:

- ``trace``: prunes with Triton's own ``prune_configs`` (``early_config_prune``, ``perf_model``/``top_k``)
  and hands every surviving config to the next layer (``Heuristics`` / ``JITFunction.run``), so each
  one's compile request reaches the capture hook; the autotuner's in-memory winners are untouched.
  A pruning function that cannot run on meta tensors is skipped (every config is kept) with a note.
- ``probe``: also asks Triton's own ``check_disk_cache`` whether a winner is stored for this call's
  tuning key, without benchmarking: ``unknown`` lists the calls that would benchmark at serving time.
- ``pin``: stores the config the spec pins as the winner, through Triton's own ``check_disk_cache``
  (so the file, its key and its format are exactly what Triton's autotuner reads).
- ``tune``: on a real GPU, gives the autotuner real tensors in place of meta ones and lets Triton
  benchmark with its own benchmarker and store the winner (``cache_results``).
"""

from __future__ import annotations

import contextlib
import contextvars
import math
import os
import threading
from dataclasses import dataclass, field
from typing import Any

from triton.runtime import autotuner as triton_autotuner
from triton.runtime.autotuner import Autotuner, Config, Heuristics
from triton.runtime.jit import JITFunction


class _NoWinner(Exception):
    """Raised in place of a benchmark: the probe found no stored winner."""


@dataclass
class AutotuneState:
    """What one fake-launch block saw of the autotuners it ran."""

    mode: str = "trace"  # trace | probe | pin | tune
    pinned: Any = None  # pin: a Config, a dict or an index, for the call(s) in this block
    row: str | None = None
    notes: list[str] = field(default_factory=list)
    unknown: list[str] = field(default_factory=list)  # probe: calls without a stored winner
    errors: list[str] = field(default_factory=list)  # pins that name no config that survives pruning
    stored: list[str] = field(default_factory=list)  # pin/tune: winners written
    calls: int = 0


_state: contextvars.ContextVar[AutotuneState | None] = contextvars.ContextVar("tritonwarm_autotune", default=None)
# True while an autotuner's surviving configs are traced and it has more than one to choose from: a
# config the GPU refuses (OutOfResources) is one Triton's autotuner skips when it benchmarks.
_choosing: contextvars.ContextVar[bool] = contextvars.ContextVar("tritonwarm_autotune_choosing", default=False)
_install_lock = threading.Lock()
_installed = 0
_original_run = Autotuner.run


def base_jit_function(kernel) -> JITFunction | None:
    """The ``JITFunction`` at the bottom of a stack of ``Autotuner`` / ``Heuristics`` (or None)."""
    seen = 0
    while kernel is not None and not isinstance(kernel, JITFunction) and seen < 16:
        kernel = getattr(kernel, "fn", None)
        seen += 1
    return kernel if isinstance(kernel, JITFunction) else None


def choosing_among_configs() -> bool:
    """Whether the compile request being traced now is one config of an autotuner with several."""
    return _choosing.get()


def is_stack(kernel) -> bool:
    return isinstance(kernel, (Autotuner, Heuristics))


def kernel_name(kernel) -> str:
    fn = kernel.fn if isinstance(kernel, JITFunction) else base_jit_function(kernel).fn
    return f"{fn.__module__}.{fn.__qualname__}"


@contextlib.contextmanager
def autotune_mode(state: AutotuneState):
    """Inside the block, autotuners called from this context follow ``state.mode``."""
    global _installed
    with _install_lock:
        if _installed == 0:
            Autotuner.run = _fake_run
        _installed += 1
    token = _state.set(state)
    try:
        yield state
    finally:
        _state.reset(token)
        with _install_lock:
            _installed -= 1
            if _installed == 0:
                Autotuner.run = _original_run


@contextlib.contextmanager
def autotuners(state: AutotuneState | None = None):
    """The block every trace runs in (``trace.tracing``): autotuners follow ``state`` (a fresh tracing
    one when None), which the block yields."""
    with autotune_mode(state if state is not None else AutotuneState()) as entered:
        yield entered


def fake_run(stack, launch):
    """A ``JitKernel``'s stack on fake inputs: Triton's own ``run(warmup=True)``, heuristics evaluated,
    every pruned config traced, in the state of the enclosing trace."""
    with autotune_mode(current_state()):
        return stack.run(*launch.args, grid=launch.grid, warmup=True, **launch.kwargs())


def _fake_run(self: Autotuner, *args, **kwargs):
    state = _state.get()
    if state is None:  # another thread, not faking anything
        return _original_run(self, *args, **kwargs)
    state.calls += 1
    name = kernel_name(self)
    where = f"{state.row}: {name}" if state.row else name
    if state.mode == "tune":
        return _tune(self, args, kwargs)
    configs = _pruned_configs(self, args, kwargs, state, where)
    result = None
    pinned = None
    if state.pinned is not None and len(configs) > 1:
        with contextlib.suppress(ValueError):  # a pin no config answers: said below
            pinned = as_config(state.pinned, configs, where, self.configs)
    for config in configs:
        # a config the autotuner chooses among others (and skips if the GPU refuses it); a pinned
        # one is stored as the winner, so it is launched without a choice
        token = _choosing.set(len(configs) > 1 and config is not pinned)
        try:
            result = self.fn.run(*args, **kwargs, **config.all_kwargs())
        finally:
            _choosing.reset(token)
    if state.mode == "trace" and state.pinned is not None and len(configs) > 1:
        try:  # a pin no config answers is the spec's error, told before anything is compiled
            as_config(state.pinned, configs, where, self.configs)
        except ValueError as e:
            if str(e) not in state.errors:
                state.errors.append(str(e))
    if state.mode == "probe" and len(configs) > 1:
        _probe(self, args, kwargs, state, where)
    elif state.mode == "pin" and len(configs) > 1:
        _pin(self, args, kwargs, configs, state, where)
    return result


def _pruned_configs(self: Autotuner, args, kwargs, state: AutotuneState, where: str) -> list[Config]:
    """Triton's own pruning on the fake arguments; every config when a pruning function cannot run on them."""
    if len(self.configs) <= 1:
        return list(self.configs)
    self.nargs = dict(zip(self.arg_names, args, strict=False))
    try:
        return list(self.prune_configs(kwargs))
    except Exception as e:
        note = (f"{where}: prune_configs_by could not run on fake inputs ({type(e).__name__}: {e}); "
                f"all {len(self.configs)} configs are warmed")
        if note not in state.notes:
            state.notes.append(note)
        return list(self.configs)
    finally:
        self.nargs = None


@contextlib.contextmanager
def _winner_lookup(self: Autotuner, bench):
    """Run Triton's own ``Autotuner.run`` with disk caching on and ``bench`` in place of benchmarking;
    the autotuner's in-memory winners are left as they were."""
    saved_cache = dict(self.cache)
    saved_flag = self.cache_results
    had_bench = "_bench" in self.__dict__
    self.cache.clear()  # look on disk, not in what this process tuned
    self.cache_results = True
    self._bench = bench
    try:
        yield
    finally:
        self.cache.clear()
        self.cache.update(saved_cache)
        self.cache_results = saved_flag
        if not had_bench:
            del self.__dict__["_bench"]
        self.nargs = None


def _serving_reads_winners(self: Autotuner) -> bool:
    from triton import knobs

    return bool(self.cache_results or knobs.autotuning.cache)


# Why a call would benchmark at serving time: each ``unknown`` line is ``row: kernel: <one of these>``.
NO_WINNER = "no stored winner: serving benchmarks it (tritonwarm tune, or pin a config)"
PRE_HOOK = "a config has a pre_hook, which Triton cannot store: it benchmarks"
NOT_READ = ("a winner is stored, but this autotuner does not read it: pass cache_results=True or set "
            "TRITON_CACHE_AUTOTUNING=1 where it is imported")
UNKNOWN_WINNER_CAUSES = (NO_WINNER, PRE_HOOK, NOT_READ)


def _probe(self: Autotuner, args, kwargs, state: AutotuneState, where: str) -> None:
    def no_benchmark(*_, config, **__):
        raise _NoWinner

    if any(c.pre_hook for c in self.configs):
        state.unknown.append(f"{where}: {PRE_HOOK}")
        return
    with _winner_lookup(self, no_benchmark):
        try:
            _original_run(self, *args, **kwargs)
        except _NoWinner:
            state.unknown.append(f"{where}: {NO_WINNER}")
            return
    if not _serving_reads_winners(self):
        state.unknown.append(f"{where}: {NOT_READ}")


def as_config(pinned, configs: list[Config], where: str, declared: list[Config] | None = None) -> Config:
    """A pin → one of ``configs`` (those that survive pruning): a Config, a mapping of meta-parameters
    and options, or an index into the autotuner's configs as declared."""
    declared = declared if declared is not None else configs
    if isinstance(pinned, Config):
        wanted = pinned
    elif isinstance(pinned, int) and not isinstance(pinned, bool):
        if not 0 <= pinned < len(declared):
            raise ValueError(f"{where}: config index {pinned} out of range: the autotuner declares "
                             f"{len(declared)} configs")
        wanted = declared[pinned]
    elif isinstance(pinned, dict):
        options = {k: pinned[k] for k in ("num_warps", "num_stages", "num_ctas", "maxnreg") if k in pinned}
        kwargs = {k: v for k, v in pinned.items() if k not in options}
        for config in configs:
            if config.kwargs == kwargs and all(getattr(config, k) == v for k, v in options.items()):
                return config
        raise ValueError(f"{where}: config {pinned} is not among the {len(configs)} that survive pruning: "
                         + "; ".join(str(c.all_kwargs()) for c in configs))
    else:
        raise ValueError(f"{where}: config must be an index or a mapping, not {pinned!r}")
    if wanted not in configs:
        raise ValueError(f"{where}: config {wanted} is not among those that survive pruning")
    return wanted


def pin_error(row: str | None, error: Exception) -> str:
    """A row's ``config:`` that cannot be evaluated, as planning and pinning both say it."""
    return f"{row}: config: {type(error).__name__}: {error}"


def _pin(self: Autotuner, args, kwargs, configs: list[Config], state: AutotuneState, where: str) -> None:
    """Store the pinned config as this call's winner, replacing any stored one, with Triton's own code."""
    if state.pinned is None:
        return
    try:
        winner = as_config(state.pinned, configs, where, self.configs)
    except ValueError as e:  # said in the words planning used
        if str(e) not in state.errors:
            state.errors.append(str(e))
        return
    if winner.pre_hook is not None or any(c.pre_hook for c in configs):
        raise ValueError(f"{where}: a config has a pre_hook: Triton never stores winners for it, "
                         "so it cannot be pinned")

    def timings(*_, config, **__):
        return [0.0, 0.0, 0.0] if config == winner else [math.inf, math.inf, math.inf]

    managers = []
    original_manager = triton_autotuner.get_cache_manager

    def remembering_manager(key):
        manager = original_manager(key)
        managers.append(manager)
        return manager

    triton_autotuner.get_cache_manager = remembering_manager
    try:
        for _ in range(2):  # a second pass when an older, different winner had to be removed first
            managers.clear()
            with _winner_lookup(self, timings):
                _original_run(self, *args, **kwargs)
                chosen = self.best_config
            if chosen == winner or not managers:
                break
            stale = managers[-1].get_file(f"{base_jit_function(self).__name__[:150]}.autotune.json")
            if stale:
                os.remove(stale)
    finally:
        triton_autotuner.get_cache_manager = original_manager
    state.stored.append(f"{where}: {winner.all_kwargs()}")


def _tune(self: Autotuner, args, kwargs):
    """Benchmark on this machine's GPU with Triton's own benchmarker, storing the winner on disk."""
    state = _state.get()
    real_args = tuple(_materialize(a) for a in args)
    real_kwargs = {k: _materialize(v) for k, v in kwargs.items()}
    real_kwargs["warmup"] = False
    saved_cache, saved_flag = dict(self.cache), self.cache_results
    self.cache.clear()
    self.cache_results = True
    if self._do_bench is None:  # a benchmarker cached under another driver: ask the GPU's own again
        self.__dict__.pop("do_bench", None)
    token = _in_real_tune.set(True)
    try:
        result = _original_run(self, *real_args, **real_kwargs)
        where = f"{state.row}: " if state.row else ""
        state.stored.append(f"{where}{kernel_name(self)}: {self.best_config.all_kwargs()}")
        return result
    finally:
        _in_real_tune.reset(token)
        self.cache.clear()
        self.cache.update(saved_cache)
        self.cache_results = saved_flag


def _materialize(value):
    """A meta tensor → a real one on the GPU with the same shape, stride, dtype and alignment."""
    import torch

    from ..core.server_tensors import backing_device, plain

    if not (isinstance(value, torch.Tensor) and backing_device(value).type == "meta"):
        return value
    value = plain(value)
    storage = value.untyped_storage().size() // max(value.element_size(), 1)
    base = torch.zeros(max(storage, 1), dtype=value.dtype, device="cuda")
    if value.dtype.is_floating_point:
        base.normal_()
    return base.as_strided(value.shape, value.stride(), value.storage_offset())


def resolve_for_interpreter(kernel, args: tuple, kwargs: dict) -> dict:
    """Meta-parameters a stack of ``Heuristics`` / ``Autotuner`` adds, for an interpreted CPU launch.

    Heuristics are evaluated as Triton does; an autotuner takes its in-memory winner for the call if it
    has one, else its first config that survives pruning (the interpreter measures nothing).
    """
    extra: dict = {}
    layer = kernel
    while is_stack(layer):
        named = {**dict(zip(layer.arg_names, args, strict=False)), **kwargs, **extra}
        if isinstance(layer, Heuristics):
            for name, heuristic in layer.values.items():
                extra[name] = heuristic(named)
        else:
            layer.nargs = dict(zip(layer.arg_names, args, strict=False))
            try:
                configs = layer.prune_configs({**kwargs, **extra}) if len(layer.configs) > 1 else layer.configs
            finally:
                layer.nargs = None
            extra.update(configs[0].all_kwargs())
        layer = layer.fn
    return extra


def current_state() -> AutotuneState:
    """The autotune state of the enclosing fake-launch block, or a fresh tracing one."""
    state = _state.get()
    return state if state is not None else AutotuneState()


_in_real_tune: contextvars.ContextVar[bool] = contextvars.ContextVar("tritonwarm_real_tune", default=False)
