"""What an engine holds: a CPU run that cannot fit is refused before any weight is made (one line that
points to the dry run), the estimate covers what a built engine really holds, and an engine is freed
as soon as nothing names it (no reference cycle), so runs one after another hold one engine at a time."""

import dataclasses
import gc
import importlib.util
import json
import sys
import weakref
from pathlib import Path

import pytest
import torch
from tritonwarm.engine import memory, runner
from tritonwarm.engine.config import ENGINES, MODELS, EngineConfig
from tritonwarm.engine.engine import Engine
from tritonwarm.engine.runner import make_workload, serve

TINY = ENGINES["tiny"]
LITE = ENGINES["deepseek-v2-lite"]
GIB = 2**30


def test_a_cpu_engine_that_cannot_fit_is_refused_in_one_line_before_any_weight_is_made(engine_cli, monkeypatch):
    """The README's last command on a 23 GB machine with no GPU: refused at once, not killed minutes later."""
    monkeypatch.setattr(memory, "available_bytes", lambda: 21 * GIB)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(runner, "Engine", lambda *a, **k: pytest.fail("an engine was built"))
    with pytest.raises(ValueError) as e:
        engine_cli(["engine", "run", "--config", "deepseek-v2-lite", "--jit-policy", "error"])
    line = str(e.value)
    assert "\n" not in line
    assert line.startswith("engine deepseek-v2-lite: 29.3 GiB of bfloat16 weights (34.9 GiB with the KV cache, "
                           "while building)")
    assert "do not fit the 21.0 GiB of memory available, and there is no GPU" in line
    assert line.endswith("--dry-run --target TARGET (meta tensors, nothing allocated)")
    # the reference mode builds the same weights: refused the same way
    with pytest.raises(ValueError, match="do not fit"):
        engine_cli(["engine", "run", "--config", "deepseek-v2-lite", "--mode", "reference"])


def test_the_dry_run_and_a_config_that_fits_are_not_refused(engine_cli, monkeypatch, capsys):
    monkeypatch.setattr(memory, "available_bytes", lambda: 21 * GIB)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert engine_cli(["engine", "run", "--config", "tiny", "--mode", "reference", "--requests", "1",
                       "--max-tokens", "1"]) == 0
    class Built(Exception):
        pass

    def build(config, mode, device, *args):
        raise Built(device)

    monkeypatch.setattr(runner, "Engine", build)
    monkeypatch.setattr(memory, "available_bytes", lambda: 0)
    with pytest.raises(Built, match="meta"):  # it went on to build its engine on meta tensors: not refused
        serve(LITE, make_workload(LITE, 1, 1), dry_run_target="sm90")


def test_the_estimate_covers_what_a_built_engine_holds():
    """Every tensor of a built engine (weights as fused, KV cache) within ``engine_bytes``, and the
    weights alone within a few percent of ``weight_bytes`` (the fused copies replace their originals)."""
    model = dataclasses.replace(MODELS["deepseek-v2-lite"], name="mini", vocab_size=512, hidden_size=128,
                                num_layers=3, num_experts=16, moe_intermediate_size=32, intermediate_size=256)
    for config in (TINY, EngineConfig(model, num_blocks=16, block_size=16, dtype=torch.bfloat16)):
        engine = Engine(config, "reference", "cpu")
        storages = {}
        tensors = [engine.model.embed, engine.model.norm, engine.model.lm_head, engine.kv.tensor,
                   *(t for layer in engine.model.layers for t in layer.values())]
        for t in tensors:
            storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        weights = sum(storages.values()) - engine.kv.tensor.untyped_storage().nbytes()
        assert sum(storages.values()) <= memory.engine_bytes(config)
        # the router bias is kept in fp32 beside the weights (a few bytes more)
        assert memory.weight_bytes(config) <= weights <= 1.01 * memory.weight_bytes(config)


def test_available_memory_is_the_smaller_of_meminfo_and_a_cgroup_limit(monkeypatch):
    files = {
        "/proc/meminfo": "MemTotal: 100 kB\nMemAvailable:   40000000 kB\n",
        "/sys/fs/cgroup/memory.max": "24000000000\n",
        "/sys/fs/cgroup/memory.current": "10000000000\n",
        "/sys/fs/cgroup/memory.stat": "anon 1\ninactive_file 1000000000\n",
    }
    monkeypatch.setattr(memory, "_read", files.get)
    assert memory.available_bytes() == 24_000_000_000 - 10_000_000_000 + 1_000_000_000
    files["/sys/fs/cgroup/memory.max"] = "max\n"  # no limit: meminfo alone
    assert memory.available_bytes() == 40_000_000 * 1024
    files.clear()  # nothing readable: no figure, nothing refused
    assert memory.available_bytes() is None
    memory.refuse_if_it_cannot_fit(LITE)


def test_an_engine_is_freed_when_nothing_names_it():
    """With the cyclic collector off: a reference cycle would keep an engine (and on a GPU its weights,
    KV cache and graphs) alive until some later collection, which GPU memory pressure never triggers."""
    gc.disable()
    try:
        engine = Engine(TINY, "triton", "cpu")
        engine.run(make_workload(TINY, 2, 2, seed=3, max_prompt=8))
        ref = weakref.ref(engine)
        del engine
        assert ref() is None
        made = []
        original = runner.Engine

        def recording(*args, **kwargs):
            engine = original(*args, **kwargs)
            made.append(weakref.ref(engine))
            return engine

        runner.Engine = recording
        try:
            serve(TINY, make_workload(TINY, 1, 1, max_prompt=4), mode="reference")
        finally:
            runner.Engine = original
        assert len(made) == 1 and made[0]() is None  # serve() returned: its engine is gone
    finally:
        gc.enable()


def _bench(name):
    path = Path(__file__).resolve().parent.parent / "bench" / f"{name}.py"
    sys.path.insert(0, str(path.parent))
    spec = importlib.util.spec_from_file_location(f"bench_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_throughput_bench_holds_one_engine_at_a_time_and_reuses_it_across_levels():
    bench = _bench("engine_throughput")
    alive, built = [], []

    def make_engine(*args):
        assert all(ref() is None for ref in alive), "a second engine while the first is alive"
        engine = Engine(*args)
        alive.append(weakref.ref(engine))
        built.append(args[1])
        return engine

    config = bench.sized_config(TINY, [1, 3], prompt=3, max_tokens=2)
    assert config.max_batch_size >= 3
    gc.disable()  # freed by reference counting alone
    try:
        for mode in ("reference", "triton"):
            figures, mem = bench.run_mode(config, mode, "cpu", [1, 3], prompt=3, max_tokens=2, warm=True,
                                          make_engine=make_engine)
            assert [f["steps"] for f in figures] == [2, 2]  # one prefill step, one decode step, per level
            assert all(f["tokens_per_s"] > 0 for f in figures)
            assert alive[-1]() is None
    finally:
        gc.enable()
    assert built == ["reference", "triton"]  # one engine per mode, not per level


def test_engine_run_reports_peak_gpu_memory(engine_cli, monkeypatch, capsys):
    """On a GPU the run's peak (what ``GpuPeak`` read from PyTorch's allocator) is printed and in --json;
    on a CPU there is no such line and the fields are null."""
    real_serve = runner.serve

    def on_a_gpu(*args, **kwargs):
        report = real_serve(*args, **kwargs)
        report.peak_gpu_allocated, report.peak_gpu_reserved = 33 * GIB + 2**29, 34 * GIB
        return report

    common = ["engine", "run", "--config", "tiny", "--mode", "reference", "--requests", "1", "--max-tokens", "1"]
    assert engine_cli(common) == 0
    assert "peak GPU memory" not in capsys.readouterr().out
    assert engine_cli([*common, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["peak_gpu_allocated_bytes"] is None
    monkeypatch.setattr(runner, "serve", on_a_gpu)
    assert engine_cli(common) == 0
    assert capsys.readouterr().out.splitlines()[-1] == (
        "peak GPU memory: 34304.0 MiB allocated by PyTorch (34816.0 MiB reserved)")
    assert engine_cli([*common, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert (out["peak_gpu_allocated_bytes"], out["peak_gpu_reserved_bytes"]) == (33 * GIB + 2**29, 34 * GIB)


def test_gpu_peak_reads_the_allocator_only_on_cuda(monkeypatch):
    calls = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: calls.append("sync"))
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda: calls.append("reset"))
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda: 5)
    monkeypatch.setattr(torch.cuda, "max_memory_reserved", lambda: 7)
    with memory.GpuPeak(torch.device("cpu")) as peak:
        pass
    assert (peak.allocated, peak.reserved, calls) == (None, None, [])
    with memory.GpuPeak(torch.device("cuda")) as peak:
        assert calls == ["sync", "reset"]
    assert (peak.allocated, peak.reserved) == (5, 7)
