"""The environment a cache entry depends on, as data: what enters Triton's key besides the kernel.

Triton's disk-cache key starts with ``triton_key()``: its version, then the sha256 of each of its
Python sources and of ``libtriton.so``; each Python's wheel of one Triton release ships a different
``libtriton.so``, so a cache warmed under another Python misses everything. The cache-invalidating
environment variables enter every key too. ``fingerprint()`` records all of it (read from Triton's own
key material, never recomputed), and ``differences()`` names each way two fingerprints disagree.
"""

from __future__ import annotations

import hashlib
import os
import platform
import sys
import sysconfig

FINGERPRINT_FORMAT = 1


def triton_version() -> str:
    import triton

    return triton.__version__


def cache_env() -> dict[str, str]:
    """The cache-invalidating environment variables in force (Triton's own list)."""
    from triton._C.libtriton import get_cache_invalidating_env_vars

    return dict(sorted(get_cache_invalidating_env_vars().items()))


def libtriton_path() -> str:
    """The ``libtriton`` extension Triton's key hashes (named with this Python's extension suffix)."""
    import triton

    ext = sysconfig.get_config_var("EXT_SUFFIX").split(".")[-1]
    return os.path.join(os.path.dirname(triton.__file__), "_C", f"libtriton.{ext}")


def _sha256_file(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def triton_key_parts() -> dict[str, str]:
    """Triton's own ``triton_key()`` taken apart: version, libtriton's digest, one digest of the rest.

    ``triton_key()`` is ``version + "-".join(sha256 of each part)``; libtriton's part is found by
    its digest, so nothing of Triton's file walk is re-implemented here.
    """
    from triton.runtime import cache as triton_cache

    key = triton_cache.triton_key()
    version = triton_version()
    digests = key[len(version):].split("-")
    libtriton = _sha256_file(libtriton_path())
    sources = [d for d in digests if d != libtriton]
    return {
        "version": version,
        "key_sha256": hashlib.sha256(key.encode()).hexdigest(),
        "libtriton_sha256": libtriton,
        "sources_sha256": hashlib.sha256("-".join(sources).encode()).hexdigest(),
    }


def fingerprint() -> dict:
    """Everything of this process that enters a compiled entry's key or a C launcher's file name."""
    return {
        "format": FINGERPRINT_FORMAT,
        "triton": triton_key_parts(),
        "python": {
            "version": platform.python_version(),
            "implementation": sys.implementation.name,
            "ext_suffix": sysconfig.get_config_var("EXT_SUFFIX"),
        },
        "platform": sysconfig.get_platform(),
        "env": cache_env(),
    }


def fingerprint_id(fp: dict) -> str:
    """A short name for the key-relevant part of a fingerprint: Triton's key material and the env."""
    parts = [fp["triton"]["key_sha256"], sorted(fp["env"].items())]
    return hashlib.sha256(repr(parts).encode()).hexdigest()[:16]


def _python_name(fp: dict) -> str:
    return f"Python {'.'.join(fp['python']['version'].split('.')[:2])}"


def differences(warmed: dict, runtime: dict) -> list[str]:
    """One line per way ``warmed`` and ``runtime`` disagree on what enters a key, with the fix."""
    lines = []
    tw, tr = warmed["triton"], runtime["triton"]
    if tw["version"] != tr["version"]:
        lines.append(f"warmed with Triton {tw['version']}, this runtime has Triton {tr['version']}: every key differs; "
                     f"warm with Triton {tr['version']}")
    else:
        if tw["sources_sha256"] != tr["sources_sha256"]:
            lines.append(f"Triton {tr['version']}'s Python sources differ from the ones warmed with (a patched or "
                         "source build): every key differs; warm with this runtime's Triton")
        if tw["libtriton_sha256"] != tr["libtriton_sha256"]:
            lines.append(f"warmed with {_python_name(warmed)}'s libtriton ({tw['libtriton_sha256'][:8]}…), this runtime "
                         f"has {_python_name(runtime)}'s ({tr['libtriton_sha256'][:8]}…): every key differs; warm with "
                         f"{_python_name(runtime)} or with --for / --for-wheel")
    env_w, env_r = warmed.get("env", {}), runtime.get("env", {})
    for name in sorted(set(env_w) | set(env_r)):
        if env_w.get(name) != env_r.get(name):
            lines.append(f"{name}: warmed with {_shown(env_w.get(name))}, this runtime has {_shown(env_r.get(name))}: "
                         f"every key differs; set it as when warming (or warm again)")
    return lines


def _shown(value) -> str:
    return "it unset" if value is None else repr(value)
