"""`check --plain`: Triton alone, in a process that imports no tritonwarm module but the kernels', finds
(or not) each planned variant in the cache; it agrees with `check` where the cache serves and where a
variable of the environment makes every key differ, and compiles and writes nothing."""

import json
import os

import pytest
from tritonwarm.jit import TARGETS
from tritonwarm.jit.pipeline.check import check
from tritonwarm.jit.pipeline.plain_check import plain_check
from tritonwarm.jit.pipeline.plan import plan
from tritonwarm.jit.pipeline.specs import load_specs
from tritonwarm.jit.pipeline.warmup import warm

SM90 = TARGETS["sm90"]


def _listing(folder):
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if "tritonwarm" not in p.parts)


@pytest.mark.slow
def test_the_readme_flow_is_proved_by_plain_triton(tmp_path, dtypes_spec_file, run_cli):
    """The README's flow, step by step (a two-variant spec for the engine config): the server's
    environment, a warm-up and bundle for it, then on the server, with TRITON_CACHE_DIR set where
    serving runs: install, and check with the plain Triton proof."""
    shell = {k: v for k, v in os.environ.items() if k != "TRITONWARM_CACHE_DIR"}  # a user's: Triton's folder
    server = {**shell, "TRITON_CACHE_DIR": str(tmp_path / "served")}
    build = {**shell, "TRITON_CACHE_DIR": str(tmp_path / "build")}
    serving, bundle = tmp_path / "serving.json", tmp_path / "warm-h100.tar.gz"
    spec = [dtypes_spec_file, "--target", "h100"]
    run_cli("env", "-o", serving, rc=0, env=server)
    run_cli("warmup", *spec, "--for", serving, "-j", "1", rc=0, env=build)
    run_cli("bundle", "create", bundle, *spec, "--for", serving, rc=0, env=build)
    run_cli("bundle", "verify", bundle, "--for", serving, rc=0, env=build)
    run_cli("bundle", "install", bundle, rc=0, env=server)
    out = run_cli("check", "--plain", *spec, rc=0, env=server).stdout
    assert "sm90: ok: 2 variants planned from 2 rows, 0 missing" in out
    assert f"plain Triton: 2/2 hits, Triton {_triton()}'s own lookup in {tmp_path / 'served'}" in out, out
    found = json.loads(run_cli("check", "--plain", *spec, "--json", rc=0, env=server).stdout)
    assert found["ok"] and found["plain"]["hits"] == {"sm90": 2} and found["plain"]["ok"]
    assert set(found["plain"]["imported"]) <= {"tritonwarm", "tritonwarm.kernels", "tritonwarm.kernels.rms_norm"}


def _triton() -> str:
    import triton

    return triton.__version__


@pytest.mark.slow
@pytest.mark.parametrize("variable, value", [("TRITON_DEFAULT_FP_FUSION", "0"), ("TRITON_DEBUG", "1")])
def test_a_wrong_variable_misses_for_check_and_for_plain_triton_alike(tmp_path, dtypes_spec_file, monkeypatch,
                                                                       run_cli, variable, value):
    """A cache-invalidating variable (every key differs), and one Triton turns into a compile option
    (``debug``): `check` and plain Triton both miss everything; nothing is compiled or written."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("TRITON_DEFAULT_FP_FUSION", "1")
    monkeypatch.delenv("TRITON_DEBUG", raising=False)
    warmed = plan(load_specs([dtypes_spec_file]), SM90)
    warm(warmed, cache)
    args = ("check", "--plain", dtypes_spec_file, "--target", "sm90", "--cache-dir", cache)
    out = run_cli(*args, rc=0).stdout
    assert "sm90: ok: 2 variants planned from 2 rows, 0 missing" in out and "plain Triton: 2/2 hits" in out, out

    monkeypatch.setenv(variable, value)
    listing = _listing(cache)
    out = run_cli(*args, rc=1).stdout
    assert "sm90: PROBLEMS: 2 variants planned from 2 rows, 2 missing" in out, out
    assert (f"plain Triton: 0/2 hits, Triton {_triton()}'s own lookup in {cache}, in a process that imports no "
            "tritonwarm module but the kernels'\nplain Triton would compile 2: rms_norm_kernel 2") in out, out
    plain = plain_check([warmed], cache)  # the warmed requests: Triton takes the rest from the environment
    assert not plain.ok and plain.hits == {"sm90": 0} and len(plain.compiles) == 2, plain
    assert _listing(cache) == listing  # nothing compiled, no folder left behind


MIXED_MODULE = """
import triton
import triton.language as tl
from tritonwarm.jit import JitKernel, Launch


@triton.jit
def add_one(x_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) + 1.0, mask=offs < n)


add_one_jit = JitKernel(add_one, lambda x: Launch(grid=(triton.cdiv(x.numel(), 256),), args=(x, x.numel()),
                                                  constexprs=dict(BLOCK=256)))


def launcher(x):
    return add_one_jit(x)
"""


@pytest.mark.slow
def test_a_kernel_whose_module_imports_tritonwarm_is_not_asked_for_plainly(tmp_path, monkeypatch):
    """The proof imports none of tritonwarm's machinery, even through a kernel's module: such a kernel is
    named as not asked for, and the proof does not pass."""
    code = tmp_path / "code"
    code.mkdir()
    (code / "mixed_kernels.py").write_text(MIXED_MODULE)
    monkeypatch.syspath_prepend(str(code))
    spec = tmp_path / "mixed.yaml"
    spec.write_text("kernel: mixed_kernels:launcher\nargs:\n  x: {tensor: [1024], dtype: float32}\n")
    the_plan = plan(load_specs([spec]), SM90)
    warm(the_plan, tmp_path / "cache")
    assert check(the_plan, tmp_path / "cache").ok
    plain = plain_check([the_plan], tmp_path / "cache")
    assert not plain.ok and plain.hits == {"sm90": 0} and len(plain.errors) == 1
    assert plain.lines()[1] == ("plain Triton could not ask for 1: ImportError: tritonwarm.jit: the plain Triton "
                                "process imports none of tritonwarm's machinery")
    assert set(plain.imported) <= {"tritonwarm"}  # its package only: no module of it ran
