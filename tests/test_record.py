"""``tritonwarm record``: a small program run as a dry run for one target; its plan, replayed for another
target, covers every variant the program launches there."""

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from tritonwarm.examples import serve_prog
from tritonwarm.jit import TARGETS
from tritonwarm.jit.adopt.record import launch_row, replay
from tritonwarm.jit.cache import entry_files
from tritonwarm.jit.core.trace import capture
from tritonwarm.jit.pipeline.plan import plan
from tritonwarm.jit.pipeline.specs import load_specs
from tritonwarm.jit.pipeline.warmup import warm

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
        assert entry_files(tmp_path / "cache", variant.entry_dir, variant.entry_name), variant.args
    assert {v.cache_hash for v in cap.variants.values()} == set(the_plan.variants)


@pytest.mark.slow
def test_record_needs_a_gpu_or_a_target(tmp_path):
    proc, out = _record(tmp_path)
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "--target" in proc.stderr
    assert not out.exists()


@pytest.mark.parametrize("recorded_on, replayed_on", [("gfx942", "gfx942"), ("sm90", "gfx942"), ("gfx942", "sm90")])
def test_a_recorded_launch_replays_to_the_same_cache_entry(recorded_on, replayed_on):
    """Triton's own request → a row → a launch on fake inputs → the entry the code itself launches there,
    across backends too (autotune configs pass num_stages=3, which is not the HIP default)."""
    from tritonwarm.examples.thirdparty_ops import add_bias_gelu

    x = torch.empty((7, 1024), dtype=torch.bfloat16, device="meta")
    bias = torch.empty((1024,), dtype=torch.bfloat16, device="meta")
    with capture(TARGETS[recorded_on], all_kernels=True) as recorded:
        add_bias_gelu(x, bias)
    rows = [launch_row(v.specialization_data, v.jit_function, TARGETS[recorded_on].gpu_target, v.key)
            for v in recorded.variants.values()]
    with capture(TARGETS[replayed_on], all_kernels=True) as replayed:
        for row in rows:
            replay(row["kernel"], row["call"])
    with capture(TARGETS[replayed_on], all_kernels=True) as direct:
        add_bias_gelu(x, bias)
    assert len(rows) == 2
    assert {v.cache_hash for v in replayed.variants.values()} == {v.cache_hash for v in direct.variants.values()}


def _one_recorded_row() -> dict:
    """One launch of ``add_bias_gelu`` on sm90 as ``tritonwarm record`` writes it into a plan."""
    from tritonwarm.examples.thirdparty_ops import add_bias_gelu

    x = torch.empty((7, 1024), dtype=torch.bfloat16, device="meta")
    bias = torch.empty((1024,), dtype=torch.bfloat16, device="meta")
    with capture(TARGETS["sm90"], all_kernels=True) as recorded:
        add_bias_gelu(x, bias)
    v = next(iter(recorded.variants.values()))
    return launch_row(v.specialization_data, v.jit_function, TARGETS["sm90"].gpu_target, v.key)


@pytest.mark.parametrize("edit, words", [
    ({"int": "i99", "div16": True}, "recorded integer class 'i99' (div16: True) is not one of i32, i64, u64"),
    ({"ptr": "zz16", "aligned": True}, "recorded pointer type 'zz16' is not one of fp16"),
])
def test_a_recorded_plan_edited_by_hand_names_the_class_it_does_not_know(edit, words):
    row = _one_recorded_row()
    kind = next(iter(edit))
    index = next(i for i, a in enumerate(row["call"]["args"]) if kind in a)
    row["call"]["args"][index] = edit
    with pytest.raises(ValueError) as e, capture(TARGETS["sm90"], all_kernels=True):
        replay(row["kernel"], row["call"])
    assert words in str(e.value)


def test_a_recorded_plan_names_a_backend_it_does_not_know():
    row = _one_recorded_row()
    assert row["call"]["backend"] == "cuda"
    row["call"]["backend"] = "foo"
    with pytest.raises(ValueError, match="recorded backend 'foo' is not one of cuda, hip"), \
            capture(TARGETS["sm90"], all_kernels=True):
        replay(row["kernel"], row["call"])
