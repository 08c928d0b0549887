"""``tritonwarm record`` of ordinary programs: kernels in the main script, a ``tl.constexpr`` between
runtime parameters (with defaults and keyword-only parameters), modules imported from the program's
own folder. The plan replays to the keys Triton computes for the program's own launches on real
(CPU) tensors under the target's driver, and warms without the program's folder on PYTHONPATH."""

import importlib.util
import sys
import textwrap

import pytest
import torch
from tritonwarm.jit import TARGETS
from tritonwarm.jit.adopt.record import launch_row, replay
from tritonwarm.jit.cache import entry_files
from tritonwarm.jit.core.trace import capture
from tritonwarm.jit.pipeline.plan import plan
from tritonwarm.jit.pipeline.specs import load_specs

SM90 = TARGETS["sm90"]

MIXED_KERNEL = """
import triton
import triton.language as tl

GAIN = tl.constexpr(2)


@triton.jit
def mixed(x_ptr, BLOCK: tl.constexpr, out_ptr, n, ACT: tl.constexpr = 0, scale=1.0, *, EXTRA: tl.constexpr = 3, m=16):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n)
    if ACT:
        x = tl.maximum(x, 0.0)
    tl.store(out_ptr + offs, x * scale * GAIN + EXTRA + m, mask=offs < n)
"""

LOCAL_MODULE = """
import triton
import triton.language as tl


@triton.jit
def scale_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) * 3.0, mask=offs < n)


def scale(x):
    out = torch_empty_like(x)
    scale_kernel[(triton.cdiv(x.numel(), 256),)](x, out, x.numel(), BLOCK=256)
    return out


def torch_empty_like(x):
    import torch

    return torch.empty_like(x)
"""

# A program as tutorials write them: its kernel in the main script, work at top level and in a main block.
# (Triton 3.6 compiles no keyword-only parameter: here they are ordinary ones, passed by keyword.)
PROGRAM = MIXED_KERNEL.replace("scale=1.0, *, EXTRA", "scale=1.0, EXTRA") + """
import argparse
import torch
import local_ops

torch.manual_seed(0)  # top-level work: a warm-up loading this script skips it


def run(device):
    for n in (1000, 4096):
        x = torch.randn(n, device=device)
        out = torch.empty_like(x)
        mixed[(4,)](x, 128, out, n, ACT=1, EXTRA=5, m=17)
        mixed[(4,)](x, 64, out, n)
        local_ops.scale(x)


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--device", default="cuda")
    run(p.parse_args().device)
"""


@pytest.fixture
def program(tmp_path):
    app = tmp_path / "app"
    app.mkdir()
    (app / "prog.py").write_text(PROGRAM)
    (app / "local_ops.py").write_text(LOCAL_MODULE)
    return app / "prog.py"


def _program_keys(path, monkeypatch):
    """The cache hashes Triton computes for the program's own launches: real CPU tensors, sm90's driver."""
    monkeypatch.syspath_prepend(str(path.parent))
    spec = importlib.util.spec_from_file_location("recorded_prog_under_test", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    with capture(SM90, all_kernels=True) as cap:
        module.run("cpu")
    return {v.cache_hash for v in cap.variants.values()}


def test_a_constexpr_between_runtime_parameters_replays_with_defaults_and_keyword_only(tmp_path, monkeypatch):
    (tmp_path / "mixed_kernels.py").write_text(MIXED_KERNEL)
    monkeypatch.syspath_prepend(str(tmp_path))
    from mixed_kernels import mixed

    x, out = torch.empty(1000), torch.empty(1000)
    with capture(SM90, all_kernels=True) as program:
        mixed[(1,)](x, 128, out, 1000, ACT=1, EXTRA=5, m=17)
        mixed[(1,)](x, 64, out, 1000)
        mixed[(1,)](x, 64, out, 1024, 1, 2.0)
    rows = [launch_row(v.specialization_data, v.jit_function, SM90.gpu_target, v.key)
            for v in program.variants.values()]
    with capture(SM90, all_kernels=True) as replayed:
        for row in rows:
            replay(row["kernel"], row["call"])
    assert len(program.variants) == 3
    assert {v.cache_hash for v in replayed.variants.values()} == {v.cache_hash for v in program.variants.values()}


@pytest.mark.slow
def test_a_program_with_kernels_in_its_main_script_and_its_own_folder_is_recorded_and_warmed(
        program, tmp_path, run_cli, monkeypatch):
    out = tmp_path / "prog.plan.yaml"
    proc = run_cli("record", "-o", out, "--target", "sm90", "--", sys.executable, program, "--device", "meta",
                   rc=0)
    assert "not recorded" not in proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == f"recorded 6 launches of 2 kernels (dry run for sm90) -> {out}"
    assert f"- {program.parent}" in out.read_text()  # its folder: an import root of the plan

    cache = tmp_path / "cache"
    run_cli("warmup", out, "--target", "sm90", "--cache-dir", cache, "--jobs", "1", rc=0)  # no PYTHONPATH for it
    run_cli("check", out, "--target", "sm90", "--cache-dir", cache, rc=0)

    monkeypatch.setattr(sys, "path", list(sys.path))
    warmed = set(plan(load_specs([out]), SM90).variants)
    assert warmed == _program_keys(program, monkeypatch)  # the keys the program's own launches get
    for cache_hash in warmed:
        variant = plan(load_specs([out]), SM90).variants[cache_hash]
        assert entry_files(cache, variant.entry_dir, variant.entry_name)


@pytest.mark.slow
def test_launches_that_cannot_be_recorded_are_said_once_with_a_count_and_one_summary(tmp_path, run_cli):
    script = tmp_path / "tuples.py"
    script.write_text(textwrap.dedent("""
        import torch
        import triton
        import triton.language as tl


        @triton.jit
        def pair_kernel(pair, n, BLOCK: tl.constexpr):
            offs = tl.arange(0, BLOCK)
            tl.store(pair[1] + offs, tl.load(pair[0] + offs, mask=offs < n), mask=offs < n)


        if __name__ == "__main__":
            for n in (16, 17, 1):
                x = torch.empty(n, device="meta")
                pair_kernel[(1,)]((x, torch.empty_like(x)), n, BLOCK=32)
        """))
    proc = run_cli("record", "-o", tmp_path / "plan.yaml", "--target", "sm90", "--", sys.executable, script, rc=1)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 2, proc.stderr
    assert lines[0].startswith(f"not recorded: {script}:pair_kernel: tuple argument 'pair' cannot be recorded")
    assert lines[0].endswith("(3 launches)")
    assert lines[1] == ("tritonwarm: no plan written: none of the program's launches could be recorded (dry run for "
                        "sm90); 3 launches not recorded (above)")
    assert not (tmp_path / "plan.yaml").exists()


def test_a_script_loaded_for_its_kernels_skips_its_work(program):
    from tritonwarm.jit.adopt.foreign import find_jit_function

    kernel = find_jit_function(f"{program}:mixed")
    assert kernel.fn.__module__ == str(program) and kernel.starting_line_number > 1
    assert find_jit_function(f"{program}:mixed") is kernel  # loaded once a process
    with pytest.raises(LookupError, match="defines no @triton.jit function 'absent'"):
        find_jit_function(f"{program}:absent")


def test_a_plan_names_where_its_modules_import_from(tmp_path, monkeypatch):
    """``import_roots``: put first on sys.path before the launcher's module is imported."""
    code = tmp_path / "code"
    code.mkdir()
    (code / "rooted_ops.py").write_text("def launch():\n    pass\n")
    spec = tmp_path / "plans" / "rooted.yaml"
    spec.parent.mkdir()
    spec.write_text("launcher: rooted_ops:launch\nimport_roots: [../code]\nargs: {}\n")
    monkeypatch.setattr(sys, "path", list(sys.path))
    [loaded] = load_specs([spec])
    assert loaded.launcher.__module__ == "rooted_ops" and sys.path[0] == str(code)


def test_a_dry_run_writes_no_dispatch_record(tmp_path, run_cli):
    proc = run_cli("record", "-o", tmp_path / "plan.yaml", "--target", "sm90", "--trace", tmp_path / "t.jsonl", "--",
                   sys.executable, "-c", "pass", rc=2)
    assert proc.stderr.strip().splitlines() == [
        "tritonwarm: error: record: --trace records what a real run found in Triton's cache: not with --target "
        "(a dry run launches nothing)"]


def test_import_roots_that_are_not_a_list_of_folders_are_named(tmp_path):
    from tritonwarm.jit.pipeline.specs import SpecError

    spec = tmp_path / "bad.yaml"
    spec.write_text("launcher: os.path:join\nimport_roots: lib\nargs: {}\n")
    with pytest.raises(SpecError, match="import_roots: must be a list of folders"):
        load_specs([spec])
