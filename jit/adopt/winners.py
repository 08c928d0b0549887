"""Autotune winners per spec row: probe whether one is stored, pin the spec's, or measure on this GPU.

Each row's launcher runs on its fake inputs with autotuners in the matching mode of ``autotune.py``;
whatever is stored goes where Triton's own autotuner reads it (``cache_results``).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

from .autotune import AutotuneState, _in_real_tune, autotune_mode, pin_error


@dataclass
class WinnerReport:
    target: str
    stored: list[str] = field(default_factory=list)  # rows whose winner was written
    unknown: list[str] = field(default_factory=list)  # rows whose winner serving would have to measure
    errors: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict:
        return dict(self.__dict__)


def _each_row(specs, target, cache_dir, mode: str, report: WinnerReport):
    """Run every row's launcher on fake inputs in autotune ``mode``; yield nothing, fill ``report``."""
    from ..cache.triton_dir import triton_cache_dir
    from ..core.trace import Capture, tracing

    for spec in specs:
        if not spec.applies_to(target):
            continue
        for row in spec.rows():
            try:
                pinned = spec.pinned_config(row.values)
            except Exception as e:
                report.errors.append(pin_error(row.label, e))
                continue
            if mode == "pin" and pinned is None:
                continue
            state = AutotuneState(mode=mode, pinned=pinned, row=row.label)
            args, kwargs = spec.call_arguments(row.values)
            try:
                with triton_cache_dir(cache_dir):
                    if mode == "tune":
                        with _measuring(target, state):
                            spec.launcher(*args, **kwargs)
                    else:
                        with tracing(Capture(), target, spec.capture_all, autotune=state):
                            spec.launcher(*args, **kwargs)
            except Exception as e:
                report.errors.append(f"{row.label}: {type(e).__name__}: {e}")
                continue
            report.stored += state.stored
            report.unknown += state.unknown
            report.errors += state.errors
            report.notes += [n for n in state.notes if n not in report.notes]
            if mode == "pin" and not state.calls:
                report.notes.append(f"{row.label}: config pinned, but the row reaches no autotuner")
            elif mode == "pin" and not state.stored and not state.errors:
                report.notes.append(f"{row.label}: config pinned, but every call has a single config left: "
                                    "nothing to store")


def probe_winners(specs, target, cache_dir) -> WinnerReport:
    """Rows whose autotuned calls have no winner stored where Triton's autotuner reads it."""
    from ..core.kernel import JitKernel

    report = WinnerReport(target.name)
    specs = list(specs)
    if not any(s.capture_all for s in specs) and not any(k.stack is not None for k in JitKernel.registry()):
        return report  # no autotuner can be reached: skip tracing every row again
    _each_row(specs, target, cache_dir, "probe", report)
    return report


def pin_winners(specs, target, cache_dir) -> WinnerReport:
    """Store each row's pinned config (``config:``) as the winner Triton's autotuner reads for ``target``."""
    report = WinnerReport(target.name)
    _each_row(specs, target, cache_dir, "pin", report)
    return report


def tune_winners(specs, target, cache_dir) -> WinnerReport:
    """On this machine's GPU: benchmark each row's configs with Triton's benchmarker; store the winners."""
    report = WinnerReport(target.name)
    _each_row(specs, target, cache_dir, "tune", report)
    return report




@contextlib.contextmanager
def _measuring(target, state: AutotuneState):
    """Launchers run on meta tensors against the real driver: plain launches are skipped (Triton's hook
    says so), autotuned ones are measured on real tensors by Triton itself (see ``_tune``)."""
    from triton import knobs

    from ..core import kernel as kernel_module
    from ..core.trace import _hook_lock

    class TuneSink(kernel_module.FakeLaunchSink):
        def launch(self, jit_kernel, launch, _target):
            if jit_kernel.stack is not None:
                return jit_kernel.stack.run(*launch.args, grid=launch.grid, warmup=False, **launch.kwargs())
            return None

    def skip_unless_measuring(**_):
        return not _in_real_tune.get()

    with _hook_lock, autotune_mode(state), _meta_device_is_this_gpu():
        previous = knobs.runtime.jit_cache_hook
        knobs.runtime.jit_cache_hook = skip_unless_measuring
        token = kernel_module._fake_mode.set((TuneSink(), target))
        try:
            yield
        finally:
            kernel_module._fake_mode.reset(token)
            knobs.runtime.jit_cache_hook = previous


@contextlib.contextmanager
def _meta_device_is_this_gpu():
    """Launchers run on meta tensors here and ask ``torch.cuda.get_device_properties(x.device)``:
    answer for this machine's GPU."""
    import torch

    names = ("get_device_properties", "get_device_capability", "get_device_name")
    saved = {name: getattr(torch.cuda, name) for name in names}

    def on_this_gpu(original):
        def answer(device=None):
            if isinstance(device, torch.device) and device.type == "meta":
                device = None
            return original(device)

        return answer

    for name in names:
        setattr(torch.cuda, name, on_this_gpu(saved[name]))
    try:
        yield
    finally:
        for name, fn in saved.items():
            setattr(torch.cuda, name, fn)
