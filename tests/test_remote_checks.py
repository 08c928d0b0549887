"""The fleet cache's own checks (``jit/cache/remote.py``) pinned with fast tests: an in-memory Redis
server stands in at the network boundary (the ``redis`` package the module imports), so no
``redis-server`` is needed, and the module's value format, MAC verification, refusals, counting,
warnings and outages run for real. ``test_remote_cache.py`` runs the same paths against a real server."""

import json
import logging
import struct
import sys
import types

import pytest
from tritonwarm.jit.cache import remote
from tritonwarm.jit.cache.layout import entry_dir_name, entry_files
from tritonwarm.jit.cache.remote import (
    RedisBackend,
    RedisCacheManager,
    RedisStore,
    RemoteCacheError,
    RemoteReport,
    RemoteUnavailable,
    check_remote,
    fetch_from_fleet,
    fleet_cache,
    held_by_fleet,
    names_problem,
    parse_redis_url,
    push,
    serving_reads_the_fleet,
    sha256,
    shown_url,
    timeout_s,
)
from tritonwarm.jit.core.trace import Variant

URL = "redis://cache.internal:6379/0"
FLEET_KEY = "0123456789abcdef" * 4
OTHER_KEY = "fedcba9876543210" * 4
GROUP = "__grp__k.json"
MANAGER = "tritonwarm.jit.cache.remote:RedisCacheManager"
LOGGER = "tritonwarm.jit.cache.remote"


# ------------------------------------------------------------------ an in-memory Redis server


class FakeRedisServer:
    """What ``redis.Redis`` talks to: keys and values in memory, the commands each client sent, and a
    switch that makes every command fail as a server that went away does."""

    def __init__(self):
        self.data: dict[str, bytes] = {}
        self.clients: list[dict] = []  # each client's connection arguments
        self.commands: list[tuple] = []  # (command, keys)
        self.transactions: list[tuple[bool, list[str]]] = []  # (transaction?, keys in the order set)
        self.down: Exception | None = None

    def key_of(self, kind: str, entry: str, name: str = "") -> str:
        return f"tritonwarm:{kind}:{entry}:{name}" if name else f"tritonwarm:{kind}:{entry}"

    def asked(self) -> list[str]:
        return [k for command, keys in self.commands if command in ("get", "mget") for k in keys]

    def plant(self, data: bytes) -> str:
        """A blob stored under its own hash, as any writer of the server can."""
        self.data[f"tritonwarm:blob:{sha256(data)}"] = data
        return sha256(data)


def _bytes(value) -> bytes:
    return value if isinstance(value, bytes) else str(value).encode()


def fake_redis_module(server: FakeRedisServer) -> dict[str, types.ModuleType]:
    redis = types.ModuleType("redis")

    class RedisError(Exception):
        pass

    class ConnectionError(RedisError):  # noqa: A001 (redis-py's own name)
        pass

    class ResponseError(RedisError):
        pass

    class Pipeline:
        def __init__(self, client, transaction):
            self.client, self.transaction, self.queued = client, transaction, []

        def set(self, key, value):
            self.queued.append((key, _bytes(value)))
            return self

        def execute(self):
            self.client.answer("exec", [k for k, _ in self.queued])
            server.transactions.append((self.transaction, [k for k, _ in self.queued]))
            server.data.update(self.queued)
            return [True] * len(self.queued)

    class Redis:
        def __init__(self, **params):
            server.clients.append(params)

        def answer(self, command, keys):
            if server.down is not None:
                raise server.down
            server.commands.append((command, list(keys)))

        def ping(self):
            self.answer("ping", [])
            return True

        def get(self, key):
            self.answer("get", [key])
            return server.data.get(key)

        def mget(self, keys):
            if not keys:  # as the server answers an MGET of nothing
                raise ResponseError("wrong number of arguments for 'mget' command")
            self.answer("mget", keys)
            return [server.data.get(k) for k in keys]

        def set(self, key, value):
            self.answer("set", [key])
            server.data[key] = _bytes(value)
            return True

        def pipeline(self, transaction=True):
            return Pipeline(self, transaction)

    redis.Redis, redis.RedisError, redis.ConnectionError, redis.ResponseError = Redis, RedisError, ConnectionError, \
        ResponseError
    backoff, retry = types.ModuleType("redis.backoff"), types.ModuleType("redis.retry")

    class NoBackoff:
        pass

    class Retry:
        def __init__(self, backoff, retries):
            self.backoff, self.retries = backoff, retries

    backoff.NoBackoff, retry.Retry = NoBackoff, Retry
    redis.backoff, redis.retry = backoff, retry
    return {"redis": redis, "redis.backoff": backoff, "redis.retry": retry}


@pytest.fixture
def server(monkeypatch):
    """The Redis server every client of this process reaches, empty; no fleet key, no URL, no warning
    given yet, no shared cache connected."""
    fake = FakeRedisServer()
    for name, module in fake_redis_module(fake).items():
        monkeypatch.setitem(sys.modules, name, module)
    fake.errors = sys.modules["redis"]
    for name in ("TRITONWARM_REDIS_KEY", "TRITONWARM_REDIS_KEY_FILE", "TRITONWARM_REDIS_URL",
                 "TRITONWARM_REDIS_TIMEOUT", "TRITONWARM_OVERLAY_DIR", "TRITON_CACHE_MANAGER"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(remote, "_fleet", {})
    monkeypatch.setattr(remote, "_refused", set())
    monkeypatch.setattr(remote, "_forged_warned", [])
    return fake


def _entry(seed: bytes = b"k"):
    """An entry's folder name and its files as Triton writes them: the metadata names its cache hash."""
    cache_hash = sha256(seed)
    return entry_dir_name(cache_hash), {"k.cubin": b"not an ELF file " + seed,
                                        "k.json": json.dumps({"name": "k", "hash": cache_hash}).encode()}


def _elf_defining(function: str) -> bytes:
    """A 64-bit little-endian ELF whose symbol table defines one function: the shape of a cubin."""
    shstrtab, strtab = b"\0.shstrtab\0.strtab\0.symtab\0", b"\0" + function.encode() + b"\0"
    symtab = bytes(24) + struct.pack("<IBBHQQ", 1, 0x12, 0, 1, 0, 0)
    at = 64
    sections = [(0, 0, 0, 0, 0)]  # (name, type, offset, size, link)
    body = b""
    for name, kind, data, link in ((1, 3, shstrtab, 0), (11, 3, strtab, 0), (19, 2, symtab, 2)):
        sections.append((name, kind, at + len(body), len(data), link))
        body += data
    shoff = at + len(body)
    header = b"\x7fELF" + bytes([2, 1, 1]) + bytes(9) + struct.pack("<HHIQQQIHHHHHH", 1, 190, 1, 0, 0, shoff, 0, 64,
                                                                      0, 0, 64, len(sections), 1)
    table = b"".join(struct.pack("<IIQQQQIIQQ", n, k, 0, 0, o, s, link, 0, 1, 0) for n, k, o, s, link in sections)
    return header + body + table


def _warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LOGGER]


def _store(key: str | None = None, url: str = URL) -> RedisStore:
    from tritonwarm.jit.cache.fleet_key import FleetKey

    return RedisStore(url, key=FleetKey(key.encode(), "test") if key else None)


# ------------------------------------------------------------------ URLs and timeouts


def test_a_redis_url_gives_the_host_port_database_credentials_and_tls():
    assert parse_redis_url("redis://alice:pw@cache.internal:6380/3") == {
        "host": "cache.internal", "port": 6380, "db": 3, "username": "alice", "password": "pw", "ssl": False}
    assert parse_redis_url("rediss://cache.internal") == {
        "host": "cache.internal", "port": 6379, "db": 0, "username": None, "password": None, "ssl": True}
    assert parse_redis_url("redis://:pw@cache.internal/") == {
        "host": "cache.internal", "port": 6379, "db": 0, "username": None, "password": "pw", "ssl": False}


@pytest.mark.parametrize("url, says", [
    ("redis://cache.internal:99999", "the port is not a number from 0 to 65535"),
    ("redis://cache.internal:port", "the port is not a number from 0 to 65535"),
    ("redis://[::1", "malformed"),
    ("http://cache.internal:6379", "expected redis://HOST:PORT[/DB]"),
    ("redis://", "expected redis://HOST:PORT[/DB]"),
    ("redis://cache.internal/0?db=1", "no query or fragment expected"),
    ("redis://cache.internal/0#top", "no query or fragment expected"),
    ("redis://cache.internal/zero", "the database after '/' must be a number, got 'zero'"),
    ("redis://cache.internal/X", "the database after '/' must be a number, got 'X'"),
])
def test_a_bad_redis_url_names_itself_and_what_is_wrong(url, says):
    with pytest.raises(RemoteCacheError) as refused:
        parse_redis_url(url)
    assert str(refused.value) == f"bad Redis URL {url!r}: {says}"


def test_a_long_database_name_is_cut_in_the_message():
    with pytest.raises(RemoteCacheError) as refused:
        parse_redis_url("redis://cache.internal/" + "x" * 100)
    assert str(refused.value).split(", got ")[1] == repr("x" * 40 + "… (60 more characters)")


@pytest.mark.parametrize("url, shown", [
    ("redis://alice:s3cr3t@cache.internal:6379/0", "redis://alice:***@cache.internal:6379/0"),
    ("redis://:s3cr3t@cache.internal", "redis://:***@cache.internal"),
    ("redis://s3cr3t@cache.internal", "redis://***@cache.internal"),
    ("redis://alice:s3@cr/3t@cache.internal", "redis://alice:***@cache.internal"),
    ("redis://alice:s3:cr3t@cache.internal", "redis://alice:***@cache.internal"),
    ("redis://alice:s3://cr3t@cache.internal", "redis://alice:***@cache.internal"),
    ("redis://cache.internal:6379/0", "redis://cache.internal:6379/0"),
    ("cache.internal:6379", "cache.internal:6379"),
])
def test_a_password_is_masked_where_the_url_is_shown(url, shown):
    assert shown_url(url) == shown


def test_a_shown_url_is_cut_at_two_hundred_characters():
    fits = "redis://" + "h" * 192
    assert shown_url(fits) == fits
    assert shown_url(fits + "h").startswith(fits + "…")


def test_the_timeout_is_one_second_unless_set(monkeypatch):
    monkeypatch.delenv("TRITONWARM_REDIS_TIMEOUT", raising=False)
    assert timeout_s() == 1.0
    monkeypatch.setenv("TRITONWARM_REDIS_TIMEOUT", "")
    assert timeout_s() == 1.0
    for text, seconds in (("2.5", 2.5), ("60", 60.0), ("0.01", 0.01)):
        monkeypatch.setenv("TRITONWARM_REDIS_TIMEOUT", text)
        assert timeout_s() == seconds


@pytest.mark.parametrize("text, says", [("0", "between 0 and 60"), ("-1", "between 0 and 60"),
                                        ("60.5", "between 0 and 60"), ("soon", "expected seconds, e.g. 1.0")])
def test_a_bad_timeout_names_the_variable_and_its_value(monkeypatch, text, says):
    monkeypatch.setenv("TRITONWARM_REDIS_TIMEOUT", text)
    with pytest.raises(RemoteCacheError) as refused:
        timeout_s()
    assert str(refused.value).startswith(f"TRITONWARM_REDIS_TIMEOUT={text!r}: ") and says in str(refused.value)


# ------------------------------------------------------------------ the store: connection and errors


def test_the_client_connects_once_with_the_timeout_and_no_retries(server, monkeypatch):
    """A server that does not answer costs one timeout, not retries with backoff: serving goes on."""
    monkeypatch.setenv("TRITONWARM_REDIS_TIMEOUT", "2.5")
    store = RedisStore("rediss://alice:pw@cache.internal:6380/3")
    [params] = server.clients
    retry = params.pop("retry")
    assert params == {"host": "cache.internal", "port": 6380, "db": 3, "username": "alice", "password": "pw",
                      "ssl": True, "socket_connect_timeout": 2.5, "socket_timeout": 2.5, "health_check_interval": 0}
    assert retry.retries == 0 and type(retry.backoff).__name__ == "NoBackoff"
    assert store.url == "rediss://alice:***@cache.internal:6380/3"
    RedisStore(URL, timeout=7.0)
    assert server.clients[-1]["socket_connect_timeout"] == server.clients[-1]["socket_timeout"] == 7.0


def test_without_the_redis_package_the_store_says_how_to_install_it(server, monkeypatch):
    monkeypatch.setitem(sys.modules, "redis", None)
    with pytest.raises(RemoteCacheError) as refused:
        RedisStore(URL)
    assert str(refused.value) == "a Redis cache needs the redis package: pip install 'tritonwarm[redis]'"


def test_the_fleet_key_comes_from_the_environment_unless_given(server, monkeypatch):
    from tritonwarm.jit.cache.fleet_key import FleetKey

    assert RedisStore(URL).key is None
    monkeypatch.setenv("TRITONWARM_REDIS_KEY", FLEET_KEY)
    assert RedisStore(URL).key == FleetKey(FLEET_KEY.encode(), "TRITONWARM_REDIS_KEY")
    assert RedisStore(URL, key=None).key is None


def test_a_server_that_went_away_is_one_line_naming_it_without_the_password(server):
    store = RedisStore("redis://alice:s3cr3t@cache.internal:6379/0")
    server.down = server.errors.ConnectionError("Error 111 connecting to cache.internal:6379.\n   Connection refused.")
    with pytest.raises(RemoteUnavailable) as away:
        store.ping()
    assert str(away.value) == ("Redis at redis://alice:***@cache.internal:6379/0: Error 111 connecting to "
                               "cache.internal:6379. Connection refused.")
    server.down = TimeoutError()
    with pytest.raises(RemoteUnavailable, match=r"^Redis at redis://alice:\*\*\*@cache.internal:6379/0: TimeoutError$"):
        store.read_entry("E", GROUP)
    server.down = None
    store.ping()


# ------------------------------------------------------------------ the store: values as stored


def test_an_entry_written_reads_back_whole_and_its_files_one_by_one(server):
    store = _store()
    entry, files = _entry()
    store.write_entry(entry, GROUP, files)
    assert store.read_entry(entry, GROUP) == files
    assert store.entry_state(entry, GROUP) == ("ok", files)
    assert store.read_files(entry, ["k.json", "absent.ptx"]) == {"k.json": files["k.json"]}
    assert store.entry_state("OTHER", GROUP) == ("missing", {})


def test_an_entry_is_stored_by_content_hash_in_one_transaction_its_group_last(server):
    """Blobs under their sha256, names pointing at them, the group naming children by hash: a reader
    never sees a group before its files, and concurrent pushers of the same bytes agree."""
    store = _store()
    entry, files = _entry()
    store.write_entry(entry, GROUP, files)
    [(transaction, keys)] = server.transactions
    assert transaction is True
    assert keys[-1] == server.key_of("file", entry, GROUP)
    for name, data in files.items():
        assert server.data[server.key_of("blob", sha256(data))] == data
        assert server.data[server.key_of("file", entry, name)] == sha256(data).encode()
        assert keys.index(server.key_of("blob", sha256(data))) < keys.index(server.key_of("file", entry, name))
    group = server.data[server.key_of("blob", server.data[server.key_of("file", entry, GROUP)].decode())]
    assert json.loads(group) == {"child_paths": {name: sha256(data) for name, data in files.items()}}
    assert group == json.dumps({"child_paths": {n: sha256(files[n]) for n in sorted(files)}}, sort_keys=True).encode()
    assert not any(":mac:" in k for k in server.data)  # no fleet key: nothing signed


def test_a_group_written_alone_names_children_already_stored(server):
    store = _store()
    entry, files = _entry()
    store.write_files(entry, files)
    assert store.entry_state(entry, GROUP) == ("missing", {})
    store.write_group(entry, GROUP, {name: sha256(data) for name, data in files.items()})
    assert store.read_entry(entry, GROUP) == files


def test_a_file_whose_stored_hash_or_bytes_do_not_agree_is_not_read(server):
    store = _store()
    entry, files = _entry()
    store.write_entry(entry, GROUP, files)
    server.data[server.key_of("blob", sha256(files["k.cubin"]))] = b"bitrot"
    assert store.read_files(entry, ["k.cubin", "k.json"]) == {"k.json": files["k.json"]}
    server.data[server.key_of("file", entry, "k.json")] = b"\xff not a digest"
    assert store.read_files(entry, ["k.json"]) == {}


def test_hashes_already_known_are_not_asked_for_again(server):
    """Triton's lookups of a group's children: the group named their hashes, Redis is asked for bytes only."""
    store = _store()
    entry, files = _entry()
    store.write_entry(entry, GROUP, files)
    server.commands.clear()
    known = {"k.cubin": sha256(files["k.cubin"])}
    assert store.read_files(entry, ["k.cubin"], known) == {"k.cubin": files["k.cubin"]}
    assert server.asked() == [server.key_of("blob", known["k.cubin"])]
    assert store.read_files(entry, ["k.cubin"], {"k.cubin": sha256(b"other")}) == {}  # the bytes must match it


def test_nothing_stored_for_the_names_is_an_empty_answer(server):
    store = _store()
    assert store.read_files("E", ["k.cubin", "k.json"]) == {}


def test_a_name_that_is_no_plain_file_name_is_never_asked_for_and_warned_about_once(server, caplog):
    store = _store()
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert store.read_files("ENTRY", ["k.json", "../../etc/passwd"]) == {}
        assert store.read_files("ENTRY", ["sub/k.json"]) == {}
    assert server.commands == []
    [warned] = _warnings(caplog)
    assert warned == ("tritonwarm: shared Triton cache entry ENTRY refused, compiling it locally: "
                      "'../../etc/passwd' is not a plain file name of the entry")


def test_a_long_name_entry_or_metadata_name_is_cut_to_eighty_characters_in_a_warning(server, caplog):
    long_entry, long_name = "E" * 100, "../" + "x" * 100
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert _store().read_files(long_entry, [long_name]) == {}
    [warned] = _warnings(caplog)
    assert f" entry {'E' * 80}… (20 more characters) refused, " in warned
    assert warned.endswith(f": {repr(long_name)[:80]}… (25 more characters) is not a plain file name of the entry")
    assert names_problem({long_name: ""}, GROUP) == (f"its group names {repr(long_name)[:80]}… (25 more characters), "
                                                     "which is not a plain file name of the entry")
    metadata = "k" * 100 + ".json"
    assert names_problem({"k.cubin": ""}, "__grp__" + metadata) == (
        f"its group lacks the entry's metadata {metadata[:80]}… (25 more characters)")


def test_a_forged_entry_with_a_long_name_is_cut_in_the_warning(server, caplog):
    _, files = _entry()
    _store().write_entry("E" * 100, GROUP, files)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert _store(FLEET_KEY).read_entry("E" * 100, GROUP) is None
    [warned] = _warnings(caplog)
    assert f" entry {'E' * 80}… (20 more characters) refused, " in warned


@pytest.mark.parametrize("name", ["__triton_launcher.cpython-312-x86_64-linux-gnu.so", "cuda_utils.pyd", "x.dll",
                                  "x.dylib"])
def test_a_host_library_is_never_fetched_nor_warned_about(server, caplog, name):
    """A C module is loaded into the serving process: built locally, whatever Redis holds."""
    store = _store()
    store.write_files("ENTRY", {name: b"\x7fELF planted"})
    server.commands.clear()
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert store.read_files("ENTRY", [name]) == {}
    assert server.commands == [] and _warnings(caplog) == []


# ------------------------------------------------------------------ the store: damaged and hostile entries


def _plant_group(server, entry, children: dict[str, bytes], extra: dict | None = None) -> bytes:
    """A group naming ``children`` by hash, written as a hostile writer of the server would."""
    group = json.dumps({"child_paths": {n: server.plant(d) for n, d in children.items()}, **(extra or {})}).encode()
    for name, data in children.items():
        server.data[server.key_of("file", entry, name)] = sha256(data).encode()
    server.data[server.key_of("file", entry, GROUP)] = server.plant(group).encode()
    return group


def test_a_missing_group_or_group_blob_is_missing(server):
    store = _store()
    entry, files = _entry()
    store.write_entry(entry, GROUP, files)
    digest = server.data[server.key_of("file", entry, GROUP)].decode()
    del server.data[server.key_of("blob", digest)]
    assert store.inspect_entry(entry, GROUP) == ("missing", {}, None)


def test_a_missing_child_is_missing_and_a_damaged_one_corrupt_both_without_a_warning(server, caplog):
    store = _store()
    entry, files = _entry()
    store.write_entry(entry, GROUP, files)
    cubin = server.key_of("blob", sha256(files["k.cubin"]))
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        server.data[cubin] = b"bitrot"
        assert store.inspect_entry(entry, GROUP) == ("corrupt", {}, None)
        assert store.read_entry(entry, GROUP) is None
        del server.data[cubin]
        assert store.inspect_entry(entry, GROUP) == ("missing", {}, None)
        assert store.read_entry(entry, GROUP) is None
    assert _warnings(caplog) == []


@pytest.mark.parametrize("group", [
    b"not json",
    b'["a list"]',
    b'{"children": {}}',
    b'{"child_paths": ["k.json"]}',
    json.dumps({"child_paths": {"k.json": "A" * 64}}).encode(),
    json.dumps({"child_paths": {"k.json": "X" * 64}}).encode(),
    json.dumps({"child_paths": {"k.json": "a" * 63}}).encode(),
    json.dumps({"child_paths": {"k.json": 7}}).encode(),
], ids=["not-json", "a-list", "no-child-paths", "names-only", "upper-case-hash", "not-hex", "short-hash", "number"])
def test_a_group_that_does_not_name_children_by_sha256_is_corrupt(server, group):
    entry, _ = _entry()
    server.data[server.key_of("file", entry, GROUP)] = server.plant(group).encode()
    assert _store().inspect_entry(entry, GROUP) == ("corrupt", {}, None)


def test_a_group_whose_bytes_do_not_hash_to_its_key_is_corrupt(server):
    store = _store()
    entry, files = _entry()
    store.write_entry(entry, GROUP, files)
    digest = server.data[server.key_of("file", entry, GROUP)].decode()
    server.data[server.key_of("blob", digest)] += b" "  # still JSON naming the same children
    assert store.inspect_entry(entry, GROUP) == ("corrupt", {}, None)


@pytest.mark.parametrize("name", ["../escaped", "/abs", "sub/x", "", "..", "__grp__other.json", "launcher.so"])
def test_a_group_naming_a_file_that_is_no_plain_file_name_is_refused_with_one_warning(server, caplog, name):
    """Triton writes each child at os.path.join(entry folder, name): the server's bytes would land anywhere."""
    entry, files = _entry()
    _plant_group(server, entry, {**files, name: b"attacker's bytes"})
    store = _store()
    state, found, why = store.inspect_entry(entry, GROUP)
    assert (state, found) == ("corrupt", {})
    assert why == f"its group names {name!r}, which is not a plain file name of the entry"
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert store.read_entry(entry, GROUP) is None
        assert store.read_entry(entry, GROUP) is None
    assert _warnings(caplog) == [f"tritonwarm: shared Triton cache entry {entry} refused, compiling it locally: {why}"]


def test_a_group_without_the_entrys_metadata_is_refused(server):
    entry, files = _entry()
    _plant_group(server, entry, {"k.cubin": files["k.cubin"], "other.json": files["k.json"]})
    assert _store().inspect_entry(entry, GROUP) == ("corrupt", {}, "its group lacks the entry's metadata k.json")


def test_names_problem_accepts_an_entrys_plain_children_with_its_metadata():
    assert names_problem({"k.cubin": "", "k.json": "", "k.ttir": ""}, GROUP) is None
    assert "lacks the entry's metadata k.json" in names_problem({"k.cubin": ""}, GROUP)
    assert "'x.dylib', which is not a plain file name" in names_problem({"k.json": "", "x.dylib": ""}, GROUP)


def test_an_entry_holding_another_keys_files_is_refused_with_one_warning_per_entry(server, caplog):
    """Entry B's key holds entry A's valid files, every hash agreeing: Triton would load kernel A for B."""
    store = _store()
    a, files = _entry(b"a")
    b, _ = _entry(b"b")
    c, _ = _entry(b"c")
    store.write_entry(b, GROUP, files)
    store.write_entry(c, GROUP, files)
    state, found, why = store.inspect_entry(b, GROUP)
    assert (state, found) == ("corrupt", {}) and "another kernel's files" in why
    assert f"{b[:16]}... is named after" in why
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert store.read_entry(b, GROUP) is None
        assert store.read_entry(b, GROUP) is None
        assert store.read_entry(c, GROUP) is None
        assert store.read_entry(a, GROUP) is None  # (never written: a miss, nothing to say)
    warned = _warnings(caplog)
    assert len(warned) == 2 and f"entry {b} refused" in warned[0] and f"entry {c} refused" in warned[1]
    assert all("another kernel's files" in w for w in warned)


def test_a_binary_defining_another_kernel_is_refused(server):
    store = _store()
    entry, files = _entry()
    store.write_entry(entry, GROUP, {**files, "k.cubin": _elf_defining("k")})
    assert store.inspect_entry(entry, GROUP)[:2] == ("ok", {**files, "k.cubin": _elf_defining("k")})
    store.write_entry(entry, GROUP, {**files, "k.cubin": _elf_defining("silu_kernel")})
    state, found, why = store.inspect_entry(entry, GROUP)
    assert (state, found) == ("corrupt", {})
    assert why == "its k.cubin defines kernel silu_kernel, not k that its metadata names (another kernel's binary)"


# ------------------------------------------------------------------ the fleet key


def test_with_a_fleet_key_every_file_and_group_carries_a_mac_that_verifies(server):
    store = _store(FLEET_KEY)
    entry, files = _entry()
    store.write_entry(entry, GROUP, files)
    for name, data in files.items():
        assert store.key.problem(server.data[server.key_of("mac", entry, name)], entry, name, sha256(data)) is None
    assert server.key_of("mac", entry, GROUP) not in server.data  # the group holds its own
    assert store.read_entry(entry, GROUP) == files
    assert store.read_files(entry, [GROUP, "k.json"])["k.json"] == files["k.json"]
    assert _store().read_entry(entry, GROUP) == files  # a reader without the key reads it too


def test_an_entry_pushed_without_the_key_is_forged_for_a_reader_with_it_and_warned_once(server, caplog):
    entry, files = _entry()
    other, other_files = _entry(b"other")
    _store().write_entry(entry, GROUP, files)
    _store().write_entry(other, GROUP, other_files)
    keyed = _store(FLEET_KEY)
    state, found, why = keyed.inspect_entry(entry, GROUP)
    assert (state, found) == ("forged", {}) and "not signed with the fleet key" in why
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert keyed.read_entry(entry, GROUP) is None
        assert keyed.read_entry(other, GROUP) is None
        assert keyed.read_files(other, ["k.cubin"]) == {}
    [warned] = _warnings(caplog)
    assert warned.startswith(f"tritonwarm: shared Triton cache entry {entry} refused, compiling it locally: ")
    assert "not signed with the fleet key" in warned
    assert warned.endswith("(entries that do not verify with the fleet key are refused without another warning)")


def test_a_file_repointed_at_other_bytes_does_not_verify(server, caplog):
    """A writer without the key points an entry's file at bytes of its choosing: the MAC names the old hash."""
    store = _store(FLEET_KEY)
    entry, files = _entry()
    store.write_entry(entry, GROUP, files)
    server.data[server.key_of("file", entry, "k.cubin")] = server.plant(b"other cubin").encode()
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert store.read_files(entry, ["k.cubin", "k.json"]) == {"k.json": files["k.json"]}
    [warned] = _warnings(caplog)
    assert f"entry {entry} refused" in warned and "k.cubin: its MAC does not verify with the fleet key" in warned


def test_a_group_rewritten_without_the_key_is_forged(server):
    """The group's children swapped (every hash agreeing), its MAC kept: it binds the old children."""
    store = _store(FLEET_KEY)
    entry, files = _entry()
    store.write_entry(entry, GROUP, files)
    mac = json.loads(server.data[server.key_of("blob", server.data[server.key_of("file", entry, GROUP)].decode())])
    _plant_group(server, entry, {**files, "k.cubin": b"another cubin"}, {"mac": mac["mac"]})
    assert store.inspect_entry(entry, GROUP) == (
        "forged", {}, "its MAC does not verify with the fleet key (changed after it was pushed)")
    assert _store().inspect_entry(entry, GROUP)[0] == "ok"  # without a key nothing can tell
    assert store.group_mac_problem(entry, GROUP, b"{}", {}) is not None
    assert _store().group_mac_problem(entry, GROUP, b"{}", {}) is None


@pytest.mark.parametrize("group", [b'{"child_paths": {}, "mac": "hmac-sha256:x:y"}', b"[1]", b"not json"])
def test_a_group_mac_that_cannot_be_read_does_not_verify(server, group):
    store = _store(FLEET_KEY)
    assert store.group_mac_problem("E", GROUP, group, {}) is not None


def test_an_entry_pushed_with_another_fleet_key_is_forged(server):
    entry, files = _entry()
    _store(OTHER_KEY).write_entry(entry, GROUP, files)
    state, _, why = _store(FLEET_KEY).inspect_entry(entry, GROUP)
    assert state == "forged" and "signed with another fleet key" in why


# ------------------------------------------------------------------ one connection per serving process


def test_no_url_no_shared_cache_one_per_url_and_process(server, monkeypatch):
    assert fleet_cache() is None
    monkeypatch.setenv("TRITONWARM_REDIS_URL", URL)
    shared = fleet_cache()
    assert shared is not None and shared.url == URL and fleet_cache() is shared
    monkeypatch.setenv("TRITONWARM_REDIS_URL", URL + "1")
    assert fleet_cache() is not shared
    monkeypatch.setenv("TRITONWARM_REDIS_URL", URL)
    monkeypatch.setattr(remote.os, "getpid", lambda: -1)  # a forked worker: a connection of its own
    assert fleet_cache() is not shared and fleet_cache() is fleet_cache()


class Clock:
    """A monotonic clock: its reference point is undefined, so a reading of 0 is one it may give."""

    def __init__(self):
        self.now = 0.0

    def monotonic(self):
        return self.now


@pytest.fixture
def clock(monkeypatch):
    """The clock the shared cache's pause reads (the module's ``time``)."""
    fake = Clock()
    monkeypatch.setattr(remote, "time", fake)
    return fake


def test_a_server_away_is_one_warning_then_another_try_after_thirty_seconds(server, monkeypatch, caplog, clock):
    monkeypatch.setenv("TRITONWARM_REDIS_URL", URL)
    shared = fleet_cache()
    assert shared.call(lambda store: store.ping() or "up") == "up"
    server.down = server.errors.ConnectionError("Connection refused.")
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert shared.call(lambda store: store.ping() or "up") is None
        server.down = None  # back already: not asked before the pause is over
        clock.now += 29.9
        assert shared.call(lambda store: store.ping() or "up") is None
        clock.now = 30.0
        assert shared.call(lambda store: store.ping() or "up") == "up"
        server.down = server.errors.ConnectionError("Connection refused.")
        assert shared.call(lambda store: store.ping() or "up") is None
    assert _warnings(caplog) == ["tritonwarm: shared Triton cache unusable, serving from the local cache only "
                                 "(compiles stay local): Redis at redis://cache.internal:6379/0: Connection refused."]
    assert len(server.clients) == 1  # one connection, kept


@pytest.mark.parametrize("url, key, says", [("http://cache.internal", None, "bad Redis URL"),
                                            (URL, "short", "fewer than 32")])
def test_a_misconfigured_shared_cache_warns_once_and_is_never_tried_again(server, monkeypatch, caplog, clock, url,
                                                                         key, says):
    monkeypatch.setenv("TRITONWARM_REDIS_URL", url)
    if key:
        monkeypatch.setenv("TRITONWARM_REDIS_KEY", key)
    shared = fleet_cache()
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert shared.call(lambda store: "used") is None
        monkeypatch.delenv("TRITONWARM_REDIS_KEY", raising=False)  # (fixed only by a restart)
        clock.now += 1e9
        assert shared.call(lambda store: "used") is None
    [warned] = _warnings(caplog)
    assert "shared Triton cache unusable" in warned and says in warned


def test_a_failure_while_serving_never_raises(server, monkeypatch, caplog, clock):
    monkeypatch.setenv("TRITONWARM_REDIS_URL", URL)

    def broken(store):
        raise RuntimeError("unexpected")

    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert fleet_cache().call(broken) is None
    assert _warnings(caplog)[0].endswith("(compiles stay local): unexpected")
    clock.now += 30.1
    assert fleet_cache().call(lambda store: "used") == "used"


# ------------------------------------------------------------------ serving: RedisCacheManager


@pytest.fixture
def serving(server, monkeypatch, tmp_path):
    """A serving process reading through the shared cache, its local cache empty in ``tmp_path/serving``."""
    monkeypatch.setenv("TRITON_CACHE_MANAGER", MANAGER)
    monkeypatch.setenv("TRITONWARM_REDIS_URL", URL)
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "serving"))
    return tmp_path / "serving"


def test_a_lookup_fetches_the_entry_verified_and_later_lookups_stay_local(server, serving):
    entry, files = _entry()
    _store().write_entry(entry, GROUP, files)
    paths = RedisCacheManager(entry).get_group("k.json")
    assert sorted(paths) == ["k.cubin", "k.json"]
    assert {name: open(path, "rb").read() for name, path in paths.items()} == files
    assert all(path.startswith(str(serving / entry)) for path in paths.values())
    assert entry_files(serving, entry, "k") == paths  # written through, as Triton's own group
    server.data.clear()
    server.commands.clear()
    assert RedisCacheManager(entry).get_group("k.json") == paths
    assert server.commands == []


def test_a_lookup_of_what_the_fleet_lacks_or_refuses_is_a_miss_and_writes_nothing(server, serving):
    entry, files = _entry()
    assert RedisCacheManager(entry).get_group("k.json") is None
    _plant_group(server, entry, {**files, "../escaped": b"x"})
    assert RedisCacheManager(entry).get_group("k.json") is None
    assert not [p for p in serving.rglob("*") if p.is_file()]


def test_a_file_lookup_is_fetched_and_written_through(server, serving):
    entry, files = _entry()
    _store().write_entry(entry, GROUP, files)
    path = RedisCacheManager(entry).get_file("k.cubin")
    assert path == str(serving / entry / "k.cubin") and open(path, "rb").read() == files["k.cubin"]
    assert RedisCacheManager(entry).get_file("k.ptx") is None
    server.data.clear()
    server.commands.clear()
    assert RedisCacheManager(entry).get_file("k.cubin") == path  # local now: Redis is not asked
    assert server.commands == []


def test_what_serving_compiles_is_pushed_as_a_whole_entry_but_host_libraries_are_not(server, serving):
    entry, files = _entry()
    manager = RedisCacheManager(entry)
    paths = {name: manager.put(data, name) for name, data in files.items()}
    manager.put("a text IR", "k.ttir", binary=False)
    manager.put(b"\x7fELF launcher", "launcher.so")
    assert _store().read_files(entry, ["k.ttir"]) == {"k.ttir": b"a text IR"}
    assert _store().entry_state(entry, GROUP) == ("missing", {})  # the group goes last
    manager.put_group("k.json", paths)
    assert _store().read_entry(entry, GROUP) == files
    assert not any("launcher.so" in k for k in server.data)
    assert not any(str(serving).encode() in v for v in server.data.values())  # Triton's own group names local paths


def test_what_a_serving_process_with_the_fleet_key_pushes_verifies(server, serving, monkeypatch):
    monkeypatch.setenv("TRITONWARM_REDIS_KEY", FLEET_KEY)
    entry, files = _entry()
    manager = RedisCacheManager(entry)
    manager.put_group("k.json", {name: manager.put(data, name) for name, data in files.items()})
    assert _store(FLEET_KEY).read_entry(entry, GROUP) == files
    assert _store(OTHER_KEY).entry_state(entry, GROUP)[0] == "forged"
    other, other_files = _entry(b"other")
    backend = RedisBackend(other)
    for name, data in other_files.items():
        backend.put(name, data)
    backend.put(GROUP, _triton_group(other_files))
    assert _store(FLEET_KEY).read_entry(other, GROUP) == other_files


def test_a_manager_for_override_or_dump_never_talks_to_the_fleet(server, serving, monkeypatch, tmp_path):
    monkeypatch.setenv("TRITON_DUMP_DIR", str(tmp_path / "dump"))
    monkeypatch.setenv("TRITON_OVERRIDE_DIR", str(tmp_path / "override"))
    entry, files = _entry()
    _store().write_entry(entry, GROUP, files)
    server.commands.clear()
    for kwargs in ({"override": True}, {"dump": True}):
        manager = RedisCacheManager(entry, **kwargs)
        assert manager.get_group("k.json") is None and manager.get_file("k.json") is None
    RedisCacheManager(entry, dump=True).put(b"bytes", "k.ptx")
    assert server.commands == []


def test_a_manager_for_override_or_dump_reads_tritons_own_folder_for_it(server, serving, monkeypatch, tmp_path):
    entry, _ = _entry()
    for kind in ("override", "dump"):
        monkeypatch.setenv(f"TRITON_{kind.upper()}_DIR", str(tmp_path / kind))
        (tmp_path / kind / entry).mkdir(parents=True)
        (tmp_path / kind / entry / "k.ptx").write_text(kind)
        path = RedisCacheManager(entry, **{kind: True}).get_file("k.ptx")
        assert open(path).read() == kind


def test_serving_with_the_server_away_is_local_only_with_one_warning(server, serving, caplog):
    entry, files = _entry()
    server.down = server.errors.ConnectionError("refused")
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        manager = RedisCacheManager(entry)
        assert manager.get_group("k.json") is None
        paths = {name: manager.put(data, name) for name, data in files.items()}
        manager.put_group("k.json", paths)
        assert RedisCacheManager(entry).get_group("k.json") == paths
    assert sum("shared Triton cache unusable" in w for w in _warnings(caplog)) == 1


def test_who_reads_through_the_fleet(server, monkeypatch):
    monkeypatch.setenv("TRITONWARM_REDIS_URL", URL)
    assert not serving_reads_the_fleet()  # Triton's own file cache
    monkeypatch.setenv("TRITON_CACHE_MANAGER", MANAGER)
    assert serving_reads_the_fleet()
    monkeypatch.setenv("TRITON_CACHE_MANAGER", "nosuch_store:Manager")
    assert not serving_reads_the_fleet()
    monkeypatch.setenv("TRITON_CACHE_MANAGER", MANAGER)
    monkeypatch.delenv("TRITONWARM_REDIS_URL")
    assert not serving_reads_the_fleet()


# ------------------------------------------------------------------ variants: push, check --remote, held


def _variant(seed: bytes, entry_name: str = "k") -> Variant:
    cache_hash = sha256(seed)
    return Variant(kernel="pkg.kernels.k", target="sm90", key=f"key {seed!r}", specialization_data="{}",
                   args={"x": "*bf16 aligned", "n": "i32:div16"}, num_warps=4, num_stages=1, cache_hash=cache_hash,
                   entry_name=entry_name)


def _warm_locally(cache, variant: Variant) -> dict[str, bytes]:
    """The variant's entry in a local cache folder, as Triton writes it (a group naming absolute paths)."""
    folder = cache / variant.entry_dir
    folder.mkdir(parents=True)
    name = variant.entry_name[:150]
    files = {f"{name}.cubin": b"cubin of " + variant.cache_hash.encode(),
             f"{name}.json": json.dumps({"name": name, "hash": variant.cache_hash}).encode()}
    for file, data in files.items():
        (folder / file).write_bytes(data)
    (folder / f"__grp__{name}.json").write_text(json.dumps({"child_paths": {f: str(folder / f) for f in files}}))
    return files


def test_push_sends_what_is_local_and_not_there_yet(server, tmp_path):
    cache = tmp_path / "cache"
    a, b, absent = _variant(b"a"), _variant(b"b"), _variant(b"absent")
    _warm_locally(cache, a)
    files_b = _warm_locally(cache, b)
    store = _store()
    first = push([absent, a, b], cache, store, "sm90")
    assert (first.pushed, first.present, first.not_local) == ([a.variant_id, b.variant_id], [], [absent.variant_id])
    assert (first.url, first.target, first.planned, first.key_id, first.ok) == (URL, "sm90", 3, None, False)
    assert store.read_entry(b.entry_dir, GROUP) == files_b
    again = push([a, b], cache, store, "sm90")
    assert (again.pushed, again.present, again.ok) == ([], [a.variant_id, b.variant_id], True)


def test_push_replaces_an_entry_that_holds_other_bytes(server, tmp_path):
    cache = tmp_path / "cache"
    a = _variant(b"a")
    files = _warm_locally(cache, a)
    store = _store()
    store.write_entry(a.entry_dir, GROUP, {**files, "k.ptx": b"an extra file"})
    assert store.entry_state(a.entry_dir, GROUP)[0] == "ok"
    assert push([a], cache, store, "sm90").pushed == [a.variant_id]
    assert store.read_entry(a.entry_dir, GROUP) == files


def test_push_with_a_fleet_key_names_it_and_signs_what_it_sends(server, tmp_path):
    cache = tmp_path / "cache"
    a = _variant(b"a")
    _warm_locally(cache, a)
    store = _store(FLEET_KEY)
    report = push([a], cache, store, "sm90")
    assert report.key_id == store.key.key_id and report.pushed == [a.variant_id]
    assert store.entry_state(a.entry_dir, GROUP)[0] == "ok"
    assert _store(OTHER_KEY).entry_state(a.entry_dir, GROUP)[0] == "forged"


def test_check_remote_counts_each_variant_by_what_redis_holds(server, tmp_path):
    cache = tmp_path / "cache"
    present, missing, corrupt, repointed = (_variant(s) for s in (b"present", b"missing", b"corrupt", b"repointed"))
    store = _store()
    for variant in (present, corrupt, repointed):
        _warm_locally(cache, variant)
    push([present, corrupt, repointed], cache, store, "sm90")
    cubin = entry_files(cache, corrupt.entry_dir, "k")["k.cubin"]
    server.data[server.key_of("blob", sha256(open(cubin, "rb").read()))] = b"bitrot"
    store.write_entry(repointed.entry_dir, GROUP, _warm_locally(tmp_path / "other", present))

    report = check_remote([present, missing, corrupt, repointed], store, "sm90")
    assert (report.url, report.target) == (URL, "sm90")
    assert (report.planned, report.present, report.forged, report.ok) == (4, [present.variant_id], [], False)
    assert report.missing == [{"id": missing.variant_id, "kernel": "pkg.kernels.k", "args": missing.args}]
    assert report.corrupt[0] == {"id": corrupt.variant_id, "kernel": "pkg.kernels.k", "args": corrupt.args}
    assert report.corrupt[1]["id"] == repointed.variant_id and "another kernel's files" in report.corrupt[1]["why"]
    assert report.to_json()["ok"] is False and report.to_json()["missing"] == report.missing
    keyed = check_remote([present], _store(FLEET_KEY), "sm90")
    assert keyed.forged[0]["id"] == present.variant_id and "not signed" in keyed.forged[0]["why"]
    assert not keyed.ok and keyed.key_id == _store(FLEET_KEY).key.key_id


def test_a_report_is_ok_only_without_missing_corrupt_forged_or_unpushed_entries():
    assert RemoteReport(URL, "sm90", planned=1, present=["a"]).ok
    for state in ("missing", "corrupt", "forged", "not_local"):
        assert not RemoteReport(URL, "sm90", **{state: [{"id": "a"}]}).ok


def test_a_long_kernel_name_is_cut_to_tritons_150_characters_everywhere(server, serving, tmp_path):
    """Triton names an entry's group after the first 150 characters of the kernel's name."""
    variant = _variant(b"long", "k" * 160)
    files = _warm_locally(tmp_path / "build", variant)
    assert push([variant], tmp_path / "build", _store(), "sm90").pushed == [variant.variant_id]
    assert check_remote([variant], _store(), "sm90").present == [variant.variant_id]
    assert fetch_from_fleet(tmp_path / "fetched", variant.entry_dir, variant.entry_name)
    fetched = entry_files(tmp_path / "fetched", variant.entry_dir, variant.entry_name)
    assert {name: open(path, "rb").read() for name, path in fetched.items()} == files


def test_held_by_fleet_names_intact_entries_where_serving_reads_through_redis(server, monkeypatch, tmp_path):
    cache = tmp_path / "cache"
    held, corrupt, absent = _variant(b"held"), _variant(b"corrupt"), _variant(b"absent")
    _warm_locally(cache, held)
    _warm_locally(cache, corrupt)
    push([held, corrupt], cache, _store(), "sm90")
    server.data[server.key_of("blob", sha256(b"cubin of " + corrupt.cache_hash.encode()))] = b"bitrot"
    monkeypatch.setenv("TRITONWARM_REDIS_URL", URL)
    assert held_by_fleet([held, corrupt, absent]) == set()  # Triton's own file cache reads no Redis
    monkeypatch.setenv("TRITON_CACHE_MANAGER", MANAGER)
    assert held_by_fleet([held, corrupt, absent]) == {held.cache_hash}
    server.down = server.errors.ConnectionError("refused")
    assert held_by_fleet([held, corrupt, absent]) == set()


def test_fetch_from_fleet_writes_the_entry_into_the_folder_or_says_it_could_not(server, serving, tmp_path):
    variant = _variant(b"a")
    files = _warm_locally(tmp_path / "build", variant)
    target = tmp_path / "fetched"
    assert not fetch_from_fleet(target, variant.entry_dir, "k")
    push([variant], tmp_path / "build", _store(), "sm90")
    assert fetch_from_fleet(target, variant.entry_dir, "k")
    assert {n: open(p, "rb").read() for n, p in entry_files(target, variant.entry_dir, "k").items()} == files
    assert not (serving / variant.entry_dir).exists()  # the folder named, not the process's cache


# ------------------------------------------------------------------ Triton's RemoteCacheManager: RedisBackend


@pytest.fixture
def backend_env(server, monkeypatch, tmp_path):
    monkeypatch.setenv("TRITONWARM_REDIS_URL", URL)
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "local"))
    return tmp_path / "local"


def _triton_group(files: dict[str, bytes]) -> bytes:
    """A group as Triton's RemoteCacheManager writes it: its children's names only."""
    return json.dumps({"child_paths": sorted(files)}).encode()


def test_the_backend_reads_a_group_then_its_children_by_the_hashes_the_group_names(server, backend_env):
    entry, files = _entry()
    _store().write_entry(entry, GROUP, files)
    backend = RedisBackend(entry)
    [(name, group)] = backend.get([GROUP]).items()
    assert name == GROUP and json.loads(group)["child_paths"] == {n: sha256(d) for n, d in files.items()}
    server.commands.clear()
    assert backend.get(json.loads(group)["child_paths"]) == files
    assert not any(":file:" in k for k in server.asked())  # the group named them


def test_the_backend_hands_over_a_groups_children_all_or_none(server, backend_env):
    entry, files = _entry()
    _store().write_entry(entry, GROUP, files)
    backend = RedisBackend(entry)
    backend.get([GROUP])
    del server.data[server.key_of("blob", sha256(files["k.cubin"]))]
    assert backend.get(["k.cubin", "k.json"]) == {}
    assert backend.get(["k.json"]) == {"k.json": files["k.json"]}


def test_the_backend_refuses_a_group_naming_a_path_or_another_keys_files(server, backend_env, caplog):
    entry, files = _entry()
    other, _ = _entry(b"other")
    _plant_group(server, entry, {**files, "../escaped": b"x"})
    _store().write_entry(other, GROUP, files)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert RedisBackend(entry).get([GROUP]) == {}
        assert RedisBackend(entry).get(["../escaped"]) == {}
        backend = RedisBackend(other)
        assert backend.get([GROUP]) != {}
        assert backend.get(["k.cubin", "k.json"]) == {}
    warned = _warnings(caplog)
    assert len(warned) == 2 and "'../escaped', which is not a plain file name" in warned[0]
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert RedisBackend("FRESH").get(["k.json", "sub/k.cubin"]) == {}
    assert _warnings(caplog)[-1] == ("tritonwarm: shared Triton cache entry FRESH refused, compiling it locally: "
                                     "a group names a file that is not a plain file name of the entry")
    assert f"entry {other} refused" in warned[1] and "another kernel's files" in warned[1]


def test_the_backend_refuses_a_group_that_does_not_verify_with_the_fleet_key(server, backend_env, monkeypatch,
                                                                            caplog):
    entry, files = _entry()
    _store().write_entry(entry, GROUP, files)
    monkeypatch.setenv("TRITONWARM_REDIS_KEY", FLEET_KEY)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert RedisBackend(entry).get([GROUP]) == {}
    [warned] = _warnings(caplog)
    assert f"entry {entry} refused" in warned and "not signed with the fleet key" in warned
    signed, signed_files = _entry(b"signed")
    _store(FLEET_KEY).write_entry(signed, GROUP, signed_files)
    backend = RedisBackend(signed)
    assert GROUP in backend.get([GROUP]) and backend.get(["k.cubin", "k.json"]) == signed_files


def test_the_backend_serves_the_local_cache_while_redis_is_away(server, backend_env, caplog):
    entry, files = _entry()
    (backend_env / entry).mkdir(parents=True)
    for name, data in files.items():
        (backend_env / entry / name).write_bytes(data)
    (backend_env / entry / GROUP).write_bytes(_triton_group(files))
    server.down = server.errors.ConnectionError("refused")
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        backend = RedisBackend(entry)
        assert backend.get([GROUP]) == {GROUP: _triton_group(files)}
        assert backend.get(["k.cubin", "k.json"]) == files
        assert backend.get(["k.ptx"]) == {}
    assert len(_warnings(caplog)) == 1


def test_the_backend_serves_a_group_it_fetched_before_from_the_local_cache_while_redis_is_away(server, backend_env):
    """What Triton's manager wrote locally is the group as Redis gave it (children by hash): no MAC can be
    checked without Redis, and the local cache is this machine's own."""
    entry, files = _entry()
    _store().write_entry(entry, GROUP, files)
    group = RedisBackend(entry).get([GROUP])[GROUP]
    (backend_env / entry).mkdir(parents=True)
    (backend_env / entry / GROUP).write_bytes(group)
    server.down = server.errors.ConnectionError("refused")
    assert RedisBackend(entry).get([GROUP]) == {GROUP: group}


def test_the_backend_refuses_a_binary_that_defines_another_kernel(server, backend_env, caplog):
    entry, files = _entry()
    _store().write_entry(entry, GROUP, {**files, "k.cubin": _elf_defining("silu_kernel")})
    backend = RedisBackend(entry)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        backend.get([GROUP])
        assert backend.get(["k.cubin", "k.json"]) == {}
    [warned] = _warnings(caplog)
    assert "its k.cubin defines kernel silu_kernel, not k that its metadata names" in warned


def test_the_backend_without_a_url_reads_the_local_cache(server, backend_env, monkeypatch):
    monkeypatch.delenv("TRITONWARM_REDIS_URL")
    entry, files = _entry()
    (backend_env / entry).mkdir(parents=True)
    (backend_env / entry / "k.json").write_bytes(files["k.json"])
    backend = RedisBackend(entry)
    assert backend.get(["k.json"]) == {"k.json": files["k.json"]}
    backend.put("k.ptx", b"ptx")  # nowhere to push: nothing happens
    assert server.commands == [] and server.clients == []


def test_the_backend_pushes_files_then_a_group_of_what_it_pushed(server, backend_env):
    entry, files = _entry()
    backend = RedisBackend(entry)
    for name, data in files.items():
        backend.put(name, data)
    assert _store().read_files(entry, ["k.cubin"]) == {"k.cubin": files["k.cubin"]}  # each file under its name
    backend.put("launcher.so", b"\x7fELF launcher")
    assert not any("launcher.so" in k for k in server.data)
    backend.put(GROUP, json.dumps({"child_paths": ["k.cubin", "k.json", "unknown.ptx"]}).encode())
    assert _store().entry_state(entry, GROUP) == ("missing", {})  # names a file it never pushed: not stored
    backend.put(GROUP, b"not json")
    assert _store().entry_state(entry, GROUP) == ("missing", {})
    backend.put(GROUP, _triton_group(files))
    assert _store().read_entry(entry, GROUP) == files
