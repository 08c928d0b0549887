"""A warmed cache on a read-only file system: serving (Triton's own runtime path) and `check` work,
warming into it fails with a one-line error."""

import subprocess
import sys

import pytest
from tritonwarm.jit import TARGETS
from tritonwarm.jit.plan import plan
from tritonwarm.jit.specs import load_specs
from tritonwarm.jit.warmup import warm

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
