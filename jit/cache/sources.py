"""What planned a cache's entries: the spec files and engine configs each target was warmed from.

``prune --unplanned`` re-plans exactly these, so it never removes what another plan warmed (an
engine config's variants are planned by no spec file). ``<dir>/tritonwarm/sources-<target>.json``,
merged under a lock like the manifest.
"""

from __future__ import annotations

import json
from pathlib import Path

from filelock import FileLock

from .layout import LOCK_TIMEOUT_S, write_json_atomic


class PlanSources:
    def __init__(self, cache_dir: Path, target: str):
        self.dir = Path(cache_dir) / "tritonwarm"
        self.path = self.dir / f"sources-{target}.json"
        self.lock = self.dir / f"sources-{target}.lock"

    def read(self) -> dict[str, list[str]]:
        """``{"specs": [spec file paths], "engine_configs": [presets or config file paths]}``."""
        try:
            data = json.loads(self.path.read_text())
            return {"specs": [str(s) for s in data["specs"]], "engine_configs": [str(c) for c in data["engine_configs"]]}
        except FileNotFoundError:
            return {"specs": [], "engine_configs": []}
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise ValueError(f"{self.path}: unreadable record of what was warmed ({e}); remove it and warm again, "
                             "or name the specs to keep: prune --unplanned SPEC...") from None

    def add(self, specs: list[str] = (), engine_configs: list[str] = ()) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        with FileLock(str(self.lock), timeout=LOCK_TIMEOUT_S):
            known = self.read()
            data = {"specs": sorted(set(known["specs"]) | {str(s) for s in specs}),
                    "engine_configs": sorted(set(known["engine_configs"]) | {str(c) for c in engine_configs})}
            if data != known:
                write_json_atomic(self.path, data, indent=1)
