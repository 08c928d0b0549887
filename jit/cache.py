"""Where the cache lives, and the manifest tritonwarm keeps beside Triton's own entries.

The compiled binaries are **Triton's own disk-cache entries** (``<dir>/<base32 hash>/...``), so
Triton's runtime finds them with no help once it reads the same directory. Beside them,
``<dir>/tritonwarm/manifest-<target>.json`` records what was warmed and why. Writers serialise
on a file lock and replace the manifest atomically, so concurrent warm-ups never corrupt it; a
warm-up killed at any point leaves either the old or the new manifest, never half of one.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
from functools import lru_cache
from pathlib import Path
from typing import Any

import platformdirs
from filelock import FileLock

MANIFEST_FORMAT = 1
LOCK_TIMEOUT_S = 600


class CacheError(RuntimeError):
    pass


def resolve_cache_dir(explicit: str | os.PathLike | None = None) -> Path:
    """``--cache-dir`` > ``TRITONWARM_CACHE_DIR`` > the user's own ``TRITON_CACHE_DIR`` > platformdirs.

    The user's ``TRITON_CACHE_DIR`` is read, never written: it is what their runtime reads, so it is
    the right place to warm when they set it (vLLM #48806 overwrote it).
    """
    for candidate in (explicit, os.environ.get("TRITONWARM_CACHE_DIR"), os.environ.get("TRITON_CACHE_DIR")):
        if candidate:
            return Path(candidate).expanduser().absolute()
    return Path(platformdirs.user_cache_dir("tritonwarm")) / "triton"


def ensure_writable(cache_dir: Path) -> None:
    """Fail early, in one line, when the cache cannot take new entries (a read-only mount, say).

    Serving from such a cache works: Triton only reads it.
    """
    folder = Path(cache_dir) / "tritonwarm"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(dir=folder, prefix=".probe-")
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise CacheError(f"cannot warm into {cache_dir}: {e.strerror or e} (serving from it still works)") from None


def triton_version() -> str:
    import triton

    return triton.__version__


def cache_env() -> dict[str, str]:
    """The cache-invalidating environment variables in force (Triton's own list)."""
    from triton._C.libtriton import get_cache_invalidating_env_vars

    return dict(sorted(get_cache_invalidating_env_vars().items()))


def entry_dir(cache_dir: Path, cache_dir_name: str) -> Path:
    return Path(cache_dir) / cache_dir_name


def entry_files(cache_dir: Path, cache_dir_name: str, kernel_name: str) -> dict[str, str] | None:
    """The files of a complete Triton entry (its ``__grp__`` group), or None: the runtime's view.

    Mirrors ``FileCacheManager.get_group``: a missing or unreadable group file, or a group naming a
    file that does not exist, reads as a miss.
    """
    group = entry_dir(cache_dir, cache_dir_name) / f"__grp__{kernel_name[:150]}.json"
    try:
        children = json.loads(group.read_text())["child_paths"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not isinstance(children, dict) or not all(os.path.exists(p) for p in children.values()):
        return None
    return children


def file_sha256(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


class Manifest:
    """``manifest-<target>.json``: cache hash → what was warmed (kernel, readable key, rows, ...)."""

    def __init__(self, cache_dir: Path, target: str):
        self.cache_dir = Path(cache_dir)
        self.target = target
        self.dir = self.cache_dir / "tritonwarm"
        self.path = self.dir / f"manifest-{target}.json"

    def read(self) -> dict[str, dict[str, Any]]:
        try:
            data = json.loads(self.path.read_text())
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as e:
            raise CacheError(f"{self.path}: unreadable manifest ({e}); remove it and warm again") from None
        if not isinstance(data, dict) or data.get("format") != MANIFEST_FORMAT:
            raise CacheError(f"{self.path}: not a tritonwarm manifest of format {MANIFEST_FORMAT}")
        return data.get("variants", {})

    @contextlib.contextmanager
    def _locked(self):
        self.dir.mkdir(parents=True, exist_ok=True)
        with FileLock(str(self.dir / f"manifest-{self.target}.lock"), timeout=LOCK_TIMEOUT_S):
            yield

    def update(self, entries: dict[str, dict[str, Any]] | None = None, remove: list[str] = ()) -> None:
        """Merge ``entries`` (and drop ``remove``) under the lock, then replace the file atomically.

        Merging happens against what is on disk *now*, so concurrent writers never lose each
        other's spec rows; a compile time already recorded survives an entry found cached.
        """
        with self._locked():
            variants = self.read()
            for key, entry in (entries or {}).items():
                old = variants.get(key)
                if old is not None:
                    entry = {**entry, "rows": sorted(set(old.get("rows", [])) | set(entry.get("rows", [])))}
                    if entry.get("compile_seconds") is None:
                        entry["compile_seconds"] = old.get("compile_seconds")
                variants[key] = entry
            for key in remove:
                variants.pop(key, None)
            payload = {"format": MANIFEST_FORMAT, "target": self.target, "variants": variants}
            fd, tmp = tempfile.mkstemp(dir=self.dir, prefix=".manifest-", suffix=".tmp")
            try:
                with os.fdopen(fd, "w") as f:
                    json.dump(payload, f, indent=1)
                    f.flush()
                    os.fsync(f.fileno())
                os.replace(tmp, self.path)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
                raise


@contextlib.contextmanager
def variant_lock(cache_dir: Path, cache_hash: str):
    """One compile per key across processes: Triton itself takes no lock (Triton #2688)."""
    locks = Path(cache_dir) / "tritonwarm" / "locks"
    locks.mkdir(parents=True, exist_ok=True)
    with FileLock(str(locks / f"{cache_hash[:32]}.lock"), timeout=LOCK_TIMEOUT_S):
        yield


def manifests(cache_dir: Path) -> dict[str, Manifest]:
    """Every target that has a manifest in ``cache_dir``."""
    folder = Path(cache_dir) / "tritonwarm"
    found = {}
    for path in sorted(folder.glob("manifest-*.json")):
        target = path.stem[len("manifest-"):]
        found[target] = Manifest(cache_dir, target)
    return found


# --------------------------------------------------------------------------- plan store


@lru_cache(maxsize=1)
def code_fingerprint() -> str:
    """sha256 over tritonwarm's own sources: any change to a launcher or kernel invalidates plans."""
    root = Path(__file__).resolve().parent.parent
    h = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        relative = path.relative_to(root)
        if relative.parts[0] in ("tests", "bench") or "__pycache__" in relative.parts:
            continue
        h.update(str(relative).encode())
        h.update(path.read_bytes())
    return h.hexdigest()


class PlanStore:
    """Traced plans keyed by everything that can change them, so a no-op warm-up re-traces nothing."""

    FORMAT = 1

    def __init__(self, cache_dir: Path):
        self.dir = Path(cache_dir) / "tritonwarm" / "plans"

    def key(self, spec, target, verify_collapse: bool) -> str:
        import inspect

        launcher_file = inspect.getsourcefile(spec.launcher) or ""
        parts = [
            self.FORMAT, spec.source_sha256, spec.index, code_fingerprint(),
            file_sha256(launcher_file) if launcher_file and os.path.exists(launcher_file) else "",
            triton_version(), cache_env(), target.name, verify_collapse,
        ]
        return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:32]

    def load(self, key: str, target):
        from .warmup import Plan

        try:
            return Plan.from_json(target, json.loads((self.dir / f"{key}.json").read_text()))
        except (OSError, ValueError, KeyError, TypeError):
            return None  # absent or damaged: trace again

    def save(self, key: str, the_plan) -> None:
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.dir, prefix=".plan-", suffix=".tmp")
            with os.fdopen(fd, "w") as f:
                json.dump(the_plan.to_json(), f)
            os.replace(tmp, self.dir / f"{key}.json")
        except OSError:
            pass  # a read-only cache still serves; it just cannot remember plans
