"""Triton's C launchers, built into the cache at warm-up so that the first launch builds nothing.

Triton 3.6 builds, at the first launch of each kernel signature, a small C extension that launches
it (``__triton_launcher<EXT_SUFFIX>`` in ``<cache>/<sha256(source + platform)>/``), and once per cache
the driver's ``cuda_utils`` the same way: gcc, the Python headers, Triton's bundled CUDA headers.
Triton 3.7 has one generic launcher inside ``cuda_utils`` and builds none per signature (``cuda_utils``
is still keyed by its source alone); from 3.8 the key of ``cuda_utils`` also names the library
directories of the serving machine (where ``libcuda.so.1`` lives): known where Triton finds that
library, or where ``TRITON_LIBCUDA_PATH`` names it, as it must then on the serving machine too.

Nothing here re-implements Triton: its own driver classes (``CudaLauncher``, ``CudaUtils``) generate
each source, with their call to the builder recorded instead of run; Triton's own
``compile_module_from_src`` then looks each up in the cache and builds what is missing. Linking needs
a ``libcuda.so.1``: a stub with that name, made here, since the launcher opens the real one at run
time. Nothing is loaded into this process and no GPU is touched.

On AMD, every version's ``hip_utils`` (and 3.6's launchers) embed the absolute path of
``libamdhip64.so`` in their source, found when the driver starts: they are warmed where Triton's own
search finds it (an AMD server, or its image, where ROCm's PyTorch ships it) or ``TRITON_LIBHIP_PATH``
names it, as it must then on the serving machine too. Nothing links against it (it is opened at run
time), so no stub is needed.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import importlib
import inspect
import json
import os
import re
import shutil
import subprocess
import sysconfig
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

from ..cache.overlay import overlay_in_force

LAUNCHER = "__triton_launcher"
_THIS_MACHINE = "this machine's driver"  # what needs the driver utilities keyed by this machine
_WHERE_KEYED = {  # the fix's tail for what is keyed by where this machine's driver library is
    "cuda": (" on this machine, or with TRITON_LIBCUDA_PATH naming where it has libcuda.so.1 "
             "(Triton keys cuda_utils by that place)"),
    "hip": (" on this machine, or with TRITON_LIBHIP_PATH naming its libamdhip64.so "
            "(Triton writes that path into the source of each)"),
}
_LAUNCHER_CLASS = {"cuda": "CudaLauncher", "hip": "HIPLauncher"}
_UTILITIES_CLASS = {"cuda": "CudaUtils", "hip": "HIPUtils"}
DRIVER_UTILITIES = {"cuda": "cuda_utils", "hip": "hip_utils"}

_patch_lock = threading.RLock()


@dataclass
class CLauncherReport:
    """What warm-up did about Triton's C launchers for one target (absent where Triton builds none)."""

    modules: int = 0  # distinct C modules the warmed variants need: launchers + the driver's utilities
    built: int = 0
    cached: int = 0
    failed: list[str] = field(default_factory=list)
    skipped: str | None = None  # why none could be built here, with the fix, in one line
    seconds: float = 0.0

    def to_json(self) -> dict:
        return {**self.__dict__, "summary": self.summary()}

    def summary(self) -> str:
        if self.skipped:
            return f"C launchers not built: {self.skipped}"
        failed = f", {len(self.failed)} failed" if self.failed else ""
        return (f"C launchers: {self.modules} needed: {self.built} built, {self.cached} already cached{failed} "
                f"in {self.seconds:.1f} s")


# --------------------------------------------------------------------------- what this Triton builds


def _driver_module(backend: str):
    return importlib.import_module(f"triton.backends.{'nvidia' if backend == 'cuda' else 'amd'}.driver")


def _build_module():
    return importlib.import_module("triton.runtime.build")


def builds_per_signature(backend: str) -> bool:
    """True where Triton generates and compiles a C launcher per kernel signature (3.6)."""
    return hasattr(_driver_module(backend), "make_launcher")


def utilities_keyed_by_source() -> bool:
    """True where a C module's cache key is its source alone (3.6, 3.7), not also the machine's library dirs."""
    return not hasattr(_build_module(), "_get_cache_manager")


def builds_c_modules(backend: str) -> bool:
    """Whether this Triton builds C modules per kernel signature, or driver utilities keyed by their
    source alone, for this backend (launchers or utilities a build machine can warm)."""
    return builds_per_signature(backend) or (backend == "cuda" and utilities_keyed_by_source())


def hip_runtime_path() -> str | None:
    """The ``libamdhip64.so`` Triton's AMD driver would open (its own search, ``TRITON_LIBHIP_PATH``
    first), or None where it finds none: the path is part of the source of every HIP C module."""
    try:
        return _driver_module("hip")._get_path_to_hip_runtime_dylib()
    except Exception:  # RuntimeError: not found; anything else: Triton's search changed shape
        return None


def warms_c_modules(backend: str) -> bool:
    """Whether warm-up on this machine builds C modules for ``backend``: this Triton's own, or the
    driver utilities keyed by where the driver library is (where Triton finds it or is told)."""
    if backend == "hip" and hip_runtime_path() is None:
        return False
    return builds_c_modules(backend) or machine_utilities_call(backend) is not None


def serving_build_is_warmable(name: str) -> bool:
    """Whether warm-up puts the C module ``name`` in the cache on this Triton (serving-time policy)."""
    import torch

    backend = "hip" if torch.version.hip is not None else "cuda"
    if name == LAUNCHER:
        return builds_per_signature(backend) and (backend == "cuda" or hip_runtime_path() is not None)
    return name == DRIVER_UTILITIES[backend] and warms_c_modules(backend)


def serving_build_fix(name: str) -> str:
    """What warm-up needs to have built the C module ``name`` that serving is building."""
    import torch

    backend = "hip" if torch.version.hip is not None else "cuda"
    machine_keyed = backend == "hip" or (name == DRIVER_UTILITIES["cuda"] and not utilities_keyed_by_source())
    return "warm up with this Python, a C compiler and its headers" + (_WHERE_KEYED[backend] if machine_keyed else "")


def _c_compiler() -> str | None:
    """The compiler Triton's builder picks (``CC``, else gcc, else clang), if it exists."""
    cc = os.environ.get("CC") or shutil.which("gcc") or shutil.which("clang")
    return shutil.which(cc) if cc else None


def _python_include_dir() -> str:
    scheme = sysconfig.get_default_scheme()
    return sysconfig.get_paths(scheme="posix_prefix" if scheme == "posix_local" else scheme)["include"]


def _serving_fingerprint() -> dict | None:
    """The fingerprint of the environment being warmed for (``warmup --for``), if any."""
    from ..cache import env

    return getattr(env, "_serving", None)


def why_not_buildable(backend: str, serving: dict | None = None) -> str | None:
    """One line saying why the C launchers cannot be built here, with the fix; None when they can."""
    from triton import knobs

    if backend == "hip" and serving:
        return ("Triton's HIP modules embed the path of the serving machine's libamdhip64.so, which its "
                "fingerprint does not record: bundle install (or warm up) there to build them")
    if backend == "hip" and hip_runtime_path() is None:
        return ("Triton's HIP modules embed the path of the serving machine's libamdhip64.so, and Triton finds "
                "none here: warm on an AMD server (or in its image, with ROCm's PyTorch), or set TRITON_LIBHIP_PATH "
                "to that path here and there")
    platform = (serving or {}).get("platform")
    if platform and platform != sysconfig.get_platform():  # machine code for another machine
        return (f"the serving platform is {platform}, this one is {sysconfig.get_platform()}: bundle install (or "
                "warm up) on the server to build them")
    python = (serving or {}).get("python", {})
    ext_suffix = sysconfig.get_config_var("EXT_SUFFIX")
    if python.get("ext_suffix") and python["ext_suffix"] != ext_suffix:
        return (f"the serving Python's extensions end in {python['ext_suffix']}, this one's in {ext_suffix}: "
                f"run warm-up with Python {python.get('version', '?')} (a C compiler and its headers) to build them")
    if knobs.build.impl is None:
        if _c_compiler() is None:
            return "no C compiler (set CC or install gcc), which Triton needs to build them"
        if not os.path.exists(os.path.join(_python_include_dir(), "Python.h")):
            return (f"no Python headers in {_python_include_dir()} (install this Python's development "
                    "package, e.g. python3-dev)")
    return None


# --------------------------------------------------------------------------- Triton's sources, recorded


class _NotLoaded:
    """Stands for a built module Triton would load: warm-up must not load a launcher into this process."""

    def __init__(self, name: str, path: str | None = None):
        self.name, self.path = name, path

    def __getattr__(self, attribute):
        return None


@contextlib.contextmanager
def _driver_library_dirs(driver_module, library_dir: str):
    """Triton's CUDA driver looks for libcuda.so.1 to link against; point it at ``library_dir``."""
    from triton import knobs

    caches = [getattr(driver_module, n) for n in ("libcuda_dirs", "library_dirs") if hasattr(driver_module, n)]
    with knobs.nvidia.scope():
        knobs.nvidia.libcuda_path = library_dir
        for cached in caches:
            cached.cache_clear()
        try:
            yield
        finally:
            for cached in caches:
                cached.cache_clear()


@dataclass
class BuilderCall:
    """One ``compile_module_from_src`` call Triton's runtime will make, and what needs it."""

    kwargs: dict
    needed_by: str
    builder: str = "compile_module_from_src"  # the function of ``triton.runtime.build`` Triton calls

    @property
    def name(self) -> str:
        return self.kwargs["name"]

    @property
    def source(self) -> str:
        if "src" in self.kwargs:
            return self.kwargs["src"]
        return Path(self.kwargs["src_path"]).read_text()

    def look_up(self, build):
        """Triton's own lookup (and, unless patched, build) of this module in the cache."""
        return getattr(build, self.builder)(**self.kwargs)

    @property
    def label(self) -> str:
        return f"{self.name} of {self.needed_by}"


def builder_calls(compiled_kernels, backend: str, library_dir: str) -> list[BuilderCall]:
    """The ``compile_module_from_src`` calls Triton's runtime will make for these kernels, deduplicated:
    each launcher's (where built per signature) and the driver utilities' (where keyed by source).

    Triton's own classes generate the sources; their builder call is recorded, not run.
    """
    driver_module = _driver_module(backend)
    calls: dict[tuple[str, str], BuilderCall] = {}
    needed_by = "the driver"

    def record(src, name, library_dirs=None, include_dirs=None, libraries=None, ccflags=None):
        kwargs = dict(src=src, name=name, library_dirs=library_dirs, include_dirs=include_dirs, libraries=libraries,
                      ccflags=ccflags)
        calls.setdefault((name, src), BuilderCall(kwargs, needed_by))
        return _NotLoaded(name)

    libraries = _driver_library_dirs(driver_module, library_dir) if backend == "cuda" else contextlib.nullcontext()
    with _patch_lock, libraries:
        saved = dict(vars(driver_module))  # CudaUtils sets module globals from the module it loads
        driver_module.compile_module_from_src = record
        try:
            if builds_per_signature(backend):
                for kernel in compiled_kernels:
                    needed_by = kernel.name
                    getattr(driver_module, _LAUNCHER_CLASS[backend])(kernel.src, kernel.metadata)
            if backend == "cuda" and utilities_keyed_by_source():
                needed_by = "the driver"
                utilities = driver_module.CudaUtils
                utilities.__init__(object.__new__(utilities))
        finally:
            vars(driver_module).update(saved)
    return list(calls.values())


def machine_utilities_call(backend: str) -> BuilderCall | None:
    """The driver utilities whose key names where this machine's driver library is: from Triton 3.8
    CUDA's (its library directories: where ``libcuda.so.1`` lives, and Triton's own install path), on
    AMD every version's (``libamdhip64.so``'s path is in the source). The serving machine builds them
    when its driver starts, into the cache, and fails there if the cache is read-only. Where Triton
    finds that library (a serving machine, with or without a GPU attached), or is told where the
    serving machines have it (``TRITON_LIBCUDA_PATH`` / ``TRITON_LIBHIP_PATH``, set the same way
    there), the key is known: this is Triton's own call for it, recorded. None where the key is the
    source alone, or Triton finds no such library, or the cache is keyed for another environment
    (``--for``)."""
    from ..cache.env import keyed_for_another

    if keyed_for_another():
        return None
    driver_module = _driver_module(backend)
    if backend == "hip":
        if hip_runtime_path() is None:
            return None
    elif utilities_keyed_by_source():
        return None
    else:
        try:
            driver_module.library_dirs()
        except Exception:  # Triton's own search finds no libcuda.so.1 and none is named: the key is unknown
            return None
    calls: list[BuilderCall] = []

    def recorder(builder):
        signature = inspect.signature(getattr(_build_module(), builder))

        def record(*args, **kwargs):
            kwargs = dict(signature.bind(*args, **kwargs).arguments)
            calls.append(BuilderCall(kwargs, _THIS_MACHINE, builder))
            return _NotLoaded(kwargs["name"])
        return record

    with _patch_lock:
        saved = dict(vars(driver_module))  # CudaUtils sets module globals from the module it loads
        for builder in ("compile_module_from_src", "compile_module_from_file"):
            if hasattr(driver_module, builder):
                setattr(driver_module, builder, recorder(builder))
        try:
            utilities = getattr(driver_module, _UTILITIES_CLASS[backend])
            utilities.__init__(object.__new__(utilities))
        finally:
            vars(driver_module).update(saved)
    return calls[0] if calls else None


_DRIVER_CALL = re.compile(r"\b(cu[A-Z]\w*)\s*\(")


def write_stub_libcuda(directory: str, sources: list[str]) -> str:
    """An empty ``libcuda.so.1`` in ``directory``, to link against: it defines each driver function the
    sources call, so that the linker (``--as-needed``) keeps ``libcuda.so.1`` as a dependency exactly as
    with the real library; at run time the real one is loaded in its place."""
    names = sorted({name for src in sources for name in _DRIVER_CALL.findall(src)})
    src = Path(directory, "libcuda_stub.c")
    src.write_text("".join(f"int {name}(void) {{ return 0; }}\n" for name in names) or "int cuInit(void);\n")
    library = Path(directory, "libcuda.so.1")
    subprocess.run([_c_compiler() or "cc", "-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-o", str(library),
                    str(src)], check=True, capture_output=True)
    return str(library)


@contextlib.contextmanager
def _lookups(on_miss, link_dir: str | None = None):
    """Triton's own cache lookup of C modules, with ``on_miss(name)`` run before a build (it may refuse
    it) and nothing loaded into this process. ``link_dir`` is searched first when linking (where the stub
    ``libcuda.so.1`` is): the key keeps the library dirs Triton names, the module records no path."""
    build = _build_module()
    with _patch_lock:
        saved = build._load_module_from_path, build._build
        build._load_module_from_path = _NotLoaded
        original_build = saved[1]

        def build_or_refuse(name, src, srcdir, library_dirs, *args, **kwargs):
            on_miss(name)
            library_dirs = [link_dir, *library_dirs] if link_dir else library_dirs
            return original_build(name, src, srcdir, library_dirs, *args, **kwargs)

        build._build = build_or_refuse
        try:
            yield build
        finally:
            build._load_module_from_path, build._build = saved


# --------------------------------------------------------------------------- warm-up and check


_TYPE = re.compile(r"[A-Za-z0-9_*<>\[\],]{1,80}")  # a Triton type as the signature writes it: nothing C could parse


def _signature(specialization_data: str, what: str) -> dict:
    """The kernel's signature (parameter → Triton type) from the compile request its row records."""
    def checked(value):
        if isinstance(value, list):  # a tuple parameter, as JSON writes it
            return tuple(checked(v) for v in value)
        if not isinstance(value, str) or not _TYPE.fullmatch(value):
            raise ValueError(f"{what}: the signature holds {str(value)[:40]!r}, not a Triton type")
        return value

    try:
        signature = json.loads(specialization_data)["signature"]
    except (ValueError, KeyError, TypeError):
        raise ValueError(f"{what}: no signature in its specialization data") from None
    if not isinstance(signature, dict):
        raise ValueError(f"{what}: the signature is not a table")
    return {str(name): checked(value) for name, value in signature.items()}


def _from_entries(variants, cache_dir) -> list:
    """What Triton's launcher classes read of each compiled kernel (its signature, its metadata),
    taken from the entry in the cache and the signature its row records: no kernel module is
    imported and nothing compiles, so a bundle's header naming modules runs none of them."""
    from ..cache.layout import entry_path

    kernels = []
    for variant in variants:
        what = f"entry {variant.entry_dir[:16]}"
        # The entry's own file, not its group's view: a volume filled for another mount path (--serve-at)
        # has groups naming files there, and its launchers are built or looked up here all the same.
        path = entry_path(cache_dir, variant.entry_dir) / f"{variant.entry_name[:150]}.json"
        try:
            metadata = json.loads(path.read_text())
        except FileNotFoundError:
            raise ValueError(f"{what}: not in the cache") from None
        if not isinstance(metadata, dict):
            raise ValueError(f"{what}: its metadata is not a table")
        signature = _signature(variant.specialization_data, what)
        kernels.append(SimpleNamespace(
            name=variant.entry_name, metadata=SimpleNamespace(**{str(k): v for k, v in metadata.items()}),
            src=SimpleNamespace(constants={}, signature=signature, fn=SimpleNamespace(arg_names=list(signature)))))
    return kernels


def _runtime_builds(variants, target, cache_dir, library_dir: str, machine: BuilderCall | None) -> list[BuilderCall]:
    """Every C module the runtime will build for ``variants``: this Triton's launchers and source-keyed
    utilities (``builder_calls``), then the driver utilities keyed by this machine (``machine``)."""
    kernels = _from_entries(variants, cache_dir) if builds_per_signature(target.backend) else []
    calls = builder_calls(kernels, target.backend, library_dir) if builds_c_modules(target.backend) else []
    return calls + ([machine] if machine else [])


def warm_c_launchers(variants, target, cache_dir: Path, *, jobs: int = 1,
                     serving: dict | None = None) -> CLauncherReport | None:
    """Build the C launchers (and driver utilities) the runtime will build for ``variants``, into the
    cache; None where this Triton builds none for the target's backend."""
    from ..cache.triton_dir import triton_cache_dir

    backend = target.backend
    machine = machine_utilities_call(backend) if variants else None
    if not variants or not (builds_c_modules(backend) or machine):
        return None
    start = time.perf_counter()
    report = CLauncherReport()
    report.skipped = why_not_buildable(backend, serving if serving is not None else _serving_fingerprint())
    if report.skipped:
        return report
    counted = threading.Lock()
    attempted, broken = [], []

    def count_build(name):
        with counted:
            attempted.append(name)

    with tempfile.TemporaryDirectory(prefix="tritonwarm-libcuda-") as library_dir, triton_cache_dir(cache_dir):
        try:
            calls = _runtime_builds(variants, target, cache_dir, library_dir, machine)
            if backend == "cuda":  # (HIP modules open libamdhip64.so at run time, by path: nothing to link)
                write_stub_libcuda(library_dir, [call.source for call in calls])
        except Exception as e:  # Triton's driver code changed shape, or the stub does not link: say so
            report.failed.append(f"preparing the C launchers: {type(e).__name__}: {e}")
            calls = []
        report.modules = len(calls)
        with _lookups(count_build, link_dir=library_dir) as build:
            with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, min(jobs, len(calls) or 1))) as pool:
                futures = {pool.submit(call.look_up, build): call for call in calls}
                for future in concurrent.futures.as_completed(futures):
                    try:
                        future.result()
                    except Exception as e:  # a compiler error: say which module, keep the others
                        report.failed.append(f"{futures[future].label}: {type(e).__name__}: {e}")
                        broken.append(futures[future])
    report.built = len(attempted) - len(broken)
    report.cached = report.modules - len(attempted)
    report.seconds = round(time.perf_counter() - start, 3)
    return report


class _Missing(Exception):
    pass


def missing_c_launchers(variants, target, cache_dir: Path) -> tuple[list[str], str | None]:
    """The C modules the runtime would build for ``variants`` (whose entries are in the cache), and the
    fix in one line; ``([], None)`` when none would be built."""
    _, missing = look_up_c_launchers(variants, target, cache_dir)
    if not missing:
        return [], None
    fix = why_not_buildable(target.backend) or "run warmup again (with a C compiler and this Python's headers)"
    if target.backend == "hip" or any(label.endswith(_THIS_MACHINE) for label in missing):
        fix += _WHERE_KEYED[target.backend]
    if not os.access(cache_dir, os.W_OK) and overlay_in_force() is None:  # Triton makes the folder first: OSError
        fix = (f"this process cannot write to the cache (read-only, or another owner's): Triton's first launch "
               f"would fail writing them into it: {fix}, before it is mounted read-only")
    return missing, fix


def look_up_c_launchers(variants, target, cache_dir: Path) -> tuple[int, list[str]]:
    """How many C modules the runtime needs for ``variants`` (entries in the cache), and which of them
    the cache lacks, as Triton's own lookup finds them (nothing is built or loaded)."""
    from ..cache.triton_dir import triton_cache_dir

    backend = target.backend
    machine = machine_utilities_call(backend) if variants else None
    if not variants or not (builds_c_modules(backend) or machine):
        return 0, []
    if backend == "hip" and hip_runtime_path() is None:
        return 0, []  # the keys name the serving machine's libamdhip64.so; warm-up says why
    missing: list[str] = []

    def refuse(name):
        raise _Missing(name)

    before = set(os.listdir(cache_dir)) if os.path.isdir(cache_dir) else set()
    with tempfile.TemporaryDirectory() as library_dir, triton_cache_dir(cache_dir):
        calls = _runtime_builds(variants, target, cache_dir, library_dir, machine)
        with _lookups(refuse) as build:
            for call in calls:
                try:
                    call.look_up(build)
                except (_Missing, OSError):  # OSError: a read-only cache without it
                    missing.append(call.label)
    for name in set(os.listdir(cache_dir)) - before:  # Triton makes a folder per lookup: leave none behind
        with contextlib.suppress(OSError):
            os.rmdir(os.path.join(cache_dir, name))
    return len(calls), missing
