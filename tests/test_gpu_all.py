"""bench/gpu_all.sh on a GPU loan: the steps run in order under BUDGET_S, and a step with too little
time left is skipped with a line, so the run ends on time with what it measured (a stand-in Python
that only records its arguments; no GPU needed)."""

import os
import pathlib
import subprocess

SCRIPT = pathlib.Path(__file__).parent.parent / "bench" / "gpu_all.sh"


def test_budget_skips_the_steps_it_cannot_fit(tmp_path):
    python = tmp_path / "python"
    python.write_text('#!/usr/bin/env bash\necho "ran: $*"\nsleep 2\n')
    python.chmod(0o755)
    out = tmp_path / "out"
    proc = subprocess.run(["bash", str(SCRIPT), str(out), "attention", "align", "fp4"],
                          env={**os.environ, "PYTHON": str(python), "BUDGET_S": "16"},
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    # the first step fits (16 s left), then 13-14 s are left: under the 15 s a step needs
    assert "== attention: exit 0" in proc.stdout
    assert "bench/attention_tiles.py --json" in (out / "attention.log").read_text()
    for step in ("align", "fp4"):
        assert f"== {step}: skipped, 1" in proc.stdout, proc.stdout
        assert not (out / f"{step}.log").exists()


def test_without_a_budget_every_named_step_runs(tmp_path):
    python = tmp_path / "python"
    python.write_text('#!/usr/bin/env bash\necho "ran: $*"\n')
    python.chmod(0o755)
    proc = subprocess.run(["bash", str(SCRIPT), str(tmp_path / "out"), "fp4", "align", "nope"],
                          env={k: v for k, v in {**os.environ, "PYTHON": str(python)}.items() if k != "BUDGET_S"},
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.index("== fp4: exit 0") < proc.stdout.index("== align: exit 0")
    assert "unknown step nope" in proc.stdout


def test_the_kv_formats_and_host_floor_steps_run_their_benchmarks(tmp_path):
    python = tmp_path / "python"
    python.write_text('#!/usr/bin/env bash\necho "ran: $*"\n')
    python.chmod(0o755)
    out = tmp_path / "out"
    proc = subprocess.run(["bash", str(SCRIPT), str(out), "kvformats", "hostfloor"],
                          env={**os.environ, "PYTHON": str(python), "KVFORMATS_TILES": "5"},
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and "== hostfloor: exit 0" in proc.stdout, proc.stdout + proc.stderr
    assert "bench/kv_formats.py --tiles 5 --budget 90 --json" in (out / "kvformats.log").read_text()
    assert "bench/host_floor.py --json" in (out / "hostfloor.log").read_text()
