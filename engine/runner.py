"""Serving a workload: ``serve`` is the whole start-up and run, shared by the CLI, the benchmark and
the tests: check the warm-up plan against the cache (``--jit-policy``), build the engine, and run
the workload under a ``DispatchMonitor`` (``serving()`` for real launches, ``dry_run(target)`` for fake ones on meta).
The dry run is the same Engine, Scheduler and Model code; only the device and the monitor differ.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..jit.core.dispatch_record import write_record
from ..jit.serving.monitor import DispatchMonitor
from .config import EngineConfig
from .engine import Engine, RunResult
from .plan import startup_check
from .platform_defaults import for_target
from .scheduler import Request


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
        write_record(path, ({**launched.to_json(), "first": self.result.first_seen.get(cache_hash)}
                            for cache_hash, launched in self.monitor.dispatches.items()))


def serve(config: EngineConfig, requests: list[Request], *, mode: str = "triton", policy: str = "off",
          dry_run_target=None, cache_dir=None, weights_path=None) -> ServeReport:
    """Start the engine (checking its warm-up plan under ``policy``) and run ``requests``.

    Raises ``JitPolicyError`` under policy ``error`` when the cache lacks a variant, at start-up or
    at the first launch that needs it.
    """
    from ..jit.cache import refuse_if_served_elsewhere, resolve_cache_dir
    from ..jit.cache.triton_dir import triton_cache_dir
    from ..jit.core.targets import local_target, resolve_target

    cache_dir = resolve_cache_dir(cache_dir)
    dry_run = dry_run_target is not None
    if dry_run and mode != "triton":
        raise ValueError("--dry-run traces the Triton kernels: it needs --mode triton")
    gpu = torch.cuda.is_available() and not dry_run
    target = resolve_target(dry_run_target) if dry_run else (local_target() if gpu and mode == "triton" else None)
    config = for_target(config, target)  # the sizes the start-up check, the plan and capture all use
    if target is not None and not dry_run:  # Triton compiles what it misses, and would repoint those groups here
        refuse_if_served_elsewhere(cache_dir)
    missing = startup_check(config, target, cache_dir, policy) if target is not None and policy != "off" else []
    device = "meta" if dry_run else ("cuda" if gpu else "cpu")
    monitor = DispatchMonitor(cache_dir, policy)
    # Triton reads the cache that was checked (not its own default): in this process, the environment untouched
    with triton_cache_dir(cache_dir):
        engine = Engine(config, mode, device, weights_path)
        with (monitor.dry_run(target) if dry_run else monitor.serving()):
            engine.capture_graphs()  # GPU only: start-up, under the same policy as serving
            result = engine.run(requests, monitor)
    return ServeReport(result, monitor, target.name if target else None, dry_run, missing)
