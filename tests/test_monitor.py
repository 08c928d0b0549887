"""The serving-time watch: a dry run on meta tensors looks every launch up in the warmed cache."""

import json
import os
import pathlib

import pytest
import torch
from tritonwarm.jit import TARGETS, fake_tensor
from tritonwarm.jit.pipeline.plan import plan
from tritonwarm.jit.pipeline.specs import load_specs
from tritonwarm.jit.pipeline.warmup import warm
from tritonwarm.jit.serving.monitor import DispatchMonitor, JitPolicyError
from tritonwarm.launchers import rms_norm

SPEC = pathlib.Path(__file__).parent.parent / "warmup_specs" / "rms_norm.yaml"


def serve(monitor, target, batches):
    with monitor.dry_run(TARGETS[target]):
        for rows, hidden in batches:
            x = fake_tensor((rows, hidden), torch.bfloat16)
            rms_norm(x, fake_tensor((hidden,), torch.bfloat16), 1e-6, fake_tensor((rows, hidden), torch.bfloat16))
            rms_norm(x, fake_tensor((hidden,), torch.bfloat16))


@pytest.fixture(scope="module")
def warmed(tmp_path_factory):
    cache = tmp_path_factory.mktemp("warmed")
    warm(plan(load_specs([SPEC]), TARGETS["sm90"]), cache)
    return cache


@pytest.mark.slow
def test_warmed_cache_serves_every_batch_size(warmed, tmp_path):
    monitor = DispatchMonitor(warmed, policy="error")
    serve(monitor, "sm90", [(1, 2048), (7, 2048), (300, 4096), (4096, 4096)])
    assert monitor.misses == [] and monitor.hits == 4
    assert sum(monitor.launches.values()) == 8
    record = tmp_path / "record.jsonl"
    monitor.write_record(record)
    lines = [json.loads(line) for line in record.read_text().splitlines()]
    assert len(lines) == 4 and all(line["hit"] for line in lines)
    assert sum(line["launches"] for line in lines) == 8


def test_error_policy_names_the_missing_kernel(tmp_path):
    monitor = DispatchMonitor(tmp_path / "empty", policy="error")
    with pytest.raises(JitPolicyError, match="rms_norm_kernel would compile at serving time on sm90"):
        serve(monitor, "sm90", [(3, 2048)])


@pytest.mark.slow
def test_warn_policy_records_misses_and_carries_on(warmed, caplog):
    monitor = DispatchMonitor(warmed, policy="warn")
    serve(monitor, "sm90", [(5, 1024)])  # hidden 1024 was never warmed
    assert len(monitor.misses) == 2 and monitor.hits == 0
    assert "would compile at serving time" in caplog.text


def test_unknown_policy_is_rejected(tmp_path):
    with pytest.raises(ValueError, match="unknown jit policy"):
        DispatchMonitor(tmp_path, policy="maybe")


@pytest.mark.slow
def test_serving_hook_sees_tritons_own_compile_requests(warmed, tmp_path):
    """monitor.serving() watches JITFunction.run itself (driven here under the target-only driver,
    as a GPU process would drive it): hits on a warmed cache, a refusal before compiling on a cold one."""
    from tritonwarm.jit.cache.triton_dir import triton_cache_dir
    from tritonwarm.jit.core.targets import target_driver
    from tritonwarm.launchers.rms_norm import rms_norm_jit, rms_norm_launch

    def launch(rows):
        x = fake_tensor((rows, 4096), torch.bfloat16)
        return rms_norm_launch(x, fake_tensor((4096,), torch.bfloat16), fake_tensor((rows, 4096), torch.bfloat16),
                               1e-6)

    monitor = DispatchMonitor(warmed, policy="error")
    with target_driver(TARGETS["sm90"]), triton_cache_dir(warmed), monitor.serving():
        rms_norm_jit.fake_run(launch(3))
        rms_norm_jit.fake_run(launch(300))  # same variant: Triton's in-memory cache, no new request
    assert monitor.hits == 1 and not monitor.misses and monitor.compiles == 0

    cold = DispatchMonitor(tmp_path / "cold", policy="error")
    with target_driver(TARGETS["sm90"]), triton_cache_dir(tmp_path / "cold"), cold.serving():
        with pytest.raises(JitPolicyError, match="rms_norm_kernel would compile at serving time"):
            rms_norm_jit.fake_run(launch(3))
    assert not list((tmp_path / "cold").glob("*/*.cubin"))  # refused before compiling

    counting = DispatchMonitor(tmp_path / "cold2", policy="warn")
    with target_driver(TARGETS["sm90"]), triton_cache_dir(tmp_path / "cold2"), counting.serving():
        rms_norm_jit.fake_run(launch(3))
    assert counting.compiles == 1 and counting.compile_seconds > 0 and len(counting.misses) == 1


@pytest.mark.slow
def test_a_monitor_never_judges_a_cache_triton_does_not_read(warmed, tmp_path, caplog):
    """The warmed cache is not where Triton reads (TRITON_CACHE_DIR unset or elsewhere): Triton compiles
    every kernel while a look-up in the warmed cache would count hits. ``error`` refuses to serve;
    ``warn`` says so and counts what Triton does."""
    from tritonwarm.jit.cache.triton_dir import triton_cache_dir
    from tritonwarm.jit.core.targets import target_driver
    from tritonwarm.launchers.rms_norm import rms_norm_jit, rms_norm_launch

    x = fake_tensor((3, 4096), torch.bfloat16)
    launch = rms_norm_launch(x, fake_tensor((4096,), torch.bfloat16), fake_tensor((3, 4096), torch.bfloat16), 1e-6)
    elsewhere = tmp_path / "triton-default"
    with pytest.raises(JitPolicyError, match=f"Triton reads its cache from {elsewhere}, not from the warmed cache "
                                             f"{warmed}: every kernel would compile; serve with TRITON_CACHE_DIR="):
        with target_driver(TARGETS["sm90"]), triton_cache_dir(elsewhere), DispatchMonitor(warmed, "error").serving():
            pass

    monitor = DispatchMonitor(warmed, policy="warn")
    with target_driver(TARGETS["sm90"]), triton_cache_dir(elsewhere), monitor.serving():
        rms_norm_jit.fake_run(launch)
    assert "Triton reads its cache from" in caplog.text
    assert (monitor.hits, monitor.compiles, len(list(elsewhere.glob("*/*.cubin")))) == (0, 1, 1)


@pytest.mark.slow
def test_always_compile_is_refused_and_counted(warmed, monkeypatch, caplog):
    """``TRITON_ALWAYS_COMPILE`` skips every cache hit without changing a key: only the monitor can
    tell that a warmed cache serves nothing. ``error`` refuses to serve; ``warn`` counts the compiles."""
    from tritonwarm.jit.cache.triton_dir import triton_cache_dir
    from tritonwarm.jit.core.targets import target_driver
    from tritonwarm.launchers.rms_norm import rms_norm_jit, rms_norm_launch

    monkeypatch.setenv("TRITON_ALWAYS_COMPILE", "1")
    x = fake_tensor((3, 4096), torch.bfloat16)
    launch = rms_norm_launch(x, fake_tensor((4096,), torch.bfloat16), fake_tensor((3, 4096), torch.bfloat16), 1e-6)
    with target_driver(TARGETS["sm90"]), triton_cache_dir(warmed):
        with pytest.raises(JitPolicyError, match="TRITON_ALWAYS_COMPILE is set: Triton compiles every kernel"):
            with DispatchMonitor(warmed, "error").serving():
                pass
        monitor = DispatchMonitor(warmed, policy="warn")
        with monitor.serving():
            rms_norm_jit.fake_run(launch)
    assert "TRITON_ALWAYS_COMPILE is set" in caplog.text
    assert (monitor.hits, monitor.compiles) == (1, 1)  # in the cache, and compiled all the same


@pytest.mark.slow
def test_torch_compile_moving_tritons_cache_while_serving_is_seen(tmp_path, monkeypatch, caplog):
    """``TRITON_CACHE_DIR`` unset and the cache warmed where Triton reads by default: the first kernel
    ``torch.compile`` loads (Inductor's own ``CachingAutotuner``, built here as a compiled graph builds it)
    sets ``TRITON_CACHE_DIR`` process-wide, and Triton's later lookups go to Inductor's folder. The
    monitor judged the folder at start-up; it sees the move at the next compile request."""
    from torch._inductor.runtime.hints import DeviceProperties
    from torch._inductor.runtime.triton_heuristics import CachingAutotuner
    from triton import Config, knobs
    from tritonwarm.jit.core.targets import target_driver
    from tritonwarm.launchers.rms_norm import rms_norm_jit, rms_norm_launch

    def launch(dtype):
        x = fake_tensor((3, 4096), dtype)
        return rms_norm_launch(x, fake_tensor((4096,), dtype), fake_tensor((3, 4096), dtype), 1e-6)

    def torch_compile_loads_a_kernel():
        CachingAutotuner(rms_norm_jit.jit_function, {"device": DeviceProperties.create(torch.device("cpu"))},
                         [Config({})], None, [], False, None)

    monkeypatch.delenv("TRITON_CACHE_DIR")
    monkeypatch.setenv("TRITON_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    default = pathlib.Path(knobs.cache.dir)
    with target_driver(TARGETS["sm90"]):  # warmed by Triton's own runtime path, where it reads by default
        rms_norm_jit.fake_run(launch(torch.bfloat16))
        rms_norm_jit.fake_run(launch(torch.float16))
    assert len(list(default.glob("*/*.cubin"))) == 2

    for policy in ("error", "warn"):
        monkeypatch.delenv("TRITON_CACHE_DIR", raising=False)
        monitor = DispatchMonitor(default, policy)
        with target_driver(TARGETS["sm90"]), monitor.serving():
            rms_norm_jit.fake_run(launch(torch.bfloat16))
            torch_compile_loads_a_kernel()
            moved = pathlib.Path(os.environ["TRITON_CACHE_DIR"])
            assert moved.is_relative_to(tmp_path / "inductor")  # torch's own behaviour, which this test is about
            if policy == "error":
                with pytest.raises(JitPolicyError, match=f"Triton's cache folder changed while serving, from "
                                                         f"{default} to {moved}"):
                    rms_norm_jit.fake_run(launch(torch.float16))
                assert not moved.exists()  # refused before compiling
            else:
                rms_norm_jit.fake_run(launch(torch.float16))
        assert monitor.hits == 1
    # under warn: the miss and the compile are counted where Triton really compiled
    assert "Triton's cache folder changed while serving" in caplog.text
    assert (len(monitor.misses), monitor.compiles, len(list(moved.glob("*/*.cubin")))) == (1, 1, 1)
