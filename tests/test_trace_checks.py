"""Tracing's own checks (``jit/core/trace.py``) pinned with fast tests: a fake launch goes through the
launch spec and Triton's binder, nothing compiles, and what is recorded (the variant's fields, the
rows that launch it, each argument's class, the module-level constexprs, the disk-cache hash) is what
Triton computes for that launch."""

import json

import pytest
import torch
import triton
import triton.language as tl
from triton import knobs
from tritonwarm.jit import TARGETS, JitKernel, Launch, trace_call
from tritonwarm.jit.core import trace
from tritonwarm.jit.core.entry_names import entry_dir_name
from tritonwarm.jit.core.specialization import fake_tensor
from tritonwarm.jit.core.trace import Capture, Variant, capture, constexpr_globals, tracing

SM90 = TARGETS["sm90"]
SCALE = tl.constexpr(2)
LONG_NAME = tl.constexpr("n" * 100)


@triton.jit
def _twice(x):
    return x * SCALE


@triton.jit
def _copy_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y_ptr + offs, _twice(tl.load(x_ptr + offs, mask=offs < n)), mask=offs < n)


def _copy_launch(x, y, block=32, warps=4):
    return Launch(grid=(1,), args=(x, y, x.numel()), constexprs={"BLOCK": block}, num_warps=warps, num_stages=2)


_copy = JitKernel(_copy_kernel, _copy_launch, name="tests.trace_checks.copy")
_copy_estimated = JitKernel(_copy_kernel, _copy_launch, name="tests.trace_checks.copy_estimated",
                            shared_estimate=lambda launch, target: 1000 * launch.num_warps + len(target.name))


@triton.jit
def _scalars_kernel(x_ptr, out_ptr, n, count, big, huge, ratio, flag, unit, nothing, MODE: tl.constexpr,
                    BLOCK: tl.constexpr):
    if MODE == LONG_NAME:
        tl.store(out_ptr, tl.load(x_ptr) * count + big + huge + ratio + flag + unit + n)
    else:
        tl.store(out_ptr, tl.load(x_ptr) + BLOCK)


_scalars = JitKernel(_scalars_kernel, lambda x, out, *scalars, mode="plain", block=1: Launch(
    grid=(1,), args=(x, out, *scalars), constexprs={"MODE": mode, "BLOCK": block}))


def _tensor(n=64, dtype=torch.float32, aligned=True):
    return fake_tensor((n,), dtype, aligned=aligned)


# ------------------------------------------------------------------ what a variant records


def test_a_traced_variant_records_tritons_request_and_its_cache_entry(compile_counter):
    with capture(SM90, import_path="tests.trace_checks") as cap:
        _copy(_tensor(), _tensor())
    assert compile_counter.count == 0  # traced: nothing compiled
    [variant] = cap.variants.values()
    assert list(cap.variants) == [("tests.trace_checks.copy", variant.key)]
    assert (variant.kernel, variant.target, variant.import_path) == ("tests.trace_checks.copy", "sm90",
                                                                     "tests.trace_checks")
    assert (variant.num_warps, variant.num_stages, variant.entry_name) == (4, 2, "_copy_kernel")
    assert (variant.jit_function, variant.autotuned, variant.shared_estimate, variant.rows) == ("", False, None, [])
    assert json.loads(variant.specialization_data)["options"]["num_warps"] == 4
    assert len(variant.cache_hash) == 64 and int(variant.cache_hash, 16) >= 0
    assert variant.variant_id == variant.cache_hash[:12]
    assert variant.entry_dir == entry_dir_name(variant.cache_hash)
    assert variant.args == {"x_ptr": "*fp32 aligned", "y_ptr": "*fp32 aligned", "n": "i32:div16", "BLOCK": "=32"}
    assert variant.constexpr_globals == {"SCALE": "2"}


def test_the_launch_specs_shared_memory_estimate_is_recorded_for_the_target():
    [variant] = trace_call(SM90, _copy_estimated, _tensor(), _tensor(), warps=8)
    assert variant.shared_estimate == 8000 + len("sm90")


def test_a_variant_survives_its_json_form_and_ignores_fields_it_does_not_know():
    [variant] = trace_call(SM90, _copy, _tensor(), _tensor())
    variant.rows.append("row 1")
    data = variant.to_json()
    assert data["id"] == variant.variant_id and data["rows"] == ["row 1"]
    assert Variant.from_json({**data, "added_by_a_later_release": 1}) == variant
    assert set(data) == {"id", *(f for f in Variant.__dataclass_fields__)}


def test_a_variant_without_the_optional_fields_reads_with_their_defaults():
    variant = Variant.from_json({"kernel": "k", "target": "sm90", "key": "K", "specialization_data": "{}",
                                 "args": {}, "num_warps": 4, "num_stages": 3, "cache_hash": "ab" * 32})
    assert (variant.rows, variant.import_path, variant.entry_name, variant.jit_function) == ([], "", "", "")
    assert (variant.constexpr_globals, variant.autotuned, variant.shared_estimate) == ({}, False, None)


# ------------------------------------------------------------------ rows and deduplication


def test_rows_credit_the_launches_inside_them_and_nest():
    small, large = _tensor(64), _tensor(1000)
    with capture(SM90) as cap:
        with cap.row("outer"):
            _copy(small, small)
            with cap.row("inner"):
                _copy(large, large, block=64)
            _copy(small, small)  # credited to "outer" again, not "inner"
        _copy(small, small, warps=8)  # in no row
        with pytest.raises(ZeroDivisionError):
            with cap.row("failing"):
                raise ZeroDivisionError
        assert cap.current_row is None
    assert cap.launches == 4 and len(cap.variants) == 3
    by_warps_block = {(v.num_warps, v.args["BLOCK"]): v for v in cap.variants.values()}
    outer, inner, loose = by_warps_block[(4, "=32")], by_warps_block[(4, "=64")], by_warps_block[(8, "=32")]
    assert (outer.rows, inner.rows, loose.rows) == (["outer"], ["inner"], [])
    assert cap.keys_of("outer") == {outer.cache_hash} and cap.keys_of("inner") == {inner.cache_hash}
    assert cap.keys_of("failing") == set() and cap.keys_of("never used") == set()


def test_a_variant_launched_by_two_rows_is_recorded_once_crediting_both():
    x = _tensor()
    with capture(SM90) as cap:
        for label in ("a", "b", "a"):
            with cap.row(label):
                _copy(x, x)
    [variant] = cap.variants.values()
    assert variant.rows == ["a", "b"] and cap.keys_of("a") == cap.keys_of("b") == {variant.cache_hash}
    assert cap.launches == 3


def test_the_compile_hook_in_force_before_a_trace_is_back_after_it_even_when_the_launch_fails():
    def mine(**_):
        return False

    with knobs.runtime.scope():
        knobs.runtime.jit_cache_hook = mine
        with capture(SM90) as cap:
            _copy(_tensor(), _tensor())
            with pytest.raises(TypeError):  # an argument missing
                cap.launch(_copy, Launch(grid=(1,), args=(_tensor(),), constexprs={"BLOCK": 32}), SM90)
            assert knobs.runtime.jit_cache_hook is mine
        assert knobs.runtime.jit_cache_hook is mine


def test_a_capture_without_an_import_path_records_none():
    cap = Capture()
    with tracing(cap, SM90):
        _copy(_tensor(), _tensor())
    assert [v.import_path for v in cap.variants.values()] == [""]


def test_trace_call_passes_the_arguments_and_returns_every_variant():
    x = _tensor()
    variants = trace_call(SM90, _copy, x, x, block=128, warps=2)
    assert [(v.args["BLOCK"], v.num_warps) for v in variants] == [("=128", 2)]


# ------------------------------------------------------------------ each argument's class


def test_each_scalar_argument_is_named_by_the_class_triton_specialized_it_as():
    x, out = _tensor(dtype=torch.float16), _tensor(dtype=torch.float16, aligned=False)
    [variant] = trace_call(SM90, _scalars, x, out, 1024, 7, 2**40, 2**63 + 16, 0.5, True, 1, None)
    assert variant.args == {
        "x_ptr": "*fp16 aligned", "out_ptr": "*fp16 unaligned", "n": "i32:div16", "count": "i32",
        "big": "i64:div16", "huge": "u64:div16", "ratio": "fp32", "flag": variant.args["flag"], "unit": "one",
        "nothing": "=None", "MODE": "=plain", "BLOCK": "=1"}
    assert variant.args["flag"] in ("i1", "u1")  # (a bool: Triton's own name for it, which releases change)


def test_a_declared_constexpr_of_one_is_its_value_not_the_class_one():
    [variant] = trace_call(SM90, _scalars, _tensor(), _tensor(), 17, 2**40 + 1, 5, 2**63 + 1, 0.5, False, 1, None,
                           block=1)
    assert variant.args["BLOCK"] == "=1" and variant.args["unit"] == "one"
    assert (variant.args["n"], variant.args["count"], variant.args["big"], variant.args["huge"]) == (
        "i32", "i64", "i32", "u64")


def test_a_constexpr_passed_wrapped_reads_as_its_value():
    [variant] = trace_call(SM90, _copy, _tensor(), _tensor(), block=tl.constexpr(64))
    assert variant.args["BLOCK"] == "=64"


def test_a_dtype_named_string_constexpr_is_refused_naming_the_kernel_parameter_and_fix():
    with pytest.raises(ValueError) as refused:
        trace_call(SM90, _scalars, _tensor(), _tensor(), 16, 7, 8, 9, 0.5, True, 1, None, mode="fp32")
    said = str(refused.value)
    assert said.startswith(f"{_scalars.name}: constexpr MODE='fp32' names a Triton dtype")
    assert "Triton's preload (which warm-up compiles with) reads it back as that dtype" in said
    assert said.endswith("a different kernel under the same cache hash: use another string")


# ------------------------------------------------------------------ module-level constexprs


def test_module_level_constexprs_a_kernel_and_its_helpers_read_are_named_with_their_values():
    assert constexpr_globals(_copy_kernel) == {"SCALE": "2"}  # read by the helper it calls
    assert constexpr_globals(_scalars_kernel) == {"LONG_NAME": repr("n" * 100)[:80]}


def test_one_name_with_two_values_in_two_modules_lists_both(tmp_path, monkeypatch):
    (tmp_path / "trace_helper_a.py").write_text(
        "import triton\nimport triton.language as tl\nLIMIT = tl.constexpr(8)\n\n\n"
        "@triton.jit\ndef limit_a(x):\n    return x + LIMIT\n")
    (tmp_path / "trace_kernel_b.py").write_text(
        "import triton\nimport triton.language as tl\nfrom trace_helper_a import limit_a\n"
        "LIMIT = tl.constexpr(16)\nPLAIN = 3\n\n\n"
        "@triton.jit\ndef kernel_b(x_ptr):\n    tl.store(x_ptr, limit_a(tl.load(x_ptr)) + LIMIT)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    from trace_kernel_b import kernel_b

    assert constexpr_globals(kernel_b) == {"LIMIT": "16 | 8"}


# ------------------------------------------------------------------ the disk-cache hash


def test_a_cache_invalidating_variable_changes_the_hash_and_back(monkeypatch):
    x = _tensor()
    [plain] = trace_call(SM90, _copy, x, x)
    monkeypatch.setenv("TRITON_DISABLE_LINE_INFO", "1")
    [changed] = trace_call(SM90, _copy, x, x)
    monkeypatch.delenv("TRITON_DISABLE_LINE_INFO")
    [again] = trace_call(SM90, _copy, x, x)
    assert changed.key == plain.key and changed.cache_hash != plain.cache_hash
    assert again.cache_hash == plain.cache_hash


def test_warming_for_another_ptxas_keys_as_it_hashes_not_as_remembered():
    """Triton's CUDA backend hashes ptxas's version: a serving environment's ptxas gives other entries."""
    from tritonwarm.jit.cache.serving import _ptxas_version_of

    x = _tensor()
    [plain] = trace_call(SM90, _copy, x, x)
    with _ptxas_version_of({90: "ptxas: NVIDIA (R) Ptx optimizing assembler, release 99.9, V99.9.1"}):
        [serving] = trace_call(SM90, _copy, x, x)
    assert serving.cache_hash != plain.cache_hash
    assert trace_call(SM90, _copy, x, x)[0].cache_hash == plain.cache_hash


def test_the_traced_hash_is_the_entry_tritons_compile_writes_for_the_launchs_options(compile_call):
    """Warps and stages other than Triton's defaults: the options enter the hash as compile() parses them."""
    [(variant, compiled)] = compile_call("sm90", _copy, _tensor(), _tensor(), block=64, warps=8)
    assert (variant.num_warps, variant.num_stages) == (8, 2) and compiled.hash == variant.cache_hash


def test_each_target_gets_its_own_hash():
    x = _tensor()
    [sm90] = trace_call(SM90, _copy, x, x)
    [sm80] = trace_call(TARGETS["sm80"], _copy, x, x)
    assert sm80.target == "sm80" and sm80.cache_hash != sm90.cache_hash


def test_a_hash_is_memoized_only_under_the_same_inputs(monkeypatch):
    seen = []
    monkeypatch.setattr(trace, "hash_inputs", [*trace.hash_inputs, lambda: seen.append(1) or len(seen)])
    x = _tensor()
    trace_call(SM90, _copy, x, x)
    trace_call(SM90, _copy, x, x)
    assert len(seen) == 2  # asked at each variant recorded


# ------------------------------------------------------------------ autotuners and capture: all


def _tuned_pair():
    """One kernel launched through an autotuner over two configs, and directly in the first config."""
    configs = [triton.Config({"BLOCK": 32}, num_warps=1, num_stages=1),
               triton.Config({"BLOCK": 64}, num_warps=1, num_stages=1)]
    tuned = triton.autotune(configs=configs, key=["n"])(_copy_kernel)
    name = "tests.trace_checks.tuned_copy"
    via_tuner = JitKernel(tuned, lambda x, y: Launch(grid=(1,), args=(x, y, x.numel())), name=name)
    direct = JitKernel(_copy_kernel, lambda x, y: Launch(grid=(1,), args=(x, y, x.numel()), constexprs={"BLOCK": 32},
                                                         options=configs[0].all_kwargs()), name=name)
    return via_tuner, direct


@pytest.mark.parametrize("direct_first", [False, True])
def test_a_config_also_launched_directly_is_not_one_the_autotuner_may_skip(direct_first):
    via_tuner, direct = _tuned_pair()
    x = _tensor()
    with capture(SM90) as cap:
        for kernel in ((direct, via_tuner) if direct_first else (via_tuner, direct)):
            kernel(x, x)
    assert sorted((v.args["BLOCK"], v.autotuned) for v in cap.variants.values()) == [("=32", False), ("=64", True)]


def test_the_autotune_state_given_is_the_one_the_block_follows_and_yields():
    from tritonwarm.jit.core.hooks import adoption

    via_tuner, _ = _tuned_pair()
    x = _tensor()
    with adoption().autotuners() as state:
        pass
    cap = Capture()
    with tracing(cap, SM90, autotune=state) as followed:
        via_tuner(x, x)
    assert followed is state and state.calls == 1
    with tracing(Capture(), SM90) as fresh:
        assert fresh is not state and fresh.calls == 0


@triton.jit
def _plain_kernel(x_ptr, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) + 1, mask=offs < n)


def test_capture_all_records_a_plain_triton_launch_and_leaves_no_trace_behind(compile_counter):
    """A kernel another package launches itself (``kernel[grid](...)``): recorded, not compiled, and
    neither the hook nor the target's fake device stays behind in the kernel."""
    x = torch.empty(64, dtype=torch.float32, device="meta")
    before = knobs.runtime.jit_cache_hook
    with capture(SM90, all_kernels=True, import_path="tests.trace_checks") as cap:
        _plain_kernel[(1,)](x, 64, BLOCK=32)
        assert _plain_kernel.device_caches
    assert compile_counter.count == 0
    [variant] = cap.variants.values()
    assert variant.jit_function.endswith(":_plain_kernel") and variant.entry_name == "_plain_kernel"
    assert (variant.import_path, variant.args["BLOCK"], variant.autotuned) == ("tests.trace_checks", "=32", False)
    assert list(cap.foreign.values()) == [_plain_kernel]
    assert knobs.runtime.jit_cache_hook is before
    assert not _plain_kernel.device_caches


@triton.jit
def _other_plain_kernel(x_ptr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(x_ptr + offs, tl.load(x_ptr + offs) * 3)


def _launch_two_packages_kernels(x):
    _plain_kernel[(1,)](x, 64, BLOCK=32)
    _other_plain_kernel[(1,)](x, BLOCK=16)


def test_every_kernel_reached_is_recorded_and_each_leaves_the_fake_device():
    x = torch.empty(64, dtype=torch.float32, device="meta")
    with capture(SM90, all_kernels=True) as cap:
        _launch_two_packages_kernels(x)
        assert _plain_kernel.device_caches and _other_plain_kernel.device_caches
    assert sorted(v.entry_name for v in cap.variants.values()) == ["_other_plain_kernel", "_plain_kernel"]
    assert sorted(f.fn.__name__ for f in cap.foreign.values()) == ["_other_plain_kernel", "_plain_kernel"]
    assert not _plain_kernel.device_caches and not _other_plain_kernel.device_caches


def test_trace_call_with_all_kernels_sees_what_the_code_launches_itself():
    x = torch.empty(64, dtype=torch.float32, device="meta")
    variants = trace_call(SM90, _launch_two_packages_kernels, x, all_kernels=True)
    assert sorted(v.entry_name for v in variants) == ["_other_plain_kernel", "_plain_kernel"]


def test_only_capture_all_answers_host_codes_device_questions_as_the_target():
    """A launcher's own ``torch.version.hip`` check sees this machine unless the trace reaches every kernel."""
    seen = []
    real = torch.version.hip
    trace_call(TARGETS["gfx942"], lambda: seen.append(torch.version.hip))
    trace_call(TARGETS["gfx942"], lambda: seen.append(torch.version.hip), all_kernels=True)
    assert seen[0] == real and seen[1] is not None and torch.version.hip == real


def test_an_autotuner_another_package_launches_marks_each_of_its_configs_as_skippable():
    """An autotuner choosing among configs skips one the GPU refuses: such a config is no launch that must work."""
    x = torch.empty(64, dtype=torch.float32, device="meta")
    tuned = triton.autotune(configs=[triton.Config({"BLOCK": 32}, num_warps=1), triton.Config({"BLOCK": 64},
                                                                                            num_warps=2)],
                            key=["n"])(_plain_kernel)
    with capture(SM90, all_kernels=True) as cap:
        tuned[(1,)](x, 64)
    assert sorted((v.args["BLOCK"], v.autotuned) for v in cap.variants.values()) == [("=32", True), ("=64", True)]
