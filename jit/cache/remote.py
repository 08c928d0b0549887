"""A cache shared by a fleet: Triton's cache entries in Redis, behind Triton's own plug points.

A serving process needs two environment variables and no code change::

    TRITON_CACHE_MANAGER=tritonwarm.jit.cache.remote:RedisCacheManager
    TRITONWARM_REDIS_URL=redis://cache.internal:6379/0

``RedisCacheManager`` is Triton's ``FileCacheManager`` with Redis behind it: a lookup reads the local
cache first; on a miss it fetches the entry from Redis, checks every file's sha256, writes the entry
into the local cache (so later lookups stay on the machine) and hands Triton the local paths. What the
process compiles itself is written locally and pushed.

``RedisBackend`` puts the same store behind Triton's own ``RemoteCacheManager``
(``TRITON_CACHE_MANAGER=triton.runtime.cache:RemoteCacheManager`` plus
``TRITON_REMOTE_CACHE_BACKEND=tritonwarm.jit.cache.remote:RedisBackend``); Triton's manager asks
Redis on every lookup, even for what it wrote locally before. Triton's own ``RedisRemoteCacheBackend``
reads ``knobs.cache.redis``, which does not exist in Triton 3.6 to 3.9.

In Redis, content-addressed::

    tritonwarm:blob:<sha256>             the bytes whose sha256 is in the key
    tritonwarm:file:<entry>:<file name>  the sha256 of that entry's file
    tritonwarm:mac:<entry>:<file name>   with a fleet key: the MAC of a file (a group carries its own)

Redis is not trusted: a group's children must be plain file names of the entry, its metadata must
name the entry's key and its binary the metadata's kernel, else the entry is a miss with one
warning; C modules are never fetched (see docs/security.md). With a fleet key (``fleet_key.py``)
every value pushed carries a MAC binding the entry's key and file name to its sha256 (a group's
MAC is inside it, and binds every child's hash): a reader refuses what does not verify, as forged.

An entry's group file (``__grp__<kernel>.json``) is stored like any other file,
but its JSON names each child's sha256 instead of a path: a group and its children read as one
consistent set wherever the cache is served from, and a value whose bytes do not hash to its key
reads as a miss. Writes are idempotent (the same bytes land on the same keys) and the group goes
last in one transaction, so concurrent pushers lose nothing and a reader never sees a group before
its files.

When Redis cannot be reached, serving goes on with the local cache: one warning per process, another
try at most every ``RETRY_AFTER_S`` seconds, connect and read timeouts of ``TRITONWARM_REDIS_TIMEOUT``
seconds (default 1).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from triton.runtime.cache import RemoteCacheBackend

from ...errors import clipped
from .binary import binary_problem
from .fleet_key import FleetKey, FleetKeyError, fleet_key
from .layout import CacheError, entry_files, file_sha256
from .overlay import OverlayCacheManager
from .records import metadata_problem, plain_file_name

URL_ENV = "TRITONWARM_REDIS_URL"
TIMEOUT_ENV = "TRITONWARM_REDIS_TIMEOUT"
DEFAULT_TIMEOUT_S = 1.0
RETRY_AFTER_S = 30.0
NAMESPACE = "tritonwarm"
GROUP_PREFIX = "__grp__"

log = logging.getLogger(__name__)


class RemoteCacheError(CacheError):
    """A bad Redis URL, or no ``redis`` package."""


class RemoteUnavailable(RemoteCacheError):
    """Redis did not answer (refused, timed out, went away)."""


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def parse_redis_url(url: str) -> dict:
    """``redis://[[user]:password@]HOST[:PORT][/DB]`` (or ``rediss://`` for TLS) as client arguments."""
    shown = shown_url(url)
    try:
        parts = urlsplit(url)
        port = parts.port or 6379
    except ValueError as e:
        why = "the port is not a number from 0 to 65535" if "port" in str(e).lower() else "malformed"
        raise RemoteCacheError(f"bad Redis URL {shown!r}: {why}") from None  # (the error quotes the URL's text)
    if parts.scheme not in ("redis", "rediss") or not parts.hostname:
        raise RemoteCacheError(f"bad Redis URL {shown!r}: expected redis://HOST:PORT[/DB]")
    if parts.query or parts.fragment:
        raise RemoteCacheError(f"bad Redis URL {shown!r}: no query or fragment expected")
    db_text = parts.path.strip("/") or "0"
    if not db_text.isdigit():
        raise RemoteCacheError(f"bad Redis URL {shown!r}: the database after '/' must be a number, "
                               f"got {clipped(db_text, 40)!r}")
    return {"host": parts.hostname, "port": port, "db": int(db_text), "username": parts.username or None,
            "password": parts.password or None, "ssl": parts.scheme == "rediss"}


def shown_url(url: str) -> str:
    """The URL for messages: everything between ``//`` and the last ``@`` but the user name masked,
    whether or not the URL parses (a password may hold ``/``, ``#`` or ``@``), and escaped."""
    scheme, sep, rest = url.partition("://")
    credentials, at, host = rest.rpartition("@")
    if at:
        user, colon, _ = credentials.partition(":")
        rest = f"{user}:***@{host}" if colon else f"***@{host}"
    return clipped(f"{scheme}{sep}{rest}", 200)


def timeout_s() -> float:
    text = os.environ.get(TIMEOUT_ENV, "")
    try:
        value = float(text) if text else DEFAULT_TIMEOUT_S
    except ValueError:
        raise RemoteCacheError(f"{TIMEOUT_ENV}={text!r}: expected seconds, e.g. 1.0") from None
    if not 0 < value <= 60:
        raise RemoteCacheError(f"{TIMEOUT_ENV}={text!r}: expected seconds between 0 and 60")
    return value


_FROM_ENVIRONMENT = object()


class RedisStore:
    """Triton's cache entries on one Redis server. Raises ``RemoteUnavailable`` when it does not answer.
    ``key``: the fleet key (default: the one the environment names; None: unauthenticated)."""

    def __init__(self, url: str, timeout: float | None = None, key: FleetKey | None = _FROM_ENVIRONMENT):
        params = parse_redis_url(url)
        self.key: FleetKey | None = fleet_key() if key is _FROM_ENVIRONMENT else key
        try:
            import redis
            from redis.backoff import NoBackoff
            from redis.retry import Retry
        except ImportError:
            raise RemoteCacheError("a Redis cache needs the redis package: pip install 'tritonwarm[redis]'") from None
        self.url = shown_url(url)
        self._errors = (redis.RedisError, OSError)
        seconds = timeout if timeout is not None else timeout_s()
        self._client = redis.Redis(**params, socket_connect_timeout=seconds, socket_timeout=seconds,
                                   retry=Retry(NoBackoff(), 0), health_check_interval=0)

    def _do(self, fn: Callable):
        try:
            return fn()
        except self._errors as e:
            raise RemoteUnavailable(f"Redis at {self.url}: {' '.join(str(e).split()) or type(e).__name__}") from None

    @staticmethod
    def _file_key(entry: str, name: str) -> str:
        return f"{NAMESPACE}:file:{entry}:{name}"

    @staticmethod
    def _blob_key(digest: str) -> str:
        return f"{NAMESPACE}:blob:{digest}"

    @staticmethod
    def _mac_key(entry: str, name: str) -> str:
        return f"{NAMESPACE}:mac:{entry}:{name}"

    def ping(self) -> None:
        self._do(self._client.ping)

    def read_files(self, entry: str, names: list[str], known: dict[str, str] | None = None) -> dict[str, bytes]:
        """The named files whose bytes match their recorded sha256 (``known`` saves asking for it).
        A name that is no plain file name of the entry, or names a host library, is never asked for."""
        bad = next((n for n in names if not plain_file_name(n) or n.endswith(HOST_CODE)), None)
        if bad is not None:
            if not bad.endswith(HOST_CODE):
                refused(entry, f"{clipped(repr(bad), 80)} is not a plain file name of the entry")
            return {}
        known = known or {}
        ask = [n for n in names if n not in known]
        digests = dict(known)
        if ask:
            signed = [n for n in ask if not n.startswith(GROUP_PREFIX)] if self.key else []  # a group holds its MAC
            keys = [self._file_key(entry, n) for n in ask] + [self._mac_key(entry, n) for n in signed]
            found = self._do(lambda: self._client.mget(keys))
            digests.update(zip(ask, found[:len(ask)], strict=True))
            for name, tag in zip(signed, found[len(ask):], strict=True):
                why = digests.get(name) and self.key.problem(tag, entry, name, _text(digests[name]))
                if why:
                    forged(entry, f"{name}: {why}")
                    digests[name] = None
        wanted = [(n, _text(digests[n])) for n in names if digests.get(n)]
        if not wanted:
            return {}
        blobs = self._do(lambda: self._client.mget([self._blob_key(d) for _, d in wanted]))
        return {n: b for (n, d), b in zip(wanted, blobs, strict=True) if b is not None and sha256(b) == d}

    def entry_state(self, entry: str, group_name: str) -> tuple[str, dict[str, bytes]]:
        """``("ok", files)``, ``("missing", {})``, ``("corrupt", {})`` or, with a fleet key,
        ``("forged", {})`` for one entry's group and children."""
        state, files, _ = self.inspect_entry(entry, group_name)
        return state, files

    def inspect_entry(self, entry: str, group_name: str) -> tuple[str, dict[str, bytes], str | None]:
        """``entry_state`` and, for an entry refused for what it says (not for damage), why: a MAC that
        does not verify with the fleet key, a child name that is no plain file name of the entry,
        metadata naming another cache hash, a binary that is not the metadata's kernel."""
        digest = self._do(lambda: self._client.get(self._file_key(entry, group_name)))
        if digest is None:
            return "missing", {}, None
        digest = _text(digest)
        group = self._do(lambda: self._client.get(self._blob_key(digest)))
        if group is None:
            return "missing", {}, None
        children = _group_hashes(group) if sha256(group) == digest else None
        if children is None:
            return "corrupt", {}, None
        why = self.group_mac_problem(entry, group_name, group, children)
        if why:
            return "forged", {}, why
        why = names_problem(children, group_name)
        if why:
            return "corrupt", {}, why
        names = sorted(children)
        blobs = self._do(lambda: self._client.mget([self._blob_key(children[n]) for n in names])) if names else []
        if any(b is None for b in blobs):
            return "missing", {}, None
        if any(sha256(b) != children[n] for n, b in zip(names, blobs, strict=True)):
            return "corrupt", {}, None
        files = dict(zip(names, blobs, strict=True))
        why = metadata_problem(files[group_name[len(GROUP_PREFIX):]], entry) or \
            binary_problem(files, group_name[len(GROUP_PREFIX):])
        return ("corrupt", {}, why) if why else ("ok", files, None)

    def group_mac_problem(self, entry: str, group_name: str, group: bytes, children: dict[str, str]) -> str | None:
        """Why a group's MAC does not vouch for it (None without a fleet key, or when it does)."""
        if self.key is None:
            return None
        return self.key.problem(_group_mac(group), entry, group_name, sha256(_group_json(children)))

    def read_entry(self, entry: str, group_name: str) -> dict[str, bytes] | None:
        """Every child of the entry, verified, or None: a missing or damaged part is a miss, and an
        entry refused for what it says is a miss with one warning."""
        state, files, why = self.inspect_entry(entry, group_name)
        if why:
            (forged if state == "forged" else refused)(entry, why)
        return files if state == "ok" else None

    def write_files(self, entry: str, files: dict[str, bytes]) -> None:
        """Blobs first, then the names pointing at them (and their MACs), in one transaction."""
        pipe = self._client.pipeline(transaction=True)
        for name, data in files.items():
            digest = sha256(data)
            pipe.set(self._blob_key(digest), data)
            pipe.set(self._file_key(entry, name), digest)
            if self.key is not None and not name.startswith(GROUP_PREFIX):
                pipe.set(self._mac_key(entry, name), self.key.tag(entry, name, digest))
        self._do(pipe.execute)

    def group_json(self, entry: str, group_name: str, hashes: dict[str, str]) -> bytes:
        """An entry's group as stored: its children by hash and, with a fleet key, the MAC over them."""
        if self.key is None:
            return _group_json(hashes)
        return _group_json(hashes, self.key.tag(entry, group_name, sha256(_group_json(hashes))))

    def write_group(self, entry: str, group_name: str, hashes: dict[str, str]) -> None:
        """The group alone: its children are already stored (``write_files``)."""
        self.write_files(entry, {group_name: self.group_json(entry, group_name, hashes)})

    def write_entry(self, entry: str, group_name: str, files: dict[str, bytes]) -> None:
        """A whole entry in one transaction: children, then the group naming them by hash."""
        hashes = {name: sha256(data) for name, data in files.items()}
        self.write_files(entry, {**files, group_name: self.group_json(entry, group_name, hashes)})


HOST_CODE = (".so", ".pyd", ".dll", ".dylib")  # C modules Triton loads into the process: built locally, never fetched
_refused: set[str] = set()
_forged_warned: list[bool] = []


def names_problem(children: dict, group_name: str) -> str | None:
    """Why an entry's group, as fetched, cannot be written into a cache folder: Triton writes each
    child at ``os.path.join(entry folder, name)``, so a name must be a plain file name of the entry
    (no separator, not absolute, no ``..``, not empty), and the group must hold the entry's metadata."""
    for name in children:
        if not plain_file_name(name) or name.startswith(GROUP_PREFIX) or name.endswith(HOST_CODE):
            return f"its group names {clipped(repr(name), 80)}, which is not a plain file name of the entry"
    if group_name[len(GROUP_PREFIX):] not in children:
        return f"its group lacks the entry's metadata {clipped(group_name[len(GROUP_PREFIX):], 80)}"
    return None


def refused(entry: str, why: str) -> None:
    """One warning per entry and process: a refused entry is a miss, which Triton compiles locally."""
    if entry not in _refused:
        _refused.add(entry)
        log.warning("tritonwarm: shared Triton cache entry %s refused, compiling it locally: %s",
                    clipped(entry, 80), why)


def forged(entry: str, why: str) -> None:
    """One warning per process, as for an outage: what does not verify with the fleet key is a miss."""
    if not _forged_warned:
        _forged_warned.append(True)
        log.warning("tritonwarm: shared Triton cache entry %s refused, compiling it locally: %s (entries that do not "
                    "verify with the fleet key are refused without another warning)", clipped(entry, 80), why)


def _text(value: bytes | str) -> str:
    """A stored hash as text; bytes that are not ASCII simply never match a digest."""
    return value.decode("ascii", "replace") if isinstance(value, bytes) else value


def _group_json(hashes: dict[str, str], mac: str | None = None) -> bytes:
    # Named "child_paths" like Triton's own group file, so Triton's RemoteCacheManager can iterate the names.
    return json.dumps({"child_paths": dict(sorted(hashes.items())), **({"mac": mac} if mac else {})},
                      sort_keys=True).encode()


def _group_mac(data: bytes):
    try:
        return json.loads(data).get("mac")
    except (ValueError, AttributeError):
        return None


def _group_hashes(data: bytes) -> dict[str, str] | None:
    try:
        children = json.loads(data)["child_paths"]
    except (ValueError, KeyError, TypeError):
        return None
    if not isinstance(children, dict) or not all(
            isinstance(d, str) and len(d) == 64 and all(c in "0123456789abcdef" for c in d) for d in children.values()):
        return None
    return children


class _FleetCache:
    """The process's one Redis connection for serving: a failure warns once and pauses it, never raises."""

    def __init__(self, url: str):
        self.url = url
        self.store: RedisStore | None = None
        self.paused_until = 0.0
        self.warned = False
        self.lock = threading.Lock()

    def call(self, fn: Callable[[RedisStore], object]):
        """``fn(store)``, or None when Redis is unusable now (then the local cache is all there is)."""
        if time.monotonic() < self.paused_until:
            return None
        try:
            if self.store is None:
                self.store = RedisStore(self.url)
            return fn(self.store)
        except Exception as e:  # serving never fails for the shared cache: it only loses its help
            misconfigured = isinstance(e, (RemoteCacheError, FleetKeyError)) and not isinstance(e, RemoteUnavailable)
            with self.lock:
                self.paused_until = time.monotonic() + (float("inf") if misconfigured else RETRY_AFTER_S)
                if not self.warned:
                    self.warned = True
                    log.warning("tritonwarm: shared Triton cache unusable, serving from the local cache only "
                                "(compiles stay local): %s", e)
            return None


_fleet: dict[tuple[str, int], _FleetCache] = {}


def fleet_cache() -> _FleetCache | None:
    """The shared cache ``TRITONWARM_REDIS_URL`` names, one per process (and per fork), or None."""
    url = os.environ.get(URL_ENV)
    if not url:
        return None
    key = (url, os.getpid())
    found = _fleet.get(key)
    if found is None:
        found = _fleet.setdefault(key, _FleetCache(url))
    return found


class RedisCacheManager(OverlayCacheManager):
    """Local disk first, then Redis (verified, written through to disk); what this process compiles is pushed.
    Local disk is the cache folder, read-only with ``TRITONWARM_OVERLAY_DIR`` set (see ``overlay.py``):
    fetched and compiled entries are then written to the overlay."""

    def __init__(self, key, override=False, dump=False):
        super().__init__(key, override=override, dump=dump)
        self._entry = key
        self._remote = None if (override or dump) else fleet_cache()

    def get_file(self, filename):
        path = super().get_file(filename)
        if path is not None or self._remote is None:
            return path
        found = self._remote.call(lambda store: store.read_files(self._entry, [filename]))
        return super().put(found[filename], filename) if found else None

    def get_group(self, filename):
        local = self.local_group(filename)
        if local is not None or self._remote is None:
            return local
        files = self._remote.call(lambda store: store.read_entry(self._entry, GROUP_PREFIX + filename))
        if files is None:
            return None
        paths = {name: super(RedisCacheManager, self).put(data, name) for name, data in sorted(files.items())}
        super().put_group(filename, paths)
        return paths

    def put(self, data, filename, binary=True):
        path = super().put(data, filename, binary=binary)
        if self._remote is not None and not filename.startswith(GROUP_PREFIX) and not filename.endswith(HOST_CODE):
            payload = data if isinstance(data, bytes) else str(data).encode()
            self._remote.call(lambda store: store.write_files(self._entry, {filename: payload}))
        return path

    def put_group(self, filename, group):
        path = super().put_group(filename, group)
        if self._remote is not None:
            hashes = {name: file_sha256(p) for name, p in group.items()}
            self._remote.call(lambda store: store.write_group(self._entry, GROUP_PREFIX + filename, hashes))
        return path


def serving_reads_the_fleet() -> bool:
    """Whether this process's Triton reads through the shared cache (``TRITON_CACHE_MANAGER`` names
    ``RedisCacheManager`` and ``TRITONWARM_REDIS_URL`` is set): then an entry missing locally is no
    miss until Redis lacks it too."""
    from triton import knobs

    try:
        manager = knobs.cache.manager_class
    except Exception:  # a TRITON_CACHE_MANAGER that does not import: Triton says so at its first lookup
        return False
    return isinstance(manager, type) and issubclass(manager, RedisCacheManager) and fleet_cache() is not None


def held_by_fleet(variants: Iterable) -> set[str]:
    """Cache hashes of ``variants`` whose entry Redis holds intact, where this process's Triton reads
    through it (read-only: what its first lookups would fetch); empty otherwise, or with Redis away."""
    fleet = fleet_cache() if serving_reads_the_fleet() else None
    if fleet is None:
        return set()
    return {v.cache_hash for v in variants
            if fleet.call(lambda store, v=v: store.entry_state(v.entry_dir, _group_name(v))[0]) == "ok"}


def fetch_from_fleet(cache_dir: str | Path, entry_dir: str, entry_name: str) -> bool:
    """Fetch one entry from Redis into ``cache_dir``, as serving's ``RedisCacheManager`` does at the
    lookup Triton is about to make (verified, written through); True when it is local now."""
    from triton import knobs

    with knobs.cache.scope():
        knobs.cache.dir = str(cache_dir)
        return RedisCacheManager(entry_dir).get_group(f"{entry_name[:150]}.json") is not None


class RedisBackend(RemoteCacheBackend):
    """The store behind Triton's own ``RemoteCacheManager``: verified reads; the local cache when Redis is down."""

    def __init__(self, key: str):
        super().__init__(key)
        self._entry = key
        self._remote = fleet_cache()
        self._hashes: dict[str, str] = {}  # file name → sha256, from a group read or a put
        self._metadata: str | None = None  # the entry's metadata file, once its group was read

    def get(self, filenames: Iterable[str]) -> dict[str, bytes]:
        names = list(filenames)  # Triton passes a group's child_paths: our dict of name → hash, or its list of names
        if not all(plain_file_name(n) for n in names):  # Triton would write each at os.path.join(entry, name)
            refused(self._entry, "a group names a file that is not a plain file name of the entry")
            return {}
        found = None
        if self._remote is not None:
            found = self._remote.call(lambda store: store.read_files(self._entry, names, self._hashes))
        from_redis = found is not None
        if found is None:
            found = self._local(names)
        for name, data in found.items():
            if name.startswith(GROUP_PREFIX):
                children = _group_hashes(data) or {}
                if from_redis and children:  # verified while the store is usable, else refused (fail closed)
                    mac = self._remote.call(lambda store, n=name, d=data, c=children: store.group_mac_problem(
                        self._entry, n, d, c) or "")
                    if mac is None or mac:
                        if mac:
                            forged(self._entry, mac)
                        return {}
                why = names_problem(children, name) if children else None
                if why:
                    refused(self._entry, why)
                    return {}
                self._hashes.update(children)
                self._metadata = name[len(GROUP_PREFIX):]
        if len(names) > 1 and len(found) != len(names):
            return {}  # a group's children: all or none (Triton 3.6 would load a partial group)
        why = None
        if self._metadata in found:
            why = metadata_problem(found[self._metadata], self._entry) or binary_problem(found, self._metadata)
        if why:
            refused(self._entry, why)
            return {}
        return found

    def put(self, filename: str, data: bytes) -> None:
        if filename.endswith(HOST_CODE):  # never fetched: pushing it would only take room
            return
        if filename.startswith(GROUP_PREFIX):
            try:
                names = list(json.loads(data)["child_paths"])
            except (ValueError, KeyError, TypeError):
                return
            if not all(n in self._hashes for n in names):
                return
            hashes = {n: self._hashes[n] for n in names}
            if self._remote is not None:
                self._remote.call(lambda store: store.write_group(self._entry, filename, hashes))
            return
        self._hashes[filename] = sha256(data)
        if self._remote is not None:
            self._remote.call(lambda store: store.write_files(self._entry, {filename: data}))

    def _local(self, names: list[str]) -> dict[str, bytes]:
        """What this machine's cache holds for the entry: Redis is down or not configured."""
        from triton import knobs

        found = {}
        for name in names:
            try:
                found[name] = Path(knobs.cache.dir, self._entry, name).read_bytes()
            except OSError:
                pass
        return found


@dataclass
class RemoteReport:
    """One target's plan against the shared cache."""

    url: str
    target: str
    planned: int = 0
    pushed: list[str] = field(default_factory=list)
    present: list[str] = field(default_factory=list)
    missing: list[dict] = field(default_factory=list)
    corrupt: list[dict] = field(default_factory=list)
    forged: list[dict] = field(default_factory=list)  # with a fleet key: entries whose MAC does not verify
    not_local: list[str] = field(default_factory=list)  # push: planned entries the local cache lacks
    key_id: str | None = None  # the fleet key's id; None: unauthenticated

    @property
    def ok(self) -> bool:
        return not (self.missing or self.corrupt or self.forged or self.not_local)

    def to_json(self) -> dict:
        return {**self.__dict__, "ok": self.ok}


def _group_name(variant) -> str:
    return f"{GROUP_PREFIX}{variant.entry_name[:150]}.json"


def push(variants: Iterable, cache_dir: Path, store: RedisStore, target: str) -> RemoteReport:
    """Push every planned entry of the local cache (its files and its group); entries already there are skipped."""
    variants = list(variants)
    report = RemoteReport(store.url, target, planned=len(variants), key_id=store.key and store.key.key_id)
    for variant in variants:
        files = entry_files(cache_dir, variant.entry_dir, variant.entry_name)
        if files is None:
            report.not_local.append(variant.variant_id)
            continue
        data = {name: Path(path).read_bytes() for name, path in sorted(files.items())}
        state, stored = store.entry_state(variant.entry_dir, _group_name(variant))
        if state == "ok" and {n: sha256(b) for n, b in stored.items()} == {n: sha256(b) for n, b in data.items()}:
            report.present.append(variant.variant_id)
            continue
        store.write_entry(variant.entry_dir, _group_name(variant), data)
        report.pushed.append(variant.variant_id)
    return report


def check_remote(variants: Iterable, store: RedisStore, target: str) -> RemoteReport:
    """Each planned entry in Redis: present and intact, missing, corrupt (a hash that does not match, an
    entry that is not its key's) or, with a fleet key, forged (a MAC that does not verify)."""
    variants = list(variants)
    report = RemoteReport(store.url, target, planned=len(variants), key_id=store.key and store.key.key_id)
    for variant in variants:
        state, _, why = store.inspect_entry(variant.entry_dir, _group_name(variant))
        summary = {"id": variant.variant_id, "kernel": variant.kernel, "args": variant.args}
        if why:
            summary["why"] = why
        if state == "ok":
            report.present.append(variant.variant_id)
        else:
            getattr(report, state).append(summary)
    return report
