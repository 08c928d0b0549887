"""Why a warmed cache misses one variant, told per variant: its files removed, the kernel's code not
the code that warmed the cache (same key, another hash), a class no spec row declared (the nearest
warmed variant's differing arguments), a kernel never warmed. ``check``, the serving monitor and
``check --trace`` each say it."""

import json
import os
import shutil
import subprocess
import sys

import pytest
import torch
from tritonwarm.engine.plan import check_trace
from tritonwarm.jit import TARGETS
from tritonwarm.jit.cache import entry_path
from tritonwarm.jit.pipeline.check import check
from tritonwarm.jit.pipeline.plan import plan
from tritonwarm.jit.pipeline.specs import load_specs
from tritonwarm.jit.pipeline.warmup import warm
from tritonwarm.jit.serving.miss import (
    COPIED,
    FILES_GONE,
    NOT_WARMED,
    OTHER_CLASS,
    OTHER_CODE,
    OTHER_GLOBALS,
    OTHER_OPTIONS,
    WarmedNeighbours,
)
from tritonwarm.jit.serving.monitor import DispatchMonitor, JitPolicyError
from tritonwarm.launchers.rms_norm import rms_norm

FP16_ONLY = """
kernel: tritonwarm.launchers.rms_norm:rms_norm
args:
  x: {tensor: [8, 4096], dtype: float16}
  weight: {tensor: [4096], dtype: float16}
"""
SILU = """
kernel: tritonwarm.launchers.activation:silu_and_mul
args:
  x: {tensor: [8, 2816], dtype: bfloat16}
"""
SM90 = TARGETS["sm90"]


@pytest.fixture
def fp16_cache(tmp_path):
    """A cache warmed (sm90) for rms_norm on float16 only."""
    spec = tmp_path / "fp16.yaml"
    spec.write_text(FP16_ONLY)
    cache = tmp_path / "cache"
    warm(plan(load_specs([spec]), SM90, cache_dir=cache), cache)
    return cache


def _checked(tmp_path, cache, *spec_texts):
    paths = []
    for n, text in enumerate(spec_texts):
        paths.append(tmp_path / f"checked{n}.yaml")
        paths[-1].write_text(text)
    return check(plan(load_specs(paths), SM90), cache)


@pytest.mark.slow
def test_a_class_no_row_declared_names_the_nearest_warmed_variant_and_what_differs(tmp_path, fp16_cache,
                                                                                    dtypes_spec_file):
    report = check(plan(load_specs([dtypes_spec_file]), SM90), fp16_cache)
    [missing] = report.missing
    assert missing["args"]["x_ptr"] == "*bf16 aligned"
    assert ("differs in x_ptr (warmed *fp16 aligned, here *bf16 aligned), weight_ptr (warmed *fp16 aligned, here "
            "*bf16 aligned), out_ptr (warmed *fp16 aligned, here *bf16 aligned): this class was not warmed"
            ) in missing["why"]
    assert report.reasons == []  # one class missing is not a cause shared by the cache


@pytest.mark.slow
def test_a_cache_copied_to_another_path_is_named_as_copied(tmp_path, fp16_cache):
    """Triton's group files hold absolute paths: a copy whose original is gone misses everything."""
    copy = tmp_path / "copy"
    shutil.copytree(fp16_cache, copy)
    shutil.rmtree(fp16_cache)
    report = _checked(tmp_path, copy, FP16_ONLY)
    [missing] = report.missing
    assert f"its entry is here, but names its files under {fp16_cache}/" in missing["why"]
    assert report.reasons == [f"1 planned variant is in a cache copied or mounted from {fp16_cache}: Triton's group "
                              f"files name the files there by absolute path, and a server reading {copy} misses them: "
                              "move a cache with `tritonwarm bundle create` / `bundle install`, for the path the "
                              f"server reads (`bundle install BUNDLE --serve-at {copy}` where it is installed at "
                              "another path)"]


@pytest.mark.slow
def test_a_server_with_other_compile_options_is_told_which(tmp_path, fp16_cache, run_cli):
    (tmp_path / "fp16.yaml").write_text(FP16_ONLY)
    env = {**os.environ, "TRITON_DEBUG": "1"}  # no part of the environment's fingerprint: an option in Triton's key
    out = run_cli("check", tmp_path / "fp16.yaml", "--target", "sm90", "--cache-dir", fp16_cache, "--verbose", rc=1,
                  env=env).stdout
    assert "has the same arguments, compiled with other options: debug (warmed False, here True)" in out
    assert "why: 1 planned variant is warmed with other compile options: debug (warmed False, here True)" in out


@pytest.mark.slow
def test_a_kernel_never_warmed_and_removed_files_are_named(tmp_path, fp16_cache):
    report = _checked(tmp_path, fp16_cache, FP16_ONLY, SILU)
    [missing] = report.missing
    assert missing["kernel"].endswith("silu_and_mul_kernel")
    assert missing["why"].startswith("no variant of this kernel is warmed for this environment")

    [variant] = [v for v in plan(load_specs([tmp_path / "checked0.yaml"]), SM90).variants.values()]
    shutil.rmtree(entry_path(fp16_cache, variant.entry_dir))
    report = _checked(tmp_path, fp16_cache, FP16_ONLY)
    [missing] = report.missing
    assert "the manifest records it as warmed, but its files are gone" in missing["why"]
    assert report.reasons == ["1 planned variant is recorded as warmed, but the files are gone (removed since "
                              "the warm-up): warm up again"]


@pytest.mark.slow
def test_a_cache_warmed_for_another_gpu_says_so_once(tmp_path, fp16_cache, run_cli):
    (tmp_path / "fp16.yaml").write_text(FP16_ONLY)
    report = check(plan(load_specs([tmp_path / "fp16.yaml"]), TARGETS["sm100"]), fp16_cache)
    assert len(report.missing) == 1 and "why" not in report.missing[0]
    assert report.reasons == ["this cache holds no entry for sm100, only for sm90: warm with --target sm100"]
    out = run_cli("check", tmp_path / "fp16.yaml", "--target", "sm100", "--cache-dir", fp16_cache, rc=1).stdout
    assert "why: this cache holds no entry for sm100, only for sm90: warm with --target sm100" in out


def test_a_cold_cache_or_one_of_another_environment_gets_no_per_variant_reason():
    wanted = {"kernel": "k", "args": {"n": "i32"}, "cache_hash": "0" * 64, "key": "k1"}
    assert WarmedNeighbours({}, {}, {"triton": {"version": "3.9.0"}, "env": {}}, "sm90").why(wanted) is None
    other = {"1" * 64: {"id": "111111111111", "kernel": "k", "args": {"n": "i32"}, "key": "k1",
                        "triton_version": "3.6.0", "env": {}}}
    assert WarmedNeighbours(other, {}, {"triton": {"version": "3.9.0"}, "env": {}}, "sm90").why(wanted) is None


def test_each_reason_is_told_from_the_nearest_entry():
    runtime = {"triton": {"version": "3.9.0"}, "env": {}}
    entry = {"kernel": "k", "args": {"x": "*bf16 aligned", "n": "i32:div16", "BLOCK": "=256"}, "key": "K",
             "num_warps": 4, "num_stages": 2, "triton_version": "3.9.0", "env": {}}
    far = {**entry, "args": {"x": "*fp32 aligned", "n": "i32", "BLOCK": "=128"}, "key": "F"}
    recorded = {"a" * 64: {**entry, "id": "aaaaaaaaaaaa"}, "b" * 64: {**far, "id": "bbbbbbbbbbbb"}}
    neighbours = WarmedNeighbours(recorded, {}, runtime, "sm90")

    def why(**changes):
        return neighbours.why({**entry, "cache_hash": "c" * 64, **changes})

    assert (why().kind, why().neighbour) == (OTHER_CODE, "aaaaaaaaaaaa")
    assert why(cache_hash="a" * 64).kind == FILES_GONE
    assert why(kernel="other").kind == NOT_WARMED
    moved = why(args={**entry["args"], "n": "i32"}, key="K2")
    assert (moved.kind, moved.neighbour) == (OTHER_CLASS, "aaaaaaaaaaaa")
    assert "differs in n (warmed i32:div16, here i32):" in moved.line
    warps = why(num_warps=8, key="K3")
    assert "differs in num_warps (warmed 4, here 8)" in warps.line
    # the same arguments and options under another key: options Triton keys on beyond num_warps / stages
    assert "other launch options" in why(key="K4").line and why(key="K4").kind == OTHER_CLASS
    many = why(args={"x": "*fp16 aligned", "n": "i64", "BLOCK": "=64", "extra": "i32"}, key="K5")
    assert many.line.count("(warmed") == 3 and "and 1 more" in many.line


def test_module_level_constexprs_with_other_values_are_named_where_both_sides_recorded_them():
    runtime = {"triton": {"version": "3.9.0"}, "env": {}}
    entry = {"kernel": "k", "args": {"n": "i32"}, "key": "K", "triton_version": "3.9.0", "env": {},
             "constexpr_globals": {"USE_FAST": "False", "SCALE": "1.0"}}
    neighbours = WarmedNeighbours({"a" * 64: {**entry, "id": "aaaaaaaaaaaa"}}, {}, runtime, "sm90")
    here = {**entry, "cache_hash": "c" * 64, "constexpr_globals": {"USE_FAST": "True", "SCALE": "1.0", "NEW": "3"}}
    reason = neighbours.why(here)
    assert (reason.kind, reason.neighbour) == (OTHER_GLOBALS, "aaaaaaaaaaaa")
    assert "the module-level constexprs the kernel reads differ: NEW (warmed -, here 3), USE_FAST (warmed False, " \
           "here True): values computed when the module is imported" in reason.line
    assert neighbours.why({**entry, "cache_hash": "c" * 64}).kind == OTHER_CODE  # same values: the code differs
    before = {k: v for k, v in here.items() if k != "constexpr_globals"}  # a monitor record without them
    assert neighbours.why(before).kind == OTHER_CODE


def test_options_are_read_from_tritons_key():
    runtime = {"triton": {"version": "3.9.0"}, "env": {}}
    key = "[('*bf16', 'D'), ('i32', 'D')]{'num_warps': 4, 'num_stages': 2, 'debug': False}"
    entry = {"id": "aaaaaaaaaaaa", "kernel": "k", "args": {"x": "*bf16 aligned"}, "key": key, "num_warps": 4,
             "num_stages": 2, "triton_version": "3.9.0", "env": {}}
    neighbours = WarmedNeighbours({"a" * 64: entry}, {}, runtime, "sm90")
    debug = neighbours.why({**entry, "cache_hash": "c" * 64, "key": key.replace("False", "True")})
    assert debug.line == ("nearest warmed variant aaaaaaaaaaaa has the same arguments, compiled with other options: "
                          "debug (warmed False, here True): serve with the options the warm-up had (TRITON_DEBUG, say)")
    warps = neighbours.why({**entry, "cache_hash": "c" * 64, "key": key.replace("'num_warps': 4", "'num_warps': 8")})
    assert "differs in num_warps (warmed 4, here 8): this class was not warmed" in warps.line
    unparsed = neighbours.why({**entry, "cache_hash": "c" * 64, "key": "not a key]{", "num_warps": 8})
    assert "differs in num_warps (warmed 4, here 8)" in unparsed.line  # the record's own fields


def test_the_serving_monitor_says_why_a_launch_misses(fp16_cache, tmp_path):
    monitor = DispatchMonitor(fp16_cache, policy="error")
    x = torch.empty(8, 4096, dtype=torch.bfloat16, device="meta")
    with pytest.raises(JitPolicyError, match=r"differs in x_ptr \(warmed \*fp16 aligned, here \*bf16 aligned\)"):
        with monitor.dry_run(SM90):
            rms_norm(x, torch.empty(4096, dtype=torch.bfloat16, device="meta"))

    with pytest.raises(JitPolicyError, match="this cache holds no entry for sm100, only for sm90"):
        with DispatchMonitor(fp16_cache, policy="error").dry_run(TARGETS["sm100"]):
            rms_norm(x.half(), torch.empty(4096, dtype=torch.float16, device="meta"))

    monitor = DispatchMonitor(fp16_cache, policy="warn")
    with monitor.dry_run(SM90):
        rms_norm(x, torch.empty(4096, dtype=torch.bfloat16, device="meta"))
        rms_norm(x.half(), torch.empty(4096, dtype=torch.float16, device="meta"))
    record = tmp_path / "record.jsonl"
    monitor.write_record(record)
    [miss] = [json.loads(line) for line in record.read_text().splitlines() if not json.loads(line)["hit"]]
    assert miss["key"] and miss["num_warps"] and "differs in x_ptr" in miss["why"]

    report = check_trace(record, fp16_cache, "sm90")
    [traced] = report.misses
    assert "differs in x_ptr (warmed *fp16 aligned, here *bf16 aligned)" in traced["why"]


@pytest.mark.slow
def test_check_names_a_kernel_whose_code_is_not_the_code_that_warmed_the_cache(custom_kernel, tmp_path, run_cli):
    """The deployment case: CI warmed with one release of the kernels, the server runs another."""
    code, spec, env = custom_kernel
    cache = tmp_path / "cache"
    run_cli("warmup", spec, "--target", "sm90", "--cache-dir", cache, rc=0, env=env)
    kernels = code / "edited_kernels.py"
    kernels.write_text(kernels.read_text().replace("x + 1.0", "x + 2.0"))

    out = run_cli("check", spec, "--target", "sm90", "--cache-dir", cache, "--verbose", rc=1, env=env).stdout
    assert "1 missing" in out
    out = " ".join(out.split())  # lines over 200 characters are wrapped
    assert ("why: edited_kernels.add_const: 1 planned variant is cached for Triton's same keys under other "
            "hashes: the kernel's code is not the code that warmed this cache") in out
    assert "has Triton's same key (arguments and options) under another hash" in out
    report = json.loads(run_cli("check", spec, "--target", "sm90", "--cache-dir", cache, "--json", rc=1,
                                env=env).stdout)
    [missing] = report["targets"][0]["missing"]
    assert "is not the code that warmed it" in missing["why"]


DRY_RUN = """
import torch
from tritonwarm.jit import TARGETS
from tritonwarm.jit.serving.monitor import DispatchMonitor, JitPolicyError
from edited_launchers import add_const_launcher

try:
    with DispatchMonitor({cache!r}, policy="error").dry_run(TARGETS["sm90"]):
        add_const_launcher(torch.empty(1024, device="meta"))
except JitPolicyError as e:
    print(e)
"""


@pytest.mark.slow
def test_a_module_level_constexpr_computed_at_import_is_named_when_it_differs(custom_kernel, tmp_path, run_cli):
    """A kernel module that reads an environment variable (or the machine) at import: the build
    machine and the server hash the same source into other keys, and the miss names the value."""
    code, spec, env = custom_kernel
    kernels = code / "edited_kernels.py"
    kernels.write_text("import os\n" + kernels.read_text().replace("x + 1.0", "x + INCREMENT").replace(
        "@triton.jit", 'INCREMENT = tl.constexpr(float(os.environ.get("ADD_CONST_INCREMENT", "1.0")))\n\n\n'
                       "@triton.jit"))
    cache = tmp_path / "cache"
    run_cli("warmup", spec, "--target", "sm90", "--cache-dir", cache, rc=0, env=env)
    [entry] = json.loads((cache / "tritonwarm" / "manifest-sm90.json").read_text())["variants"].values()
    assert entry["constexpr_globals"] == {"INCREMENT": "1.0"}
    run_cli("check", spec, "--target", "sm90", "--cache-dir", cache, rc=0, env=env)

    server = {**env, "ADD_CONST_INCREMENT": "2.0"}
    out = " ".join(run_cli("check", spec, "--target", "sm90", "--cache-dir", cache, rc=1, env=server).stdout.split())
    assert ("why: edited_kernels.add_const: 1 planned variant is cached for Triton's same keys under other hashes, "
            "warmed with other values of the module-level constexprs the kernel reads: INCREMENT (warmed 1.0, here "
            "2.0): values computed when the module is imported (from an environment variable, or the machine) are "
            "part of every key of the kernel: warm where they have the serving values") in out
    served = subprocess.run([sys.executable, "-c", DRY_RUN.format(cache=str(cache))], env=server, text=True,
                            capture_output=True, timeout=300)
    assert "would compile at serving time" in served.stdout and "INCREMENT (warmed 1.0, here 2.0)" in served.stdout, \
        served.stdout + served.stderr


@pytest.mark.slow
def test_check_notes_that_triton_here_reads_another_folder(tmp_path, fp16_cache, run_cli):
    (tmp_path / "fp16.yaml").write_text(FP16_ONLY)
    args = ("check", tmp_path / "fp16.yaml", "--target", "sm90", "--cache-dir", fp16_cache)
    elsewhere = " ".join(run_cli(*args, rc=0, env={**os.environ, "TRITON_CACHE_DIR": str(tmp_path / "other")}).stdout
                         .split())  # lines over 200 characters are wrapped
    assert f"note: Triton in this environment reads {tmp_path / 'other'}: serve with TRITON_CACHE_DIR={fp16_cache}" \
        in elsewhere
    assert "note: Triton" not in run_cli(*args, rc=0, env={**os.environ, "TRITON_CACHE_DIR": str(fp16_cache)}).stdout

    # Triton's default folder, TRITON_CACHE_DIR unset: read only until torch.compile sets it (at its first kernel)
    default = tmp_path / "home" / ".triton" / "cache"
    default.mkdir(parents=True)
    env = {**{k: v for k, v in os.environ.items() if k != "TRITON_CACHE_DIR"}, "TRITON_HOME": str(tmp_path / "home")}
    out = run_cli("check", tmp_path / "fp16.yaml", "--target", "sm90", "--cache-dir", default, rc=1, env=env).stdout
    out = " ".join(out.split())
    assert ("note: TRITON_CACHE_DIR is unset: Triton reads this folder by default, until torch.compile points it at "
            f"Inductor's: serve with TRITON_CACHE_DIR={default}") in out


@pytest.mark.slow
def test_check_and_env_name_a_runtime_that_compiles_whatever_the_cache_holds(tmp_path, fp16_cache, run_cli):
    (tmp_path / "fp16.yaml").write_text(FP16_ONLY)
    env = {**os.environ, "TRITON_ALWAYS_COMPILE": "1", "TRITON_CACHE_DIR": str(fp16_cache)}
    out = run_cli("check", tmp_path / "fp16.yaml", "--target", "sm90", "--cache-dir", fp16_cache, rc=1, env=env).stdout
    assert "sm90: PROBLEMS: 1 variant planned from " in out and ", 0 missing" in out
    assert "runtime: TRITON_ALWAYS_COMPILE is set: Triton compiles every kernel at its first launch" in out
    assert "WARNING      TRITON_ALWAYS_COMPILE is set" in run_cli("env", rc=0, env=env).stdout

    # keyed for a server (--for): this build machine's own settings say nothing of the server's
    serving = tmp_path / "serving.json"
    run_cli("env", "-o", serving, rc=0)
    env["TRITON_CACHE_DIR"] = str(tmp_path / "elsewhere")
    out = run_cli("check", tmp_path / "fp16.yaml", "--target", "sm90", "--cache-dir", fp16_cache, "--for", serving,
                  rc=0, env=env).stdout
    assert "sm90: ok: 1 variant planned from " in out and ", 0 missing" in out
    assert "runtime:" not in out and "note: Triton" not in out


def test_a_variant_whose_compile_failed_is_named_as_failed_with_its_error_row_and_module(tmp_path, run_cli):
    """The warm-up names the row, the kernel and its module; ``check`` then says the compile failed and
    why, one line for the kernel and error with its count, not that a class was not warmed."""
    name = f"fails_to_compile_{os.getpid()}"
    (tmp_path / f"{name}.py").write_text("""
import triton
import triton.language as tl


@triton.jit
def copy_kernel(x_ptr, n, BLOCK: tl.constexpr):
    tl.static_assert(BLOCK <= 128, "BLOCK over 128")
    offs = tl.arange(0, BLOCK)
    tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=offs < n), mask=offs < n)


def copy(x, block):
    copy_kernel[(1,)](x, x.numel(), BLOCK=block)
""")
    spec = tmp_path / "blocks.yaml"
    spec.write_text(f"""
launcher: {name}:copy
capture: all
axes:
  block: [64, 256, 512]
args:
  x: {{tensor: [1000], dtype: float32}}
  block: $block
""")
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    cache = tmp_path / "cache"
    warmed = run_cli("warmup", spec, "--target", "sm90", "--cache-dir", cache, rc=1, env=env)
    failures = [line for line in warmed.stderr.splitlines() if line.startswith("problem: ")]
    assert len(failures) == 2 and all(f"{name}.copy_kernel" in line and "BLOCK over 128" in line for line in failures)
    assert {line.split(": ")[1] for line in failures} == {"blocks.yaml#1 (block=256)", "blocks.yaml#2 (block=512)"}

    checked = json.loads(run_cli("check", spec, "--target", "sm90", "--cache-dir", cache, "--json", rc=1,
                                 env=env).stdout)["targets"][0]
    assert [m["cause"] for m in checked["missing"]] == ["compile failed"] * 2
    reason = "2 planned variants are missing: the warm-up could not compile them, first blocks.yaml#1 (block=256): "
    assert len(checked["reasons"]) == 1 and reason in checked["reasons"][0]
    assert checked["reasons"][0].endswith("BLOCK over 128")
    said = run_cli("check", spec, "--target", "sm90", "--cache-dir", cache, rc=1, env=env).stdout
    assert "missing: 2 (compile failed)" in said and "other class" not in said

    (tmp_path / f"{name}.py").write_text((tmp_path / f"{name}.py").read_text().replace("<= 128", "<= 512"))
    run_cli("warmup", spec, "--target", "sm90", "--cache-dir", cache, rc=0, env=env)
    assert run_cli("check", spec, "--target", "sm90", "--cache-dir", cache, "--json", rc=0, env=env)


RUNTIME = {"triton": {"version": "3.9.0"}, "env": {}}
KEY = "[('*bf16', 'D'), ('i32', 'D')]{'num_warps': 4, 'num_stages': 2, 'debug': False}"
ENTRY = {"kernel": "m.k", "args": {"x": "*bf16 aligned", "n": "i32:div16"}, "key": KEY, "num_warps": 4,
         "num_stages": 2, "triton_version": "3.9.0", "env": {}}


def test_every_reason_line_names_the_neighbour_what_differs_and_the_fix():
    """The whole line, for each cause: what a person reads after a missing variant."""
    neighbours = WarmedNeighbours({"a" * 64: {**ENTRY, "id": "aaaaaaaaaaaa"}}, {}, RUNTIME, "sm90")

    def why(**changes):
        return neighbours.why({**ENTRY, "cache_hash": "c" * 64, **changes})

    gone = why(cache_hash="a" * 64)
    assert (gone.kind, gone.neighbour, gone.line) == (FILES_GONE, "aaaaaaaaaaaa", (
        "the manifest records it as warmed, but its files are gone (removed since the warm-up): warm up again"))
    never = why(kernel="m.other")
    assert (never.kind, never.neighbour, never.line) == (NOT_WARMED, None, (
        "no variant of this kernel is warmed for this environment: warm a spec or engine config that launches it"))
    code = why()
    assert (code.kind, code.neighbour, code.line) == (OTHER_CODE, "aaaaaaaaaaaa", (
        "variant aaaaaaaaaaaa has Triton's same key (arguments and options) under another hash: the kernel's code "
        "(its source or a @triton.jit helper) is not the code that warmed it: warm with the code that serves"))
    options = why(key=KEY + " ")  # same arguments and options as parsed, another key: options beyond them
    assert (options.kind, options.neighbour, options.line) == (OTHER_CLASS, "aaaaaaaaaaaa", (
        "variant aaaaaaaaaaaa has the same arguments under another hash: other launch options, or other code of "
        "the kernel"))
    cls = why(args={"x": "*bf16 aligned", "n": "i32"}, key="K2")
    assert (cls.kind, cls.neighbour, cls.line) == (OTHER_CLASS, "aaaaaaaaaaaa", (
        "nearest warmed variant aaaaaaaaaaaa differs in n (warmed i32:div16, here i32): this class was not warmed: "
        "warm a spec row that launches it"))
    debug = why(key=KEY.replace("False", "True"))
    assert (debug.kind, debug.detail) == (OTHER_OPTIONS, "debug (warmed False, here True)")
    # an argument the warmed variant lacks, or one only it has, is told with "-"
    extra = why(args={**ENTRY["args"], "m": "i32"}, key="K3")
    assert "differs in m (warmed -, here i32)" in extra.line
    fewer = why(args={"x": "*bf16 aligned"}, key="K4")
    assert "differs in n (warmed i32:div16, here -)" in fewer.line


def test_the_nearest_neighbour_is_the_one_with_fewest_differences_and_three_are_named():
    near = {**ENTRY, "id": "bbbbbbbbbbbb", "args": {"x": "*bf16 aligned", "n": "i32"}, "key": "KB"}
    far = {**ENTRY, "id": "aaaaaaaaaaaa", "args": {"x": "*fp16 aligned", "n": "i32"}, "key": "KA"}
    neighbours = WarmedNeighbours({"a" * 64: far, "b" * 64: near}, {}, RUNTIME, "sm90")
    reason = neighbours.why({**ENTRY, "cache_hash": "c" * 64, "args": {"x": "*bf16 aligned", "n": "i64"}, "key": "K"})
    assert reason.neighbour == "bbbbbbbbbbbb" and reason.line.startswith(
        "nearest warmed variant bbbbbbbbbbbb differs in n (warmed i32, here i64): this class")
    args = {f"a{i}": "i32" for i in range(4)}
    wide = WarmedNeighbours({"a" * 64: {**ENTRY, "id": "aaaaaaaaaaaa", "args": args}}, {}, RUNTIME, "sm90")
    three = wide.why({**ENTRY, "cache_hash": "c" * 64, "key": "K", "args": {f"a{i}": "i64" for i in range(3)} | {
        "a3": "i32"}})
    assert "a0 (warmed i32, here i64), a1 (warmed i32, here i64), a2 (warmed i32, here i64): this" in three.line
    assert " more" not in three.line
    four = wide.why({**ENTRY, "cache_hash": "c" * 64, "key": "K", "args": {f"a{i}": "i64" for i in range(4)}})
    assert "a2 (warmed i32, here i64) and 1 more: this class" in four.line and "a3" not in four.line


def test_another_target_only_is_told_and_a_damaged_manifest_explains_nothing(tmp_path):
    from tritonwarm.jit.cache import Manifest
    from tritonwarm.jit.cache.layout import entry_dir_name

    h = "d" * 64
    record = {**ENTRY, "id": h[:12], "target": "gfx942", "entry_name": "k", "entry_dir": entry_dir_name(h)}
    Manifest(tmp_path, "gfx942").update({h: record})
    wanted = {**ENTRY, "cache_hash": "c" * 64}
    reason = WarmedNeighbours.of_cache(tmp_path, "sm90", RUNTIME).why(wanted)
    assert reason.line == "this cache holds no entry for sm90, only for gfx942: warm with --target sm90"
    assert WarmedNeighbours.of_cache(tmp_path, "gfx942", RUNTIME).why(wanted).kind == OTHER_CODE
    # records of this target under another environment: not another target's cache
    assert WarmedNeighbours({h: record}, {}, {"triton": {"version": "3.6.0"}, "env": {}}, "sm90",
                            ["gfx942"]).why(wanted) is None
    (tmp_path / "tritonwarm" / "manifest-gfx942.json").write_text("{not json")
    assert WarmedNeighbours.of_cache(tmp_path, "gfx942", RUNTIME).why(wanted) is None


def test_a_cache_warmed_only_for_other_targets_names_them_and_the_fix():
    from tritonwarm.jit.serving.miss import OTHER_TARGET, WarmedNeighbours

    neighbours = WarmedNeighbours({}, {}, {}, "sm90", other_targets=["gfx942", "sm80", "sm90"])
    reason = neighbours.why({"kernel": "pkg.k", "args": {}})
    assert reason.kind == OTHER_TARGET
    assert reason.line == "this cache holds no entry for sm90, only for gfx942, sm80: warm with --target sm90"
    assert WarmedNeighbours({}, {}, {}, "sm90").why({"kernel": "pkg.k"}) is None  # a cold cache explains nothing


def test_differences_name_what_only_one_side_has_with_a_dash():
    from tritonwarm.jit.serving.miss import _differences, _differing_globals

    assert _differing_globals({"constexpr_globals": {"A": 1, "B": 2}}, {"constexpr_globals": {"A": 1, "C": 3}}) == \
        [("B", 2, "-"), ("C", "-", 3)]
    assert _differing_globals({}, {"constexpr_globals": {"A": 1}}) == []  # recorded before globals were
    options = {"options": {"num_warps": 4}}
    assert _differences(options, {"args": {"x": "i32"}, **options}) == [("x", "-", "i32")]
    assert _differences({"args": {"x": "i32"}, **options}, options) == [("x", "i32", "-")]


@pytest.mark.parametrize("key, options", [
    ("[('i32', 'D')]{'num_warps': 4, 'tag': 'x]{y'}", {"num_warps": 4, "tag": "x]{y"}),  # the first ]{ ends the key
    ("]{'num_warps': 2}", {"num_warps": 2}),
    ("{'num_warps': 2}", {"num_warps": 8, "num_stages": 3}),  # not Triton's form: the record's own fields
    ("[('i32', 'D')]{'num_warps': ", {"num_warps": 8, "num_stages": 3}),
    (None, {"num_warps": 8, "num_stages": 3}),
])
def test_the_compile_options_are_read_from_the_end_of_tritons_key(key, options):
    from tritonwarm.jit.serving.miss import _options

    assert _options({"key": key, "num_warps": 8, "num_stages": 3}) == options


def _recorded_in(cache_dir, cache_hash, record):
    from tritonwarm.jit.cache import Manifest
    from tritonwarm.jit.cache.layout import entry_dir_name

    record = {**record, "id": cache_hash[:12], "target": "sm90", "entry_name": "k",
              "entry_dir": entry_dir_name(cache_hash)}
    Manifest(cache_dir, "sm90").update({cache_hash: record})
    return record


def test_the_serving_monitors_neighbours_name_a_copied_cache_and_when_to_use_serve_at(tmp_path):
    """``of_cache`` (what the serving monitor asks) reads the group files of the cache it was given:
    an entry whose group names another folder's files is a copy, not files removed since the warm-up."""
    from tritonwarm.jit.cache.layout import entry_dir_name

    h = "e" * 64
    _recorded_in(tmp_path, h, ENTRY)
    here = entry_path(tmp_path, entry_dir_name(h))
    here.mkdir(parents=True)
    original = tmp_path / "original" / entry_dir_name(h)
    (here / "__grp__k.json").write_text(json.dumps({"child_paths": {"k.cubin": str(original / "k.cubin")}}))
    reason = WarmedNeighbours.of_cache(tmp_path, "sm90", RUNTIME).why({**ENTRY, "cache_hash": h, "entry_name": "k"})
    assert reason.kind == COPIED and reason.detail == str(original.parent)
    assert f"names its files under {original} " in reason.line
    assert reason.line.endswith("move a cache with bundle create / bundle install (--serve-at PATH when it is "
                                "installed at another path than the server mounts it at)")


def test_records_the_caller_read_are_the_ones_explained(tmp_path):
    """The dry run passes the records it holds; the manifest on disk (empty here) is not read instead."""
    h = "e" * 64
    record = {**ENTRY, "id": h[:12]}
    neighbours = WarmedNeighbours.of_cache(tmp_path, "sm90", RUNTIME, recorded={h: record})
    assert neighbours.why({**ENTRY, "cache_hash": "c" * 64}).kind == OTHER_CODE
    assert WarmedNeighbours.of_cache(tmp_path, "sm90", RUNTIME).why({**ENTRY, "cache_hash": "c" * 64}) is None


def test_only_the_served_targets_backend_decides_the_environment():
    """An entry warmed for sm90 stays a neighbour where only another target's compiler differs."""
    warmed = {"triton": {"version": "3.9.0", "key_sha256": "k"}, "env": {}, "backends": {"sm90": "A", "gfx942": "B"}}
    runtime = {**warmed, "backends": {"sm90": "A", "gfx942": "C"}}
    entry = {**ENTRY, "id": "aaaaaaaaaaaa", "environment": "w", "triton_version": None}
    neighbours = WarmedNeighbours({"a" * 64: entry}, {"w": warmed}, runtime, "sm90")
    assert neighbours.why({**ENTRY, "cache_hash": "c" * 64}).neighbour == "aaaaaaaaaaaa"
    other_sm90 = {**runtime, "backends": {"sm90": "D", "gfx942": "B"}}
    assert WarmedNeighbours({"a" * 64: entry}, {"w": warmed}, other_sm90, "sm90").why(ENTRY) is None


def test_each_cause_names_its_neighbour_and_the_detail_its_line_is_grouped_by():
    neighbours = WarmedNeighbours({"a" * 64: {**ENTRY, "id": "aaaaaaaaaaaa", "constexpr_globals": {"G": 1}}}, {},
                                  RUNTIME, "sm90")
    wanted = {**ENTRY, "cache_hash": "c" * 64}
    constants = neighbours.why({**wanted, "constexpr_globals": {"G": 2}})
    assert (constants.kind, constants.neighbour, constants.detail) == (OTHER_GLOBALS, "aaaaaaaaaaaa",
                                                                      "G (warmed 1, here 2)")
    debug = neighbours.why({**wanted, "key": KEY.replace("False", "True")})
    assert (debug.kind, debug.neighbour) == (OTHER_OPTIONS, "aaaaaaaaaaaa")


def test_a_record_without_arguments_is_told_from_its_neighbours_without_failing():
    """Records of a kernel with no arguments, or an older record that lacks them, still get a reason."""
    bare = {"kernel": "m.k", "key": "K", "num_warps": 4, "num_stages": 2, "id": "aaaaaaaaaaaa",
            "triton_version": "3.9.0"}
    neighbours = WarmedNeighbours({"a" * 64: bare}, {}, RUNTIME, "sm90")
    reason = neighbours.why({"kernel": "m.k", "cache_hash": "c" * 64, "key": "K2", "num_warps": 8, "num_stages": 2})
    assert (reason.kind, reason.neighbour) == (OTHER_CLASS, "aaaaaaaaaaaa")
    assert "num_warps (warmed 4, here 8)" in reason.line
    with_args = WarmedNeighbours({"a" * 64: ENTRY | {"id": "aaaaaaaaaaaa"}}, {}, RUNTIME, "sm90")
    reason = with_args.why({"kernel": "m.k", "cache_hash": "c" * 64, "key": "K2", "num_warps": 4, "num_stages": 2})
    assert "differs in x (warmed *bf16 aligned, here -)" in reason.line
