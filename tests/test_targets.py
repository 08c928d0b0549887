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


@pytest.mark.parametrize("name, arch", [("b300", 103), ("gb300", 103), ("NVIDIA B300 SXM6 AC", 103), ("sm103", 103),
                                        ("gb10", 121), ("sm121", 121), ("b200", 100), ("rtx5090", 120)])
def test_blackwell_ultra_and_gb10_have_their_own_targets(name, arch):
    assert resolve_target(name).arch == arch


@pytest.mark.parametrize("typed", ["b400", "sm110", "sm87", "sm101", "rtx5070", "gfx1100", "h300"])
def test_no_suggestion_crosses_a_compute_capability(typed):
    with pytest.raises(UnknownTargetError) as refused:
        resolve_target(typed)
    assert "nearest" not in str(refused.value), str(refused.value)


@pytest.mark.parametrize("typed, suggested", [("h10", "h100"), ("sm9", "sm90"), ("mi300", "mi300x"),
                                              ("gfx94", "gfx942"), ("b30", "b300")])
def test_a_typo_of_a_known_name_is_suggested(typed, suggested):
    with pytest.raises(UnknownTargetError, match=rf"\(nearest: {suggested}\)"):
        resolve_target(typed)


def test_sm_names_are_only_suggested_for_their_own_number():
    from tritonwarm.jit.core.gpu_names import nearest

    for number in range(70, 130):
        found = nearest(f"sm{number}", TARGETS)
        assert found is None or TARGETS[found].arch == number, (number, found)


def test_each_target_compiles_a_kernel_under_its_own_key(tmp_path, monkeypatch):
    """Triton compiles for every target of the table (no GPU here), and targets Triton tells apart (sm100
    and sm103, sm120 and sm121) have their own cache keys: one target's cache never serves the other."""
    import triton
    import triton.language as tl
    from triton.compiler import ASTSource

    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))

    @triton.jit
    def double(x, y, n, BLOCK: tl.constexpr):
        i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(y + i, tl.load(x + i, mask=i < n) * 2, mask=i < n)

    hashes = {}
    for target in TARGETS.values():
        source = ASTSource(double, {"x": "*fp32", "y": "*fp32", "n": "i32", "BLOCK": "constexpr"}, {"BLOCK": 128})
        compiled = triton.compile(source, target=target.gpu_target)
        assert compiled.asm.get(target.binary_ext), target.name
        hashes[target.name] = compiled.hash
    assert len(set(hashes.values())) == len(TARGETS), hashes
