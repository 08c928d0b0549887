"""Disk use of a cache and pruning: what each kernel and target costs, and what can go.

Pruning removes whole Triton entries (the folder named by the cache hash) and their manifest
records, each under the variant's lock, so a concurrent warm-up never sees half an entry.
"""

from __future__ import annotations

import shutil
from collections import defaultdict
from pathlib import Path

from .env import current_fingerprint, differences, same_environment
from .layout import entry_dir_name, entry_path, variant_lock
from .manifest import Manifest, entry_fingerprint, manifests


def _size(folder: Path) -> int:
    try:
        return sum(p.stat().st_size for p in folder.iterdir() if p.is_file())
    except OSError:
        return 0


def disk_usage(cache_dir: Path) -> dict:
    """Bytes and variant counts per (target, kernel), plus Triton entries no manifest knows."""
    cache_dir = Path(cache_dir)
    rows: dict[tuple[str, str], dict] = defaultdict(lambda: {"variants": 0, "bytes": 0})
    known: set[str] = set()
    for target, manifest in manifests(cache_dir).items():
        for entry in manifest.read().values():
            folder = cache_dir / entry["entry_dir"]
            known.add(entry["entry_dir"])
            row = rows[(target, entry["kernel"])]
            row["variants"] += 1
            row["bytes"] += _size(folder)
    other = [p for p in cache_dir.iterdir() if p.is_dir() and p.name != "tritonwarm" and p.name not in known] \
        if cache_dir.is_dir() else []
    return {
        "kernels": [{"target": t, "kernel": k, **v} for (t, k), v in sorted(rows.items())],
        "unmanaged": {"entries": len(other), "bytes": sum(_size(p) for p in other)},
        "total_bytes": sum(v["bytes"] for v in rows.values()) + sum(_size(p) for p in other),
    }


def prune_candidates(cache_dir: Path, *, target: str | None = None, planned: dict[str, set[str]] | None = None,
                     used: dict[str, set[str]] | None = None, other_environments: bool = False,
                     other_versions: bool = False) -> list[dict]:
    """Manifest entries to remove, each with the reason.

    ``planned``: target → cache hashes some spec plans (entries outside it go); ``used``: target →
    cache hashes a dispatch record saw there (entries of those targets outside it go; a target the
    record never launched on is not judged); ``other_environments`` (``other_versions``
    is its old name): entries warmed under another environment than the runtime's (another Triton
    version or libtriton, backend or cache-invalidating env): that runtime can never read them.
    A plan is computed for the runtime's environment, so it judges only that environment's entries:
    what was warmed for another (``warmup --for``) is never "unplanned".
    """
    other_environments = other_environments or other_versions
    runtime = current_fingerprint() if (other_environments or planned is not None) else None
    doomed = []
    for name, manifest in manifests(cache_dir).items():
        if target and name != target:
            continue
        environments = manifest.environments() if runtime is not None else {}
        for cache_hash, entry in manifest.read().items():
            reasons = []
            warmed = entry_fingerprint(entry, environments) if runtime is not None else None
            if (planned is not None and name in planned and cache_hash not in planned[name]
                    and same_environment(warmed, runtime, name)):
                reasons.append("no spec plans it")
            if used is not None and name in used and cache_hash not in used[name]:
                reasons.append("the dispatch record never used it")
            if other_environments:
                if warmed["triton"].get("version") != runtime["triton"]["version"]:
                    reasons.append(f"compiled by Triton {warmed['triton'].get('version')}")
                elif not same_environment(warmed, runtime, name):
                    lines = differences(warmed, runtime, targets=[name])
                    reasons.append(f"warmed under another environment ({lines[0] if lines else 'unrecorded'})")
            if reasons:
                doomed.append({"target": name, "id": entry["id"], "kernel": entry["kernel"],
                               "cache_hash": cache_hash, "entry_dir": entry["entry_dir"],
                               "bytes": _size(Path(cache_dir) / entry["entry_dir"]), "why": "; ".join(reasons)})
    return doomed


def remove(cache_dir: Path, doomed: list[dict]) -> None:
    by_target: dict[str, list[str]] = defaultdict(list)
    for item in doomed:
        with variant_lock(cache_dir, item["cache_hash"]):  # the folder the hash names, whatever a record says
            shutil.rmtree(entry_path(cache_dir, entry_dir_name(item["cache_hash"])), ignore_errors=True)
        by_target[item["target"]].append(item["cache_hash"])
    for target, hashes in by_target.items():
        manifest = Manifest(cache_dir, target)
        manifest.update(remove=hashes)
        manifest.compact()


def used_hashes(record_path: Path) -> dict[str, set[str]]:
    """Target → the cache hashes a dispatch record (``engine run --record``) launched there. A record
    that holds no launch is refused: a server that died before writing it must not empty the cache."""
    from ..core.dispatch_record import read_record
    from ..core.targets import TARGETS

    used: dict[str, set[str]] = defaultdict(set)
    for number, line in enumerate(read_record(record_path), 1):
        if line["target"] not in TARGETS:
            raise ValueError(f"{record_path}: line {number}: unknown target {line['target']!r}")
        used[line["target"]].add(line["cache_hash"])
    if not used:
        raise ValueError(f"{record_path} is empty: no launch was recorded, so nothing can be judged unused")
    return dict(used)
