"""``jit/`` in layers: each imports only what lies below it (core, cache, serving, adopt, pipeline, from
the ground up); what a layer above must change in one below, it plugs into that one's hooks, in every
process that can trace."""

import ast
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from tritonwarm.examples.inhouse_autotuned import scale_rows_kernel, scale_rows_launch
from tritonwarm.jit import TARGETS, JitKernel, fake_tensor, trace_call
from tritonwarm.jit.core import hooks
from tritonwarm.jit.serving.monitor import DispatchMonitor
from tritonwarm.launchers import rms_norm

JIT = Path(__file__).resolve().parents[1] / "jit"
LAYERS = ["core", "cache", "serving", "adopt", "pipeline"]  # from the ground up


def _module(path: Path) -> str:
    parts = ["tritonwarm", *path.relative_to(JIT.parent).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _file(module: str) -> Path | None:
    """The file of a module of ``jit/`` (a package's ``__init__.py``), or None."""
    if not module.startswith("tritonwarm.jit"):
        return None
    path = JIT.parent.joinpath(*module.split(".")[1:])
    return path / "__init__.py" if path.is_dir() else path.with_suffix(".py") if path.with_suffix(".py").exists() \
        else None


def _imports(path: Path):
    """``(line, file)`` of every file of ``jit/`` that ``path`` imports, inside functions too."""
    package = _module(path).split(".") if path.name == "__init__.py" else _module(path).split(".")[:-1]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = ".".join(package[: len(package) - node.level + 1] + ([node.module] if node.module else [])) \
                if node.level else node.module
            names = [f"{base}.{alias.name}" if _file(f"{base}.{alias.name}") else base for alias in node.names]
        else:
            continue
        yield from ((node.lineno, found) for found in {_file(name) for name in names} if found and found != path)


def _layer(path: Path) -> str | None:
    parts = path.relative_to(JIT).parts
    return parts[0] if len(parts) > 1 and parts[0] in LAYERS else None


def test_no_module_of_jit_imports_a_layer_above_its_own():
    upward = []
    for path in sorted(JIT.rglob("*.py")):
        if _layer(path) is None:  # jit/__init__.py: the package's face, which installs the hooks
            continue
        for line, imported in _imports(path):
            if _layer(imported) and LAYERS.index(_layer(imported)) > LAYERS.index(_layer(path)):
                upward.append(f"{path.relative_to(JIT.parent)}:{line} imports {imported.relative_to(JIT.parent)}")
    assert upward == []


def test_no_files_of_jit_import_each_other_in_a_circle():
    graph = {path: {imported for _, imported in _imports(path)} for path in JIT.rglob("*.py")}
    circles, done = [], set()

    def visit(path, trail):
        if path in trail:
            circles.append(" -> ".join(str(p.relative_to(JIT.parent)) for p in trail[trail.index(path):] + [path]))
            return
        if path in done:
            return
        for imported in graph.get(path, ()):
            visit(imported, trail + [path])
        done.add(path)

    for path in graph:
        visit(path, [])
    assert circles == []


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
