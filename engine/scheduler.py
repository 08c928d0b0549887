"""Continuous batching: requests join and leave the running batch at any step.

Every step each running request gets the tokens it has not processed yet, up to the token budget:
one for a decoding request, a chunk of the prompt for a prefilling one (decodes are served first,
so a long prompt never stalls them). A waiting request is admitted when the batch has room and the
allocator can cover its *whole* length (prompt + max_tokens) on top of what running requests may
still claim; blocks are then allocated lazily as its tokens arrive. A request that does not fit
therefore waits, and a running request can never run out of blocks or touch another's.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from .config import EngineConfig
from .kv import BlockAllocator


@dataclass
class Request:
    request_id: int
    prompt: list[int]
    max_tokens: int
    stop_token_ids: tuple[int, ...] = ()
    arrival_step: int = 0


@dataclass
class Sequence:
    request: Request
    block_size: int
    tokens: list[int] = field(default_factory=list)  # prompt, then generated tokens
    num_computed: int = 0  # tokens whose KV is in the cache
    block_table: list[int] = field(default_factory=list)
    finished: bool = False

    def __post_init__(self):
        self.tokens = list(self.request.prompt)

    @property
    def request_id(self) -> int:
        return self.request.request_id

    @property
    def output(self) -> list[int]:
        return self.tokens[len(self.request.prompt):]

    @property
    def max_blocks(self) -> int:
        """Blocks for the longest this request can get (its KV never holds the last sampled token)."""
        return -(-(len(self.request.prompt) + self.request.max_tokens - 1) // self.block_size)

    @property
    def num_pending(self) -> int:
        """Tokens not yet through the model: the rest of the prompt, or the last sampled token."""
        return len(self.tokens) - self.num_computed


@dataclass
class ScheduledBatch:
    step: int
    work: list[tuple[Sequence, int]]  # (sequence, tokens to process this step), in row order
    new_blocks: list[int]  # blocks allocated this step: to be zeroed before the forward

    @property
    def num_tokens(self) -> int:
        return sum(n for _, n in self.work)


class Scheduler:
    def __init__(self, config: EngineConfig, allocator: BlockAllocator):
        self.config = config
        self.allocator = allocator
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.finished: list[Sequence] = []

    def add(self, request: Request) -> Sequence:
        seq = Sequence(request, self.config.block_size)
        total = len(request.prompt) + request.max_tokens
        if not request.prompt or request.max_tokens < 1:
            raise ValueError(f"request {request.request_id}: needs a prompt and max_tokens >= 1")
        if total > self.config.max_model_len or seq.max_blocks > self.config.num_blocks:
            raise ValueError(f"request {request.request_id}: {total} tokens can never fit "
                             f"(max_model_len {self.config.max_model_len}, {self.config.num_blocks} blocks)")
        self.waiting.append(seq)
        return seq

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def _unclaimed_blocks(self) -> int:
        """Free blocks that no running request may still need."""
        claimed = sum(seq.max_blocks - len(seq.block_table) for seq in self.running)
        return self.allocator.num_free - claimed

    def schedule(self, step: int) -> ScheduledBatch | None:
        while (self.waiting and len(self.running) < self.config.max_batch_size
               and self.waiting[0].max_blocks <= self._unclaimed_blocks()):
            self.running.append(self.waiting.popleft())
        budget = self.config.max_num_tokens
        work, new_blocks = [], []
        # Decodes first (one token each), then prompt chunks in admission order.
        for seq in sorted(self.running, key=lambda s: s.num_computed < len(s.request.prompt)):
            count = min(seq.num_pending, budget)
            if count == 0:
                continue
            budget -= count
            needed = -(-(seq.num_computed + count) // self.config.block_size) - len(seq.block_table)
            if needed > 0:
                blocks = self.allocator.allocate(seq.request_id, needed)
                seq.block_table += blocks
                new_blocks += blocks
            work.append((seq, count))
        return ScheduledBatch(step, work, new_blocks) if work else None

    def update(self, batch: ScheduledBatch, sampled: dict[int, int]) -> list[Sequence]:
        """Advance each sequence by its processed tokens, append sampled tokens, retire finished ones."""
        done = []
        for seq, count in batch.work:
            seq.num_computed += count
            token = sampled.get(seq.request_id)
            if token is None:  # mid-prompt chunk: nothing sampled yet
                continue
            seq.tokens.append(token)
            if token in seq.request.stop_token_ids or len(seq.output) >= seq.request.max_tokens:
                seq.finished = True
                done.append(seq)
        for seq in done:
            self.running.remove(seq)
            self.allocator.free(seq.request_id, seq.block_table)
            seq.block_table = []
            self.finished.append(seq)
        return done
