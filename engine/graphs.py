"""CUDA graphs of decode steps, one per declared decode batch size.

A decode step of ``n`` requests (one token each) runs as the captured graph of the smallest
declared size ``B >= n``: the step's inputs are copied into the graph's static buffers, rows
``n..B-1`` are padding (token 0 at position 0, attending to one token of a scratch KV block that no
request owns), and the first ``n`` logits are read back. Larger or mixed steps run eagerly.

The declared sizes are part of the engine's warm-up plan (``plan.py`` traces a decode step of each),
so capture at start-up compiles nothing; under ``--jit-policy error`` a compile during capture fails
start-up like any other. Capture needs a CUDA device; on a CPU or meta engine nothing here runs, and
``graph_size`` / ``pad_decode_rows`` (pure host logic) are what the CPU tests check.
"""

from __future__ import annotations

import torch

from .model import StepInputs


def graph_size(num_requests: int, sizes: tuple[int, ...]) -> int | None:
    """The smallest declared size that holds ``num_requests`` decodes, or None (run eagerly)."""
    for size in sizes:  # sorted ascending (validated by the config)
        if size >= num_requests:
            return size
    return None


def pad_step(step: StepInputs, size: int, scratch_block: int) -> StepInputs:
    """A decode step of ``n`` rows as a step of ``size`` rows: the padding rows read token 0 at
    position 0 and attend to one token of ``scratch_block``; every row samples (the graph's logits
    are ``[size, vocab]``, of which the caller reads the first ``n``). Works on any device."""
    n = step.input_ids.shape[0]
    if n > size:
        raise ValueError(f"a step of {n} rows does not fit a graph of {size}")
    pad = size - n

    def padded(t: torch.Tensor, value) -> torch.Tensor:
        return torch.cat([t, t.new_full((pad, *t.shape[1:]), value)]) if pad else t

    return StepInputs(
        input_ids=padded(step.input_ids, 0),
        positions=padded(step.positions, 0),
        seq_lens=padded(step.seq_lens, 1),
        block_tables=padded(step.block_tables, scratch_block),
        sample_rows=torch.arange(size, dtype=torch.int64, device=step.input_ids.device),
    )


def is_graph_step(batch) -> bool:
    """A pure decode step: every request processes exactly one token and samples."""
    return bool(batch.work) and all(count == 1 and seq.num_computed + 1 == len(seq.tokens)
                                    for seq, count in batch.work)


class DecodeGraphs:
    """Captured decode steps of one engine, keyed by batch size; built by ``capture``."""

    def __init__(self, model, kv_layers: list[torch.Tensor], sizes: tuple[int, ...], max_blocks: int,
                 scratch_block: int, device: torch.device):
        self.model, self.kv_layers, self.sizes = model, kv_layers, tuple(sizes)
        self.scratch_block, self.device = scratch_block, device
        self.graphs: dict[int, tuple[torch.cuda.CUDAGraph, StepInputs, torch.Tensor]] = {}
        self.max_blocks = max_blocks
        self.pool = None

    def _static_inputs(self, size: int) -> StepInputs:
        dev = self.device
        return StepInputs(
            input_ids=torch.zeros(size, dtype=torch.int64, device=dev),
            positions=torch.zeros(size, dtype=torch.int64, device=dev),
            seq_lens=torch.ones(size, dtype=torch.int32, device=dev),
            block_tables=torch.full((size, self.max_blocks), self.scratch_block, dtype=torch.int32, device=dev),
            sample_rows=torch.arange(size, dtype=torch.int64, device=dev),
        )

    def capture(self) -> None:
        """Capture the largest size first so the smaller ones share its memory pool (as vLLM does)."""
        for size in sorted(self.sizes, reverse=True):
            static = self._static_inputs(size)
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):  # one eager run first: lazy allocations out of the graph
                self.model.forward(static, self.kv_layers)
            torch.cuda.current_stream().wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self.pool):
                logits = self.model.forward(static, self.kv_layers)
            self.pool = graph.pool()
            self.graphs[size] = (graph, static, logits)
        torch.cuda.synchronize()

    def run(self, step: StepInputs) -> torch.Tensor | None:
        """The logits of a decode step through its graph, or None when no captured size fits."""
        n = step.input_ids.shape[0]
        size = graph_size(n, self.sizes)
        if size is None or size not in self.graphs:
            return None
        graph, static, logits = self.graphs[size]
        padded = pad_step(step, size, self.scratch_block)
        for name in ("input_ids", "positions", "seq_lens", "block_tables"):
            getattr(static, name).copy_(getattr(padded, name))
        graph.replay()
        return logits[:n]
