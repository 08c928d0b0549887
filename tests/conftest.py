"""Shared fixtures. Every test process gets its own Triton and tritonwarm cache directories, so
tests never touch the user's caches; CPU tensors run in Triton's interpreter automatically."""

import os
import tempfile
import warnings

import pytest

_SESSION_DIR = tempfile.mkdtemp(prefix="tritonwarm-tests-")
os.environ["TRITON_CACHE_DIR"] = os.path.join(_SESSION_DIR, "triton-cache")
os.environ["TRITONWARM_CACHE_DIR"] = os.path.join(_SESSION_DIR, "tritonwarm-cache")
os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")  # silence Triton 3.9's default-change warning
warnings.filterwarnings("ignore", module="triton")


@pytest.fixture(scope="session")
def compile_cache_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("compiled")


@pytest.fixture
def compile_call(compile_cache_dir):
    """``compile_call("sm90", launcher, *fake_args)``: trace the call with Triton's own keys, compile
    every variant it launches for that target, and return ``[(variant, CompiledKernel), ...]``."""
    from tritonwarm.jit import TARGETS, trace_call
    from tritonwarm.jit.compile import compile_variant

    def run(target_name, fn, *args, **kwargs):
        target = TARGETS[target_name]
        variants = trace_call(target, fn, *args, **kwargs)
        assert variants, "the call launched no kernel"
        out = []
        for variant in variants:
            compiled = compile_variant(variant, target, compile_cache_dir)
            binary = "cubin" if target.is_nvidia else "hsaco"
            assert compiled.asm.get(binary), f"no {binary} for {variant.kernel}"
            assert compiled.hash == variant.cache_hash
            out.append((variant, compiled))
        return out

    return run
