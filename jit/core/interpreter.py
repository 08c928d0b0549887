"""Bugs of Triton's interpreter, fixed for the duration of an interpreted launch, so that device code
carries no interpreter-only branches and the CPU tests check what the GPU computes.

NumPy has no bf16: the interpreter keeps bf16 tensors as their uint16 bit patterns, and its
arithmetic then works on the bit patterns as integers. Here:

- ``tl.dot`` on bf16 widens to fp32 first (exact: the GPU's bf16 products are exact in its fp32
  accumulator too);
- conversions between fp32 and bf16 round to nearest even and keep subnormals (the interpreter's
  own conversion rounds ties up and mishandles bf16 subnormals);
- elementwise bf16 arithmetic (add, sub, mul, div, fma, neg, min / max, comparisons) computes on
  the widened values and rounds the result to bf16, to nearest even, as the GPU's bf16 instructions
  do. For add, sub, mul and div the fp64 (then fp32) result rounds to the bf16 the exact result
  rounds to (an intermediate of at least 2p + 2 bits is innocuous for these); an fma is exact in
  fp64 unless its product and addend are some 2**37 apart, and only then, when the larger is
  exactly halfway between two bf16 values, can it break that tie the other way than the GPU;
- Triton 3.6's minimum and maximum that ignore NaN propagated it (NumPy's minimum, not fmin);
- Triton 3.6 converts a tensor to a ``range()`` bound with ``int(array)``, which NumPy 2 rejects
  for a one-element array: use the element (what Triton 3.9 does).
"""

from __future__ import annotations

import contextlib

import numpy as np
import triton.language as tl

_BF16_BINARY = {  # builder method -> NumPy op on the widened values
    "create_fadd": np.add, "create_fsub": np.subtract, "create_fmul": np.multiply, "create_fdiv": np.divide,
    "create_precise_divf": np.divide, "create_minimumf": np.minimum, "create_maximumf": np.maximum,
}
# minimum / maximum that ignore NaN: for every float dtype (Triton 3.6's used NumPy's minimum)
_NAN_IGNORING = {"create_minnumf": np.fmin, "create_maxnumf": np.fmax}
_COMPARISONS = {"LT": np.less, "GT": np.greater, "LE": np.less_equal, "GE": np.greater_equal, "EQ": np.equal,
                "NE": np.not_equal}


def _widen(handle):
    """A bf16 handle as fp64 values (exact); any other handle unchanged."""
    if handle.dtype.scalar != tl.bfloat16:
        return handle.data
    with np.errstate(invalid="ignore"):  # a signaling NaN widens to a quiet one
        return _bf16_as_fp32(handle.data).astype(np.float64)


def _bf16_as_fp32(bits):
    """bf16 bit patterns as the fp32 values they are (bit for bit: NaN payloads kept)."""
    return (bits.view(np.uint16).astype(np.uint32) << 16).view(np.float32)


def _bf16(values):
    """fp64 values rounded to bf16 (to nearest even; NaN stays NaN) as the interpreter's bit patterns."""
    with np.errstate(over="ignore", invalid="ignore"):  # beyond fp32: inf, as beyond bf16; NaN stays
        bits = values.astype(np.float32).view(np.uint32)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    return np.where(np.isnan(values), (bits >> 16) | 0x40, rounded).astype(np.uint16)


def _is_bf16(*handles) -> bool:
    return any(h.dtype.scalar == tl.bfloat16 for h in handles)


def _comparison(predicate: str):
    """The NumPy form of an LLVM float comparison (``OLT``, ``UNE``, ...) on widened values."""
    op = _COMPARISONS[predicate[1:]]
    if predicate[0] == "U":  # unordered: true where either is NaN
        return lambda a, b: op(a, b) | np.isnan(a) | np.isnan(b)
    if predicate == "ONE":  # ordered: false where either is NaN (NumPy's != is true there)
        return lambda a, b: op(a, b) & ~np.isnan(a) & ~np.isnan(b)
    return op  # NumPy's ordered comparisons are false on NaN already


@contextlib.contextmanager
def interpreter_fixes():
    """The fixes above, undone when the launch returns."""
    from triton.runtime import interpreter

    builder = interpreter.InterpreterBuilder
    patched = {}

    def patch(name, make):  # make(original) -> the fixed method; a method this Triton lacks is left alone
        original = getattr(builder, name, None)
        if original is not None:
            patched[name] = original
            setattr(builder, name, make(original))

    def widen_for_dot(handle):
        if handle.dtype.scalar == tl.bfloat16:
            return interpreter.TensorHandle(_bf16_as_fp32(handle.data), tl.float32)
        return handle

    patch("create_dot", lambda original: lambda self, a, b, d, *args, **kwargs: original(
        self, widen_for_dot(a), widen_for_dot(b), d, *args, **kwargs))

    def bf16(op, otherwise=None):  # bf16 operands: op on the widened values; else otherwise, or the original
        def make(original):
            def method(self, lhs, rhs):
                if not _is_bf16(lhs, rhs):
                    return original(self, lhs, rhs) if otherwise is None else self.binary_op(lhs, rhs, otherwise)
                with np.errstate(all="ignore"):  # inf - inf, 0 * inf: NaN, as on the GPU
                    return interpreter.TensorHandle(_bf16(op(_widen(lhs), _widen(rhs))), tl.bfloat16)
            return method
        return make

    for name, op in _BF16_BINARY.items():
        patch(name, bf16(op))
    for name, op in _NAN_IGNORING.items():
        patch(name, bf16(op, otherwise=op))

    def comparison(op):
        def make(original):
            def method(self, lhs, rhs):
                if not _is_bf16(lhs, rhs):
                    return original(self, lhs, rhs)
                with np.errstate(invalid="ignore"):
                    return interpreter.TensorHandle(op(_widen(lhs), _widen(rhs)), tl.int1)
            return method
        return make

    for ordering in "OU":
        for predicate in _COMPARISONS:
            patch(f"create_fcmp{ordering}{predicate}", comparison(_comparison(ordering + predicate)))

    def fma(original):
        def create_fma(self, x, y, z):
            if not _is_bf16(x, y, z):
                return original(self, x, y, z)
            with np.errstate(all="ignore"):
                return interpreter.TensorHandle(_bf16(_widen(x) * _widen(y) + _widen(z)), tl.bfloat16)
        return create_fma

    def fneg(original):
        def create_fneg(self, arg):
            if not _is_bf16(arg):
                return original(self, arg)
            return interpreter.TensorHandle(arg.data.view(np.uint16) ^ np.uint16(0x8000), tl.bfloat16)
        return create_fneg

    def cast(original):
        def cast_impl(self, src, dst_type):  # fp32 <-> bf16, subnormals included
            if {src.dtype.scalar, dst_type.scalar} != {tl.float32, tl.bfloat16}:
                return original(self, src, dst_type)
            if dst_type.scalar == tl.bfloat16:
                return interpreter.TensorHandle(_bf16(src.data.astype(np.float64)), tl.bfloat16)
            return interpreter.TensorHandle(_bf16_as_fp32(src.data), tl.float32)
        return cast_impl

    patch("create_fma", fma)
    patch("create_fneg", fneg)
    patch("cast_impl", cast)

    original_tensor_patch = interpreter._patch_lang_tensor

    def patch_lang_tensor(tensor, scope):
        original_tensor_patch(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    interpreter._patch_lang_tensor = patch_lang_tensor
    try:
        yield
    finally:
        interpreter._patch_lang_tensor = original_tensor_patch
        for name, method in patched.items():
            setattr(builder, name, method)
