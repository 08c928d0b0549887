"""The engine loop: arrivals → schedule → zero new blocks → forward → greedy sample → update.

The same ``Engine`` runs real launches (GPU or the interpreter) and, on meta tensors under the
target-only driver, the dry run and the warm-up trace of an engine config (``plan.py``).
"""

from __future__ import annotations

import dataclasses
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from ..jit import in_fake_mode
from ..jit.pipeline.progress import set_phase
from ..jit.serving.monitor import DispatchMonitor
from .config import EngineConfig
from .graphs import DecodeGraphs, is_graph_step
from .kv import BlockAllocator, KVCache
from .model import Model, StepInputs
from .ops import as_int32, get_ops
from .platform_defaults import capture_sizes
from .scheduler import Request, ScheduledBatch, Scheduler
from .weights import load_weights, random_weights

# (request ids, each one's index of the token being sampled, logits [rows, vocab]) -> the tokens
Sampler = Callable[[list[int], list[int], torch.Tensor], list[int]]


class Engine:
    def __init__(self, config: EngineConfig, mode: str = "triton", device="cpu", weights_path=None,
                 weights_dtype: torch.dtype | None = None):
        """``weights_dtype``: make the weights in this dtype, then compute in ``config.dtype`` (bf16
        weights in fp32: the same model without bf16 arithmetic). Default: ``config.dtype``."""
        self.config = config
        self.device = torch.device(device)
        self.ops = get_ops(mode)
        made = weights_dtype or config.dtype
        if weights_path is not None and self.device.type != "meta":
            weights = load_weights(weights_path, config.model, made, self.device)
        else:
            weights = random_weights(config.model, made, self.device, config.seed)
        if made != config.dtype:
            for name in weights:  # one tensor at a time: never two copies of the model
                weights[name] = weights[name].to(config.dtype)
        self.model = Model(config, weights, self.ops, self.device)
        # CUDA graphs of decode steps: a GPU and the Triton ops (the references read values on the
        # host, which a graph cannot hold), at the config's sizes or this GPU's defaults. One KV block
        # past the allocator's is the padding rows' scratch.
        sizes = capture_sizes(config) if self.device.type == "cuda" and mode == "triton" else ()
        use_graphs = bool(sizes)
        kv_config = dataclasses.replace(config, num_blocks=config.num_blocks + 1) if use_graphs else config
        self.kv = KVCache(kv_config, self.device)
        self.allocator = BlockAllocator(config.num_blocks)
        self.scheduler = Scheduler(config, self.allocator)
        self.graphs = None
        if use_graphs:
            self.graphs = DecodeGraphs(self.model, self.kv.layers, sizes,
                                       config.max_blocks_per_request, config.num_blocks, self.device)

    def capture_graphs(self) -> int:
        """Capture the declared decode sizes (GPU only); returns how many were captured."""
        if self.graphs is None:
            return 0
        self.graphs.capture()
        return len(self.graphs.graphs)

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

    def execute(self, batch: ScheduledBatch, sampler: Sampler | None = None) -> dict[int, int]:
        """Run one scheduled step; returns ``{request_id: sampled token}`` for requests that sample.
        Greedy, unless a ``sampler`` (teacher forcing, ``logits.py``) picks the tokens."""
        if batch.new_blocks:  # a recycled block must not show its previous owner's KV
            self.ops.kv_block_zero(self.kv.tensor, as_int32(batch.new_blocks, self.device))
        step = self.step_inputs(batch)
        logits = self.graphs.run(step) if self.graphs is not None and is_graph_step(batch) else None
        if logits is None:
            logits = self.model.forward(step, self.kv.layers)
        sampling = [seq for seq, count in batch.work if seq.num_computed + count == len(seq.tokens)]
        if in_fake_mode() or logits.device.type == "meta":
            # Traced on meta tensors there are no logits to read: a fixed token that is not a stop
            # token keeps every request running to max_tokens, the longest (most launching) path.
            tokens = [_fake_token(seq.request.stop_token_ids) for seq in sampling]
        elif sampler is not None:
            tokens = sampler([seq.request_id for seq in sampling], [len(seq.output) for seq in sampling], logits)
        else:
            tokens = logits.argmax(dim=-1).tolist()  # greedy
        return {seq.request_id: token for seq, token in zip(sampling, tokens, strict=True)}

    def run(self, requests: list[Request], monitor: DispatchMonitor | None = None,
            sampler: Sampler | None = None) -> RunResult:
        result = RunResult()
        pending = deque(sorted(requests, key=lambda r: (r.arrival_step, r.request_id)))
        sequences = {}
        preemptions_before, finished_before = self.scheduler.num_preemptions, len(self.scheduler.finished)
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
                raise RuntimeError("the scheduler made no progress")  # preemption makes this unreachable
            step_start = time.perf_counter()
            sampled = self.execute(batch, sampler)  # ends in a host read of the tokens: the device is done
            if is_graph_step(batch):
                result.decode_step_seconds.append(time.perf_counter() - step_start)
            self.scheduler.update(batch, sampled)
            if sampled and result.first_token_seconds is None:
                result.first_token_seconds = time.perf_counter() - start
            result.steps += 1
            result.tokens_processed += batch.num_tokens
            done = len(self.scheduler.finished) - finished_before
            set_phase(f"serving: {done}/{len(requests)} requests done, step {result.steps}, "
                      f"{result.tokens_processed} tokens")
            if monitor is not None:
                for cache_hash in monitor.dispatches.keys() - result.first_seen.keys():
                    result.first_seen[cache_hash] = {"step": step, "requests": len(batch.work),
                                                     "tokens": batch.num_tokens}
            step += 1
        result.seconds = time.perf_counter() - start
        ordered = [sequences[r.request_id] for r in sorted(requests, key=lambda r: r.request_id)]
        result.outputs = [seq.output for seq in ordered]
        result.request_preemptions = [seq.num_preemptions for seq in ordered]
        result.preemptions = self.scheduler.num_preemptions - preemptions_before
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
    preemptions: int = 0  # preemption events in this run
    request_preemptions: list[int] = field(default_factory=list)  # times each request was preempted, id order
    decode_step_seconds: list[float] = field(default_factory=list)  # each step in which every request decoded

    @property
    def generated_tokens(self) -> int:
        return sum(len(o) for o in self.outputs)
