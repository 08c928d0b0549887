"""Engine throughput: generated tokens per second and time per decode step at 1, 16 and 64
concurrent requests, against a baseline measured in the same run.

    python bench/engine_throughput.py [--config C] [--concurrency 1,16,64] [--prompt 16] [--max-tokens N]

On a GPU (default config ``deepseek-v2-lite``): the Triton engine with decode CUDA graphs against the
same engine run eagerly (no graphs), each after a warm-up pass that compiles whatever the cache
lacks. On a CPU (default ``tiny``): the Triton engine through Triton's interpreter against the
engine's PyTorch reference mode — the interpreter runs every program of every kernel in Python,
so there the figures measure the interpreter, not the kernels; they show the engine runs end to end.

Every request arrives at once with a seeded prompt of ``--prompt`` tokens and generates exactly
``--max-tokens`` tokens (no stop token). A decode step is a step in which every request of the
batch processes one token; its time is the whole ``Engine.execute`` (inputs to sampled tokens).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import random
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(__file__))
from _common import save_json, table  # noqa: E402


def sized_config(base, concurrency: int, prompt: int, max_tokens: int):
    """``base`` with room for ``concurrency`` requests running at once (and a decode graph of that
    many: the platform's sizes end at the batch limit, a config's own get it added)."""
    per_request = -(-(prompt + max_tokens) // base.block_size)
    sizes = base.cuda_graph_batch_sizes
    return dataclasses.replace(
        base, max_batch_size=max(base.max_batch_size, concurrency),
        max_num_tokens=max(base.max_num_tokens, concurrency),
        num_blocks=max(base.num_blocks, concurrency * per_request),
        max_model_len=max(base.max_model_len, prompt + max_tokens),
        cuda_graph_batch_sizes=None if sizes is None else tuple(sorted({*sizes, concurrency} - {0})),
    )


def requests_for(config, concurrency: int, prompt: int, max_tokens: int, seed: int = 0):
    from tritonwarm.engine.scheduler import Request

    rng = random.Random(seed)
    vocab = config.model.vocab_size
    return [Request(i, [rng.randrange(vocab) for _ in range(prompt)], max_tokens) for i in range(concurrency)]


def measure(config, mode: str, device: str, concurrency: int, prompt: int, max_tokens: int, warm: bool) -> dict:
    from tritonwarm.engine.engine import Engine
    from tritonwarm.engine.graphs import is_graph_step

    engine = Engine(config, mode, device)
    engine.capture_graphs()
    if warm:  # compile (or load) every variant this workload launches, outside the timing
        engine.run(requests_for(config, concurrency, prompt, 2, seed=1))
        engine = Engine(config, mode, device)
        engine.capture_graphs()
    decode_seconds = []
    execute = engine.execute

    def timed_execute(batch):
        start = time.perf_counter()
        out = execute(batch)  # ends in a host read of the sampled tokens: the device work is done
        if is_graph_step(batch):
            decode_seconds.append(time.perf_counter() - start)
        return out

    engine.execute = timed_execute
    result = engine.run(requests_for(config, concurrency, prompt, max_tokens))
    return {"tokens_per_s": result.generated_tokens / result.seconds, "steps": result.steps,
            "decode_ms": 1000 * statistics.median(decode_seconds) if decode_seconds else float("nan")}


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

    base = load_engine_config(args.config)
    device = "cuda" if gpu else "cpu"
    if gpu:
        runs = [("triton, CUDA graphs", "triton", True), ("triton, eager", "triton", False)]
    else:
        runs = [("triton (interpreter)", "triton", True), ("reference (PyTorch)", "reference", True)]
    rows, figures = [], []
    for concurrency in (int(c) for c in args.concurrency.split(",")):
        config = sized_config(base, concurrency, args.prompt, args.max_tokens)
        results = []
        for label, mode, graphs in runs:
            run_config = config if graphs else dataclasses.replace(config, cuda_graph_batch_sizes=())
            results.append((label, measure(run_config, mode, device, concurrency, args.prompt, args.max_tokens,
                                           warm=gpu)))
        baseline = results[-1][1]["tokens_per_s"]
        for label, r in results:
            figures.append({"requests": concurrency, "engine": label, **r})
            rows.append([concurrency, label, f"{r['tokens_per_s']:.1f}", f"{r['decode_ms']:.2f}", r["steps"],
                         f"{r['tokens_per_s'] / baseline:.2f}x"])
    where = torch.cuda.get_device_name() if gpu else "CPU, no GPU: Triton's interpreter"
    table(f"Engine throughput, {args.config}, {where} (prompt {args.prompt}, {args.max_tokens} tokens each)",
          ["requests", "engine", "tokens/s", "ms per decode step (median)", "steps", f"vs {runs[-1][0]}"],
          rows, f"python bench/engine_throughput.py --config {args.config} --concurrency {args.concurrency} "
                f"--prompt {args.prompt} --max-tokens {args.max_tokens}")
    save_json(args.json, {"config": args.config, "where": where, "runs": figures})


if __name__ == "__main__":
    main()
