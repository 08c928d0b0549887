"""A server that runs torch.compile (vLLM, SGLang) and launches warmed kernels.

Inductor (``CachingAutotuner.__init__`` in ``torch/_inductor/runtime/triton_heuristics.py``) sets
``TRITON_CACHE_DIR`` to its own folder when the variable is unset, as the first Triton kernel of a
compiled graph loads; Triton reads the variable at every lookup, so every launch after that looks
there. SGLang's compile step sets it always. Each server below is a plain process (no tritonwarm
import) that takes one of those steps, then launches the warmed kernel through Triton's own runtime
for sm90 on a machine without a GPU, and prints how many kernels Triton compiled (built the IR for)."""

import json
import os
import subprocess
import sys

import pytest
import torch

SERVER = """
import json
import os
import sys

import torch
from triton.backends.compiler import GPUTarget
from triton.compiler import compiler
from triton.runtime.driver import driver


class CompileOnlyDriver:
    def get_current_target(self):
        return GPUTarget("cuda", 90, 32)

    def get_current_device(self):
        return 0

    def get_current_stream(self, device=None):
        return 0

    def is_active(self):
        return True

    def get_active_torch_device(self):
        return torch.device("cpu")


compiles = 0
make_ir = compiler.ASTSource.make_ir


def counting_make_ir(*args, **kwargs):
    global compiles
    compiles += 1
    return make_ir(*args, **kwargs)


compiler.ASTSource.make_ir = counting_make_ir
driver.set_active(CompileOnlyDriver())
step = sys.argv[1]
if step == "inductor":  # torch.compile of a model: Inductor generates, loads and compiles a Triton kernel
    import torch._inductor.config

    torch._inductor.config.cpu_backend = "triton"  # Inductor's Triton path, which a CPU takes only so
    try:
        torch.compile(lambda x: (x * 2).sin())(torch.randn(64))
    except Exception as e:  # no Triton backend compiles for a CPU: it fails after Inductor chose the folder
        print("inductor:", type(e).__name__, file=sys.stderr)
elif step == "always":  # SGLang's compile step (InductorAdaptor.initialize_cache): whatever the variable says
    os.environ["TRITON_CACHE_DIR"] = os.path.join(sys.argv[2], "triton_cache")
before = compiles

from edited_kernels import add_const

x = torch.zeros(1024)
add_const.run(x, x.numel(), grid=(4,), warmup=True, BLOCK=256)
print(json.dumps({"TRITON_CACHE_DIR": os.environ.get("TRITON_CACHE_DIR"), "compiles": compiles - before}))
"""

WARMED_MANAGER = "tritonwarm.jit.cache.warmed:WarmedCacheManager"


def serve(code, env, step, engine_folder=None) -> dict:
    """A server process that takes ``step`` (``inductor`` or ``always``), then launches the warmed kernel."""
    argv = [sys.executable, "-c", SERVER, step] + ([str(engine_folder)] if engine_folder else [])
    done = subprocess.run(argv, capture_output=True, text=True, timeout=600, env={**env, "PYTHONPATH": str(code)},
                          cwd=code)
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def user_env(env, tmp_path) -> dict:
    """A new user's shell: their own HOME, Inductor's cache in the test's folder, no cache variable set."""
    drop = {"TRITON_CACHE_DIR", "TRITONWARM_CACHE_DIR", "TRITON_HOME", "XDG_CACHE_HOME", "TRITON_CACHE_MANAGER"}
    (tmp_path / "home").mkdir(exist_ok=True)
    return {**{k: v for k, v in env.items() if k not in drop}, "HOME": str(tmp_path / "home"),
            "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")}


@pytest.mark.slow
def test_a_torch_compile_server_hits_the_warmed_cache_once_its_folder_is_set(custom_kernel, tmp_path, run_cli):
    code, spec, env = custom_kernel
    user = user_env(env, tmp_path)
    default = tmp_path / "home" / ".triton" / "cache"
    out = run_cli("warmup", spec, "--target", "sm90", "-j", "1", rc=0, env=user).stdout
    assert f"cache: {default}" in out

    # TRITON_CACHE_DIR unset: Inductor points it at its own folder, and the warmed kernel compiles again
    unset = serve(code, user, "inductor")
    assert unset["TRITON_CACHE_DIR"].startswith(str(tmp_path / "inductor"))  # torch's own behaviour
    assert unset["compiles"] == 1

    # set where serving runs, as `check` and `bundle install` print it: Inductor leaves it, and it hits
    checked = " ".join(run_cli("check", spec, "--target", "sm90", rc=0, env=user).stdout.split())  # (wrapped)
    assert f"Dockerfile: ENV TRITON_CACHE_DIR={default}" in checked
    assert f'systemd unit: Environment="TRITON_CACHE_DIR={default}"' in checked, checked
    served = {**user, "TRITON_CACHE_DIR": str(default)}
    assert serve(code, served, "inductor") == {"TRITON_CACHE_DIR": str(default), "compiles": 0}
    assert "Dockerfile:" not in run_cli("check", spec, "--target", "sm90", rc=0, env=served).stdout

    # SGLang's step sets it always: the variable cannot reach Triton, the cache manager can
    engine = tmp_path / "sglang-compile-cache"
    assert serve(code, served, "always", engine)["compiles"] == 1
    assert f"TRITON_CACHE_MANAGER={WARMED_MANAGER} TRITONWARM_CACHE_DIR={default}" in checked
    pinned = {**user, "TRITON_CACHE_MANAGER": WARMED_MANAGER, "TRITONWARM_CACHE_DIR": str(default)}
    engine = tmp_path / "sglang-compile-cache-2"
    assert serve(code, pinned, "always", engine) == {"TRITON_CACHE_DIR": str(engine / "triton_cache"),
                                                     "compiles": 0}
    assert not (engine / "triton_cache").exists() or not any((engine / "triton_cache").iterdir())  # nothing written
    # ... and under Inductor's set-if-unset step, with no TRITON_CACHE_DIR at all
    moved = serve(code, pinned, "inductor")
    assert moved["TRITON_CACHE_DIR"].startswith(str(tmp_path / "inductor")) and moved["compiles"] == 0
    assert "Dockerfile:" not in run_cli("check", spec, "--target", "sm90", rc=0, env=pinned).stdout


def test_the_warmed_manager_reads_the_warmed_folder_first_and_writes_where_triton_says(tmp_path, monkeypatch):
    from triton.runtime.cache import get_cache_manager
    from tritonwarm.jit.cache import entry_dir_name

    warmed, engine = tmp_path / "warmed", tmp_path / "engine"
    key, other_key = "ab" * 32, "cd" * 32  # Triton's cache hashes: each entry's folder is named after it
    entry = warmed / entry_dir_name(key)
    entry.mkdir(parents=True)
    (entry / "k.cubin").write_bytes(b"cubin")
    (entry / "k.json").write_text("{}")
    (entry / "__grp__k.json").write_text(json.dumps({"child_paths": {
        "k.cubin": str(entry / "k.cubin"), "k.json": str(entry / "k.json")}}))
    monkeypatch.setenv("TRITON_CACHE_DIR", str(engine))
    monkeypatch.setenv("TRITON_CACHE_MANAGER", WARMED_MANAGER)
    monkeypatch.setenv("TRITONWARM_CACHE_DIR", str(warmed))
    manager = get_cache_manager(key)  # Triton's own resolution of TRITON_CACHE_MANAGER
    assert manager.get_group("k.json") == {"k.cubin": str(entry / "k.cubin"), "k.json": str(entry / "k.json")}
    assert manager.get_file("k.cubin") == str(entry / "k.cubin")
    other = get_cache_manager(other_key)  # what the warmed folder lacks: looked up and written where Triton says
    assert other.get_group("k.json") is None and not engine.exists()
    written = other.put(b"new", "k.cubin")
    assert written == str(engine / entry_dir_name(other_key) / "k.cubin") and other.get_file("k.cubin") == written
    assert os.listdir(warmed) == [entry.name]  # the warmed folder is never written: it may be read-only

    from tritonwarm.cli.env import cache_lines
    from tritonwarm.jit.cache.triton_dir import triton_reads_instead

    assert triton_reads_instead(warmed) is None  # check's view: Triton reads the warmed folder first
    assert cache_lines() == [f"cache        Triton reads {warmed} (TRITONWARM_CACHE_DIR, WarmedCacheManager) first, "
                             f"then {engine} (TRITON_CACHE_DIR), and writes what it compiles there"]  # env's view
    assert triton_reads_instead(engine) == warmed.resolve()
    monkeypatch.delenv("TRITONWARM_CACHE_DIR")  # without it: Triton's own manager, unchanged
    assert get_cache_manager(key).get_group("k.json") is None


GPU_SERVER = """
import json
import os

import torch
from triton.compiler import compiler

compiles = 0
make_ir = compiler.ASTSource.make_ir


def counting_make_ir(*args, **kwargs):
    global compiles
    compiles += 1
    return make_ir(*args, **kwargs)


compiler.ASTSource.make_ir = counting_make_ir
torch.compile(lambda x: (x * 2).sin())(torch.randn(64, device="cuda"))  # Inductor compiles its own kernel
before = compiles
from tritonwarm.launchers import rms_norm

for dtype in (torch.float16, torch.bfloat16):
    rms_norm(torch.randn(8, 4096, dtype=dtype, device="cuda"), torch.rand(4096, dtype=dtype, device="cuda"))
torch.cuda.synchronize()
print(json.dumps({"TRITON_CACHE_DIR": os.environ.get("TRITON_CACHE_DIR"), "compiles": compiles - before}))
"""


@pytest.mark.slow
@pytest.mark.skipif(not torch.cuda.is_available(), reason="a GPU server: torch.compile on CUDA")
def test_on_a_gpu_inductor_moves_an_unset_folder_and_leaves_a_set_one(tmp_path, dtypes_spec_file, run_cli):
    """On a GPU, with Inductor's real compile: the warmed kernels launched after it miss where
    TRITON_CACHE_DIR was unset, and hit where it was set."""
    user = user_env(os.environ, tmp_path)
    default = tmp_path / "home" / ".triton" / "cache"
    run_cli("warmup", dtypes_spec_file, "--target", "local", rc=0, env=user)

    def server(env):
        done = subprocess.run([sys.executable, "-c", GPU_SERVER], capture_output=True, text=True, timeout=600, env=env)
        assert done.returncode == 0, done.stdout + done.stderr
        return json.loads(done.stdout.strip().splitlines()[-1])

    unset = server(user)
    assert unset["TRITON_CACHE_DIR"].startswith(str(tmp_path / "inductor")) and unset["compiles"] == 2, unset
    assert server({**user, "TRITON_CACHE_DIR": str(default)}) == {"TRITON_CACHE_DIR": str(default), "compiles": 0}
