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


# Fixed examples at the values production uses, beside the random ones above: every shipped collapsed
# range starts at 1 (a batch of one request), 16 is the first divisible value, and the width limits
# are where a class changes its integer type.
PRODUCTION_RANGES = {
    (1, 1): {"one": 1},
    (1, 2): {"one": 1, "i32": 2},
    (1, 15): {"one": 1, "i32": 2},
    (1, 16): {"one": 1, "i32:div16": 16, "i32": 2},
    (1, 8192): {"one": 1, "i32:div16": 16, "i32": 2},
    (0, 1): {"one": 1, "i32:div16": 0},
    (2, 16): {"i32:div16": 16, "i32": 2},
    (16, 16): {"i32:div16": 16},
    (16, 17): {"i32:div16": 16, "i32": 17},
    (17, 31): {"i32": 17},
    (1, 2**31 - 1): {"one": 1, "i32:div16": 16, "i32": 2},
    (1, 2**31): {"one": 1, "i32:div16": 16, "i32": 2, "i64:div16": 2**31},
    (2**31 - 1, 2**31 + 1): {"i32": 2**31 - 1, "i64:div16": 2**31, "i64": 2**31 + 1},
    (2**31 + 1, 2**31 + 15): {"i64": 2**31 + 1},
    (-(2**31) - 1, -(2**31)): {"i32:div16": -(2**31), "i64": -(2**31) - 1},
    (-(2**31) - 17, -(2**31) - 1): {"i64:div16": -(2**31) - 16, "i64": -(2**31) - 17},
    (2**63 - 1, 2**63 + 1): {"i64": 2**63 - 1, "u64:div16": 2**63, "u64": 2**63 + 1},
    (2**64 - 2, 2**64 - 1): {"u64": 2**64 - 2},
    (-(2**63), -(2**63)): {"i64:div16": -(2**63)},
    (-1, 1): {"one": 1, "i32:div16": 0, "i32": -1},
}


@pytest.mark.parametrize(("lo", "hi"), list(PRODUCTION_RANGES))
def test_class_reps_at_the_ranges_production_collapses(lo, hi):
    reps = class_reps(lo, hi)
    assert reps == PRODUCTION_RANGES[(lo, hi)]
    assert list(reps) == [c for c in SCALAR_CLASSES if c in reps]  # in Triton's order, as warm-up walks them
    for cls, value in reps.items():
        assert triton_class(value) == cls


@pytest.mark.parametrize("hi", [1, 2, 16, 4096, 2**31 - 1, 2**31, 2**63, 2**64 - 1])
def test_a_range_starting_at_one_always_warms_the_exact_one_class(hi):
    """Without it, a batch of one request compiles at serving time (Triton folds 1 into a constexpr)."""
    assert class_reps(1, hi)["one"] == 1
    assert "one" not in class_reps(2, max(hi, 2))


def test_an_empty_or_unpassable_range_is_refused():
    with pytest.raises(ValueError, match=r"empty range \[5, 4\]"):
        class_reps(5, 4)
    class_reps(3, 3)  # one value is a range
    with pytest.raises(ValueError, match="does not fit in 64 bits"):
        class_reps(1, 2**64)
    with pytest.raises(ValueError, match="is not an int"):
        class_reps(True, 4)


@pytest.mark.parametrize("value", [1, 16, 2, 2**31 - 1, 2**31, 2**31 + 1, 2**63 - 1, 2**63, 2**63 + 1, 2**64 - 1])
def test_scalar_class_and_rep_at_the_width_limits(value):
    expected = {1: ("one", 1), 16: ("i32:div16", 16), 2: ("i32", 2), 2**31 - 1: ("i32", 2),
                2**31: ("i64:div16", 2**31), 2**31 + 1: ("i64", 2**31 + 1), 2**63 - 1: ("i64", 2**31 + 1),
                2**63: ("u64:div16", 2**63), 2**63 + 1: ("u64", 2**63 + 1), 2**64 - 1: ("u64", 2**63 + 1)}
    assert (scalar_class(value), scalar_rep(value)) == expected[value]
    assert triton_class(value) == expected[value][0]


def test_value_errors_name_the_value_and_why():
    with pytest.raises(ValueError, match=r"^True is not an int: Triton passes bool as u1 and float as fp32, never "
                                         r"value-specialized$"):
        scalar_class(True)
    with pytest.raises(ValueError, match=r"^1\.5 is not an int"):
        scalar_class(1.5)
    with pytest.raises(ValueError, match=rf"^{2**64} does not fit in 64 bits: Triton cannot pass it"):
        scalar_class(2**64)
    assert scalar_class(-(2**63)) == "i64:div16" and scalar_class(2**64 - 1) == "u64"  # the limits themselves


# The alignment class of a fake tensor for every dtype width: one element off is never 16-byte
# aligned, 16 bytes off always is, exactly as Triton sees the same view of a real tensor.
DTYPES_BY_WIDTH = {1: [torch.uint8, torch.int8, torch.float8_e4m3fn], 2: [torch.float16, torch.bfloat16, torch.int16],
                   4: [torch.float32, torch.int32], 8: [torch.float64, torch.int64]}


@pytest.mark.parametrize(("width", "dtype"), [(w, d) for w, ds in DTYPES_BY_WIDTH.items() for d in ds])
def test_fake_tensor_alignment_for_every_dtype_width(width, dtype):
    assert torch.tensor([], dtype=dtype).element_size() == width
    aligned, offset = fake_tensor((3, 7), dtype), fake_tensor((3, 7), dtype, aligned=False)
    assert (aligned.storage_offset(), offset.storage_offset()) == (0, 1)
    assert (pointer_class(aligned), pointer_class(offset)) == ("aligned", "unaligned")
    fake_aligned, fake_offset = as_kernel_arg(aligned), as_kernel_arg(offset)
    assert (fake_aligned.data_ptr(), fake_offset.data_ptr()) == (0, width)
    assert (fake_aligned.dtype, fake_offset.dtype) == (dtype, dtype)
    assert fake_aligned.ptr_range() == 21 * width and fake_offset.ptr_range() == 22 * width  # the whole storage
    # Triton's specializer gives the fakes the class it gives real tensors of the same view
    real = torch.empty(64, dtype=dtype)
    views = {"aligned": real[: 21].view(3, 7), "unaligned": real[1:22].view(3, 7),
             "16 bytes on": real[16 // width: 16 // width + 21].view(3, 7)}
    assert [native_specialize_impl(BaseBackend, v, False, True, True)[1] for v in views.values()] == ["D", "", "D"]
    for fake, real_view in ((fake_aligned, views["aligned"]), (fake_offset, views["unaligned"])):
        assert native_specialize_impl(BaseBackend, fake, False, True, True) == \
            native_specialize_impl(BaseBackend, real_view, False, True, True)
    sixteen_on = torch.empty(64, dtype=dtype, device="meta")[16 // width:].as_strided((3, 7), (7, 1))
    assert pointer_class(sixteen_on) == "aligned" and pointer_class(sixteen_on[0, 1:]) == "unaligned"


def test_fake_tensor_strides_and_storage_follow_the_shape():
    t = fake_tensor((2, 3, 4), torch.float16)
    assert t.stride() == (12, 4, 1) and t.untyped_storage().nbytes() == 24 * 2
    assert fake_tensor((2, 0, 4), torch.float16).stride() == (4, 4, 1)  # an empty axis keeps later strides
    assert fake_tensor((2, 0, 4), torch.float16).untyped_storage().nbytes() == 2  # holds nothing: one element
    with pytest.raises(ValueError):  # a stride per dimension, or a ValueError a spec's loader names
        fake_tensor((3, 5), torch.float16, stride=(1,))
    assert fake_tensor((0,), torch.float32).untyped_storage().nbytes() == 4  # never a zero-size storage
    assert fake_tensor((0,), torch.float32, aligned=False).storage_offset() == 1
    strided = fake_tensor((3, 5), torch.float32, stride=(8, 1))
    assert strided.untyped_storage().nbytes() == (2 * 8 + 4 + 1) * 4
    with pytest.raises(ValueError, match="cannot misalign a torch.complex128 tensor by whole elements"):
        fake_tensor((2,), torch.complex128, aligned=False)
    assert fake_tensor((2,), torch.complex64, aligned=False).storage_offset() == 1


def test_cpu_twin_of_a_server_tensor_keeps_its_argument_and_its_layout():
    """Host code that sees ``cuda`` tensors (a server's own program) is compared on real CPU twins too."""
    from tritonwarm.jit.core.server_tensors import ServerTensor, backing_device
    from tritonwarm.jit.core.specialization import cpu_twin

    fake = ServerTensor(fake_tensor((4, 8), torch.float16, aligned=False), "x")
    [twin] = cpu_twin([fake])
    assert isinstance(twin, ServerTensor) and twin.arg == "x" and backing_device(twin).type == "cpu"
    assert (tuple(twin.shape), twin.stride(), twin.storage_offset()) == ((4, 8), (8, 1), 1)
    assert twin.untyped_storage().nbytes() == fake.untyped_storage().nbytes()
    plain_twin = cpu_twin({"w": fake_tensor((3,), torch.float32)})["w"]
    assert type(plain_twin) is torch.Tensor and plain_twin.device.type == "cpu"


def test_a_real_tensor_is_classed_by_its_address():
    from tritonwarm.jit.core.specialization import pointer_address

    real = torch.empty(64, dtype=torch.float16)
    assert pointer_address(real[3:]) == real[3:].data_ptr() == real.data_ptr() + 6
    assert pointer_address(fake_tensor((4,), torch.float16, aligned=False)) == 2  # a fake's: its offset in bytes
