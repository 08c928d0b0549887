"""Every variant of every shipped spec compiles for sm90, and for gfx942 where the spec applies;
the shipped specs plan cleanly (no unreachable rows, no launcher errors, sound collapses); one cache
serves every GPU of a target."""

import dataclasses
import pathlib

import pytest
import torch
from tritonwarm.engine.config import ENGINES
from tritonwarm.engine.plan import engine_plan
from tritonwarm.jit import TARGETS
from tritonwarm.jit.core.targets import DEVICES, target_device_answers
from tritonwarm.jit.pipeline.check import check
from tritonwarm.jit.pipeline.plan import plan
from tritonwarm.jit.pipeline.specs import load_specs
from tritonwarm.jit.pipeline.warmup import warm

SHIPPED = pathlib.Path(__file__).parent.parent / "warmup_specs"


@pytest.mark.slow
@pytest.mark.parametrize("target_name", ["sm90", "gfx942"])
def test_every_shipped_variant_compiles(tmp_path, target_name):
    target = TARGETS[target_name]
    specs = load_specs([SHIPPED])
    the_plan = plan(specs, target)
    assert not the_plan.unreachable and not the_plan.errors and not the_plan.collapse_errors
    kernels = {v.kernel.rsplit(".", 1)[1] for v in the_plan.variants.values()}
    assert {"rms_norm_kernel", "silu_and_mul_kernel", "moe_topk_routing_kernel"} <= kernels
    result = warm(the_plan, tmp_path, jobs=2)
    assert result.failed == 0, result.failures
    assert result.compiled == len(the_plan.variants) > 20
    assert check(plan(specs, target), tmp_path).ok
    binaries = list(tmp_path.glob(f"*/*.{target.binary_ext}"))
    assert len(binaries) == len(the_plan.variants)


def test_nvidia_only_specs_are_skipped_for_amd():
    specs = load_specs([SHIPPED])
    nvfp4 = [s for s in specs if "nvfp4" in s.kernel_path]
    assert nvfp4 and all(s.applies_to(TARGETS["sm90"]) and not s.applies_to(TARGETS["gfx942"]) for s in nvfp4)


# GPUs of one target that a fleet mixes: the target's representative differs in SMs, memory and L2
OTHER_GPUS = {
    "sm80": {"name": "NVIDIA A30", "multi_processor_count": 56, "total_memory": 24 * 2**30,
             "L2_cache_size": 24 * 2**20, "mem_bus_width": 3072},
    "sm90": {"name": "NVIDIA H20", "multi_processor_count": 78, "total_memory": 96 * 2**30,
             "L2_cache_size": 60 * 2**20},
    "gfx942": {"name": "AMD Instinct MI308X", "multi_processor_count": 80},
}


@pytest.mark.slow
@pytest.mark.parametrize("target_name", sorted(OTHER_GPUS))
def test_one_cache_serves_every_gpu_of_a_target(monkeypatch, target_name):
    """A cache is warmed per target (sm90); a fleet runs several GPUs of it (H100, H20, H200). Launch specs
    may size a grid or a do_not_specialize count from the GPU, never pick a compiled value from it: every
    shipped spec and engine plans the same variants, traced with another GPU's answers."""
    target = TARGETS[target_name]
    specs = load_specs([SHIPPED])

    def planned() -> set[str]:
        plans = [plan(specs, target, verify_collapse=False), *(engine_plan(c, target) for c in ENGINES.values())]
        assert not [error for p in plans for error in p.errors]  # a launcher failing on both would hide a change
        return {variant for p in plans for variant in p.variants}

    representative = planned()
    other = dataclasses.replace(DEVICES[target_name], **OTHER_GPUS[target_name])
    monkeypatch.setitem(DEVICES, target_name, other)
    with target_device_answers(target):  # what a launch spec asking the device now hears
        assert torch.cuda.get_device_properties(0).multi_processor_count == other.multi_processor_count
    assert planned() == representative and len(representative) > 20
