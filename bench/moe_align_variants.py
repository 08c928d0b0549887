"""``moe_align_block_size``: where the time goes, and the paths and tile settings side by side.

    python bench/moe_align_variants.py [--json PATH] [--budget-s 45]

Per case (routed slots = tokens x top_k over num_experts experts, block_size) and per variant:

- ``whole``: the full call with ``triton.testing.do_bench`` (median). On a GPU this includes the
  device idling while the host prepares the next launch, so several Python launches show up here.
- ``host``: Python time per call, issued back to back without waiting for the device.
- ``graph``: the same call captured ``REPEATS`` times in one CUDA graph, replay time / ``REPEATS``:
  device time only, the host cost of launching gone.
- per stage (each kernel, and the host ``torch.full`` of the three-kernel path) alone, also
  replayed from a CUDA graph.

Variants: ``launcher`` (the public call, whichever path its rule picks), ``three_kernels`` (count ->
one-program scan -> scatter + a sentinel fill: the older large-size path, the baseline),
``expert_scan`` (count -> scan by slices of experts -> segment scatter, every output from kernels),
``count_place`` (count -> place, the place programs read the whole count table; a sweep of one-hot
size x warps), ``single`` (one program, two passes, one launch). Every variant's output is compared
with the PyTorch reference once per case; a wrong one is reported WRONG and not timed; a failing one
prints one line and the run goes on. Compiles stop being started once ``--budget-s`` seconds have
passed (the rest is reported as skipped).

Without a GPU every variant runs once at small sizes through Triton's interpreter and is checked;
nothing is timed and it exits 0 saying so.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable

import torch

sys.path.insert(0, os.path.dirname(__file__))
from _common import one_line, table  # noqa: E402
from tritonwarm.kernels.moe_align import moe_align_block_size_reference  # noqa: E402
from tritonwarm.launchers import moe_align as ma  # noqa: E402

REPEATS = 20  # calls per CUDA graph
# (tokens, top_k, num_experts, block_size); the first is the figure to beat.
GPU_CASES = [(16384, 6, 64, 16), (16384, 6, 64, 64), (4096, 6, 64, 16), (64, 6, 64, 16), (1, 6, 64, 16),
             (16384, 8, 256, 64)]
CPU_CASES = [(1, 6, 64, 16), (40, 6, 64, 16), (300, 6, 64, 64), (50, 8, 256, 64)]
PLACE_SWEEP = [(8192, 4), (16384, 4), (16384, 8), (32768, 8)]  # (one-hot elements, num_warps)
SINGLE_SWEEP = [(8192, 4), (16384, 8)]
PLACE_MAX_READS = 1 << 28  # count-table elements read by all place programs together
SINGLE_MAX_BENCH_NUMEL = 4096 * 6  # one program over more slots than this is not a contender


def routed_ids(tokens: int, top_k: int, num_experts: int, device: str, seed: int) -> torch.Tensor:
    """Router-like ids: top_k distinct experts per token, random scores; a few dropped (-1) slots."""
    g = torch.Generator(device=device).manual_seed(seed)
    ids = torch.rand(tokens, num_experts, generator=g, device=device).topk(top_k, dim=1).indices.to(torch.int32)
    if tokens > 8:
        ids[::97, -1] = -1  # an expert on another expert-parallel rank
    return ids


def variants(numel: int, num_experts: int) -> dict[str, Callable]:
    """name -> fn(flat_ids, block_size) returning the three outputs."""
    out: dict[str, Callable] = {  # the baseline first: the others' ratios are against it
        "three_kernels": lambda f, bs: ma.align_three_kernels(f, num_experts, bs),
        "launcher": lambda f, bs: ma.moe_align_block_size(f, num_experts, bs),
        "expert_scan": lambda f, bs: ma.align_expert_scan(f, num_experts, bs),
    }
    for one_hot, warps in PLACE_SWEEP:
        _, _, tiles = ma._tiling(numel, num_experts, one_hot)
        if tiles * tiles * num_experts > PLACE_MAX_READS:  # every program reads the whole table
            continue
        out[f"count_place oh{one_hot} w{warps}"] = (
            lambda f, bs, o=one_hot, w=warps: ma.align_count_place(f, num_experts, bs, one_hot=o, num_warps=w))
    if numel <= SINGLE_MAX_BENCH_NUMEL:
        for one_hot, warps in SINGLE_SWEEP:
            out[f"single oh{one_hot} w{warps}"] = (
                lambda f, bs, o=one_hot, w=warps: ma.align_single(f, num_experts, bs, one_hot=o, num_warps=w))
    return out


def stages(name: str, flat: torch.Tensor, num_experts: int, bs: int) -> dict[str, Callable]:
    """Each launch of a variant alone, on buffers allocated once (for per-kernel device time)."""
    numel = flat.numel()
    sorted_ids, expert_ids, post = ma._outputs(numel, num_experts, bs, flat.device)
    if name == "three_kernels":
        _, _, tiles = ma._tiling(numel, num_experts)
        counts = torch.empty((tiles, num_experts), dtype=torch.int32, device=flat.device)
        starts = torch.empty_like(counts)
        return {
            "full": lambda: torch.full(sorted_ids.shape, numel, dtype=torch.int32, device=flat.device),
            "count": lambda: ma.moe_align_count_jit(flat, counts, num_experts),
            "scan": lambda: ma.moe_align_scan_jit(flat, counts, starts, expert_ids, post, num_experts, bs),
            "scatter": lambda: ma.moe_align_scatter_jit(flat, starts, sorted_ids, num_experts),
        }
    if name == "expert_scan":
        _, _, tiles = ma._tiling(numel, num_experts)
        counts = torch.empty((tiles, num_experts), dtype=torch.int32, device=flat.device)
        starts = torch.empty_like(counts)
        totals = torch.empty((num_experts,), dtype=torch.int32, device=flat.device)
        return {
            "count": lambda: ma.moe_align_count_jit(flat, counts, num_experts),
            "expert_scan": lambda: ma.moe_align_expert_scan_jit(counts, starts, totals, num_experts),
            "segment_scatter": lambda: ma.moe_align_segment_scatter_jit(flat, starts, totals, sorted_ids, expert_ids,
                                                                        post, num_experts, bs),
        }
    if name.startswith("count_place"):
        one_hot, warps = (int(part[2:]) if i == 0 else int(part[1:]) for i, part in enumerate(name.split()[1:]))
        _, _, tiles = ma._tiling(numel, num_experts, one_hot)
        counts = torch.empty((tiles, num_experts), dtype=torch.int32, device=flat.device)
        kw = dict(one_hot=one_hot, num_warps=warps)
        return {
            "count": lambda: ma.moe_align_count_jit(flat, counts, num_experts, **kw),
            "place": lambda: ma.moe_align_place_jit(flat, counts, sorted_ids, expert_ids, post, num_experts, bs, **kw),
        }
    return {}


def agrees(got, want) -> bool:
    return all(g.dtype == torch.int32 and torch.equal(g.cpu(), w.cpu()) for g, w in zip(got, want, strict=True))


def run_on_cpu(json_path: str | None) -> None:
    checked, results = 0, []
    for tokens, top_k, num_experts, bs in CPU_CASES:
        ids = routed_ids(tokens, top_k, num_experts, "cpu", seed=tokens)
        want = moe_align_block_size_reference(ids, num_experts, bs)
        for name, fn in variants(ids.numel(), num_experts).items():
            label = f"{tokens}x{top_k} E{num_experts} bs{bs} {name}"
            try:
                ok = agrees(fn(ids.reshape(-1), bs), want)
                for stage in stages(name, ids.reshape(-1), num_experts, bs).values():
                    stage()
            except Exception as e:  # one line, then the next variant
                print(f"  {label}: FAILED {one_line(e)}")
                results.append({"case": label, "status": f"FAILED {one_line(e)}"})
                continue
            print(f"  {label}: {'ok' if ok else 'WRONG'}")
            results.append({"case": label, "status": "ok" if ok else "WRONG"})
            checked += ok
    if json_path:
        with open(json_path, "w") as f:
            json.dump({"device": None, "timed": False, "results": results}, f, indent=1)
    print(f"bench/moe_align_variants.py: no GPU here, nothing timed; {checked} variant runs checked against "
          "the reference in Triton's interpreter.")


def host_time_ms(fn: Callable, calls: int = 200) -> float:
    """Python time of one call, the device left to run behind (issue cost: the floor of ``whole``)."""
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    elapsed = time.perf_counter() - start
    torch.cuda.synchronize()
    return elapsed * 1e3 / calls


def graph_time_ms(fn: Callable, do_bench) -> float:
    """Device time of one ``fn()``: REPEATS calls captured in one CUDA graph, replayed."""
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(REPEATS):
            fn()
    return do_bench(graph.replay, warmup=5, rep=25) / REPEATS


def measured(label: str, measure: Callable) -> float | None:
    try:
        return measure()
    except Exception as e:  # one line; the other figures of the variant stand
        print(f"  {label}: FAILED {one_line(e)}")
        return None


def fmt(us: float | None) -> str:
    return "-" if us is None else f"{us:.1f}"


def ratio(baseline: dict | None, entry: dict, field: str) -> str:
    if not baseline or baseline.get(field) is None or entry.get(field) is None:
        return "-"
    return f"{baseline[field] / entry[field]:.2f}x"


def copy_bandwidth_gbs(do_bench) -> float:
    big = torch.empty(1 << 28, device="cuda", dtype=torch.uint8)
    return 2 * big.nbytes / do_bench(big.clone, rep=50) / 1e6


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", metavar="PATH", help="write every figure measured here as one JSON object")
    p.add_argument("--budget-s", type=float, default=45.0, help="start no new variant after this many seconds")
    args = p.parse_args()
    if not torch.cuda.is_available():
        run_on_cpu(args.json)
        return
    import triton
    from triton.testing import do_bench

    began = time.perf_counter()
    copy_gbs = copy_bandwidth_gbs(do_bench)
    report = {"device": torch.cuda.get_device_name(), "triton": triton.__version__, "torch": torch.__version__,
              "copy_gbs": copy_gbs, "repeats_per_graph": REPEATS, "results": []}
    rows = []
    for tokens, top_k, num_experts, bs in GPU_CASES:
        case = f"{tokens}x{top_k} E{num_experts} bs{bs}"
        ids = routed_ids(tokens, top_k, num_experts, "cuda", seed=tokens)
        flat = ids.reshape(-1)
        want = moe_align_block_size_reference(ids.cpu(), num_experts, bs)
        nbytes = 2 * flat.numel() * 4 + sum(w.numel() * 4 for w in want)  # ids read twice, outputs written
        baseline = None
        for name, fn in variants(flat.numel(), num_experts).items():
            entry = {"case": case, "variant": name, "tokens": tokens, "top_k": top_k, "num_experts": num_experts,
                     "block_size": bs, "path": ma.align_path(flat.numel(), num_experts) if name == "launcher" else name}
            report["results"].append(entry)
            if time.perf_counter() - began > args.budget_s:
                entry["status"] = "skipped (time budget)"
                continue
            try:
                if not agrees(fn(flat, bs), want):
                    entry["status"] = "WRONG"
                    rows.append([case, name, "WRONG", "", "", "", "", ""])
                    print(f"  {case} {name}: WRONG (differs from the reference)")
                    continue
                call = lambda fn=fn, flat=flat, bs=bs: fn(flat, bs)  # noqa: E731
                whole = do_bench(call, warmup=5, rep=25)
                host = host_time_ms(call)
            except Exception as e:  # one line, then the next variant
                entry["status"] = f"FAILED {one_line(e)}"
                print(f"  {case} {name}: {entry['status']}")
                continue
            # Device-only figures: a capture failure costs these, not the whole-call time above.
            graph = measured(f"{case} {name} graph", lambda call=call: graph_time_ms(call, do_bench))
            per_stage = {}
            for stage_name, stage in stages(name, flat, num_experts, bs).items():
                us = measured(f"{case} {name} {stage_name}", lambda stage=stage: graph_time_ms(stage, do_bench))
                per_stage[stage_name] = None if us is None else us * 1e3
            entry.update(status="ok", whole_us=whole * 1e3, host_us=host * 1e3,
                         graph_us=None if graph is None else graph * 1e3, stages_us=per_stage,
                         graph_gbs=None if graph is None else nbytes / graph / 1e6)
            if name == "three_kernels":
                baseline = entry
            rows.append([case, name if name != "launcher" else f"launcher ({entry['path']})",
                         f"{whole * 1e3:.1f}", f"{host * 1e3:.1f}", fmt(entry["graph_us"]),
                         " ".join(f"{s} {fmt(us)}" for s, us in per_stage.items()) or "-",
                         f"{ratio(baseline, entry, 'whole_us')} / {ratio(baseline, entry, 'graph_us')}",
                         "-" if graph is None else f"{entry['graph_gbs'] / copy_gbs:.1%}"])
    report["wall_s"] = time.perf_counter() - began
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    table(f"moe_align_block_size on {report['device']} (copy {copy_gbs:.0f} GB/s; graph = device time, "
          f"{REPEATS} calls per CUDA graph; ratio = three_kernels / variant, whole / graph)",
          ["case", "variant", "whole µs", "host µs", "graph µs", "stages µs (graph)", "vs three_kernels", "of copy"],
          rows, "python bench/moe_align_variants.py" + (f" --json {args.json}" if args.json else ""))


if __name__ == "__main__":
    main()
