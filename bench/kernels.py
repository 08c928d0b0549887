"""Each kernel against its strongest peer in the same process, with the fraction of a plain device
copy's bandwidth measured in the same run.

    python bench/kernels.py [--tokens 4096] [--no-compile]

Peers, per case, whichever of them exist here: torch's eager fused op (``F.rms_norm``), the kernel's
PyTorch reference under ``torch.compile``, ``F.scaled_dot_product_attention`` on the same K/V stored
contiguously (what a paged decode competes with), the eager per-expert loop a fused MoE replaces.
The table names the fastest peer of each case and the ratio against it (> 1: tritonwarm is faster),
both timed per call as a user calls them (host launch cost included). Each of ours is also replayed
as a CUDA graph: that time is the kernels' own, and the bandwidth columns are computed from it, so a
small call whose time is the host's shows as such instead of as a slow kernel.

Without a GPU every case still runs once at a small size on the CPU (the kernels in Triton's
interpreter, the eager peers beside them, outputs compared), so the script's code paths are checked
on any machine; nothing is timed and it exits 0 saying so.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(__file__))
from _common import save_json, table  # noqa: E402


@dataclass
class Case:
    name: str
    ours: Callable
    nbytes: int  # bytes the op must move at least: its roofline
    peers: dict[str, Callable] = field(default_factory=dict)  # eager peers
    compiled: dict[str, Callable] = field(default_factory=dict)  # functions to torch.compile as peers
    check: Callable | None = None  # (ours output, first peer output) -> None, on the CPU run


def _close(atol):
    def check(a, b):
        a, b = (a[0], b[0]) if isinstance(a, tuple) else (a, b)
        torch.testing.assert_close(a.float(), b.float(), atol=atol, rtol=atol)
    return check


def _moe_loop(hidden, w_gate_up, w_down, topk_weights, topk_ids):
    """The per-expert loop of torch matmuls a fused MoE replaces (eager, the input's dtype)."""
    tokens, top_k = topk_ids.shape
    inter = w_down.shape[2]
    out = torch.zeros(tokens, hidden.shape[1], dtype=torch.float32, device=hidden.device)
    flat = topk_ids.reshape(-1)
    for e in range(w_gate_up.shape[0]):
        slots = torch.nonzero(flat == e).flatten()
        if slots.numel() == 0:
            continue
        rows = slots // top_k
        gate_up = hidden[rows] @ w_gate_up[e].T
        y = (F.silu(gate_up[:, :inter]) * gate_up[:, inter:]) @ w_down[e].T
        out.index_add_(0, rows, y.float() * topk_weights.reshape(-1)[slots, None])
    return out.to(hidden.dtype)


def cases(tokens: int, dev: str, small: bool):
    """DeepSeek-V2-Lite / Llama-3.1-8B shapes on a GPU; the same cases shrunk for the CPU run."""
    from tritonwarm import launchers as L
    from tritonwarm.kernels import (
        activation,
        fp4,
        fused_moe,
        moe_align,
        moe_routing,
        rms_norm,
        rotary,
    )

    bf16 = torch.bfloat16
    hidden, inter, experts, top_k = (64, 32, 8, 2) if small else (2048, 1408, 64, 6)
    wide = 256 if small else 4096

    x = torch.randn(tokens, wide, device=dev, dtype=bf16)
    w = torch.randn(wide, device=dev, dtype=bf16)
    yield Case(f"rms_norm {tokens}x{wide}", lambda: L.rms_norm(x, w), 2 * x.nbytes + w.nbytes,
               {"F.rms_norm": lambda: F.rms_norm(x, (wide,), w, 1e-6)},
               {"compiled reference": lambda: rms_norm.rms_norm_reference(x, w)}, _close(2e-2))
    d = 256 if small else 14336
    g = torch.randn(tokens, 2 * d, device=dev, dtype=bf16)
    yield Case(f"silu_and_mul {tokens}x{d}", lambda: L.silu_and_mul(g), g.nbytes * 3 // 2,
               {"eager F.silu * up": lambda: F.silu(g[:, :d]) * g[:, d:]},
               {"compiled reference": lambda: activation.silu_and_mul_reference(g)}, _close(2e-2))
    heads, kv_heads, head_dim = (4, 2, 32) if small else (32, 8, 128)
    q = torch.randn(tokens, heads, head_dim, device=dev, dtype=bf16)
    k = torch.randn(tokens, kv_heads, head_dim, device=dev, dtype=bf16)
    cos_sin = torch.randn(8192, head_dim, device=dev, dtype=torch.float32)
    pos = torch.randint(0, 8192, (tokens,), device=dev)
    yield Case(f"rotary {heads}q/{kv_heads}k x {head_dim}", lambda: L.rotary_embedding(pos, q, k, cos_sin),
               2 * (q.nbytes + k.nbytes),
               {"eager reference": lambda: rotary.rotary_embedding_reference(pos, q, k, cos_sin)},
               {"compiled reference": lambda: rotary.rotary_embedding_reference(pos, q, k, cos_sin)})
    logits = torch.randn(tokens, experts, device=dev, dtype=bf16)
    yield Case(f"moe_topk_routing {experts}/top{top_k}", lambda: L.moe_topk_routing(logits, top_k),
               logits.nbytes + tokens * top_k * 8,
               {"eager reference": lambda: moe_routing.moe_topk_routing_reference(logits, top_k)},
               {"compiled reference": lambda: moe_routing.moe_topk_routing_reference(logits, top_k)})
    ids = torch.randint(0, experts, (tokens, top_k), device=dev, dtype=torch.int32)
    yield Case(f"moe_align_block_size {tokens}x{top_k}, {experts} experts",
               lambda: L.moe_align_block_size(ids, experts, 16), ids.nbytes * 3,
               {"eager reference (per expert)": lambda: moe_align.moe_align_block_size_reference(ids, experts, 16),
                "torch.sort of the ids": lambda: torch.sort(ids.flatten(), stable=True)})
    xq = torch.randn(tokens, 256 if small else 7168, device=dev, dtype=bf16)
    yield Case(f"mxfp4_quantize {tuple(xq.shape)}", lambda: L.mxfp4_quantize(xq),
               xq.nbytes + xq.numel() // 2 + xq.numel() // 32,
               {"eager reference": lambda: fp4.mxfp4_quantize_reference(xq)},
               {"compiled reference": lambda: fp4.mxfp4_quantize_reference(xq)}, _close(0))
    packed, scales = L.mxfp4_quantize(xq)
    yield Case(f"mxfp4_dequantize {tuple(xq.shape)}", lambda: L.mxfp4_dequantize(packed, scales, bf16),
               xq.nbytes + packed.nbytes + scales.nbytes,
               {"eager reference": lambda: fp4.mxfp4_dequantize_reference(packed, scales, bf16)},
               {"compiled reference": lambda: fp4.mxfp4_dequantize_reference(packed, scales, bf16)}, _close(0))
    h = torch.randn(tokens, hidden, device=dev, dtype=bf16)
    w_gu = torch.randn(experts, 2 * inter, hidden, device=dev, dtype=bf16) / hidden**0.5
    w_dn = torch.randn(experts, hidden, inter, device=dev, dtype=bf16) / inter**0.5
    topk_w = torch.rand(tokens, top_k, device=dev)
    moe_bytes = w_gu.nbytes + w_dn.nbytes + 2 * h.nbytes  # each expert's weights read once at least
    yield Case(f"fused_moe {tokens} tokens, {experts}x top-{top_k}, {hidden}/{inter}",
               lambda: L.fused_moe(h, w_gu, w_dn, topk_w, ids), moe_bytes,
               {"eager per-expert matmuls": lambda: _moe_loop(h, w_gu, w_dn, topk_w, ids)},
               check=lambda a, b: torch.testing.assert_close(
                   a.float(), fused_moe.fused_moe_reference(h, w_gu, w_dn, topk_w, ids).float(), atol=3e-2, rtol=3e-2))
    yield from _attention_cases(dev, small)
    layout = L.KVCacheLayout.mla(num_blocks=64 if small else 4096, block_size=16 if small else 64, kv_lora_rank=512,
                                 rope_dim=64)
    kv = layout.allocate(bf16, dev)
    block_ids = torch.arange(0, layout.num_blocks, 4, device=dev, dtype=torch.int32)
    yield Case(f"kv_block_zero {block_ids.numel()} blocks", lambda: L.kv_block_zero(kv, block_ids),
               block_ids.numel() * layout.block_numel * 2,
               {"eager index_fill_": lambda: kv.index_fill_(0, block_ids.long(), 0)})


def _attention_cases(dev: str, small: bool):
    from tritonwarm import launchers as L

    bf16 = torch.bfloat16
    geometries = [("MLA", 64, 2048, 16, 1, 576, 512), ("MLA", 1, 4096, 16, 1, 576, 512),
                  ("GQA Llama-8B", 64, 2048, 32, 8, 128, 128)]
    if small:
        geometries = [("MLA", 2, 40, 4, 1, 576, 512), ("GQA", 3, 33, 4, 2, 32, 32)]
    for kind, batch, seq, heads, kv_heads, key_dim, value_dim in geometries:
        block = 16 if small else 64
        blocks_per_seq = -(-seq // block)
        if kind == "MLA":
            layout = L.KVCacheLayout.mla(batch * blocks_per_seq, block, 512, 64)
        else:
            layout = L.KVCacheLayout.gqa(batch * blocks_per_seq, block, kv_heads, key_dim)
        kv = layout.allocate(bf16, dev)
        kv.normal_()
        tables = torch.arange(batch * blocks_per_seq, device=dev, dtype=torch.int32).view(batch, -1)
        lens = torch.full((batch,), seq, device=dev, dtype=torch.int32)
        q = torch.randn(batch, heads, key_dim, device=dev, dtype=bf16)
        scale = key_dim**-0.5
        # the same K/V stored contiguously: [batch, kv_heads, seq, dim]
        keys = layout.keys(kv)[tables.long()].flatten(1, 2)[:, :seq].transpose(1, 2).contiguous()
        values = layout.values(kv)[tables.long()].flatten(1, 2)[:, :seq].transpose(1, 2).contiguous()
        q4 = q[:, :, None]

        def sdpa(q4=q4, keys=keys, values=values, scale=scale, gqa=heads != kv_heads):
            return F.scaled_dot_product_attention(q4, keys, values, scale=scale, enable_gqa=gqa)[:, :, 0]

        nbytes = batch * seq * kv_heads * (key_dim + (0 if kind == "MLA" else value_dim)) * 2
        v_dim = value_dim if kind == "MLA" else None
        yield Case(f"paged {kind} decode {batch}x{seq}",
                   lambda q=q, kv=kv, tables=tables, lens=lens, scale=scale, v_dim=v_dim:
                   L.paged_decode_attention(q, kv, tables, lens, scale, v_head_dim=v_dim),
                   nbytes, {"SDPA, contiguous K/V": sdpa}, check=_close(3e-2))


def run_on_cpu() -> None:
    """Every case once at a small size: ours in the interpreter against its first eager peer."""
    names = []
    for case in cases(4, "cpu", small=True):
        ours = case.ours()
        for peer in case.peers.values():
            peer()
        if case.check is not None:
            case.check(ours, next(iter(case.peers.values()))())
        names.append(case.name)
    print(f"bench/kernels.py: no GPU here, nothing timed; the {len(names)} cases ran once on the CPU "
          f"at small sizes (Triton's interpreter, eager peers) and agree where compared.")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tokens", type=int, default=4096)
    p.add_argument("--no-compile", action="store_true", help="skip the torch.compile peers")
    p.add_argument("--json", metavar="PATH", help="also write every figure here")
    args = p.parse_args()
    if not torch.cuda.is_available():
        run_on_cpu()
        return
    from triton.testing import do_bench, do_bench_cudagraph

    big = torch.empty(1 << 28, device="cuda", dtype=torch.uint8)
    copy_ms = do_bench(lambda: big.clone())
    copy_gbs = 2 * big.nbytes / copy_ms / 1e6
    rows, figures = [], {"device": torch.cuda.get_device_name(), "copy_gbs": copy_gbs, "cases": {}}
    for case in cases(args.tokens, "cuda", small=False):
        try:
            ours_ms = do_bench(case.ours)
        except Exception as e:  # one broken case must not hide the others' figures
            print(f"  {case.name}: FAILED: {type(e).__name__}: {str(e)[:200]}", file=sys.stderr)
            rows.append([case.name, "FAILED", "-", "-", "-", "-", "-", "-"])
            continue
        peers = dict(case.peers)
        if not args.no_compile:
            peers.update({name: torch.compile(fn, dynamic=False) for name, fn in case.compiled.items()})
        timings = {}
        for name, fn in peers.items():
            try:
                timings[name] = do_bench(fn)
            except Exception as e:  # a peer this torch cannot run (e.g. SDPA without enable_gqa)
                print(f"  {case.name}: peer {name} skipped: {type(e).__name__}: {str(e)[:100]}", file=sys.stderr)
        best = min(timings, key=timings.get) if timings else None
        try:  # device time alone: the same call replayed as a CUDA graph, no host launch cost
            graph_ms = do_bench_cudagraph(case.ours, return_mode="median")
        except Exception as e:
            print(f"  {case.name}: CUDA graph replay failed: {type(e).__name__}: {str(e)[:100]}", file=sys.stderr)
            graph_ms = float("nan")
        device_ms = graph_ms if graph_ms == graph_ms else ours_ms  # the kernels' own time where known
        gbs = case.nbytes / device_ms / 1e6
        figures["cases"][case.name] = {"ours_us": ours_ms * 1000, "graph_us": graph_ms * 1000, "gbs": gbs,
                                       "of_copy": gbs / copy_gbs,
                                       "peers_us": {k: v * 1000 for k, v in timings.items()}}
        rows.append([case.name, f"{ours_ms * 1000:.1f}", f"{graph_ms * 1000:.1f}", best or "-",
                     f"{timings[best] * 1000:.1f}" if best else "-",
                     f"{timings[best] / ours_ms:.2f}x" if best else "-", f"{gbs:.0f}", f"{gbs / copy_gbs:.0%}"])
    table(f"Kernels on {torch.cuda.get_device_name()} (device copy: {copy_gbs:.0f} GB/s)",
          ["case", "tritonwarm µs", "as CUDA graph µs", "strongest peer", "peer µs", "peer / ours",
           "GB/s (graph)", "of copy bandwidth"],
          rows, f"python bench/kernels.py --tokens {args.tokens}{' --no-compile' if args.no_compile else ''}")
    save_json(args.json, figures)


if __name__ == "__main__":
    main()
