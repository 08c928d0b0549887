"""The manifest tritonwarm keeps beside Triton's entries: what was warmed, for which target, and why.

``<dir>/tritonwarm/manifest-<target>.json``: ``variants`` (cache hash → record) and ``environments``
(fingerprint id → the fingerprint entries were warmed under; each record names its ``environment``).
Manifests written before environments were recorded read as having none.

Recording one variant must cost the same in a manifest of 25,000 as in one of 100, so a writer does
not rewrite that file: it appends one line to ``manifest-<target>.journal`` under the manifest's lock
and fsyncs it. A reader applies the journal's lines to the file, in order. ``compact`` (once at the
end of a warm-up, an install, a prune) folds the journal into a new file, replaced atomically, and
removes the journal. The file carries a ``generation``, and the journal's first line names the
generation it extends: a journal already folded in (a compaction killed before removing it) names an
older one and is ignored. A line is recorded once its newline is on disk; a writer killed mid-line
leaves a torn last line, which readers ignore and the next writer cuts off.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from pathlib import Path
from typing import Any

from filelock import FileLock

from .layout import LOCK_TIMEOUT_S, CacheError, disk_full, entry_dir_name, file_mode, file_sha256, write_json_atomic
from .records import SHA256, record_problem

MANIFEST_FORMAT = 1
JOURNAL_FORMAT = 1
_HEAD_BYTES = 512  # the file's first bytes hold its generation, before any variant
_GENERATION = re.compile(rb'"generation":\s*(\d+)')


class ManifestDamaged(CacheError):
    """The manifest exists but is not one: ``check`` reports it, ``warmup`` rebuilds it."""


class Manifest:
    """``manifest-<target>.json`` and its journal: cache hash → what was warmed (kernel, readable key, rows, ...)."""

    def __init__(self, cache_dir: Path, target: str):
        self.cache_dir = Path(cache_dir)
        self.target = target
        self.dir = self.cache_dir / "tritonwarm"
        self.path = self.dir / f"manifest-{target}.json"
        self.journal = self.dir / f"manifest-{target}.journal"
        self._environments: tuple[tuple, dict] | None = None  # (files' identity, environments) of the last read
        self._journaled: tuple[tuple[int, int], set[str]] = ((-1, -1), set())  # environments this writer appended

    def _damaged(self, where: str, why: str) -> ManifestDamaged:
        return ManifestDamaged(f"{self.path}: damaged manifest: {where}{why}; `tritonwarm warmup` rebuilds it")

    def read(self) -> dict[str, dict[str, Any]]:
        """Every record, the journal applied; a damaged file, journal line or record raises ``ManifestDamaged``."""
        return self._load()[0]

    def environments(self) -> dict[str, dict[str, Any]]:
        """Fingerprint id → the environment (``env.fingerprint()``) entries were warmed under."""
        if self._environments is not None and self._environments[0] == self._identity():
            return self._environments[1]
        try:
            return self._load()[1]
        except CacheError:
            return {}

    def _identity(self) -> tuple:
        """What changes whenever the file or the journal does."""
        def of(path):
            try:
                st = os.stat(path)
            except OSError:
                return None
            return st.st_ino, st.st_size, st.st_mtime_ns
        return of(self.path), of(self.journal)

    def _load(self, data: dict | None = None) -> tuple[dict[str, dict[str, Any]], dict[str, dict[str, Any]], int]:
        """``(variants, environments, generation)``, the journal applied and every record checked;
        ``data``: the file as ``_read_file`` read it under the lock (its tables are changed in place)."""
        identity = self._identity()
        journal = self._read_bytes(self.journal)  # before the file: a journal folded in meanwhile names an
        if data is None:                          # older generation than the file read after it
            data = self._read_file()
        variants, known = data["variants"], data["environments"]
        if b"\n" in journal and self._journal_generation(journal) == data["generation"]:
            self._apply_journal(journal, variants, known)
        for cache_hash, entry in variants.items():
            if isinstance(entry, dict) and SHA256.fullmatch(str(cache_hash)):  # written before entry_dir was
                entry.setdefault("entry_dir", entry_dir_name(cache_hash))    # recorded
            problem = record_problem(cache_hash, entry, self.target)
            if problem:
                raise self._damaged(f"variants.{problem[0]}: ", problem[1])
        named = {entry.get("environment") for entry in variants.values()}
        environments = {k: v for k, v in sorted(known.items()) if k in named}
        self._environments = (identity, environments)
        return variants, environments, data["generation"]

    def _journal_generation(self, head: bytes) -> int:
        """The generation the journal's first line names; a first line that is not a journal's header
        is damage (only a header cut short, with no newline yet, is nothing)."""
        try:
            header = json.loads(head.split(b"\n", 1)[0])
        except ValueError:
            header = None
        generation = header.get("generation") if isinstance(header, dict) else None
        if not isinstance(header, dict) or header.get("journal") != JOURNAL_FORMAT or not isinstance(generation, int):
            raise ManifestDamaged(f"{self.journal}: damaged manifest journal: its first line is not a journal "
                                  f"header of format {JOURNAL_FORMAT}; `tritonwarm warmup` rebuilds it")
        return generation

    def _read_bytes(self, path: Path) -> bytes:
        try:
            return path.read_bytes()
        except FileNotFoundError:
            return b""
        except OSError as e:
            raise CacheError(f"{path}: unreadable manifest: {e.strerror or e}") from None

    def _read_file(self) -> dict[str, Any]:
        """The compacted file: ``variants``, ``environments``, ``generation`` (0 for none yet)."""
        text = self._read_bytes(self.path)
        if not text and not self.path.exists():
            return {"variants": {}, "environments": {}, "generation": 0}
        try:
            data = json.loads(text)
        except ValueError as e:
            why = "empty" if not text.strip() else f"not JSON ({e})"
            raise self._damaged("", why) from None
        variants = data.get("variants") if isinstance(data, dict) else None
        if not isinstance(data, dict) or data.get("format") != MANIFEST_FORMAT or not isinstance(variants, dict):
            raise self._damaged("", f"not a tritonwarm manifest of format {MANIFEST_FORMAT}")
        if data.get("target", self.target) != self.target:
            raise self._damaged("target: ", f"{data['target']!r} in the manifest of {self.target}")
        generation = data.get("generation", 0)
        if not isinstance(generation, int) or isinstance(generation, bool):
            raise self._damaged("generation: ", f"{generation!r:.40} is not an integer")
        known = data.get("environments", {})
        return {"variants": variants, "environments": known if isinstance(known, dict) else {},
                "generation": generation}

    def _apply_journal(self, journal: bytes, variants: dict, known: dict) -> None:
        """Apply each complete line after the header, in order; a torn last line was never recorded."""
        lines = journal.split(b"\n")[1:-1]  # the last piece follows the last newline: torn or empty
        for number, line in enumerate(lines, 2):
            try:
                change = json.loads(line)
                assert isinstance(change, dict)
                _apply(variants, known, change.get("set") or {}, change.get("remove") or [],
                       change.get("environments") or {})
            except (ValueError, AssertionError, TypeError, AttributeError):
                raise ManifestDamaged(f"{self.journal}: damaged manifest journal: line {number} is not a change "
                                      "tritonwarm writes; `tritonwarm warmup` rebuilds it") from None

    def set_aside_damaged(self) -> Path | None:
        """Under the lock, move a damaged manifest to ``<name>.damaged`` (kept for inspection; its
        journal beside it) so that it can be rebuilt; a manifest another writer repaired meanwhile is
        left alone."""
        with self._locked():
            try:
                self.read()
                return None
            except ManifestDamaged:
                aside = self.path.with_name(self.path.name + ".damaged")
                with contextlib.suppress(FileNotFoundError):
                    os.replace(self.journal, self.journal.with_name(self.journal.name + ".damaged"))
                with contextlib.suppress(FileNotFoundError):
                    os.replace(self.path, aside)
                return aside

    @contextlib.contextmanager
    def _locked(self):
        self.dir.mkdir(parents=True, exist_ok=True)
        with FileLock(str(self.dir / f"manifest-{self.target}.lock"), timeout=LOCK_TIMEOUT_S):
            yield

    def update(self, entries: dict[str, dict[str, Any]] | None = None, remove: list[str] = (),
               environments: dict[str, dict[str, Any]] | None = None) -> None:
        """Record ``entries`` and ``environments`` (and drop ``remove``): one line appended to the
        journal under the lock, and fsynced; nothing already recorded is read.

        Readers merge each line with what came before, so concurrent writers never lose each other's
        spec rows, and a compile time already recorded survives an entry found cached. An environment
        no entry names any more is dropped with the last of its entries.
        """
        with self._locked():
            try:
                self._append(entries or {}, list(remove), environments or {})
            except OSError as e:
                if disk_full(e):
                    raise CacheError(f"disk full: cannot write {self.journal}: no space left on device") from None
                raise CacheError(f"cannot write {self.journal}: {e.strerror or e}") from None

    def _append(self, entries: dict, remove: list[str], environments: dict) -> None:
        generation = self._file_generation()
        fd = os.open(self.journal, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), file_mode())
        with os.fdopen(fd, "r+b") as f:
            head = f.read(_HEAD_BYTES)
            size = os.fstat(fd).st_size
            if b"\n" not in head or self._journal_generation(head) != generation:
                f.truncate(0)  # none yet, a torn header, or one the file has folded in already
                f.seek(0)
                f.write(json.dumps({"journal": JOURNAL_FORMAT, "generation": generation}).encode() + b"\n")
                size = f.tell()
            else:
                f.seek(size - 1)
                if f.read(1) != b"\n":
                    size = _end_of_last_line(f, size)  # a writer killed mid-line: that line was never recorded
                    f.truncate(size)
            place = (os.fstat(fd).st_ino, generation)
            if self._journaled[0] != place:
                self._journaled = (place, set())
            new_envs = {k: v for k, v in environments.items() if k not in self._journaled[1]}
            change = {"set": entries, "remove": remove, "environments": new_envs}
            f.seek(size)
            try:
                f.write(json.dumps(change, separators=(",", ":")).encode() + b"\n")
                f.flush()
                os.fsync(fd)
            except BaseException:  # a full disk: what did get written is no record
                with contextlib.suppress(OSError):
                    f.truncate(size)
                raise
            self._journaled[1].update(new_envs)

    def _file_generation(self) -> int:
        """The compacted file's generation, from its first bytes (0: none yet, or one written before
        generations were)."""
        try:
            with open(self.path, "rb") as f:
                head = f.read(_HEAD_BYTES)
        except FileNotFoundError:
            return 0
        found = _GENERATION.search(head.split(b'"variants"')[0])
        return int(found.group(1)) if found else 0

    def compact(self) -> None:
        """Fold the journal into the file (under the lock, atomically replaced and fsynced), then
        remove it: reading stays one file. Nothing to do without a journal; a journal that changes
        nothing (an install or warm-up run again) only goes, so the file keeps its bytes and its
        generation; a damaged manifest is left for ``warmup`` to set aside."""
        with self._locked():
            if not self.journal.exists():
                return
            try:
                data = self._read_file()  # parsed once: what it held is kept, one table a record, to compare
                before = ({key: dict(entry) if isinstance(entry, dict) else entry
                           for key, entry in data["variants"].items()}, dict(data["environments"]))
                variants, environments, generation = self._load(data)
            except ManifestDamaged:
                return
            if before == (variants, environments):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(self.journal)
                return
            payload = {"format": MANIFEST_FORMAT, "target": self.target, "generation": generation + 1,
                       "variants": variants, "environments": environments}
            try:
                write_json_atomic(self.path, payload, indent=1, durable=True)
            except OSError as e:
                if disk_full(e):
                    raise CacheError(f"disk full: cannot write {self.path}: no space left on device") from None
                raise CacheError(f"cannot write {self.path}: {e.strerror or e}") from None
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.journal)


def _apply(variants: dict, known: dict, entries: dict, remove: list, environments: dict) -> None:
    """One journal line: records merged with what is there (rows joined; a compile time kept where
    the new record has none), then removals."""
    known.update(environments)
    for key, entry in entries.items():
        old = variants.get(key)
        if isinstance(old, dict) and isinstance(entry, dict):
            entry = {**entry, "rows": sorted(set(old.get("rows", [])) | set(entry.get("rows", [])))}
            if entry.get("compile_seconds") is None:
                entry["compile_seconds"] = old.get("compile_seconds")
        variants[key] = entry
    for key in remove:
        variants.pop(key, None)


def _end_of_last_line(f, size: int) -> int:
    """Where the last complete line of ``f`` ends (just after its newline), read backwards."""
    end = size
    while end > 0:
        start = max(0, end - 4096)
        f.seek(start)
        chunk = f.read(end - start)
        at = chunk.rfind(b"\n")
        if at >= 0:
            return start + at + 1
        end = start
    return 0
def manifests(cache_dir: Path) -> dict[str, Manifest]:
    """Every target that has a manifest in ``cache_dir``."""
    folder = Path(cache_dir) / "tritonwarm"
    names = {path.stem[len("manifest-"):] for suffix in ("json", "journal")  # a journal not yet folded in
             for path in folder.glob(f"manifest-*.{suffix}")}
    return {target: Manifest(cache_dir, target) for target in sorted(names)}


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
