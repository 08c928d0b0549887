"""``@triton.autotune`` / ``@triton.heuristics`` kernels as JitKernels: every pruned config warmed, winners
pinned where Triton's autotuner reads them, and Triton's own ``Autotuner.run`` then compiling and
benchmarking nothing."""

import pytest
import torch
import triton
import triton.language as tl
from tritonwarm.examples import inhouse_autotuned as ex
from tritonwarm.jit import TARGETS, fake_tensor
from tritonwarm.jit.adopt.winners import pin_winners, probe_winners
from tritonwarm.jit.cache.triton_dir import triton_cache_dir
from tritonwarm.jit.core.targets import NoBenchmarkError, target_driver
from tritonwarm.jit.core.trace import trace_call
from tritonwarm.jit.pipeline.plan import plan
from tritonwarm.jit.pipeline.specs import load_specs
from tritonwarm.jit.pipeline.warmup import warm

SPEC = ex.__file__.replace(".py", ".yaml")


def _expected_variants(n_cols_values):
    """(n_cols, BLOCK, num_warps, EVEN) for every config Triton's own pruning keeps, per row."""
    autotuner = ex.scale_rows_kernel
    out = set()
    for n in n_cols_values:
        autotuner.nargs = {"n_cols": n}
        try:
            configs = autotuner.prune_configs({})
        finally:
            autotuner.nargs = None
        for c in configs:
            out.add((n, c.kwargs["BLOCK"], c.num_warps, n % c.kwargs["BLOCK"] == 0))
    return out


def _planned(the_plan):
    got = set()
    for v in the_plan.variants.values():
        n = 4096 if v.args["n_cols"] == "i32:div16" else 1000
        got.add((n, int(v.args["BLOCK"][1:]), v.num_warps, v.args["EVEN"] == "=True"))
    return got


def _runtime(target, cache_dir, n_cols):
    """Triton's own Autotuner.run → Heuristics.run → JITFunction.run, as a server calls it (no launch)."""
    x = fake_tensor((32, n_cols), torch.bfloat16)
    scale = fake_tensor((32,), torch.float32)
    autotuner = ex.scale_rows_kernel
    autotuner.cache.clear()  # a fresh serving process
    with target_driver(target) as fake, triton_cache_dir(cache_dir):
        try:
            autotuner.run(x, scale, x, n_cols, x.stride(0), x.stride(0), grid=(32,), warmup=True)
        finally:
            _base(autotuner).device_caches.pop(fake.device, None)
            autotuner.__dict__.pop("do_bench", None)
    return autotuner.best_config


def _base(kernel):
    while not isinstance(kernel, triton.runtime.jit.JITFunction):
        kernel = kernel.fn
    return kernel


@pytest.mark.slow
@pytest.mark.parametrize("target_name", ["sm90", "gfx942"])
def test_every_pruned_config_warmed_and_pinned_winner_needs_no_compile_or_benchmark(
        target_name, tmp_path, compile_counter, monkeypatch):
    target = TARGETS[target_name]
    specs = load_specs([SPEC])
    the_plan = plan(specs, target)
    assert not the_plan.errors and not the_plan.notes
    assert _planned(the_plan) == _expected_variants([1000, 4096])

    result = warm(the_plan, tmp_path)
    assert result.failed == 0 and result.compiled == len(the_plan.variants)

    unknown = probe_winners(specs, target, tmp_path).unknown
    assert len(unknown) == 2 and all("no stored winner" in u for u in unknown)
    stored = pin_winners(specs, target, tmp_path)
    assert not stored.errors and len(stored.stored) == 2
    assert probe_winners(specs, target, tmp_path).unknown == []

    def no_benchmark(*args, **kwargs):
        raise AssertionError("the autotuner benchmarked")

    monkeypatch.setattr(triton.runtime.autotuner.Autotuner, "_bench", no_benchmark)
    compile_counter.count = 0
    # config: "$0 if n_cols < 4096 else 2" (indices into the declared configs)
    assert _runtime(target, tmp_path, 1000) == ex.scale_rows_kernel.configs[0]
    assert _runtime(target, tmp_path, 4096) == ex.scale_rows_kernel.configs[2]
    assert compile_counter.count == 0


def test_target_only_driver_refuses_to_benchmark_without_a_winner(tmp_path, compile_counter):
    with pytest.raises(NoBenchmarkError, match="pin a config"):
        _runtime(TARGETS["sm90"], tmp_path, 1000)


def test_repinning_replaces_the_stored_winner(tmp_path):
    target = TARGETS["sm90"]
    spec_file = tmp_path / "s.yaml"
    text = open(SPEC).read()
    spec_file.write_text(text)
    assert not pin_winners(load_specs([spec_file]), target, tmp_path).errors
    spec_file.write_text(text.replace('config: "$0 if n_cols < 4096 else 2"', "config: {BLOCK: 256, num_warps: 2}"))
    assert not pin_winners(load_specs([spec_file]), target, tmp_path).errors
    files = sorted(tmp_path.rglob("*.autotune.json"))
    assert len(files) == 2
    assert _runtime_config_only(target, tmp_path, 4096) == ex.scale_rows_kernel.configs[1]


def _runtime_config_only(target, cache_dir, n_cols):
    """The winner Triton's autotuner picks, with every compile skipped (nothing warmed here)."""
    from triton import knobs

    previous = knobs.runtime.jit_cache_hook
    knobs.runtime.jit_cache_hook = lambda **_: True
    try:
        return _runtime(target, cache_dir, n_cols)
    finally:
        knobs.runtime.jit_cache_hook = previous


def test_pinned_config_must_survive_pruning(tmp_path):
    spec_file = tmp_path / "s.yaml"
    spec_file.write_text(open(SPEC).read().replace('config: "$0 if n_cols < 4096 else 2"', "config: 3"))
    report = pin_winners(load_specs([spec_file]), TARGETS["sm90"], tmp_path)
    assert len(report.errors) == 1 and "n_cols=1000" in report.errors[0] and "not among" in report.errors[0]


@pytest.mark.slow
def test_a_pin_that_names_no_config_is_told_by_the_plan_once_before_anything_is_compiled(tmp_path, capsys):
    from tritonwarm.cli import main

    spec_file = tmp_path / "s.yaml"
    spec_file.write_text(open(SPEC).read().replace('config: "$0 if n_cols < 4096 else 2"', "config: 7"))
    expected = "config index 7 out of range: the autotuner declares 4 configs"
    the_plan = plan(load_specs([spec_file]), TARGETS["sm90"])
    assert len(the_plan.errors) == 2 and all(expected in e for e in the_plan.errors)
    assert "n_cols=1000" in the_plan.errors[0] and "n_cols=4096" in the_plan.errors[1]

    args = [str(spec_file), "--target", "sm90", "--cache-dir", str(tmp_path / "cache")]
    capsys.readouterr()
    assert main(["check", *args]) == 1  # the cache is empty, and the spec's mistake comes first
    out = " ".join(capsys.readouterr().out.split())
    assert out.count(expected) == 1 and "error: 2 rows (s.yaml#0 (dtype=bfloat16, n_cols=1000) and 1 more): " in out
    assert main(["warmup", *args, "-j", "1"]) == 1
    assert capsys.readouterr().err.count(expected) == 1  # the plan's line, not repeated after pinning

    spec_file.write_text(open(SPEC).read().replace('config: "$0 if n_cols < 4096 else 2"',
                                                   'config: "$1 // (n_cols - 1000)"'))
    [error] = plan(load_specs([spec_file]), TARGETS["sm90"]).errors  # the n_cols=1000 row's pin divides by 0
    assert "n_cols=1000" in error and "config: ZeroDivisionError" in error


def test_jitkernel_runs_an_autotuned_heuristics_kernel_in_the_interpreter():
    x = torch.randn(3, 1000)
    scale = torch.randn(3)
    torch.testing.assert_close(ex.scale_rows(x, scale), x * scale[:, None])


def _prune_reading_data(configs, named_args, **kwargs):
    return [c for c in configs if c.kwargs["BLOCK"] <= int(named_args["x_ptr"].abs().max().item())]


@triton.autotune(configs=[triton.Config({"BLOCK": 32}), triton.Config({"BLOCK": 64}), triton.Config({"BLOCK": 128})],
                 key=["n"], prune_configs_by={"early_config_prune": _prune_reading_data})
@triton.jit
def _data_pruned_kernel(x_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) * 2, mask=offs < n)


def test_pruning_that_needs_data_keeps_every_config_with_a_note():
    from tritonwarm.jit.core.trace import Capture, tracing

    cap = Capture()
    with tracing(cap, TARGETS["sm90"], all_kernels=True) as state:
        _data_pruned_kernel[(1,)](fake_tensor((100,), torch.float32), 100)
    assert sorted(v.args["BLOCK"] for v in cap.variants.values()) == ["=128", "=32", "=64"]
    assert len(state.notes) == 1 and "prune_configs_by" in state.notes[0]
    assert _data_pruned_kernel.cache == {}  # tracing leaves the autotuner's winners alone


def test_config_field_is_validated(tmp_path):
    from tritonwarm.jit.pipeline.specs import SpecError

    bad = tmp_path / "bad.yaml"
    bad.write_text(open(SPEC).read().replace('config: "$0 if n_cols < 4096 else 2"', "config: true"))
    with pytest.raises(SpecError, match=r"bad.yaml:\d+: config: a pinned autotune config is an index"):
        load_specs([bad])


def test_tune_on_a_machine_without_gpu_is_one_line_exit_2(capsys, tmp_path):
    from tritonwarm.cli import main

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    assert main(["tune", SPEC, "--target", "local", "--cache-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "there is none" in err


def test_tune_for_a_target_stores_the_pinned_winners(capsys, tmp_path):
    from tritonwarm.cli import main

    assert main(["tune", SPEC, "--target", "sm90", "--cache-dir", str(tmp_path)]) == 0
    assert "sm90: 2 winners pinned, 0 errors" in capsys.readouterr().out
    assert probe_winners(load_specs([SPEC]), TARGETS["sm90"], tmp_path).unknown == []


def _modelled_time(**meta):
    return {32: 3.0, 64: 1.0, 128: 2.0}[meta["BLOCK"]]


@triton.autotune(configs=[triton.Config({"BLOCK": 32}), triton.Config({"BLOCK": 64}), triton.Config({"BLOCK": 128})],
                 key=["n"], prune_configs_by={"perf_model": _modelled_time, "top_k": 2})
@triton.jit
def _modelled_kernel(x_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) * 2, mask=offs < n)


@triton.heuristics({"BLOCK": lambda args: triton.next_power_of_2(args["n"])})
@triton.jit
def _heuristic_kernel(x_ptr, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) + 1, mask=offs < n)


def test_perf_model_top_k_prunes_as_triton_does():
    variants = trace_call(TARGETS["gfx942"], lambda x: _modelled_kernel[(1,)](x, 100),
                          fake_tensor((100,), torch.float32), all_kernels=True)
    assert sorted(v.args["BLOCK"] for v in variants) == ["=128", "=64"]  # the two fastest by the model


def test_jitkernel_of_a_heuristics_kernel_traces_and_interprets():
    from tritonwarm.jit import JitKernel, Launch

    jit = JitKernel(_heuristic_kernel, lambda x: Launch(grid=(1,), args=(x, x.numel())), name="test.heuristic_only")
    variants = trace_call(TARGETS["sm90"], jit, fake_tensor((100,), torch.float32))
    assert [v.args["BLOCK"] for v in variants] == ["=128"]
    x = torch.zeros(100)
    jit(x)
    assert torch.equal(x, torch.ones(100))


@pytest.mark.slow
def test_warmup_stores_pinned_winners_and_check_reports_unknown_ones(capsys, tmp_path):
    from tritonwarm.cli import main

    args = [SPEC, "--target", "sm90", "--cache-dir", str(tmp_path)]
    assert main(["warmup", *args, "-j", "1"]) == 0
    assert main(["check", *args]) == 0
    for stored in tmp_path.rglob("*.autotune.json"):
        stored.unlink()
    capsys.readouterr()
    assert main(["check", *args]) == 1
    out = capsys.readouterr().out  # one line for the kernel, naming its rows and the command that stores them
    assert out.count("winner unknown:") == 1 and "scale_rows_kernel: 2 rows, first " in out and "n_cols=1000" in out
    assert "`tritonwarm tune SPEC --target local`" in " ".join(out.split())
    assert main(["check", *args, "--verbose"]) == 1
    out = capsys.readouterr().out
    assert out.count("winner unknown:") == 2 and "n_cols=1000" in out and "n_cols=4096" in out
