"""The engine loop: arrivals → schedule → zero new blocks → forward → greedy sample → update.

``serve`` is the whole start-up and run, shared by the CLI, the benchmark and the tests: check the
warm-up plan against the cache (``--jit-policy``), build the engine, and run the workload under a
``DispatchMonitor`` (``serving()`` for real launches, ``dry_run(target)`` for fake ones on meta).
The dry run is the same Engine, Scheduler and Model code; only the device and the monitor differ.
"""

from __future__ import annotations

import json
import random
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..jit import in_fake_mode
from ..jit.monitor import DispatchMonitor
from .config import EngineConfig
from .kv import BlockAllocator, KVCache
from .model import Model, StepInputs
from .ops import as_int32, get_ops
from .scheduler import Request, ScheduledBatch, Scheduler
from .weights import load_weights, random_weights


class Engine:
    def __init__(self, config: EngineConfig, mode: str = "triton", device="cpu", weights_path=None):
        self.config = config
        self.device = torch.device(device)
        self.ops = get_ops(mode)
        if weights_path is not None and self.device.type != "meta":
            weights = load_weights(weights_path, config.model, config.dtype, self.device)
        else:
            weights = random_weights(config.model, config.dtype, self.device, config.seed)
        self.model = Model(config, weights, self.ops, self.device)
        self.kv = KVCache(config, self.device)
        self.allocator = BlockAllocator(config.num_blocks)
        self.scheduler = Scheduler(config, self.allocator)

    def step_inputs(self, batch: ScheduledBatch) -> StepInputs:
        """Host-side bookkeeping (Python ints from the scheduler) to the step's device tensors."""
        input_ids, positions, row_seq, sample_rows, tables = [], [], [], [], []
        for index, (seq, count) in enumerate(batch.work):
            first = seq.num_computed
            input_ids += seq.tokens[first:first + count]
            positions += range(first, first + count)
            row_seq += [index] * count
            if first + count == len(seq.tokens):  # all known tokens processed: sample the next one
                sample_rows.append(len(input_ids) - 1)
            tables.append(seq.block_table + [0] * (self.config.max_blocks_per_request - len(seq.block_table)))
        dev = self.device
        return StepInputs(
            input_ids=torch.tensor(input_ids, dtype=torch.int64, device=dev),
            positions=torch.tensor(positions, dtype=torch.int64, device=dev),
            seq_lens=as_int32([p + 1 for p in positions], dev),
            block_tables=as_int32(tables, dev)[torch.tensor(row_seq, device=dev)],
            sample_rows=torch.tensor(sample_rows, dtype=torch.int64, device=dev),
        )

    def execute(self, batch: ScheduledBatch) -> dict[int, int]:
        """Run one scheduled step; returns ``{request_id: sampled token}`` for requests that sample."""
        if batch.new_blocks:  # a recycled block must not show its previous owner's KV
            self.ops.kv_block_zero(self.kv.tensor, as_int32(batch.new_blocks, self.device))
        step = self.step_inputs(batch)
        logits = self.model.forward(step, self.kv.layers)
        sampling = [seq for seq, count in batch.work if seq.num_computed + count == len(seq.tokens)]
        if in_fake_mode() or logits.device.type == "meta":
            # Traced on meta tensors there are no logits to read: a fixed token that is not a stop
            # token keeps every request running to max_tokens, the longest (most launching) path.
            tokens = [_fake_token(seq.request.stop_token_ids) for seq in sampling]
        else:
            tokens = logits.argmax(dim=-1).tolist()  # greedy
        return {seq.request_id: token for seq, token in zip(sampling, tokens)}

    def run(self, requests: list[Request], monitor: DispatchMonitor | None = None) -> "RunResult":
        result = RunResult()
        pending = deque(sorted(requests, key=lambda r: (r.arrival_step, r.request_id)))
        sequences = {}
        step, start = 0, time.perf_counter()
        while pending or self.scheduler.has_work:
            while pending and pending[0].arrival_step <= step:
                request = pending.popleft()
                sequences[request.request_id] = self.scheduler.add(request)
            if not self.scheduler.has_work:  # idle until the next arrival
                step = pending[0].arrival_step
                continue
            batch = self.scheduler.schedule(step)
            if batch is None:
                raise RuntimeError("the scheduler made no progress")  # admission rules make this unreachable
            sampled = self.execute(batch)
            self.scheduler.update(batch, sampled)
            if sampled and result.first_token_seconds is None:
                result.first_token_seconds = time.perf_counter() - start
            result.steps += 1
            result.tokens_processed += batch.num_tokens
            if monitor is not None:
                for cache_hash in monitor.dispatches.keys() - result.first_seen.keys():
                    result.first_seen[cache_hash] = {"step": step, "requests": len(batch.work),
                                                     "tokens": batch.num_tokens}
            step += 1
        result.seconds = time.perf_counter() - start
        result.outputs = [sequences[r.request_id].output for r in sorted(requests, key=lambda r: r.request_id)]
        return result


def _fake_token(stop_token_ids) -> int:
    return next(t for t in range(len(stop_token_ids) + 1) if t not in stop_token_ids)


@dataclass
class RunResult:
    outputs: list[list[int]] = field(default_factory=list)  # generated ids, in request id order
    steps: int = 0
    tokens_processed: int = 0  # prompt chunks and decode inputs through the model
    seconds: float = 0.0
    first_token_seconds: float | None = None
    first_seen: dict[str, dict] = field(default_factory=dict)  # cache hash -> first step that launched it

    @property
    def generated_tokens(self) -> int:
        return sum(len(o) for o in self.outputs)


def make_workload(config: EngineConfig, num_requests: int, max_tokens: int, seed: int = 0,
                  max_prompt: int | None = None) -> list[Request]:
    """Seeded requests of varied prompt lengths arriving at varied steps (same in every mode).

    Prompts run up to past the token budget, so long ones are prefilled in chunks; the last vocab
    id is every request's stop token.
    """
    rng = random.Random(seed)
    vocab = config.model.vocab_size
    longest = config.max_model_len - max_tokens
    if longest < 1:
        raise ValueError(f"max_tokens {max_tokens} leaves no room for a prompt in max_model_len {config.max_model_len}")
    max_prompt = min(max_prompt or config.max_num_tokens + config.block_size, longest)
    requests = []
    for i in range(num_requests):
        prompt = [rng.randrange(vocab - 1) for _ in range(rng.randint(1, max_prompt))]
        requests.append(Request(i, prompt, max_tokens, stop_token_ids=(vocab - 1,),
                                arrival_step=rng.randint(0, 2 * num_requests)))
    return requests


# --------------------------------------------------------------------------- start-up and run


@dataclass
class ServeReport:
    result: RunResult
    monitor: DispatchMonitor
    target: str | None
    dry_run: bool
    startup_missing: list[dict] = field(default_factory=list)

    @property
    def serve_compiles(self) -> int:
        """Compiles at serving time: real ones on a GPU; on a dry run, the variants that would compile."""
        return self.monitor.compiles + (len(self.monitor.misses) if self.dry_run else 0)

    def write_record(self, path: str | Path) -> None:
        """The dispatch record (JSONL): every variant launched, hit or miss, and the first step needing it."""
        with open(path, "w") as f:
            for cache_hash, dispatch in self.monitor.dispatches.items():
                line = {**dispatch.to_json(), "first": self.result.first_seen.get(cache_hash)}
                f.write(json.dumps(line) + "\n")


def serve(config: EngineConfig, requests: list[Request], *, mode: str = "triton", policy: str = "off",
          dry_run_target=None, cache_dir=None, weights_path=None) -> ServeReport:
    """Start the engine (checking its warm-up plan under ``policy``) and run ``requests``.

    Raises ``JitPolicyError`` under policy ``error`` when the cache lacks a variant, at start-up or
    at the first launch that needs it.
    """
    from ..jit.cache import resolve_cache_dir
    from ..jit.targets import local_target, resolve_target
    from .plan import startup_check

    cache_dir = resolve_cache_dir(cache_dir)
    dry_run = dry_run_target is not None
    if dry_run and mode != "triton":
        raise ValueError("--dry-run traces the Triton kernels: it needs --mode triton")
    gpu = torch.cuda.is_available() and not dry_run
    target = resolve_target(dry_run_target) if dry_run else (local_target() if gpu and mode == "triton" else None)
    missing = startup_check(config, target, cache_dir, policy) if target is not None and policy != "off" else []
    device = "meta" if dry_run else ("cuda" if gpu else "cpu")
    engine = Engine(config, mode, device, weights_path)
    monitor = DispatchMonitor(cache_dir, policy)
    with (monitor.dry_run(target) if dry_run else monitor.serving()):
        result = engine.run(requests, monitor)
    return ServeReport(result, monitor, target.name if target else None, dry_run, missing)
