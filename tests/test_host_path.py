"""The launchers' host path: plain-int helpers equal Triton's, ops registered the cheap way."""

import re

import pytest
import torch
import triton
from tritonwarm.launchers._host import cdiv, next_power_of_2
from tritonwarm.launchers._op import custom_op


def test_host_helpers_equal_tritons():
    for n in [*range(0, 4100), 2**31 - 1, 2**31, 2**31 + 1, 10**12]:
        assert next_power_of_2(n) == triton.next_power_of_2(n), n
    for a in [*range(0, 300), 2**40 + 3]:
        for b in (1, 2, 3, 16, 17, 1024):
            assert cdiv(a, b) == triton.cdiv(a, b), (a, b)


def test_ops_are_plain_library_ops_with_a_fake():
    import tritonwarm.launchers  # noqa: F401  (registers the ops)

    op = torch.ops.tritonwarm.rms_norm.default
    assert re.search(r"Tensor\(a\d*!\)\? residual", str(op._schema))  # mutated in place, as declared
    x, w = torch.randn(3, 16, device="meta"), torch.randn(16, device="meta")
    # the fake answers for meta tensors without launching anything
    assert torch.ops.tritonwarm.rms_norm(x, w, 1e-6, None).shape == (3, 16)
    # no torch.library.custom_op wrapper (its per-call Python is what the Library path avoids)
    assert not isinstance(torch.ops.tritonwarm.rms_norm, torch._library.custom_ops.CustomOpDef)


def test_ops_live_in_one_namespace():
    with pytest.raises(ValueError, match="tritonwarm namespace"):
        custom_op("elsewhere::f")
