"""The adoption loop for a library whose host code branches on what no build machine sees: record on
the server once, warm the record on CPUs, verify with the server's own dispatch record.

The server is played here by real CPU tensors under a driver that answers for sm90 and launches
nothing: Triton's own binder computes each key from the real tensors, its own cache lookup finds an
entry or compiles one; only the final launch is a no-op."""

import json
import sys
import textwrap

import pytest
import torch
from tritonwarm.jit import TARGETS
from tritonwarm.jit.adopt.record import read_record, recording, write_plan
from tritonwarm.jit.cache.triton_dir import triton_cache_dir
from tritonwarm.jit.core.dispatch_record import write_record
from tritonwarm.jit.core.targets import TargetOnlyDriver, _TargetUtils
from tritonwarm.jit.pipeline.plan import plan
from tritonwarm.jit.pipeline.specs import load_specs
from tritonwarm.jit.pipeline.warmup import warm

SM90 = TARGETS["sm90"]

LIBRARY = textwrap.dedent("""
    import os

    import torch
    import triton
    import triton.language as tl


    @triton.jit
    def act_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr, FAST: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        x = tl.load(x_ptr + offs, mask=offs < n)
        y = x * tl.sigmoid(x) if FAST else x / (1.0 + tl.exp(-x))
        tl.store(out_ptr + offs, y, mask=offs < n)


    def act(x):
        fast = os.environ.get("SRVLIB_FAST_PATH") == "1"  # the server's configuration: no build machine has it
        out = torch.empty_like(x)
        act_kernel[(triton.cdiv(x.numel(), 1024),)](x, out, x.numel(), BLOCK=1024, FAST=fast)
        return out
    """)

SPEC = """
launcher: srvlib:act
capture: all
import_roots: [lib]
axes:
  n: [4096, 1000]
args:
  x: {tensor: [$n], dtype: float32}
"""


class _ServingUtils(_TargetUtils):
    def load_binary(self, name, kernel, shared, device):
        return None, None, 0, 0, 1024


class ServingDriver(TargetOnlyDriver):
    """sm90's answers, Triton's real cache and compiler, a launch that does nothing."""

    @property
    def utils(self):
        return _ServingUtils(self.target)

    def launcher_cls(self, src, metadata):
        return lambda *args, **kwargs: None


def serve(lib, cache, record, monkeypatch):
    """The server (its configuration sets the library's fast path): the library imported from its
    folder (added to sys.path, as a program does), two calls on real tensors, recorded with its
    dispatch record; returns how many kernels it compiled."""
    from triton.runtime.driver import driver

    saved = driver._active
    driver.set_active(ServingDriver(SM90))
    sys.path[:] = [p for p in sys.path if p != str(lib)]  # the server's process: only what it adds itself
    monkeypatch.setenv("SRVLIB_FAST_PATH", "1")
    try:
        with triton_cache_dir(cache), recording(record, trace=True) as recorder:
            sys.path.insert(0, str(lib))
            sys.modules.pop("srvlib", None)
            import srvlib

            srvlib.act(torch.randn(4096))
            srvlib.act(torch.randn(1000))
    finally:
        driver._active = saved
        monkeypatch.delenv("SRVLIB_FAST_PATH")
    return recorder.monitor.compiles


def deploy(cache, *specs):
    """A cache warmed on CPUs from the specs (what the build machine ships)."""
    assert warm(plan(load_specs(list(specs)), SM90), cache).failed == 0
    return cache


@pytest.mark.slow
def test_record_on_the_server_then_warm_then_check_trace(tmp_path, monkeypatch, run_cli):
    monkeypatch.setattr(sys, "path", list(sys.path))
    lib = tmp_path / "lib"
    lib.mkdir()
    (lib / "srvlib.py").write_text(LIBRARY)
    spec = tmp_path / "srvlib.yaml"
    spec.write_text(SPEC)
    ci = deploy(tmp_path / "ci", spec)
    run_cli("check", spec, "--target", "sm90", "--cache-dir", ci, rc=0)  # the spec path cannot see the branch

    record = tmp_path / "server1.jsonl"
    assert serve(lib, deploy(tmp_path / "server1", spec), record, monkeypatch) == 2  # both compiled while serving
    recorded = read_record(record)
    the_plan, trace = tmp_path / "server.plan.yaml", tmp_path / "server1.trace.jsonl"
    write_plan(recorded.rows, the_plan, ["serve"], None, recorded.roots)
    write_record(trace, recorded.dispatches.values())
    assert [d["args"]["FAST"] for d in recorded.dispatches.values()] == ["=True", "=True"]
    assert recorded.roots == [str(lib)]  # what the server added to sys.path: warm-up imports from there

    out = run_cli("check", "--trace", trace, "--target", "sm90", "--cache-dir", ci, rc=1).stdout
    assert "sm90: MISSES: 2 variants launched, 2 missed the cache" in out
    assert "missed: 2 variants (other class) of act_kernel: nearest warmed variant" in out, out  # one line, counted
    assert out.count("differs in FAST (warmed =False, here =True): this class was not warmed") == 1, out

    run_cli("warmup", the_plan, "--target", "sm90", "--cache-dir", ci, "--jobs", "1", rc=0)  # no PYTHONPATH
    out = run_cli("check", "--trace", trace, "--target", "sm90", "--cache-dir", ci, rc=0).stdout
    assert "2 missed when recorded and warmed since" in out

    server2 = deploy(tmp_path / "server2", spec, the_plan)
    entries = sorted(p.name for p in server2.iterdir())
    assert serve(lib, server2, tmp_path / "server2.jsonl", monkeypatch) == 0  # compiles nothing
    assert sorted(p.name for p in server2.iterdir()) == entries
    again = read_record(tmp_path / "server2.jsonl")
    assert [d["hit"] for d in again.dispatches.values()] == [True, True]
    write_record(tmp_path / "server2.trace.jsonl", again.dispatches.values())
    report = json.loads(run_cli("check", "--trace", tmp_path / "server2.trace.jsonl", "--target", "sm90",
                                "--cache-dir", ci, "--json", rc=0).stdout)
    assert report["ok"] and not report["misses"]
