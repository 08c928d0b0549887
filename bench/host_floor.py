"""What the host adds to each public launcher at batch 1: its cost per call against its kernels' time.

    python bench/host_floor.py [--calls 300] [--json PATH]

Every public launcher (``launchers/__init__.py``) is called as a decode step calls it, with no
precomputed metadata, on small inputs (one request of 4096 tokens for the decode attentions, one
token elsewhere):

- host µs: the wall time of ``--calls`` back-to-back calls with no sync between them, over their
  number, after a warm-up: where the host is slower than the GPU this is the host's cost per call;
- kernel µs: the same call captured once in a CUDA graph and replayed (its kernels alone);
- floor µs: host minus kernel, what the host adds; the goal is at most 25 µs.

Without a GPU each launcher's host code (its launch specs included; kernels recorded, not run) runs
on ``meta`` tensors under the sm90 target-only driver, and its µs per call on this CPU is printed.
torch runs some ops on ``meta`` tensors through Python references (``empty_like``, ``arange``: a few
hundred µs here, a few on a GPU), so these figures only rank the launchers' own Python.
``tests/test_no_host_sync.py`` proves none of them reads device data on the host.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(__file__))
from _common import one_line, save_json, table  # noqa: E402

GOAL_US = 25.0


def cases(dev: str) -> dict:
    """name -> a call of that launcher, inputs made once (random, valid indices)."""
    from tritonwarm import launchers as L

    g = torch.Generator(device="cpu").manual_seed(0)

    def rand(*shape, dtype=torch.bfloat16):
        return torch.randn(shape, generator=g).to(dtype).to(dev)

    def ids(high, *shape):
        return torch.randint(0, high, shape, generator=g, dtype=torch.int32).to(dev)

    i32 = torch.int32
    mla = L.KVCacheLayout.mla(64, 64, 512, 64)
    gqa = L.KVCacheLayout.gqa(256, 16, 8, 128)
    mla_cache, gqa_cache = rand(*mla.shape), rand(*gqa.shape)
    mla_table = torch.randperm(64, generator=g).to(i32).view(1, 64).to(dev)
    gqa_table = torch.randperm(256, generator=g).to(i32).view(1, 256).to(dev)
    lens = torch.full((1,), 4096, dtype=i32, device=dev)
    q_mla, q_gqa = rand(1, 16, 576), rand(1, 32, 128)
    quantized = {}
    for name in L.QUANTIZED_DS_MLA_FORMATS:
        cache = L.QuantizedMLALayout(L.kv_format(name), 64, 64).allocate(dev)
        slots = torch.arange(4096, device=dev).view(64, 64)[mla_table.long().view(-1)].view(-1)
        L.mla_kv_cache_write(cache, slots, rand(4096, 512), rand(4096, 64), name)
        quantized[name] = cache
    experts, hidden, inter = 8, 2048, 1408
    w_gate_up, w_down = rand(experts, 2 * inter, hidden) * 0.02, rand(experts, hidden, inter) * 0.02
    weights, topk = torch.rand(1, 2, generator=g).to(dev), ids(experts, 1, 2)
    mx_up, mx_down = L.mxfp4_quantize(w_gate_up), L.mxfp4_quantize(w_down)
    # 448 * 6 / amax: the weights are N(0, 0.02^2), under 0.15 in magnitude at these sizes
    gs_up = gs_down = torch.full((experts,), 448.0 * 6 / 0.15, device=dev)
    nv_up = [L.nvfp4_quantize(w_gate_up[e], gs_up[e]) for e in range(experts)]
    nv_down = [L.nvfp4_quantize(w_down[e], gs_down[e]) for e in range(experts)]
    nv_up = (torch.stack([p for p, _ in nv_up]), torch.stack([s.view(torch.uint8) for _, s in nv_up]))
    nv_down = (torch.stack([p for p, _ in nv_down]), torch.stack([s.view(torch.uint8) for _, s in nv_down]))
    x, w, act = rand(1, 2048), rand(2048), rand(1, 2 * 1408)
    packed, scales = L.mxfp4_quantize(x)
    global_scale = torch.tensor(100.0, device=dev)
    nv_packed, nv_scales = L.nvfp4_quantize(x, global_scale)
    positions, q_rot, k_rot, cos_sin = ids(4096, 1).long(), rand(1, 16, 64), rand(1, 1, 64), rand(4096, 64)
    zero_blocks, slot, latent, rope, logits = ids(64, 1), ids(4096, 1).long(), rand(1, 512), rand(1, 64), rand(1, 64)
    return {
        "silu_and_mul": lambda: L.silu_and_mul(act),
        "rms_norm": lambda: L.rms_norm(x, w, 1e-6),
        "rotary_embedding": lambda: L.rotary_embedding(positions, q_rot, k_rot, cos_sin),
        "kv_block_zero": lambda: L.kv_block_zero(mla_cache, zero_blocks),
        "mla_decode_metadata": lambda: L.mla_decode_metadata(lens, 16, 64, 132),
        "paged_decode_metadata": lambda: L.paged_decode_metadata(lens, mla_table, 16, 1, 576, 64),
        "paged_decode_attention": lambda: L.paged_decode_attention(q_mla, mla_cache, mla_table, lens, 0.07,
                                                                   v_head_dim=512),
        "paged_decode_attention GQA": lambda: L.paged_decode_attention(q_gqa, gqa_cache, gqa_table, lens, 0.09),
        "quantized_mla_decode_metadata": lambda: L.quantized_mla_decode_metadata(lens, mla_table, 16, 64,
                                                                                 "fp8_ds_mla"),
        **{f"quantized_mla_decode_attention {name}": (
            lambda name=name: L.quantized_mla_decode_attention(q_mla, quantized[name], mla_table, lens, 0.07, name,
                                                               512)) for name in L.QUANTIZED_DS_MLA_FORMATS},
        "mla_kv_cache_write": lambda: L.mla_kv_cache_write(quantized["fp8_ds_mla"], slot, latent, rope, "fp8_ds_mla"),
        "moe_topk_routing": lambda: L.moe_topk_routing(logits, 6),
        "moe_align_block_size": lambda: L.moe_align_block_size(topk, experts, 16),
        "fused_moe": lambda: L.fused_moe(x, w_gate_up, w_down, weights, topk),
        "fused_moe_mxfp4": lambda: L.fused_moe_mxfp4(x, *mx_up, *mx_down, weights, topk),
        "fused_moe_nvfp4": lambda: L.fused_moe_nvfp4(x, *nv_up, gs_up, *nv_down, gs_down, weights, topk),
        "mxfp4_quantize": lambda: L.mxfp4_quantize(x),
        "mxfp4_dequantize": lambda: L.mxfp4_dequantize(packed, scales, torch.bfloat16),
        "nvfp4_quantize": lambda: L.nvfp4_quantize(x, global_scale),
        "nvfp4_dequantize": lambda: L.nvfp4_dequantize(nv_packed, nv_scales, global_scale, torch.bfloat16),
    }


def host_us(fn, calls: int, sync) -> float:
    for _ in range(10):
        fn()
    sync()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    sync()
    return (time.perf_counter() - start) / calls * 1e6


def graph_us(fn) -> float:
    from triton.testing import do_bench_cudagraph

    return do_bench_cudagraph(fn, return_mode="median") * 1000


@contextlib.contextmanager
def recorded_launches():
    """Kernels recorded, not run, under the sm90 target-only driver (the CPU mode)."""
    from tritonwarm.jit import TARGETS, JitKernel, target_driver

    launch, memo = JitKernel.launch, JitKernel._memoized_call
    JitKernel.launch = lambda self, spec: None
    JitKernel._memoized_call = lambda self, inputs: (False, None)
    try:
        with target_driver(TARGETS["sm90"]):
            yield
    finally:
        JitKernel.launch, JitKernel._memoized_call = launch, memo


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--calls", type=int, default=300, help="back-to-back calls timed per launcher")
    p.add_argument("--json", metavar="PATH", help="also write every figure here")
    args = p.parse_args()
    gpu = torch.cuda.is_available()
    figures, rows = {"device": torch.cuda.get_device_name() if gpu else "cpu (host code only)", "cases": {}}, []
    with contextlib.nullcontext() if gpu else recorded_launches():
        all_cases = cases("cuda" if gpu else "meta")
        for name, fn in all_cases.items():
            try:
                host = host_us(fn, args.calls, torch.cuda.synchronize if gpu else lambda: None)
                kernel = graph_us(fn) if gpu else None
            except Exception as e:  # one failing launcher must not hide the others
                rows.append([name, f"FAILED: {one_line(e, 100)}", "-", "-", "-"])
                continue
            floor = None if kernel is None else max(0.0, host - kernel)
            figures["cases"][name] = {"host_us": host, "kernel_us": kernel, "floor_us": floor}
            print(f"{name}: host {host:.1f} µs" + ("" if kernel is None else f", kernel {kernel:.1f} µs"), flush=True)
            verdict = "-" if floor is None else ("ok" if floor <= GOAL_US else f"over {GOAL_US:g} µs")
            rows.append([name, f"{host:.1f}", "-" if kernel is None else f"{kernel:.1f}",
                         "-" if floor is None else f"{floor:.1f}", verdict])
    title = (f"Host cost per call at batch 1 on {figures['device']} ({args.calls} calls back to back; kernel µs "
             f"as CUDA graph; goal: floor <= {GOAL_US:g} µs)" if gpu else
             "Host code per call of each launcher on this CPU (meta tensors, kernels recorded, not run; no GPU)")
    table(title, ["launcher", "host µs", "kernel µs", "floor µs", "goal"], rows,
          f"python bench/host_floor.py --calls {args.calls}")
    save_json(args.json, figures)


if __name__ == "__main__":
    main()
