"""The manifest tritonwarm keeps beside Triton's entries: what was warmed, for which target, and why.

``<dir>/tritonwarm/manifest-<target>.json``: ``variants`` (cache hash → record) and ``environments``
(fingerprint id → the fingerprint entries were warmed under; each record names its ``environment``).
Manifests written before environments were recorded read as having none. Writers serialise on a
file lock and replace the file atomically, so concurrent warm-ups never corrupt it; a warm-up killed
at any point leaves either the old or the new manifest, never half of one.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import Any

from filelock import FileLock

from .layout import LOCK_TIMEOUT_S, CacheError, disk_full, entry_dir_name, file_sha256, write_json_atomic
from .records import SHA256, record_problem

MANIFEST_FORMAT = 1


class ManifestDamaged(CacheError):
    """The manifest exists but is not one: ``check`` reports it, ``warmup`` rebuilds it."""


class Manifest:
    """``manifest-<target>.json``: cache hash → what was warmed (kernel, readable key, rows, ...)."""

    def __init__(self, cache_dir: Path, target: str):
        self.cache_dir = Path(cache_dir)
        self.target = target
        self.dir = self.cache_dir / "tritonwarm"
        self.path = self.dir / f"manifest-{target}.json"

    def read(self) -> dict[str, dict[str, Any]]:
        try:
            text = self.path.read_text()
        except FileNotFoundError:
            return {}
        except OSError as e:
            raise CacheError(f"{self.path}: unreadable manifest: {e.strerror or e}") from None
        try:
            data = json.loads(text)
        except ValueError as e:
            why = "empty" if not text.strip() else f"not JSON ({e})"
            raise ManifestDamaged(f"{self.path}: damaged manifest: {why}; `tritonwarm warmup` rebuilds it") from None
        variants = data.get("variants") if isinstance(data, dict) else None
        if not isinstance(data, dict) or data.get("format") != MANIFEST_FORMAT or not isinstance(variants, dict):
            raise ManifestDamaged(f"{self.path}: damaged manifest: not a tritonwarm manifest of format "
                                  f"{MANIFEST_FORMAT}; `tritonwarm warmup` rebuilds it")
        def damaged(where: str, why: str) -> ManifestDamaged:
            return ManifestDamaged(f"{self.path}: damaged manifest: {where}: {why}; `tritonwarm warmup` rebuilds it")

        if data.get("target", self.target) != self.target:
            raise damaged("target", f"{data['target']!r} in the manifest of {self.target}")
        for cache_hash, entry in variants.items():
            if isinstance(entry, dict) and SHA256.fullmatch(str(cache_hash)):  # written before entry_dir was
                entry.setdefault("entry_dir", entry_dir_name(cache_hash))    # recorded
            problem = record_problem(cache_hash, entry, self.target)
            if problem:
                raise damaged(f"variants.{problem[0]}", problem[1])
        return variants

    def set_aside_damaged(self) -> Path | None:
        """Under the lock, move a damaged manifest to ``<name>.damaged`` (kept for inspection) so that
        it can be rebuilt; a manifest another writer repaired meanwhile is left alone."""
        with self._locked():
            try:
                self.read()
                return None
            except ManifestDamaged:
                aside = self.path.with_name(self.path.name + ".damaged")
                os.replace(self.path, aside)
                return aside

    def environments(self) -> dict[str, dict[str, Any]]:
        """Fingerprint id → the environment (``env.fingerprint()``) entries were warmed under."""
        try:
            data = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return {}
        found = data.get("environments", {}) if isinstance(data, dict) else {}
        return found if isinstance(found, dict) else {}

    @contextlib.contextmanager
    def _locked(self):
        self.dir.mkdir(parents=True, exist_ok=True)
        with FileLock(str(self.dir / f"manifest-{self.target}.lock"), timeout=LOCK_TIMEOUT_S):
            yield

    def update(self, entries: dict[str, dict[str, Any]] | None = None, remove: list[str] = (),
               environments: dict[str, dict[str, Any]] | None = None) -> None:
        """Merge ``entries`` and ``environments`` (and drop ``remove``) under the lock, then replace the
        file atomically.

        Merging happens against what is on disk *now*, so concurrent writers never lose each
        other's spec rows; a compile time already recorded survives an entry found cached. An
        environment no entry names any more is dropped with the last of its entries.
        """
        with self._locked():
            variants = self.read()
            known = {**self.environments(), **(environments or {})}
            for key, entry in (entries or {}).items():
                old = variants.get(key)
                if old is not None:
                    entry = {**entry, "rows": sorted(set(old.get("rows", [])) | set(entry.get("rows", [])))}
                    if entry.get("compile_seconds") is None:
                        entry["compile_seconds"] = old.get("compile_seconds")
                variants[key] = entry
            for key in remove:
                variants.pop(key, None)
            named = {entry.get("environment") for entry in variants.values()}
            payload = {"format": MANIFEST_FORMAT, "target": self.target, "variants": variants,
                       "environments": {k: v for k, v in sorted(known.items()) if k in named}}
            try:
                write_json_atomic(self.path, payload, indent=1, durable=True)
            except OSError as e:
                if disk_full(e):
                    raise CacheError(f"disk full: cannot write {self.path}: no space left on device") from None
                raise CacheError(f"cannot write {self.path}: {e.strerror or e}") from None


def manifests(cache_dir: Path) -> dict[str, Manifest]:
    """Every target that has a manifest in ``cache_dir``."""
    folder = Path(cache_dir) / "tritonwarm"
    found = {}
    for path in sorted(folder.glob("manifest-*.json")):
        target = path.stem[len("manifest-"):]
        found[target] = Manifest(cache_dir, target)
    return found


def files_match_record(files: dict[str, str], recorded: dict | None) -> bool:
    """Files match the content hashes the manifest recorded (when it recorded them)."""
    if not recorded or "files" not in recorded:
        return True
    for name, digest in recorded["files"].items():
        path = files.get(name)
        if path is None:
            return False
        try:
            if file_sha256(path) != digest:
                return False
        except OSError:
            return False
    return True


def entry_fingerprint(entry: dict, environments: dict[str, dict]) -> dict:
    """The environment a record was warmed under: its ``environment`` in the table, or, for a record
    older than the table (or one whose Triton version disagrees with it), what the record itself
    says (Triton's version and the cache-invalidating env)."""
    fp = environments.get(entry.get("environment") or "")
    recorded_version = entry.get("triton_version")
    if isinstance(fp, dict) and recorded_version in (None, fp.get("triton", {}).get("version")):
        return fp
    return {"triton": {"version": recorded_version}, "env": entry.get("env", {})}
