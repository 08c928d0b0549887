"""The target table and the target-only driver: set and restored in one place, on every path."""

import pytest
from triton.runtime.driver import driver
from tritonwarm.jit import TARGETS, resolve_target, resolve_targets, target_driver
from tritonwarm.jit.core.targets import UnknownTargetError, local_target


def test_driver_is_restored_after_an_error():
    before = driver._active
    with pytest.raises(RuntimeError, match="boom"):
        with target_driver(TARGETS["gfx950"]) as fake:
            assert driver.active is fake
            assert driver.active.get_current_target().arch == "gfx950"
            raise RuntimeError("boom")
    assert driver._active is before


def test_nested_drivers_unwind_in_order():
    before = driver._active
    with target_driver(TARGETS["sm90"]) as outer:
        with target_driver(TARGETS["sm120"]) as inner:
            assert driver.active is inner and inner.device != outer.device
        assert driver.active is outer
    assert driver._active is before


def test_every_target_answers_like_a_driver():
    for target in TARGETS.values():
        with target_driver(target) as fake:
            gpu = driver.active.get_current_target()
            assert (gpu.backend, gpu.arch, gpu.warp_size) == (target.backend, target.arch, target.warp_size)
            assert fake.get_current_stream(fake.get_current_device()) == 0


def test_resolving_targets():
    assert [t.name for t in resolve_targets("sm90, gfx942,sm90")] == ["sm90", "gfx942"]
    with pytest.raises(UnknownTargetError, match="unknown target 'sm91'.*sm90"):
        resolve_target("sm91")
    if local_target() is None:  # this machine has no GPU: a missing --target lists the choices
        with pytest.raises(UnknownTargetError, match="no GPU on this machine.*gfx942"):
            resolve_target(None)
