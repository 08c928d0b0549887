import pathlib

import pytest
import torch
from tritonwarm.jit import TARGETS, fake_tensor
from tritonwarm.jit.pipeline.plan import plan
from tritonwarm.jit.pipeline.specs import load_specs
from tritonwarm.kernels.rms_norm import rms_norm_reference
from tritonwarm.launchers import rms_norm

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows,hidden", [(1, 1), (1, 7), (3, 100), (5, 5120), (2, 7168)])
def test_matches_reference(dtype, rows, hidden):
    g = torch.Generator().manual_seed(rows * 10007 + hidden)
    x = torch.randn(rows, hidden, generator=g).to(dtype)
    w = torch.randn(hidden, generator=g).to(dtype)
    torch.testing.assert_close(rms_norm(x, w, 1e-6), rms_norm_reference(x, w, 1e-6), atol=TOL[dtype], rtol=TOL[dtype])


@pytest.mark.parametrize("dtype", DTYPES)
def test_fused_residual_updates_in_place(dtype):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(4, 96, generator=g).to(dtype)
    w = torch.randn(96, generator=g).to(dtype)
    residual = torch.randn(4, 96, generator=g).to(dtype)
    expected_out, expected_residual = rms_norm_reference(x, w, 1e-5, residual=residual.clone())
    out, res = rms_norm(x, w, 1e-5, residual=residual)
    assert res.data_ptr() == residual.data_ptr()
    # x + residual in fp32, rounded once to the dtype on both sides: exact, bf16 included
    torch.testing.assert_close(res, expected_residual, atol=0, rtol=0)
    torch.testing.assert_close(out, expected_out, atol=TOL[dtype], rtol=TOL[dtype])


def test_strided_rows():
    g = torch.Generator().manual_seed(2)
    base = torch.randn(6, 160, generator=g)
    x = base[:, :100]  # row stride 160 > hidden 100
    w = torch.randn(100, generator=g)
    torch.testing.assert_close(rms_norm(x, w), rms_norm_reference(x, w))


def test_inf_propagates_and_zero_row_is_finite():
    x = torch.zeros(2, 33)
    x[1, 3] = float("inf")
    out = rms_norm(x, torch.ones(33))
    assert torch.isfinite(out[0]).all() and (out[0] == 0).all()
    assert not torch.isfinite(out[1]).all()


def test_zero_rows_launch_nothing():
    assert rms_norm(torch.empty(0, 64), torch.ones(64)).shape == (0, 64)


def test_weight_of_another_hidden_size_is_refused_by_the_launch_spec():
    # The check lives in the launch spec (run once per input key), so warm-up's fake launches and
    # zero-row calls refuse a mismatched weight too, and the message names both sizes.
    x = torch.randn(3, 64)
    with pytest.raises(ValueError, match=r"weight shape \(32,\) does not match hidden size 64"):
        rms_norm(x, torch.ones(32))
    with pytest.raises(ValueError, match="hidden size 64"):
        rms_norm(x[:0], torch.ones(32))


@pytest.mark.slow
@pytest.mark.parametrize("target", ["sm90", "gfx942"])
def test_compiles(compile_call, target):
    x = fake_tensor((8, 4096), torch.bfloat16)
    w = fake_tensor((4096,), torch.bfloat16)
    [(variant, _)] = compile_call(target, rms_norm, x, w, 1e-6)
    assert variant.args["x_ptr"] == "*bf16 aligned"
    assert variant.args["BLOCK"] == "=4096"


@pytest.mark.parametrize("fused", [False, True])
def test_custom_op(fused):
    g = torch.Generator().manual_seed(3)
    x, w = torch.randn(3, 40, generator=g), torch.randn(40, generator=g)
    residual = torch.randn(3, 40, generator=g) if fused else None
    torch.library.opcheck(torch.ops.tritonwarm.rms_norm.default, (x, w, 1e-6, residual))


@pytest.mark.parametrize("target", ["sm90", "gfx942"])
def test_shipped_spec_plans_cleanly(target):
    path = pathlib.Path(__file__).parent.parent / "warmup_specs" / "rms_norm.yaml"
    the_plan = plan(load_specs([path]), TARGETS[target])
    assert not (the_plan.unreachable or the_plan.errors or the_plan.collapse_errors or the_plan.redundant)
    assert len(the_plan.variants) == 8  # 2 dtypes x 2 hidden sizes x plain/fused
