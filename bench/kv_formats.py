"""Decode attention and the cache write in each MLA KV cache format, against the bf16 cache measured in
the same run (DeepSeek-V2-Lite geometry: 16 heads, 512 + 64 latent, 64-token blocks).

    python bench/kv_formats.py [--batches 1,16,64] [--context 4096] [--json PATH]

Per format and batch: the decode's time replayed as a CUDA graph (the kernels' own time), the KV
bytes it must read (the cache's bytes per token times the tokens attended), that as GB/s and as a
fraction of a plain device copy, and the time relative to the bf16 cache (> 1: the format is faster).
The write row times quantizing one step's tokens into the cache (bf16: the layout's indexed copy).

Without a GPU each path runs once at a small size on the CPU (Triton's interpreter, outputs compared
with the references); nothing is timed and it exits 0 saying so.
"""

from __future__ import annotations

import argparse
import math
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))
from _common import save_json, table  # noqa: E402

HEADS, RANK, ROPE, BLOCK = 16, 512, 64, 64
FORMATS = ("auto", "fp8_ds_mla", "nvfp4_ds_mla")


def build(kv_cache_dtype: str, batch: int, context: int, rank: int, rope: int, block: int, dev: str, dtype):
    """(decode callable, write callable, KV bytes the decode reads, output check)."""
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
    nbytes = batch * context * kv_bytes_per_token(kv_cache_dtype, rank, rope, dtype)
    return decode, write, nbytes, check


def run_on_cpu() -> None:
    for kv_cache_dtype in FORMATS:
        decode, write, _, check = build(kv_cache_dtype, 2, 40, 128, 16, 16, "cpu", torch.float32)
        write()
        check(decode())
        print(f"{kv_cache_dtype}: decode and write ran on the CPU (interpreter), output matches the reference")
    print("no GPU: nothing timed")


def _copy_gbs(do_bench) -> float:
    big = torch.empty(1 << 28, device="cuda", dtype=torch.uint8)
    return 2 * big.nbytes / do_bench(lambda: big.clone()) / 1e6


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batches", default="1,16,64", help="decode batch sizes, comma-separated")
    p.add_argument("--context", type=int, default=4096, help="tokens each request attends to")
    p.add_argument("--json", metavar="PATH", help="also write every figure here")
    args = p.parse_args()
    if not torch.cuda.is_available():
        run_on_cpu()
        return
    from triton.testing import do_bench, do_bench_cudagraph

    copy_gbs = _copy_gbs(do_bench)
    figures = {"device": torch.cuda.get_device_name(), "copy_gbs": copy_gbs, "context": args.context, "cases": {}}
    rows = []
    for batch in [int(b) for b in args.batches.split(",")]:
        bf16_us = None
        for kv_cache_dtype in FORMATS:
            name = f"{kv_cache_dtype} batch={batch}"
            try:
                decode, write, nbytes, check = build(kv_cache_dtype, batch, args.context, RANK, ROPE, BLOCK, "cuda",
                                                     torch.bfloat16)
                if batch == 1:
                    check(decode())
                decode_us = do_bench_cudagraph(decode, return_mode="median") * 1000
            except Exception as e:  # one broken case must not hide the others' figures
                print(f"  {name}: FAILED: {type(e).__name__}: {str(e)[:200]}", file=sys.stderr)
                rows.append([name, "FAILED", "-", "-", "-", "-", "-"])
                continue
            try:
                write_us = do_bench_cudagraph(write, return_mode="median") * 1000
            except Exception as e:
                print(f"  {name}: write: {type(e).__name__}: {str(e)[:200]}", file=sys.stderr)
                write_us = float("nan")
            bf16_us = decode_us if kv_cache_dtype == "auto" else bf16_us
            gbs = nbytes / decode_us / 1e3
            speedup = bf16_us / decode_us if bf16_us else float("nan")
            figures["cases"][name] = {"decode_us": decode_us, "write_us": write_us, "kv_bytes": nbytes, "gbs": gbs,
                                      "of_copy": gbs / copy_gbs, "vs_bf16": speedup}
            rows.append([name, f"{decode_us:.1f}", f"{nbytes / 2**20:.1f}", f"{gbs:.0f}", f"{gbs / copy_gbs:.0%}",
                         f"{speedup:.2f}x", f"{write_us:.1f}"])
            torch.cuda.empty_cache()
    table(f"MLA decode per KV cache format on {torch.cuda.get_device_name()} (device copy {copy_gbs:.0f} GB/s, "
          f"{args.context} tokens per request)",
          ["case", "decode µs (graph)", "KV MiB read", "GB/s", "of copy", "bf16 µs / this", "write µs (graph)"],
          rows, f"python bench/kv_formats.py --batches {args.batches} --context {args.context}")
    save_json(args.json, figures)


if __name__ == "__main__":
    main()
