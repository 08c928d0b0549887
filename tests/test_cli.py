"""The command line as a user meets it: exit codes, one-line errors, JSON, and several processes."""

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time

import pytest

GOOD = """
kernel: tritonwarm.launchers.rms_norm:rms_norm
axes:
  num_tokens: {range: [1, 64], collapse: true}
  dtype: [float16, bfloat16]
groups:
  model:
    hidden: [1024, 2048, 4096]
args:
  x: {tensor: [$num_tokens, $hidden], dtype: $dtype}
  weight: {tensor: [$hidden], dtype: $dtype}
"""




@pytest.fixture
def good_spec(tmp_path):
    path = tmp_path / "good.yaml"
    path.write_text(GOOD)
    return path


BAD_SPECS = {
    "unknown_field": ("kernel: tritonwarm.launchers.rms_norm:rms_norm\nargs: {}\nflavour: spicy\n", 3, "flavour"),
    "wrong_type": ("kernel: tritonwarm.launchers.rms_norm:rms_norm\naxes:\n  n: {range: [1, two]}\nargs: {}\n", 3,
                   "axes.n.range"),
    "unknown_kernel": ("kernel: tritonwarm.launchers.rms_norm:no_such_norm\nargs: {}\n", 1, "unknown kernel"),
    "unknown_axis": ("kernel: tritonwarm.launchers.rms_norm:rms_norm\naxes:\n  n: [1]\nargs:\n  x: $m + 1\n", 5,
                     "unknown axis 'm'"),
    "ragged_group": ("kernel: tritonwarm.launchers.rms_norm:rms_norm\ngroups:\n  g:\n    a: [1, 2]\n    b: [1]\n"
                     "args: {}\n", 3, "differ in length"),
    "bad_dtype": ("kernel: tritonwarm.launchers.rms_norm:rms_norm\nargs:\n  x: {tensor: [2], dtype: float17}\n", 3,
                  "unknown dtype"),
    "bad_target": ("kernel: tritonwarm.launchers.rms_norm:rms_norm\ntargets: [sm91]\nargs: {}\n", 2,
                   "unknown target 'sm91'"),
    "not_yaml": ("kernel: [unclosed\n", 2, "<yaml>"),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(BAD_SPECS))
def test_malformed_spec_exits_2_with_file_and_line(run_cli, tmp_path, name):
    text, line, fragment = BAD_SPECS[name]
    path = tmp_path / f"{name}.yaml"
    path.write_text(text)
    proc = run_cli("warmup", path, "--target", "sm90", "--cache-dir", tmp_path / "c", rc=2)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert f"{path}:{line}:" in lines[0] and fragment in lines[0], lines[0]
    assert not (tmp_path / "c" / "tritonwarm").exists()  # nothing written before validation passed


@pytest.mark.slow
def test_unknown_target_and_missing_target(run_cli, tmp_path, good_spec):
    proc = run_cli("warmup", good_spec, "--target", "sm91", rc=2)
    assert "unknown target 'sm91'" in proc.stderr and "sm90" in proc.stderr
    proc = run_cli("check", good_spec, rc=2)  # no GPU here, no --target
    assert "--target" in proc.stderr and "gfx942" in proc.stderr


@pytest.mark.slow
def test_warmup_twice_then_list_show_check(run_cli, tmp_path, good_spec):
    cache = tmp_path / "cache"
    first = json.loads(run_cli("warmup", good_spec, "--target", "sm90", "--cache-dir", cache, "--json",
                               rc=0).stdout)
    assert first["planned"] == 6 and first["compiled"] == 6 and first["failed"] == 0
    second = json.loads(run_cli("warmup", good_spec, "--target", "sm90", "--cache-dir", cache, "--json",
                                rc=0).stdout)
    assert (second["compiled"], second["cached"]) == (0, 6)
    rows = json.loads(run_cli("list", "--cache-dir", cache, "--json", rc=0).stdout)
    assert len(rows) == 6 and {r["target"] for r in rows} == {"sm90"}
    assert all(r["resources"]["registers"] > 0 for r in rows)
    text = run_cli("list", "--cache-dir", cache, "--kernel", "rms_norm", rc=0).stdout
    assert "REGS" in text and "BLOCK=4096" in text
    ptx = run_cli("show", rows[0]["id"][:8], "--cache-dir", cache, "--ir", "ptx", rc=0).stdout
    assert ".target sm_90a" in ptx
    assert run_cli("show", "ffffffff", "--cache-dir", cache, rc=2).stderr.startswith("tritonwarm: error:")
    report = json.loads(run_cli("check", good_spec, "--target", "sm90", "--cache-dir", cache, "--json",
                                rc=0).stdout)
    assert report["ok"] and report["targets"][0]["planned"] == 6
    cold = run_cli("check", good_spec, "--target", "sm90", "--cache-dir", tmp_path / "cold", rc=1)
    assert "6 missing" in cold.stdout


@pytest.mark.slow
def test_gfx942_writes_hsaco(run_cli, tmp_path, good_spec):
    cache = tmp_path / "cache"
    run_cli("warmup", good_spec, "--target", "gfx942", "--cache-dir", cache, rc=0)
    assert len(list(cache.glob("*/*.hsaco"))) == 6


OVERLAP = """
kernel: tritonwarm.launchers.rms_norm:rms_norm
axes:
  num_tokens: {range: [1, 64], collapse: true}
  dtype: [float16, bfloat16]
groups:
  model:
    hidden: [2048, 4096, 8192]
args:
  x: {tensor: [$num_tokens, $hidden], dtype: $dtype}
  weight: {tensor: [$hidden], dtype: $dtype}
"""


@pytest.mark.slow
def test_eight_concurrent_warmups_of_overlapping_specs(run_cli, tmp_path, good_spec):
    """Two specs sharing 4 of their 6 variants each, eight processes at once into one cache."""
    other = tmp_path / "overlap.yaml"
    other.write_text(OVERLAP)
    cache = tmp_path / "cache"
    procs = [subprocess.Popen([sys.executable, "-m", "tritonwarm", "warmup", str(spec), "--target", "sm90",
                               "--cache-dir", str(cache), "--json", "--jobs", "1"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for spec in [good_spec, other] * 4]
    outs = [p.communicate(timeout=900) for p in procs]
    assert all(p.returncode == 0 for p in procs), [o[1] for o in outs]
    assert not any("FileNotFoundError" in o[1] for o in outs)
    results = [json.loads(o[0]) for o in outs]
    assert sum(r["compiled"] for r in results) == 8  # 8 distinct keys, a lock per key: each compiled once
    assert all(r["compiled"] + r["cached"] == 6 for r in results)
    manifest = json.loads((cache / "tritonwarm" / "manifest-sm90.json").read_text())
    assert len(manifest["variants"]) == 8
    shared = [e for e in manifest["variants"].values() if "BLOCK=1024" not in str(e["args"])
              and e["args"]["BLOCK"] in ("=2048", "=4096")]
    assert shared and all(any("good.yaml" in r for r in e["rows"]) and any("overlap.yaml" in r for r in e["rows"])
                          for e in shared)  # rows of both specs recorded, none lost to a race
    run_cli("check", good_spec, other, "--target", "sm90", "--cache-dir", cache, rc=0)


@pytest.mark.slow
def test_sigkill_at_random_points_then_rerun_completes(run_cli, tmp_path, good_spec):
    cache = tmp_path / "cache"
    cmd = [sys.executable, "-m", "tritonwarm", "warmup", str(good_spec), "--target", "sm90,gfx942",
           "--cache-dir", str(cache), "--jobs", "1", "--replan"]
    rng = random.Random(7)
    for trial in range(10):
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(rng.uniform(1.5, 4.5))  # start-up takes ~2 s; tracing and compiling follow
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        if trial % 3 == 2:  # now and then start over, so kills land early in the work again
            shutil.rmtree(cache, ignore_errors=True)
    run_cli("warmup", good_spec, "--target", "sm90,gfx942", "--cache-dir", cache, rc=0)
    run_cli("check", good_spec, "--target", "sm90,gfx942", "--cache-dir", cache, rc=0)


@pytest.mark.slow
def test_shipped_specs_are_found_from_anywhere(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "tritonwarm", "check", "--target", "sm90", "--cache-dir",
                           str(tmp_path / "c"), "--json"], capture_output=True, text=True, cwd=tmp_path, timeout=600)
    assert proc.returncode == 1, proc.stderr  # cold cache: missing variants, but the specs were found
    report = json.loads(proc.stdout)["targets"][0]
    assert report["planned"] > 0 and len(report["missing"]) == report["planned"]


@pytest.mark.slow
def test_interpreter_env_refuses_to_warm(tmp_path, good_spec):
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    proc = subprocess.run([sys.executable, "-m", "tritonwarm", "warmup", str(good_spec), "--target", "sm90"],
                          capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 2 and "TRITON_INTERPRET" in proc.stderr
