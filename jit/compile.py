"""Compile one traced variant with Triton's own ``JITFunction.preload``, into a given cache dir."""

from __future__ import annotations

import contextlib
import importlib
from pathlib import Path

from triton import knobs

from .kernel import JitKernel
from .targets import Target, target_driver
from .trace import Variant


@contextlib.contextmanager
def triton_cache_dir(path):
    """Point this process's Triton at ``path`` for the block; the environment is left untouched."""
    if path is None:
        yield
        return
    with knobs.cache.scope():
        knobs.cache.dir = str(path)
        yield


def triton_reads_instead(cache_dir) -> Path | None:
    """The folder this process's Triton reads its cache from (``TRITON_CACHE_DIR``, or its default),
    when that is not ``cache_dir``: a cache warmed there is then never read."""
    read = Path(knobs.cache.dir).expanduser().resolve()
    return None if read == Path(cache_dir).expanduser().resolve() else read


def find_kernel(variant: Variant) -> JitKernel:
    if variant.jit_function:  # captured from code that launches it itself (capture: all, record)
        from .thirdparty.foreign import find_jit_function, kernel_for

        return kernel_for(find_jit_function(variant.jit_function))
    kernel = JitKernel.lookup(variant.kernel)
    if kernel is None and variant.import_path:
        importlib.import_module(variant.import_path.split(":")[0])
        kernel = JitKernel.lookup(variant.kernel)
    if kernel is None:
        raise LookupError(f"kernel {variant.kernel} is not defined by any imported launcher")
    return kernel


def compile_variant(variant: Variant, target: Target, cache_dir=None, *, binary_only: bool = False):
    """Compile (or find in Triton's disk cache) exactly the request Triton formed while tracing.

    ``binary_only`` uses Triton's own ``store_binary_only``: the entry keeps the cubin/hsaco and its
    metadata, all the runtime loads, and drops the IR (it is not part of the cache key).
    """
    kernel = find_kernel(variant)
    with target_driver(target) as fake, triton_cache_dir(cache_dir), knobs.compilation.scope():
        knobs.compilation.store_binary_only = binary_only
        try:
            compiled = kernel.jit_function.preload(variant.specialization_data)
        finally:
            kernel.jit_function.device_caches.pop(fake.device, None)
    return compiled
