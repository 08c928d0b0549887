"""The plan store: traced plans keyed by everything that can change them, so a no-op warm-up re-traces nothing."""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from functools import lru_cache
from pathlib import Path

from .env import cache_env, triton_version
from .layout import file_sha256


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

    def load(self, key: str) -> dict | None:
        """The stored plan's JSON, or None when absent or unreadable (the caller traces again)."""
        try:
            data = json.loads((self.dir / f"{key}.json").read_text())
        except (OSError, ValueError):
            return None
        return data if isinstance(data, dict) else None

    def save(self, key: str, the_plan) -> None:
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.dir, prefix=".plan-", suffix=".tmp")
            with os.fdopen(fd, "w") as f:
                json.dump(the_plan.to_json(), f)
            os.replace(tmp, self.dir / f"{key}.json")
        except OSError:
            pass  # a read-only cache still serves; it just cannot remember plans
