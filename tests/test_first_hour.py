"""What a new user meets in the first hour, each trap a test: the default folder is the one Triton
reads, a cache that will miss elsewhere never passes `check`, a failed or interrupted warm-up says
so, and every command's output is readable."""

import os
import subprocess
import sys

import pytest

# A plain Triton program (no tritonwarm import) launching the user's kernel for sm90 on a machine
# with no GPU: a driver that only names the target, and Triton's own JITFunction.run with a real CPU
# tensor. It prints how many kernels Triton compiled (built the IR for: its disk cache missed).
PLAIN_TRITON = """
import torch
from triton.backends.compiler import GPUTarget
from triton.compiler import compiler
from triton.runtime.driver import driver

from edited_kernels import add_const


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
x = torch.zeros(1024)
add_const.run(x, x.numel(), grid=(4,), warmup=True, BLOCK=256)
print("compiles", compiles)
"""


def plain_env(env: dict, home) -> dict:
    """A new user's shell: HOME of their own, no cache variable of Triton's or tritonwarm's."""
    drop = {"TRITON_CACHE_DIR", "TRITONWARM_CACHE_DIR", "TRITON_HOME", "XDG_CACHE_HOME"}
    return {**{k: v for k, v in env.items() if k not in drop}, "HOME": str(home)}


def plain_triton_compiles(code, env) -> int:
    proc = subprocess.run([sys.executable, "-c", PLAIN_TRITON], capture_output=True, text=True, timeout=300,
                          env={**env, "PYTHONPATH": str(code)}, cwd=code)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return int(proc.stdout.split("compiles")[-1])


@pytest.mark.slow
def test_default_warmup_fills_the_folder_a_plain_triton_process_reads(custom_kernel, tmp_path, run_cli):
    code, spec, env = custom_kernel
    user = plain_env(env, tmp_path / "home")
    (tmp_path / "home").mkdir()
    assert plain_triton_compiles(code, user) == 1  # control: a cold cache compiles (and the count works)
    for entry in (tmp_path / "home" / ".triton" / "cache").iterdir():  # cold again
        if entry.name != "tritonwarm":
            subprocess.run(["rm", "-rf", str(entry)], check=True)
    out = run_cli("warmup", spec, "--target", "sm90", "-j", "1", rc=0, env=user).stdout
    assert f"cache: {tmp_path / 'home' / '.triton' / 'cache'}" in out
    assert plain_triton_compiles(code, user) == 0
    checked = run_cli("check", spec, "--target", "sm90", rc=0, env=user).stdout
    assert "sm90: ok: 1 planned, 0 missing" in checked
    assert "add_const" in run_cli("list", rc=0, env=user).stdout


def test_a_cache_in_the_old_default_folder_gets_one_line(tmp_path, run_cli):
    home = tmp_path / "home"
    old = home / ".cache" / "tritonwarm" / "triton"
    (old / "tritonwarm").mkdir(parents=True)
    (old / "tritonwarm" / "manifest-sm90.json").write_text('{"format": 1, "variants": {}}')
    user = plain_env(os.environ, home)
    err = run_cli("list", rc=0, env=user).stderr
    notes = [line for line in err.splitlines() if "earlier tritonwarm" in line]
    new = home / ".triton" / "cache"
    assert notes == [f"tritonwarm: note: an earlier tritonwarm warmed {old}; Triton reads {new}: "
                     f"warm again, or use that cache with --cache-dir {old} (serve it with TRITON_CACHE_DIR={old})"]
    assert "earlier tritonwarm" not in run_cli("list", "--cache-dir", old, rc=0, env=user).stderr
