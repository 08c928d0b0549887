"""``capture: all``: a module that launches ``kernel[grid](...)`` itself (autotuned and heuristic kernels
included) is warmed with no JitKernel, then Triton's own launch path finds every variant: 0 compiles."""

import contextlib

import pytest
import torch
import triton
from triton.runtime.jit import JITFunction
from tritonwarm.examples import thirdparty_ops as ops
from tritonwarm.jit import TARGETS, fake_tensor
from tritonwarm.jit.adopt.winners import probe_winners
from tritonwarm.jit.cache.triton_dir import triton_cache_dir
from tritonwarm.jit.core.targets import target_device_answers, target_driver
from tritonwarm.jit.core.trace import trace_call
from tritonwarm.jit.pipeline.plan import plan
from tritonwarm.jit.pipeline.specs import SpecError, load_specs
from tritonwarm.jit.pipeline.warmup import warm

SPEC = ops.__file__.replace(".py", ".yaml")


@contextlib.contextmanager
def serving_without_launching(target, cache_dir, monkeypatch):
    """Triton's own ``JITFunction.run`` for ``target`` reading ``cache_dir``; only the launch itself is
    skipped (``warmup=True``), as no GPU is here. Fresh in-memory caches, as in a new process."""
    original = JITFunction.run

    def run_without_launch(self, *args, grid, warmup, **kwargs):
        return original(self, *args, grid=grid, warmup=True, **kwargs)

    monkeypatch.setattr(JITFunction, "run", run_without_launch)
    monkeypatch.setattr(ops.bias_gelu_kernel, "cache_results", True)  # what TRITON_CACHE_AUTOTUNING=1 does
    ops.bias_gelu_kernel.cache.clear()
    with target_driver(target) as fake, target_device_answers(target), triton_cache_dir(cache_dir):
        try:
            yield
        finally:
            for kernel in (ops.softmax_kernel, ops.bias_gelu_kernel.fn.fn):
                kernel.device_caches.pop(fake.device, None)


def test_device_questions_get_the_targets_answers_and_are_restored():
    before = torch.cuda.get_device_properties, torch.version.hip
    x, bias = fake_tensor((64, 3000), torch.bfloat16), fake_tensor((3000,), torch.bfloat16)
    warps = {}
    for name in ("sm90", "gfx942"):
        variants = trace_call(TARGETS[name], ops.softmax, x, all_kernels=True)
        assert [v.jit_function for v in variants] == ["tritonwarm.examples.thirdparty_ops:softmax_kernel"]
        warps[name] = variants[0].num_warps
    assert warps == {"sm90": 8, "gfx942": 16}  # the module's own is_hip() branch, answered per target
    assert (torch.cuda.get_device_properties, torch.version.hip) == before
    assert len(trace_call(TARGETS["sm90"], ops.mlp_block, x, bias, all_kernels=True)) == 3  # 2 configs + softmax


@pytest.mark.slow
def test_capture_all_warms_a_module_that_launches_itself_then_it_runs_with_zero_compiles(
        tmp_path, compile_counter, monkeypatch):
    target = TARGETS["sm90"]
    specs = load_specs([SPEC])
    the_plan = plan(specs, target)
    assert not the_plan.errors and not the_plan.unreachable
    kernels = {v.jit_function for v in the_plan.variants.values()}
    assert kernels == {"tritonwarm.examples.thirdparty_ops:softmax_kernel",
                       "tritonwarm.examples.thirdparty_ops:bias_gelu_kernel"}
    result = warm(the_plan, tmp_path)
    assert result.failed == 0 and result.compiled == len(the_plan.variants)

    # the autotuned kernel has no winner yet: check says so; pin one per row (here: the first config)
    unknown = probe_winners(specs, target, tmp_path).unknown
    assert len(unknown) == 4 and all("bias_gelu_kernel" in u for u in unknown)
    spec_file = tmp_path / "pinned.yaml"
    spec_file.write_text(open(SPEC).read() + "config: 0\n")
    from tritonwarm.jit.adopt.winners import pin_winners

    assert not pin_winners(load_specs([spec_file]), target, tmp_path).errors

    def no_benchmark(*args, **kwargs):
        raise AssertionError("the autotuner benchmarked")

    monkeypatch.setattr(triton.runtime.autotuner.Autotuner, "_bench", no_benchmark)
    compile_counter.count = 0
    with serving_without_launching(target, tmp_path, monkeypatch):
        for tokens in (1, 64):
            for hidden in (1024, 3000):
                ops.mlp_block(fake_tensor((tokens, hidden), torch.bfloat16), fake_tensor((hidden,), torch.bfloat16))
    assert compile_counter.count == 0
    assert ops.bias_gelu_kernel.best_config == ops.bias_gelu_kernel.configs[0]


def test_launcher_field_and_kernel_alias(tmp_path):
    text = open(SPEC).read()
    alias = tmp_path / "alias.yaml"
    alias.write_text(text.replace("launcher:", "kernel:"))
    assert load_specs([alias])[0].capture_all
    both = tmp_path / "both.yaml"
    both.write_text("kernel: tritonwarm.examples.thirdparty_ops:softmax\n" + text)
    with pytest.raises(SpecError, match="kernel: give the launcher once"):
        load_specs([both])
    bad = tmp_path / "bad.yaml"
    bad.write_text(text.replace("capture: all", "capture: everything"))
    with pytest.raises(SpecError, match=r"bad.yaml:\d+: capture: unknown capture mode 'everything'"):
        load_specs([bad])


@pytest.mark.slow
def test_serving_monitor_sees_kernels_that_are_not_jitkernels(tmp_path, monkeypatch):
    from tritonwarm.jit.serving.monitor import DispatchMonitor, JitPolicyError

    target = TARGETS["sm90"]
    x = fake_tensor((64, 1024), torch.bfloat16)  # a shape the spec names
    monitor = DispatchMonitor(tmp_path, policy="error")
    with serving_without_launching(target, tmp_path, monkeypatch), monitor.serving():
        with pytest.raises(JitPolicyError, match="softmax_kernel would compile at serving time"):
            ops.softmax(x)
    assert [d.kernel for d in monitor.misses] == ["tritonwarm.examples.thirdparty_ops.softmax_kernel"]

    assert warm(plan(load_specs([SPEC]), target), tmp_path).failed == 0
    monitor = DispatchMonitor(tmp_path, policy="error")
    with serving_without_launching(target, tmp_path, monkeypatch), monitor.serving():
        ops.softmax(x)
    assert monitor.misses == [] and monitor.hits == 1

    unwarmed = fake_tensor((64, 1000), torch.bfloat16)  # a row length whose classes no spec row names
    with serving_without_launching(target, tmp_path, monkeypatch), monitor.serving():
        with pytest.raises(JitPolicyError, match=r"is not in .*: nearest warmed variant \w+ differs in \w+ "
                                                 r"\(warmed .*, here .*\).*: this class was not warmed"):
            ops.softmax(unwarmed)


def test_triton_and_torch_device_queries_answer_for_the_target():
    from triton.runtime import driver
    from tritonwarm.jit.core.trace import Capture, tracing

    seen = {}
    for name in ("sm90", "gfx942"):
        with tracing(Capture(), TARGETS[name], all_kernels=True):
            seen[name] = (driver.active.utils.get_device_properties(0)["multiprocessor_count"],
                          torch.cuda.get_device_properties(0).multi_processor_count,
                          torch.cuda.get_device_capability(), torch.version.hip is not None,
                          driver.active.get_current_target().backend)
    assert seen == {"sm90": (132, 132, (9, 0), False, "cuda"), "gfx942": (304, 304, (9, 4), True, "hip")}
