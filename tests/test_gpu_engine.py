"""The GPU lane, engine: the README's flow for ``--target local`` on a CUDA machine, then both engine
configs served in every KV cache format with ``--jit-policy error`` (nothing compiled, nothing built),
the tiny config token-identical to its reference, DeepSeek-V2-Lite's bf16 logits within the stated
tolerance, and a plain Triton process (no tritonwarm machinery imported) that hits the same cache.

``python -m pytest -m gpu`` (docs/testing.md). Without a GPU the ``gpu`` tests are skipped; the tests
not marked ``gpu`` at the end check on any machine that the lane's own commands and configs are valid.
"""

import atexit
import json
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest
import torch
import yaml

KV_CACHE_DTYPES = ("auto", "fp8_ds_mla", "nvfp4_ds_mla")
# tiny's 32-wide latent is too narrow for the quantized formats (fp8_ds_mla tiles it in 128s): the
# quantized tiny configs take a 128-wide one, as the CPU tests do.
LANE_CONFIGS = {
    **{f"tiny-{d}": {"preset": "tiny", "kv_cache_dtype": d}
       | ({} if d == "auto" else {"model": {"preset": "tiny", "kv_lora_rank": 128}}) for d in KV_CACHE_DTYPES},
    **{f"deepseek-v2-lite-{d}": {"preset": "deepseek-v2-lite", "kv_cache_dtype": d} for d in KV_CACHE_DTYPES},
}
SERVE = ["--requests", "8", "--max-tokens", "8", "--jit-policy", "error", "--json"]
# Time limits (s), so that one hang cannot take a short loan of a GPU: the warm-up, counted from its
# start; one engine process; a test that waits for the warm-up and then runs two engine processes.
WARMUP_TIMEOUT_S = 300
RUN_TIMEOUT_S = 170
ENGINE_TEST_TIMEOUT_S = 360


def write_configs(folder: Path) -> dict[str, Path]:
    folder.mkdir(parents=True, exist_ok=True)
    paths = {}
    for name, fields in LANE_CONFIGS.items():
        paths[name] = folder / f"{name}.yaml"
        paths[name].write_text(yaml.safe_dump(fields))
    return paths


def warmup_commands(configs: dict[str, Path], target: str = "local") -> list[list[str]]:
    """The README's flow for ``target``: the shipped specs and DeepSeek-V2-Lite's plan, then each other
    config's plan (what the lane serves). They run at once (tracing is one core each; the cache takes
    concurrent writers), each compiling in half the cores."""
    jobs = ["-j", str(max(2, (os.cpu_count() or 2) // 2))]
    flow = [["warmup", "--target", target, *jobs], ["warmup", "--engine-config", "deepseek-v2-lite", "--target",
                                                     target, *jobs]]
    return flow + [["warmup", "--engine-config", str(path), "--target", target, *jobs]
                   for name, path in configs.items() if name != "deepseek-v2-lite-auto"]


def serve_command(config: Path, mode: str = "triton") -> list[str]:
    return ["engine", "run", "--config", str(config), "--mode", mode, *SERVE]


def _env(cache: Path) -> dict:
    """A user's environment: Triton's folder is the cache (no tritonwarm variable set)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITONWARM_CACHE_DIR"}
    return {**env, "TRITON_CACHE_DIR": str(cache)}


def _die_with_parent():
    """In a lane's child process (Linux): killed when pytest ends however it ends (killed by ``timeout``,
    or ended by a test's time limit), so no compile or engine outlives the lane on a short loan."""
    import ctypes

    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def _tritonwarm(args, cache: Path, timeout=RUN_TIMEOUT_S):
    return subprocess.run([sys.executable, "-m", "tritonwarm", *args], capture_output=True, text=True,
                          env=_env(cache), timeout=timeout, preexec_fn=_die_with_parent)


def _last_line(proc) -> str:
    lines = (proc.stderr.strip() or proc.stdout.strip()).splitlines()
    return lines[-1] if lines else f"exit {proc.returncode}, no output"


class LaneWarmup:
    """The README's flow into a fresh cache, in the background: started once the lane is collected on a
    GPU (``tests/conftest.py``), so it compiles on the host's cores while the kernel tests use the GPU;
    the engine tests wait for it. Whatever is still running when the tests end is killed."""

    def __init__(self):
        self.root = Path(tempfile.mkdtemp(prefix="tritonwarm-gpu-lane-"))
        self.cache, self.configs = self.root / "triton-cache", write_configs(self.root / "configs")
        self.started = time.monotonic()
        self.running = []
        for i, args in enumerate(warmup_commands(self.configs)):  # output in files: no pipe fills while unread
            with open(self.root / f"warmup-{i}.out", "w") as out, open(self.root / f"warmup-{i}.err", "w") as err:
                self.running.append((i, args, subprocess.Popen([sys.executable, "-m", "tritonwarm", *args], stdout=out,
                                                               stderr=err, env=_env(self.cache),
                                                               preexec_fn=_die_with_parent)))
        atexit.register(self.stop)
        self.failed: list[str] | None = None

    def wait(self) -> tuple[Path, dict[str, Path]]:
        if self.failed is None:
            self.failed = []
            for i, args, proc in self.running:
                left = WARMUP_TIMEOUT_S - (time.monotonic() - self.started)
                try:
                    proc.wait(timeout=max(left, 1))
                except subprocess.TimeoutExpired:
                    self.stop()
                    self.failed.append(f"tritonwarm {' '.join(args[:3])}: not done in {WARMUP_TIMEOUT_S} s")
                    break
                if proc.returncode != 0:
                    out, err = ((self.root / f"warmup-{i}.{name}").read_text() for name in ("out", "err"))
                    done = subprocess.CompletedProcess(args, proc.returncode, out, err)
                    self.failed.append(f"tritonwarm {' '.join(args[:3])}: exit {proc.returncode}: {_last_line(done)}")
        if self.failed:
            pytest.fail(f"warm-up failed after {time.monotonic() - self.started:.0f} s: {'; '.join(self.failed)}",
                        pytrace=False)
        return self.cache, self.configs

    def stop(self):
        for _, _, proc in self.running:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


_warmup: LaneWarmup | None = None


def start_lane_warmup() -> LaneWarmup:
    global _warmup
    if _warmup is None:
        _warmup = LaneWarmup()
    return _warmup


@pytest.fixture(scope="session")
def lane():
    """The warmed cache and the configs: the README's flow, run once for the whole lane."""
    return start_lane_warmup().wait()


@pytest.mark.gpu(timeout_s=ENGINE_TEST_TIMEOUT_S)
@pytest.mark.parametrize("name", LANE_CONFIGS)
def test_the_engine_serves_with_nothing_compiled(lane, name):
    cache, configs = lane
    proc = _tritonwarm(serve_command(configs[name]), cache)
    assert proc.returncode == 0, _last_line(proc)
    run = json.loads(proc.stdout)
    assert (run["serve_compiles"], run["cache_misses"], run["startup_missing"]) == (0, 0, 0)
    assert run["cache_hits"] > 0 and run["generated_tokens"] > 0 and run["target"] is not None
    from tritonwarm.engine.config import load_engine_config
    from tritonwarm.engine.memory import weight_bytes

    config = load_engine_config(configs[name])
    assert weight_bytes(config) <= run["peak_gpu_allocated_bytes"] <= torch.cuda.get_device_properties(0).total_memory
    if name.startswith("tiny"):  # fp32: the kernels and their references pick the same tokens
        reference = _tritonwarm(serve_command(configs[name], "reference"), cache)
        assert reference.returncode == 0, _last_line(reference)
        assert run["outputs"] == json.loads(reference.stdout)["outputs"]


@pytest.mark.gpu(timeout_s=ENGINE_TEST_TIMEOUT_S)
def test_bf16_logits_stay_within_the_stated_tolerance(lane):
    """DeepSeek-V2-Lite's geometry in 4 layers (the lane's time): teacher-forced, the Triton logits are
    no farther from the reference than bf16 rounding takes the reference from the same model in fp32
    (docs/engine.md)."""
    from tritonwarm.engine.config import engine_config_from_dict
    from tritonwarm.engine.logits import compare_modes
    from tritonwarm.engine.runner import make_workload

    cache, _ = lane
    config = engine_config_from_dict({"preset": "deepseek-v2-lite", "model": {"preset": "deepseek-v2-lite",
                                                                              "num_layers": 4}})
    report = compare_modes(config, make_workload(config, 4, 8, seed=0, max_prompt=64), cache_dir=cache)
    assert not report.problems, report.problems


PLAIN_TRITON = textwrap.dedent("""
    # A plain Triton program: the kernels' modules (device code, torch and triton imports only) and
    # Triton's own launch path; nothing of tritonwarm's machinery is imported.
    import importlib, json, sys
    import torch, triton
    from triton.compiler import compiler
    from triton.runtime import build

    counts = {"make_ir": 0, "c_builds": 0, "hits": 0, "compile_calls": 0}
    make_ir, c_build = compiler.ASTSource.make_ir, build._build

    def counting_make_ir(*a, **k):
        counts["make_ir"] += 1
        return make_ir(*a, **k)

    def counting_build(*a, **k):
        counts["c_builds"] += 1
        return c_build(*a, **k)

    def listener(*, cache_hit, **_):  # Triton's compile listener: every compile() call, hit or not
        counts["compile_calls"] += 1
        counts["hits"] += bool(cache_hit)

    compiler.ASTSource.make_ir, build._build = counting_make_ir, counting_build
    knobs = getattr(triton, "knobs", None)
    if knobs is not None and hasattr(knobs.compilation, "listener"):
        knobs.compilation.listener = listener
    for launch in json.loads(sys.argv[1]):
        module_name, kernel_name = launch["kernel"].rsplit(".", 1)
        kernel = getattr(importlib.import_module(module_name), kernel_name)
        args = []
        for arg in launch["args"]:
            if isinstance(arg, dict):
                dtype = getattr(torch, arg["dtype"])
                args.append(torch.randn(arg["shape"], device="cuda").to(dtype).as_strided(arg["shape"],
                                                                                          arg["strides"]))
            else:
                args.append(arg)
        kernel[tuple(launch["grid"])](*args, **launch["kwargs"])
    torch.cuda.synchronize()
    counts["machinery"] = sorted(m for m in sys.modules if m.startswith(("tritonwarm.jit", "tritonwarm.launchers")))
    print(json.dumps(counts))
""")


def plain_launches() -> list[dict]:
    """Launches of warmed variants (the shipped specs' RMSNorm at DeepSeek-V2-Lite's width, plain and
    fused, and SiLU-and-mul) as data: kernel, grid, arguments and options as the launch specs decide."""
    from tritonwarm.launchers.activation import silu_and_mul_jit, silu_and_mul_launch
    from tritonwarm.launchers.rms_norm import rms_norm_jit, rms_norm_launch

    def meta(*shape, dtype=torch.bfloat16):
        return torch.empty(*shape, dtype=dtype, device="meta")

    launches = [
        (rms_norm_jit, rms_norm_launch(meta(7, 2048), meta(2048), meta(7, 2048), 1e-6)),
        (rms_norm_jit, rms_norm_launch(meta(7, 2048), meta(2048), meta(7, 2048), 1e-6, meta(7, 2048))),
        (silu_and_mul_jit, silu_and_mul_launch(meta(7, 2 * 1408), meta(7, 1408))),
    ]
    out = []
    for jit, launch in launches:
        fn = jit.jit_function.fn
        args = [{"shape": list(a.shape), "strides": list(a.stride()), "dtype": str(a.dtype).removeprefix("torch.")}
                if isinstance(a, torch.Tensor) else a for a in launch.args]
        out.append({"kernel": f"{fn.__module__}.{fn.__name__}", "grid": list(launch.grid), "args": args,
                    "kwargs": launch.kwargs()})
    return out


@pytest.mark.gpu(timeout_s=ENGINE_TEST_TIMEOUT_S)
def test_a_plain_triton_process_hits_the_warmed_cache(lane):
    cache, _ = lane
    proc = subprocess.run([sys.executable, "-c", PLAIN_TRITON, json.dumps(plain_launches())], capture_output=True,
                          text=True, env=_env(cache), timeout=RUN_TIMEOUT_S, preexec_fn=_die_with_parent)
    assert proc.returncode == 0, _last_line(proc)
    counts = json.loads(proc.stdout.strip().splitlines()[-1])
    assert counts["machinery"] == [], counts  # plain: Triton's own path only
    assert (counts["make_ir"], counts["c_builds"]) == (0, 0), counts
    # where Triton's listener reports cache hits (3.9 does), each of the three variants was one
    assert counts["hits"] == counts["compile_calls"] and counts["compile_calls"] in (0, 3), counts


# ----------------------------------------------------------------------------- the lane itself, on any machine


def test_the_lanes_commands_parse_and_its_configs_load(tmp_path):
    """What the lane runs is valid here too: every command parses with the CLI's own parser, every
    config loads, and each KV cache format is served by both models."""
    from tritonwarm.cli import _parser
    from tritonwarm.engine.config import load_engine_config

    configs = write_configs(tmp_path)
    commands = warmup_commands(configs) + [serve_command(p, m) for p in configs.values() for m in ("triton",
                                                                                                    "reference")]
    parser = _parser()
    for args in commands:
        namespace = parser.parse_args(args)
        assert callable(namespace.func), args
    loaded = {name: load_engine_config(path) for name, path in configs.items()}
    for model in ("tiny", "deepseek-v2-lite"):
        assert {c.kv_cache_dtype for n, c in loaded.items() if c.model.name == model} == set(KV_CACHE_DTYPES)
    # every engine config the lane serves is warmed: the preset by the README's own command, the rest by file
    warmed = {args[args.index("--engine-config") + 1] for args in commands if "--engine-config" in args}
    assert warmed == {"deepseek-v2-lite"} | {str(p) for n, p in configs.items() if n != "deepseek-v2-lite-auto"}
    assert load_engine_config("deepseek-v2-lite") == loaded["deepseek-v2-lite-auto"]


def test_the_plain_launches_are_warmed_by_the_shipped_specs():
    """The plain process launches, from data alone, variants that the lane's warm-up plans: the same
    calls traced for sm90 with Triton's own keys are among the shipped specs' variants."""
    from tritonwarm.jit import TARGETS, fake_tensor, trace_call
    from tritonwarm.jit.pipeline.plan import plan
    from tritonwarm.jit.pipeline.specs import load_specs
    from tritonwarm.launchers import rms_norm, silu_and_mul

    launches = plain_launches()
    assert json.loads(json.dumps(launches)) == launches
    assert [launch["kernel"] for launch in launches] == ["tritonwarm.kernels.rms_norm.rms_norm_kernel"] * 2 + [
        "tritonwarm.kernels.activation.silu_and_mul_kernel"]
    sm90 = TARGETS["sm90"]
    x, w = fake_tensor((7, 2048), torch.bfloat16), fake_tensor((2048,), torch.bfloat16)
    traced = [*trace_call(sm90, rms_norm, x, w, 1e-6), *trace_call(sm90, rms_norm, x, w, 1e-6, x),
              *trace_call(sm90, silu_and_mul, fake_tensor((7, 2 * 1408), torch.bfloat16))]
    assert [v.kernel.rsplit(".", 1)[-1] for v in traced] == [launch["kernel"].rsplit(".", 1)[-1] for launch in launches]
    specs = Path(__file__).resolve().parent.parent / "warmup_specs"
    planned = plan(load_specs([specs / "rms_norm.yaml", specs / "silu_and_mul.yaml"]), sm90)
    assert {v.cache_hash for v in traced} <= set(planned.variants)


def test_the_background_warmup_reports_each_failed_command_in_one_line(monkeypatch):
    """The lane's warm-up runs its commands at once; waiting gives the cache, or fails naming each
    command that failed with its last line (here: an unknown target, and a help that succeeds)."""
    monkeypatch.setitem(globals(), "warmup_commands",
                        lambda configs: [["warmup", "--help"], ["warmup", "--target", "sm_nonesuch"]])
    warmup = LaneWarmup()
    with pytest.raises(pytest.fail.Exception, match=r"warm-up failed after \d+ s: tritonwarm warmup --target "
                                                    r"sm_nonesuch: exit 2: .*sm_nonesuch") as failed:
        warmup.wait()
    assert "--help" not in str(failed.value)
    with pytest.raises(pytest.fail.Exception):  # the same answer for every test that waits
        warmup.wait()


def test_a_warmup_past_its_limit_is_killed(monkeypatch, tmp_path):
    python = tmp_path / "python"  # a warm-up that never ends
    python.write_text("#!/bin/sh\nexec sleep 60\n")
    python.chmod(0o755)
    monkeypatch.setitem(globals(), "WARMUP_TIMEOUT_S", 1)
    monkeypatch.setattr(sys, "executable", str(python))
    warmup = LaneWarmup()
    with pytest.raises(pytest.fail.Exception, match="not done in 1 s"):
        warmup.wait()
    assert all(proc.poll() is not None for _, _, proc in warmup.running)


# What a GPU image may lack: the other test modules' dependencies, and what the lane never needs.
NOT_ON_A_GPU_IMAGE = ("hypothesis", "redis", "cryptography", "tqdm", "xdist")
BLOCK_IMPORTS = f"""
import sys

class Blocked:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {NOT_ON_A_GPU_IMAGE!r}:
            raise ImportError(f"blocked: {{name}} is not on this image")

sys.meta_path.insert(0, Blocked())
"""


def _lane_run(args, tmp_path, cwd, timeout=300):
    """``python -m pytest ARGS`` in ``cwd`` where the modules a GPU image may lack cannot be imported."""
    (tmp_path / "blocked").mkdir(exist_ok=True)
    (tmp_path / "blocked" / "sitecustomize.py").write_text(BLOCK_IMPORTS)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path / "blocked"), *sys.path]),
           "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}  # no plugin of a blocked package (hypothesis', xdist)
    return subprocess.run([sys.executable, "-m", "pytest", *args], capture_output=True, text=True, cwd=cwd, env=env,
                          timeout=timeout)


def test_without_a_gpu_the_lane_is_skipped_for_one_reason(tmp_path):
    """The lane's own command, in the repository, on an image without the other tests' dependencies:
    only the lane's files are collected, and every test is skipped for one reason."""
    if torch.cuda.is_available():
        pytest.skip("a GPU is here: the lane runs")
    root = Path(__file__).resolve().parent.parent
    proc = _lane_run(["-m", "gpu", "-v", "--tb=no", "-rfEs"], tmp_path, cwd=root)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    skipped = [line for line in proc.stdout.splitlines() if line.startswith("SKIPPED")]
    assert len(skipped) == 1 and "no CUDA GPU: the GPU lane (pytest -m gpu) runs on one" in skipped[0], proc.stdout
    count = int(skipped[0].split("[", 1)[1].split("]", 1)[0])
    assert count >= 60 and f"{count} skipped" in proc.stdout.splitlines()[-1]
    assert "passed" not in proc.stdout.splitlines()[-1] and "error" not in proc.stdout.lower()
    files = {line.split("::")[0] for line in proc.stdout.splitlines() if "::" in line and "SKIPPED" in line}
    assert files == {"tests/test_gpu_kernels.py", "tests/test_gpu_engine.py"}, proc.stdout


TIME_LIMITED = """
import signal
import time

import pytest
import torch

torch.cuda.is_available = lambda: True  # the lane's hooks see a GPU; nothing here uses one


@pytest.fixture
def slow_fixture():
    time.sleep(30)


@pytest.mark.gpu(timeout_s=1)
def test_slow_body():
    time.sleep(30)


@pytest.mark.gpu(timeout_s=1)
def test_slow_setup(slow_fixture):
    pass


@pytest.mark.gpu(timeout_s=2)
def test_in_time():
    time.sleep(0.5)


def test_not_in_the_lane_has_no_limit():
    time.sleep(1.5)


@pytest.mark.gpu(timeout_s=1)
def test_hang_python_cannot_interrupt():  # as a wait inside native code: the alarm never reaches Python
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})
    time.sleep(60)
"""


def _time_limited_run(tmp_path, *args):
    folder = tmp_path / "lane"
    folder.mkdir()
    (folder / "conftest.py").write_text((Path(__file__).parent / "conftest.py").read_text())
    (folder / "test_limits.py").write_text(TIME_LIMITED)
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:xdist", "-q", "--tb=line", "-rfE", "-o",
                           "markers=gpu: the lane", "-o", "addopts=-p no:cacheprovider", *args, str(folder)],
                          capture_output=True, text=True, cwd=folder, timeout=120)
    return proc, time.monotonic() - start


def test_a_gpu_test_past_its_limit_fails_and_the_lane_goes_on(tmp_path):
    proc, took = _time_limited_run(tmp_path, "-k", "not hang")
    last = proc.stdout.strip().splitlines()[-1]
    assert "1 failed, 2 passed" in last and "1 error" in last, proc.stdout
    assert "test_slow_body - " in proc.stdout and "over its time limit of 1 s" in proc.stdout, proc.stdout
    assert "ERROR" in proc.stdout and "test_slow_setup" in proc.stdout
    assert took < 30  # neither 30 s sleep ran out: both were cut at 1 s


@pytest.mark.slow
def test_a_hang_in_native_code_ends_the_run_with_tracebacks(tmp_path):
    """Python never sees the alarm: 30 s after the limit the process ends, saying where it waited."""
    proc, took = _time_limited_run(tmp_path, "-k", "hang")
    assert proc.returncode != 0
    assert "Timeout" in proc.stderr and "test_hang_python_cannot_interrupt" in proc.stderr, proc.stderr
    assert 30 < took < 60
