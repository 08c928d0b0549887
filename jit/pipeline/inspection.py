"""Inspecting what was warmed: the variants of a cache, one variant in full, its IR."""

from __future__ import annotations

import contextlib
from pathlib import Path

from ..cache import manifests


def list_variants(cache_dir: Path, *, target: str | None = None, kernel: str | None = None) -> list[dict]:
    rows = []
    for name, manifest in manifests(cache_dir).items():
        if target and name != target:
            continue
        for entry in manifest.read().values():
            if kernel and kernel not in entry["kernel"]:
                continue
            rows.append(entry)
    return sorted(rows, key=lambda e: (e["target"], e["kernel"], e["id"]))


def find_variant(cache_dir: Path, variant_id: str) -> dict:
    matches = [e for e in list_variants(cache_dir) if e["id"].startswith(variant_id) or e["cache_hash"] == variant_id]
    if not matches:
        raise LookupError(f"no warmed variant {variant_id!r} in {cache_dir} (see `tritonwarm list`)")
    if len(matches) > 1:
        raise LookupError(f"{variant_id!r} is ambiguous: " + ", ".join(f"{m['id']} ({m['target']})" for m in matches))
    return matches[0]


IR_KINDS = ("ttir", "ttgir", "llir", "ptx", "sass", "amdgcn")


def variant_ir(cache_dir: Path, entry: dict, ir: str) -> str:
    from .resources import sass

    folder = Path(cache_dir) / entry["entry_dir"]
    name = entry["entry_name"]
    if ir == "sass":
        cubin = folder / f"{name}.cubin"
        if not cubin.exists():
            raise LookupError(f"variant {entry['id']} has no cubin (target {entry['target']}): no SASS")
        return sass(cubin)
    path = folder / f"{name}.{ir}"
    if not path.exists():
        have = sorted(p.suffix[1:] for p in folder.glob(f"{name}.*") if p.suffix[1:] in IR_KINDS)
        raise LookupError(f"variant {entry['id']} has no {ir} (it has: {', '.join(have) or 'none'})")
    with contextlib.suppress(UnicodeDecodeError):
        return path.read_text()
    raise LookupError(f"{path.name} is binary")
