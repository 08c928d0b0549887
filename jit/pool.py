"""One pool of forked worker processes for a whole warm-up: tracing and compiling share it.

Each worker pays Triton's start-up once. Triton's own key material (``triton_key()``: a sha256 of
every Triton source and of ``libtriton``, about a second; each backend's hash, which asks ``ptxas``
for its version) is computed once here, before the first fork, so that no worker computes it again.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import multiprocessing
import sys
from collections.abc import Iterable

from .targets import Target


def prime_key_material(targets: Iterable[Target]) -> None:
    """Compute, in this process, the parts of every key Triton memoizes: forked workers inherit them."""
    from triton.compiler.compiler import make_backend
    from triton.runtime.cache import triton_key

    triton_key()
    for target in targets:
        make_backend(target.gpu_target).hash()


@contextlib.contextmanager
def worker_pool(jobs: int, targets: Iterable[Target]):
    """A process pool of ``jobs`` workers (None for ``jobs <= 1``: everything runs in this process).

    Leaving the block early (an error, a full disk) cancels what has not started.
    """
    if jobs <= 1:
        yield None
        return
    prime_key_material(targets)
    context = multiprocessing.get_context("fork" if sys.platform == "linux" else "spawn")
    pool = concurrent.futures.ProcessPoolExecutor(max_workers=jobs, mp_context=context)
    try:
        yield pool
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
