"""End to end: spec → trace → warm into Triton's cache for real targets → Triton's own runtime
path finds every entry (counted at the compiler, not read from our manifest) → check."""

import os
import textwrap

import pytest
from triton import knobs
from tritonwarm.jit import TARGETS
from tritonwarm.jit.cache import Manifest, entry_files
from tritonwarm.jit.pipeline.check import check
from tritonwarm.jit.pipeline.plan import plan
from tritonwarm.jit.pipeline.specs import load_specs
from tritonwarm.jit.pipeline.warmup import warm


@pytest.mark.slow
@pytest.mark.parametrize("target_name", ["sm90", "gfx942"])
def test_warmed_cache_serves_runtime_launches_without_compiling(tmp_path, spec_file, compile_counter,
                                                               rms_norm_runtime, target_name):
    target = TARGETS[target_name]
    cache_dir = tmp_path / "cache"
    the_plan = plan(load_specs([spec_file]), target)
    assert len(the_plan.variants) == 2 and not the_plan.collapse_errors and not the_plan.unreachable
    result = warm(the_plan, cache_dir)
    assert (result.planned, result.compiled, result.failed) == (2, 2, 0)
    for variant in the_plan.variants.values():
        files = entry_files(cache_dir, variant.entry_dir, variant.entry_name)
        binary = [p for n, p in files.items() if n.endswith("." + target.binary_ext)]
        assert binary and os.path.getsize(binary[0]) > 1000

    compiled_by_warmup = compile_counter.count
    assert compiled_by_warmup == 2
    for rows in (1, 2, 16, 37, 4096, 3000):  # batch sizes the spec never named
        for fused in (False, True):
            kernel = rms_norm_runtime(target, cache_dir, rows, fused)
            assert kernel.hash in the_plan.variants
    assert compile_counter.count == compiled_by_warmup

    # control: the same runtime path against an empty cache does compile (the counter works)
    rms_norm_runtime(target, tmp_path / "empty", 5, False)
    assert compile_counter.count == compiled_by_warmup + 1


@pytest.mark.slow
def test_second_warm_compiles_nothing_and_check_is_clean(tmp_path, spec_file):
    target, cache_dir = TARGETS["sm90"], tmp_path / "cache"
    specs = load_specs([spec_file])
    assert check(plan(specs, target), cache_dir).missing  # cold
    first = warm(plan(specs, target), cache_dir)
    second = warm(plan(specs, target), cache_dir)
    assert first.compiled == 2 and (second.compiled, second.cached) == (0, 2)
    report = check(plan(specs, target), cache_dir)
    assert report.ok, report.to_json()
    entries = Manifest(cache_dir, "sm90").read()
    assert len(entries) == 2
    for entry in entries.values():
        assert entry["triton_version"] and entry["env"] is not None and entry["files"]
        assert entry["resources"]["registers"] > 0  # read offline from the cubin
        assert entry["rows"]


@pytest.mark.slow
def test_stale_and_corrupt_entries_are_reported_and_repaired(tmp_path, spec_file):
    target, cache_dir = TARGETS["sm90"], tmp_path / "cache"
    specs = load_specs([spec_file])
    the_plan = plan(specs, target)
    warm(the_plan, cache_dir)
    variant = next(iter(the_plan.variants.values()))
    cubin = entry_files(cache_dir, variant.entry_dir, variant.entry_name)[f"{variant.entry_name}.cubin"]
    with open(cubin, "r+b") as f:  # flip bytes in the middle of the binary
        f.seek(200)
        f.write(b"\xde\xad\xbe\xef")
    report = check(the_plan, cache_dir)
    assert [c["id"] for c in report.corrupt] == [variant.variant_id] and not report.ok
    repaired = warm(plan(specs, target), cache_dir)
    assert repaired.repaired == 1
    assert check(plan(specs, target), cache_dir).ok

    manifest = Manifest(cache_dir, "sm90")
    entry = manifest.read()[variant.cache_hash]
    manifest.update({variant.cache_hash: {**entry, "triton_version": "0.0.1"}})
    stale = check(plan(specs, target), cache_dir).stale
    assert stale and "Triton 0.0.1" in stale[0]["why"]


@pytest.mark.slow
def test_killed_midway_entry_reads_as_missing_and_is_rebuilt(tmp_path, spec_file):
    target, cache_dir = TARGETS["sm90"], tmp_path / "cache"
    specs = load_specs([spec_file])
    warm(plan(specs, target), cache_dir)
    variant = next(iter(plan(specs, target).variants.values()))
    # what a kill between Triton's file writes leaves: files without their group
    group = cache_dir / variant.entry_dir / f"__grp__{variant.entry_name}.json"
    group.unlink()
    assert [m["id"] for m in check(plan(specs, target), cache_dir).missing] == [variant.variant_id]
    again = warm(plan(specs, target), cache_dir)
    assert (again.compiled, again.cached) == (1, 1)


def test_collapsing_an_axis_that_picks_a_constexpr_is_caught(tmp_path):
    # hidden picks BLOCK (next power of two): collapsing it would warm BLOCK=16 for 4096 (vLLM #53567)
    path = tmp_path / "bad.yaml"
    path.write_text(textwrap.dedent("""
        kernel: tritonwarm.launchers.rms_norm:rms_norm
        axes:
          hidden: {range: [1, 8192], collapse: true}
        args:
          x: {tensor: [4, $hidden], dtype: float16}
          weight: {tensor: [$hidden], dtype: float16}
    """))
    the_plan = plan(load_specs([path]), TARGETS["sm90"])
    assert the_plan.collapse_errors
    assert f"{path}:4: axes.hidden: collapse: true is unsound" in the_plan.collapse_errors[0]


def test_rows_that_launch_nothing_are_unreachable(tmp_path):
    path = tmp_path / "empty_rows.yaml"
    path.write_text(textwrap.dedent("""
        kernel: tritonwarm.launchers.rms_norm:rms_norm
        axes:
          num_tokens: [0, 8]
        args:
          x: {tensor: [$num_tokens, 64], dtype: float16}
          weight: {tensor: [64], dtype: float16}
    """))
    target = TARGETS["sm90"]
    the_plan = plan(load_specs([path]), target)
    assert len(the_plan.unreachable) == 1 and "num_tokens=0" in the_plan.unreachable[0]
    assert not check(the_plan, tmp_path / "cache").ok


def test_unaligned_views_are_a_separate_variant(tmp_path):
    path = tmp_path / "views.yaml"
    path.write_text(textwrap.dedent("""
        kernel: tritonwarm.launchers.rms_norm:rms_norm
        axes:
          aligned: [true, false]
        args:
          x: {tensor: [8, 64], dtype: float16, aligned: $aligned}
          weight: {tensor: [64], dtype: float16}
    """))
    variants = plan(load_specs([path]), TARGETS["sm90"]).variants.values()
    assert sorted(v.args["x_ptr"] for v in variants) == ["*fp16 aligned", "*fp16 unaligned"]


@pytest.mark.slow
def test_user_triton_cache_dir_is_never_overwritten(tmp_path, spec_file):
    before = os.environ["TRITON_CACHE_DIR"]
    warm(plan(load_specs([spec_file]), TARGETS["sm90"]), tmp_path / "elsewhere")
    assert os.environ["TRITON_CACHE_DIR"] == before
    assert knobs.cache.dir == before


@pytest.mark.slow
def test_parallel_warmup_is_byte_identical_to_serial(tmp_path, spec_file):
    target, specs = TARGETS["sm90"], load_specs([spec_file])
    serial = warm(plan(specs, target), tmp_path / "serial", jobs=1)
    parallel = warm(plan(specs, target), tmp_path / "parallel", jobs=2)
    assert serial.compiled == parallel.compiled == 2 and parallel.failed == 0
    for variant in plan(specs, target).variants.values():
        a = entry_files(tmp_path / "serial", variant.entry_dir, variant.entry_name)
        b = entry_files(tmp_path / "parallel", variant.entry_dir, variant.entry_name)
        assert a.keys() == b.keys()
        for name in a:  # the group file lists absolute paths; everything Triton compiled is identical
            if not name.startswith("__grp__"):
                with open(a[name], "rb") as fa, open(b[name], "rb") as fb:
                    assert fa.read() == fb.read(), name
    assert Manifest(tmp_path / "parallel", "sm90").read().keys() == Manifest(tmp_path / "serial", "sm90").read().keys()


@pytest.mark.slow
def test_noop_warmup_reuses_stored_plans_until_an_input_changes(tmp_path, spec_file, monkeypatch):
    from tritonwarm.jit.core.trace import Capture

    target, cache_dir = TARGETS["sm90"], tmp_path / "cache"
    first = plan(load_specs([spec_file]), target, cache_dir=cache_dir)
    warm(first, cache_dir)

    traced = []
    original = Capture.launch
    monkeypatch.setattr(Capture, "launch", lambda self, *a: traced.append(1) or original(self, *a))
    again = plan(load_specs([spec_file]), target, cache_dir=cache_dir)
    assert not traced, "traced a spec whose inputs did not change"
    assert again.variants.keys() == first.variants.keys() and again.rows == first.rows
    assert warm(again, cache_dir).cached == 2

    spec_file.write_text(spec_file.read_text() + "description: edited\n")  # any change to the spec file re-traces it
    assert plan(load_specs([spec_file]), target, cache_dir=cache_dir).variants.keys() == first.variants.keys()
    assert traced
    traced.clear()
    plan(load_specs([spec_file]), TARGETS["sm100"], cache_dir=cache_dir)  # so does another target
    assert traced


def test_overlapping_cache_dir_blocks_leave_tritons_setting_as_it_was(tmp_path, monkeypatch):
    """A warm-up per target runs in threads, each pointing Triton at the cache: their blocks overlap and
    close in any order. When the last closes, Triton reads what the process set before (here its
    ``TRITON_CACHE_DIR``, still followed), not a folder one block left behind."""
    import threading

    from tritonwarm.jit.cache.triton_dir import triton_cache_dir

    cache, entered, first_closed = tmp_path / "cache", threading.Barrier(2), threading.Event()

    def block(closes_first: bool):
        with triton_cache_dir(cache):
            entered.wait()
            assert knobs.cache.dir == str(cache)
            if not closes_first:
                first_closed.wait()
        if closes_first:
            first_closed.set()

    threads = [threading.Thread(target=block, args=(first,)) for first in (True, False)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert knobs.cache.dir == os.environ["TRITON_CACHE_DIR"]
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "moved"))
    assert knobs.cache.dir == str(tmp_path / "moved")  # no folder pinned: the environment is read again
