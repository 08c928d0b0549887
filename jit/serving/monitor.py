"""Serving-time watch on compiles: which variant each launch needs, and whether the cache had it.

Two ways to run the same check:

- ``monitor.serving()`` on a GPU: Triton calls ``jit_cache_hook`` whenever a launch of *any* Triton
  kernel in the process (ours or another package's) misses its in-memory cache, i.e. when it is about
  to load from disk *or* compile. The monitor computes the
  disk-cache entry Triton will look for and records a hit or a miss; a miss under policy ``error``
  raises before anything compiles, under ``warn`` it is logged and compiled.
- ``monitor.dry_run(target)``: the engine's own code runs on meta tensors under the target-only
  driver; every launch is traced (Triton's key, nothing compiled) and looked up in the cache.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from triton import knobs

from ..cache import UnreadableEntry, entry_files
from ..cache.env import cache_bypassed
from ..cache.overlay import misses_fail_here, overlay_in_force
from ..cache.remote import fetch_from_fleet, serving_reads_the_fleet
from ..cache.triton_dir import triton_reads_instead
from ..core.dispatch_record import write_record
from ..core.hooks import adoption
from ..core.kernel import FakeLaunchSink, JitKernel, Launch, fake_launches, launch_observer
from ..core.targets import Target, target_from_gpu_target
from ..core.trace import Capture, Variant, _hook_lock
from .miss import WarmedNeighbours

log = logging.getLogger("tritonwarm")

POLICIES = ("off", "warn", "error")


class JitPolicyError(RuntimeError):
    """A launch at serving time needs a variant the warmed cache does not hold."""


@dataclass
class LaunchedVariant:
    """One line of the dispatch record: a variant launched at serving time, found in the cache or not.

    (Not to be confused with ``dispatch.FastDispatch``, the direct launch path of a ``JitKernel``.)
    """

    kernel: str
    target: str
    variant: str  # short id (start of Triton's cache hash), as `tritonwarm list` shows it
    cache_hash: str
    hit: bool
    args: dict
    launches: int = 0
    key: str | None = None  # Triton's in-memory key: tells other code from another class on a miss
    num_warps: int | None = None
    num_stages: int | None = None
    entry_name: str | None = None  # the kernel function's name: Triton names the entry's files after it
    constexpr_globals: dict | None = None  # the kernel's module-level constexprs (``trace.constexpr_globals``)
    why: str | None = None  # on a miss: what the cache holds instead (``miss.WarmedNeighbours``)

    def to_json(self) -> dict:
        return dict(self.__dict__)


class DispatchMonitor:
    """Counts launches per kernel and records, per variant, whether serving found it in the cache."""

    def __init__(self, cache_dir: str | Path, policy: str = "warn"):
        if policy not in POLICIES:
            raise ValueError(f"unknown jit policy {policy!r}: choose one of {', '.join(POLICIES)}")
        self.cache_dir = Path(cache_dir)
        self.policy = policy
        self.dispatches: dict[str, LaunchedVariant] = {}
        self.launches: collections.Counter[str] = collections.Counter()
        self.compiles = 0  # kernel compiles and C builds at serving time
        self.compile_seconds = 0.0
        self.c_builds: list[str] = []  # names of the C modules Triton built at serving time
        self._warmed: dict[str, WarmedNeighbours] = {}
        self._fleet: bool | None = None  # whether Triton reads through the shared cache (asked once)
        self._overlay = overlay_in_force()  # what serving compiled into the overlay, Triton reads there too
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ recording

    @property
    def hits(self) -> int:
        return sum(1 for d in self.dispatches.values() if d.hit)

    @property
    def misses(self) -> list[LaunchedVariant]:
        return [d for d in self.dispatches.values() if not d.hit]

    def count_launch(self, kernel: JitKernel) -> None:
        with self._lock:
            self.launches[kernel.name] += 1

    def _record(self, variant: Variant, *, count_launch: bool) -> LaunchedVariant:
        with self._lock:
            dispatch = self.dispatches.get(variant.cache_hash)
            if dispatch is None:
                hit = any(self._holds(folder, variant) for folder in (self.cache_dir, self._overlay) if folder)
                if not hit and self._reads_fleet():  # Triton's next lookup fetches it: so do we, first
                    hit = fetch_from_fleet(self.cache_dir, variant.entry_dir, variant.entry_name)
                dispatch = LaunchedVariant(variant.kernel, variant.target, variant.variant_id, variant.cache_hash, hit,
                                           variant.args, key=variant.key, num_warps=variant.num_warps,
                                           num_stages=variant.num_stages, entry_name=variant.entry_name,
                                           constexpr_globals=variant.constexpr_globals)
                self.dispatches[variant.cache_hash] = dispatch
                if not hit:
                    self._on_miss(dispatch)
            if count_launch:  # dry run: every launch passes here (on a GPU, count_launch() counts them)
                dispatch.launches += 1
                self.launches[variant.kernel] += 1
            return dispatch

    @staticmethod
    def _holds(folder: Path, variant: Variant) -> bool:
        try:
            return entry_files(folder, variant.entry_dir, variant.entry_name) is not None
        except UnreadableEntry:
            return False  # Triton cannot read it either: it would compile

    def _on_miss(self, dispatch: LaunchedVariant) -> None:
        if self.policy == "off":
            return
        reason = self._neighbours(dispatch.target).why(dispatch.to_json())
        dispatch.why = reason.line if reason else None
        fails = misses_fail_here(self.cache_dir)  # read-only: the launch fails instead of compiling
        message = (f"{dispatch.kernel} would compile at serving time on {dispatch.target}: variant "
                   f"{dispatch.variant} ({', '.join(f'{k}:{v}' for k, v in dispatch.args.items())}) "
                   f"is not in {self.cache_dir}" + (f": {dispatch.why}" if dispatch.why else "")
                   + (f"; and {fails}" if fails else ""))
        if self.policy == "error":
            raise JitPolicyError(message)
        if self.policy == "warn":
            log.warning(message)

    def _reads_fleet(self) -> bool:
        if self._fleet is None:
            self._fleet = serving_reads_the_fleet()
        return self._fleet

    def _judge_the_cache_triton_reads(self) -> bool:
        """Serving reads ``knobs.cache.dir`` (``TRITON_CACHE_DIR``, or Triton's default), whatever cache
        was warmed: a monitor looking elsewhere would count hits while Triton compiles. Under ``error``
        that is refused; otherwise (logged under ``warn``) the monitor judges the cache Triton reads.
        ``TRITON_ALWAYS_COMPILE`` (every hit skipped) is refused or logged the same way; returns
        whether it is set."""
        bypassed = cache_bypassed()
        if bypassed and self.policy != "off":
            if self.policy == "error":
                raise JitPolicyError(bypassed)
            log.warning(bypassed)
        self._follow_the_cache_triton_reads(changed=False)
        return bypassed is not None

    def _follow_the_cache_triton_reads(self, *, changed: bool) -> None:
        """Judge the folder Triton reads now. Asked again at each compile request: the folder can change
        while serving, as ``torch.compile`` sets ``TRITON_CACHE_DIR`` process-wide, when unset, at the
        first kernel it loads (Inductor's ``CachingAutotuner``); every later lookup then misses."""
        read = triton_reads_instead(self.cache_dir)
        if read is None:
            return
        if changed:
            message = (f"Triton's cache folder changed while serving, from {self.cache_dir} to {read} (torch.compile "
                       f"sets TRITON_CACHE_DIR when it is unset): every kernel launched from now on would compile; "
                       f"set TRITON_CACHE_DIR={self.cache_dir} before serving starts")
        else:
            message = (f"Triton reads its cache from {read}, not from the warmed cache {self.cache_dir}: every "
                       f"kernel would compile; serve with TRITON_CACHE_DIR={self.cache_dir}")
        if self.policy == "error":
            raise JitPolicyError(message)
        if self.policy == "warn":
            log.warning(message)
        self.cache_dir, self._warmed = read, {}

    def _neighbours(self, target: str) -> WarmedNeighbours:
        """What the cache's manifest holds for ``target``, read at the first miss (serving writes none)."""
        if target not in self._warmed:
            self._warmed[target] = WarmedNeighbours.of_cache(self.cache_dir, target)
        return self._warmed[target]

    def write_record(self, path: str | Path) -> None:
        """The dispatch record as JSON lines: one per variant launched, with hit or miss."""
        write_record(path, (d.to_json() for d in self.dispatches.values()))

    # ------------------------------------------------------------------ dry run

    @contextlib.contextmanager
    def dry_run(self, target: Target):
        """Run engine code on meta tensors for ``target``: trace and look up every launch."""
        with fake_launches(_DryRunSink(self), target):
            yield self

    # ------------------------------------------------------------------ real serving

    @contextlib.contextmanager
    def serving(self):
        """Watch real launches on this machine's GPU (a no-op for interpreted CPU launches)."""
        from triton.runtime.driver import driver

        from ..core.trace import constexpr_globals, disk_cache_hash, readable_args

        monitor = self
        started: dict[str, float] = {}
        kernel_for = adoption().kernel_for

        def on_compile_request(*, key, fn, compile, **_):
            kernel = kernel_for(fn.jit_function)  # a JitKernel, or any other package's Triton kernel
            target = target_from_gpu_target(driver.active.get_current_target())
            monitor._follow_the_cache_triton_reads(changed=True)
            variant = Variant(kernel.name, target.name, str(key), compile["specialization_data"],
                              readable_args(kernel, compile), int(compile["num_warps"]), int(compile["num_stages"]),
                              disk_cache_hash(kernel, target, compile), entry_name=kernel.fn.__name__,
                              constexpr_globals=constexpr_globals(fn.jit_function))
            dispatch = monitor._record(variant, count_launch=False)
            if not dispatch.hit or always_compiles:
                started[str(key)] = time.perf_counter()
            return False

        def after_compile(*, key, **_):
            t0 = started.pop(str(key), None)
            if t0 is not None:
                monitor.compiles += 1
                monitor.compile_seconds += time.perf_counter() - t0

        always_compiles = self._judge_the_cache_triton_reads()  # under warn / off: every request compiles
        with _hook_lock:
            saved = knobs.runtime.jit_cache_hook, knobs.runtime.jit_post_compile_hook
            knobs.runtime.jit_cache_hook, knobs.runtime.jit_post_compile_hook = on_compile_request, after_compile
        token = launch_observer.set(self)
        try:
            with _counting_c_builds(self):
                yield self
        finally:
            launch_observer.reset(token)
            with _hook_lock:
                knobs.runtime.jit_cache_hook, knobs.runtime.jit_post_compile_hook = saved


@contextlib.contextmanager
def _counting_c_builds(monitor: DispatchMonitor):
    """Triton's C builds (a launcher per kernel signature on 3.6, the driver's utilities once per cache)
    count as compiles at serving time; under policy ``error`` one that warm-up would have made is refused."""
    from triton.runtime import build

    from .c_launchers import serving_build_fix, serving_build_is_warmable

    original = build._build

    def counted_build(name, *args, **kwargs):
        if monitor.policy != "off":
            message = (f"Triton is building its C module {name} at serving time: {monitor.cache_dir} lacks it "
                       f"({serving_build_fix(name)})")
            if monitor.policy == "error" and serving_build_is_warmable(name):
                raise JitPolicyError(message)
            log.warning(message)
        start = time.perf_counter()
        try:
            return original(name, *args, **kwargs)
        finally:
            with monitor._lock:
                monitor.compiles += 1
                monitor.compile_seconds += time.perf_counter() - start
                monitor.c_builds.append(name)

    with _hook_lock:
        build._build = counted_build
    try:
        yield
    finally:
        with _hook_lock:
            build._build = original


class _DryRunSink(FakeLaunchSink):
    def __init__(self, monitor: DispatchMonitor):
        self.monitor = monitor

    def launch(self, kernel: JitKernel, launch: Launch, target: Target) -> None:
        cap = Capture()
        cap.launch(kernel, launch, target)
        for variant in cap.variants.values():
            self.monitor._record(variant, count_launch=True)

