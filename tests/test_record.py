"""``tritonwarm record``: a small program run as a dry run for one target; its plan, replayed for another
target, covers every variant the program launches there."""

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from tritonwarm.examples import serve_prog
from tritonwarm.jit import TARGETS
from tritonwarm.jit.cache import entry_files
from tritonwarm.jit.plan import plan
from tritonwarm.jit.record import launch_row, replay
from tritonwarm.jit.specs import load_specs
from tritonwarm.jit.trace import capture
from tritonwarm.jit.warmup import warm

ROOT = Path(__file__).resolve().parent.parent


def _record(tmp_path, *extra):
    out = tmp_path / "prog.plan.yaml"
    env_path = str(ROOT.parent)
    proc = subprocess.run(
        [sys.executable, "-m", "tritonwarm", "record", "-o", str(out), *extra, "--",
         sys.executable, "-m", "tritonwarm.examples.serve_prog", "--device", "meta"],
        capture_output=True, text=True, timeout=300, env={**__import__("os").environ, "PYTHONPATH": env_path})
    return proc, out


@pytest.mark.slow
def test_record_dry_run_replayed_for_another_target_covers_every_launch(tmp_path):
    proc, out = _record(tmp_path, "--target", "sm90")
    assert proc.returncode == 0, proc.stderr
    assert "recorded 5 launches of 2 kernels" in proc.stdout

    other = TARGETS["sm120"]
    the_plan = plan(load_specs([out]), other)
    assert not the_plan.errors and the_plan.rows == 5
    result = warm(the_plan, tmp_path / "cache")
    assert result.failed == 0

    with capture(other, all_kernels=True) as cap:  # what the program launches on that target
        serve_prog.main(["--device", "meta"])
    assert cap.variants
    for variant in cap.variants.values():
        assert entry_files(tmp_path / "cache", variant.cache_dir_name, variant.entry_name), variant.args
    assert {v.cache_hash for v in cap.variants.values()} == set(the_plan.variants)


@pytest.mark.slow
def test_record_needs_a_gpu_or_a_target(tmp_path):
    proc, out = _record(tmp_path)
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "--target" in proc.stderr
    assert not out.exists()


def test_a_recorded_launch_replays_to_the_same_key():
    """Triton's own request → a row → a launch on fake inputs → the same request again."""
    x = torch.empty((7, 1024), dtype=torch.bfloat16, device="meta")
    target = TARGETS["gfx942"]
    with capture(target, all_kernels=True) as first:
        serve_prog.mlp_block(x, torch.empty((1024,), dtype=torch.bfloat16, device="meta"))
    rows = [launch_row(v.specialization_data, v.jit_function, target.gpu_target) for v in first.variants.values()]
    with capture(target, all_kernels=True) as again:
        for row in rows:
            replay(row["kernel"], row["call"])
    # the disk-cache entries agree (Triton's in-memory key also lists options passed at their defaults)
    assert {v.cache_hash for v in again.variants.values()} == {v.cache_hash for v in first.variants.values()}
