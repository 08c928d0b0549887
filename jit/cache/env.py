"""The environment a cache entry depends on: Triton's version and its cache-invalidating variables."""

from __future__ import annotations


def triton_version() -> str:
    import triton

    return triton.__version__


def cache_env() -> dict[str, str]:
    """The cache-invalidating environment variables in force (Triton's own list)."""
    from triton._C.libtriton import get_cache_invalidating_env_vars

    return dict(sorted(get_cache_invalidating_env_vars().items()))
