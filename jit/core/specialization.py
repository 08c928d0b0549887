"""Triton's specialization classes for scalar and pointer arguments, as public helpers.

Triton compiles one binary per *class* of each argument, not per value. For an int the
classes are "exactly one" (folded into a constexpr), "divisible by 16" and "generic", each in
i32, i64 or u64 width; for a pointer, "16-byte aligned" and "unaligned". A warm-up therefore
needs one representative per class, never every value. These helpers only *name* classes; the
keys tritonwarm records are always the ones Triton computes itself (see ``trace.py``), and the
test suite checks every function here against Triton's own specializer.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

I32 = (-(2**31), 2**31 - 1)
I64 = (-(2**63), 2**63 - 1)
U64 = (2**63, 2**64 - 1)
_WIDTHS = (("i32", I32), ("i64", I64), ("u64", U64))
# The same widths as disjoint intervals, in ascending order (i64 minus i32 is two pieces).
_DISJOINT_WIDTHS = (("i64", (I64[0], I32[0] - 1)), ("i32", I32), ("i64", (I32[1] + 1, I64[1])), ("u64", U64))

SCALAR_CLASSES = ("one", "i32:div16", "i32", "i64:div16", "i64", "u64:div16", "u64")
_CANONICAL_REP = {
    "one": 1,
    "i32:div16": 16,
    "i32": 2,
    "i64:div16": 2**31,
    "i64": 2**31 + 1,
    "u64:div16": 2**63,
    "u64": 2**63 + 1,
}


def _check_int(value) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{value!r} is not an int: Triton passes bool as u1 and float as fp32, "
                         "never value-specialized")
    if not I64[0] <= value <= U64[1]:
        raise ValueError(f"{value} does not fit in 64 bits: Triton cannot pass it to a kernel")
    return value


def _width(value: int) -> str:
    for name, (lo, hi) in _WIDTHS:
        if lo <= value <= hi:
            return name
    raise AssertionError(value)  # unreachable after _check_int


def scalar_class(value: int) -> str:
    """The specialization class Triton puts ``value`` in when passed as a plain int argument.

    One of ``"one"``, ``"i32:div16"``, ``"i32"``, ``"i64:div16"``, ``"i64"``, ``"u64:div16"``, ``"u64"``.
    Raises ``ValueError`` for a bool, a non-int, or an int outside [-2**63, 2**64).
    """
    value = _check_int(value)
    if value == 1:
        return "one"
    width = _width(value)
    return f"{width}:div16" if value % 16 == 0 else width


def scalar_rep(value: int) -> int:
    """A canonical representative of ``value``'s class: 1, 16, 2, 2**31, 2**31+1, 2**63 or 2**63+1."""
    return _CANONICAL_REP[scalar_class(value)]


def class_reps(lo: int, hi: int) -> dict[str, int]:
    """For the inclusive range [lo, hi], the smallest value of each class the range touches.

    A range collapsed this way keeps every compiled variant and picks representatives *inside* the
    range, so a launch spec that reads the value (to size a fake tensor, say) sees a plausible one.
    """
    _check_int(lo), _check_int(hi)
    if lo > hi:
        raise ValueError(f"empty range [{lo}, {hi}]")
    reps: dict[str, int] = {}
    if lo <= 1 <= hi:
        reps["one"] = 1
    for name, (wlo, whi) in _DISJOINT_WIDTHS:
        a, b = max(lo, wlo), min(hi, whi)
        if a > b:
            continue
        first_div16 = a + (-a) % 16
        if first_div16 <= b and f"{name}:div16" not in reps:
            reps[f"{name}:div16"] = first_div16
        # smallest value in [a, b] that is neither 1 nor a multiple of 16
        for candidate in range(a, min(b, a + 18) + 1):
            if candidate != 1 and candidate % 16 != 0 and name not in reps:
                reps[name] = candidate
                break
    return {cls: reps[cls] for cls in SCALAR_CLASSES if cls in reps}


# --------------------------------------------------------------------------- pointers

POINTER_CLASSES = ("aligned", "unaligned")


def pointer_class(tensor: torch.Tensor) -> str:
    """``"aligned"`` when Triton sees the pointer as 16-byte divisible, else ``"unaligned"``.

    For a fake (meta) tensor the address is taken as its storage offset in bytes, which is what
    the same view has at run time on top of the (always 256-byte aligned) caching allocator.
    """
    return "aligned" if pointer_address(tensor) % 16 == 0 else "unaligned"


def pointer_address(tensor: torch.Tensor) -> int:
    if _backing(tensor) == "meta":
        return tensor.storage_offset() * tensor.element_size()
    return tensor.data_ptr()


def _backing(tensor: torch.Tensor) -> str:
    """Where a tensor really is: a ``ServerTensor`` (host code sees ``cuda``) is meta or CPU underneath."""
    from .server_tensors import backing_device

    return backing_device(tensor).type


def fake_tensor(shape, dtype: torch.dtype, *, stride=None, aligned: bool = True) -> torch.Tensor:
    """A meta tensor standing in for a runtime input: no memory, real shape, stride and dtype.

    ``aligned=False`` gives an offset view (storage offset of one element), the class a runtime
    slice such as ``x[1:]`` lands in (vLLM #57667: aligned fakes do not cover offset views).
    """
    shape = tuple(int(s) for s in shape)
    if stride is None:
        stride, running = [], 1
        for size in reversed(shape):
            stride.append(running)
            running *= max(size, 1)
        stride = tuple(reversed(stride))
    offset = 0 if aligned else 1
    if not aligned and torch.tensor([], dtype=dtype).element_size() >= 16:
        raise ValueError(f"cannot misalign a {dtype} tensor by whole elements")
    span = offset + sum((s - 1) * st for s, st in zip(shape, stride, strict=True)) + 1 if all(shape) else offset
    base = torch.empty(max(span, 1), dtype=dtype, device="meta")
    return base.as_strided(shape, tuple(stride), offset)


@dataclass(frozen=True)
class FakePointer:
    """What each backend's specializer reads of a tensor argument, for a meta tensor.

    - every backend: ``dtype`` and ``data_ptr()`` (16-byte divisibility), the address being the
      runtime alignment of the same view;
    - HIP (gfx targets, buffer ops on by default): ``ptr_range()``, the bytes of the tensor's whole
      storage, which Triton reads before falling back to ``untyped_storage().size()``; a tensor of
      at most 2 GiB gets the pointer-range attribute, so without it every warmed gfx key would
      differ from a real tensor's.
    """

    dtype: torch.dtype
    address: int
    storage_bytes: int

    def data_ptr(self) -> int:
        return self.address

    def ptr_range(self) -> int:
        return self.storage_bytes


def as_kernel_arg(value):
    """Meta tensors become ``FakePointer`` for Triton's specializer; everything else passes through."""
    if isinstance(value, torch.Tensor) and _backing(value) == "meta":
        return FakePointer(value.dtype, pointer_address(value), value.untyped_storage().nbytes())
    return value


def cpu_twin(value):
    """A real CPU tensor with a meta tensor's dtype, shape, strides, storage offset and storage size
    (lists, tuples and dicts walked); anything else unchanged. ``torch.empty`` touches no memory, so
    this is how warmed keys are compared with the keys Triton computes for real tensors."""
    if isinstance(value, torch.Tensor) and _backing(value) == "meta":
        from .server_tensors import ServerTensor, plain

        elements = value.untyped_storage().nbytes() // value.element_size()
        twin = torch.empty(elements, dtype=value.dtype).as_strided(value.shape, value.stride(), value.storage_offset())
        return ServerTensor(twin, value.arg) if isinstance(value, ServerTensor) else plain(twin)
    if isinstance(value, (list, tuple)):
        return type(value)(cpu_twin(v) for v in value)
    if isinstance(value, dict):
        return {k: cpu_twin(v) for k, v in value.items()}
    return value
