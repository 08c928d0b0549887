"""The plan store: traced plans keyed by everything that can change them, so a no-op warm-up re-traces nothing."""

from __future__ import annotations

import hashlib
import json
import os
from functools import lru_cache
from pathlib import Path

from .env import cache_env, current_triton_key_sha256, triton_version
from .layout import file_sha256, write_json_atomic


@lru_cache(maxsize=1)
def code_fingerprint() -> str:
    """sha256 over tritonwarm's own sources: any change to a launcher or kernel invalidates plans."""
    root = Path(__file__).resolve().parents[2]
    h = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        relative = path.relative_to(root)
        if relative.parts[0] in ("tests", "bench") or "__pycache__" in relative.parts:
            continue
        h.update(str(relative).encode())
        h.update(path.read_bytes())
    return h.hexdigest()


class PlanStore:
    """Traced plans keyed by everything that can change them, so a no-op warm-up re-traces nothing.

    The key covers the spec file, tritonwarm's code, the launcher's module, Triton and its
    environment, the target. Kernels may live elsewhere (another module, another package): each
    stored plan also records Triton's source key of every kernel it traced (``JITFunction.cache_key``,
    which covers the kernel's ``@triton.jit`` dependencies), and the planner re-traces when one
    changed. A stored plan carries a digest of itself, so a file altered by hand is not trusted.
    """

    FORMAT = 2

    def __init__(self, cache_dir: Path):
        self.dir = Path(cache_dir) / "tritonwarm" / "plans"

    def key(self, spec, target, verify_collapse: bool) -> str:
        import inspect

        launcher_file = inspect.getsourcefile(spec.launcher) or ""
        parts = [
            self.FORMAT, spec.source_sha256, spec.index, code_fingerprint(),
            file_sha256(launcher_file) if launcher_file and os.path.exists(launcher_file) else "",
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
