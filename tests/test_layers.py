"""The adoption machinery plugs into the core's hooks from above, in every process that can trace."""

import subprocess
import sys
import textwrap

import pytest
import torch
from tritonwarm.examples.inhouse_autotuned import scale_rows_kernel, scale_rows_launch
from tritonwarm.jit import TARGETS, JitKernel, fake_tensor, trace_call
from tritonwarm.jit.core import hooks
from tritonwarm.jit.serving.monitor import DispatchMonitor
from tritonwarm.launchers import rms_norm


def test_a_process_that_imports_only_the_core_has_the_adoption_hooks(tmp_path):
    """Importing one core module runs ``tritonwarm.jit`` first, which installs ``jit.adopt``: an
    autotuned kernel of another package reached by a trace is traced in each config that survives."""
    script = tmp_path / "prog.py"
    script.write_text(textwrap.dedent("""
        import torch
        import triton
        import triton.language as tl
        from tritonwarm.jit.core.specialization import fake_tensor
        from tritonwarm.jit.core.targets import TARGETS
        from tritonwarm.jit.core.trace import trace_call

        @triton.autotune(configs=[triton.Config({"BLOCK": 64}), triton.Config({"BLOCK": 128}, num_warps=8)],
                         key=["n"])
        @triton.jit
        def double(x_ptr, n, BLOCK: tl.constexpr):
            offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
            tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) * 2, mask=offs < n)

        def launcher(x):
            double[lambda meta: (triton.cdiv(x.numel(), meta["BLOCK"]),)](x, x.numel())

        found = trace_call(TARGETS["sm90"], launcher, fake_tensor((4096,), torch.float32), all_kernels=True)
        print(sorted((v.args["BLOCK"], v.num_warps) for v in found))
    """))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[('=128', 8), ('=64', 4)]"


@pytest.fixture
def without_adoption(monkeypatch):
    monkeypatch.setattr(hooks, "_installed", None)


def test_the_core_refuses_to_trace_without_the_adoption_hooks(without_adoption, tmp_path):
    """Without ``jit.adopt``'s answers a trace would miss every kernel of another package: each core
    step that needs them says so instead, for JitKernels too."""
    x, w = fake_tensor((4, 2048), torch.bfloat16), fake_tensor((2048,), torch.bfloat16)
    with pytest.raises(hooks.AdoptionMissing, match="would miss every kernel of another package"):
        trace_call(TARGETS["sm90"], rms_norm, x, w)
    with pytest.raises(hooks.AdoptionMissing):
        trace_call(TARGETS["sm90"], rms_norm, x, w, all_kernels=True)
    with pytest.raises(hooks.AdoptionMissing):
        JitKernel(scale_rows_kernel, scale_rows_launch, name="scale_rows_without_hooks")
    with pytest.raises(hooks.AdoptionMissing), DispatchMonitor(tmp_path).serving():
        pass


def test_a_memoized_key_follows_the_serving_ptxas_that_cache_serving_sets(monkeypatch):
    """The core memoizes disk-cache hashes; the serving environment (``cache/serving.py``, above it) swaps
    the ptxas ``--version`` text CUDA keys hash: inside that block the memo gives what Triton computes
    afresh, and after it this machine's keys again."""
    from tritonwarm.jit.cache.serving import _ptxas_version_of
    from tritonwarm.jit.core import trace

    def hashes():
        x, w = fake_tensor((4, 2048), torch.bfloat16), fake_tensor((2048,), torch.bfloat16)
        return {v.cache_hash for v in trace_call(TARGETS["sm90"], rms_norm, x, w)}

    here = hashes()
    with _ptxas_version_of({90: "ptxas: NVIDIA (R) Ptx optimizing assembler\nBuilt on another machine\nV0.0.1"}):
        served = hashes()
        monkeypatch.setattr(trace, "_HASHES", {})  # nothing memoized: Triton's own hash, computed again
        assert hashes() == served
    assert here and served.isdisjoint(here)
    assert hashes() == here
