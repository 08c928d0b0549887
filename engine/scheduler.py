"""Continuous batching with preemption: requests join and leave the running batch at any step.

Every step each running request gets the tokens it has not processed yet, up to the token budget:
one for a decoding request, a chunk of the prompt for a prefilling one (decodes are served first,
so a long prompt never stalls them). Blocks are allocated as tokens arrive, and a waiting request is
admitted when the batch has room and the blocks of its first chunk are free: nothing is reserved
for the tokens a request may still generate, so the batch fills with what fits now.

When a running request needs blocks that are not free, the most recently admitted running request
is *preempted* (recompute): its blocks go back to the pool and it returns to the front of the
waiting queue with its generated tokens kept; on readmission its prompt and generated tokens are
prefilled again, which rebuilds exactly the KV it had. The oldest running request therefore always
makes progress, so preemption cannot livelock; a request that could not fit the cache even alone
is refused when it is added.

``admission="reserve"`` keeps the rule this scheduler had before preemption (admit a request only
when its whole length, prompt + max_tokens, fits beside what running requests may still claim; no
preemption ever happens): the benchmark compares the two.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from .config import EngineConfig
from .kv import BlockAllocator, OutOfBlocks

ADMISSIONS = ("preempt", "reserve")


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
    num_preemptions: int = 0  # times its KV was dropped to make room (recomputed on readmission)

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
        """Tokens not yet through the model: the rest of the prompt (and, after a preemption, of the
        generated tokens), or the last sampled token."""
        return len(self.tokens) - self.num_computed

    @property
    def prefilling(self) -> bool:
        return self.num_pending > 1 or self.num_computed < len(self.request.prompt)

    def blocks_for(self, count: int) -> int:
        """Blocks to add so that ``count`` more tokens have a slot."""
        return -(-(self.num_computed + count) // self.block_size) - len(self.block_table)


@dataclass
class ScheduledBatch:
    step: int
    work: list[tuple[Sequence, int]]  # (sequence, tokens to process this step), in row order
    new_blocks: list[int]  # blocks allocated this step: to be zeroed before the forward

    @property
    def num_tokens(self) -> int:
        return sum(n for _, n in self.work)


class Scheduler:
    def __init__(self, config: EngineConfig, allocator: BlockAllocator, admission: str = "preempt"):
        if admission not in ADMISSIONS:
            raise ValueError(f"unknown admission {admission!r}: choose one of {', '.join(ADMISSIONS)}")
        self.config = config
        self.allocator = allocator
        self.admission = admission
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []  # in admission order: the last is the first to preempt
        self.finished: list[Sequence] = []
        self.num_preemptions = 0  # preemption events so far

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

    def schedule(self, step: int) -> ScheduledBatch | None:
        budget = self.config.max_num_tokens
        work: list[tuple[Sequence, int]] = []
        new_blocks: list[int] = []
        preempted = False
        # Running requests: decodes first (one token each), then prompt chunks, in admission order.
        for seq in sorted(self.running, key=lambda s: s.prefilling):
            if seq not in self.running:  # preempted this step to make room for an older one
                continue
            count = min(seq.num_pending, budget)
            if count == 0:
                continue
            needed = seq.blocks_for(count)
            while needed > self.allocator.num_free and seq in self.running:
                victim = self.running[-1]
                if victim is seq and len(self.running) == 1:
                    raise OutOfBlocks(f"request {seq.request_id} alone needs {len(seq.block_table) + needed} "
                                      f"blocks; the allocator has {self.allocator.num_blocks}")
                budget += self._preempt(victim, work, new_blocks)
                preempted = True
            if seq not in self.running:  # it was the newest: it waits for room
                continue
            self._grant(seq, count, needed, work, new_blocks)
            budget -= count
        # Waiting requests, oldest first, while the batch has room; none after a preemption (what was
        # just freed goes to the requests already running, not to one that would be preempted next).
        while (self.waiting and not preempted and budget > 0
               and len(self.running) < self.config.max_batch_size):
            seq = self.waiting[0]
            count = min(seq.num_pending, budget)
            needed = seq.blocks_for(count)
            if not self._admits(seq, needed):
                break
            self.running.append(self.waiting.popleft())
            self._grant(seq, count, needed, work, new_blocks)
            budget -= count
        return ScheduledBatch(step, work, new_blocks) if work else None

    def _admits(self, seq: Sequence, needed: int) -> bool:
        if self.admission == "reserve":  # its whole length beside what running requests may still claim
            claimed = sum(s.max_blocks - len(s.block_table) for s in self.running)
            return seq.max_blocks <= self.allocator.num_free - claimed
        return needed <= self.allocator.num_free

    def _grant(self, seq: Sequence, count: int, needed: int, work: list, new_blocks: list) -> None:
        if needed > 0:
            blocks = self.allocator.allocate(seq.request_id, needed)
            seq.block_table += blocks
            new_blocks += blocks
        work.append((seq, count))

    def _preempt(self, seq: Sequence, work: list, new_blocks: list) -> int:
        """Free ``seq``'s blocks and put it first in the waiting queue, its tokens kept (recompute);
        drop it from this step's work. Returns the tokens of budget that gives back."""
        self.running.remove(seq)
        self.allocator.free(seq.request_id, seq.block_table)
        freed = set(seq.block_table)
        new_blocks[:] = [b for b in new_blocks if b not in freed]
        released = sum(n for s, n in work if s is seq)
        work[:] = [(s, n) for s, n in work if s is not seq]
        seq.block_table = []
        seq.num_computed = 0
        seq.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(seq)
        return released

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
