"""``TRITON_CACHE_MANAGER`` replaces the folder Triton's runtime reads: one that does not import fails
Triton's first lookup, mid-serving; one that is not a file cache reads a store of its own. Triton's own
runtime is run to show each, then ``check``, ``env``, ``warmup`` and the serving monitor are asked."""

import pytest
from tritonwarm.cli import main
from tritonwarm.jit import TARGETS
from tritonwarm.jit.pipeline.check import check
from tritonwarm.jit.pipeline.plan import plan
from tritonwarm.jit.pipeline.specs import load_specs
from tritonwarm.jit.pipeline.warmup import warm
from tritonwarm.jit.serving.monitor import DispatchMonitor, JitPolicyError

SM90 = TARGETS["sm90"]

# An object-store manager, as a user would name one: its own store, empty here.
ELSEWHERE = '''
import json
import os

from triton.runtime.cache import CacheManager


class ElsewhereCacheManager(CacheManager):
    def __init__(self, key, override=False, dump=False):
        self.folder = os.path.join(os.environ["ELSEWHERE_STORE"], key)

    def get_file(self, filename):
        path = os.path.join(self.folder, filename)
        return path if os.path.exists(path) else None

    def put(self, data, filename, binary=True):
        os.makedirs(self.folder, exist_ok=True)
        path = os.path.join(self.folder, filename)
        data = data if isinstance(data, bytes) else str(data)  # Triton hands IR modules, as to its own
        with open(path, "wb" if isinstance(data, bytes) else "w") as f:
            f.write(data)
        return path

    def get_group(self, filename):
        return None

    def put_group(self, filename, group):
        return self.put(json.dumps({"child_paths": group}), "__grp__" + filename, binary=False)
'''


@pytest.fixture
def warmed(spec_file):
    """The folder holding ``rms.yaml`` and ``cache``, warmed for it."""
    warm(plan(load_specs([spec_file]), SM90), spec_file.parent / "cache")
    return spec_file.parent


def _refused_at_start(cache, match):
    with pytest.raises(JitPolicyError, match=match):
        with DispatchMonitor(cache, "error").serving():
            pass


@pytest.mark.slow
def test_a_manager_with_a_store_of_its_own_serves_nothing_warmed(warmed, tmp_path, monkeypatch, compile_counter,
                                                                rms_norm_runtime, capsys):
    cache, specs = warmed / "cache", load_specs([warmed / "rms.yaml"])
    assert check(plan(specs, SM90), cache).ok
    before = compile_counter.count
    rms_norm_runtime(SM90, cache, 7, False)
    assert compile_counter.count == before  # control: the folder serves it

    (tmp_path / "elsewhere_manager.py").write_text(ELSEWHERE)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("ELSEWHERE_STORE", str(tmp_path / "store"))
    monkeypatch.setenv("TRITON_CACHE_MANAGER", "elsewhere_manager:ElsewhereCacheManager")
    rms_norm_runtime(SM90, cache, 7, False)
    assert compile_counter.count == before + 1  # Triton's runtime: warmed, and compiled all the same

    report = check(plan(specs, SM90), cache)
    assert not report.ok and report.missing == []
    assert report.bypassed.startswith("TRITON_CACHE_MANAGER='elsewhere_manager:ElsewhereCacheManager' is not a "
                                      "file cache (Triton reads and writes through it, not the cache folder)")
    assert compile_counter.count == before + 1  # (check looked nothing up through it, and says so)
    assert report.notes[-1].startswith("C launchers not looked up: TRITON_CACHE_MANAGER='elsewhere_manager:")
    _refused_at_start(cache, "is not a file cache")

    bundle, installed = tmp_path / "b.tar.gz", tmp_path / "installed"  # installed all the same, and said so
    assert main(["bundle", "create", str(bundle), str(warmed / "rms.yaml"), "--target", "sm90",
                 "--cache-dir", str(cache)]) == 0
    assert main(["bundle", "install", str(bundle), "--cache-dir", str(installed)]) == 0
    assert "warning: TRITON_CACHE_MANAGER='elsewhere_manager:ElsewhereCacheManager' is not a file cache (Triton " \
           "reads and writes through it, not the cache folder): no C launchers built" in capsys.readouterr().err
    assert compile_counter.count == before + 1

    # tritonwarm's shared-cache managers read through the folder: nothing to say
    monkeypatch.setenv("TRITON_CACHE_MANAGER", "tritonwarm.jit.cache.remote:RedisCacheManager")
    assert check(plan(specs, SM90), cache).ok
    monkeypatch.setenv("TRITON_CACHE_MANAGER", "triton.runtime.cache:RemoteCacheManager")
    monkeypatch.setenv("TRITON_REMOTE_CACHE_BACKEND", "tritonwarm.jit.cache.remote:RedisBackend")
    assert check(plan(specs, SM90), cache).ok
    monkeypatch.setenv("TRITON_REMOTE_CACHE_BACKEND", "triton.runtime.cache:RedisRemoteCacheBackend")
    assert "is not a file cache" in check(plan(specs, SM90), cache).bypassed


@pytest.mark.slow
def test_a_manager_that_does_not_import_is_named_before_serving(warmed, tmp_path, monkeypatch, rms_norm_runtime,
                                                                 capsys):
    cache, specs = warmed / "cache", load_specs([warmed / "rms.yaml"])
    monkeypatch.setenv("TRITON_CACHE_MANAGER", "nosuch_store:Manager")
    with pytest.raises(ModuleNotFoundError):  # Triton's runtime: the first lookup of a serving process
        rms_norm_runtime(SM90, cache, 7, False)

    report = check(plan(specs, SM90), cache)
    assert not report.ok and report.bypassed == (
        "TRITON_CACHE_MANAGER='nosuch_store:Manager' cannot be used (ModuleNotFoundError: No module named "
        "'nosuch_store'): Triton's first cache lookup would fail: fix or unset it where serving runs")
    _refused_at_start(cache, "cannot be used")

    assert main(["env"]) == 0
    assert "WARNING      TRITON_CACHE_MANAGER='nosuch_store:Manager' cannot be used" in capsys.readouterr().out

    # a warm-up through it would fail at every entry: refused in one line, nothing written
    fresh = tmp_path / "fresh"
    assert main(["warmup", str(warmed / "rms.yaml"), "--target", "sm90", "--cache-dir", str(fresh)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"the warm-up fills {fresh}: unset it for the warm-up" in err, err
    assert not list(fresh.glob("*/*.cubin"))
