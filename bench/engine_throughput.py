"""Engine throughput: generated tokens per second and time per decode step at 1, 16 and 64
concurrent requests, against a baseline measured in the same run.

    python bench/engine_throughput.py [--config C] [--concurrency 1,16,64] [--prompt 16] [--max-tokens N]

On a GPU (default config ``deepseek-v2-lite``): the Triton engine with decode CUDA graphs against the
same engine run eagerly (no graphs), each level after a warm-up pass that compiles whatever the cache
lacks. On a CPU (default ``tiny``): the Triton engine through Triton's interpreter against the
engine's PyTorch reference mode — the interpreter runs every program of every kernel in Python,
so there the figures measure the interpreter, not the kernels; they show the engine runs end to end.

One engine per mode, sized for the largest level and reused for every level; it is freed before the
next mode's is built (a GPU holds one DeepSeek-V2-Lite engine at a time), and the memory left
allocated after freeing it is checked. Every request arrives at once with a seeded prompt of
``--prompt`` tokens and generates exactly ``--max-tokens`` tokens (no stop token). A decode step is a
step in which every request of the batch processes one token; its time is the whole step, inputs to
sampled tokens (``RunResult.decode_step_seconds``).
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import os
import random
import statistics
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))
from _common import save_json, table  # noqa: E402

GIB = 2**30
LEAK_BYTES = GIB  # more than this still allocated after an engine is freed: something holds it


def sized_config(base, levels: list[int], prompt: int, max_tokens: int):
    """``base`` with room for the largest level's requests running at once, and a decode graph of each
    level (the platform's sizes end at the batch limit, a config's own get the levels added)."""
    most = max(levels)
    per_request = -(-(prompt + max_tokens) // base.block_size)
    sizes = base.cuda_graph_batch_sizes
    return dataclasses.replace(
        base, max_batch_size=max(base.max_batch_size, most),
        max_num_tokens=max(base.max_num_tokens, most),
        num_blocks=max(base.num_blocks, most * per_request),
        max_model_len=max(base.max_model_len, prompt + max_tokens),
        cuda_graph_batch_sizes=None if sizes is None else tuple(sorted({*sizes, *levels} - {0})),
    )


def requests_for(config, concurrency: int, prompt: int, max_tokens: int, seed: int = 0):
    from tritonwarm.engine.scheduler import Request

    rng = random.Random(seed)
    vocab = config.model.vocab_size
    return [Request(i, [rng.randrange(vocab) for _ in range(prompt)], max_tokens) for i in range(concurrency)]


def measure(engine, concurrency: int, prompt: int, max_tokens: int, warm: bool) -> dict:
    """One level on an engine already built: a warm-up pass (compiles or loads every variant this
    workload launches, outside the timing), then the timed run."""
    if warm:
        engine.run(requests_for(engine.config, concurrency, prompt, 2, seed=1))
    result = engine.run(requests_for(engine.config, concurrency, prompt, max_tokens))
    decode = result.decode_step_seconds
    return {"tokens_per_s": result.generated_tokens / result.seconds, "steps": result.steps,
            "decode_ms": 1000 * statistics.median(decode) if decode else float("nan")}


def gpu_allocated() -> int:
    return torch.cuda.memory_allocated() if torch.cuda.is_available() else 0


def run_mode(config, mode: str, device: str, levels: list[int], prompt: int, max_tokens: int, warm: bool,
             make_engine=None) -> tuple[list[dict], dict]:
    """Every level on one engine of ``mode``, then the engine freed; returns the levels' figures and
    the mode's memory: its peak, and what stayed allocated after it was freed."""
    from tritonwarm.engine.engine import Engine

    before = gpu_allocated()
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    engine = (make_engine or Engine)(config, mode, device)
    engine.capture_graphs()
    figures = [measure(engine, level, prompt, max_tokens, warm) for level in levels]
    peak = torch.cuda.max_memory_allocated() if torch.cuda.is_available() else None
    del engine
    gc.collect()  # nothing should need it (an engine holds no reference cycle), but a leak must not hide
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    left = gpu_allocated() - before
    if left > LEAK_BYTES:
        raise SystemExit(f"engine_throughput: {left / GIB:.1f} GiB still allocated after the {mode} engine was "
                         "freed: something holds it")
    return figures, {"peak_gpu_bytes": peak, "left_after_free_bytes": left}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    gpu = torch.cuda.is_available()
    p.add_argument("--config", default="deepseek-v2-lite" if gpu else "tiny")
    p.add_argument("--concurrency", default="1,16,64")
    p.add_argument("--prompt", type=int, default=16)
    p.add_argument("--max-tokens", type=int, default=32 if gpu else 4)
    p.add_argument("--json", metavar="PATH", help="also write every figure here")
    args = p.parse_args()
    from tritonwarm.engine.config import load_engine_config

    levels = [int(c) for c in args.concurrency.split(",")]
    config = sized_config(load_engine_config(args.config), levels, args.prompt, args.max_tokens)
    device = "cuda" if gpu else "cpu"
    if gpu:
        runs = [("triton, CUDA graphs", "triton", True), ("triton, eager", "triton", False)]
    else:
        runs = [("triton (interpreter)", "triton", True), ("reference (PyTorch)", "reference", True)]
    by_mode, memory = {}, {}
    for label, mode, graphs in runs:
        run_config = config if graphs else dataclasses.replace(config, cuda_graph_batch_sizes=())
        by_mode[label], memory[label] = run_mode(run_config, mode, device, levels, args.prompt, args.max_tokens,
                                                 warm=gpu)
    baseline_label = runs[-1][0]
    rows, figures = [], []
    for index, level in enumerate(levels):
        baseline = by_mode[baseline_label][index]["tokens_per_s"]
        for label, _, _ in runs:
            r = by_mode[label][index]
            figures.append({"requests": level, "engine": label, **r})
            rows.append([level, label, f"{r['tokens_per_s']:.1f}", f"{r['decode_ms']:.2f}", r["steps"],
                         f"{r['tokens_per_s'] / baseline:.2f}x"])
    where = torch.cuda.get_device_name() if gpu else "CPU, no GPU: Triton's interpreter"
    table(f"Engine throughput, {args.config}, {where} (prompt {args.prompt}, {args.max_tokens} tokens each)",
          ["requests", "engine", "tokens/s", "ms per decode step (median)", "steps", f"vs {baseline_label}"],
          rows, f"python bench/engine_throughput.py --config {args.config} --concurrency {args.concurrency} "
                f"--prompt {args.prompt} --max-tokens {args.max_tokens}")
    if gpu:
        print("\n" + "; ".join(f"{label}: peak {m['peak_gpu_bytes'] / GIB:.1f} GiB, "
                               f"{m['left_after_free_bytes'] / 2**20:.0f} MiB left after freeing it"
                               for label, m in memory.items()))
    save_json(args.json, {"config": args.config, "where": where, "runs": figures, "memory": memory})


if __name__ == "__main__":
    main()
