"""Bundles: a warmed cache as one archive that installs into any folder.

A bundle is a gzip-compressed tar: first ``tritonwarm-bundle.json`` (the environment fingerprint and
the manifest rows, with each file's sha256), then ``<entry dir>/<file>`` for every file of every
entry, all relative to the cache root. Triton's ``__grp__*.json`` holds absolute child paths and its
``get_group`` drops children that do not exist, so a copied cache misses everything; a bundle stores
each group with paths relative to the cache root and ``install`` writes them for the destination.

Reading is one bounded stream: the compressed bytes, the decompressed bytes, each member and the
number of members are all capped while reading, so a decompression bomb stops at the cap; the tar
headers are read by ``tar_stream``, which checks each announced size before reading it. The header's
counts (entries, files) are capped before a member is read, and every row is checked field by field.
Every member must be a regular file at a name the header announces, with the hash it announces, and
each entry's metadata must name its own cache hash; anything else refuses the whole archive before a
single entry is moved into the cache. See docs/security.md.
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import inspect
import io
import json
import os
import re
import shutil
import socket
import tarfile
import tempfile
import zlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from ...errors import clipped
from . import env
from .layout import (
    CacheError,
    entry_files,
    file_mode,
    file_sha256,
    record_serve_at,
    serve_at_of,
    variant_lock,
    write_json_atomic,
)
from .manifest import Manifest, files_match_record, manifests
from .records import metadata_problem, record_problem
from .sources import PlanSources
from .tar_stream import Member, TarFormatError, TarStream

HEADER_NAME = "tritonwarm-bundle.json"
BUNDLE_FORMAT = 1
_TARGET = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]{0,63}")
_BINARY_EXTS = ("cubin", "hsaco")  # with the metadata .json: all Triton's store_binary_only keeps


class BundleError(CacheError):
    """A bundle that cannot be trusted or used: one line naming the archive member or field."""


@dataclass(frozen=True)
class Limits:
    """Caps on what reading a bundle may cost; a bundle over any of them is refused."""

    archive_bytes: int = 8 << 30  # the compressed file
    total_bytes: int = 16 << 30  # decompressed bytes read while streaming (tar headers included)
    member_bytes: int = 1 << 30  # one file
    header_bytes: int = 16 << 20  # the JSON header
    header_commas: int = 600_000  # ... bounds the values parsing it creates (with the next)
    header_containers: int = 250_000  # its '[' and '{'
    extended_header_bytes: int = 64 << 10  # one pax extended header or GNU long name
    json_file_bytes: int = 1 << 20  # an entry's group or metadata, which are parsed
    entries: int = 2_000
    files_per_entry: int = 12
    files: int = 16_000  # every file of every entry (groups not counted)
    members: int = 18_001  # files, a group per entry, the header


@dataclass
class BundleReport:
    path: str
    entries: int = 0
    files: int = 0
    bytes: int = 0  # decompressed file bytes
    archive_bytes: int = 0
    binary_only: bool = False
    targets: dict[str, int] = field(default_factory=dict)
    differences: list[str] = field(default_factory=list)  # fingerprint vs this runtime
    installed: int = 0
    already: int = 0
    set_aside: list[str] = field(default_factory=list)  # install: damaged manifests moved away, then rebuilt
    layout: list = field(default_factory=list, repr=False)  # install: (entry dir, entry name, hash, files)

    def to_json(self) -> dict:
        return {name: value for name, value in self.__dict__.items() if name != "layout"}


# ---------------------------------------------------------------------------------------------- create


def collect(cache_dir: Path, variants_by_target: dict[str, Iterable], *, binary_only: bool = False) -> dict:
    """The header of a bundle holding these variants from ``cache_dir``; each must be warmed and intact.

    Each row is the manifest's row, with ``files`` narrowed to what the bundle carries. A folder
    installed for a server that mounts it elsewhere is read as that server reads it.
    """
    cache_dir = Path(cache_dir)
    served_at = serve_at_of(cache_dir)
    targets: dict[str, dict] = {}
    environments: dict[str, dict] = {}
    for target, variants in variants_by_target.items():
        manifest = Manifest(cache_dir, target)
        recorded = manifest.read()
        known = manifest.environments() if hasattr(manifest, "environments") else {}
        rows = {}
        for variant in sorted(variants, key=lambda v: v.cache_hash):
            what = f"{target} {variant.variant_id} ({variant.kernel.rsplit('.', 1)[-1]})"
            row = recorded.get(variant.cache_hash)
            files = entry_files(cache_dir, variant.entry_dir, variant.entry_name, served_at)
            if files is None or row is None:
                raise BundleError(f"{what}: not warmed in {cache_dir}; run tritonwarm warmup with the same "
                                  "specs, targets and options first")
            if not files_match_record(files, row) or not _inside(files, cache_dir / variant.entry_dir):
                raise BundleError(f"{what}: the cache entry is damaged or not this folder's own; warm again")
            keep = _kept_files(row, binary_only)
            rows[variant.cache_hash] = {**row, "files": {name: row["files"][name] for name in keep}}
        targets[target] = rows
        named = {row.get("environment") for row in rows.values()}
        environments[target] = {k: v for k, v in sorted(known.items()) if k in named}
    return {"format": BUNDLE_FORMAT, "binary_only": binary_only, "fingerprint": _warmed_for(environments),
            "targets": targets, "environments": environments}


def _warmed_for(environments: dict[str, dict]) -> dict:
    """The environment the entries were keyed for: the one the manifest records for them (a warm-up
    for another serving Python records that one), else this process's."""
    recorded = {json.dumps(fp, sort_keys=True) for table in environments.values() for fp in table.values()}
    if len(recorded) == 1:
        return json.loads(recorded.pop())
    return getattr(env, "current_fingerprint", env.fingerprint)()


def _kept_files(row: dict, binary_only: bool) -> list[str]:
    names = sorted(row["files"])
    if not binary_only:
        return names
    metadata = _metadata_name(row["entry_name"])
    return [n for n in names if n == metadata or n.rsplit(".", 1)[-1] in _BINARY_EXTS]


def _inside(files: dict[str, str], folder: Path) -> bool:
    return all(Path(path) == folder / name for name, path in files.items())


def create(out: Path, cache_dir: Path, variants_by_target: dict[str, Iterable], *,
           binary_only: bool = False) -> BundleReport:
    """Write a bundle of these variants from ``cache_dir`` to ``out`` (atomically)."""
    header = collect(cache_dir, variants_by_target, binary_only=binary_only)
    write(out, header, lambda entry_dir, name: Path(cache_dir) / entry_dir / name)
    return summary(out, header)


def write(out: Path, header: dict, source: Callable[[str, str], Path]) -> None:
    """Write ``header`` and every file it names (read from ``source(entry_dir, name)``), byte-reproducibly.

    The same header and files give the same bytes (no times, owners or file names recorded), so a
    bundle's sha256 names its content.
    """
    out = Path(out)
    data = json.dumps(_canonical(header), indent=1).encode()
    _refuse_what_readers_refuse(out, data, header, Limits())
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=out.parent, prefix=f".{out.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as raw, \
                gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0, compresslevel=6) as gz, \
                tarfile.open(fileobj=gz, mode="w|", format=tarfile.PAX_FORMAT) as tar:
            _add_bytes(tar, HEADER_NAME, data)
            for entry_dir, entry_name, names in _entries(header):
                for name in names:
                    path = source(entry_dir, name)
                    with open(path, "rb") as f:
                        info = _tarinfo(f"{entry_dir}/{name}", os.fstat(f.fileno()).st_size)
                        tar.addfile(info, f)
                group = {"child_paths": {name: f"{entry_dir}/{name}" for name in names}}
                _add_bytes(tar, f"{entry_dir}/{_group_name(entry_name)}", json.dumps(group, sort_keys=True).encode())
        os.chmod(tmp, file_mode())  # readable as a plain file would be, not mkstemp's 0600
        os.replace(tmp, out)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _entries_and_files(header: dict) -> tuple[int, int]:
    """The entries a header's targets hold, and their files (a row that is no table counts none)."""
    rows = [row for rows in header["targets"].values() for row in rows.values()]
    return len(rows), sum(len(row["files"]) for row in rows
                          if isinstance(row, dict) and isinstance(row.get("files"), dict))


def _refuse_what_readers_refuse(out: Path, data: bytes, header: dict, limits: Limits) -> None:
    """A bundle over a cap that ``verify`` and ``install`` hold it to is not written: one line with the
    count, the cap and how many bundles the same variants fit in (``--shard I/N``), before any byte."""
    entries, files = _entries_and_files(header)
    counts = [("entries", entries, limits.entries), ("files", files, limits.files),
              (f"bytes of {HEADER_NAME}", len(data), limits.header_bytes),
              (f"commas in {HEADER_NAME}", data.count(b","), limits.header_commas),
              (f"brackets in {HEADER_NAME}", data.count(b"[") + data.count(b"{"), limits.header_containers)]
    over = [(what, count, cap) for what, count, cap in counts if count > cap]
    if over:
        what, count, cap = over[0]
        parts = max(-(-count * 5 // (cap * 4)) for _, count, cap in over)  # shards differ in size: 25 % spare
        raise BundleError(f"{out}: {count} {what}, over the {cap} that `bundle verify` and `bundle install` "
                          f"accept: make {parts} bundles of these variants instead, one per "
                          f"`bundle create ... --shard I/{parts}` (I = 1..{parts}), and install each")


_IN_ORDER = ("args",)  # tables whose order is the kernel's signature: kept, not sorted


def _canonical(value, key: str | None = None):
    """``value`` with every table's keys sorted (the same header gives the same bytes, whatever order
    a manifest holds its rows in), except an entry's ``args``, which keep the order of the kernel's
    signature: an installed variant lists its arguments as the build machine did."""
    if isinstance(value, dict):
        items = value.items() if key in _IN_ORDER else sorted(value.items())
        return {k: _canonical(v, k) for k, v in items}
    if isinstance(value, list):
        return [_canonical(v) for v in value]
    return value


def _tarinfo(name: str, size: int) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = size, 0o644, 0
    return info


def _add_bytes(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    tar.addfile(_tarinfo(name, len(data)), io.BytesIO(data))


def _group_name(entry_name: str) -> str:
    return f"__grp__{entry_name[:150]}.json"  # Triton: "__grp__" + the metadata file's name


def _entries(header: dict):
    """``(entry_dir, entry_name, file names)`` of every entry, sorted, each once."""
    seen = {}
    for rows in header["targets"].values():
        for row in rows.values():
            seen[row["entry_dir"]] = (row["entry_name"], sorted(row["files"]))
    for entry_dir in sorted(seen):
        yield entry_dir, *seen[entry_dir]


def summary(path: Path, header: dict) -> BundleReport:
    entries = list(_entries(header))
    return BundleReport(str(path), entries=len(entries), files=sum(len(n) for _, _, n in entries),
                        archive_bytes=os.path.getsize(path), binary_only=bool(header["binary_only"]),
                        targets={t: len(rows) for t, rows in sorted(header["targets"].items())})


# ------------------------------------------------------------------------------------------------ read


class _Capped(io.RawIOBase):
    """A reader that refuses to go past ``limit`` bytes: what bounds a decompression bomb."""

    def __init__(self, inner, limit: int, what: str):
        self.inner, self.limit, self.what, self.count = inner, limit, what, 0

    def readable(self) -> bool:
        return True

    def read(self, size: int = -1) -> bytes:
        if size is None or size < 0 or size > self.limit - self.count + 1:
            size = self.limit - self.count + 1
        data = self.inner.read(size)
        self.count += len(data)
        if self.count > self.limit:
            raise BundleError(f"{self.what} is over the limit of {self.limit} bytes")
        return data

    def readinto(self, buffer) -> int:
        data = self.read(len(buffer))
        buffer[:len(data)] = data
        return len(data)


def read_header(path: Path, limits: Limits = Limits()) -> dict:
    """Only the header (the first member): rows, fingerprint; no file is read."""
    with open_archive(path, limits) as tar:
        return _read_header(tar, path, limits)


@contextlib.contextmanager
def open_archive(path: Path, limits: Limits, what: str | None = None, kind: str = "tritonwarm bundle"):
    """The members of a gzip tar (a bundle, or an image's layer) as one bounded ``TarStream``: the file,
    the decompressed bytes and every tar header capped before they are read. ``what`` names the
    archive in messages (default: its path); ``kind`` says what it should have been."""
    path = Path(path)
    what = str(path) if what is None else what
    try:
        size = os.path.getsize(path)
    except OSError as e:
        raise BundleError(f"{what}: {e.strerror or e}") from None
    if size > limits.archive_bytes:
        raise BundleError(f"{what}: the archive ({size} bytes) is over the limit of {limits.archive_bytes} bytes")
    with open(path, "rb") as raw:
        compressed = _Capped(raw, limits.archive_bytes, f"{what}: the archive")
        gz = gzip.GzipFile(fileobj=compressed, mode="rb")
        plain = _Capped(gz, limits.total_bytes, f"{what}: the decompressed archive (a decompression bomb?)")
        try:
            yield TarStream(plain, limits.extended_header_bytes)
        except BundleError:
            raise
        except (TarFormatError, OSError, EOFError, zlib.error) as e:
            raise BundleError(f"{what}: not a readable {kind} ({type(e).__name__}: {clipped(e)})") from None


def _read_header(tar: TarStream, path: Path, limits: Limits) -> dict:
    first = tar.next()
    if first is None or first.name != HEADER_NAME:
        raise BundleError(f"{path}: the first member is {_member(first.name) if first else 'missing'}, "
                          f"not {HEADER_NAME}: not a tritonwarm bundle")
    check_member(first, path, limits.header_bytes)
    data = tar.read()
    for what, count, cap in (("brackets ('[' and '{')", data.count(b"[") + data.count(b"{"), limits.header_containers),
                             ("commas", data.count(b","), limits.header_commas)):
        if count > cap:  # parsed, each is a Python object: 16 MiB of "[]," would take 400 MiB
            raise BundleError(f"{path}: {HEADER_NAME} holds {count} {what}, over the limit of {cap} "
                              "(far more than a real header)")
    try:
        header = json.loads(data)
    except (ValueError, RecursionError) as e:
        raise BundleError(f"{path}: {HEADER_NAME}: not JSON ({clipped(e)})") from None
    _check_header(header, path, limits)
    return header


def _member(name: str) -> str:
    """A member's name for a message: escaped and cut short (an archive chooses it)."""
    return clipped(repr(name), 120)


def check_member(member: Member, where, max_bytes: int) -> None:
    """What every member of an archive tritonwarm reads must be: a regular file, at a relative name
    that stays inside, of at most ``max_bytes``. Where it belongs is the caller's to check."""
    name = member.name
    if name.startswith("/"):
        raise BundleError(f"{where}: member {_member(name)} is an absolute path; refused")
    if ".." in name.replace("\\", "/").split("/"):
        raise BundleError(f"{where}: member {_member(name)} climbs out with '..'; refused")
    if not member.isreg():
        raise BundleError(f"{where}: member {_member(name)} is {member.kind}, not a regular file; refused")
    if member.size > max_bytes:
        raise BundleError(f"{where}: member {_member(name)} ({member.size} bytes) is over the limit of "
                          f"{max_bytes} bytes")


def _check_header(header, path: Path, limits: Limits) -> None:
    """Every name the header gives becomes a path: each must be a plain name of the expected shape.
    Every row lands in the destination's manifest, which every later command reads: each field is
    checked, type by type, here, before a byte is written."""
    def bad(where: str, why: str):
        raise BundleError(f"{path}: {HEADER_NAME}: {clipped(where, 120)}: {clipped(why)}")

    if not isinstance(header, dict) or header.get("format") != BUNDLE_FORMAT:
        bad("format", f"not a tritonwarm bundle of format {BUNDLE_FORMAT}")
    if not isinstance(header.get("fingerprint"), dict) or not isinstance(header.get("targets"), dict):
        bad("fingerprint/targets", "missing")
    for target, rows in header["targets"].items():
        if not isinstance(target, str) or not _TARGET.fullmatch(target):
            bad(f"targets.{target!r}", "not a target name")
        if not isinstance(rows, dict):
            bad(f"targets.{target}", "not a table of rows")
    entries, files = _entries_and_files(header)
    if entries > limits.entries:
        bad("targets", f"{entries} entries, over the limit of {limits.entries} (far more than a real cache holds)")
    if files > limits.files:
        bad("targets", f"{files} files, over the limit of {limits.files} (far more than a real cache holds)")
    if not isinstance(header.setdefault("binary_only", False), bool):
        bad("binary_only", f"{header['binary_only']!r} is not true or false")
    environments = header.setdefault("environments", {})
    if not isinstance(environments, dict) or not all(
            t in header["targets"] and isinstance(table, dict) and all(isinstance(fp, dict) for fp in table.values())
            for t, table in environments.items()):
        bad("environments", "not a table of fingerprints per target")
    dirs: dict[str, tuple] = {}
    for target, rows in header["targets"].items():
        for cache_hash, row in rows.items():
            problem = record_problem(cache_hash, row, target, files_required=True, complete=True)  # with files
            if problem:
                bad(f"targets.{target}.{problem[0]}", problem[1])
            where = f"targets.{target}.{cache_hash[:16]}"
            if len(row["files"]) > limits.files_per_entry:
                bad(f"{where}.files", f"{len(row['files'])} files, over the limit of {limits.files_per_entry} "
                                      "(a Triton entry has under 10)")
            if _metadata_name(row["entry_name"]) not in row["files"]:
                bad(f"{where}.files", f"no {_metadata_name(row['entry_name'])!r}: Triton's metadata of the entry")
            named = row.get("environment")  # the environment it was warmed under, which the header carries
            if named is not None and named not in environments.get(target, {}):
                bad(f"{where}.environment", f"{named!r} is not in environments.{target}")
            entry_dir, entry_name, files = row["entry_dir"], row["entry_name"], row["files"]
            if dirs.setdefault(entry_dir, (entry_name, files)) != (entry_name, files):
                bad(where, "the same entry appears twice with different files")


def _stream_files(path: Path, limits: Limits, sink: Callable[[str, str, Iterable[bytes]], None]):
    """Read the whole bundle once, checking everything; ``sink(entry_dir, name, chunks)`` gets each file.

    Returns ``(header, decompressed file bytes)``. Group files are checked here and not passed on:
    the destination's groups are written from the header. Each entry's metadata (Triton's
    ``<kernel>.json``) must name the cache hash its row is filed under.
    """
    with open_archive(path, limits) as tar:
        header = _read_header(tar, path, limits)
        expected, index, metadata = {}, _by_entry(header), {}
        for entry_dir, entry_name, names in _entries(header):
            digests = index[entry_dir][1]["files"]
            for name in names:
                expected[f"{entry_dir}/{name}"] = digests[name]
            expected[f"{entry_dir}/{_group_name(entry_name)}"] = None
            metadata[f"{entry_dir}/{_metadata_name(entry_name)}"] = entry_dir
        seen: set[str] = set()
        total, count = 0, 1
        while (member := tar.next()) is not None:
            count += 1
            if count > limits.members:
                raise BundleError(f"{path}: more than {limits.members} members")
            name = member.name
            check_member(member, path, limits.member_bytes)
            if name not in expected:
                raise BundleError(f"{path}: member {_member(name)} is outside the expected layout "
                                  "(<entry folder>/<file> of an entry the header lists); refused")
            if name in seen:
                raise BundleError(f"{path}: member {_member(name)} appears twice")
            seen.add(name)
            entry_dir, file_name = name.split("/")
            if (expected[name] is None or name in metadata) and member.size > limits.json_file_bytes:
                raise BundleError(f"{path}: member {_member(name)} ({member.size} bytes) is over the limit of "
                                  f"{limits.json_file_bytes} bytes for an entry's group or metadata")
            if expected[name] is None:
                _check_group(tar.read(), entry_dir, index[entry_dir][1]["files"], path, name)
                continue
            digest = hashlib.sha256()
            kept = [] if name in metadata else None  # the metadata is parsed too: which hash it names

            def chunks(digest=digest, kept=kept):
                for chunk in iter(lambda: tar.read(1 << 20), b""):
                    digest.update(chunk)
                    if kept is not None:
                        kept.append(chunk)
                    yield chunk

            sink(entry_dir, file_name, chunks())
            for _ in chunks():  # whatever the sink left unread still counts and is hashed
                pass
            if digest.hexdigest() != expected[name]:
                raise BundleError(f"{path}: member {_member(name)}: sha256 {digest.hexdigest()[:16]}… differs from "
                                  f"the recorded {expected[name][:16]}…; the bundle is damaged or was altered")
            if kept is not None:
                problem = metadata_problem(b"".join(kept), metadata[name])
                if problem:
                    raise BundleError(f"{path}: member {_member(name)}: {problem}; refused")
            total += member.size
        missing = sorted(set(expected) - seen)
        if missing:
            raise BundleError(f"{path}: member {_member(missing[0])} is missing ({len(missing)} missing in all)")
    return header, total


def _metadata_name(entry_name: str) -> str:
    return f"{entry_name[:150]}.json"  # Triton: the kernel's name, cut as the compiler cuts it


def _by_entry(header: dict) -> dict[str, tuple[str, dict]]:
    """Entry folder → (cache hash, row)."""
    return {row["entry_dir"]: (h, row) for rows in header["targets"].values() for h, row in rows.items()}


def _check_group(data: bytes, entry_dir: str, files: dict, path: Path, name: str) -> None:
    try:
        children = json.loads(data)["child_paths"]
    except (ValueError, KeyError, TypeError):
        children = None
    if children != {n: f"{entry_dir}/{n}" for n in files}:
        raise BundleError(f"{path}: member {name!r} names other files than the entry holds; refused")


def _differences(header: dict) -> list[str]:
    warmed, here = header["fingerprint"], getattr(env, "current_fingerprint", env.fingerprint)()  # or --for's
    try:
        if "targets" in inspect.signature(env.differences).parameters:  # compare only the bundled targets' backends
            return env.differences(warmed, here, targets=sorted(header["targets"]))
        return env.differences(warmed, here)
    except (KeyError, TypeError, AttributeError):
        return [f"{HEADER_NAME}: the fingerprint is malformed: cannot tell whether this runtime reads its entries"]


def verify(path: Path, limits: Limits = Limits()) -> BundleReport:
    """Read the whole bundle, checking every member and hash; name each way its fingerprint differs."""
    def discard(entry_dir, name, chunks):
        for _ in chunks:
            pass

    header, total = _stream_files(path, limits, discard)
    report = summary(path, header)
    report.bytes = total
    report.differences = _differences(header)
    return report


# --------------------------------------------------------------------------------------------- install


def install(path: Path, cache_dir: Path, limits: Limits = Limits(), *, compare_environment: bool = True,
            durable: bool = True, serve_at: Path | None = None) -> BundleReport:
    """Install a bundle into ``cache_dir``: every entry in place, groups pointing there, manifest merged.

    Everything is extracted and checked in a staging folder inside the destination first (same file
    system), so a refused bundle moves nothing. Each entry then goes into place with one rename under
    its per-key lock (an entry already there and intact is left alone; a damaged one is renamed away
    first), and the manifest is merged last. A kill at any moment leaves entries either absent or
    whole, which Triton reads as a miss or a hit; installing again completes the job. The fingerprint
    is compared last (it hashes Triton's ~0.5 GB library): differences are reported, not refused,
    since the installing Python need not be the serving one. ``durable`` flushes every file to disk
    before it goes into place, so a power loss cannot leave an entry of empty files that Triton would
    load; an image build, whose layer is written out afterwards, can skip it.

    Groups name files here. ``serve_at`` (where the server will mount this folder) only counts an
    entry whose group already names its files there as intact; ``point_groups`` moves them there.
    """
    cache_dir = Path(cache_dir).absolute()
    from .layout import ensure_writable

    ensure_writable(cache_dir)
    _remove_stale_staging(cache_dir)
    staging = Path(tempfile.mkdtemp(dir=cache_dir / "tritonwarm", prefix=_staging_prefix()))
    try:
        def store(entry_dir, name, chunks):
            folder = staging / entry_dir
            folder.mkdir(exist_ok=True)
            with open(folder / name, "wb") as f:
                for chunk in chunks:
                    f.write(chunk)
                if durable:
                    f.flush()
                    os.fsync(f.fileno())

        header, total = _stream_files(path, limits, store)
        report = summary(path, header)
        report.bytes = total
        report.set_aside = _set_aside_damaged_manifests(cache_dir, header["targets"])
        aside = staging / "replaced"
        aside.mkdir()
        index = _by_entry(header)
        for entry_dir, entry_name, names in _entries(header):
            final = cache_dir / entry_dir
            cache_hash, row = index[entry_dir]
            report.layout.append((entry_dir, entry_name, cache_hash, row["files"]))
            with variant_lock(cache_dir, cache_hash):
                if _intact(final, entry_name, row["files"]) or \
                        (serve_at and _intact(final, entry_name, row["files"], Path(serve_at) / entry_dir)):
                    report.already += 1
                    continue
                group = {"child_paths": {name: str(final / name) for name in names}}
                (staging / entry_dir / _group_name(entry_name)).write_text(json.dumps(group))
                if final.exists() or final.is_symlink():
                    os.rename(final, aside / entry_dir)
                os.rename(staging / entry_dir, final)
                report.installed += 1
        if durable and report.installed:
            _fsync_dir(cache_dir)
        for target, rows in header["targets"].items():
            environments = header["environments"].get(target)
            manifest = Manifest(cache_dir, target)
            if environments:  # a manifest that keeps the environments entries were warmed under
                manifest.update(rows, environments=environments)
            else:
                manifest.update(rows)
            manifest.compact()
            PlanSources(cache_dir, target).add(installed=list(rows))  # prune --unplanned keeps them
        if compare_environment:
            report.differences = _differences(header)
        return report
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _set_aside_damaged_manifests(cache_dir: Path, targets) -> list[str]:
    """A damaged manifest of a target the bundle fills is moved to ``<name>.damaged`` before any entry
    moves in, so the merge that ends the install rebuilds it from the entries installed (a warm-up
    with the specs records the others again); one line each, for the caller to print."""
    lines = []
    for target in sorted(targets):
        aside = Manifest(cache_dir, target).set_aside_damaged()
        if aside is not None:
            lines.append(f"{aside.with_suffix('')} was damaged: set aside as {aside.name} and rebuilt from the "
                         "entries this bundle installs (a warm-up with the specs records any others again)")
    return lines


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def serve_from(cache_dir: Path, at: Path | None, *, durable: bool = True) -> int:
    """Make the folder serve at ``at`` (where a server mounts it; None: where it is): the path is
    recorded first (warm-ups here are refused from then on), then the group of every entry its
    manifests record is pointed there, so the whole folder serves at one path. A kill part-way is
    completed by the next install. Returns how many groups were rewritten."""
    cache_dir = Path(cache_dir).absolute()
    if at is None and serve_at_of(cache_dir) is None:
        return 0  # serves where it is, and always did: install wrote its groups for here
    record_serve_at(cache_dir, at, durable=durable)
    return point_groups(cache_dir, recorded_layout(cache_dir), at or cache_dir, durable=durable)


def recorded_layout(cache_dir: Path) -> list[tuple[str, str, str, dict]]:
    """``(entry_dir, entry_name, cache_hash, files)`` of every entry the folder's manifests record."""
    return [(row["entry_dir"], row["entry_name"], cache_hash, row["files"])
            for manifest in manifests(cache_dir).values() for cache_hash, row in manifest.read().items()
            if isinstance(row.get("files"), dict)]


def point_groups(cache_dir: Path, layout: list, at: Path, *, durable: bool = True) -> int:
    """Rewrite the group of each installed entry (``BundleReport.layout``) to name its files under
    ``at``, the path the server mounts ``cache_dir`` at (Triton reads absolute paths there); ``at`` =
    ``cache_dir`` points them back here. Each group is replaced whole, under the entry's lock, so a
    reader sees the old group or the new one. Returns how many were rewritten."""
    cache_dir, at, rewritten = Path(cache_dir).absolute(), Path(at), 0
    for entry_dir, entry_name, cache_hash, digests in layout:
        wanted = {name: str(at / entry_dir / name) for name in sorted(digests)}
        group = cache_dir / entry_dir / _group_name(entry_name)
        with variant_lock(cache_dir, cache_hash):
            if group.parent.is_dir() and _group_children(group) != wanted:  # a pruned entry stays gone
                write_json_atomic(group, {"child_paths": wanted}, durable=durable)
                rewritten += 1
    return rewritten


def _group_children(group: Path) -> dict | None:
    try:
        children = json.loads(group.read_text())["child_paths"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return children if isinstance(children, dict) else None


def _intact(folder: Path, entry_name: str, digests: dict[str, str], named_at: Path | None = None) -> bool:
    """The entry Triton would load from ``folder``: its group names this folder's own files, as recorded.
    With ``named_at``, the group names them there instead (the folder as the server mounts it)."""
    if named_at is None:
        files = entry_files(folder.parent, folder.name, entry_name)
        return files is not None and _inside(files, folder) and files_match_record(files, {"files": digests})
    children = _group_children(folder / _group_name(entry_name))
    return children == {name: str(named_at / name) for name in digests} and \
        files_match_record({name: str(folder / name) for name in digests}, {"files": digests})


def _staging_prefix() -> str:
    return f".install-{socket.gethostname()}-{os.getpid()}-"


def _remove_stale_staging(cache_dir: Path) -> None:
    """Staging folders of installs killed on this host (their process is gone)."""
    host = f".install-{socket.gethostname()}-"
    for folder in (cache_dir / "tritonwarm").glob(f"{host}*"):
        try:
            pid = int(folder.name[len(host):].split("-", 1)[0])
            os.kill(pid, 0)
        except ProcessLookupError:
            shutil.rmtree(folder, ignore_errors=True)
        except (ValueError, PermissionError):
            continue


# ----------------------------------------------------------------------------------------------- merge


def merge(out: Path, paths: list[Path], limits: Limits = Limits()) -> BundleReport:
    """Join bundles (shards of one warm-up) into one; they must share fingerprint and options."""
    if not paths:
        raise BundleError("merge: no bundles given")
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent, prefix=f".{out.name}.merge-") as tmp:
        merged: dict | None = None
        first = None
        sources: dict[str, int] = {}  # entry dir -> the first bundle that holds it
        for index, path in enumerate(paths):
            folder = Path(tmp) / str(index)

            def store(entry_dir, name, chunks, folder=folder):
                (folder / entry_dir).mkdir(parents=True, exist_ok=True)
                with open(folder / entry_dir / name, "wb") as f:
                    for chunk in chunks:
                        f.write(chunk)

            header, _ = _stream_files(path, limits, store)
            if merged is None:
                merged, first = {**header, "targets": {}, "environments": {}}, path
            _check_compatible(merged, header, first, path)
            for target, table in header["environments"].items():
                merged["environments"].setdefault(target, {}).update(table)
            for target, rows in header["targets"].items():
                into = merged["targets"].setdefault(target, {})
                for cache_hash, row in rows.items():
                    into[cache_hash] = _merge_row(into.get(cache_hash), row, path, cache_hash)
                    sources.setdefault(row["entry_dir"], index)
        write(out, merged, lambda entry_dir, name: Path(tmp) / str(sources[entry_dir]) / entry_dir / name)
    return summary(out, merged)


def _check_compatible(merged: dict, header: dict, first: Path, path: Path) -> None:
    try:
        same = env.fingerprint_id(header["fingerprint"]) == env.fingerprint_id(merged["fingerprint"])
    except (KeyError, TypeError, AttributeError):
        raise BundleError(f"{path}: {HEADER_NAME}: fingerprint: malformed") from None
    if not same:
        lines = env.differences(merged["fingerprint"], header["fingerprint"]) or [
            f"{k} differs" for k in sorted(set(header["fingerprint"]) | set(merged["fingerprint"]))
            if header["fingerprint"].get(k) != merged["fingerprint"].get(k)]
        raise BundleError(f"{path}: warmed in another environment than {first}: {'; '.join(lines)}")
    if header["binary_only"] != merged["binary_only"]:
        raise BundleError(f"{path}: binary-only is {header['binary_only']}, {first} has {merged['binary_only']}; "
                          "bundle every shard the same way")


def _merge_row(old: dict | None, new: dict, path: Path, cache_hash: str) -> dict:
    new = dict(new)
    if old is None:
        return new
    if old["files"] != new["files"]:
        raise BundleError(f"{path}: entry {cache_hash[:12]} has other file contents than an earlier bundle's")
    merged = {**old, "rows": sorted(set(old.get("rows", [])) | set(new.get("rows", [])))}
    if merged.get("compile_seconds") is None:
        merged["compile_seconds"] = new.get("compile_seconds")
    return merged


__all__ = ["BUNDLE_FORMAT", "BundleError", "BundleReport", "HEADER_NAME", "Limits", "check_member", "collect", "create",
           "install", "merge", "open_archive", "read_header", "verify", "write", "file_sha256"]
