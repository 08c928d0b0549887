"""Warming for another environment: compile with this Triton, key as the serving environment will.

The serving machine's key differs from this one's only where its ``libtriton`` differs (each Python's
wheel of a Triton release ships its own binary). So the serving ``triton_key()`` is this one's with
libtriton's digest replaced; it is installed as ``triton.runtime.cache.triton_key`` for the duration
(Triton's own compile pool does the same for its workers), with the serving cache-invalidating
variables, so traced keys, compiled entries and the plan store all follow it. Anything else that
differs (the Triton release, one of its hashed Python sources, a target's backend) would make
different binaries, so it is refused, in one line.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import platform
import re
import sysconfig
import zipfile
from pathlib import Path

from ..core.trace import hash_inputs
from . import env as env_module

_ptxas_texts: tuple = ()  # (arch, --version text) of the serving ptxas builds hashed instead of this one's


class ServingEnvironmentError(ValueError):
    """A fingerprint or wheel this Triton cannot warm for (one line, exit 2)."""


def ptxas_texts_in_force() -> tuple:
    """The serving ptxas texts Triton's CUDA backend hashes now, for memos of keys; () when its own."""
    return _ptxas_texts


hash_inputs.append(ptxas_texts_in_force)  # memoized disk-cache hashes are told apart by them (core/trace.py)


_HEX64 = re.compile(r"^[0-9a-f]{64}$")


def load_fingerprint(path: str | os.PathLike) -> dict:
    """Read a fingerprint written by ``tritonwarm env -o``; every field a key depends on is checked."""
    try:
        data = json.loads(Path(path).read_text())
    except OSError as e:
        raise ServingEnvironmentError(f"{path}: cannot read it ({e.strerror or e})") from None
    except ValueError as e:
        raise ServingEnvironmentError(f"{path}: not JSON ({e})") from None
    if not isinstance(data, dict) or data.get("format") != env_module.FINGERPRINT_FORMAT:
        raise ServingEnvironmentError(f"{path}: not a fingerprint of format {env_module.FINGERPRINT_FORMAT} "
                                      "(write one with `tritonwarm env -o FILE` on the serving image)")
    triton = data.get("triton")
    if not isinstance(triton, dict):
        raise ServingEnvironmentError(f"{path}: field triton: missing or not an object")
    if not isinstance(triton.get("version"), str):
        raise ServingEnvironmentError(f"{path}: field triton.version: missing or not a string")
    for name in ("key_sha256", "libtriton_sha256", "sources_sha256"):
        value = triton.get(name)
        if not isinstance(value, str) or not _HEX64.match(value):
            raise ServingEnvironmentError(f"{path}: field triton.{name}: {value!r} is not a sha256 hex digest")
    env = data.get("env", {})
    if not isinstance(env, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
        raise ServingEnvironmentError(f"{path}: field env: not an object of strings")
    if not isinstance(data.get("backends", {}), dict):
        raise ServingEnvironmentError(f"{path}: field backends: not an object")
    if not isinstance(data.get("triton_sources", {}), dict):
        raise ServingEnvironmentError(f"{path}: field triton_sources: not an object")
    python = data.get("python")
    if not isinstance(python, dict):
        raise ServingEnvironmentError(f"{path}: field python: missing or not an object")
    for name in ("version", "ext_suffix"):  # which Python's C launchers a warm-up may build
        if not isinstance(python.get(name), str):
            raise ServingEnvironmentError(f"{path}: field python.{name}: missing or not a string")
    return data


def fingerprint_from_wheel(path: str | os.PathLike) -> dict:
    """The serving fingerprint of a Triton wheel for another Python: this one's, with the wheel's
    libtriton. Refused unless the release and every Python source ``triton_key()`` hashes are identical."""
    path = Path(path)
    try:
        with zipfile.ZipFile(path) as wheel:
            names = set(wheel.namelist())
            metadata = _dist_info_file(wheel, names, "METADATA", path)
            version = re.search(r"^Version: *(\S+)", metadata, re.M)
            if version is None:
                raise ServingEnvironmentError(f"{path}: its METADATA names no Version")
            local = env_module.triton_version()
            if version.group(1) != local:
                raise ServingEnvironmentError(f"{path}: Triton {version.group(1)}, this Triton is {local}: warm with "
                                              f"Triton {version.group(1)} installed (only libtriton may differ)")
            tags = re.findall(r"^Tag: *(\S+)", _dist_info_file(wheel, names, "WHEEL", path), re.M)
            _same_machine(tags, path)
            _compare_sources(wheel, names, path)
            lib = f"triton/_C/libtriton.{sysconfig.get_config_var('EXT_SUFFIX').split('.')[-1]}"
            if lib not in names:
                raise ServingEnvironmentError(f"{path}: no {lib}: not a Triton wheel for this platform")
            h = hashlib.sha256()
            with wheel.open(lib) as f:
                for chunk in iter(lambda: f.read(1 << 20), b""):
                    h.update(chunk)
    except (zipfile.BadZipFile, EOFError, zipfile.LargeZipFile) as e:
        raise ServingEnvironmentError(f"{path}: not a readable wheel ({e})") from None
    except OSError as e:
        raise ServingEnvironmentError(f"{path}: cannot read it ({e.strerror or e})") from None
    local_fp = env_module.fingerprint()
    libtriton = h.hexdigest()
    key = _serving_key_string(libtriton)
    python = _python_of_tags(tags, local_fp["python"])
    return {**local_fp, "python": python,
            "triton": {**local_fp["triton"], "libtriton_sha256": libtriton,
                       "key_sha256": hashlib.sha256(key.encode()).hexdigest()},
            "wheel": {"file": path.name, "tags": tags}}


def _same_machine(tags: list[str], path: Path) -> None:
    """A wheel for another machine architecture bundles another build of ptxas, whose ``--version``
    text every CUDA key hashes ("Built on" differs): only the server itself can say what it prints."""
    here = platform.machine()
    for tag in tags:
        machine = re.search(r"(x86_64|aarch64|arm64|ppc64le|s390x|i686|armv7l)$", tag)
        if machine and machine.group(1) != here:
            raise ServingEnvironmentError(
                f"{path}: a wheel for {machine.group(1)} (tag {tag}), this machine is {here}: its ptxas, whose "
                "--version every CUDA key hashes, is another build: write the server's fingerprint there with "
                "`tritonwarm env -o FILE` and warm with --for FILE")


def _dist_info_file(wheel: zipfile.ZipFile, names: set[str], name: str, path: Path) -> str:
    found = sorted(n for n in names if re.fullmatch(rf"triton[^/]*\.dist-info/{name}", n))
    if not found:
        raise ServingEnvironmentError(f"{path}: no triton-*.dist-info/{name}: not a Triton wheel")
    return wheel.read(found[0]).decode("utf-8", "replace")


def _compare_sources(wheel: zipfile.ZipFile, names: set[str], path: Path) -> None:
    """Every Python file the key hashes must be byte-identical; the first that is not is named."""
    for relative, digest in env_module.hashed_sources():
        member = f"triton/{relative}"
        if member not in names:
            raise ServingEnvironmentError(f"{path}: lacks {member}, which this Triton's key hashes: a different "
                                          "build of Triton; warm with the serving Triton installed")
        if hashlib.sha256(wheel.read(member)).hexdigest() != digest:
            raise ServingEnvironmentError(f"{path}: {member} differs from this Triton's: a different build of "
                                          "Triton; warm with the serving Triton installed")
    hashed = {f"triton/{r}" for r, _ in env_module.hashed_sources()}
    import triton

    root = Path(triton.__file__).resolve().parent
    for member in sorted(names):
        if (member.endswith(".py") and member.split("/")[1:2] in (["compiler"], ["backends"], ["language"])
                and member not in hashed and not (root / member[len("triton/"):]).exists()):
            raise ServingEnvironmentError(f"{path}: has {member}, which this Triton lacks: a different build of "
                                          "Triton; warm with the serving Triton installed")


def _python_of_tags(tags: list[str], local: dict) -> dict:
    for tag in tags:
        found = re.match(r"cp(\d)(\d+)-(\w+)-", tag)
        if found:
            major, minor, abi = found.groups()
            suffix = re.sub(r"cpython-\d+", f"cpython-{major}{minor}", local.get("ext_suffix") or "")
            return {"version": f"{major}.{minor}", "implementation": "cpython", "abi": abi,
                    "ext_suffix": suffix if abi != "abi3" else None}
    return {"version": "?", "implementation": "?", "ext_suffix": None}


def _serving_key_string(libtriton_sha256: str) -> str:
    """This Triton's key with libtriton's digest replaced: what a Triton with that libtriton computes."""
    key = env_module.local_triton_key()
    version = env_module.triton_version()
    local_lib = env_module.triton_key_parts()["libtriton_sha256"]
    digests = key[len(version):].split("-")
    if digests.count(local_lib) != 1:
        raise ServingEnvironmentError("this Triton's key does not hold its libtriton's digest once: cannot warm "
                                      "for another libtriton")
    return version + "-".join(libtriton_sha256 if d == local_lib else d for d in digests)


def serving_key(fp: dict, source: str = "the fingerprint") -> str:
    """The ``triton_key()`` string of the environment ``fp`` describes; refused unless only libtriton differs."""
    local = env_module.triton_key_parts()
    served = fp["triton"]
    if served["version"] != local["version"]:
        raise ServingEnvironmentError(f"{source}: Triton {served['version']}, this Triton is {local['version']}: "
                                      f"warm with Triton {served['version']} installed (only libtriton may differ)")
    if served["sources_sha256"] != local["sources_sha256"]:
        changed = env_module.first_differing_source(fp, {"triton_sources": dict(env_module.hashed_sources())})
        raise ServingEnvironmentError(f"{source}: Triton {served['version']}'s hashed Python sources differ from "
                                      f"this Triton's ({changed + ' first; ' if changed else ''}a patched or source "
                                      "build): warm with the serving Triton installed (only libtriton may differ)")
    key = _serving_key_string(served["libtriton_sha256"])
    if hashlib.sha256(key.encode()).hexdigest() != served["key_sha256"]:
        raise ServingEnvironmentError(f"{source}: triton.key_sha256 is not the key of this Triton with libtriton "
                                      f"{served['libtriton_sha256'][:12]}…: the fingerprint was edited or is damaged")
    return key


def check_backends(fp: dict, targets, source: str = "the fingerprint") -> dict[int, str]:
    """A target whose backend (ptxas / linker) differs would get other binaries under other keys; except
    the same ptxas built for another machine architecture (an aarch64 server): its output is the same
    binary, and only its ``--version`` text, which the key hashes, differs. Returns that text per arch."""
    local, foreign = env_module.backend_hashes(), {}
    for target in targets:
        served = fp.get("backends", {}).get(target)
        if served is not None and env_module.same_ptxas_elsewhere(served, local.get(target, "")):
            foreign[int(env_module.ptxas_build(served)["arch"])] = served.rsplit("-", 1)[0]
        elif served is not None and served != local.get(target):
            raise ServingEnvironmentError(
                f"{source}: {target}'s compiler backend is {env_module.backend_name(served)}, this one's is "
                f"{env_module.backend_name(local.get(target, '?'))}: warm with the serving backend (same "
                "TRITON_PTXAS_PATH)")
    return foreign


@contextlib.contextmanager
def _ptxas_version_of(texts: dict[int, str]):
    """Inside the block Triton's CUDA backend hashes the serving ptxas's ``--version`` text for these
    arches (``get_ptxas_version``, which only its ``hash()`` reads), while this machine's ptxas compiles.
    ``hash()`` is memoized per backend, and a JIT function keeps its backend per device: forgotten on
    the way in and out, so no key of either side outlives the block."""
    if not texts:
        yield
        return
    from triton.backends.nvidia import compiler as nvidia

    global _ptxas_texts
    original = nvidia.get_ptxas_version
    nvidia.get_ptxas_version = lambda arch=80: texts[arch] if arch in texts else original(arch)
    nvidia.CUDABackend.hash.cache_clear()
    _ptxas_texts = tuple(sorted(texts.items()))
    try:
        yield
    finally:
        _ptxas_texts = ()
        nvidia.get_ptxas_version = original
        nvidia.CUDABackend.hash.cache_clear()


@contextlib.contextmanager
def serving_environment(fp: dict, *, targets=(), source: str = "the fingerprint", warmed_from: str | None = None):
    """Inside the block this process keys (traces, compiles, plans, records) as ``fp``'s runtime will."""
    from triton.runtime import cache as triton_cache

    if env_module.original_triton_key() is not None:
        raise RuntimeError("already warming for another environment")
    key = serving_key(fp, source)
    foreign_ptxas = check_backends(fp, targets, source)
    local = env_module.fingerprint()
    recorded = {**fp, "warmed_for": {"source": warmed_from or source, "python": local["python"]["version"],
                                     "libtriton_sha256": local["triton"]["libtriton_sha256"]}}
    names = set(env_module.cache_env_names()) | set(fp.get("env", {}))
    saved_env = {name: os.environ.get(name) for name in names}
    env_module._original_key_fn = triton_cache.triton_key
    try:
        for name in names:
            if name in fp.get("env", {}):
                os.environ[name] = fp["env"][name]
            else:
                os.environ.pop(name, None)
        triton_cache.triton_key = lambda: key
        env_module._serving = recorded
        with _ptxas_version_of(foreign_ptxas):
            yield recorded
    finally:
        env_module._serving = None
        triton_cache.triton_key = env_module._original_key_fn
        env_module._original_key_fn = None
        for name, value in saved_env.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
