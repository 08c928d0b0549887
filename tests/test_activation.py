import pathlib

import pytest
import torch
from tritonwarm.jit import TARGETS, fake_tensor
from tritonwarm.jit.pipeline.plan import plan
from tritonwarm.jit.pipeline.specs import load_specs
from tritonwarm.kernels.activation import silu_and_mul_reference
from tritonwarm.launchers.activation import silu_and_mul

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
# fp32 math on both sides; exp may differ in the last fp32 bit (numpy vs torch), which can move a
# fp16 or bf16 result by one ulp.
TOL = {torch.float32: dict(atol=1e-6, rtol=1e-6), torch.float16: dict(atol=1e-5, rtol=2**-10),
       torch.bfloat16: dict(atol=1e-5, rtol=2**-7)}
SPEC = pathlib.Path(__file__).parent.parent / "warmup_specs" / "silu_and_mul.yaml"


def random_input(shape, dtype, seed):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed)).mul(3).to(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows,d", [(1, 1), (1, 7), (3, 100), (2, 1100), (2, 1408)])
def test_matches_reference(dtype, rows, d):
    # 1100 and 1408 are not multiples of the 1024 block: the last column block is partial.
    x = random_input((rows, 2 * d), dtype, seed=rows * 7919 + d)
    out = silu_and_mul(x)
    assert out.shape == (rows, d) and out.dtype == dtype
    torch.testing.assert_close(out, silu_and_mul_reference(x), **TOL[dtype])


def test_leading_dims_and_strided_rows():
    base = random_input((2, 3, 2 * 40 + 24), torch.float32, seed=3)
    x = base[..., : 2 * 40]  # row stride 104 > 2*d: the kernel reads it in place
    assert silu_and_mul(x).shape == (2, 3, 40)
    torch.testing.assert_close(silu_and_mul(x), silu_and_mul_reference(x), **TOL[torch.float32])
    permuted = random_input((3, 2, 80), torch.float32, seed=4).permute(1, 0, 2)  # rows not evenly strided
    torch.testing.assert_close(silu_and_mul(permuted), silu_and_mul_reference(permuted), **TOL[torch.float32])


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # numpy in the interpreter: exp overflow, inf * 0
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_special_values_match_torch(dtype):
    inf, nan = float("inf"), float("nan")
    gate = torch.tensor([-inf, inf, nan, -1000.0, -100.0, 0.0, -0.0, 2.0, 0.0, -inf, 1.0])
    up = torch.tensor([1.0, 1.0, 1.0, 1.0, 3.0, inf, 1.0, -inf, nan, 0.0, -0.0])
    x = torch.cat([gate, up])[None].to(dtype)
    out, expected = silu_and_mul(x), silu_and_mul_reference(x)
    assert torch.isnan(expected[0, 0])  # torch's silu(-inf) is nan, not -0
    torch.testing.assert_close(out, expected, atol=0, rtol=0, equal_nan=True)
    # assert_close treats -0 == +0; silu of a large negative number is -0 in torch
    finite = ~torch.isnan(expected)
    assert torch.equal(torch.signbit(out[finite]), torch.signbit(expected[finite]))


def test_zero_rows_launch_nothing():
    assert silu_and_mul(torch.empty(0, 16)).shape == (0, 8)


def test_odd_last_dim_is_rejected():
    with pytest.raises(ValueError, match="odd"):
        silu_and_mul(torch.zeros(2, 7))


def test_custom_op():
    x = random_input((3, 2 * 24), torch.float32, seed=5)
    torch.testing.assert_close(torch.ops.tritonwarm.silu_and_mul(x), silu_and_mul_reference(x), **TOL[torch.float32])
    torch.library.opcheck(torch.ops.tritonwarm.silu_and_mul.default, (x,))


@pytest.mark.slow
@pytest.mark.parametrize("target", ["sm90", "gfx942"])
def test_compiles(compile_call, target):
    [(variant, _)] = compile_call(target, silu_and_mul, fake_tensor((8, 2 * 14336), torch.bfloat16))
    assert variant.args["x_ptr"] == "*bf16 aligned"
    assert variant.args["d"] == "i32:div16"
    assert variant.args["BLOCK"] == "=1024"


@pytest.mark.parametrize("target", ["sm90", "gfx942"])
def test_warmup_spec_plans_cleanly(target):
    """Every row launches, collapsed token counts never change the variant, few variants in all."""
    the_plan = plan(load_specs([SPEC]), TARGETS[target])
    assert not (the_plan.unreachable or the_plan.errors or the_plan.collapse_errors)
    # d in {1408, 10944, 14336} are multiples of 16 and >= the block: one binary per dtype
    assert len(the_plan.variants) == 2
