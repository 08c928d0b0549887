"""scalar_class / scalar_rep / class_reps must agree with Triton's own specializer."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from triton._C.libtriton import native_specialize_impl
from triton.backends.compiler import BaseBackend
from tritonwarm.jit import SCALAR_CLASSES, class_reps, fake_tensor, pointer_class, scalar_class, scalar_rep
from tritonwarm.jit.core.specialization import FakePointer, as_kernel_arg

BOUNDARIES = [0, 1, -1, 2, 15, 16, 17, -16, -15, 2**31 - 1, 2**31, 2**31 + 1, 2**31 + 16, -(2**31), -(2**31) - 1,
              -(2**31) - 16, 2**32, 2**63 - 1, 2**63 - 16, 2**63, 2**63 + 1, 2**63 + 16, 2**64 - 1, 2**64 - 16,
              -(2**63), -(2**63) + 1]


def triton_class(value: int) -> str:
    """Triton's own answer, in scalar_class's vocabulary."""
    ty, attr = native_specialize_impl(BaseBackend, value, False, True, True)
    if ty == "constexpr":
        assert attr == 1
        return "one"
    return f"{ty}:div16" if attr == "D" else ty


@pytest.mark.parametrize("value", BOUNDARIES)
def test_boundaries_agree_with_triton(value):
    assert scalar_class(value) == triton_class(value)
    assert triton_class(scalar_rep(value)) == triton_class(value)


@settings(max_examples=10_000, deadline=None)
@given(st.integers(min_value=-(2**63), max_value=2**64 - 1))
def test_random_ints_agree_with_triton(value):
    assert scalar_class(value) == triton_class(value)
    assert triton_class(scalar_rep(value)) == triton_class(value)


@settings(max_examples=500, deadline=None)
@given(st.integers(min_value=-(2**63), max_value=2**64 - 1), st.integers(min_value=0, max_value=2**40))
def test_class_reps_cover_every_class_in_the_range(lo, span):
    hi = min(lo + span, 2**64 - 1)
    reps = class_reps(lo, hi)
    for cls, value in reps.items():
        assert lo <= value <= hi and triton_class(value) == cls
    # every class present at the ends of the range (and at 1) has a representative
    for probe in {lo, hi, lo + 1, hi - 1, 1, 16, 2**31, 2**63}:
        if lo <= probe <= hi:
            assert scalar_class(probe) in reps


def test_every_class_has_a_canonical_rep():
    assert {scalar_class(scalar_rep(v)) for v in BOUNDARIES} == set(SCALAR_CLASSES)


@pytest.mark.parametrize("bad", [2**64, -(2**63) - 1, 10**30, True, 1.5, "3"])
def test_values_triton_cannot_pass_raise_value_error(bad):
    with pytest.raises(ValueError):
        scalar_class(bad)


def test_out_of_range_is_also_rejected_by_triton():
    for bad in (2**64, -(2**63) - 1):
        with pytest.raises(OverflowError):
            native_specialize_impl(BaseBackend, bad, False, True, True)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.uint8])
def test_fake_pointers_land_in_the_class_triton_gives_them(dtype):
    aligned = fake_tensor((4, 64), dtype)
    offset_view = fake_tensor((4, 64), dtype, aligned=False)
    assert pointer_class(aligned) == "aligned" and pointer_class(offset_view) == "unaligned"
    ty, attr = native_specialize_impl(BaseBackend, as_kernel_arg(aligned), False, True, True)
    assert attr == "D" and ty.startswith("*")
    _, attr = native_specialize_impl(BaseBackend, as_kernel_arg(offset_view), False, True, True)
    assert attr == ""
    # the same offset view of a real (CPU) tensor is unaligned too
    real = torch.empty(4 * 64 + 1, dtype=dtype)[1:]
    assert native_specialize_impl(BaseBackend, real, False, True, True)[1] == ""
    assert isinstance(as_kernel_arg(offset_view), FakePointer)


def test_fake_tensor_keeps_shape_and_stride():
    t = fake_tensor((3, 5), torch.float16, stride=(8, 1), aligned=False)
    assert t.shape == (3, 5) and t.stride() == (8, 1) and t.device.type == "meta"
