"""Fused MoE tile configs measured, not guessed: at DeepSeek-V2-Lite's expert shape (64 experts,
hidden 2048, intermediate 1408, top-6, bf16 activations), for each M (tokens per call) the shipped
table's entry against a few candidates, bf16, MXFP4 and NVFP4 weights, beside the eager per-expert loop and
the weight-bytes roofline (each routed expert's weights read once), with a device copy's bandwidth
measured in the same run.

    python bench/fused_moe_tiles.py [--json PATH] [--tokens 1 16 64 256 1024 4096] [--sweep small|full]
                                    [--emit-tables DIR]

The fastest correct config per M and weight format is printed in vLLM's ``fused_moe`` config format
(and with ``--emit-tables DIR`` written as ``<target>.json``, ``<target>_mxfp4.json`` and
``<target>_nvfp4.json``), ready to be saved as the target's tables in ``launchers/fused_moe_configs/``.
The last table has one row per M and format: the fastest config's µs, its share of copy bandwidth
on the bytes it must read (each routed expert's weights once, plus activations), TFLOP/s, and its
time over bf16's fastest measured in the same run. ``--sweep small`` (the default, about two minutes
on an H200 with compiles) tries the table's entry and one or two candidates per M; ``full`` all.
A config is timed as the whole op (alignment, both GEMMs, the top-k sum) replayed from a CUDA graph,
so that small M measures the GPU, not the host;
the shipped entry is also timed as an eager call (host included) for comparison. Every variant's
output is checked once against the PyTorch reference; a wrong one is reported WRONG, not timed.

Compiles dominate a short run: before timing, the variants compile in parallel worker processes
(``--jobs``) into Triton's on-disk cache, from which this process then loads them.

Without a GPU every variant runs once at a tiny size in Triton's interpreter and is checked; nothing
is timed and it exits 0.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import time
from dataclasses import asdict

import torch

sys.path.insert(0, os.path.dirname(__file__))
from _common import one_line, save_json, table  # noqa: E402

EXPERTS, HIDDEN, INTER, TOP_K = 64, 2048, 1408, 6
TOKENS = (1, 16, 64, 256, 1024, 4096)
FORMATS = ("bf16", "mxfp4", "nvfp4")


def _cfg(m, n, k, g, w, s):
    from tritonwarm.launchers.fused_moe import TileConfig

    return TileConfig(m, n, k, g, w, s)


def candidates() -> dict[str, object]:
    """Named candidates beside the shipped table; anchored on vLLM's published H100/H200 configs.
    Small M: one expert's rows fit one 16-row block, the GEMM is a weight stream (GEMV-like): wide K
    tiles and deep pipelines keep more bytes in flight. Large M: 64/128-row blocks reuse each weight
    tile across rows; GROUP_M keeps a column block in L2 while its row blocks pass."""
    return {
        "16x64x128 w4 s4": _cfg(16, 64, 128, 1, 4, 4),
        "16x128x128 w4 s3": _cfg(16, 128, 128, 1, 4, 3),
        "16x64x256 w4 s3": _cfg(16, 64, 256, 1, 4, 3),
        "32x64x128 g8 w4 s4": _cfg(32, 64, 128, 8, 4, 4),
        "64x128x64 g16 w4 s3": _cfg(64, 128, 64, 16, 4, 3),
        "64x128x64 g16 w4 s4": _cfg(64, 128, 64, 16, 4, 4),
        "128x128x64 g16 w8 s3": _cfg(128, 128, 64, 16, 8, 3),
        "128x128x64 g16 w8 s4": _cfg(128, 128, 64, 16, 8, 4),
        "64x256x64 g32 w8 s3": _cfg(64, 256, 64, 32, 8, 3),
        "16x128x256 w4 s2": _cfg(16, 128, 256, 1, 4, 2),
        "32x128x128 g8 w4 s3": _cfg(32, 128, 128, 8, 4, 3),
        "128x256x64 g16 w8 s3": _cfg(128, 256, 64, 16, 8, 3),
    }


PER_M = {  # candidate names tried at each M with --sweep full, beside the shipped table's entry
    1: ["16x64x128 w4 s4", "16x128x128 w4 s3", "16x64x256 w4 s3"],
    16: ["16x64x128 w4 s4", "16x128x128 w4 s3", "16x64x256 w4 s3"],
    64: ["16x64x128 w4 s4", "16x128x128 w4 s3", "16x128x256 w4 s2"],
    256: ["16x128x128 w4 s3", "32x64x128 g8 w4 s4", "32x128x128 g8 w4 s3", "64x128x64 g16 w4 s3"],
    1024: ["64x128x64 g16 w4 s4", "128x128x64 g16 w8 s3", "128x128x64 g16 w8 s4", "64x256x64 g32 w8 s3"],
    4096: ["64x128x64 g16 w4 s4", "128x128x64 g16 w8 s3", "128x128x64 g16 w8 s4", "64x256x64 g32 w8 s3",
           "128x256x64 g16 w8 s3"],
}
SMALL_SWEEP = {  # the default sweep: the candidates the SASS counts and the last H200 run point at
    1: ["16x64x128 w4 s4"],
    16: ["16x64x128 w4 s4", "16x128x128 w4 s3"],
    64: ["16x64x128 w4 s4", "16x128x256 w4 s2"],
    256: ["32x128x128 g8 w4 s3", "64x128x64 g16 w4 s3"],
    1024: ["128x128x64 g16 w8 s4", "64x128x64 g16 w4 s4"],
    4096: ["128x128x64 g16 w8 s4", "128x256x64 g16 w8 s3"],
}


def vllm_entry(config) -> dict:
    return {"BLOCK_SIZE_M": config.block_m, "BLOCK_SIZE_N": config.block_n, "BLOCK_SIZE_K": config.block_k,
            "GROUP_SIZE_M": config.group_m, "num_warps": config.num_warps, "num_stages": config.num_stages}


def variants(tokens, fmt: str = "bf16", sweep: str = "full") -> list[tuple[int, str, object]]:
    """(M, name, config) for every M: the entry of the table this target's runtime uses for ``fmt``
    first ("table"), default.json's where that differs, then the candidates (each config once per M)."""
    from tritonwarm.launchers.fused_moe import active_tile_table, load_tile_table

    shipped, default = active_tile_table(fmt), load_tile_table()
    pool = candidates()
    per_m = SMALL_SWEEP if sweep == "small" else PER_M
    out = []
    for m in tokens:
        seen = set()
        named = [("table", shipped.select(m)), ("default.json", default.select(m))]
        named += [(name, pool[name]) for name in per_m.get(m, per_m[min(per_m, key=lambda k: abs(k - m))])]
        for name, config in named:
            if config not in seen:
                seen.add(config)
                out.append((m, name, config))
    return out


class Layer:
    """One MoE layer's weights in a format, its call and its reference."""

    def __init__(self, fmt: str, w_gate_up, w_down, dev):
        from tritonwarm import launchers as L

        self.fmt = fmt
        if fmt == "bf16":
            self.weights = (w_gate_up, w_down)
            self.dense = (w_gate_up, w_down)
            self.nbytes_per_expert = (w_gate_up[0].nbytes + w_down[0].nbytes)
        elif fmt == "mxfp4":  # the reference uses the exact dequantized weights
            gu, gu_s = L.mxfp4_quantize(w_gate_up)
            dn, dn_s = L.mxfp4_quantize(w_down)
            self.weights = (gu, gu_s, dn, dn_s)
            self.dense = (L.mxfp4_dequantize(gu, gu_s, w_gate_up.dtype), L.mxfp4_dequantize(dn, dn_s, w_down.dtype))
            self.nbytes_per_expert = gu[0].nbytes + gu_s[0].nbytes + dn[0].nbytes + dn_s[0].nbytes
        else:  # nvfp4, one global scale per expert; the reference dequantizes as nvfp4_dequantize rounds
            gu, gu_s, gu_g, gu_dense = _nvfp4_per_expert(w_gate_up)
            dn, dn_s, dn_g, dn_dense = _nvfp4_per_expert(w_down)
            self.weights = (gu, gu_s, gu_g, dn, dn_s, dn_g)
            self.dense = (gu_dense, dn_dense)
            self.nbytes_per_expert = gu[0].nbytes + gu_s[0].nbytes + dn[0].nbytes + dn_s[0].nbytes + 8

    def call(self, hidden, topk_w, ids, table):
        from tritonwarm import launchers as L

        call = {"bf16": L.fused_moe, "mxfp4": L.fused_moe_mxfp4, "nvfp4": L.fused_moe_nvfp4}[self.fmt]
        return call(hidden, *self.weights, topk_w, ids, tile_table=table)

    def reference(self, hidden, topk_w, ids):
        from tritonwarm.kernels.fused_moe import fused_moe_reference

        return fused_moe_reference(hidden, *self.dense, topk_w, ids)


def _nvfp4_per_expert(w):
    """(packed, scales, global scales [E], dequantized) with each expert's global scale 448 * 6 / amax."""
    from tritonwarm import launchers as L

    global_scales = (448.0 * 6.0 / w.float().abs().amax(dim=(1, 2))).contiguous()
    parts = [L.nvfp4_quantize(w[e], global_scales[e]) for e in range(w.shape[0])]
    dense = [L.nvfp4_dequantize(p, sc, global_scales[e], w.dtype) for e, (p, sc) in enumerate(parts)]
    return (torch.stack([p for p, _ in parts]), torch.stack([sc for _, sc in parts]), global_scales,
            torch.stack(dense))


def make_weights(dev, experts, hidden, inter, seed=0):
    g = torch.Generator(device=dev).manual_seed(seed)
    w_gu = (torch.randn(experts, 2 * inter, hidden, device=dev, generator=g) / hidden**0.5).to(torch.bfloat16)
    w_dn = (torch.randn(experts, hidden, inter, device=dev, generator=g) / inter**0.5).to(torch.bfloat16)
    return w_gu, w_dn


def make_tokens(m, dev, experts, hidden, top_k, seed):
    g = torch.Generator(device=dev).manual_seed(seed)
    hidden_states = torch.randn(m, hidden, device=dev, generator=g).to(torch.bfloat16)
    scores = torch.rand(m, experts, device=dev, generator=g)
    topk_w, ids = torch.topk(scores.softmax(-1), top_k, dim=-1)
    return hidden_states, topk_w.float(), ids.to(torch.int32)


def rel_error(got, want) -> float:
    return float((got.float() - want.float()).abs().max() / want.float().abs().max().clamp_min(1e-6))


TOLERANCE = 2e-2  # relative to the output's largest magnitude: bf16 intermediate rounding, summation order


def _table(m, config):
    from tritonwarm.launchers.fused_moe import TileTable

    return TileTable((m,), (config,))


# ----------------------------------------------------------------------------- parallel compile

def _compile_worker(jobs: list[tuple[str, tuple]]) -> list[str]:
    """In a fresh process: one real call per (format, config) at M = 1, which compiles both GEMMs
    of that config into Triton's on-disk cache. Returns one line per failure."""
    from tritonwarm.launchers.fused_moe import TileConfig

    dev = "cuda"
    w_gu = torch.empty(EXPERTS, 2 * INTER, HIDDEN, device=dev, dtype=torch.bfloat16).normal_(0, 0.02)
    w_dn = torch.empty(EXPERTS, HIDDEN, INTER, device=dev, dtype=torch.bfloat16).normal_(0, 0.02)
    layers = {}
    h, tw, ids = make_tokens(1, dev, EXPERTS, HIDDEN, TOP_K, 0)
    failures = []
    for fmt, fields in jobs:
        config = TileConfig(*fields)
        try:
            layer = layers.get(fmt) or layers.setdefault(fmt, Layer(fmt, w_gu, w_dn, dev))
            layer.call(h, tw, ids, _table(1, config))
            torch.cuda.synchronize()
        except Exception as e:  # reported by the timing pass too; one line here
            failures.append(f"{fmt} {fields}: {one_line(e)}")
    return failures


def precompile(work: list[tuple[str, object]], jobs: int) -> float:
    """Compile every distinct (format, config) in ``jobs`` spawned processes; seconds taken."""
    import concurrent.futures as cf
    import multiprocessing as mp

    distinct = sorted({(fmt, tuple(asdict(c).values())) for fmt, c in work})
    start = time.perf_counter()
    if jobs <= 1 or not distinct:
        return 0.0
    chunks = [distinct[i::jobs] for i in range(min(jobs, len(distinct)))]
    try:
        with cf.ProcessPoolExecutor(len(chunks), mp_context=mp.get_context("spawn")) as pool:
            for failures in pool.map(_compile_worker, chunks):
                for line in failures:
                    print(f"  precompile: {line}", file=sys.stderr)
    except Exception as e:  # compiling in this process instead is only slower
        print(f"  precompile skipped: {type(e).__name__}: {e}", file=sys.stderr)
    return time.perf_counter() - start


# ----------------------------------------------------------------------------- runs

def run_cpu(sweep: str = "small") -> None:
    """Every variant once at a tiny size in the interpreter, checked against the reference."""
    experts, hidden, inter, top_k = 8, 64, 32, 2
    w_gu, w_dn = make_weights("cpu", experts, hidden, inter)
    layers = [Layer(fmt, w_gu, w_dn, "cpu") for fmt in FORMATS]
    checked, wrong = 0, []
    for m, name, config in variants(TOKENS, sweep=sweep):
        h, tw, ids = make_tokens(min(m, 5), "cpu", experts, hidden, top_k, m)
        for layer in layers:
            try:
                err = rel_error(layer.call(h, tw, ids, _table(m, config)), layer.reference(h, tw, ids))
            except Exception as e:
                wrong.append(f"M={m} {layer.fmt} {name}: FAILED {type(e).__name__}: {e}")
                continue
            checked += 1
            if not err <= TOLERANCE:
                wrong.append(f"M={m} {layer.fmt} {name}: WRONG (relative error {err:.3g})")
    for line in wrong:
        print(line)
    print(f"bench/fused_moe_tiles.py: no GPU here, nothing timed; {checked} variants ran once in Triton's "
          f"interpreter at {experts} experts, {hidden}/{inter}, top-{top_k}; {len(wrong)} wrong or failed.")


def _eager_moe_loop():
    """bench/kernels.py's per-expert loop, loaded by path (a ``kernels`` package may shadow the name)."""
    import importlib.util

    path = os.path.join(os.path.dirname(__file__), "kernels.py")
    spec = importlib.util.spec_from_file_location("bench_kernels", path)
    module = sys.modules[spec.name] = importlib.util.module_from_spec(spec)  # dataclasses look it up there
    spec.loader.exec_module(module)
    return module._moe_loop


def _bench_graph(fn) -> float:
    """Median ms of ``fn`` replayed from a CUDA graph (the GPU's time, no host launch overhead)."""
    from triton.testing import do_bench_cudagraph

    return do_bench_cudagraph(fn, rep=20, return_mode="median")


def _bench_eager(fn) -> float:
    from triton.testing import do_bench

    return do_bench(fn, warmup=5, rep=25, return_mode="median")


def run_gpu(args) -> dict:
    dev = "cuda"
    started = time.perf_counter()
    formats = args.formats
    work = {fmt: variants(args.tokens, fmt, args.sweep) for fmt in formats}
    compile_s = precompile([(fmt, c) for fmt in formats for _, _, c in work[fmt]], args.jobs)

    big = torch.empty(1 << 28, device=dev, dtype=torch.uint8)
    copy_ms = _bench_eager(big.clone)
    copy_gbs = 2 * big.nbytes / copy_ms / 1e6
    del big
    w_gu, w_dn = make_weights(dev, EXPERTS, HIDDEN, INTER)
    layers = {fmt: Layer(fmt, w_gu, w_dn, dev) for fmt in formats}
    moe_loop = _eager_moe_loop()

    results, rows, best = [], [], {fmt: {} for fmt in formats}
    inputs = {}  # M -> (hidden, topk weights, ids, experts hit, eager loop ms)
    for m in args.tokens:
        h, tw, ids = make_tokens(m, dev, EXPERTS, HIDDEN, TOP_K, m)
        try:
            loop_ms = _bench_eager(lambda h=h, tw=tw, ids=ids: moe_loop(h, w_gu, w_dn, tw, ids))
        except Exception as e:
            loop_ms = None
            print(f"M={m}: eager loop failed: {type(e).__name__}: {e}", file=sys.stderr)
        inputs[m] = (h, tw, ids, int(torch.unique(ids).numel()), loop_ms)
    # format by format, so that a run past its budget loses the newest format's figures first
    for fmt, layer in layers.items():
        for m in args.tokens:
            h, tw, ids, experts_hit, loop_ms = inputs[m]
            want = layer.reference(h, tw, ids)
            roof_bytes = experts_hit * layer.nbytes_per_expert + 2 * h.nbytes
            flops = 2 * m * TOP_K * 3 * INTER * HIDDEN  # gate/up (2I x H) and down (H x I) per slot
            for vm, name, config in work[fmt]:
                if vm != m:
                    continue
                if time.perf_counter() - started > args.budget_s:
                    print(f"M={m} {fmt} {name}: skipped (past the {args.budget_s:.0f} s budget)")
                    continue
                rec = {"M": m, "format": fmt, "variant": name, "config": vllm_entry(config),
                       "experts_hit": experts_hit, "roofline_bytes": roof_bytes, "eager_loop_ms": loop_ms}
                table_ = _table(m, config)
                try:
                    err = rel_error(layer.call(h, tw, ids, table_), want)
                    rec["rel_error"] = err
                    if not err <= TOLERANCE:
                        rec["status"] = "WRONG"
                    else:
                        call = functools.partial(layer.call, h, tw, ids, table_)
                        rec["graph_ms"] = _bench_graph(call)
                        if name == "table":
                            rec["eager_ms"] = _bench_eager(call)
                        rec["status"] = "ok"
                        rec["gbs"] = roof_bytes / rec["graph_ms"] / 1e6
                        rec["of_copy"] = rec["gbs"] / copy_gbs
                        rec["tflops"] = flops / rec["graph_ms"] / 1e9
                except Exception as e:
                    rec["status"] = f"FAILED {one_line(e)}"
                    print(f"M={m} {fmt} {name}: {rec['status']}")
                results.append(rec)
            ok = [r for r in results if r["M"] == m and r["format"] == fmt and r["status"] == "ok"]
            if ok:
                win = min(ok, key=lambda r: r["graph_ms"])
                shipped = next((r for r in ok if r["variant"] == "table"), None)
                best[fmt][str(m)] = win["config"]
                rows.append([m, fmt, experts_hit, f"{shipped['graph_ms'] * 1e3:.1f}" if shipped else "-",
                             f"{shipped['eager_ms'] * 1e3:.1f}" if shipped else "-", win["variant"],
                             f"{win['graph_ms'] * 1e3:.1f}", f"{loop_ms * 1e3:.1f}" if loop_ms else "-",
                             f"{loop_ms / win['graph_ms']:.1f}x" if loop_ms else "-",
                             f"{win['gbs']:.0f}", f"{win['of_copy']:.0%}", f"{win['tflops']:.0f}"])
    rows.sort(key=lambda row: (row[0], formats.index(row[1])))
    fastest = {(r[0], r[1]): float(r[6]) for r in rows}
    for row in rows:  # time over bf16's fastest at the same M, measured in this run
        base = fastest.get((row[0], "bf16"))
        row.append(f"{float(row[6]) / base:.2f}x" if base else "-")
    from triton.runtime import driver
    from tritonwarm.jit.core.targets import target_from_gpu_target
    from tritonwarm.launchers.fused_moe import target_table_path

    target = target_from_gpu_target(driver.active.get_current_target()).name
    return {"device": torch.cuda.get_device_name(), "target": target,
            "table_file": target_table_path(target).name, "copy_gbs": copy_gbs, "precompile_s": compile_s,
            "total_s": time.perf_counter() - started, "shape": {"experts": EXPERTS, "hidden": HIDDEN,
            "intermediate": INTER, "top_k": TOP_K}, "results": results, "best_tables": best, "rows": rows}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", help="write every measured figure to this file")
    p.add_argument("--tokens", type=int, nargs="+", default=list(TOKENS))
    p.add_argument("--formats", nargs="+", default=list(FORMATS), choices=FORMATS)
    p.add_argument("--jobs", type=int, default=min(12, os.cpu_count() or 1), help="compile processes")
    p.add_argument("--budget-s", type=float, default=100.0, help="stop starting new variants after this many seconds")
    p.add_argument("--sweep", choices=("small", "full"), default="small",
                   help="candidates per M: small (about 2 min on an H200 with compiles) or full")
    p.add_argument("--emit-tables", metavar="DIR",
                   help="write the fastest config per M of each format here as the target's tables")
    args = p.parse_args()
    if not torch.cuda.is_available():
        run_cpu(args.sweep)
        return
    data = run_gpu(args)
    save_json(args.json, data)
    for fmt, best in data["best_tables"].items():
        print(f"\nfastest config per M, {fmt} weights (vLLM fused_moe format):")
        print(json.dumps(best, indent=1))
    if args.emit_tables:
        os.makedirs(args.emit_tables, exist_ok=True)
        for fmt, best in data["best_tables"].items():
            if best:
                name = data["target"] + ("" if fmt == "bf16" else f"_{fmt}")
                with open(os.path.join(args.emit_tables, f"{name}.json"), "w") as f:
                    json.dump(best, f, indent=1)
    table(f"Fused MoE tiles on {data['device']} ({data['target']}, table {data['table_file']}; 64 experts, "
          f"2048/1408, top-6; device copy {data['copy_gbs']:.0f} GB/s; {data['total_s']:.0f} s, "
          f"{data['precompile_s']:.0f} s of it compiling)",
          ["M", "weights", "experts hit", "table µs (graph)", "table µs (eager)", "fastest", "µs",
           "eager loop µs", "loop / fastest", "GB/s (weights once)", "of copy", "TFLOP/s", "vs bf16"],
          data["rows"], f"python bench/fused_moe_tiles.py --sweep {args.sweep} --json moe.json")


if __name__ == "__main__":
    main()
