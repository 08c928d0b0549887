"""What a new user meets in the first hour, each trap a test: the default folder is the one Triton
reads, a cache that will miss elsewhere never passes `check`, a failed or interrupted warm-up says
so, and every command's output is readable."""

import os
import subprocess
import sys

import pytest

# A plain Triton program (no tritonwarm import) launching the user's kernel for sm90 on a machine
# with no GPU: a driver that only names the target, and Triton's own JITFunction.run with a real CPU
# tensor. It prints how many kernels Triton compiled (built the IR for: its disk cache missed).
PLAIN_TRITON = """
import torch
from triton.backends.compiler import GPUTarget
from triton.compiler import compiler
from triton.runtime.driver import driver

from edited_kernels import add_const


class CompileOnlyDriver:
    def get_current_target(self):
        return GPUTarget("cuda", 90, 32)

    def get_current_device(self):
        return 0

    def get_current_stream(self, device=None):
        return 0

    def is_active(self):
        return True

    def get_active_torch_device(self):
        return torch.device("cpu")


compiles = 0
make_ir = compiler.ASTSource.make_ir


def counting_make_ir(*args, **kwargs):
    global compiles
    compiles += 1
    return make_ir(*args, **kwargs)


compiler.ASTSource.make_ir = counting_make_ir
driver.set_active(CompileOnlyDriver())
x = torch.zeros(1024)
add_const.run(x, x.numel(), grid=(4,), warmup=True, BLOCK=256)
print("compiles", compiles)
"""


def plain_env(env: dict, home) -> dict:
    """A new user's shell: HOME of their own, no cache variable of Triton's or tritonwarm's."""
    drop = {"TRITON_CACHE_DIR", "TRITONWARM_CACHE_DIR", "TRITON_HOME", "XDG_CACHE_HOME"}
    return {**{k: v for k, v in env.items() if k not in drop}, "HOME": str(home)}


def plain_triton_compiles(code, env) -> int:
    proc = subprocess.run([sys.executable, "-c", PLAIN_TRITON], capture_output=True, text=True, timeout=300,
                          env={**env, "PYTHONPATH": str(code)}, cwd=code)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return int(proc.stdout.split("compiles")[-1])


@pytest.mark.slow
def test_default_warmup_fills_the_folder_a_plain_triton_process_reads(custom_kernel, tmp_path, run_cli):
    code, spec, env = custom_kernel
    user = plain_env(env, tmp_path / "home")
    (tmp_path / "home").mkdir()
    assert plain_triton_compiles(code, user) == 1  # control: a cold cache compiles (and the count works)
    for entry in (tmp_path / "home" / ".triton" / "cache").iterdir():  # cold again
        if entry.name != "tritonwarm":
            subprocess.run(["rm", "-rf", str(entry)], check=True)
    out = run_cli("warmup", spec, "--target", "sm90", "-j", "1", rc=0, env=user).stdout
    assert f"cache: {tmp_path / 'home' / '.triton' / 'cache'}" in out
    assert plain_triton_compiles(code, user) == 0
    checked = run_cli("check", spec, "--target", "sm90", rc=0, env=user).stdout
    assert "sm90: ok: 1 variant planned from " in checked and ", 0 missing" in checked
    assert "add_const" in run_cli("list", rc=0, env=user).stdout


def test_a_cache_in_the_old_default_folder_gets_one_line(tmp_path, run_cli):
    home = tmp_path / "home"
    old = home / ".cache" / "tritonwarm" / "triton"
    (old / "tritonwarm").mkdir(parents=True)
    (old / "tritonwarm" / "manifest-sm90.json").write_text('{"format": 1, "variants": {}}')
    user = plain_env(os.environ, home)
    err = run_cli("list", rc=0, env=user).stderr
    notes = [line for line in err.splitlines() if "earlier tritonwarm" in line]
    new = home / ".triton" / "cache"
    assert notes == [f"tritonwarm: note: an earlier tritonwarm warmed {old}; Triton reads {new}: "
                     f"warm again, or use that cache with --cache-dir {old} (serve it with TRITON_CACHE_DIR={old})"]
    assert "earlier tritonwarm" not in run_cli("list", "--cache-dir", old, rc=0, env=user).stderr


@pytest.mark.slow
def test_check_of_a_copied_cache_fails_and_names_the_folder_it_reads(tmp_path, dtypes_spec_file, run_cli):
    """`cp -r` of a warmed cache, then `check` of the copy (a CI gate): the group files still name the
    original's files, so the copy hits here only while the original exists; a server misses it."""
    original, copy = tmp_path / "original", tmp_path / "copy"
    run_cli("warmup", dtypes_spec_file, "--target", "sm90", "-j", "1", "--cache-dir", original, rc=0)
    subprocess.run(["cp", "-r", str(original), str(copy)], check=True)
    out = run_cli("check", dtypes_spec_file, "--target", "sm90", "--cache-dir", copy, rc=1).stdout
    assert "sm90: PROBLEMS: 2 variants planned from " in out and ", 0 missing" in out
    flat = " ".join(out.split())
    assert (f"why: 2 planned variants are read from {original}, not from {copy}: its group files name files there "
            "(a copied cache): a server without that folder misses them: move a cache with `tritonwarm bundle "
            "create` + `bundle install` (`--serve-at PATH` for another mount path)") in flat
    assert all(len(line) <= 200 for line in out.splitlines())
    same = run_cli("check", dtypes_spec_file, "--target", "sm90", "--cache-dir", copy, "--same-machine", rc=0).stdout
    assert "sm90: ok: 2 variants planned from " in same and f"note: 2 planned variants are read from {original}" in same
    run_cli("check", dtypes_spec_file, "--target", "sm90", "--cache-dir", original, rc=0)  # the original itself


LAZY_LAUNCHER = """
from edited_launchers import add_const_jit


def launcher(x):
    import lazy_helper  # found only with the right PYTHONPATH

    return add_const_jit(lazy_helper.same(x))
"""


@pytest.mark.slow
def test_a_failed_trace_is_not_stored_the_next_warmup_traces_again(custom_kernel, tmp_path, run_cli):
    code, _, env = custom_kernel
    (code / "lazy_launchers.py").write_text(LAZY_LAUNCHER)
    extra = tmp_path / "extra"
    extra.mkdir()
    (extra / "lazy_helper.py").write_text("def same(x):\n    return x\n")
    spec = tmp_path / "lazy.yaml"
    spec.write_text("kernel: lazy_launchers:launcher\nargs:\n  x: {tensor: [1024], dtype: float32}\n")
    args = ("warmup", spec, "--target", "sm90", "-j", "1", "--cache-dir", tmp_path / "cache")
    failed = run_cli(*args, rc=1, env=env)
    assert "No module named 'lazy_helper'" in failed.stderr
    assert not list((tmp_path / "cache" / "tritonwarm" / "plans").glob("*.json"))
    fixed = {**env, "PYTHONPATH": os.pathsep.join([str(extra), env["PYTHONPATH"]])}
    out = run_cli(*args, rc=0, env=fixed).stdout
    assert "sm90: 1 variant planned from 1 row: 1 compiled" in out


SLOW_LAUNCHER = """
import os
import pathlib
import time

from edited_launchers import add_const_jit


def launcher(x):
    gate = os.environ.get("SLOW_GATE")
    if gate:  # the warm-up to interrupt: say it is under way, then take long
        pathlib.Path(gate).write_text("tracing")
        time.sleep(300)
    return add_const_jit(x)
"""


@pytest.mark.slow
@pytest.mark.parametrize("signal_name", ["SIGINT", "SIGTERM", "SIGKILL"])
def test_an_interrupted_warmup_leaves_a_mark_that_check_reads(custom_kernel, tmp_path, run_cli, signal_name):
    import signal
    import time

    code, _, env = custom_kernel
    (code / "slow_launchers.py").write_text(SLOW_LAUNCHER)
    spec = tmp_path / "slow.yaml"
    spec.write_text("kernel: slow_launchers:launcher\nargs:\n  x: {tensor: [1024], dtype: float32}\n")
    cache, gate = tmp_path / "cache", tmp_path / "gate"
    args = ("warmup", spec, "--target", "sm90", "-j", "1", "--cache-dir", cache)
    proc = subprocess.Popen([sys.executable, "-m", "tritonwarm", *map(str, args)], env={**env, "SLOW_GATE": str(gate)},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        for _ in range(600):
            if gate.exists() or proc.poll() is not None:
                break
            time.sleep(0.5)
        assert gate.exists(), proc.communicate()
        proc.send_signal(getattr(signal, signal_name))
        proc.communicate(timeout=120)
    finally:
        proc.kill()
    out = run_cli("check", spec, "--target", "sm90", "--cache-dir", cache, rc=1, env=env).stdout
    lines = [line for line in out.splitlines() if "was interrupted" in line]
    assert len(lines) == 1, out
    line = lines[0]
    assert line.startswith("  interrupted: the warm-up of ") and line.endswith(" was interrupted: run it again"), out
    run_cli(*args, rc=0, env=env)
    out = run_cli("check", spec, "--target", "sm90", "--cache-dir", cache, rc=0, env=env).stdout
    assert "was interrupted" not in out


@pytest.mark.slow
def test_a_bundle_for_another_python_is_judged_for_it_end_to_end(tmp_path, dtypes_spec_file, capsys):
    import importlib.util

    from tritonwarm.cli import main
    from tritonwarm.jit.cache.env import fingerprint as this_fingerprint
    from tritonwarm.jit.cache.env import python_name

    found = importlib.util.spec_from_file_location("for_wheel_tests", os.path.join(os.path.dirname(__file__),
                                                                                 "test_for_wheel.py"))
    for_wheel_tests = importlib.util.module_from_spec(found)
    found.loader.exec_module(for_wheel_tests)  # its wheel of this Triton for Python 3.12
    wheel = for_wheel_tests.make_wheel(tmp_path / "triton-cp312.whl")
    here = python_name(this_fingerprint())
    cache, out = tmp_path / "cache", tmp_path / "warm.tar.gz"
    spec = ["--target", "sm90", "--cache-dir", str(cache)]
    assert main(["warmup", str(dtypes_spec_file), *spec, "--for-wheel", str(wheel), "-j", "1"]) == 0
    capsys.readouterr()

    # create without --for: the entries are there, keyed for another environment: it says which
    assert main(["bundle", "create", str(out), str(dtypes_spec_file), *spec]) == 2
    err = capsys.readouterr().err
    assert ("the cache's sm90 entries are keyed for Python 3.12, Triton " in err
            and "(keyed --for-wheel triton-cp312.whl), not this runtime: bundle them with `bundle create ... "
                "--for-wheel triton-cp312.whl`" in err), err
    assert main(["bundle", "create", str(out), str(dtypes_spec_file), *spec, "--for-wheel", str(wheel)]) == 0

    # verify: judged for the environment the bundle carries, or the one named
    capsys.readouterr()
    assert main(["bundle", "verify", str(out)]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "environment: for Python 3.12, Triton " in text and f"this runtime is {here}" in text
    assert main(["bundle", "verify", str(out), "--for-wheel", str(wheel)]) == 0
    assert "environment: matches the runtime of --for-wheel" in " ".join(capsys.readouterr().out.split())
    this_env = tmp_path / "this.json"
    assert main(["env", "-o", str(this_env)]) == 0
    capsys.readouterr()
    assert main(["bundle", "verify", str(out), "--for", str(this_env)]) == 1
    text = " ".join(capsys.readouterr().out.split())
    assert "this bundle is for Python 3.12, Triton" in text and f"warm with {here}" not in text, text

    # install here (not its server): the warning names the bundle's environment, not a fix for this one
    assert main(["bundle", "install", str(out), "--cache-dir", str(tmp_path / "here")]) == 0
    err = " ".join(capsys.readouterr().err.split())
    assert "this bundle is for Python 3.12, Triton" in err and f"warm with {here}" not in err, err
    # installed for its server (an image build on this machine): judged for that runtime, nothing to warn of
    assert main(["bundle", "install", str(out), "--cache-dir", str(tmp_path / "image"), "--for-wheel", str(wheel)]) == 0
    err = capsys.readouterr().err
    assert "this bundle is for" not in err and "warning: installed for another runtime" in err


def test_every_command_has_a_description_and_an_example_that_parses():
    from tritonwarm.cli import _parser
    from tritonwarm.cli.examples import subcommands

    parser = _parser()
    seen = []
    for path, sub, _ in subcommands(parser):
        seen.append(" ".join(path))
        assert sub.description, f"{' '.join(path)} --help has no description"
        assert sub.epilog and sub.epilog.startswith("example:\n  tritonwarm "), f"{' '.join(path)} has no example"
        example = sub.epilog.splitlines()[1].split()[1:]
        assert example[:len(path)] == list(path), sub.epilog
        assert getattr(parser.parse_args(example), "func", None), sub.epilog  # it parses: no drift
        assert "example:" in sub.format_help()
    assert {"warmup", "check", "bundle create", "bundle verify", "engine run", "targets"} <= set(seen)


def test_target_takes_gpu_names_and_names_the_nearest(run_cli):
    from tritonwarm.jit.core.targets import UnknownTargetError, resolve_target, resolve_targets

    assert resolve_target("h100").name == "sm90" and resolve_target("NVIDIA H200").name == "sm90"
    assert resolve_target("a100-80gb").name == "sm80" and resolve_target("a10g").name == "sm86"
    assert resolve_target("MI300X").name == "gfx942" and resolve_target("mi355x").name == "gfx950"
    assert resolve_target("b200").name == "sm100" and resolve_target("rtx5090").name == "sm120"
    assert [t.name for t in resolve_targets("h100,h200,mi300x")] == ["sm90", "gfx942"]
    with pytest.raises(UnknownTargetError, match=r"unknown target 'h10' \(nearest: h100\)"):
        resolve_target("h10")
    out = run_cli("targets", rc=0).stdout
    assert any(line.startswith("sm90 ") and "h100, h200, h800" in line for line in out.splitlines()), out
    assert any(line.startswith("gfx942 ") and "mi300x" in line for line in out.splitlines()), out


@pytest.mark.slow
def test_tritons_fp_fusion_warning_is_shown_once_a_run(tmp_path, dtypes_spec_file, run_cli):
    pytest.importorskip("triton._utils").__dict__.get("FP_FUSION_DEFAULT_WARNING") or pytest.skip(
        "this Triton does not warn of its FP fusion default")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_DEFAULT_FP_FUSION"}
    err = run_cli("warmup", dtypes_spec_file, "--target", "sm90", "-j", "2", "--cache-dir", tmp_path / "cache",
                  rc=0, env=env).stderr
    assert err.count("TRITON_DEFAULT_FP_FUSION is unset") == 1, err
    assert "defaulting to FP fusion ENABLED" not in err  # Triton's own, once in every worker


def test_an_engine_run_on_a_cpu_prints_progress(run_cli):
    env = {**os.environ, "TRITONWARM_PROGRESS_SECONDS": "0.01"}
    proc = run_cli("engine", "run", "--config", "tiny", "--mode", "reference", "--requests", "2", "--max-tokens", "2",
                   rc=0, env=env)
    assert "tritonwarm engine run: " in proc.stderr and "(0 s)" in proc.stderr, proc.stderr


@pytest.mark.slow
def test_no_line_of_default_output_is_over_200_characters(tmp_path, spec_file, capsys, monkeypatch):
    from tritonwarm.cli import main
    from tritonwarm.jit.cache import Manifest

    deep = tmp_path / "deploy-paths-are-often-this-long"  # a path is never broken: two of them on one line are
    cache, bundle = deep / "cache", deep / "warm-sm90.tar.gz"
    spec = [str(spec_file), "--target", "h100", "--cache-dir", str(cache)]
    runs = [["warmup", *spec, "-j", "1"], ["check", *spec], ["list", "--cache-dir", str(cache)],
            ["du", "--cache-dir", str(cache)], ["targets"], ["env"], ["bundle", "create", str(bundle), *spec],
            ["bundle", "verify", str(bundle)], ["bundle", "install", str(bundle), "--cache-dir", str(deep / "served")],
            ["prune", "--unplanned", "--dry-run", "--cache-dir", str(cache)],
            ["check", *spec, "--serve-at", str(deep / "mounted" / "elsewhere")]]
    outputs = []
    for argv in runs:
        main(argv)
        captured = capsys.readouterr()
        outputs.append((argv, captured.out + captured.err))
    [variant] = list(Manifest(cache, "sm90").read().values())[:1]
    main(["show", variant["id"], "--cache-dir", str(cache)])
    outputs.append((["show"], capsys.readouterr().out))
    monkeypatch.setenv("TRITON_DEFAULT_FP_FUSION", "0")  # every key differs: the longest reasons
    assert main(["check", *spec]) == 1
    outputs.append((["check", "fp fusion"], capsys.readouterr().out))
    assert main(["bundle", "verify", str(bundle)]) == 1
    outputs.append((["bundle verify", "fp fusion"], capsys.readouterr().out))
    for argv, out in outputs:
        long = [line for line in out.splitlines() if len(line) > 200]
        assert not long, f"{' '.join(argv[:2])}: {long[0]}"


@pytest.mark.slow
def test_check_with_the_wrong_serve_at_says_each_cause_once_with_a_count(tmp_path, spec_file, capsys):
    from tritonwarm.cli import main

    warmed, bundle, volume = tmp_path / "warmed", tmp_path / "warm.tar.gz", tmp_path / "volume"
    spec = [str(spec_file), "--target", "sm90"]
    assert main(["warmup", *spec, "--cache-dir", str(warmed), "-j", "1"]) == 0
    assert main(["bundle", "create", str(bundle), *spec, "--cache-dir", str(warmed)]) == 0
    assert main(["bundle", "install", str(bundle), "--cache-dir", str(volume), "--serve-at", "/srv/cache"]) == 0
    capsys.readouterr()
    wrong = ["check", *spec, "--cache-dir", str(volume), "--serve-at", "/srv/elsewhere"]
    assert main(wrong) == 1
    out = capsys.readouterr().out
    assert out.count("why: ") == 1 and "  missing  " not in out, out
    assert "missing: 2 (copied): rms_norm_kernel: the why line above says why (--verbose lists each)" in out
    assert main([*wrong, "--verbose"]) == 1
    assert capsys.readouterr().out.count("  missing  ") == 2


def test_the_gpu_table_in_the_docs_is_the_one_targets_prints():
    from tritonwarm.jit.core.gpu_names import gpus_of
    from tritonwarm.jit.core.targets import TARGETS

    page = open(os.path.join(os.path.dirname(__file__), "..", "docs", "targets.md")).read()
    rows = [line.split("|")[1:4] for line in page.splitlines() if line.startswith("| `")]
    rows = [row for row in rows if row[1].strip() in ("cuda", "hip")]  # the GPU table, not the limits table
    table = {name.strip(" `"): [gpu.strip() for gpu in gpus.split(",")] for name, _, gpus in rows}
    assert table == {name: gpus_of(name) for name in TARGETS}
