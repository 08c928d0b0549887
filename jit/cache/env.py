"""The environment a cache entry depends on, as data: what enters Triton's key besides the kernel.

Triton's disk-cache key starts with ``triton_key()``: its version, then the sha256 of each of its
Python sources and of ``libtriton.so``; each Python's wheel of one Triton release ships a different
``libtriton.so``, so a cache warmed under another Python misses everything. The backend's hash (the
ptxas / linker version, per target) and the cache-invalidating environment variables enter every key
too, and a C launcher's file name depends on the Python build. ``fingerprint()`` records all of it
(read from Triton's own key material, never recomputed), and ``differences()`` names each way two
fingerprints disagree, with the fix.
"""

from __future__ import annotations

import functools
import hashlib
import os
import platform
import re
import shutil
import sys
import sysconfig
import threading

from .layout import file_sha256

FINGERPRINT_FORMAT = 1

# While warming for another environment (``serving.serving_environment``), the fingerprint of that
# environment: what ``current_fingerprint()`` answers, and what manifests record.
_serving: dict | None = None
_original_key_fn = None  # Triton's own triton_key while another environment's is installed (serving.py)


def triton_version() -> str:
    import triton

    return triton.__version__


def cache_env() -> dict[str, str]:
    """The cache-invalidating environment variables in force (Triton's own list)."""
    from triton._C.libtriton import get_cache_invalidating_env_vars

    return dict(sorted(get_cache_invalidating_env_vars().items()))


def cache_bypassed() -> str | None:
    """Why this process's Triton would not serve what its cache folder holds, or None.

    ``TRITON_ALWAYS_COMPILE`` skips every cache hit (it is no part of the key, so nothing else shows
    it). ``TRITON_CACHE_MANAGER`` replaces the folder: one that does not import fails Triton's first
    lookup, in the middle of serving; one that is not a file cache reads a store nothing here can see.
    """
    from triton import knobs

    if knobs.compilation.always_compile:
        return ("TRITON_ALWAYS_COMPILE is set: Triton compiles every kernel at its first launch whatever the "
                "cache holds: unset it where serving reads the cache")
    problem = cache_manager_problem()
    if problem is None:
        return None
    broken, what = problem
    if broken:
        return f"{what}: Triton's first cache lookup would fail: fix or unset it where serving runs"
    return (f"{what}: what it holds cannot be checked here: unset it, or use "
            "tritonwarm.jit.cache.remote:RedisCacheManager, which reads through the folder")


def cache_manager_problem() -> tuple[bool, str] | None:
    """``(broken, what)`` when ``TRITON_CACHE_MANAGER`` replaces the cache folder: one that does not
    import (``broken``), or one that is not a file cache; None for the folder itself (Triton's
    ``FileCacheManager`` or a subclass, such as tritonwarm's ``RedisCacheManager``) and for Triton's
    ``RemoteCacheManager`` over tritonwarm's ``RedisBackend``, which reads through the folder too."""
    from triton import knobs
    from triton.runtime.cache import FileCacheManager, RemoteCacheManager

    from .remote import RedisBackend

    named = os.environ.get("TRITON_CACHE_MANAGER")
    try:
        manager = knobs.cache.manager_class
        backend = knobs.cache.remote_manager_class if _subclass(manager, RemoteCacheManager) else None
    except Exception as e:  # Triton imports them at its first lookup, and raises there
        why = " ".join(f"{type(e).__name__}: {e}".split())
        return True, f"TRITON_CACHE_MANAGER={named!r} cannot be used ({why})"
    if manager is None or _subclass(manager, FileCacheManager) or _subclass(backend, RedisBackend):
        return None
    return False, (f"TRITON_CACHE_MANAGER={named or manager.__qualname__!r} is not a file cache (Triton reads and "
                   "writes through it, not the cache folder)")


def _subclass(cls, base: type) -> bool:
    return isinstance(cls, type) and issubclass(cls, base)


_probe_lock = threading.Lock()


@functools.lru_cache(maxsize=1)
def _knob_env_names() -> tuple[str, ...]:
    """Every environment variable Triton's ``knobs`` declare (each knob descriptor names its variable)."""
    from triton import knobs

    names = set()
    for holder in vars(knobs).values():
        if isinstance(holder, type):
            for attribute in vars(holder).values():
                if isinstance(attribute, knobs.env_base) and isinstance(getattr(attribute, "key", None), str):
                    names.add(attribute.key)
    return tuple(sorted(names))


@functools.lru_cache(maxsize=1)
def _invalidating_knob_names() -> tuple[str, ...]:
    """The knob variables that invalidate the cache: each one Triton's own
    ``get_cache_invalidating_env_vars`` reports once it is set (Triton keeps that list in C++ only)."""
    from triton._C.libtriton import get_cache_invalidating_env_vars

    found = []
    with _probe_lock:
        for name in _knob_env_names():
            previous = os.environ.get(name)
            os.environ[name] = previous if previous is not None else "1"
            try:
                if name in get_cache_invalidating_env_vars():
                    found.append(name)
            finally:
                if previous is None:
                    del os.environ[name]
    return tuple(found)


def cache_env_names() -> list[str]:
    """The cache-invalidating variable names Triton knows: the knobs that invalidate, plus any set now."""
    return sorted(set(_invalidating_knob_names()) | set(cache_env()))


def libtriton_path() -> str:
    """The ``libtriton`` extension Triton's key hashes (named with this Python's extension suffix)."""
    import triton

    ext = sysconfig.get_config_var("EXT_SUFFIX").split(".")[-1]
    return os.path.join(os.path.dirname(triton.__file__), "_C", f"libtriton.{ext}")


@functools.lru_cache(maxsize=1)
def hashed_sources() -> tuple[tuple[str, str], ...]:
    """``(path inside the triton package, sha256)`` of each Python file ``triton_key()`` hashes, in
    its order: ``runtime/cache.py``, then the ``compiler`` and ``backends`` packages, (libtriton,) then
    ``language``, walked as Triton walks them (``pkgutil.walk_packages``)."""
    import pkgutil

    import triton

    root = os.path.dirname(os.path.abspath(triton.__file__))
    paths = [os.path.join(root, "runtime", "cache.py")]
    for folder in ("compiler", "backends", "language"):
        for lib in pkgutil.walk_packages([os.path.join(root, folder)], prefix=f"triton.{folder}."):
            paths.append(lib.module_finder.find_spec(lib.name).origin)
    return tuple((os.path.relpath(p, root).replace(os.sep, "/"), file_sha256(p)) for p in paths)


def local_triton_key() -> str:
    """This installation's own ``triton_key()``, even while another environment's key is installed."""
    from triton.runtime import cache as triton_cache

    return _original_key_fn() if _original_key_fn is not None else triton_cache.triton_key()


def original_triton_key():
    """Triton's own ``triton_key`` while another environment's is installed, else None."""
    return _original_key_fn


def current_triton_key_sha256() -> str:
    """sha256 of the ``triton_key()`` in force now (another environment's while warming for it)."""
    from triton.runtime import cache as triton_cache

    return hashlib.sha256(triton_cache.triton_key().encode()).hexdigest()


@functools.lru_cache(maxsize=4)
def _key_parts(key: str) -> dict[str, str]:
    version = triton_version()
    digests = key[len(version):].split("-")
    sources = {digest for _, digest in hashed_sources()}
    rest = [d for d in digests if d not in sources]
    libtriton = rest[0] if len(rest) == 1 else file_sha256(libtriton_path())
    return {
        "version": version,
        "key_sha256": hashlib.sha256(key.encode()).hexdigest(),
        "libtriton_sha256": libtriton,
        "sources_sha256": hashlib.sha256("-".join(d for d in digests if d != libtriton).encode()).hexdigest(),
    }


def triton_key_parts() -> dict[str, str]:
    """This Triton's own ``triton_key()`` taken apart: version, libtriton's digest, one digest of the rest.

    ``triton_key()`` is ``version + "-".join(sha256 of each part)``; libtriton's part is the one digest
    that is not one of its Python sources, so libtriton's 500 MB are not read a second time.
    """
    return dict(_key_parts(local_triton_key()))


def backend_hashes() -> dict[str, str]:
    """Each known target's backend hash (Triton's ``make_backend(target).hash()``: the ptxas or linker
    version and the arch), as it enters every key of that target."""
    from triton.compiler.compiler import make_backend

    from ..core.targets import TARGETS

    out = {}
    for target in TARGETS.values():
        try:
            out[target.name] = str(make_backend(target.gpu_target).hash())
        except Exception as e:  # a backend whose tools are missing: say so, the rest still counts
            out[target.name] = f"unavailable: {type(e).__name__}: {e}"
    return out


def build_tools() -> dict:
    """What Triton's ``runtime/build.py`` would build a C launcher with: ``$CC`` (else gcc, else clang)
    and this Python's headers."""
    from triton import knobs

    cc = os.environ.get("CC")
    found = shutil.which(cc) if cc else shutil.which("gcc") or shutil.which("clang")
    scheme = sysconfig.get_default_scheme()
    if scheme == "posix_local":  # as Triton does
        scheme = "posix_prefix"
    include = sysconfig.get_paths(scheme=scheme)["include"]
    try:
        from triton.runtime.build import platform_key

        launcher_platform = platform_key()
    except ImportError:
        launcher_platform = None
    return {
        "c_compiler": found or cc,
        "c_compiler_found": found is not None,
        "custom_build": getattr(getattr(knobs, "build", None), "impl", None) is not None,
        "python_include": include,
        "python_headers": os.path.exists(os.path.join(include, "Python.h")),
        "launcher_platform": launcher_platform,
    }


def fingerprint() -> dict:
    """Everything of this process that enters a compiled entry's key or a C launcher's file name."""
    return {
        "format": FINGERPRINT_FORMAT,
        "triton": triton_key_parts(),
        "triton_sources": dict(hashed_sources()),
        "python": {
            "version": platform.python_version(),
            "implementation": sys.implementation.name,
            "ext_suffix": sysconfig.get_config_var("EXT_SUFFIX"),
        },
        "platform": sysconfig.get_platform(),
        "backends": backend_hashes(),
        "env": cache_env(),
        "env_unset": [n for n in cache_env_names() if n not in cache_env()],
        "build": build_tools(),
    }


def keyed_for_another() -> bool:
    """Whether keys are computed for another serving environment (``--for``): then this process's
    own settings (``TRITON_ALWAYS_COMPILE``, the folder its Triton reads) say nothing of the server."""
    return _serving is not None


def current_fingerprint() -> dict:
    """The environment keys are computed for now: this process's, or the one being warmed for."""
    return _serving if _serving is not None else fingerprint()


def fingerprint_id(fp: dict, target: str | None = None) -> str:
    """A short name for the key-relevant part of a fingerprint: Triton's key material, the env and the
    backends (only ``target``'s when given: what the keys of that target depend on)."""
    backends = fp.get("backends", {})
    if target is not None:
        backends = {target: backends.get(target)}
    parts = [fp["triton"]["key_sha256"], sorted(fp.get("env", {}).items()), sorted(backends.items())]
    return hashlib.sha256(repr(parts).encode()).hexdigest()[:16]


def first_differing_source(warmed: dict, runtime: dict) -> str | None:
    """The first Python file of Triton's key whose digest differs between two fingerprints (when both
    list them): what a patched or source build changed."""
    a, b = warmed.get("triton_sources"), runtime.get("triton_sources")
    if not isinstance(a, dict) or not isinstance(b, dict):
        return None
    return next((f"triton/{path}" for path in list(b) + [p for p in a if p not in b] if a.get(path) != b.get(path)),
                None)


def same_environment(warmed: dict, runtime: dict, target: str | None = None) -> bool:
    """Would ``runtime`` compute the keys ``warmed`` did (for ``target``)? A fingerprint recorded
    without Triton's key material is judged by what it has: Triton's version and the env."""
    if "key_sha256" in warmed.get("triton", {}):
        return fingerprint_id(warmed, target) == fingerprint_id(runtime, target)
    return (warmed.get("triton", {}).get("version") == runtime["triton"]["version"]
            and warmed.get("env", {}) == runtime.get("env", {}))


def python_name(fp: dict) -> str:
    version = str(fp.get("python", {}).get("version", "?"))
    return f"Python {'.'.join(version.split('.')[:2])}"


def backend_name(backend_hash: str, *, build: bool = False) -> str:
    found = re.search(r"release ([\d.]+), V([\d.]+)", backend_hash)
    if found:
        stamp = ptxas_build(backend_hash)
        return f"ptxas {found.group(2)}" + (f" built {stamp['built']}" if build and stamp else "")
    if backend_hash.startswith("GPUTarget("):  # HIP: the target, then the digest of its tools, if any
        rest = backend_hash.split(")", 1)[1].lstrip("-")
        return f"tools {rest[:12]}…" if rest else "no tool version"
    return backend_hash if len(backend_hash) <= 48 else backend_hash[:45] + "…"


_PTXAS_VERSION = re.compile(r"(?P<name>[^\n]*): NVIDIA \(R\) Ptx optimizing assembler\n.*?Built on (?P<built>[^\n]*)\n"
                            r"(?P<release>Cuda compilation tools, release [^\n]*)\n(?P<build>Build [^\n]*)\n?"
                            r"-(?P<arch>\d+)", re.S)


def ptxas_build(backend_hash: str) -> dict | None:
    """A CUDA backend hash (``ptxas --version`` + ``-arch``) taken apart: name, built, release, build, arch."""
    found = _PTXAS_VERSION.fullmatch(backend_hash or "")
    return found.groupdict() if found else None


def same_ptxas_elsewhere(a: str, b: str) -> bool:
    """Two CUDA backend hashes that differ only in ptxas's build stamp: one ptxas release and compiler
    build, compiled for two machine architectures (each platform's Triton wheel bundles its own, and
    Triton hashes the whole ``--version`` text, "Built on" included). Their output is the same binary."""
    pa, pb = ptxas_build(a), ptxas_build(b)
    return a != b and pa is not None and pb is not None and all(
        pa[part] == pb[part] for part in ("name", "release", "build", "arch"))


def differences(warmed: dict, runtime: dict, *, targets=None) -> list[str]:
    """One line per way ``warmed`` and ``runtime`` disagree on what enters a key, with the fix.

    Fingerprints recorded before environments were kept may lack parts; what is not known is not
    compared. ``targets``: compare only these targets' backends.
    """
    lines = []
    tw, tr = warmed.get("triton", {}), runtime.get("triton", {})
    if tw.get("version") != tr.get("version"):
        lines.append(f"warmed with Triton {tw.get('version')}, this runtime has Triton {tr.get('version')}: "
                     f"every key differs: warm with Triton {tr.get('version')}")
    else:
        if tw.get("sources_sha256") and tw.get("sources_sha256") != tr.get("sources_sha256"):
            changed = first_differing_source(warmed, runtime)
            lines.append(f"Triton {tr.get('version')}'s Python sources differ from the ones warmed with "
                         f"({changed + ' first; ' if changed else ''}a patched or source build): every key differs: "
                         "warm with this runtime's Triton")
        if tw.get("libtriton_sha256") and tw.get("libtriton_sha256") != tr.get("libtriton_sha256"):
            lines.append(f"warmed with {python_name(warmed)}'s libtriton ({tw['libtriton_sha256'][:8]}…), this "
                         f"runtime has {python_name(runtime)}'s ({tr['libtriton_sha256'][:8]}…): every key differs: "
                         f"warm with {python_name(runtime)} or use warmup --for / --for-wheel")
    bw, br = warmed.get("backends", {}), runtime.get("backends", {})
    for name in sorted(set(bw) & set(br)):
        if (targets is not None and name not in targets) or bw[name] == br[name]:
            continue
        if same_ptxas_elsewhere(bw[name], br[name]):
            lines.append(f"{name}: warmed with {backend_name(bw[name], build=True)} on {warmed.get('platform', '?')}, "
                         f"this runtime has the same release built {ptxas_build(br[name])['built']} on "
                         f"{runtime.get('platform', '?')} (Triton hashes ptxas's whole --version): every {name} key "
                         "differs: warm with --for FILE, FILE written here by `tritonwarm env -o FILE`")
        else:
            lines.append(f"{name}: warmed with {backend_name(bw[name])}, this runtime has {backend_name(br[name])}: "
                         f"every {name} key differs: warm with this runtime's compiler backend (same Triton wheel, "
                         "same TRITON_PTXAS_PATH)")
    if "env" in warmed:
        env_w, env_r = warmed.get("env", {}), runtime.get("env", {})
        for name in sorted(set(env_w) | set(env_r)):
            if env_w.get(name) != env_r.get(name):
                lines.append(f"{name}: warmed with {_shown(env_w.get(name))}, this runtime has "
                             f"{_shown(env_r.get(name))}: every key differs: set it identically when warming and "
                             "serving")
    return lines


def _shown(value) -> str:
    return "it unset" if value is None else f"{value!r}"
