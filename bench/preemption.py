"""Scheduling under KV pressure: tokens per step with preemption against the rule it replaced.

    python bench/preemption.py [--config tiny] [--blocks 10,16,24,64] [--requests 24] [--mode scheduler]

The same seeded workload runs with a KV cache of each ``--blocks`` size, twice:
``preempt`` (the scheduler's rule: admit what fits now, preempt the newest request when a step
needs blocks that are not free, recompute it later) and ``reserve`` (the old rule, kept as
``Scheduler(admission="reserve")`` for this comparison: admit a request only when its whole length
fits beside what running requests may still claim). Every request arrives at step 0 and generates
exactly its ``max_tokens`` (no stop token), so both runs do the same useful work; the table shows
generated tokens per engine step (the throughput the step count allows), all tokens through the
model per step (recomputed ones included), the mean running batch, the preemptions, and the
ratio of generated tokens per step, preempt / reserve, measured in the same run.

``--mode scheduler`` (the default) runs the engine's own ``Scheduler`` and ``BlockAllocator`` with a
stand-in for the model that samples a fixed token (as a dry run does): with no stop token, the
schedule, and so every figure in the table, is the engine's. ``--mode reference`` runs the whole
engine on the CPU through the kernels' PyTorch references, and ``--mode triton`` through the kernels
(Triton's interpreter on a CPU: slow); those also check that both rules generate the same tokens
(recompute is exact). Keep their workloads small: a CPU step of the model takes a good part of a second.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import random
import sys

sys.path.insert(0, os.path.dirname(__file__))
from _common import save_json, table  # noqa: E402


def workload(config, num_requests: int, seed: int = 0):
    """Prompts of 4..48 tokens and 8..64 generated tokens, all arriving at once."""
    from tritonwarm.engine.scheduler import Request

    rng = random.Random(seed)
    vocab = config.model.vocab_size
    return [Request(i, [rng.randrange(vocab) for _ in range(rng.randint(4, 48))], rng.randint(8, 64))
            for i in range(num_requests)]


def run_scheduler(config, requests, admission: str) -> dict:
    """The engine's scheduling loop, a fixed sampled token in place of the model's."""
    from tritonwarm.engine.kv import BlockAllocator
    from tritonwarm.engine.scheduler import Scheduler

    scheduler = Scheduler(config, BlockAllocator(config.num_blocks), admission)
    for request in requests:
        scheduler.add(request)
    steps = processed = 0
    batch_sizes = []
    while scheduler.has_work:
        batch = scheduler.schedule(steps)
        sampled = {seq.request_id: 0 for seq, n in batch.work if seq.num_computed + n == len(seq.tokens)}
        scheduler.update(batch, sampled)
        steps, processed = steps + 1, processed + batch.num_tokens
        batch_sizes.append(len(batch.work))
    outputs = [seq.output for seq in sorted(scheduler.finished, key=lambda s: s.request_id)]
    return {"steps": steps, "generated": sum(map(len, outputs)), "processed": processed,
            "preemptions": scheduler.num_preemptions, "mean_batch": sum(batch_sizes) / len(batch_sizes),
            "outputs": None}


def run(config, requests, mode: str, admission: str) -> dict:
    from tritonwarm.engine.engine import Engine
    from tritonwarm.engine.scheduler import Scheduler

    if mode == "scheduler":
        return run_scheduler(config, requests, admission)
    engine = Engine(config, mode, "cpu")
    engine.scheduler = Scheduler(config, engine.allocator, admission)
    batch_sizes = []
    schedule = engine.scheduler.schedule

    def counted(step):
        batch = schedule(step)
        if batch is not None:
            batch_sizes.append(len(batch.work))
        return batch

    engine.scheduler.schedule = counted
    result = engine.run(requests)
    return {"steps": result.steps, "generated": result.generated_tokens, "processed": result.tokens_processed,
            "preemptions": result.preemptions, "mean_batch": sum(batch_sizes) / len(batch_sizes),
            "outputs": result.outputs}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default="tiny")
    p.add_argument("--blocks", default="10,16,24,64", help="KV cache sizes in blocks, comma-separated")
    p.add_argument("--requests", type=int, default=24)
    p.add_argument("--max-batch-size", type=int, default=8)
    p.add_argument("--mode", choices=("scheduler", "reference", "triton"), default="scheduler")
    p.add_argument("--json", metavar="PATH", help="also write every figure here")
    args = p.parse_args()
    from tritonwarm.engine.config import load_engine_config

    base = load_engine_config(args.config)
    base = dataclasses.replace(base, max_batch_size=args.max_batch_size,
                               max_num_tokens=max(base.max_num_tokens, args.max_batch_size))
    requests = workload(base, args.requests)
    rows, figures = [], []
    for blocks in (int(b) for b in args.blocks.split(",")):
        config = dataclasses.replace(base, num_blocks=blocks)
        results = {admission: run(config, requests, args.mode, admission) for admission in ("reserve", "preempt")}
        if results["preempt"]["outputs"] != results["reserve"]["outputs"]:
            raise SystemExit(f"{blocks} blocks: preemption changed the generated tokens")
        baseline = results["reserve"]["generated"] / results["reserve"]["steps"]
        for admission, r in results.items():
            per_step = r["generated"] / r["steps"]
            figures.append({"blocks": blocks, "admission": admission, **{k: v for k, v in r.items() if k != "outputs"}})
            rows.append([blocks, admission, r["steps"], f"{per_step:.2f}", f"{r['processed'] / r['steps']:.2f}",
                         f"{r['mean_batch']:.2f}", r["preemptions"], f"{per_step / baseline:.2f}x"])
    tokens = sum(r.max_tokens for r in requests)
    table(f"Tokens per step under KV pressure: {args.config}, {args.requests} requests ({tokens} tokens to "
          f"generate), batch <= {args.max_batch_size}, block {base.block_size} tokens, mode {args.mode}",
          ["KV blocks", "admission", "steps", "generated/step", "processed/step", "mean batch", "preemptions",
           "vs reserve"],
          rows, f"python bench/preemption.py --config {args.config} --blocks {args.blocks} --requests "
                f"{args.requests} --max-batch-size {args.max_batch_size} --mode {args.mode}")
    save_json(args.json, {"config": args.config, "mode": args.mode, "runs": figures})


if __name__ == "__main__":
    main()
