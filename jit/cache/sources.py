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
        except FileNotFoundError:
            return {kind: [] for kind in KINDS}
        except (OSError, ValueError) as e:
            raise self._unreadable(str(e)) from None
        if not isinstance(data, dict):
            raise self._unreadable("not a table")
        for kind in KINDS:
            items = data.get(kind, [])
            if not isinstance(items, list) or not all(isinstance(item, str) for item in items):
                raise self._unreadable(f"{kind}: not a list of names")
        return {kind: list(data.get(kind, [])) for kind in KINDS}

    def _unreadable(self, why: str) -> ValueError:
        # prune --unplanned re-plans from this record: a damaged one must stop it, never read as "nothing"
        return ValueError(f"{self.path}: unreadable record of what was warmed ({why}); remove it and warm "
                          "again, or name the specs to keep: prune --unplanned SPEC...")

    def add(self, specs: list[str] = (), engine_configs: list[str] = (), installed: list[str] = ()) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        with FileLock(str(self.lock), timeout=LOCK_TIMEOUT_S):
            known = self.read()
            new = {"specs": specs, "engine_configs": engine_configs, "installed": installed}
            data = {kind: sorted(set(known[kind]) | {str(item) for item in new[kind]}) for kind in KINDS}
            if data != known:
                write_json_atomic(self.path, data, indent=1)
