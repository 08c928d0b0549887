"""Decode attention and the cache write in each MLA KV cache format, against the bf16 cache measured in
the same run (DeepSeek-V2-Lite geometry: 16 heads, 512 + 64 latent, 64-token blocks).

    python bench/kv_formats.py [--batches 1,16,64] [--context 4096] [--tiles N] [--budget S] [--json PATH]

Per format and batch: the decode's time replayed as a CUDA graph (the kernels' own time), the KV
bytes it must read (the cache's bytes per token times the tokens attended), that as GB/s and as a
fraction of a plain device copy, the time over the bf16 cache's time in the same run and the goal
for it (a quantized format: its bytes over bf16's, times 1.2). The write row times quantizing one
step's tokens into the cache (bf16: the layout's indexed copy).

``--tiles N`` also sweeps the first N candidate settings of the quantized decode (``CANDIDATES``:
tokens per tile, warps, pipeline stages, heads per program, parts per SM) for each quantized format
and batch, each checked against the shipped settings' output before it is timed, and prints the
fastest per format as entries of ``launchers/mla_kv_quant_tiles.json`` for this GPU's target.
Compiling a candidate takes seconds: ``--budget`` stops starting new ones after that many seconds.

Without a GPU each path runs once at a small size on the CPU (Triton's interpreter, outputs compared
with the references); nothing is timed and it exits 0 saying so.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(__file__))
from _common import save_json, table  # noqa: E402

HEADS, RANK, ROPE, BLOCK = 16, 512, 64, 64
FORMATS = ("auto", "fp8_ds_mla", "nvfp4_ds_mla")
# (block_n, num_warps, num_stages, block_h, parts_per_sm), most promising first: the shipped sm90
# entry; 32-token tiles with half the registers and shared memory, so two programs share an SM; a
# third stage; 8 warps on 32 tokens; 16-token tiles, four programs an SM.
CANDIDATES = [(64, 8, 2, 16, 1), (32, 4, 2, 16, 2), (64, 8, 3, 16, 1), (32, 8, 2, 16, 2), (32, 4, 3, 16, 2),
              (64, 4, 2, 16, 1), (16, 4, 3, 16, 4), (64, 8, 2, 16, 2)]


def build(kv_cache_dtype: str, batch: int, context: int, rank: int, rope: int, block: int, dev: str, dtype):
    """(decode callable, write callable, KV bytes the decode reads, output check, retile): ``retile()``
    is the decode with metadata made under the launcher's tiles as declared at that moment."""
    from tritonwarm.kernels.mla_kv_quant import quantized_mla_decode_attention_reference
    from tritonwarm.kernels.paged_attention import paged_decode_attention_reference
    from tritonwarm.launchers.kv_cache import KVCacheLayout
    from tritonwarm.launchers.kv_cache_formats import QuantizedMLALayout, kv_bytes_per_token, kv_format
    from tritonwarm.launchers.mla_kv_quant import (
        mla_kv_cache_write,
        quantized_mla_decode_attention,
        quantized_mla_decode_metadata,
        slots_of,
    )
    from tritonwarm.launchers.paged_attention import paged_decode_attention, paged_decode_metadata

    g = torch.Generator(device="cpu").manual_seed(0)
    blocks_per = math.ceil(context / block)
    num_blocks = batch * blocks_per
    table_ = torch.randperm(num_blocks, generator=g).to(torch.int32).view(batch, blocks_per).to(dev)
    seq_lens = torch.full((batch,), context, dtype=torch.int32, device=dev)
    q = torch.randn(batch, HEADS, rank + rope, generator=g).to(dtype).to(dev)
    latent = torch.randn(batch * context, rank, generator=g).to(dtype).to(dev)
    k_pe = torch.randn(batch * context, rope, generator=g).to(dtype).to(dev)
    positions = torch.arange(context, device=dev).repeat(batch)
    rows_table = table_.repeat_interleave(context, dim=0)
    step = slice(0, batch)  # one decode step: one new token per request
    scale = 1 / math.sqrt(128 + 64)
    if kv_cache_dtype == "auto":
        layout = KVCacheLayout.mla(num_blocks, block, rank, rope)
        cache = layout.allocate(dtype, dev)
        key = torch.cat([latent, k_pe], dim=-1)[:, None]
        layout.write(cache, rows_table, positions, key)
        metadata = paged_decode_metadata(seq_lens, table_, HEADS, 1, rank + rope, block)

        def decode():
            return paged_decode_attention(q, cache, table_, seq_lens, scale, metadata, rank)

        def write():
            layout.write(cache, rows_table[step], positions[step], key[step])

        def check(out):
            expected = paged_decode_attention_reference(q, cache, table_, seq_lens, scale, layout)
            torch.testing.assert_close(out.float(), expected.float(), atol=2e-2, rtol=2e-2)

        retile = None
    else:
        fmt = kv_format(kv_cache_dtype, rank, rope)
        cache = QuantizedMLALayout(fmt, num_blocks, block).allocate(dev)
        slots = slots_of(rows_table, positions, block)
        mla_kv_cache_write(cache, slots, latent, k_pe, kv_cache_dtype)
        metadata = quantized_mla_decode_metadata(seq_lens, table_, HEADS, block, kv_cache_dtype)

        def decode():
            return quantized_mla_decode_attention(q, cache, table_, seq_lens, scale, kv_cache_dtype, rank, metadata)

        def write():
            mla_kv_cache_write(cache, slots[step], latent[step], k_pe[step], kv_cache_dtype)

        def check(out):
            expected = quantized_mla_decode_attention_reference(q, cache, table_, seq_lens, scale, fmt)
            torch.testing.assert_close(out.float(), expected.float(), atol=2e-2, rtol=2e-2)

        def retile():
            tiled = quantized_mla_decode_metadata(seq_lens, table_, HEADS, block, kv_cache_dtype)
            return lambda: quantized_mla_decode_attention(q, cache, table_, seq_lens, scale, kv_cache_dtype, rank,
                                                          tiled)
    nbytes = batch * context * kv_bytes_per_token(kv_cache_dtype, rank, rope, dtype)
    return decode, write, nbytes, check, retile


def goal(kv_cache_dtype: str) -> float:
    """The most a format's decode may take over bf16's: its bytes per token over bf16's, times 1.2."""
    from tritonwarm.launchers.kv_cache_formats import kv_bytes_per_token

    ratio = kv_bytes_per_token(kv_cache_dtype, RANK, ROPE, torch.bfloat16) / kv_bytes_per_token("auto", RANK, ROPE,
                                                                                                 torch.bfloat16)
    return 1.0 if kv_cache_dtype == "auto" else 1.2 * ratio


@contextlib.contextmanager
def declared_tiles(kv_cache_dtype: str, candidate: tuple):
    """The launcher's declared tiles for ``kv_cache_dtype`` replaced by ``candidate`` inside the block."""
    from tritonwarm.launchers import mla_kv_quant as M

    shipped = M.quantized_tiles
    tiles = M.QuantizedTiles(*candidate)
    M.quantized_tiles = lambda name: tiles if name == kv_cache_dtype else shipped(name)
    try:
        yield tiles
    finally:
        M.quantized_tiles = shipped


def sweep_candidates(formats, batches, context, count: int, budget: float, dev: str, dtype, rank=RANK, rope=ROPE,
                     block=BLOCK, timer=None):
    """``{format: {candidate: {batch: µs or None}}}`` for the first ``count`` candidates, each checked
    against the shipped settings' output first (a mismatch or a failure raises, named, for that
    candidate only: listed under "failed"). ``timer(fn)`` gives µs (None: run once, untimed)."""
    start = time.perf_counter()
    results, failed, skipped = {}, [], 0
    for kv_cache_dtype in formats:
        for batch in batches:
            decode, _, _, _, retile = build(kv_cache_dtype, batch, context, rank, rope, block, dev, dtype)
            shipped = decode()
            for candidate in CANDIDATES[:count]:
                label = "N{} w{} s{} h{} p{}".format(*candidate)
                if time.perf_counter() - start > budget:
                    skipped += 1
                    continue
                try:
                    with declared_tiles(kv_cache_dtype, candidate):
                        run = retile()
                        torch.testing.assert_close(run().float(), shipped.float(), atol=2e-2, rtol=2e-2)
                        us = timer(run) if timer else None
                except Exception as e:  # a candidate that fails (shared memory, a wrong output) is one line
                    failed.append(f"{kv_cache_dtype} {label} batch={batch}: {type(e).__name__}: "
                                  f"{(str(e).strip().splitlines() or [''])[0][:160]}")
                    continue
                results.setdefault(kv_cache_dtype, {}).setdefault(label, {})[batch] = us
            del decode, retile, shipped
            if dev == "cuda":
                torch.cuda.empty_cache()
    return results, failed, skipped


def sweep_tiles(args, bf16_per_call: dict, copy_gbs: float) -> dict:
    """Each candidate x quantized format x batch: µs (graph), of copy, µs / bf16 µs; the best per format."""
    from triton.runtime import driver
    from triton.testing import do_bench_cudagraph
    from tritonwarm.launchers._attention_tiles import target_name
    from tritonwarm.launchers.kv_cache_formats import kv_bytes_per_token

    batches = [int(b) for b in args.batches.split(",")]
    results, failed, skipped = sweep_candidates(
        FORMATS[1:], batches, args.context, args.tiles, args.budget, "cuda", torch.bfloat16,
        timer=lambda fn: do_bench_cudagraph(fn, return_mode="median") * 1000)
    rows, best_lines = [], []
    for kv_cache_dtype, candidates in results.items():
        best = None
        for label, per_batch in candidates.items():
            ratios = []
            for batch, us in per_batch.items():
                gbs = batch * args.context * kv_bytes_per_token(kv_cache_dtype, RANK, ROPE, torch.bfloat16) / us / 1e3
                ratio = us / bf16_per_call[batch] if bf16_per_call.get(batch) else float("nan")
                ratios.append(ratio)
                rows.append([kv_cache_dtype, label, batch, f"{us:.1f}", f"{gbs / copy_gbs:.0%}", f"{ratio:.2f}",
                             f"<= {goal(kv_cache_dtype):.2f}"])
            if len(per_batch) == len(batches) and (best is None or sum(ratios) < best[0]):
                best = (sum(ratios), label)
        if best is not None:
            candidate = CANDIDATES[[("N{} w{} s{} h{} p{}".format(*c)) for c in CANDIDATES].index(best[1])]
            names = ("block_n", "num_warps", "num_stages", "block_h", "parts_per_sm")
            fields = dict(zip(names, candidate, strict=True))
            best_lines.append(f'"{kv_cache_dtype}": {json.dumps(fields)}')
    table(f"Quantized MLA decode tile candidates ({args.context} tokens per request; µs as CUDA graph, against the "
          "bf16 rows above)", ["format", "candidate", "batch", "µs", "of copy", "µs / bf16 µs", "goal"], rows,
          f"python bench/kv_formats.py --batches {args.batches} --context {args.context} --tiles {args.tiles}")
    for line in failed:
        print(f"  FAILED {line}")
    if skipped:
        print(f"  {skipped} candidate runs skipped past the {args.budget:.0f} s budget")
    target = target_name(driver.active.get_current_target())
    print(f"\nFastest per format (the least sum of µs / bf16 µs over the batches), as "
          f"launchers/mla_kv_quant_tiles.json entries of \"{target}\":")
    for line in best_lines:
        print("  " + line)
    return {"target": target, "candidates": results, "best": best_lines, "failed": failed, "skipped": skipped}


def run_on_cpu(tiles: int) -> None:
    for kv_cache_dtype in FORMATS:
        decode, write, _, check, _ = build(kv_cache_dtype, 2, 40, 128, 16, 16, "cpu", torch.float32)
        write()
        check(decode())
        print(f"{kv_cache_dtype}: decode and write ran on the CPU (interpreter), output matches the reference")
    if tiles:
        results, failed, _ = sweep_candidates(FORMATS[1:], [2], 70, tiles, float("inf"), "cpu", torch.bfloat16,
                                              rank=128, rope=16, block=16)
        runs = sum(len(c) for c in results.values())
        print(f"tile candidates: {runs} ran on the CPU (interpreter) and matched the shipped settings, "
              f"{len(failed)} failed")
        for line in failed:
            print(f"  FAILED {line}")
    print("no GPU: nothing timed")


def _copy_gbs(do_bench) -> float:
    big = torch.empty(1 << 28, device="cuda", dtype=torch.uint8)
    return 2 * big.nbytes / do_bench(lambda: big.clone()) / 1e6


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batches", default="1,16,64", help="decode batch sizes, comma-separated")
    p.add_argument("--context", type=int, default=4096, help="tokens each request attends to")
    p.add_argument("--tiles", type=int, default=0, metavar="N",
                   help=f"also sweep the first N of the {len(CANDIDATES)} candidate tile settings")
    p.add_argument("--budget", type=float, default=90.0, help="seconds after which no new candidate starts")
    p.add_argument("--json", metavar="PATH", help="also write every figure here")
    args = p.parse_args()
    if not torch.cuda.is_available():
        run_on_cpu(args.tiles)
        return
    from triton.testing import do_bench, do_bench_cudagraph

    copy_gbs = _copy_gbs(do_bench)
    figures = {"device": torch.cuda.get_device_name(), "copy_gbs": copy_gbs, "context": args.context, "cases": {}}
    rows = []
    bf16_per_call: dict[int, float | None] = {}
    for batch in [int(b) for b in args.batches.split(",")]:
        bf16_us = None
        for kv_cache_dtype in FORMATS:
            name = f"{kv_cache_dtype} batch={batch}"
            try:
                decode, write, nbytes, check, _ = build(kv_cache_dtype, batch, args.context, RANK, ROPE, BLOCK,
                                                        "cuda", torch.bfloat16)
                if batch == 1:
                    check(decode())
                decode_us = do_bench_cudagraph(decode, return_mode="median") * 1000
            except Exception as e:  # one broken case must not hide the others' figures
                print(f"  {name}: FAILED: {type(e).__name__}: {str(e)[:200]}", file=sys.stderr)
                rows.append([name, "FAILED", "-", "-", "-", "-", "-", "-"])
                continue
            try:
                write_us = do_bench_cudagraph(write, return_mode="median") * 1000
            except Exception as e:
                print(f"  {name}: write: {type(e).__name__}: {str(e)[:200]}", file=sys.stderr)
                write_us = float("nan")
            bf16_us = decode_us if kv_cache_dtype == "auto" else bf16_us
            bf16_per_call[batch] = bf16_us
            gbs = nbytes / decode_us / 1e3
            ratio = decode_us / bf16_us if bf16_us else float("nan")
            figures["cases"][name] = {"decode_us": decode_us, "write_us": write_us, "kv_bytes": nbytes, "gbs": gbs,
                                      "of_copy": gbs / copy_gbs, "vs_bf16": ratio, "goal": goal(kv_cache_dtype)}
            rows.append([name, f"{decode_us:.1f}", f"{nbytes / 2**20:.1f}", f"{gbs:.0f}", f"{gbs / copy_gbs:.0%}",
                         f"{ratio:.2f}", f"<= {goal(kv_cache_dtype):.2f}", f"{write_us:.1f}"])
            torch.cuda.empty_cache()
    table(f"MLA decode per KV cache format on {torch.cuda.get_device_name()} (device copy {copy_gbs:.0f} GB/s, "
          f"{args.context} tokens per request)",
          ["case", "decode µs (graph)", "KV MiB read", "GB/s", "of copy", "µs / bf16 µs", "goal", "write µs (graph)"],
          rows, f"python bench/kv_formats.py --batches {args.batches} --context {args.context}")
    if args.tiles:
        figures["tiles"] = sweep_tiles(args, bf16_per_call, copy_gbs)
    save_json(args.json, figures)


if __name__ == "__main__":
    main()
