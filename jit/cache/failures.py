"""Variants a warm-up could not compile, kept in the cache so that ``check`` says they failed, and why,
instead of "not warmed". One file per target; a variant's line goes when it compiles."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

from filelock import FileLock

from .layout import LOCK_TIMEOUT_S, write_json_atomic


def _path(cache_dir: Path, target: str) -> Path:
    return Path(cache_dir) / "tritonwarm" / "failed" / f"{target}.json"


def record_compiles(cache_dir: Path, target: str, failed: dict[str, dict], compiled: Iterable[str]) -> None:
    """``failed``: cache hash -> ``{kernel, rows, error}`` of each compile that failed; ``compiled``: the
    hashes the cache now holds, whose earlier failures are forgotten."""
    path, compiled = _path(cache_dir, target), set(compiled)
    if not failed and not path.exists():
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with FileLock(f"{path}.lock", timeout=LOCK_TIMEOUT_S):
            known = {h: f for h, f in failed_compiles(cache_dir, target).items() if h not in compiled}
            write_json_atomic(path, {**known, **failed})
    except OSError:
        pass  # a cache that cannot take this cannot take entries either: the warm-up says so


def failed_compiles(cache_dir: Path, target: str) -> dict[str, dict]:
    """Cache hash -> ``{kernel, rows, error}`` as warm-ups recorded them ({} when none, or unreadable)."""
    try:
        data = json.loads(_path(cache_dir, target).read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict):
        return {}
    return {h: f for h, f in data.items() if isinstance(f, dict) and isinstance(f.get("error"), str)
            and isinstance(f.get("kernel"), str) and isinstance(f.get("rows"), list)}
