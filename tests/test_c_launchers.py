"""Triton's C launchers: warm-up builds them where Triton builds one per signature (3.6), named as the
runtime looks them up; `check` lists the missing ones; serving counts every C build as a compile."""

import os
import shutil
import subprocess
import sys
import sysconfig
import textwrap
import types
from unittest import mock

import pytest
import torch
from triton import knobs
from tritonwarm.engine.metrics import EngineMetrics
from tritonwarm.jit import TARGETS, fake_tensor
from tritonwarm.jit.cache.triton_dir import triton_cache_dir
from tritonwarm.jit.core.kernel import FakeLaunchSink, fake_launches
from tritonwarm.jit.core.specialization import cpu_twin
from tritonwarm.jit.core.trace import trace_call
from tritonwarm.jit.pipeline.check import check
from tritonwarm.jit.pipeline.plan import Plan
from tritonwarm.jit.pipeline.warmup import warm
from tritonwarm.jit.serving import c_launchers
from tritonwarm.jit.serving.monitor import DispatchMonitor, JitPolicyError
from tritonwarm.launchers import rms_norm

SM90 = TARGETS["sm90"]
EXT_SUFFIX = sysconfig.get_config_var("EXT_SUFFIX")
PER_SIGNATURE = c_launchers.builds_per_signature("cuda")
BUILDS = c_launchers.builds_c_modules("cuda")
# what the runtime builds for the two signatures below: a launcher each (3.6), and cuda_utils (3.6, 3.7)
EXPECTED = ["__triton_launcher"] * 2 * PER_SIGNATURE + ["cuda_utils"] * BUILDS
needs_builds = pytest.mark.skipif(not BUILDS, reason="this Triton builds no C module warm-up could provide")


def calls():
    """Two signatures (plain and fused RMSNorm), each launched as a server would: (launcher, fake args)."""
    x, w = fake_tensor((3, 2048), torch.bfloat16), fake_tensor((2048,), torch.bfloat16)
    return [(rms_norm, (x, w, 1e-6)), (rms_norm, (x, w, 1e-6, fake_tensor((3, 2048), torch.bfloat16)))]


@pytest.fixture(scope="module")
def warmed(tmp_path_factory):
    cache = tmp_path_factory.mktemp("c-launchers")
    the_plan = Plan(SM90)
    for fn, args in calls():
        the_plan.variants.update({v.cache_hash: v for v in trace_call(SM90, fn, *args)})
    result = warm(the_plan, cache)
    assert result.failed == 0 and result.compiled == len(the_plan.variants) == 2
    return cache, the_plan, result


class _RuntimeSink(FakeLaunchSink):
    """Triton's own ``JITFunction.run`` for each launch (no hook): the ``CompiledKernel`` it returns."""

    def __init__(self):
        self.kernels = []

    def launch(self, kernel, launch, target):
        self.kernels.append(kernel.fake_run(launch))


def runtime_lookups(cache, monkeypatch, tmp_path):
    """Run the runtime's own path on real CPU tensors: JITFunction.run → CompiledKernel → the driver's
    CudaLauncher and CudaUtils, which compute each C module's cache key and look it up. Building is
    patched to fail (a miss is loud) and loading to record the path found (nothing is loaded)."""
    from triton.backends.nvidia import driver as cuda_driver
    from triton.runtime import build

    sink = _RuntimeSink()
    with fake_launches(sink, SM90), triton_cache_dir(cache):
        for fn, args in calls():
            fn(*cpu_twin(args))
    found = []

    def refuse(name, *args, **kwargs):
        raise AssertionError(f"Triton would build {name}: the warmed cache lacks it")

    def record(name, path):
        found.append((name, path))
        return mock.MagicMock()

    monkeypatch.setattr(build, "_build", refuse)
    monkeypatch.setattr(build, "_load_module_from_path", record)
    monkeypatch.setenv("TRITON_LIBCUDA_PATH", str(tmp_path))  # library_dirs() must not look for a GPU here
    monkeypatch.setattr(cuda_driver, "PyCUtensorMap", cuda_driver.PyCUtensorMap)  # CudaUtils sets it
    for cached in (cuda_driver.libcuda_dirs, cuda_driver.library_dirs):
        cached.cache_clear()
    try:
        with triton_cache_dir(cache):
            for kernel in sink.kernels if PER_SIGNATURE else ():
                cuda_driver.CudaLauncher(kernel.src, kernel.metadata)
            cuda_driver.CudaUtils.__init__(object.__new__(cuda_driver.CudaUtils))
    finally:
        for cached in (cuda_driver.libcuda_dirs, cuda_driver.library_dirs):
            cached.cache_clear()
    return sink.kernels, found


@pytest.mark.slow
@needs_builds
def test_warmup_builds_the_launcher_of_every_warmed_signature(warmed, compile_counter, monkeypatch, tmp_path):
    cache, _, result = warmed
    assert result.c_launchers["built"] == len(EXPECTED) and not result.c_launchers["failed"]
    kernels, found = runtime_lookups(cache, monkeypatch, tmp_path)
    assert compile_counter.count == 0 and len(kernels) == 2
    assert sorted(name for name, _ in found) == EXPECTED
    for name, path in found:
        assert os.path.dirname(os.path.dirname(path)) == str(cache)
        assert os.path.basename(path) == name + EXT_SUFFIX and os.path.getsize(path) > 0
    assert len({path for _, path in found}) == len(EXPECTED)


@pytest.mark.slow
@needs_builds
def test_warmup_again_finds_them_cached(warmed):
    cache, the_plan, _ = warmed
    again = warm(the_plan, cache)
    assert again.c_launchers["built"] == 0 and again.c_launchers["cached"] == len(EXPECTED)


@needs_builds
@pytest.mark.slow
def test_built_launchers_load_as_extensions_of_this_python(warmed, tmp_path):
    """Linked against the stub, each module still depends on libcuda.so.1 (as when linked against the real
    one), and this Python loads it once some libcuda.so.1 is present."""
    cache, _, _ = warmed
    stub = c_launchers.write_stub_libcuda(str(tmp_path), [])
    modules = sorted(str(p) for p in cache.glob(f"*/*{EXT_SUFFIX}"))
    assert len(modules) == len(EXPECTED)
    for path in modules:
        needed = subprocess.run(["readelf", "-d", path], capture_output=True, text=True).stdout
        assert "[libcuda.so.1]" in needed, path
    script = textwrap.dedent(f"""
        import ctypes, importlib.util, os, sys
        ctypes.CDLL({stub!r}, mode=os.RTLD_GLOBAL)
        sys.setdlopenflags(os.RTLD_LAZY)
        for path in {modules!r}:
            name = os.path.basename(path).split(".")[0]
            spec = importlib.util.spec_from_file_location(name, path)
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            assert hasattr(module, "launch" if name == "__triton_launcher" else "load_binary"), path
        print("loaded", len({modules!r}))
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and f"loaded {len(EXPECTED)}" in out.stdout, out.stderr


@pytest.mark.slow
@pytest.mark.skipif(BUILDS, reason="this Triton builds C modules")
def test_a_triton_without_per_signature_launchers_builds_nothing_and_says_nothing(warmed):
    cache, the_plan, result = warmed
    assert result.c_launchers is None
    assert not list(cache.glob(f"*/*{EXT_SUFFIX}"))
    report = check(the_plan, cache)
    assert report.missing_c_launchers == [] and report.ok


@pytest.mark.slow
@needs_builds
def test_check_lists_a_missing_launcher_with_the_fix(warmed, tmp_path):
    cache, the_plan, _ = warmed
    assert check(the_plan, cache).ok
    copy = tmp_path / "cache"
    shutil.copytree(cache, copy)
    module = next(copy.glob(f"*/{EXPECTED[0]}{EXT_SUFFIX}"))
    shutil.rmtree(module.parent)
    entries = sorted(os.listdir(copy))
    report = check(the_plan, copy)
    assert not report.ok and not report.missing
    needed_by = "rms_norm_kernel" if PER_SIGNATURE else "the driver"
    assert report.missing_c_launchers == [f"{EXPECTED[0]} of {needed_by}"]
    assert "warmup" in report.c_launcher_fix
    assert sorted(os.listdir(copy)) == entries  # the lookups left no empty folder behind


def test_says_in_one_line_why_launchers_cannot_be_built(monkeypatch):
    other = ".cpython-399-x86_64-linux-gnu.so"
    reason = c_launchers.why_not_buildable("cuda", {"python": {"ext_suffix": other, "version": "3.99.0"}})
    assert other in reason and "Python 3.99.0" in reason and "\n" not in reason
    assert "libamdhip64" in c_launchers.why_not_buildable("hip")
    # keyed for another machine (--for): its libamdhip64.so is not in its fingerprint
    assert "fingerprint does not record" in c_launchers.why_not_buildable("hip", {"python": {"version": "3.12.0"}})
    monkeypatch.setenv("CC", "/nonexistent/cc")
    assert "no C compiler" in c_launchers.why_not_buildable("cuda")


@pytest.mark.slow
@needs_builds
def test_warmup_without_a_compiler_builds_nothing_and_says_so(warmed, tmp_path, monkeypatch):
    _, the_plan, _ = warmed
    monkeypatch.setenv("CC", "/nonexistent/cc")
    report = c_launchers.warm_c_launchers(list(the_plan.variants.values()), SM90, tmp_path)
    assert report.built == 0 and "no C compiler" in report.summary()
    assert not list(tmp_path.glob(f"*/*{EXT_SUFFIX}"))


# --------------------------------------------------------------------------- serving


def _probe_source(name: str) -> str:
    return (f"#include <Python.h>\n"
            f"static struct PyModuleDef m = {{PyModuleDef_HEAD_INIT, \"{name}\", NULL, -1, NULL}};\n"
            f"PyMODINIT_FUNC PyInit_{name}(void) {{ return PyModule_Create(&m); }}\n")


def test_serving_counts_a_c_build_as_a_compile(tmp_path, caplog):
    from triton.runtime.build import compile_module_from_src

    monitor = DispatchMonitor(tmp_path, policy="warn")
    with triton_cache_dir(tmp_path), monitor.serving():
        module = compile_module_from_src(_probe_source("tritonwarm_probe"), "tritonwarm_probe")
    assert module.__name__ == "tritonwarm_probe"
    assert monitor.compiles == 1 and monitor.c_builds == ["tritonwarm_probe"] and monitor.compile_seconds > 0
    assert "building its C module tritonwarm_probe at serving time" in caplog.text
    metrics = EngineMetrics()
    metrics.observe(types.SimpleNamespace(monitor=monitor, serve_compiles=monitor.compiles,
                                          result=types.SimpleNamespace(steps=1, generated_tokens=1, preemptions=0,
                                                                            request_preemptions=[])))
    text = metrics.text()
    assert "tritonwarm_serve_compiles_total 1.0" in text and "tritonwarm_serve_c_builds_total 1.0" in text
    with triton_cache_dir(tmp_path), monitor.serving():  # now cached: nothing built, nothing counted
        compile_module_from_src(_probe_source("tritonwarm_probe"), "tritonwarm_probe")
    assert monitor.compiles == 1


@pytest.mark.skipif(not c_launchers.serving_build_is_warmable(c_launchers.LAUNCHER),
                    reason="warm-up builds no launcher on this Triton")
def test_error_policy_refuses_a_launcher_build_before_it_starts(tmp_path):
    from triton.runtime.build import compile_module_from_src

    monitor = DispatchMonitor(tmp_path, policy="error")
    with triton_cache_dir(tmp_path), monitor.serving():
        with pytest.raises(JitPolicyError, match="C module __triton_launcher at serving time"):
            compile_module_from_src(_probe_source("__triton_launcher"), "__triton_launcher")
    assert not list(tmp_path.glob(f"*/*{EXT_SUFFIX}"))
    assert knobs.build.impl is None


@pytest.mark.skipif(c_launchers.serving_build_is_warmable("cuda_utils"), reason="warm-up builds cuda_utils here")
def test_error_policy_counts_what_no_warmup_could_provide(tmp_path, caplog):
    """From Triton 3.8 cuda_utils' key names where libcuda.so.1 is: unknown here, counted and logged."""
    from triton.runtime.build import compile_module_from_src

    monitor = DispatchMonitor(tmp_path, policy="error")
    with triton_cache_dir(tmp_path), monitor.serving():
        compile_module_from_src(_probe_source("cuda_utils"), "cuda_utils")
    assert monitor.c_builds == ["cuda_utils"] and monitor.compiles == 1
    assert "on this machine, or with TRITON_LIBCUDA_PATH naming where it has libcuda.so.1" in caplog.text


@pytest.mark.slow
@needs_builds
def test_a_compiler_that_fails_is_a_warmup_failure_named_in_one_line(warmed, monkeypatch):
    cache, the_plan, _ = warmed
    monkeypatch.setenv("CC", shutil.which("false"))
    report = c_launchers.warm_c_launchers(list(the_plan.variants.values()), SM90, cache)
    assert report.built == 0 and len(report.failed) == 1 and "CalledProcessError" in report.failed[0]


# ----------------------------------------------- keyed by the serving machine's driver (CUDA 3.8+, AMD)

MACHINE_KEYED = not c_launchers.utilities_keyed_by_source()

DRIVER_START = """
import sys
from triton.runtime import build
from triton.backends.BACKEND.driver import UTILITIES as Utilities

def refuse(name, *args, **kwargs):
    sys.exit(f"Triton built {name}")

if sys.argv[1:] == ["--no-build"]:
    build._build = refuse
try:
    Utilities()  # what Triton's driver does when it starts, at a process's first launch
except OSError as e:
    sys.exit(f"driver start failed: {e}")
print("driver started")
"""


def driver_start(backend: str) -> list[str]:
    """A process that starts Triton's driver for ``backend`` as a first launch does; ``--no-build``
    makes any build of a C module fail it."""
    script = DRIVER_START.replace("BACKEND", {"cuda": "nvidia", "hip": "amd"}[backend])
    return [sys.executable, "-c", script.replace("UTILITIES", {"cuda": "CudaUtils", "hip": "HIPUtils"}[backend])]


@pytest.fixture
def declared_driver(tmp_path, monkeypatch):
    """Where the serving machines have their NVIDIA driver's ``libcuda.so.1``, declared with
    ``TRITON_LIBCUDA_PATH`` (an empty folder here, as on an image build machine); ``install()`` puts a
    stub there defining every driver function ``cuda_utils`` calls, as the container runtime mounts
    the real library at serving time."""
    from triton.backends.nvidia import driver as cuda_driver

    folder = tmp_path / "nvidia-driver"
    folder.mkdir()
    monkeypatch.setenv("TRITON_LIBCUDA_PATH", str(folder))
    caches = (cuda_driver.libcuda_dirs, cuda_driver.library_dirs)
    for cached in caches:
        cached.cache_clear()
    source = c_launchers.machine_utilities_call("cuda").source
    yield types.SimpleNamespace(folder=folder, install=lambda: c_launchers.write_stub_libcuda(str(folder), [source]))
    for cached in caches:
        cached.cache_clear()


RMS_SPEC = ("kernel: tritonwarm.launchers.rms_norm:rms_norm\nargs:\n"
            "  x: {tensor: [3, 4096], dtype: bfloat16}\n  weight: {tensor: [4096], dtype: bfloat16}\n")
needs_machine_key = pytest.mark.skipif(not MACHINE_KEYED, reason="cuda_utils is keyed by its source alone here")


@pytest.mark.slow
@needs_machine_key
def test_driver_utilities_keyed_by_the_serving_machine_serve_a_read_only_cache(tmp_path, declared_driver,
                                                                                read_only_mount, run_cli):
    """From Triton 3.8 the driver builds ``cuda_utils`` when it starts, keyed by where the machine's
    libcuda.so.1 lives, into the cache: on a read-only cache (an image run with a read-only root, a
    volume a fleet mounts read-only) the first launch fails. Warm-up with that place declared builds
    it, on a machine without the library (an image build); Triton's own driver start on the serving
    machine then finds it and builds nothing; `check` names it when it is missing."""
    spec = tmp_path / "rms.yaml"
    spec.write_text(RMS_SPEC)
    driver = declared_driver.folder
    env = {**os.environ, "LD_LIBRARY_PATH": str(driver)}
    start = driver_start("cuda")

    assert (f"cuda_utils   keyed by libcuda.so.1 in {driver} (TRITON_LIBCUDA_PATH; not on this machine): warmup "
            "here builds it") in run_cli("env", rc=0, env=env).stdout.replace("\n" + " " * 13, " ")
    cache = tmp_path / "cache"
    out = run_cli("warmup", spec, "--target", "sm90", "--cache-dir", cache, rc=0, env=env).stdout
    assert "C launchers: 1 needed: 1 built" in out
    [module] = cache.glob(f"*/cuda_utils{EXT_SUFFIX}")
    assert not list(driver.iterdir())  # built without the library, linked against a stub elsewhere

    declared_driver.install()  # serving: the driver's library is where it was declared
    (tmp_path / "empty").mkdir()
    with read_only_mount(tmp_path / "empty", tmp_path / "ro-empty") as empty:
        failed = subprocess.run(start, capture_output=True, text=True, env={**env, "TRITON_CACHE_DIR": str(empty)})
    assert failed.returncode != 0 and "driver start failed" in failed.stderr and "Read-only file system" in \
        failed.stderr, failed.stderr  # Triton's own behaviour on a cache without it, which warm-up prevents
    with read_only_mount(cache, tmp_path / "ro") as served:
        started = subprocess.run(start + ["--no-build"], capture_output=True, text=True,
                                 env={**env, "TRITON_CACHE_DIR": str(served)})
        assert started.returncode == 0 and "driver started" in started.stdout, started.stderr
        assert f"cuda_utils   keyed by this machine's libcuda.so.1 in {driver}" in run_cli(
            "env", rc=0, env=env).stdout.replace("\n" + " " * 13, " ")
        seen = ("--cache-dir", served, "--same-machine")  # its groups name the folder, which this machine sees too
        assert "sm90: ok: 1 variant planned" in run_cli("check", spec, "--target", "sm90", *seen, rc=0, env=env).stdout
        shutil.rmtree(module.parent)  # removed under the mount: the fleet's volume without it
        out = " ".join(run_cli("check", spec, "--target", "sm90", *seen, rc=1, env=env).stdout.split())
    assert ("1 C launchers missing (Triton would build them at first launch): this process cannot write to the "
            "cache (read-only, or another owner's): Triton's first launch would fail writing them into it") in out
    assert ("on this machine, or with TRITON_LIBCUDA_PATH naming where it has libcuda.so.1 (Triton keys cuda_utils "
            "by that place), before it is mounted read-only") in out


@pytest.mark.slow
@needs_machine_key
def test_bundle_install_in_an_image_build_builds_the_driver_utilities_for_the_declared_place(
        tmp_path, declared_driver, run_cli):
    """The README's Dockerfile: a bundle made in CI, installed at image build (no driver) with
    ``TRITON_LIBCUDA_PATH`` declared: the installed cache holds the ``cuda_utils`` the servers need."""
    spec = tmp_path / "rms.yaml"
    spec.write_text(RMS_SPEC)
    build, served, bundle = tmp_path / "build", tmp_path / "served", tmp_path / "warm.tar.gz"
    run_cli("warmup", spec, "--target", "sm90", "--cache-dir", build, rc=0)
    run_cli("bundle", "create", bundle, spec, "--target", "sm90", "--cache-dir", build, rc=0)
    out = run_cli("bundle", "install", bundle, "--cache-dir", served, rc=0).stdout
    assert "C launchers: 1 needed: 1 built" in out, out
    assert len(list(served.glob(f"*/cuda_utils{EXT_SUFFIX}"))) == 1
    checked = run_cli("check", spec, "--target", "sm90", "--cache-dir", served, rc=0).stdout
    assert "sm90: ok: 1 variant planned" in checked


@pytest.mark.slow
@needs_machine_key
def test_an_image_build_that_cannot_key_the_driver_utilities_is_told_so_with_the_fix(tmp_path, monkeypatch, capsys):
    """No libcuda.so.1 here and none declared (an image build): neither install nor warm-up can build the
    ``cuda_utils`` every server builds at its first launch. `bundle install` and `check` name it, with
    ``TRITON_LIBCUDA_PATH``; declared, install builds it and nothing is left to say."""
    from tritonwarm.cli import main

    monkeypatch.delenv("TRITON_LIBCUDA_PATH", raising=False)
    if c_launchers.machine_utilities_call("cuda") is not None:
        pytest.skip("Triton finds a libcuda.so.1 on this machine")
    spec = tmp_path / "rms.yaml"
    spec.write_text(RMS_SPEC)
    build, image, bundle = tmp_path / "build", tmp_path / "image", tmp_path / "warm.tar.gz"
    assert main(["warmup", str(spec), "--target", "sm90", "--cache-dir", str(build), "-j", "1"]) == 0
    assert main(["bundle", "create", str(bundle), str(spec), "--target", "sm90", "--cache-dir", str(build)]) == 0
    capsys.readouterr()
    fix = "set TRITON_LIBCUDA_PATH to that folder (e.g. /usr/lib/"
    assert main(["bundle", "install", str(bundle), "--cache-dir", str(image)]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert f"sm90: warning: cuda_utils is not in the cache: Triton {triton_version()} builds it when the server's " \
           "driver starts" in out and fix in out, out
    assert main(["check", str(spec), "--target", "sm90", "--cache-dir", str(image)]) == 0  # the kernels all hit
    out = " ".join(capsys.readouterr().out.split())
    assert "sm90: ok: 1 variant planned" in out and "warning: cuda_utils is not in the cache" in out and fix in out, out

    monkeypatch.setenv("TRITON_LIBCUDA_PATH", str(tmp_path / "nvidia-driver"))  # where the servers have it
    caches = (c_launchers._driver_module("cuda").libcuda_dirs, c_launchers._driver_module("cuda").library_dirs)
    for cached in caches:
        cached.cache_clear()
    try:
        assert main(["bundle", "install", str(bundle), "--cache-dir", str(image)]) == 0
        assert "sm90: C launchers: 1 needed: 1 built" in capsys.readouterr().out
        assert main(["check", str(spec), "--target", "sm90", "--cache-dir", str(image)]) == 0
        assert "cuda_utils" not in capsys.readouterr().out
    finally:
        for cached in caches:
            cached.cache_clear()


def triton_version() -> str:
    import triton

    return triton.__version__


HIP_RUNTIME_STUB = """
int hipDriverGetVersion(int *version) { *version = 70000000; return 0; }  /* 7.0.0: what Triton requires */
int hipGetProcAddress(const char *symbol, void **fn, int version, unsigned long flags, int *status) {
    *fn = 0; if (status) *status = 0; return 0;
}
"""


@pytest.mark.slow
def test_hip_modules_keyed_by_the_runtime_path_serve_a_read_only_cache(tmp_path, monkeypatch, read_only_mount,
                                                                       run_cli):
    """On AMD every Triton writes the path of ``libamdhip64.so`` into the source of ``hip_utils`` (and
    3.6 into each launcher's), built when the driver starts: with that path declared
    (``TRITON_LIBHIP_PATH``), warm-up on a machine without ROCm builds them, Triton's own driver start
    on a read-only cache loads them and builds nothing, and `check` names one that is missing."""
    runtime = tmp_path / "rocm" / "libamdhip64.so"  # stands for the servers' HIP runtime, at that path
    runtime.parent.mkdir()
    (tmp_path / "hip_stub.c").write_text(HIP_RUNTIME_STUB)
    subprocess.run([c_launchers._c_compiler(), "-shared", "-fPIC", "-o", str(runtime), str(tmp_path / "hip_stub.c")],
                   check=True)
    monkeypatch.setenv("TRITON_LIBHIP_PATH", str(runtime))
    assert f"hip_utils    keyed by the HIP runtime {runtime}: warmup here builds it" in run_cli("env", rc=0).stdout
    spec = tmp_path / "rms.yaml"
    spec.write_text(RMS_SPEC)
    cache = tmp_path / "cache"
    needed = 1 + c_launchers.builds_per_signature("hip")  # hip_utils, and one launcher on 3.6
    out = run_cli("warmup", spec, "--target", "gfx942", "--cache-dir", cache, rc=0).stdout
    assert f"C launchers: {needed} needed: {needed} built" in out, out
    [utilities] = cache.glob(f"*/hip_utils{EXT_SUFFIX}")
    with read_only_mount(cache, tmp_path / "ro") as served:
        started = subprocess.run(driver_start("hip") + ["--no-build"], capture_output=True, text=True,
                                 env={**os.environ, "TRITON_CACHE_DIR": str(served)})
        assert started.returncode == 0 and "driver started" in started.stdout, started.stderr
        seen = ("--cache-dir", served, "--same-machine")  # its groups name the folder, which this machine sees too
        assert "gfx942: ok: 1 variant planned" in run_cli("check", spec, "--target", "gfx942", *seen, rc=0).stdout
        shutil.rmtree(utilities.parent)
        out = " ".join(run_cli("check", spec, "--target", "gfx942", *seen, rc=1).stdout.split())
    assert "1 C launchers missing (Triton would build them at first launch): this process cannot write" in out
    assert "or with TRITON_LIBHIP_PATH naming its libamdhip64.so" in out
