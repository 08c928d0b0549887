"""What planned a cache's entries: the spec files and engine configs each target was warmed from,
and the entries installed from bundles (planned on another machine).

``prune --unplanned`` re-plans exactly these, so it never removes what another plan warmed (an
engine config's variants are planned by no spec file; a bundle's by files this machine lacks).
``<dir>/tritonwarm/sources-<target>.json``, merged under a lock like the manifest.
"""

from __future__ import annotations

import json
from pathlib import Path

from filelock import FileLock

from .layout import LOCK_TIMEOUT_S, write_json_atomic

KINDS = ("specs", "engine_configs", "installed")


class PlanSources:
    def __init__(self, cache_dir: Path, target: str):
        self.dir = Path(cache_dir) / "tritonwarm"
        self.path = self.dir / f"sources-{target}.json"
        self.lock = self.dir / f"sources-{target}.lock"

    def read(self) -> dict[str, list[str]]:
        """``{"specs": [spec file paths], "engine_configs": [presets or config files], "installed": [cache
        hashes installed from bundles]}``."""
        try:
            data = json.loads(self.path.read_text())
            return {kind: [str(item) for item in data.get(kind, [])] for kind in KINDS}
        except FileNotFoundError:
            return {kind: [] for kind in KINDS}
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise ValueError(f"{self.path}: unreadable record of what was warmed ({e}); remove it and warm again, "
                             "or name the specs to keep: prune --unplanned SPEC...") from None

    def add(self, specs: list[str] = (), engine_configs: list[str] = (), installed: list[str] = ()) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        with FileLock(str(self.lock), timeout=LOCK_TIMEOUT_S):
            known = self.read()
            new = {"specs": specs, "engine_configs": engine_configs, "installed": installed}
            data = {kind: sorted(set(known[kind]) | {str(item) for item in new[kind]}) for kind in KINDS}
            if data != known:
                write_json_atomic(self.path, data, indent=1)
