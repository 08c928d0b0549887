"""One pool of forked worker processes for a whole warm-up: tracing and compiling share it.

Each worker pays Triton's start-up once. Triton's own key material (``triton_key()``: a sha256 of
every Triton source and of ``libtriton``, about a second; each backend's hash, which asks ``ptxas``
for its version; each kernel's source key, which walks its ``@triton.jit`` dependencies) is computed
once here, before the first fork, so that no worker computes it again.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import multiprocessing
import sys
import threading
from collections.abc import Iterable

from ..core.targets import Target


def prime_key_material(targets: Iterable[Target]) -> None:
    """Compute, in this process, the parts of every key Triton memoizes: forked workers inherit them."""
    from triton.compiler.compiler import make_backend
    from triton.runtime.cache import triton_key

    from ..core.kernel import JitKernel

    triton_key()
    for target in targets:
        make_backend(target.gpu_target).hash()
    for kernel in JitKernel.registry():  # the kernels the specs' launchers (and the engine) define
        _ = kernel.jit_function.cache_key


class _ForkedPool(concurrent.futures.Executor):
    """Starts its workers at the first ``submit``: a warm-up with nothing to trace or compile (the
    plan store and the cache have it all) pays neither the key material nor the forks."""

    def __init__(self, jobs: int, targets: list[Target]):
        self.jobs, self.targets = jobs, targets
        self.pool: concurrent.futures.ProcessPoolExecutor | None = None
        self._lock = threading.Lock()

    @property
    def started(self) -> bool:
        """Whether the workers exist (forked at the first ``submit``, all at once, by that thread)."""
        return self.pool is not None

    def submit(self, fn, /, *args, **kwargs):
        with self._lock:
            if self.pool is None:
                prime_key_material(self.targets)
                context = multiprocessing.get_context("fork" if sys.platform == "linux" else "spawn")
                self.pool = concurrent.futures.ProcessPoolExecutor(max_workers=self.jobs, mp_context=context)
        return self.pool.submit(fn, *args, **kwargs)

    def shutdown(self, wait=True, *, cancel_futures=False):
        if self.pool is not None:
            self.pool.shutdown(wait=wait, cancel_futures=cancel_futures)


@contextlib.contextmanager
def worker_pool(jobs: int, targets: Iterable[Target]):
    """A process pool of ``jobs`` workers (None for ``jobs <= 1``: everything runs in this process).

    Leaving the block early (an error, a full disk) cancels what has not started.
    """
    if jobs <= 1:
        yield None
        return
    pool = _ForkedPool(jobs, list(targets))
    try:
        yield pool
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
