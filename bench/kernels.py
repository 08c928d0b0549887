"""Each kernel's time and achieved memory bandwidth on a GPU, against its PyTorch reference on
the same inputs, with the fraction of a plain device copy's bandwidth measured in the same run.

    python bench/kernels.py [--tokens 4096]

Needs a GPU (CUDA or ROCm); on a machine without one it says so and exits 0.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))
from _common import table  # noqa: E402


def cases(tokens: int):
    """(name, triton call, reference call, bytes moved) at DeepSeek-V2-Lite / Llama-3.1-8B shapes."""
    from tritonwarm import launchers as L
    from tritonwarm.kernels import activation, fp4, kv_block_zero, moe_routing, paged_attention, rms_norm, rotary

    dev, bf16 = "cuda", torch.bfloat16
    x = torch.randn(tokens, 4096, device=dev, dtype=bf16)
    w = torch.randn(4096, device=dev, dtype=bf16)
    yield "rms_norm 4096", lambda: L.rms_norm(x, w), lambda: rms_norm.rms_norm_reference(x, w), 2 * x.nbytes + w.nbytes
    g = torch.randn(tokens, 2 * 14336, device=dev, dtype=bf16)
    yield ("silu_and_mul 14336", lambda: L.silu_and_mul(g), lambda: activation.silu_and_mul_reference(g),
           g.nbytes * 3 // 2)
    q = torch.randn(tokens, 32, 128, device=dev, dtype=bf16)
    k = torch.randn(tokens, 8, 128, device=dev, dtype=bf16)
    cache = torch.randn(8192, 128, device=dev, dtype=torch.float32)
    pos = torch.randint(0, 8192, (tokens,), device=dev)
    yield ("rotary 32q/8k x 128", lambda: L.rotary_embedding(pos, q, k, cache),
           lambda: rotary.rotary_embedding_reference(pos, q.clone(), k.clone(), cache), 2 * (q.nbytes + k.nbytes))
    logits = torch.randn(tokens, 64, device=dev, dtype=bf16)
    yield ("moe_topk_routing 64/top6", lambda: L.moe_topk_routing(logits, 6),
           lambda: moe_routing.moe_topk_routing_reference(logits, 6), logits.nbytes + tokens * 6 * 8)
    xq = torch.randn(tokens, 7168, device=dev, dtype=bf16)
    yield ("mxfp4_quantize 7168", lambda: L.mxfp4_quantize(xq), lambda: fp4.mxfp4_quantize_reference(xq),
           xq.nbytes + xq.numel() // 2 + xq.numel() // 32)
    packed, scales = L.mxfp4_quantize(xq)
    yield ("mxfp4_dequantize 7168", lambda: L.mxfp4_dequantize(packed, scales, bf16),
           lambda: fp4.mxfp4_dequantize_reference(packed, scales, bf16), xq.nbytes + packed.nbytes + scales.nbytes)
    layout = L.KVCacheLayout.mla(num_blocks=4096, block_size=64, kv_lora_rank=512, rope_dim=64)
    kv = layout.allocate(bf16, dev)
    batch, seq = 64, 2048
    tables = torch.arange(batch * seq // 64, device=dev, dtype=torch.int32).view(batch, -1)
    lens = torch.full((batch,), seq, device=dev, dtype=torch.int32)
    qa = torch.randn(batch, 16, 576, device=dev, dtype=bf16)
    yield ("paged MLA decode 64x2048", lambda: L.paged_decode_attention(qa, kv, tables, lens, 0.04, v_head_dim=512),
           lambda: paged_attention.paged_decode_attention_reference(qa, kv, tables, lens, 0.04, layout),
           batch * seq * 576 * 2)
    ids = torch.arange(0, 4096, 4, device=dev, dtype=torch.int32)
    yield ("kv_block_zero 1024 blocks", lambda: L.kv_block_zero(kv, ids),
           lambda: kv_block_zero.kv_block_zero_reference(kv, ids), ids.numel() * layout.block_numel * 2)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tokens", type=int, default=4096)
    args = p.parse_args()
    if not torch.cuda.is_available():
        print("bench/kernels.py needs a GPU (CUDA or ROCm): none here, nothing measured.")
        return
    from triton.testing import do_bench

    big = torch.empty(1 << 28, device="cuda", dtype=torch.uint8)
    copy_ms = do_bench(lambda: big.clone())
    copy_gbs = 2 * big.nbytes / copy_ms / 1e6
    rows = []
    for name, ours, reference, nbytes in cases(args.tokens):
        ours_ms, ref_ms = do_bench(ours), do_bench(reference)
        gbs = nbytes / ours_ms / 1e6
        rows.append([name, f"{ours_ms * 1000:.1f}", f"{ref_ms * 1000:.1f}", f"{ref_ms / ours_ms:.1f}x",
                     f"{gbs:.0f}", f"{gbs / copy_gbs:.0%}"])
    table(f"Kernels on {torch.cuda.get_device_name()} (device copy: {copy_gbs:.0f} GB/s)",
          ["kernel", "tritonwarm µs", "PyTorch reference µs", "speed-up", "GB/s", "of copy bandwidth"],
          rows, f"python bench/kernels.py --tokens {args.tokens}")


if __name__ == "__main__":
    main()
