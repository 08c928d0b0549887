"""The no-compile guarantee: the engine's own warm-up plan, ``--jit-policy`` on dry runs for sm90,
the dispatch record and ``check_trace``. Compiles for sm90 for real (no GPU needed)."""

import dataclasses
import json

import pytest
import torch
import triton
from tritonwarm.engine import ops as engine_ops
from tritonwarm.engine.config import ENGINES
from tritonwarm.engine.plan import check_trace, engine_plan, format_trace_report
from tritonwarm.engine.runner import make_workload, serve
from tritonwarm.engine.scheduler import Request
from tritonwarm.jit import TARGETS, JitKernel, Launch
from tritonwarm.jit.pipeline.warmup import warm
from tritonwarm.jit.serving.monitor import JitPolicyError
from tritonwarm.kernels.rms_norm import rms_norm_kernel
from tritonwarm.launchers.fused_moe import load_tile_table, target_table_path
from tritonwarm.launchers.moe_align import align_path
from tritonwarm.launchers.rms_norm import rms_norm_launch

LITE = ENGINES["deepseek-v2-lite"]
COMMON_KERNELS = {"rms_norm_kernel", "silu_and_mul_kernel", "rotary_embedding_kernel", "moe_topk_routing_kernel",
                  "fused_moe_kernel", "moe_align_single_kernel", "moe_align_count_kernel", "moe_align_place_kernel",
                  "paged_decode_attention_combine_kernel", "kv_block_zero_kernel"}
SCHEDULE_KERNELS = {"mla_decode_metadata_kernel", "paged_decode_attention_split_kernel"}
# DeepSeek-V2-Lite's 576-wide latent is cuda:90's "wide" class: the grid split kernel, no schedule.
ENGINE_KERNELS = COMMON_KERNELS | {"paged_decode_attention_grid_split_kernel"}
# The tiny engine's steps (at most 32 tokens x top-2) all take moe_align's single-program path; its
# 48-wide latent is "narrow": the schedule-driven split kernel on every target.
TINY_KERNELS = COMMON_KERNELS - {"moe_align_count_kernel", "moe_align_place_kernel"} | SCHEDULE_KERNELS


def _entries(cache_dir):
    """Triton's kernel entries (a group file each); C launchers built beside them are not counted."""
    if not cache_dir.exists():
        return set()
    return {p.name for p in cache_dir.iterdir() if p.name != "tritonwarm" and any(p.glob("__grp__*.json"))}


@pytest.fixture(scope="module")
def lite_cache(tmp_path_factory):
    """A cache warmed with exactly the DeepSeek-V2-Lite engine plan for sm90."""
    cache_dir = tmp_path_factory.mktemp("lite-sm90")
    the_plan = engine_plan(LITE, "sm90")
    assert not the_plan.errors and not the_plan.unreachable
    result = warm(the_plan, cache_dir)
    assert result.failed == 0, result.failures
    return cache_dir, the_plan


@pytest.mark.slow
def test_plan_covers_every_engine_kernel_once_per_configuration(lite_cache):
    _, the_plan = lite_cache
    kernels = [v.kernel.rsplit(".", 1)[-1] for v in the_plan.variants.values()]
    assert set(kernels) == ENGINE_KERNELS
    # Batch sizes never multiply variants through Triton's scalar classes: rms_norm has three (hidden
    # 2048, the 512 latent, with and without the fused residual), and the fused MoE GEMM two (gate/up,
    # down) per tile-table entry that a step of up to max_num_tokens tokens selects.
    tiles = load_tile_table(target_table_path("sm90"))  # the table the engine launches with on sm90
    entries = {tiles.select(m) for m in range(1, LITE.max_num_tokens + 1)}
    assert len(entries) > 1
    assert kernels.count("fused_moe_kernel") == 2 * len(entries)
    # moe_align: one program for small steps, count -> place beyond; one variant per kernel.
    cfg = LITE.model
    assert {align_path(m * cfg.top_k, cfg.num_experts) for m in range(1, LITE.max_num_tokens + 1)} == {
        "single", "count_place"}
    assert len(kernels) == len(ENGINE_KERNELS) + 2 + 2 * len(entries) - 1
    assert all(v.import_path == "tritonwarm.engine.ops" for v in the_plan.variants.values())
    assert "engine:deepseek-v2-lite decode tokens=16 batch=16" in next(iter(the_plan.variants.values())).rows
    attention = next(v for v in the_plan.variants.values() if "split" in v.kernel)
    assert attention.args["KEY_DIM"] == "=576" and attention.args["q_ptr"] == "*bf16 aligned"
    # AMD: the same kernels trace for gfx942 (nothing NVIDIA-only).
    tiny = ENGINES["tiny"]
    assert align_path(tiny.max_num_tokens * tiny.model.top_k, tiny.model.num_experts) == "single"
    amd = engine_plan(tiny, TARGETS["gfx942"])
    assert not amd.errors and {v.kernel.rsplit(".", 1)[-1] for v in amd.variants.values()} == TINY_KERNELS




def test_jit_policy_error_refuses_a_cold_cache(engine_cli, tmp_path, capsys):
    rc = engine_cli(["engine", "run", "--config", "deepseek-v2-lite", "--requests", "2", "--max-tokens", "2",
                      "--dry-run", "--target", "sm90", "--jit-policy", "error", "--cache-dir", str(tmp_path)])
    assert rc == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "engine start refused" in err
    assert "paged_decode_attention_grid_split_kernel" in err and "moe_topk_routing_kernel" in err
    assert err.endswith("run `tritonwarm warmup --engine-config CONFIG --target sm90`")
    assert _entries(tmp_path) == set()  # a dry run compiles nothing


@pytest.mark.slow
def test_jit_policy_error_says_why_a_warmed_cache_misses(engine_cli, lite_cache, capsys):
    cache_dir, _ = lite_cache
    rc = engine_cli(["engine", "run", "--config", "deepseek-v2-lite", "--requests", "2", "--max-tokens", "2",
                     "--dry-run", "--target", "gfx942", "--jit-policy", "error", "--cache-dir", str(cache_dir)])
    assert rc == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert err.endswith("why: this cache holds no entry for gfx942, only for sm90: warm with --target gfx942")


@pytest.mark.slow
def test_warmed_cache_serves_a_varied_dry_run_with_no_new_entry(lite_cache, tmp_path):
    cache_dir, the_plan = lite_cache
    before = _entries(cache_dir)
    assert len(before) == len(the_plan.variants)
    # Prompts up to 2.5x the token budget (chunked prefill), arrivals spread, batches of 1..5.
    requests = make_workload(LITE, 5, 3, seed=2, max_prompt=2600)
    report = serve(LITE, requests, policy="error", dry_run_target="sm90", cache_dir=cache_dir)
    assert report.serve_compiles == 0 and not report.monitor.misses
    # The workload used every warmed variant, except fused-MoE tile entries of step sizes it never ran.
    fused = {h for h, v in the_plan.variants.items() if v.kernel.endswith("fused_moe_kernel")}
    assert len(the_plan.variants) - len(fused) < report.monitor.hits <= len(the_plan.variants)
    assert all(len(o) == 3 for o in report.result.outputs)
    assert _entries(cache_dir) == before
    record = tmp_path / "record.jsonl"
    report.write_record(record)
    trace = check_trace(record, cache_dir)
    assert trace.ok and trace.launched == report.monitor.hits
    assert all(u["kernel"].endswith("fused_moe_kernel") for u in trace.unused)


# A launch spec tuned by batch size, the way vLLM #53567 went wrong: its num_warps (part of Triton's
# key) follows the row count by power-of-two buckets, which Triton's scalar classes do not see. The
# engine's own kernels never do this, so the test swaps it in for rms_norm to give the engine
# variants that batch sizes the warm-up never traced need.
def _tuned_rms_norm_launch(x, weight, out, eps, residual=None):
    launch = rms_norm_launch(x, weight, out, eps, residual)
    if launch is None:  # no rows (a step that samples nothing has no final-norm rows)
        return None
    num_warps = min(8, max(1, triton.next_power_of_2(x.shape[0]) // 4))  # rows 1-4: 1, 5-8: 2, 9-16: 4
    return Launch(grid=launch.grid, args=launch.args, constexprs=launch.constexprs, num_warps=num_warps,
                  num_stages=launch.num_stages, options=launch.options)


# Its own JITFunction of the same device code: the library's rms_norm kernel stays untouched.
tuned_rms_norm_jit = JitKernel(rms_norm_kernel.fn, _tuned_rms_norm_launch, name="tests.engine.tuned_rms_norm")


def _tuned_rms_norm(x, weight, eps=1e-6, residual=None):
    x2 = x.reshape(-1, x.shape[-1])
    out = torch.empty(x2.shape, dtype=x.dtype, device=x.device)
    tuned_rms_norm_jit(x2, weight, out, eps, residual)
    return (out.view(x.shape), residual) if residual is not None else out.view(x.shape)


@pytest.mark.slow
def test_unwarmed_batch_sizes_are_refused_and_found_by_check_trace(monkeypatch, tmp_path):
    monkeypatch.setitem(engine_ops.OPS, "triton", dataclasses.replace(engine_ops.TRITON, rms_norm=_tuned_rms_norm))
    served = ENGINES["tiny"]  # up to 4 requests and 32 tokens a step
    requests = [Request(0, list(range(7)), 2), Request(1, list(range(3)), 3, arrival_step=1)]  # a 7-row step

    # Warmed for a smaller engine (2 tokens a step): the start-up check finds the 16- and 32-row
    # variants (32: the fused MoE tile entry's step) of its three rms_norm calls (hidden, latent,
    # hidden with residual) missing, and the two fused MoE GEMMs of that tile entry, and refuses.
    declared = dataclasses.replace(served, max_batch_size=2, max_num_tokens=2, cuda_graph_batch_sizes=(1, 2))
    assert warm(engine_plan(declared, "sm90"), tmp_path).failed == 0
    with pytest.raises(JitPolicyError,
                       match=r"engine start refused: .* lacks 8 of .*\(fused_moe_kernel, tuned_rms_norm\)"):
        serve(served, requests, policy="error", dry_run_target="sm90", cache_dir=tmp_path)

    # Warmed for the served config, whose plan traces 1, 2 and 16 rows: a 7-row step still needs a
    # variant nobody warmed, and policy error stops at that launch, naming the kernel and variant.
    assert warm(engine_plan(served, "sm90"), tmp_path).failed == 0
    with pytest.raises(JitPolicyError, match=r"tests\.engine\.tuned_rms_norm would compile at serving time on sm90"):
        serve(served, requests, policy="error", dry_run_target="sm90", cache_dir=tmp_path)

    report = serve(served, requests, policy="warn", dry_run_target="sm90", cache_dir=tmp_path)
    record = tmp_path / "record.jsonl"
    report.write_record(record)
    lines = [json.loads(line) for line in record.read_text().splitlines()]
    assert {line["kernel"].rsplit(".", 1)[-1] for line in lines} >= TINY_KERNELS - {"rms_norm_kernel"}
    trace = check_trace(record, tmp_path)
    assert not trace.ok
    assert {m["first"]["tokens"] for m in trace.misses} == {7}
    assert all(m["kernel"] == "tests.engine.tuned_rms_norm" for m in trace.misses)
    assert trace.unused  # the 16-row variants: warmed, never used by this workload
    text = "\n".join(format_trace_report(trace, verbose=True))
    assert f"miss    {trace.misses[0]['id']}  tuned_rms_norm first at step 0 (batch=1, tokens=7)" in text
    folded = format_trace_report(trace)
    assert len(folded) <= 5 and folded[1].startswith(f"  missed: {len(trace.misses)} variant"), folded
    assert "tuned_rms_norm first at step 0 (batch=1, tokens=7)" in folded[1], folded


@pytest.mark.slow
def test_jit_policy_error_refuses_a_cache_without_its_c_launchers(lite_cache, tmp_path):
    """Where Triton builds a C launcher per kernel signature (3.6), a cache whose launchers are gone
    would run gcc on the first request: the engine refuses to start under ``error``."""
    import shutil

    from tritonwarm.jit.serving.c_launchers import builds_per_signature

    if not builds_per_signature("cuda"):
        pytest.skip("this Triton builds no C launcher per kernel signature")
    cache_dir = tmp_path / "cache"
    shutil.copytree(lite_cache[0], cache_dir)
    launchers = [p for p in cache_dir.glob("*/__triton_launcher*")]
    assert launchers  # warm-up built them
    for path in launchers:
        shutil.rmtree(path.parent)
    requests = make_workload(LITE, 2, 2, seed=3)
    with pytest.raises(JitPolicyError, match="C launchers"):
        serve(LITE, requests, policy="error", dry_run_target="sm90", cache_dir=cache_dir)
