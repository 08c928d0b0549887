"""The plan store: traced plans keyed by everything that can change them, so a no-op warm-up re-traces nothing."""

from __future__ import annotations

import hashlib
import json
from functools import cache
from pathlib import Path

from .env import cache_env, current_triton_key_sha256, triton_version
from .layout import write_json_atomic

TRACED_SUFFIXES = (".py", ".json")  # code, and the data launch specs read (tile tables, tuned configs)
_NOT_READ_BY_LAUNCHERS = ("tests", "bench", "__pycache__")


def code_fingerprint() -> str:
    """sha256 over tritonwarm's own code and data: any change to a launcher, a kernel, the engine or
    a tile table invalidates plans."""
    return tree_fingerprint(str(Path(__file__).resolve().parents[2]))


def traced_files(root: Path) -> list[Path]:
    """Every ``.py`` and ``.json`` file under ``root`` (a package's folder, or one module's file),
    tests, benchmarks and hidden folders left out: what a launch spec may read beyond its own
    module (helpers of its package, a tile table beside it)."""
    if root.is_file():
        return [root]
    return sorted(path for path in root.rglob("*") if path.suffix in TRACED_SUFFIXES and path.is_file() and not any(
        part in _NOT_READ_BY_LAUNCHERS or part.startswith(".") or part.endswith(".egg-info")
        for part in path.relative_to(root).parts[:-1]))


@cache
def tree_fingerprint(root: str) -> str:
    """sha256 over ``traced_files(root)``, names and contents: a plan traced from them is only as
    good as they are unchanged (once per process: the code it runs is the code it imported)."""
    top = Path(root)
    h = hashlib.sha256()
    for path in traced_files(top):
        h.update(str(path.relative_to(top) if path != top else path.name).encode())
        h.update(path.read_bytes())
    return h.hexdigest()


def launcher_fingerprint(launcher) -> str:
    """``tree_fingerprint`` of the top-level package a launcher is defined in (of its own file where it
    is in no package; empty where it has none, like code typed into an interpreter)."""
    import inspect

    found = package_fingerprint(str(getattr(launcher, "__module__", "")))
    if found:
        return found
    try:
        source = inspect.getsourcefile(launcher) or ""
    except TypeError:  # no Python source (a builtin, a partial): nothing to read
        source = ""
    return tree_fingerprint(str(Path(source).resolve())) if source and Path(source).is_file() else ""


def package_fingerprint(module_name: str) -> str:
    """``tree_fingerprint`` of the top-level package ``module_name`` is in (of its own file where it is
    in no package, or of a program's script named by its path), found without running it; empty where
    it has no file."""
    import sys

    if module_name.endswith(".py") and Path(module_name).is_file():  # a program's main script
        return tree_fingerprint(str(Path(module_name).resolve()))
    root = module_name.split(".")[0]
    top = sys.modules.get(root) or _unexecuted(root)  # a capture: all launcher is imported only when traced
    file = getattr(top, "__file__", None)
    if file and Path(file).name == "__init__.py":
        return tree_fingerprint(str(Path(file).resolve().parent))
    folders = list(getattr(top, "__path__", []) or [])  # a namespace package: each of its folders
    if folders:
        return hashlib.sha256("".join(tree_fingerprint(str(Path(f).resolve())) for f in folders).encode()).hexdigest()
    return tree_fingerprint(str(Path(file).resolve())) if file and Path(file).is_file() else ""


def _unexecuted(name: str):
    """Where the package ``name`` lives, found without running it: ``__file__`` and ``__path__``."""
    import importlib.util
    from types import SimpleNamespace

    try:
        found = importlib.util.find_spec(name) if name else None
    except (ImportError, ValueError):
        return None
    if found is None:
        return None
    return SimpleNamespace(__file__=found.origin if found.has_location else None,
                           __path__=list(found.submodule_search_locations or []))


class PlanStore:
    """Traced plans keyed by everything that can change them, so a no-op warm-up re-traces nothing.

    The key covers the spec file, tritonwarm's code and data, the code and data of the launcher's
    package (``tree_fingerprint``), Triton and its environment, the target. Kernels may live elsewhere
    (another module, another package): each stored plan also records Triton's source key of every
    kernel it traced (``JITFunction.cache_key``, which covers the kernel's ``@triton.jit``
    dependencies; for a kernel of another package, the fingerprint of that package's files, read
    without importing it), and the planner re-traces when one changed. A stored plan carries a digest of
    itself, so a file altered by hand is not trusted.
    """

    FORMAT = 2

    def __init__(self, cache_dir: Path):
        self.dir = Path(cache_dir) / "tritonwarm" / "plans"

    def key(self, spec, target, verify_collapse: bool) -> str:
        parts = [
            self.FORMAT, spec.source_sha256, spec.index, code_fingerprint(), launcher_fingerprint(spec.launcher),
            triton_version(), current_triton_key_sha256(), cache_env(), target.name, verify_collapse,
        ]
        return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:32]

    def engine_key(self, config_repr: str, target) -> str:
        """An engine config's plan: the config (its repr), tritonwarm's code (the engine included),
        Triton's version and cache-invalidating environment, the target."""
        parts = [self.FORMAT, "engine", config_repr, code_fingerprint(), triton_version(), cache_env(), target.name]
        return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:32]

    def load(self, key: str) -> tuple[dict, dict[str, str]] | None:
        """``(plan JSON, kernel source keys)`` as saved under ``key``, or None: absent, unreadable,
        of another format or altered since it was written (the caller traces again)."""
        try:
            data = json.loads((self.dir / f"{key}.json").read_text())
            if data["format"] != self.FORMAT or data["key"] != key or data["digest"] != _digest(data):
                return None
            return data["plan"], data["kernels"]
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def save(self, key: str, plan_json: dict, kernels: dict[str, str]) -> None:
        """Remember a traced plan and the source key of each kernel it traced (see ``plan.py``)."""
        data = {"format": self.FORMAT, "key": key, "kernels": kernels, "plan": plan_json}
        data["digest"] = _digest(data)
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            write_json_atomic(self.dir / f"{key}.json", data)
        except OSError:
            pass  # a read-only cache still serves; it just cannot remember plans


def _digest(data: dict) -> str:
    body = {k: data[k] for k in ("format", "key", "kernels", "plan")}
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()
