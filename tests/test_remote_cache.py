"""The cache shared by a fleet: a real ``redis-server`` on the loopback, Triton's own runtime reading
through it, concurrent pushers, a server that goes away, damaged values and bad URLs."""

import errno
import json
import logging
import os
import shutil
import socket
import subprocess
import sys
import textwrap
import time

import pytest
from tritonwarm.cli import main
from tritonwarm.jit import TARGETS
from tritonwarm.jit.pipeline.plan import plan
from tritonwarm.jit.pipeline.specs import load_specs
from tritonwarm.jit.pipeline.warmup import warm

SPEC = """
kernel: tritonwarm.launchers.rms_norm:rms_norm
axes:
  dtype: [bfloat16, float16]
  fused: [false, true]
args:
  x: {tensor: [8, 4096], dtype: $dtype}
  weight: {tensor: [4096], dtype: $dtype}
  eps: 1.0e-6
  residual: {tensor: [8, 4096], dtype: $dtype, when: $fused}
"""
MANAGER = "tritonwarm.jit.cache.remote:RedisCacheManager"


def _needed(what: str, found: bool, install: str):
    """Absent outside CI: skip, saying how to get it; absent in CI (which installs it): fail."""
    if found:
        return
    if os.environ.get("CI") == "true":
        pytest.fail(f"{what} is not installed, and CI installs it ({install})")
    pytest.skip(f"{what} is not installed ({install})")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RedisServer:
    """A throw-away ``redis-server`` on 127.0.0.1: no persistence, its files in a temporary folder."""

    def __init__(self, binary: str, folder):
        self.binary, self.folder, self.proc, self.port = binary, folder, None, None

    def start(self, port: int | None = None) -> "RedisServer":
        import redis

        for _attempt in range(3):  # another process may take the free port first
            self.port = port or _free_port()
            self.proc = subprocess.Popen(
                [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                 "--dir", str(self.folder), "--loglevel", "warning"],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            client = redis.Redis(host="127.0.0.1", port=self.port, socket_connect_timeout=0.2)
            for _ in range(100):
                if self.proc.poll() is not None:
                    break
                try:
                    client.ping()
                    return self
                except redis.ConnectionError:
                    time.sleep(0.05)
            self.stop()
        raise RuntimeError("redis-server did not start on the loopback")

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}"

    def client(self, db: int = 0):
        import redis

        return redis.Redis(host="127.0.0.1", port=self.port, db=db)

    def stop(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
        if self.proc is not None:
            self.proc.wait(timeout=10)


@pytest.fixture
def redis_py():
    try:
        import redis  # noqa: F401
        have_client = True
    except ImportError:
        have_client = False
    _needed("the redis package", have_client, "pip install 'tritonwarm[redis]'")


@pytest.fixture
def redis_server(redis_py, tmp_path):
    binary = shutil.which("redis-server")
    _needed("redis-server", binary is not None, "apt-get install redis-server")
    folder = tmp_path / "redis"
    folder.mkdir()
    server = RedisServer(binary, folder).start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def warmed(tmp_path_factory):
    """Four rms_norm variants warmed for sm90 into a local cache: what a build machine pushes."""
    folder = tmp_path_factory.mktemp("warmed")
    spec = folder / "rms.yaml"
    spec.write_text(SPEC)
    cache = folder / "cache"
    the_plan = plan(load_specs([spec]), TARGETS["sm90"])
    assert warm(the_plan, cache).failed == 0
    return spec, cache, the_plan


def _store(server):
    from tritonwarm.jit.cache.remote import RedisStore

    return RedisStore(server.url)


def _push(server, warmed):
    from tritonwarm.jit.cache.remote import push

    _, cache, the_plan = warmed
    report = push(the_plan.variants.values(), cache, _store(server), "sm90")
    assert report.ok and len(report.pushed) == 4


def _uses_redis(monkeypatch, url, manager=MANAGER, backend=None):
    monkeypatch.setenv("TRITON_CACHE_MANAGER", manager)
    monkeypatch.setenv("TRITONWARM_REDIS_URL", url)
    if backend:
        monkeypatch.setenv("TRITON_REMOTE_CACHE_BACKEND", backend)


def _fake_entry(seed: bytes = b"k"):
    """An entry's folder name and files as Triton writes them: the metadata names its cache hash."""
    from tritonwarm.jit.cache.layout import entry_dir_name
    from tritonwarm.jit.cache.remote import sha256

    cache_hash = sha256(seed)
    return entry_dir_name(cache_hash), {"k.cubin": b"\x7fELF binary " + seed,
                                        "k.json": json.dumps({"name": "k", "hash": cache_hash}).encode()}


@pytest.mark.slow
def test_store_round_trip_and_damage_reads_as_a_miss(redis_server):
    from tritonwarm.jit.cache.remote import sha256

    store = _store(redis_server)
    entry, files = _fake_entry()
    store.write_entry(entry, "__grp__k.json", files)
    assert store.read_entry(entry, "__grp__k.json") == files
    assert store.read_files(entry, ["k.json", "absent"]) == {"k.json": files["k.json"]}
    assert store.entry_state("OTHER", "__grp__k.json") == ("missing", {})

    redis_server.client().set(f"tritonwarm:blob:{sha256(files['k.cubin'])}", b"\x7fELF bitrot")
    assert store.entry_state(entry, "__grp__k.json") == ("corrupt", {})
    assert store.read_entry(entry, "__grp__k.json") is None
    assert store.read_files(entry, ["k.cubin", "k.json"]) == {"k.json": files["k.json"]}

    redis_server.client().set(f"tritonwarm:file:{entry}:k.json", b"\xff not a digest")
    assert store.read_files(entry, ["k.json"]) == {}
    redis_server.client().delete(f"tritonwarm:blob:{sha256(files['k.json'])}")
    assert store.entry_state(entry, "__grp__k.json")[0] in ("missing", "corrupt")
    store.write_entry(entry, "__grp__k.json", files)  # pushing again repairs it
    assert store.read_entry(entry, "__grp__k.json") == files


# ------------------------------------------------------------------ hostile values in Redis


def _plant_group(server, entry, children: dict[str, bytes]):
    """A group naming ``children`` by hash, as a hostile writer of the Redis server would store it."""
    from tritonwarm.jit.cache.remote import sha256

    client = server.client()
    hashes = {name: sha256(data) for name, data in children.items()}
    group = json.dumps({"child_paths": hashes}).encode()
    for data in (*children.values(), group):
        client.set(f"tritonwarm:blob:{sha256(data)}", data)
    for name, digest in hashes.items():
        client.set(f"tritonwarm:file:{entry}:{name}", digest)
    client.set(f"tritonwarm:file:{entry}:__grp__k.json", sha256(group))


def _serving_lookup(monkeypatch, tmp_path, server, entry, manager):
    """Triton's lookup of the entry's group through the manager serving uses (ours, or Triton's own
    ``RemoteCacheManager`` with our backend), with an empty local cache."""
    from triton.runtime.cache import RemoteCacheManager
    from tritonwarm.jit.cache import remote

    monkeypatch.setattr(remote, "_fleet", {})
    _uses_redis(monkeypatch, server.url, *MANAGERS[manager])
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "serving"))  # read by Triton, never pinned
    return (remote.RedisCacheManager if manager == "ours" else RemoteCacheManager)(entry).get_group("k.json")


HOSTILE_NAMES = ["ABSOLUTE", "../../escaped", "sub/x", "", "..", "."]
MANAGERS = {"ours": (MANAGER, None),
            "triton's": ("triton.runtime.cache:RemoteCacheManager", "tritonwarm.jit.cache.remote:RedisBackend")}


@pytest.mark.slow
@pytest.mark.parametrize("manager", MANAGERS)
@pytest.mark.parametrize("name", HOSTILE_NAMES)
def test_a_group_child_that_is_no_plain_file_name_is_a_miss_with_one_warning(
        redis_server, tmp_path, monkeypatch, caplog, name, manager):
    """Triton writes each child at os.path.join(entry folder, name): an absolute name or one with '..'
    wrote the server's bytes anywhere, 'sub/x' or '' raised inside every lookup."""
    entry, files = _fake_entry()
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    name = str(victim) if name == "ABSOLUTE" else name
    _plant_group(redis_server, entry, {**files, name: b"attacker's bytes"})
    from tritonwarm.jit.cache import remote

    monkeypatch.setattr(remote, "_refused", set())
    with caplog.at_level(logging.WARNING, logger="tritonwarm.jit.cache.remote"):
        assert not _serving_lookup(monkeypatch, tmp_path, redis_server, entry, manager)
        assert not _serving_lookup(monkeypatch, tmp_path, redis_server, entry, manager)
    assert victim.read_text() == "precious"
    assert not list(tmp_path.rglob("escaped")) and not list(tmp_path.rglob("x"))
    warned = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    assert len(warned) == 1 and entry[:16] in warned[0] and "\n" not in warned[0]
    assert _store(redis_server).entry_state(entry, "__grp__k.json") == ("corrupt", {})


@pytest.mark.slow
def test_an_entry_holding_another_keys_files_is_refused_by_serving_and_by_check(
        warmed, redis_server, tmp_path, monkeypatch, caplog, capsys):
    """Entry B's key holds entry A's valid files (every hash agrees): Triton would load kernel A for B."""
    from tritonwarm.jit.cache.remote import _group_name, entry_files

    spec, cache, the_plan = warmed
    a, b = sorted(the_plan.variants.values(), key=lambda v: v.cache_hash)[:2]
    files = {name: open(path, "rb").read() for name, path in entry_files(cache, a.entry_dir, a.entry_name).items()}
    _store(redis_server).write_entry(b.entry_dir, _group_name(b), files)
    with caplog.at_level(logging.WARNING, logger="tritonwarm.jit.cache.remote"):
        from tritonwarm.jit.cache import remote
        monkeypatch.setattr(remote, "_fleet", {})
        _uses_redis(monkeypatch, redis_server.url)
        monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "serving"))  # read by Triton, never pinned
        assert remote.RedisCacheManager(b.entry_dir).get_group(f"{b.entry_name}.json") is None
    assert any("another kernel's files" in r.getMessage() for r in caplog.records)
    assert not (tmp_path / "serving" / b.entry_dir).exists() or not list((tmp_path / "serving" / b.entry_dir).iterdir())
    monkeypatch.delenv("TRITON_CACHE_MANAGER")
    assert main(["check", str(spec), "--target", "sm90", "--remote", redis_server.url]) == 1
    out = capsys.readouterr().out
    assert "  corrupt: 1 variant of rms_norm_kernel (" in out and "another kernel's files" in out, out
    assert main(["check", str(spec), "--target", "sm90", "--remote", redis_server.url, "--verbose"]) == 1
    out = capsys.readouterr().out
    assert f"corrupt  {b.variant_id}" in out and "another kernel's files" in out


@pytest.mark.slow
def test_a_host_library_is_never_fetched_from_redis(redis_server, tmp_path, monkeypatch):
    """A C module (Triton's launcher, cuda_utils) is loaded into the serving process: Redis cannot
    vouch for it, so it is built locally, never fetched."""
    from tritonwarm.jit.cache import remote

    entry, _ = _fake_entry()
    name = "__triton_launcher.cpython-312-x86_64-linux-gnu.so"
    _store(redis_server).write_files(entry, {name: b"\x7fELF planted"})
    monkeypatch.setattr(remote, "_fleet", {})
    _uses_redis(monkeypatch, redis_server.url)
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "serving"))  # read by Triton, never pinned
    assert remote.RedisCacheManager(entry).get_file(name) is None
    assert not list(tmp_path.rglob("*.so"))


@pytest.mark.parametrize("url", ["redis://user:s3cr3t@127.0.0.1:port/0", "redis://:s3cr3t@/0",
                                 "redis://u:s3cr3t@host:6379/zero", "http://u:s3cr3t@host", "redis://:pa@s3cr3t@h:x",
                                 "redis://u:s3cr3t#@host:1/0", "redis://:s3cr3t/@host:bad"])
def test_a_password_is_masked_in_every_message_even_in_a_malformed_url(tmp_path, capsys, monkeypatch, caplog, url):
    from tritonwarm.jit.cache import remote

    spec = tmp_path / "rms.yaml"
    spec.write_text(SPEC)
    assert main(["check", str(spec), "--target", "sm90", "--remote", url]) == 2
    err = capsys.readouterr().err
    assert "s3cr3t" not in err and "***" in err and err.count("\n") == 1
    monkeypatch.setattr(remote, "_fleet", {})
    monkeypatch.setenv("TRITONWARM_REDIS_URL", url)
    with caplog.at_level(logging.WARNING, logger="tritonwarm.jit.cache.remote"):
        assert remote.fleet_cache().call(lambda store: store.ping()) is None
    assert caplog.records and not any("s3cr3t" in r.getMessage() for r in caplog.records)


@pytest.mark.slow
def test_serving_uses_redis_again_once_it_is_back(redis_server, monkeypatch, caplog):
    from tritonwarm.jit.cache import remote

    monkeypatch.setattr(remote, "RETRY_AFTER_S", 0.0)
    monkeypatch.setenv("TRITONWARM_REDIS_URL", redis_server.url)
    shared = remote.fleet_cache()
    assert shared.call(lambda store: store.ping() or "up") == "up"
    redis_server.stop()
    with caplog.at_level(logging.WARNING, logger="tritonwarm.jit.cache.remote"):
        assert shared.call(lambda store: store.ping() or "up") is None
        assert shared.call(lambda store: store.ping() or "up") is None
    assert sum("shared Triton cache unusable" in r.getMessage() for r in caplog.records) == 1
    redis_server.start(redis_server.port)
    assert shared.call(lambda store: store.ping() or "up") == "up"


@pytest.mark.slow
@pytest.mark.parametrize("url, says", [
    ("http://127.0.0.1:6379", "expected redis://HOST:PORT[/DB]"),
    ("redis://127.0.0.1:port", "bad Redis URL"),
    ("redis://127.0.0.1:6379/zero", "the database after '/' must be a number"),
    ("redis://", "expected redis://HOST:PORT[/DB]"),
])
def test_bad_url_is_one_line_and_exit_2(tmp_path, capsys, url, says):
    spec = tmp_path / "rms.yaml"
    spec.write_text(SPEC)
    assert main(["check", str(spec), "--target", "sm90", "--remote", url]) == 2
    err = capsys.readouterr().err
    assert says in err and err.count("\n") == 1 and "Traceback" not in err
    assert main(["warmup", str(spec), "--target", "sm90", "--cache-dir", str(tmp_path / "c"), "--push", url]) == 2
    assert not (tmp_path / "c").exists()  # refused before compiling anything


def test_unreachable_server_is_one_line_and_exit_2(redis_py, tmp_path, capsys):
    spec = tmp_path / "rms.yaml"
    spec.write_text(SPEC)
    started = time.monotonic()
    assert main(["check", str(spec), "--target", "sm90", "--remote", f"redis://127.0.0.1:{_free_port()}"]) == 2
    err = capsys.readouterr().err
    assert "cannot reach Redis at redis://127.0.0.1:" in err and err.count("\n") == 1
    assert time.monotonic() - started < 30


@pytest.mark.slow
def test_warmup_pushes_and_check_remote_finds_every_variant(warmed, redis_server, capsys):
    spec, cache, the_plan = warmed
    url = redis_server.url + "/2"
    assert main(["check", str(spec), "--target", "sm90", "--remote", url]) == 1
    assert "4 missing" in capsys.readouterr().out

    assert main(["warmup", str(spec), "--target", "sm90", "--cache-dir", str(cache), "--jobs", "1",
                 "--push", url]) == 0
    assert "4 pushed, 0 already there" in capsys.readouterr().out
    assert main(["check", str(spec), "--target", "sm90", "--remote", url, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)["targets"][0]
    assert sorted(report["present"]) == sorted(v.variant_id for v in the_plan.variants.values())
    assert main(["warmup", str(spec), "--target", "sm90", "--cache-dir", str(cache), "--jobs", "1",
                 "--push", url]) == 0
    assert "0 pushed, 4 already there" in capsys.readouterr().out

    from tritonwarm.jit.cache.remote import sha256

    client = redis_server.client(db=2)
    [cubin_key] = [k for k in client.keys("tritonwarm:file:*.cubin")][:1]
    client.set(b"tritonwarm:blob:" + client.get(cubin_key), b"not the cubin")
    assert main(["check", str(spec), "--target", "sm90", "--remote", url]) == 1
    out = capsys.readouterr().out
    assert "1 corrupt" in out and "3 present" in out
    assert sha256(b"not the cubin") not in out


@pytest.mark.slow
@pytest.mark.parametrize("manager, backend", [
    (MANAGER, None),
    ("triton.runtime.cache:RemoteCacheManager", "tritonwarm.jit.cache.remote:RedisBackend"),
], ids=["RedisCacheManager", "triton-RemoteCacheManager"])
def test_runtime_reads_through_redis_and_compiles_nothing(warmed, redis_server, tmp_path, monkeypatch, manager,
                                                          backend, compile_counter, rms_norm_runtime):
    _push(redis_server, warmed)
    _uses_redis(monkeypatch, redis_server.url, manager, backend)
    empty = tmp_path / "serving"
    for fused in (False, True):
        rms_norm_runtime(TARGETS["sm90"], empty, 8, fused)
    assert compile_counter.count == 0
    assert len(list(empty.glob("*/*.cubin"))) == 2  # written through to the local cache


@pytest.mark.slow
def test_a_fleet_server_whose_local_cache_is_read_only_fetches_into_the_overlay(
        warmed, redis_server, tmp_path, monkeypatch, compile_counter, rms_norm_runtime, read_only_mount):
    _push(redis_server, warmed)
    _uses_redis(monkeypatch, redis_server.url)
    image_cache = tmp_path / "image-cache"  # baked into an image served with a read-only root file system
    image_cache.mkdir()
    overlay = tmp_path / "overlay"
    monkeypatch.setenv("TRITONWARM_OVERLAY_DIR", str(overlay))
    with read_only_mount(image_cache, tmp_path / "ro") as local:
        for fused in (False, True):
            rms_norm_runtime(TARGETS["sm90"], local, 8, fused)
        assert compile_counter.count == 0
        assert len(list(overlay.glob("*/*.cubin"))) == 2 and not any(local.iterdir())
        redis_server.client().flushall()  # later lookups are local: the overlay
        rms_norm_runtime(TARGETS["sm90"], local, 8, False)
        assert compile_counter.count == 0


@pytest.mark.slow
def test_tritons_remote_manager_fails_every_lookup_on_a_read_only_local_cache_and_check_says_so(
        warmed, redis_server, tmp_path, monkeypatch, rms_norm_runtime, read_only_mount):
    from tritonwarm.jit.cache.overlay import misses_fail_here

    _push(redis_server, warmed)
    _uses_redis(monkeypatch, redis_server.url, "triton.runtime.cache:RemoteCacheManager",
                "tritonwarm.jit.cache.remote:RedisBackend")
    with read_only_mount(warmed[1], tmp_path / "ro") as local:  # every entry is there, and in Redis
        with pytest.raises(OSError) as failed:  # it writes what Redis returns into the folder, hit or not
            rms_norm_runtime(TARGETS["sm90"], local, 8, False)
        assert failed.value.errno == errno.EROFS
        assert "Triton's RemoteCacheManager writes every entry it reads into this folder" in misses_fail_here(local)
        monkeypatch.setenv("TRITONWARM_OVERLAY_DIR", str(tmp_path / "overlay"))  # no help: it is not ours
        assert "every lookup fails" in misses_fail_here(local)


@pytest.mark.slow
def test_later_lookups_are_local(warmed, redis_server, tmp_path, monkeypatch, compile_counter, rms_norm_runtime):
    _push(redis_server, warmed)
    _uses_redis(monkeypatch, redis_server.url)
    serving = tmp_path / "serving"
    rms_norm_runtime(TARGETS["sm90"], serving, 8, False)
    redis_server.client().flushall()  # the fleet's cache forgets everything: this machine still has it
    rms_norm_runtime(TARGETS["sm90"], serving, 8, False)
    assert compile_counter.count == 0
    monkeypatch.delenv("TRITON_CACHE_MANAGER")  # Triton's plain FileCacheManager reads what was written through
    rms_norm_runtime(TARGETS["sm90"], serving, 8, False)
    assert compile_counter.count == 0


@pytest.mark.slow
def test_corrupt_value_is_a_miss_and_a_recompile(warmed, redis_server, tmp_path, monkeypatch, compile_counter,
                                                 rms_norm_runtime):
    _push(redis_server, warmed)
    client = redis_server.client()
    for key in client.keys("tritonwarm:file:*.cubin"):
        client.set(b"tritonwarm:blob:" + client.get(key), b"\x7fELF truncated")
    _uses_redis(monkeypatch, redis_server.url)
    serving = tmp_path / "serving"
    rms_norm_runtime(TARGETS["sm90"], serving, 8, False)
    assert compile_counter.count == 1
    assert all(p.read_bytes() != b"\x7fELF truncated" for p in serving.glob("*/*.cubin"))
    from tritonwarm.jit.cache.remote import check_remote

    report = check_remote(warmed[2].variants.values(), _store(redis_server), "sm90")
    assert len(report.present) == 1 and len(report.corrupt) == 3  # the recompile pushed a sound entry


def test_bad_url_while_serving_warns_once_and_compiles_locally(tmp_path, monkeypatch, caplog, compile_counter,
                                                               rms_norm_runtime):
    _uses_redis(monkeypatch, "http://not-redis")
    with caplog.at_level(logging.WARNING, logger="tritonwarm.jit.cache.remote"):
        rms_norm_runtime(TARGETS["sm90"], tmp_path / "serving", 8, False)
        rms_norm_runtime(TARGETS["sm90"], tmp_path / "serving", 8, False)
    assert compile_counter.count == 1
    warnings = [r for r in caplog.records if "shared Triton cache unusable" in r.getMessage()]
    assert len(warnings) == 1 and "bad Redis URL" in warnings[0].getMessage()


SERVE = textwrap.dedent("""
    import json, os, signal, sys, time
    from triton.compiler import compiler
    compiles = [0]
    make_ir = compiler.ASTSource.make_ir
    def counting(src, *args, **kwargs):
        compiles[0] += 1
        return make_ir(src, *args, **kwargs)
    compiler.ASTSource.make_ir = counting
    import torch
    from tritonwarm.jit import TARGETS, fake_tensor
    from tritonwarm.jit.core.targets import target_driver
    from tritonwarm.launchers.rms_norm import rms_norm_jit, rms_norm_launch

    def launch(dtype, fused):
        fake = lambda *shape: fake_tensor(shape, getattr(torch, dtype))
        call = rms_norm_launch(fake(8, 4096), fake(4096), fake(8, 4096), 1e-6, fake(8, 4096) if fused else None)
        with target_driver(TARGETS["sm90"]) as driver:
            try:
                rms_norm_jit.fake_run(call)  # Triton's own JITFunction.run
            finally:
                rms_norm_jit.jit_function.device_caches.pop(driver.device, None)

    counts = []
    for step in sys.argv[1:]:
        if step.startswith("kill:"):
            os.kill(int(step[5:]), signal.SIGKILL)
            continue
        before = compiles[0]
        dtype, fused = step.split(",")
        launch(dtype, fused == "fused")
        counts.append(compiles[0] - before)
    print(json.dumps(counts))
""")


def _serve(tmp_path, url, *steps):
    """A fresh serving process: only environment variables point its Triton at the shared cache."""
    script = tmp_path / "serve.py"
    script.write_text(SERVE)
    env = {**os.environ, "TRITON_CACHE_DIR": str(tmp_path / "serving"), "TRITON_CACHE_MANAGER": MANAGER,
           "TRITONWARM_REDIS_URL": url}
    proc = subprocess.run([sys.executable, str(script), *steps], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1]), proc.stderr


@pytest.mark.slow
def test_fresh_process_with_empty_cache_reads_every_entry_from_redis(warmed, redis_server, tmp_path):
    _push(redis_server, warmed)
    steps = [f"{d},{f}" for d in ("bfloat16", "float16") for f in ("plain", "fused")]
    counts, stderr = _serve(tmp_path, redis_server.url, *steps)
    assert counts == [0, 0, 0, 0], stderr
    assert len(list((tmp_path / "serving").glob("*/*.cubin"))) == 4


@pytest.mark.slow
def test_server_killed_mid_run_falls_back_with_one_warning(warmed, redis_server, tmp_path):
    _push(redis_server, warmed)
    counts, stderr = _serve(tmp_path, redis_server.url, "bfloat16,plain", f"kill:{redis_server.proc.pid}",
                            "bfloat16,plain", "bfloat16,fused", "float16,plain", "float16,fused")
    # Fetched before the kill: served locally after it. The rest compile locally, with one warning in all.
    assert counts == [0, 0, 1, 1, 1], stderr
    assert stderr.count("shared Triton cache unusable") == 1, stderr
    assert "Traceback" not in stderr


PUSHER = textwrap.dedent("""
    import hashlib, json, os, sys, time
    from tritonwarm.jit.cache.layout import entry_dir_name
    from tritonwarm.jit.cache.remote import RedisStore
    url, me, go = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    store = RedisStore(url, timeout=10)

    def entry(seed):  # an entry folder and metadata naming its hash, as Triton writes them
        cache_hash = hashlib.sha256(seed.encode()).hexdigest()
        return entry_dir_name(cache_hash), cache_hash

    def meta(cache_hash, text):
        return json.dumps({"hash": cache_hash, "from": text}).encode()

    for _ in range(600):  # start together
        if os.path.exists(go):
            break
        time.sleep(0.01)
    shared, shared_hash = entry("shared")
    for i in range(40):
        own, own_hash = entry(f"own {me} {i}")
        store.write_entry(own, "__grp__k.json", {"k.cubin": f"cubin {me} {i}".encode() * 50,
                                                 "k.json": meta(own_hash, f"{me} {i}")})
        store.write_entry(shared, "__grp__k.json", {"k.cubin": f"cubin from {me}".encode() * 50,
                                                    "k.json": meta(shared_hash, str(me))})
""")


@pytest.mark.slow
def test_eight_concurrent_pushers_lose_nothing(redis_server, tmp_path):
    script = tmp_path / "pusher.py"
    script.write_text(PUSHER)
    go = tmp_path / "go"
    pushers = [subprocess.Popen([sys.executable, str(script), redis_server.url, str(me), str(go)],
                                stderr=subprocess.PIPE, text=True) for me in range(8)]
    time.sleep(1.0)
    go.touch()
    for p in pushers:
        assert p.wait(timeout=300) == 0, p.stderr.read()
    from tritonwarm.jit.cache.layout import entry_dir_name
    from tritonwarm.jit.cache.remote import sha256

    def meta(cache_hash, text):
        return json.dumps({"hash": cache_hash, "from": text}).encode()

    store = _store(redis_server)
    for me in range(8):
        for i in range(40):
            own_hash = sha256(f"own {me} {i}".encode())
            assert store.read_entry(entry_dir_name(own_hash), "__grp__k.json") == {
                "k.cubin": f"cubin {me} {i}".encode() * 50, "k.json": meta(own_hash, f"{me} {i}")}
    shared_hash = sha256(b"shared")
    shared = store.read_entry(entry_dir_name(shared_hash), "__grp__k.json")
    winner = json.loads(shared["k.json"])["from"]  # one pusher's complete entry, never a mix
    assert shared == {"k.cubin": f"cubin from {winner}".encode() * 50, "k.json": meta(shared_hash, winner)}


@pytest.mark.slow
def test_triton_manager_with_redis_away_serves_the_local_cache(redis_py, tmp_path, monkeypatch, caplog, compile_counter,
                                                               rms_norm_runtime):
    spec = tmp_path / "rms.yaml"
    spec.write_text(SPEC.replace("[bfloat16, float16]", "[bfloat16]").replace("[false, true]", "[false]"))
    local = tmp_path / "local"
    assert warm(plan(load_specs([spec]), TARGETS["sm90"]), local).compiled == 1
    before = compile_counter.count
    _uses_redis(monkeypatch, f"redis://127.0.0.1:{_free_port()}", "triton.runtime.cache:RemoteCacheManager",
                "tritonwarm.jit.cache.remote:RedisBackend")
    with caplog.at_level(logging.WARNING, logger="tritonwarm.jit.cache.remote"):
        rms_norm_runtime(TARGETS["sm90"], local, 8, False)
        rms_norm_runtime(TARGETS["sm90"], local, 8, False)
    assert compile_counter.count == before
    assert sum("shared Triton cache unusable" in r.getMessage() for r in caplog.records) == 1


@pytest.mark.slow
def test_the_monitor_counts_what_the_fleet_serves_as_hits(warmed, redis_server, tmp_path, monkeypatch):
    """A launch missing locally is no miss while Redis holds it: Triton's RedisCacheManager fetches it at
    the lookup the monitor judges, so the monitor fetches it first (under ``error`` it used to refuse)."""
    import torch
    from tritonwarm.jit.serving.monitor import DispatchMonitor, JitPolicyError
    from tritonwarm.launchers.rms_norm import rms_norm

    x, weight = torch.empty(8, 4096, dtype=torch.bfloat16, device="meta"), torch.empty(4096, dtype=torch.bfloat16,
                                                                                      device="meta")
    serving = tmp_path / "serving"
    _uses_redis(monkeypatch, redis_server.url)
    with pytest.raises(JitPolicyError, match="would compile at serving time"):  # Redis is empty yet
        with DispatchMonitor(serving, "error").dry_run(TARGETS["sm90"]):
            rms_norm(x, weight)
    _push(redis_server, warmed)
    monitor = DispatchMonitor(serving, "error")
    with monitor.dry_run(TARGETS["sm90"]):
        rms_norm(x, weight)
    assert (monitor.hits, len(monitor.misses)) == (1, 0)
    assert len(list(serving.glob("*/*.cubin"))) == 1  # written through, as the manager writes it


@pytest.mark.slow
def test_an_engine_starts_on_a_fleet_server_with_an_empty_local_cache(redis_server, tmp_path, monkeypatch):
    """``--jit-policy error`` on a serving machine that reads through Redis: start-up fetches the
    engine's plan from the fleet (what its first lookups would do), then checks it and serves."""
    from tritonwarm.engine.config import ENGINES
    from tritonwarm.engine.plan import engine_plan
    from tritonwarm.engine.runner import make_workload, serve
    from tritonwarm.jit.cache.remote import push

    tiny, target = ENGINES["tiny"], TARGETS["sm90"]
    the_plan = engine_plan(tiny, target)
    assert warm(the_plan, tmp_path / "build").failed == 0
    assert push(the_plan.variants.values(), tmp_path / "build", _store(redis_server), "sm90").ok
    _uses_redis(monkeypatch, redis_server.url)
    report = serve(tiny, make_workload(tiny, 4, 4, seed=0), policy="error", dry_run_target="sm90",
                   cache_dir=tmp_path / "serving")
    assert report.serve_compiles == 0 and report.monitor.hits and not report.monitor.misses


@pytest.mark.slow
def test_check_counts_what_the_fleet_holds_as_served(warmed, redis_server, tmp_path, monkeypatch, capsys):
    """On a machine reading through Redis, an entry missing locally but intact in Redis is served (Triton
    fetches it at its first lookup): ``check`` says so, read-only, instead of failing on it."""
    from tritonwarm.jit.pipeline.check import check

    spec, _, the_plan = warmed
    _push(redis_server, warmed)
    serving = tmp_path / "serving"
    assert len(check(the_plan, serving).missing) == 4  # not reading through Redis: all missing
    _uses_redis(monkeypatch, redis_server.url)
    report = check(the_plan, serving)
    assert report.ok and (len(report.missing), len(report.from_fleet)) == (0, 4)
    assert not serving.exists() or not list(serving.glob("*/*.cubin"))  # nothing fetched by a check
    redis_server.client().delete(*redis_server.client().keys("tritonwarm:file:*:__grp__*")[:1])  # one entry gone
    assert len(check(the_plan, serving).missing) == 1
    assert main(["check", str(spec), "--target", "sm90", "--cache-dir", str(serving)]) == 1
    assert "3 not in the local cache but in the shared cache, intact" in capsys.readouterr().out


# ------------------------------------------------------------------ the fleet key: a hostile writer of Redis

FLEET_KEY = "0123456789abcdef" * 4  # 64 characters


def _entry_bytes(cache, variant):
    from tritonwarm.jit.cache.remote import entry_files

    return {name: open(path, "rb").read() for name, path in entry_files(cache, variant.entry_dir,
                                                                        variant.entry_name).items()}


def _delete_half(client, cache, a, b):
    keys = sorted(client.keys("tritonwarm:*"))
    client.delete(*keys[::2])


def _child_not_stored(client, cache, a, b):
    from tritonwarm.jit.cache.remote import sha256

    cubin = next(d for n, d in _entry_bytes(cache, a).items() if n.endswith(".cubin"))
    client.delete(f"tritonwarm:blob:{sha256(cubin)}")


def _blob_replaced(client, cache, a, b):
    from tritonwarm.jit.cache.remote import sha256

    cubin = next(d for n, d in _entry_bytes(cache, a).items() if n.endswith(".cubin"))
    client.set(f"tritonwarm:blob:{sha256(cubin)}", b"\x7fELF other bytes")


def _repointed(client, cache, a, b):
    """Entry A's key holds B's files, metadata too, written without the fleet key."""
    from tritonwarm.jit.cache.remote import RedisStore, _group_name

    port = client.connection_pool.connection_kwargs["port"]
    RedisStore(f"redis://127.0.0.1:{port}", key=None).write_entry(a.entry_dir, _group_name(a), _entry_bytes(cache, b))


def _cubin_swapped(client, cache, a, b):
    """A's cubin swapped for B's valid cubin, A's group rewritten to name it (keeping its MAC, if it had
    one), A's metadata kept: every hash agrees, and both cubins define the same kernel."""
    from tritonwarm.jit.cache.remote import _group_name, sha256

    b_cubin = next(d for n, d in _entry_bytes(cache, b).items() if n.endswith(".cubin"))
    group_key = f"tritonwarm:file:{a.entry_dir}:{_group_name(a)}"
    group = json.loads(client.get(b"tritonwarm:blob:" + client.get(group_key)))
    name = next(n for n in group["child_paths"] if n.endswith(".cubin"))
    group["child_paths"][name] = sha256(b_cubin)
    data = json.dumps(group, sort_keys=True).encode()
    client.set(f"tritonwarm:blob:{sha256(data)}", data)
    client.set(f"tritonwarm:file:{a.entry_dir}:{name}", sha256(b_cubin))
    client.set(group_key, sha256(data))


# The table: Redis damaged before any server runs → what `check --remote` says, then what a
# serving process hits and compiles (of the 4 variants), then `check --remote` again (self-healing).
# (check says, server compiles, warnings) without the fleet key / with it; None: as many as check found missing.
FLEET_TABLE = {
    "half of all keys deleted": (_delete_half, ("missing", None, 0), ("missing", None, 0)),
    "a group naming a child hash that is not stored": (_child_not_stored, ("missing", 1, 0), ("missing", 1, 0)),
    "a blob replaced by other bytes": (_blob_replaced, ("corrupt", 1, 0), ("corrupt", 1, 0)),
    "an entry repointed at another variant's files, metadata too": (_repointed, ("corrupt", 1, 1),
                                                                    ("forged", 1, 1)),
    "one entry's cubin swapped for another variant's valid cubin": (_cubin_swapped, (None, 0, 0), ("forged", 1, 1)),
}


@pytest.mark.slow
@pytest.mark.parametrize("keyed", [False, True], ids=["no key", "fleet key"])
@pytest.mark.parametrize("row", FLEET_TABLE)
def test_redis_damaged_before_a_server_runs(warmed, redis_server, tmp_path, monkeypatch, caplog, capsys,
                                            compile_counter, rms_norm_runtime, row, keyed):
    """Each row: ``check --remote`` counts the damage, a server compiles exactly what it refuses (with
    one warning where Redis says something false), pushes it, and Redis is whole again. Without a fleet
    key the swapped cubin goes unseen, and ``check --remote`` says it is unauthenticated."""
    import torch
    from tritonwarm.jit.cache import remote

    damage, unkeyed, with_key = FLEET_TABLE[row]
    state, compiles, warnings = with_key if keyed else unkeyed
    if keyed:
        monkeypatch.setenv("TRITONWARM_REDIS_KEY", FLEET_KEY)
    spec, cache, the_plan = warmed
    _push(redis_server, warmed)
    a, b = sorted(the_plan.variants.values(), key=lambda v: v.cache_hash)[:2]
    damage(redis_server.client(), cache, a, b)

    assert main(["check", str(spec), "--target", "sm90", "--remote", redis_server.url, "--json"]) == (1 if state else 0)
    report = json.loads(capsys.readouterr().out)["targets"][0]
    found = {s: len(report[s]) for s in ("missing", "corrupt", "forged")}
    assert sum(found.values()) == (found[state] if state else 0) and (found[state] >= 1 if state else True), found
    if compiles is None:
        compiles = found[state]
    if state == "corrupt" and warnings:
        assert "another kernel's files" in report["corrupt"][0]["why"]
    assert report["key_id"] == (remote.fleet_key().key_id if keyed else None)

    monkeypatch.setattr(remote, "_fleet", {})
    monkeypatch.setattr(remote, "_refused", set())
    monkeypatch.setattr(remote, "_forged_warned", [])
    _uses_redis(monkeypatch, redis_server.url)
    with caplog.at_level(logging.WARNING, logger="tritonwarm.jit.cache.remote"):
        for dtype in (torch.bfloat16, torch.float16):
            for fused in (False, True):
                rms_norm_runtime(TARGETS["sm90"], tmp_path / "serving", 8, fused, dtype)
    assert compile_counter.count == compiles
    assert sum("refused" in r.getMessage() for r in caplog.records) == warnings, caplog.text

    monkeypatch.delenv("TRITON_CACHE_MANAGER")  # the server is done: Redis is whole again
    assert main(["check", str(spec), "--target", "sm90", "--remote", redis_server.url]) == 0
    verdict = capsys.readouterr().out.splitlines()[0]
    assert "ok" in verdict and ("authenticated with fleet key" if keyed else "unauthenticated") in verdict, verdict


def test_a_binary_is_checked_against_the_kernel_and_warps_its_metadata_names(warmed):
    """Read from the ELF itself: the cubin defines the metadata's kernel, built for its warps."""
    from tritonwarm.jit.cache.binary import binary_facts, binary_problem

    _, cache, the_plan = warmed
    variant = next(iter(the_plan.variants.values()))
    files = _entry_bytes(cache, variant)
    metadata_name = f"{variant.entry_name}.json"
    metadata = json.loads(files[metadata_name])
    cubin = next(d for n, d in files.items() if n.endswith(".cubin"))
    facts = binary_facts(cubin, metadata["name"])
    assert metadata["name"] in facts["functions"] and facts["threads"] == metadata["num_warps"] * 32
    assert facts["registers"] > 0
    assert binary_problem(files, metadata_name) is None

    def said(**changed):
        return binary_problem({**files, metadata_name: json.dumps({**metadata, **changed}).encode()}, metadata_name)

    assert "another kernel's binary" in said(name="_silu_and_mul_kernel")
    assert "another variant's binary" in said(num_warps=metadata["num_warps"] * 2)
    assert "over the maxnreg" in said(maxnreg=facts["registers"] - 8)
    assert said(maxnreg=facts["registers"]) is None


@pytest.mark.slow
def test_another_kernels_cubin_under_intact_metadata_is_refused_without_a_key(
        warmed, redis_server, tmp_path, monkeypatch, caplog, capsys, compile_counter, rms_norm_runtime):
    """The cheap identity check: a silu_and_mul cubin swapped into an rms_norm entry (group rewritten,
    metadata kept) is another kernel's binary, refused by serving and by ``check --remote``."""
    import torch
    from tritonwarm.jit.cache import remote
    from tritonwarm.jit.cache.remote import _group_name, sha256

    spec, cache, the_plan = warmed
    silu_spec = tmp_path / "silu.yaml"
    silu_spec.write_text("launcher: tritonwarm.launchers.activation:silu_and_mul\naxes: {}\n"
                         "args: [{tensor: [8, 2816], dtype: bfloat16}]\n")
    silu_plan = plan(load_specs([silu_spec]), TARGETS["sm90"])
    assert warm(silu_plan, tmp_path / "silu").failed == 0
    silu_cubin = next(d for n, d in _entry_bytes(tmp_path / "silu", next(iter(silu_plan.variants.values()))).items()
                      if n.endswith(".cubin"))
    _push(redis_server, warmed)
    a = min(the_plan.variants.values(), key=lambda v: v.cache_hash)
    files = _entry_bytes(cache, a)
    name = next(n for n in files if n.endswith(".cubin"))
    _store(redis_server).write_entry(a.entry_dir, _group_name(a), {**files, name: silu_cubin})
    assert sha256(silu_cubin) != sha256(files[name])

    assert main(["check", str(spec), "--target", "sm90", "--remote", redis_server.url]) == 1
    out = capsys.readouterr().out
    assert "1 corrupt" in out and "another kernel's binary" in out and "unauthenticated" in out
    monkeypatch.setattr(remote, "_fleet", {})
    monkeypatch.setattr(remote, "_refused", set())
    _uses_redis(monkeypatch, redis_server.url)
    before = compile_counter.count
    with caplog.at_level(logging.WARNING, logger="tritonwarm.jit.cache.remote"):
        for dtype in (torch.bfloat16, torch.float16):
            for fused in (False, True):
                rms_norm_runtime(TARGETS["sm90"], tmp_path / "serving", 8, fused, dtype)
    assert compile_counter.count - before == 1
    assert sum("another kernel's binary" in r.getMessage() for r in caplog.records) == 1


def test_the_fleet_key_comes_from_one_variable_or_a_file_beside_the_url(tmp_path, monkeypatch):
    from tritonwarm.jit.cache.fleet_key import FleetKeyError, fleet_key

    monkeypatch.delenv("TRITONWARM_REDIS_KEY", raising=False)
    monkeypatch.delenv("TRITONWARM_REDIS_KEY_FILE", raising=False)
    assert fleet_key() is None
    monkeypatch.setenv("TRITONWARM_REDIS_KEY", FLEET_KEY)
    from_variable = fleet_key()
    key_file = tmp_path / "fleet.key"
    key_file.write_text(FLEET_KEY + "\n")
    monkeypatch.setenv("TRITONWARM_REDIS_KEY_FILE", str(key_file))
    with pytest.raises(FleetKeyError, match="give the fleet key once"):
        fleet_key()
    monkeypatch.delenv("TRITONWARM_REDIS_KEY")
    from_file = fleet_key()
    assert from_file.key_id == from_variable.key_id
    tag = from_file.tag("ENTRY", "k.cubin", "a" * 64)
    assert from_variable.problem(tag, "ENTRY", "k.cubin", "a" * 64) is None
    assert "does not verify" in from_file.problem(tag, "OTHER", "k.cubin", "a" * 64)  # bound to the entry
    assert "does not verify" in from_file.problem(tag, "ENTRY", "k.cubin", "b" * 64)  # ... and to the bytes
    assert "no MAC" in from_file.problem(None, "ENTRY", "k.cubin", "a" * 64)
    key_file.write_text("short")
    with pytest.raises(FleetKeyError, match="fewer than 32"):
        fleet_key()
    key_file.write_text("another key of enough characters for a fleet, 0123456789")
    assert "another fleet key" in fleet_key().problem(tag, "ENTRY", "k.cubin", "a" * 64)
    monkeypatch.setenv("TRITONWARM_REDIS_KEY_FILE", str(tmp_path / "absent.key"))
    with pytest.raises(FleetKeyError, match="cannot read the fleet key"):
        fleet_key()


def test_a_bad_fleet_key_is_one_line_on_the_command_line_and_local_only_while_serving(
        redis_py, tmp_path, monkeypatch, capsys, caplog):
    from tritonwarm.jit.cache import remote

    spec = tmp_path / "rms.yaml"
    spec.write_text(SPEC)
    monkeypatch.setenv("TRITONWARM_REDIS_KEY", "short")
    assert main(["check", str(spec), "--target", "sm90", "--remote", f"redis://127.0.0.1:{_free_port()}"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "TRITONWARM_REDIS_KEY: the fleet key has 5 characters" in err
    monkeypatch.setattr(remote, "_fleet", {})
    monkeypatch.setenv("TRITONWARM_REDIS_URL", f"redis://127.0.0.1:{_free_port()}")
    with caplog.at_level(logging.WARNING, logger="tritonwarm.jit.cache.remote"):
        assert remote.fleet_cache().call(lambda store: "used") is None
        assert remote.fleet_cache().call(lambda store: "used") is None
    warned = [r.getMessage() for r in caplog.records if "shared Triton cache unusable" in r.getMessage()]
    assert len(warned) == 1 and "fewer than 32" in warned[0]


@pytest.mark.slow
def test_tritons_remote_manager_refuses_the_swapped_cubin_with_a_fleet_key(
        warmed, redis_server, tmp_path, monkeypatch, caplog, compile_counter, rms_norm_runtime):
    """The same MAC check behind Triton's own RemoteCacheManager (RedisBackend)."""
    import torch
    from tritonwarm.jit.cache import remote

    monkeypatch.setenv("TRITONWARM_REDIS_KEY", FLEET_KEY)
    _push(redis_server, warmed)
    a, b = sorted(warmed[2].variants.values(), key=lambda v: v.cache_hash)[:2]
    _cubin_swapped(redis_server.client(), warmed[1], a, b)
    monkeypatch.setattr(remote, "_fleet", {})
    monkeypatch.setattr(remote, "_forged_warned", [])
    _uses_redis(monkeypatch, redis_server.url, *MANAGERS["triton's"])
    with caplog.at_level(logging.WARNING, logger="tritonwarm.jit.cache.remote"):
        for dtype in (torch.bfloat16, torch.float16):
            for fused in (False, True):
                rms_norm_runtime(TARGETS["sm90"], tmp_path / "serving", 8, fused, dtype)
    assert compile_counter.count == 1
    assert sum("fleet key" in r.getMessage() for r in caplog.records) == 1
    report = remote.check_remote(warmed[2].variants.values(), _store(redis_server), "sm90")
    assert report.ok and len(report.present) == 4  # what it compiled was pushed with its MAC
