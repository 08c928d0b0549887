"""Warm-up split across build machines: shard I of N is a fixed part of the plan.

The split is a pure function of the plan, N and the compile times given (never of what a machine
already has cached), so N machines that each warm one shard together warm the whole plan once:
variants sorted by (kernel, cache hash), then handed out longest first, each to the shard with the
least work so far. Without recorded times every variant weighs 1 (so each kernel's variants are
dealt round the shards in turn).
"""

from __future__ import annotations

import json
import re
import statistics
from pathlib import Path

from ..core.trace import Variant
from .plan import Plan


def parse_shard(text: str) -> tuple[int, int]:
    """``"I/N"`` (1 ≤ I ≤ N) → ``(I, N)``."""
    match = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", text or "")
    if not match or not 1 <= int(match[1]) <= int(match[2]):
        raise ValueError(f"--shard {text!r}: expected I/N with 1 <= I <= N, e.g. 2/4")
    return int(match[1]), int(match[2])


def weights(variants: list[Variant], seconds: dict[str, float]) -> dict[str, float]:
    """Each variant's expected compile time: its recorded one, else its kernel's median, else the median."""
    known = {v.cache_hash: float(seconds[v.cache_hash]) for v in variants
             if isinstance(seconds.get(v.cache_hash), (int, float)) and seconds[v.cache_hash] > 0}
    if not known:
        return {v.cache_hash: 1.0 for v in variants}
    by_kernel: dict[str, list[float]] = {}
    for v in variants:
        if v.cache_hash in known:
            by_kernel.setdefault(v.kernel, []).append(known[v.cache_hash])
    overall = statistics.median(known.values())
    return {v.cache_hash: known.get(v.cache_hash) or statistics.median(by_kernel.get(v.kernel, [overall]))
            for v in variants}


def assign(variants: list[Variant], count: int, seconds: dict[str, float] | None = None) -> list[list[Variant]]:
    """Greedy longest-first over a stable order: ``count`` lists of variants with balanced total time."""
    cost = weights(variants, seconds or {})
    ordered = sorted(variants, key=lambda v: (-cost[v.cache_hash], v.kernel, v.cache_hash))
    shards: list[list[Variant]] = [[] for _ in range(count)]
    load = [0.0] * count
    for variant in ordered:
        lightest = min(range(count), key=lambda i: (load[i], i))
        shards[lightest].append(variant)
        load[lightest] += cost[variant.cache_hash]
    return shards


def shard_plan(the_plan: Plan, index: int, count: int, seconds: dict[str, float] | None = None) -> Plan:
    """The part of ``the_plan`` shard ``index`` of ``count`` (1-based) warms; rows and findings kept whole."""
    mine = assign(list(the_plan.variants.values()), count, seconds)[index - 1]
    keep = {v.cache_hash for v in mine}
    return Plan(the_plan.target, {h: v for h, v in the_plan.variants.items() if h in keep}, the_plan.rows,
                list(the_plan.unreachable), list(the_plan.redundant), list(the_plan.errors),
                list(the_plan.collapse_errors), failed_rows=list(the_plan.failed_rows))


def recorded_seconds(path: str | Path) -> dict[str, float]:
    """Compile times recorded in a bundle or a ``manifest-<target>.json`` (cache hash → seconds)."""
    from ..cache.bundle import read_header

    path = Path(path)
    if path.suffix == ".json":
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError) as e:
            raise ValueError(f"--shard-times {path}: unreadable ({e})") from None
        if not isinstance(data, dict) or not isinstance(data.get("variants"), dict):
            raise ValueError(f"--shard-times {path}: not a manifest (no table of variants); name a bundle "
                             "or a cache's tritonwarm/manifest-<target>.json")
        tables = [data["variants"]]
    else:
        tables = list(read_header(path)["targets"].values())
    times = {}
    for table in tables:
        for cache_hash, row in table.items():
            if isinstance(row, dict) and isinstance(row.get("compile_seconds"), (int, float)):
                times[cache_hash] = float(row["compile_seconds"])
    return times
