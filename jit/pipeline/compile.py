"""Compile one traced variant with Triton's own ``JITFunction.preload``, into a given cache dir."""

from __future__ import annotations

import importlib

from triton import knobs

from ..cache.triton_dir import triton_cache_dir
from ..core.kernel import JitKernel
from ..core.targets import Target, target_driver
from ..core.trace import Variant


def find_kernel(variant: Variant, target: Target | None = None) -> JitKernel:
    if variant.jit_function:  # captured from code that launches it itself (capture: all, record)
        from ..adopt.foreign import find_jit_function, kernel_for

        # imported under the target's answers: module-level constexprs take its serving values
        return kernel_for(find_jit_function(variant.jit_function, target))
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
    kernel = find_kernel(variant, target)
    with target_driver(target) as fake, triton_cache_dir(cache_dir), knobs.compilation.scope():
        knobs.compilation.store_binary_only = binary_only
        try:
            compiled = kernel.jit_function.preload(variant.specialization_data)
        finally:
            kernel.jit_function.device_caches.pop(fake.device, None)
    return compiled
