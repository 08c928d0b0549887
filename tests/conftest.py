"""Shared fixtures. Every test process gets its own Triton and tritonwarm cache directories, so
tests never touch the user's caches; CPU tensors run in Triton's interpreter automatically."""

import argparse
import contextlib
import faulthandler
import os
import signal
import subprocess
import sys
import tempfile
import warnings

import pytest

_SESSION_DIR = tempfile.mkdtemp(prefix="tritonwarm-tests-")
os.environ["TRITON_CACHE_DIR"] = os.path.join(_SESSION_DIR, "triton-cache")
os.environ["TRITONWARM_CACHE_DIR"] = os.path.join(_SESSION_DIR, "tritonwarm-cache")
os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")  # silence Triton 3.9's default-change warning
os.environ.pop("COLUMNS", None)  # output as a log gets it (200 columns), whatever terminal runs the tests
os.environ.setdefault("TRITONWARM_PROGRESS_SECONDS", "0")  # no progress line in output a test reads, however
# loaded the machine is (the tests of progress lines set their own interval)
warnings.filterwarnings("ignore", module="triton")

# Test files whose outcome can depend on the Triton release: its specializer, binder and keys, its
# compiler (every shipped variant compiled), cache and autotuner formats, its C launchers and driver,
# its interpreter (the fixes tritonwarm applies, and the kernels that need them: a loaded value as a
# range() bound). Their tests carry the `triton_version` marker, which CI runs again under the oldest
# supported Triton; the other kernels' interpreter tests and the pure-Python ones run once.
TRITON_VERSION_FILES = {
    "test_autotune.py", "test_bundle.py", "test_c_launchers.py", "test_cache_manager.py", "test_capture_all.py",
    "test_dispatch.py", "test_engine_warm.py", "test_env.py", "test_for_wheel.py", "test_fp4_e2m1_rounding.py",
    "test_import_once.py", "test_interpreter.py", "test_layers.py", "test_miss_reasons.py", "test_mla_metadata.py",
    "test_monitor.py", "test_paged_attention.py", "test_plain_check.py", "test_readonly_cache.py", "test_record.py",
    "test_resources.py", "test_torch_compile_server.py",
    "test_remote_cache.py", "test_runtime_keys.py", "test_sass_count.py", "test_shipped_specs.py",
    "test_specialization.py", "test_targets.py", "test_warmup.py",
}


# The GPU lane (``pytest -m gpu``, docs/testing.md): its files, and each test's time limit unless its
# marker says otherwise (``@pytest.mark.gpu(timeout_s=...)``), so that one hang cannot take a short
# loan of a GPU: past it the test fails; a hang in native code that Python cannot interrupt ends the
# run 30 s later, with every thread's traceback.
GPU_LANE_FILES = ("test_gpu_kernels.py", "test_gpu_engine.py")
GPU_TEST_TIMEOUT_S = 120


def pytest_ignore_collect(collection_path, config):
    """``-m gpu`` collects the lane's files only: a GPU image needs none of the other test modules'
    dependencies (hypothesis, redis), and collection takes no time."""
    if (config.getoption("markexpr") == "gpu" and collection_path.suffix == ".py"
            and collection_path.name.startswith("test_") and collection_path.name not in GPU_LANE_FILES):
        return True
    return None


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.path.name in TRITON_VERSION_FILES:
            item.add_marker(pytest.mark.triton_version)
    # The lane's warm-up starts as soon as the lane is collected on a GPU, so that its compiles (on the
    # host's cores) overlap the kernel tests (on the GPU) instead of following them.
    lane = [item for item in items if item.get_closest_marker("gpu") is not None]
    if lane and not config.getoption("collectonly") and _has_cuda():
        for module in {id(item.module): item.module for item in lane}.values():
            start = getattr(module, "start_lane_warmup", None)
            if start is not None:
                start()


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    """The GPU lane (``@pytest.mark.gpu``) without a GPU: skipped before any fixture runs, from this one
    place, so ``-rs`` prints one line for the whole lane."""
    if item.get_closest_marker("gpu") is not None and not _has_cuda():
        pytest.skip("no CUDA GPU: the GPU lane (pytest -m gpu) runs on one")


def _has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def gpu_test_timeout(item) -> int | None:
    marker = item.get_closest_marker("gpu")
    return None if marker is None else int(marker.kwargs.get("timeout_s", GPU_TEST_TIMEOUT_S))


class GpuTestTimeout(Exception):
    pass


@contextlib.contextmanager
def time_limit(seconds: int | None):
    """Fail the block after ``seconds`` (SIGALRM); ``None``: no limit. A hang in native code never
    returns to Python: faulthandler then ends the process 30 s later and prints where each thread was."""
    if seconds is None or not hasattr(signal, "SIGALRM"):
        yield
        return

    def expire(signum, frame):
        raise GpuTestTimeout(f"over its time limit of {seconds} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    faulthandler.dump_traceback_later(seconds + 30, exit=True, file=_STDERR_FD or sys.__stderr__)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        faulthandler.cancel_dump_traceback_later()
        signal.signal(signal.SIGALRM, previous)


class GpuTestTimeLimits:
    """The time limit around a GPU test's setup (its fixtures: the lane's warm-up, its tensors) and,
    afresh, around its body."""

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_setup(self, item):
        with time_limit(gpu_test_timeout(item)):
            yield

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_call(self, item):
        with time_limit(gpu_test_timeout(item)):
            yield


_STDERR_FD: int | None = None  # the terminal's stderr, which pytest does not capture


def pytest_configure(config):
    global _STDERR_FD
    _STDERR_FD = os.dup(sys.stderr.fileno())  # pytest's capture is suspended while plugins configure
    config.pluginmanager.register(GpuTestTimeLimits(), "gpu-test-time-limits")


@pytest.fixture
def read_only_mount():
    """``with read_only_mount(source, mount):`` shows ``source`` at ``mount`` on a read-only bind mount
    (a volume mounted read-only, as a fleet shares a cache); skips where mounts are not permitted."""

    @contextlib.contextmanager
    def mount_read_only(source, mount):
        mount.mkdir(exist_ok=True)
        if subprocess.run(["mount", "--bind", str(source), str(mount)], capture_output=True).returncode != 0:
            pytest.skip("bind mounts are not permitted here")
        try:
            if subprocess.run(["mount", "-o", "remount,bind,ro", str(mount)], capture_output=True).returncode != 0:
                pytest.skip("read-only remounts are not permitted here")
            with pytest.raises(OSError):
                (mount / "probe").write_text("x")  # really read-only
            yield mount
        finally:
            subprocess.run(["umount", str(mount)], capture_output=True)

    return mount_read_only


@pytest.fixture(scope="session")
def compile_cache_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("compiled")


@pytest.fixture
def compile_call(compile_cache_dir):
    """``compile_call("sm90", launcher, *fake_args)``: trace the call with Triton's own keys, compile
    every variant it launches for that target, and return ``[(variant, CompiledKernel), ...]``."""
    from tritonwarm.jit import TARGETS, trace_call
    from tritonwarm.jit.pipeline.compile import compile_variant

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


@pytest.fixture
def compile_counter(monkeypatch):
    """Counts real compilations: Triton builds the IR only when its disk cache misses."""
    from triton.compiler import compiler as triton_compiler

    class Counter:
        count = 0

    original = triton_compiler.ASTSource.make_ir

    def counting_make_ir(src, *args, **kwargs):
        Counter.count += 1
        return original(src, *args, **kwargs)

    monkeypatch.setattr(triton_compiler.ASTSource, "make_ir", counting_make_ir)
    return Counter


@pytest.fixture
def rms_norm_runtime():
    """What a serving process does for one RMSNorm call: Triton's own ``JITFunction.run`` for the
    target (under the target-only driver), with fresh in-memory caches, reading ``cache_dir``."""
    import torch
    from triton import knobs
    from tritonwarm.jit import fake_tensor
    from tritonwarm.jit.cache.triton_dir import triton_cache_dir
    from tritonwarm.jit.core.targets import target_driver
    from tritonwarm.launchers.rms_norm import rms_norm_jit, rms_norm_launch

    def run(target, cache_dir, rows, fused, dtype=torch.bfloat16):
        x = fake_tensor((rows, 4096), dtype)
        launch = rms_norm_launch(x, fake_tensor((4096,), dtype), fake_tensor((rows, 4096), dtype),
                                 1e-6, fake_tensor((rows, 4096), dtype) if fused else None)
        assert knobs.runtime.jit_cache_hook is None
        with target_driver(target) as fake, triton_cache_dir(cache_dir):
            try:
                return rms_norm_jit.fake_run(launch)
            finally:
                rms_norm_jit.jit_function.device_caches.pop(fake.device, None)

    return run


@pytest.fixture
def served_from_bundle():
    """``served_from_bundle(check_report)``: check's verdict on what a bundle carries, every kernel entry.
    Bundles do not carry Triton's C launchers: where Triton builds them (3.6, 3.7), check lists them apart,
    and serving would build them at first launch."""
    import dataclasses

    from tritonwarm.jit.serving import c_launchers

    def served(report) -> bool:
        listed = bool(report.missing_c_launchers) == c_launchers.warms_c_modules("cuda")
        return listed and dataclasses.replace(report, missing_c_launchers=[], c_launcher_fix=None).ok

    return served


@pytest.fixture
def run_cli():
    """``run_cli(*args, rc=None)``: ``python -m tritonwarm ARGS`` in a fresh process, as a user runs it;
    with ``rc``, the exit code is checked (the output is shown when it differs)."""

    def run(*args, rc=None, env=None):
        proc = subprocess.run([sys.executable, "-m", "tritonwarm", *map(str, args)], capture_output=True, text=True,
                              timeout=600, env=env)
        if rc is not None:
            assert proc.returncode == rc, proc.stdout + proc.stderr
        return proc

    return run


@pytest.fixture
def engine_cli():
    """``engine_cli(argv)``: the ``engine`` command group in this process; exceptions propagate."""
    from tritonwarm.engine.cli import add_engine_parser

    def run(argv):
        parser = argparse.ArgumentParser(prog="tritonwarm")
        add_engine_parser(parser.add_subparsers())
        args = parser.parse_args(argv)
        return args.func(args)

    return run


# Small rms_norm specs many tests warm: each runtime scalar class with and without the fused residual
# (what ``rms_norm_runtime`` launches), and one row per dtype.
RMS_SPEC = """
kernel: tritonwarm.launchers.rms_norm:rms_norm
axes:
  num_tokens: {range: [1, 4096], collapse: true}
  fused: [false, true]
args:
  x: {tensor: [$num_tokens, 4096], dtype: bfloat16}
  weight: {tensor: [4096], dtype: bfloat16}
  eps: 1.0e-6
  residual: {tensor: [$num_tokens, 4096], dtype: bfloat16, when: $fused}
"""
RMS_DTYPES_SPEC = """
kernel: tritonwarm.launchers.rms_norm:rms_norm
axes:
  dtype: [float16, bfloat16]
args:
  x: {tensor: [8, 4096], dtype: $dtype}
  weight: {tensor: [4096], dtype: $dtype}
"""


@pytest.fixture
def spec_file(tmp_path):
    """``rms.yaml``: rms_norm over every class of the token count, with and without the residual."""
    path = tmp_path / "rms.yaml"
    path.write_text(RMS_SPEC)
    return path


@pytest.fixture
def dtypes_spec_file(tmp_path):
    """``rms.yaml``: rms_norm of 8 x 4096 in float16 and bfloat16 (two variants)."""
    path = tmp_path / "rms.yaml"
    path.write_text(RMS_DTYPES_SPEC)
    return path


# A kernel in one module and its launcher in another, outside the package: what a user edits.
KERNEL_MODULE = """
import triton
import triton.language as tl


@triton.jit
def add_const(x_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n)
    tl.store(x_ptr + offs, x + 1.0, mask=offs < n)
"""

LAUNCHER_MODULE = """
import triton
from tritonwarm.jit import JitKernel, Launch

from edited_kernels import add_const


def _launch(x):
    return Launch(grid=(triton.cdiv(x.numel(), 256),), args=(x, x.numel()), constexprs=dict(BLOCK=256))


add_const_jit = JitKernel(add_const, _launch)


def add_const_launcher(x):
    return add_const_jit(x)
"""

CUSTOM_SPEC = """
kernel: edited_launchers:add_const_launcher
args:
  x: {tensor: [1024], dtype: float32}
"""


@pytest.fixture
def custom_kernel(tmp_path):
    """A kernel in one module, its launcher in another, and a spec naming the launcher."""
    code = tmp_path / "code"
    code.mkdir()
    (code / "edited_kernels.py").write_text(KERNEL_MODULE)
    (code / "edited_launchers.py").write_text(LAUNCHER_MODULE)
    spec = tmp_path / "custom.yaml"
    spec.write_text(CUSTOM_SPEC)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(code), os.environ.get("PYTHONPATH")]))}
    return code, spec, env
