"""Every variant of every shipped spec compiles for sm90, and for gfx942 where the spec applies;
the shipped specs plan cleanly (no unreachable rows, no launcher errors, sound collapses)."""

import pathlib

import pytest
from tritonwarm.jit import TARGETS
from tritonwarm.jit.check import check
from tritonwarm.jit.plan import plan
from tritonwarm.jit.specs import load_specs
from tritonwarm.jit.warmup import warm

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
