"""Planning, pinned with fast tests on small kernels of the test's own: what a plan counts and merges,
which rows it calls failed, unreachable or redundant, when a stored plan is read back and when it is
traced again, and the advice an unsound collapse gives."""

import importlib
import itertools
import json
import os
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest
from tritonwarm.jit import TARGETS, fake_tensor
from tritonwarm.jit.core.trace import Variant
from tritonwarm.jit.pipeline import plan as planning
from tritonwarm.jit.pipeline.plan import Plan, environment_reads, plan, plan_targets, storable, trace_rows
from tritonwarm.jit.pipeline.specs import load_specs

SM90, SM100 = TARGETS["sm90"], TARGETS["sm100"]
_names = itertools.count()

# A kernel and its launcher, as a user writes them. RULE picks BLOCK from n; the launcher counts its
# calls (every trace is seen) and fails or launches nothing as the spec's `mode` asks.
USER_MODULE = """
import os
import threading

import triton
import triton.language as tl
from tritonwarm.jit import JitKernel, Launch

CALLS = []
THREADS = []


@triton.jit
def scale(x_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) * 2.0, mask=offs < n)


def _launch(x, n):
    return Launch(grid=(1,), args=(x, n), constexprs=dict(BLOCK=RULE))


scale_jit = JitKernel(scale, _launch)


def launcher(x, n=8, mode="launch"):
    CALLS.append(n)
    THREADS.append(threading.current_thread())
    if mode == "fail":
        raise ValueError("cannot run on fake inputs")
    if mode == "type":
        raise TypeError("bad operand")
    if mode == "env":
        os.environ.get("TW_PLAN_CHECKS_VARIABLE")
    if mode == "none":
        return None
    return scale_jit(x, n)
"""

# The same kernel launched by Triton's own ``kernel[grid](...)``, no JitKernel: ``capture: all``.
RAW_MODULE = """
import triton
import triton.language as tl


@triton.jit
def scale(x_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) * 2.0, mask=offs < n)


def launcher(x, n=8):
    scale[(1,)](x, n, BLOCK=RULE)
"""

# An autotuned kernel whose pruning function cannot run on fake inputs.
TUNED_MODULE = """
import triton
import triton.language as tl


def _prune(configs, named_args, **kwargs):
    raise RuntimeError("reads the device")


@triton.autotune(configs=[triton.Config({"BLOCK": 128}), triton.Config({"BLOCK": 256})], key=["n"],
                 prune_configs_by={"early_config_prune": _prune})
@triton.jit
def tuned(x_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) * 2.0, mask=offs < n)


def launcher(x, n=8):
    tuned[(1,)](x, n)
"""


@pytest.fixture
def user_code(tmp_path, monkeypatch):
    """``user_code(rule="128")`` → (module, its name): a new module of USER_MODULE, importable."""
    code = tmp_path / "code"
    code.mkdir()
    monkeypatch.syspath_prepend(str(code))

    def make(rule="128", source=USER_MODULE):
        name = f"plan_checks_user_{os.getpid()}_{next(_names)}"
        (code / f"{name}.py").write_text(source.replace("RULE", f"({rule})"))
        importlib.invalidate_caches()
        return importlib.import_module(name), name

    yield make
    for name in [m for m in sys.modules if m.startswith("plan_checks_user_")]:
        del sys.modules[name]


def _spec(tmp_path, module_name, body="", *, axes="", file="spec.yaml", args="  x: {tensor: [4096], dtype: float32}\n"
          "  n: $n\n"):
    path = tmp_path / file
    path.write_text(f"kernel: {module_name}:launcher\n" + body + ("axes:\n" + axes if axes else "") + "args:\n" + args)
    return path


def _n_axis(values="[8]"):
    return f"  n: {values}\n"


# --- a plan's rows ------------------------------------------------------------------------------------------


def test_rows_that_launch_nothing_are_unreachable_and_a_spec_that_launches_nothing_is_an_error(tmp_path, user_code):
    _, name = user_code()
    path = _spec(tmp_path, name, axes=_n_axis("[8, 24]") + "  mode: [none]\n",
                 args="  x: {tensor: [4096], dtype: float32}\n  n: $n\n  mode: $mode\n")
    result = plan(load_specs([path]), SM90)
    assert result.rows == 2 and not result.variants
    assert result.unreachable == ["spec.yaml#0 (n=8, mode=none)", "spec.yaml#1 (n=24, mode=none)"]
    assert result.errors == [f"{path}: kernel: {name}:launcher launched no Triton kernel in any of its 2 rows: it "
                             "must call tritonwarm JitKernels"]
    assert not storable(result)


def test_one_failing_row_is_named_with_the_launchers_error(tmp_path, user_code):
    _, name = user_code()
    path = _spec(tmp_path, name, axes=_n_axis("[8]") + "  mode: [launch, fail]\n",
                 args="  x: {tensor: [4096], dtype: float32}\n  n: $n\n  mode: $mode\n")
    result = plan(load_specs([path]), SM90)
    failed = "spec.yaml#1 (n=8, mode=fail)"
    assert result.errors == [f"{failed}: the launcher failed on fake inputs: cannot run on fake inputs"]
    assert result.failed_rows == [failed] and result.unreachable == []
    assert result.rows == 2 and len(result.variants) == 1


def test_rows_failing_alike_are_said_once_with_their_count(tmp_path, user_code):
    _, name = user_code()
    path = _spec(tmp_path, name, axes=_n_axis("[8, 24, 40]") + "  mode: [fail]\n",
                 args="  x: {tensor: [4096], dtype: float32}\n  n: $n\n  mode: $mode\n")
    result = plan(load_specs([path]), SM90)
    labels = [f"spec.yaml#{i} (n={n}, mode=fail)" for i, n in enumerate((8, 24, 40))]
    assert result.errors == [f"3 rows ({labels[0]} and 2 more): the launcher failed on fake inputs: cannot run on "
                             "fake inputs"]
    assert result.failed_rows == labels
    assert not any("launched no Triton kernel" in e for e in result.errors)  # the failure is the news


def test_rows_failing_for_different_reasons_are_all_failed_rows(tmp_path, user_code):
    _, name = user_code()
    path = _spec(tmp_path, name, axes=_n_axis() + "  mode: [fail, type]\n",
                 args="  x: {tensor: [4096], dtype: float32}\n  n: $n\n  mode: $mode\n")
    result = plan(load_specs([path]), SM90)
    assert result.failed_rows == ["spec.yaml#0 (n=8, mode=fail)", "spec.yaml#1 (n=8, mode=type)"]
    assert len(result.errors) == 2


def test_a_launcher_raising_type_error_itself_is_told_as_its_own_error(tmp_path, user_code):
    _, name = user_code()
    path = _spec(tmp_path, name, axes=_n_axis() + "  mode: [type]\n",
                 args="  x: {tensor: [4096], dtype: float32}\n  n: $n\n  mode: $mode\n")
    [error] = plan(load_specs([path]), SM90).errors
    assert error.endswith(": the launcher failed on fake inputs: TypeError: bad operand")


def test_a_capture_all_row_whose_arguments_do_not_fit_names_the_launchers_parameters(tmp_path, user_code):
    """A ``capture: all`` launcher is imported when traced, so its arguments are checked per row."""
    _, name = user_code()
    path = _spec(tmp_path, name, "capture: all\n", axes=_n_axis(),
                 args="  x: {tensor: [4096], dtype: float32}\n  count: $n\n")
    [error] = plan(load_specs([path]), SM90).errors
    assert "the launcher failed on fake inputs: TypeError: " in error
    assert "'count'" in error and "the launcher is launcher(x, n=8, mode='launch')" in error


def test_a_capture_all_launcher_is_traced_with_every_kernel_it_reaches(tmp_path, user_code):
    _, name = user_code(source=RAW_MODULE)
    path = _spec(tmp_path, name, "capture: all\n", axes=_n_axis("[8, 24]"))
    result = plan(load_specs([path]), SM90)
    assert not result.errors and result.rows == 2
    [variant] = result.variants.values()
    assert variant.jit_function == f"{name}:scale"


def test_a_row_whose_variants_differently_declared_rows_give_is_redundant(tmp_path, user_code):
    _, name = user_code()
    path = _spec(tmp_path, name, axes=_n_axis("[8, 24]") + "  mode: [launch, env]\n",
                 args="  x: {tensor: [4096], dtype: float32}\n  n: $n\n  mode: $mode\n")
    result = plan(load_specs([path]), SM90)
    assert len(result.variants) == 1  # n=8 and n=24 are one class, `env` launches what `launch` does
    assert result.redundant == ["spec.yaml#1 (n=8, mode=env)", "spec.yaml#2 (n=24, mode=launch)",
                                "spec.yaml#3 (n=24, mode=env)"]


def test_collapsed_representatives_sharing_a_variant_are_not_redundant(tmp_path, user_code):
    """Each class of a collapsed axis has its row; that they launch one variant is by design."""
    _, name = user_code()
    path = _spec(tmp_path, name, axes="  m: {range: [1, 32], collapse: true}\n",
                 args="  x: {tensor: [4096], dtype: float32}\n  n: 8\n")
    result = plan(load_specs([path]), SM90)
    assert result.rows == 3 and len(result.variants) == 1
    assert result.redundant == []


def test_rows_differing_in_a_declared_axis_are_redundant_when_they_add_nothing(tmp_path, user_code):
    _, name = user_code()
    path = _spec(tmp_path, name, axes="  m: {range: [1, 32], collapse: true}\n  k: [1, 2]\n",
                 args="  x: {tensor: [4096], dtype: float32}\n  n: 8\n")
    result = plan(load_specs([path]), SM90)
    assert result.rows == 6 and len(result.variants) == 1
    labels = [f"spec.yaml#{i} (m={m}, k={k})" for i, (m, k) in enumerate(itertools.product((1, 16, 2), (1, 2)))]
    assert result.redundant == labels[1:]  # each adds nothing to rows of the other k before it


def test_a_row_launching_a_new_variant_is_not_redundant(tmp_path, user_code):
    _, name = user_code(rule="128 if n < 20 else 256")
    path = _spec(tmp_path, name, axes=_n_axis("[8, 24]"))
    result = plan(load_specs([path]), SM90)
    assert len(result.variants) == 2 and result.redundant == []


# --- unsound collapses ---------------------------------------------------------------------------------------


def _collapse_errors(tmp_path, name, rng="[1, 4096]", verify=True):
    path = _spec(tmp_path, name, axes=f"  n: {{range: {rng}, collapse: true}}\n")
    return path, plan(load_specs([path]), SM90, verify_collapse=verify).collapse_errors


def test_a_collapse_whose_class_launches_two_variants_is_split_where_they_change(tmp_path, user_code):
    """The whole advice: which value launched what, where the variants change, the two ranges to write."""
    _, name = user_code(rule="256 if n >= 1000 and n % 16 else 128")
    path, [error] = _collapse_errors(tmp_path, name)
    sample = int(error.split("is unsound: n=", 1)[1].split(" ", 1)[0])
    assert sample >= 1000 and sample % 16  # a value of the row's class that launches the other variant
    assert error == (f"{path}:3: axes.n: collapse: true is unsound: n={sample} launches other variants than n=2 "
                     "(spec.yaml#2 (n=2)): the launcher picks a constexpr or a kernel by it; the variants change "
                     "between n=999 and n=1000: split the range there, in two spec documents (--- between them): "
                     "n: {range: [1, 999], collapse: true} and {range: [1000, 4096], collapse: true}")


def test_the_advice_of_an_unsound_collapse_is_the_same_on_every_check(tmp_path, user_code):
    """Warm-up and check trace the same samples, so they print the same line."""
    _, name = user_code(rule="256 if n >= 1000 and n % 16 else 128")
    _, first = _collapse_errors(tmp_path, name)
    for _ in range(3):
        assert _collapse_errors(tmp_path, name)[1] == first


def test_the_split_of_a_multiple_of_16_class_is_found_among_multiples_of_16(tmp_path, user_code):
    _, name = user_code(rule="256 if n >= 1000 and n % 16 == 0 else 128")
    _, [error] = _collapse_errors(tmp_path, name)
    assert "the variants change between n=992 and n=1008" in error
    assert "n: {range: [1, 1007], collapse: true} and {range: [1008, 4096], collapse: true}" in error
    assert "launches other variants than n=16 (" in error


def test_the_split_of_a_plain_class_skips_multiples_of_16(tmp_path, user_code):
    _, name = user_code(rule="256 if n > 1008 and n % 16 else 128")
    _, [error] = _collapse_errors(tmp_path, name)
    assert "the variants change between n=1007 and n=1009" in error
    assert "n: {range: [1, 1008], collapse: true} and {range: [1009, 4096], collapse: true}" in error


def test_a_split_probed_beside_a_multiple_of_16_is_exact(tmp_path, user_code):
    """Bisecting a plain class steps over the multiples of 16 (another class) to the value beside them."""
    _, name = user_code(rule="256 if n >= 17 and n % 16 else 128")
    _, [error] = _collapse_errors(tmp_path, name, rng="[2, 18]")
    assert "n=18 launches other variants than n=2" in error
    assert "the variants change between n=15 and n=17" in error
    assert error.endswith("n: {range: [2, 16], collapse: true} and {range: [17, 18], collapse: true}")


def test_a_change_at_the_bottom_of_the_range_is_found(tmp_path, user_code):
    _, name = user_code(rule="256 if n % 16 and n > 3 else 128")
    _, [error] = _collapse_errors(tmp_path, name, rng="[2, 300]")
    assert "the variants change between n=3 and n=4" in error
    assert error.endswith("n: {range: [2, 3], collapse: true} and {range: [4, 300], collapse: true}")


def test_a_collapse_is_said_once_per_axis_and_names_the_row_and_sample(tmp_path, user_code):
    _, name = user_code(rule="128 if n < 1000 else 256")
    _, errors = _collapse_errors(tmp_path, name)
    [error] = errors  # both the plain and the multiple-of-16 class are unsound: one line for the axis
    sample = error.split("unsound: n=", 1)[1].split(" ", 1)[0]
    assert int(sample) >= 1000
    assert f"n={sample} launches other variants than n=" in error and "(spec.yaml#" in error


def test_a_sound_collapse_or_an_unverified_one_says_nothing(tmp_path, user_code):
    _, name = user_code(rule="128")
    assert _collapse_errors(tmp_path, name)[1] == []
    _, unsound = user_code(rule="128 if n < 1000 else 256")
    assert _collapse_errors(tmp_path, unsound, verify=False)[1] == []


def test_samples_the_launcher_cannot_run_are_skipped(tmp_path, user_code):
    module, name = user_code(rule="128 if n < 1000 else 256")
    source = USER_MODULE.replace('    if mode == "fail":', '    if n >= 1000:\n        raise ValueError("big")\n'
                                                           '    if mode == "fail":')
    _, failing = user_code(rule="128 if n < 1000 else 256", source=source)
    path, errors = _collapse_errors(tmp_path, failing)
    assert errors == []


def test_a_row_launching_nothing_is_not_checked_for_its_collapse(tmp_path, user_code):
    module, name = user_code(rule="128 if n < 1000 else 256")
    source = USER_MODULE.replace('    if mode == "none":', '    if n < 1000:\n        return None\n'
                                                           '    if mode == "none":')
    _, sparse = user_code(rule="128 if n < 1000 else 256", source=source)
    path = _spec(tmp_path, sparse, axes="  n: {range: [1, 999], collapse: true}\n")
    result = plan(load_specs([path]), SM90)
    assert result.collapse_errors == [] and len(result.unreachable) == result.rows


def test_two_unsound_axes_are_each_said(tmp_path, user_code):
    source = USER_MODULE.replace("def launcher(x, n=8, mode=\"launch\"):",
                                 "def launcher(x, n=8, m=8, mode=\"launch\"):")
    source = source.replace("return scale_jit(x, n)", "return scale_jit(x, n if m < 1000 else n + 4096)")
    _, name = user_code(rule="128 if n < 1000 else 256", source=source)
    path = _spec(tmp_path, name, axes="  n: {range: [1, 4096], collapse: true}\n"
                                     "  m: {range: [1, 4096], collapse: true}\n",
                 args="  x: {tensor: [4096], dtype: float32}\n  n: $n\n  m: $m\n")
    errors = plan(load_specs([path]), SM90).collapse_errors
    assert [e.split(": collapse:")[0].rsplit(" ", 1)[-1] for e in errors] == ["axes.n", "axes.m"]


# --- merging plans ------------------------------------------------------------------------------------------


def _variant(cache_hash, rows, autotuned=False, kernel="mod.kernel", jit_function=""):
    return Variant(kernel=kernel, target="sm90", key="k", specialization_data="{}", args={}, num_warps=4,
                   num_stages=3, cache_hash=cache_hash, rows=list(rows), autotuned=autotuned,
                   jit_function=jit_function)


def test_merging_adds_rows_and_keeps_every_finding_in_order():
    a, b = Plan(SM90), Plan(SM90)
    a.rows, b.rows = 2, 3
    for name in ("unreachable", "redundant", "errors", "failed_rows", "collapse_errors", "notes"):
        getattr(a, name).append(f"a-{name}")
        getattr(b, name).append(f"b-{name}")
    a.environment_read, b.environment_read = {"X": "1", "Y": None}, {"Y": "2"}
    a.merge(b)
    assert a.rows == 5
    for name in ("unreachable", "redundant", "errors", "failed_rows", "collapse_errors", "notes"):
        assert getattr(a, name) == [f"a-{name}", f"b-{name}"], name
    assert a.environment_read == {"X": "1", "Y": "2"}


def test_merging_unions_the_sources_sorted():
    a, b = Plan(SM90), Plan(SM90)
    a.sources = {"specs": ["/b.yaml", "/a.yaml"], "engine_configs": []}
    b.sources = {"specs": ["/c.yaml", "/a.yaml"], "engine_configs": ["tiny"], "programs": ["p"]}
    a.merge(b)
    assert a.sources == {"specs": ["/a.yaml", "/b.yaml", "/c.yaml"], "engine_configs": ["tiny"], "programs": ["p"]}


def test_merging_the_same_variant_joins_its_rows_and_is_autotuned_only_if_both_are():
    a, b = Plan(SM90), Plan(SM90)
    a.variants = {"h1": _variant("h1", ["r1", "r2"], autotuned=True)}
    b.variants = {"h1": _variant("h1", ["r2", "r3"], autotuned=False), "h2": _variant("h2", ["r4"], autotuned=True)}
    a.merge(b)
    assert a.variants["h1"].rows == ["r1", "r2", "r3"] and a.variants["h1"].autotuned is False
    assert a.variants["h2"].rows == ["r4"] and a.variants["h2"].autotuned
    c = Plan(SM90)
    c.variants = {"h2": _variant("h2", ["r5"], autotuned=False)}
    a.merge(c)
    assert not a.variants["h2"].autotuned and a.variants["h2"].rows == ["r4", "r5"]
    assert b.variants["h2"].autotuned  # the merged plan holds its own copy of what it took
    assert b.variants["h2"].rows == ["r4"]  # rows merged later do not reach the partial plan it came from


def test_a_plan_reads_back_what_it_wrote():
    original = Plan(SM90, {"h1": _variant("h1", ["r1"])}, 4, ["u"], ["d"], ["e"], ["c"], notes=["n"],
                    environment_read={"X": None}, failed_rows=["f"])
    data = json.loads(json.dumps(original.to_json()))
    assert set(data) == {"rows", "unreachable", "redundant", "errors", "failed_rows", "collapse_errors", "notes",
                         "environment_read", "variants"}
    back = Plan.from_json(SM90, data)
    assert back.to_json() == original.to_json()
    assert (back.rows, back.unreachable, back.redundant, back.errors, back.collapse_errors) == (4, ["u"], ["d"], ["e"],
                                                                                               ["c"])
    assert (back.notes, back.environment_read, back.failed_rows) == (["n"], {"X": None}, ["f"])
    assert list(back.variants) == ["h1"] and back.target is SM90


def test_a_plan_written_before_notes_and_environment_were_recorded_reads_with_none():
    data = {"rows": 1, "unreachable": [], "redundant": [], "errors": [], "collapse_errors": [], "variants": []}
    back = Plan.from_json(SM90, data)
    assert (back.notes, back.environment_read, back.failed_rows) == ([], {}, [])


# --- several specs and targets ------------------------------------------------------------------------------------


def test_each_target_plans_the_specs_that_apply_to_it_in_their_order(tmp_path, user_code, monkeypatch):
    _, name = user_code()
    hip_only = _spec(tmp_path, name, "targets: [hip]\n", axes=_n_axis("[24]"), file="a.yaml")
    second = _spec(tmp_path, name, axes=_n_axis("[8]"), file="b.yaml")
    monkeypatch.chdir(tmp_path)
    plans = plan_targets(load_specs(["a.yaml", "b.yaml"]), [SM90, TARGETS["gfx942"]])
    assert set(plans) == {"sm90", "gfx942"}
    assert plans["sm90"].sources["specs"] == [str(second)] and plans["sm90"].rows == 1
    assert plans["gfx942"].sources["specs"] == [str(hip_only), str(second)] and plans["gfx942"].rows == 2
    assert plans["sm90"].target is SM90
    [variant] = plans["sm90"].variants.values()
    assert variant.rows == ["b.yaml#0 (n=8)"]
    assert [v.rows for v in plans["gfx942"].variants.values()] == [["a.yaml#0 (n=24)", "b.yaml#0 (n=8)"]]


def test_specs_launching_the_same_variant_merge_into_one_with_both_rows(tmp_path, user_code):
    _, name = user_code()
    _spec(tmp_path, name, axes=_n_axis("[8]"), file="a.yaml")
    _spec(tmp_path, name, axes=_n_axis("[24]"), file="b.yaml")
    result = plan(load_specs([tmp_path / "a.yaml", tmp_path / "b.yaml"]), SM90)
    [variant] = result.variants.values()
    assert variant.rows == ["a.yaml#0 (n=8)", "b.yaml#0 (n=24)"] and result.rows == 2


def test_a_pool_traces_each_spec_document_as_the_process_would(tmp_path, user_code):
    module, name = user_code(rule="128 if n < 1000 else 256")
    path = tmp_path / "two.yaml"
    path.write_text(f"kernel: {name}:launcher\naxes:\n  n: [8]\nargs:\n  x: {{tensor: [4096], dtype: float32}}\n"
                    f"  n: $n\n---\nkernel: {name}:launcher\naxes:\n  n: {{range: [1, 4096], collapse: true}}\n"
                    "args:\n  x: {tensor: [4096], dtype: float32}\n  n: $n\n")
    specs = load_specs([path])
    serial = plan(specs, SM90)
    assert len(serial.collapse_errors) == 1 and "two.yaml:10: axes.n" in serial.collapse_errors[0]
    module.THREADS.clear()
    with ThreadPoolExecutor(1, thread_name_prefix="planner") as pool:
        pooled = plan(specs, SM90, pool=pool)
    assert pooled.to_json() == serial.to_json() and pooled.sources == serial.sources
    assert module.THREADS and all(t.name.startswith("planner") for t in module.THREADS)


def test_a_partial_plan_is_an_error_on_every_warmup(tmp_path, user_code):
    _, name = user_code()
    path = _spec(tmp_path, name, 'partial: "the program exited with 1"\n', axes=_n_axis())
    cache = tmp_path / "cache"
    for _ in range(2):  # traced, then read back from the store: said both times
        result = plan(load_specs([path]), SM90, cache_dir=cache)
        assert result.errors == [f"{path}: a partial plan (the program exited with 1): it lacks launches the program "
                                 "makes; record the program again"]
        assert len(result.variants) == 1


# --- the plan store ----------------------------------------------------------------------------------------------


def test_a_stored_plan_is_read_back_without_tracing(tmp_path, user_code):
    module, name = user_code()
    path = _spec(tmp_path, name, axes=_n_axis("[8, 24]"))
    cache = tmp_path / "cache"
    first = plan(load_specs([path]), SM90, cache_dir=cache)
    assert module.CALLS == [8, 24]
    [stored] = (cache / "tritonwarm" / "plans").iterdir()
    written = stored.stat().st_ino
    again = plan(load_specs([path]), SM90, cache_dir=cache)
    assert module.CALLS == [8, 24]
    assert list((cache / "tritonwarm" / "plans").iterdir()) == [stored]
    assert stored.stat().st_ino == written  # read, not written again
    assert again.to_json() == first.to_json() and again.sources == first.sources
    plan(load_specs([path]), SM90, cache_dir=cache, verify_collapse=False)  # another key
    assert module.CALLS == [8, 24, 8, 24]


def test_a_failed_trace_is_never_stored(tmp_path, user_code):
    module, name = user_code()
    path = _spec(tmp_path, name, axes=_n_axis() + "  mode: [fail]\n",
                 args="  x: {tensor: [4096], dtype: float32}\n  n: $n\n  mode: $mode\n")
    cache = tmp_path / "cache"
    plan(load_specs([path]), SM90, cache_dir=cache)
    plan(load_specs([path]), SM90, cache_dir=cache)
    assert module.CALLS == [8, 8]
    assert not list((cache / "tritonwarm" / "plans").glob("*.json"))


def test_a_stored_plan_is_traced_again_when_a_variable_its_launcher_read_changes(tmp_path, user_code, monkeypatch):
    module, name = user_code()
    path = _spec(tmp_path, name, axes=_n_axis() + "  mode: [env]\n",
                 args="  x: {tensor: [4096], dtype: float32}\n  n: $n\n  mode: $mode\n")
    cache = tmp_path / "cache"
    monkeypatch.delenv("TW_PLAN_CHECKS_VARIABLE", raising=False)
    first = plan(load_specs([path]), SM90, cache_dir=cache)
    assert "TW_PLAN_CHECKS_VARIABLE" in first.environment_read
    assert first.environment_read["TW_PLAN_CHECKS_VARIABLE"] is None
    plan(load_specs([path]), SM90, cache_dir=cache)
    assert len(module.CALLS) == 1
    monkeypatch.setenv("TW_PLAN_CHECKS_VARIABLE", "1")
    assert plan(load_specs([path]), SM90, cache_dir=cache).environment_read["TW_PLAN_CHECKS_VARIABLE"] == "1"
    assert len(module.CALLS) == 2
    plan(load_specs([path]), SM90, cache_dir=cache)
    assert len(module.CALLS) == 2


def test_a_stored_plan_is_traced_again_when_its_kernel_is_edited(tmp_path, user_code):
    """The kernel's module is loaded again with an edited body: Triton's source key changes."""
    module, name = user_code()
    path = _spec(tmp_path, name, axes=_n_axis())
    cache = tmp_path / "cache"
    plan(load_specs([path]), SM90, cache_dir=cache)
    file = tmp_path / "code" / f"{name}.py"
    file.write_text(file.read_text().replace("* 2.0", "* 3.0"))
    calls = module.CALLS
    importlib.reload(module)
    module.CALLS = calls
    plan(load_specs([path]), SM90, cache_dir=cache)
    assert len(calls) == 2


def test_a_stored_plan_of_a_kernel_in_another_package_records_that_packages_files(tmp_path, user_code):
    from tritonwarm.jit.cache.plans import package_fingerprint

    _, name = user_code(source=RAW_MODULE)
    path = _spec(tmp_path, name, "capture: all\n", axes=_n_axis())
    result = plan(load_specs([path]), SM90)
    keys = planning.kernel_source_keys(result)
    assert keys == {f"{name}:scale": "files:" + package_fingerprint(name)}
    assert package_fingerprint(name)


def test_a_jitkernels_source_key_is_tritons_and_none_for_a_kernel_not_loaded(tmp_path, user_code):
    module, name = user_code()
    result = plan(load_specs([_spec(tmp_path, name, axes=_n_axis("[8, 24]"))]), SM90)
    assert planning.kernel_source_keys(result) == {f"{name}.scale": module.scale.cache_key}
    assert planning._source_key("no_such_module.kernel") is None


@pytest.mark.parametrize("damage", [
    lambda data: data.pop("environment_read"),
    lambda data: data.update(environment_read=["X"]),
    lambda data: data.update(environment_read={"TW_PLAN_CHECKS_VARIABLE": "set then"}),
    lambda data: data.pop("rows"),
    lambda data: data.update(variants=[{"kernel": "k"}]),
], ids=["no-environment", "environment-not-a-mapping", "environment-changed", "no-rows", "bad-variant"])
def test_a_stored_plan_that_cannot_be_trusted_is_traced_again(tmp_path, user_code, damage, monkeypatch):
    """Whoever saved it (an older tritonwarm, a copied cache), a plan that lacks what the check needs
    or that fails to read is traced again, not trusted or fatal."""
    from tritonwarm.jit.cache import PlanStore

    monkeypatch.delenv("TW_PLAN_CHECKS_VARIABLE", raising=False)
    module, name = user_code()
    path = _spec(tmp_path, name, axes=_n_axis())
    cache = tmp_path / "cache"
    first = plan(load_specs([path]), SM90, cache_dir=cache)
    store = PlanStore(cache)
    [stored] = store.dir.glob("*.json")
    key = stored.stem
    data, kernels = store.load(key)
    damage(data)
    store.save(key, data, kernels)
    again = plan(load_specs([path]), SM90, cache_dir=cache)
    assert len(module.CALLS) == 2
    assert again.to_json() == first.to_json()


def test_a_stored_plan_whose_environment_names_a_non_string_is_traced_again(tmp_path, user_code):
    from tritonwarm.jit.cache import PlanStore

    module, name = user_code()
    path = _spec(tmp_path, name, axes=_n_axis())
    cache = tmp_path / "cache"
    plan(load_specs([path]), SM90, cache_dir=cache)
    store = PlanStore(cache)
    [stored] = store.dir.glob("*.json")
    data, kernels = store.load(stored.stem)
    assert planning.stored_plan(store, stored.stem, SM90).target is SM90
    store.save(stored.stem, [data], kernels)  # not a mapping at all
    assert planning.stored_plan(store, stored.stem, SM90) is None
    assert planning.stored_plan(store, "0" * 32, SM90) is None  # nothing stored under that key


# --- environment reads ------------------------------------------------------------------------------------------


def test_a_read_inside_a_block_is_recorded_with_its_first_value(monkeypatch):
    monkeypatch.setenv("TW_PLAN_CHECKS_A", "x")
    with environment_reads() as read:
        os.environ["TW_PLAN_CHECKS_A"]
        os.environ["TW_PLAN_CHECKS_A"] = "y"
        os.environ["TW_PLAN_CHECKS_A"]
        with pytest.raises(KeyError):
            os.environ["TW_PLAN_CHECKS_MISSING"]
    assert read == {"TW_PLAN_CHECKS_A": "x", "TW_PLAN_CHECKS_MISSING": None}


def test_two_blocks_open_at_once_each_record_and_closing_one_keeps_the_other():
    first = environment_reads()
    second = environment_reads()
    a = first.__enter__()
    b = second.__enter__()
    first.__exit__(None, None, None)  # closed before the other: its reader goes, the other stays
    os.environ.get("TW_PLAN_CHECKS_LATE")
    second.__exit__(None, None, None)
    assert a == {} and b == {"TW_PLAN_CHECKS_LATE": None}
    assert type(os.environ).__getitem__ is planning._environ_getitem


def test_trace_rows_counts_rows_and_keeps_tritons_variants(tmp_path, user_code):
    import torch

    module, _ = user_code(rule="128 if n < 20 else 256")
    x = fake_tensor((4096,), torch.float32)
    result, cap = trace_rows(SM90, "m:launcher", [("small", lambda: module.launcher(x, 8)),
                                                  ("large", lambda: module.launcher(x, 24)),
                                                  ("nothing", lambda: None)])
    assert result.rows == 3 and result.unreachable == ["nothing"] and len(result.variants) == 2
    assert result.target is SM90
    assert cap.keys_of("small") | cap.keys_of("large") == set(result.variants)
    assert {v.import_path for v in result.variants.values()} == {"m:launcher"}  # what a worker imports


def test_trace_rows_keeps_only_jitkernels_unless_asked_for_every_kernel(user_code):
    import torch

    raw, _ = user_code(source=RAW_MODULE)
    x = fake_tensor((4096,), torch.float32)
    result, _ = trace_rows(SM90, "m:launcher", [("raw", lambda: raw.launcher(x, 8))])
    assert not result.variants  # Triton's own launch is not faked here
    result, _ = trace_rows(SM90, "m:launcher", [("raw", lambda: raw.launcher(x, 8))], all_kernels=True)
    assert result.unreachable == [] and result.errors == [] and len(result.variants) == 1


def test_a_spec_with_positional_arguments_calls_the_launcher_with_them(tmp_path, user_code):
    _, name = user_code()
    path = _spec(tmp_path, name, axes=_n_axis("[8]"), args="  - {tensor: [4096], dtype: float32}\n  - $n\n")
    result = plan(load_specs([path]), SM90)
    assert not result.errors and len(result.variants) == 1
    [variant] = result.variants.values()
    assert variant.import_path == f"{name}:launcher"


def test_several_targets_verify_collapses_unless_told_not_to(tmp_path, user_code):
    _, name = user_code(rule="128 if n < 1000 else 256")
    specs = load_specs([_spec(tmp_path, name, axes="  n: {range: [1, 4096], collapse: true}\n")])
    plans = plan_targets(specs, [SM90, SM100])
    assert [len(plans[t].collapse_errors) for t in ("sm90", "sm100")] == [1, 1]
    assert plan_targets(specs, [SM90], verify_collapse=False)["sm90"].collapse_errors == []


def test_the_spec_file_is_what_a_row_label_names(tmp_path, user_code):
    _, name = user_code()
    path = _spec(tmp_path, name, axes=_n_axis(), file="named.yaml")
    result = plan(load_specs([path]), SM90)
    assert [v.rows for v in result.variants.values()] == [["named.yaml#0 (n=8)"]]


# --- what tracing approximates, pins, and rows checked for their collapse -----------------------------------------


def test_an_autotuner_whose_pruning_cannot_run_is_noted_per_row(tmp_path, user_code):
    _, name = user_code(source=TUNED_MODULE)
    path = _spec(tmp_path, name, "capture: all\n", axes=_n_axis("[8, 24]"))
    result = plan(load_specs([path]), SM90)
    assert not result.errors and len(result.variants) == 2  # every config is warmed
    assert [note.split(": ")[0] for note in result.notes] == ["spec.yaml#0 (n=8)", "spec.yaml#1 (n=24)"]
    assert all("prune_configs_by could not run on fake inputs (RuntimeError: reads the device); all 2 configs are "
               "warmed" in note for note in result.notes)


def test_a_pin_no_config_answers_is_an_error_of_its_row(tmp_path, user_code):
    _, name = user_code(source=TUNED_MODULE)
    path = _spec(tmp_path, name, "capture: all\nconfig: 5\n", axes=_n_axis("[8]"))
    result = plan(load_specs([path]), SM90)
    [error] = result.errors
    assert error.startswith("spec.yaml#0 (n=8): ") and "config index 5 out of range" in error
    assert not storable(result)


def test_a_pin_that_cannot_be_evaluated_is_an_error_of_its_row(tmp_path, user_code):
    _, name = user_code(source=TUNED_MODULE)
    path = _spec(tmp_path, name, "capture: all\nconfig: \"$n // (n - n)\"\n", axes=_n_axis("[8]"))
    result = plan(load_specs([path]), SM90)
    [error] = result.errors  # the row's pin is dropped, not also refused by the autotuner
    assert error.startswith("spec.yaml#0 (n=8): config: ZeroDivisionError")


def test_rows_after_one_that_launches_nothing_are_still_checked_for_their_collapse(tmp_path, user_code):
    source = USER_MODULE.replace('    if mode == "none":',
                                 '    if n == 1:\n        return None\n    if mode == "none":')
    _, name = user_code(rule="256 if n >= 1000 and n % 16 else 128", source=source)
    path = _spec(tmp_path, name, axes="  n: {range: [1, 4096], collapse: true}\n")
    result = plan(load_specs([path]), SM90)
    assert result.unreachable == ["spec.yaml#0 (n=1)"]
    [error] = result.collapse_errors
    assert "than n=2 (spec.yaml#2 (n=2))" in error


def test_samples_after_one_the_launcher_cannot_run_are_still_compared(tmp_path, user_code):
    source = USER_MODULE.replace('    if mode == "fail":', '    if 3 <= n < 100:\n        raise ValueError("no")\n'
                                                           '    if mode == "fail":')
    _, name = user_code(rule="256 if n >= 1000 and n % 16 else 128", source=source)
    path = _spec(tmp_path, name, axes="  n: {range: [2, 4096], collapse: true}\n")
    [error] = plan(load_specs([path]), SM90).collapse_errors
    assert "than n=2 (spec.yaml#1 (n=2))" in error


def test_a_capture_all_collapse_is_probed_with_every_kernel(tmp_path, user_code):
    _, name = user_code(source=RAW_MODULE)
    path = _spec(tmp_path, name, "capture: all\n", axes="  n: {range: [1, 4096], collapse: true}\n")
    result = plan(load_specs([path]), SM90)
    assert result.rows == 3 and len(result.variants) == 3 and result.collapse_errors == []
    _, unsound = user_code(rule="128 if n < 1000 else 256", source=RAW_MODULE)
    path = _spec(tmp_path, unsound, "capture: all\n", axes="  n: {range: [1, 4096], collapse: true}\n", file="b.yaml")
    assert len(plan(load_specs([path]), SM90).collapse_errors) == 1
