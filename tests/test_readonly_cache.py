"""A warmed cache on a read-only file system: serving (Triton's own runtime path) and `check` work,
warming into it fails with a one-line error; a kernel it lacks fails its launch (Triton writes into
the folder it reads) unless an overlay takes what serving compiles."""

import errno
import os
import subprocess
import sys

import pytest
import torch
from tritonwarm.jit import TARGETS
from tritonwarm.jit.pipeline.plan import plan
from tritonwarm.jit.pipeline.specs import load_specs
from tritonwarm.jit.pipeline.warmup import warm

SPEC = """
kernel: tritonwarm.launchers.rms_norm:rms_norm
axes:
  num_tokens: {range: [1, 512], collapse: true}
args:
  x: {tensor: [$num_tokens, 4096], dtype: bfloat16}
  weight: {tensor: [4096], dtype: bfloat16}
"""


@pytest.fixture
def readonly_cache(tmp_path, read_only_mount):
    spec = tmp_path / "rms.yaml"
    spec.write_text(SPEC)
    source = tmp_path / "src"
    warm(plan(load_specs([spec]), TARGETS["sm90"]), source)
    with read_only_mount(source, tmp_path / "ro") as mount:
        yield spec, mount


@pytest.mark.slow
def test_serving_and_check_work_warming_fails(readonly_cache, compile_counter, rms_norm_runtime):
    spec, cache = readonly_cache
    compiled_before = compile_counter.count
    for rows in (1, 33, 512):
        rms_norm_runtime(TARGETS["sm90"], cache, rows, fused=False)
    assert compile_counter.count == compiled_before

    cmd = [sys.executable, "-m", "tritonwarm"]
    ok = subprocess.run(cmd + ["check", str(spec), "--target", "sm90", "--cache-dir", str(cache)],
                        capture_output=True, text=True, timeout=600)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    bad = subprocess.run(cmd + ["warmup", str(spec), "--target", "sm90", "--cache-dir", str(cache)],
                         capture_output=True, text=True, timeout=600)
    assert bad.returncode == 2
    assert bad.stderr.strip().count("\n") == 0 and "Read-only file system" in bad.stderr, bad.stderr


OVERLAY_MANAGER = "tritonwarm.jit.cache.overlay:OverlayCacheManager"


@pytest.mark.slow
def test_a_kernel_the_read_only_cache_lacks_fails_there_and_compiles_into_an_overlay(
        readonly_cache, tmp_path, compile_counter, rms_norm_runtime, monkeypatch):
    spec, cache = readonly_cache
    sm90 = TARGETS["sm90"]
    with pytest.raises(OSError) as failed:  # float16 was never warmed: Triton cannot even make its folder
        rms_norm_runtime(sm90, cache, 8, fused=False, dtype=torch.float16)
    assert failed.value.errno == errno.EROFS

    overlay = tmp_path / "overlay"
    monkeypatch.setenv("TRITON_CACHE_MANAGER", OVERLAY_MANAGER)
    monkeypatch.setenv("TRITONWARM_OVERLAY_DIR", str(overlay))
    compiled = compile_counter.count
    rms_norm_runtime(sm90, cache, 8, fused=False)  # warmed: read from the mount, nothing written anywhere
    assert compile_counter.count == compiled and not overlay.exists()
    rms_norm_runtime(sm90, cache, 8, fused=False, dtype=torch.float16)  # compiled, into the overlay
    assert compile_counter.count == compiled + 1
    [entry] = [p for p in overlay.iterdir() if p.is_dir()]
    assert not (cache / entry.name).exists() and any(entry.glob("__grp__*.json"))
    rms_norm_runtime(sm90, cache, 8, fused=False, dtype=torch.float16)  # a fresh process's lookup: the overlay
    assert compile_counter.count == compiled + 1

    from tritonwarm.jit import fake_tensor
    from tritonwarm.jit.serving.monitor import DispatchMonitor
    from tritonwarm.launchers.rms_norm import rms_norm

    x = fake_tensor((8, 4096), torch.float16)
    with DispatchMonitor(cache, policy="error").dry_run(sm90) as monitor:  # Triton finds it: no compile
        rms_norm(x, fake_tensor((4096,), torch.float16))
    assert monitor.hits == 1 and not monitor.misses


@pytest.mark.slow
def test_check_warns_that_misses_fail_on_a_read_only_cache_and_commands_that_fill_it_refuse_an_overlay(
        readonly_cache, tmp_path):
    spec, cache = readonly_cache
    cmd = [sys.executable, "-m", "tritonwarm"]
    env = {**os.environ, "TRITON_CACHE_DIR": str(cache)}
    plain = subprocess.run(cmd + ["check", str(spec), "--target", "sm90", "--cache-dir", str(cache)],
                           capture_output=True, text=True, timeout=600, env=env)
    assert plain.returncode == 0, plain.stdout + plain.stderr
    flat = " ".join(plain.stdout.split())  # lines over 200 characters are wrapped
    assert (f"note: this process cannot write to {cache} (read-only, or another owner's): Triton's first launch of a "
            "kernel it lacks fails (OSError) instead of compiling") in flat
    assert "TRITON_CACHE_MANAGER=tritonwarm.jit.cache.overlay:OverlayCacheManager" in flat

    overlaid = {**env, "TRITON_CACHE_MANAGER": OVERLAY_MANAGER, "TRITONWARM_OVERLAY_DIR": str(tmp_path / "ov")}
    served = subprocess.run(cmd + ["check", str(spec), "--target", "sm90", "--cache-dir", str(cache)],
                            capture_output=True, text=True, timeout=600, env=overlaid)
    assert served.returncode == 0 and "cannot write" not in served.stdout, served.stdout + served.stderr

    described = subprocess.run(cmd + ["env"], capture_output=True, text=True, timeout=600, env=env).stdout
    described = described.replace("\n" + " " * 13, " ")  # lines over 200 characters are continued
    assert f"cache        Triton reads {cache} (TRITON_CACHE_DIR) and writes what it compiles there" in described
    assert f"WARNING      this process cannot write to {cache}" in described
    described = subprocess.run(cmd + ["env"], capture_output=True, text=True, timeout=600, env=overlaid).stdout
    described = described.replace("\n" + " " * 13, " ")
    assert f"and writes what it compiles to {tmp_path / 'ov'} (TRITONWARM_OVERLAY_DIR)" in described
    assert "WARNING      this process cannot write" not in described

    writable = tmp_path / "writable"
    for command in (["warmup", str(spec)], ["tune", str(spec)]):
        refused = subprocess.run(cmd + command + ["--target", "sm90", "--cache-dir", str(writable)],
                                 capture_output=True, text=True, timeout=600, env=overlaid)
        assert refused.returncode == 2, refused.stdout + refused.stderr
        assert refused.stderr.strip().count("\n") == 0
        assert f"TRITONWARM_OVERLAY_DIR={tmp_path / 'ov'} is set with the overlay cache manager" in refused.stderr
    assert not (writable / "tritonwarm").exists()
