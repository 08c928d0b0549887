"""Checking: a plan against the cache, as the runtime would see it: what serving would compile, what
is stale or damaged, what the specs cannot reach."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from .cache import Manifest, cache_env, entry_files, files_match_record, triton_version
from .plan import Plan


@dataclass
class CheckReport:
    target: str
    planned: int
    missing: list[dict] = field(default_factory=list)
    stale: list[dict] = field(default_factory=list)
    corrupt: list[dict] = field(default_factory=list)
    unreachable: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    collapse_errors: list[str] = field(default_factory=list)
    redundant: list[str] = field(default_factory=list)
    unknown_winners: list[str] = field(default_factory=list)  # autotuned calls serving would benchmark
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not (self.missing or self.stale or self.corrupt or self.unreachable or self.errors
                    or self.collapse_errors or self.unknown_winners)

    def to_json(self) -> dict:
        return {**self.__dict__, "ok": self.ok}


def check(the_plan: Plan, cache_dir: Path) -> CheckReport:
    """Plan vs cache: what serving would compile, what is stale or damaged, what the spec cannot reach."""
    target = the_plan.target
    report = CheckReport(target.name, len(the_plan.variants), unreachable=list(the_plan.unreachable),
                         errors=list(the_plan.errors), collapse_errors=list(the_plan.collapse_errors),
                         redundant=list(the_plan.redundant), notes=list(the_plan.notes))
    recorded = Manifest(cache_dir, target.name).read()
    for variant in the_plan.variants.values():
        files = entry_files(cache_dir, variant.cache_dir_name, variant.entry_name)
        summary = {"id": variant.variant_id, "kernel": variant.kernel, "args": variant.args, "rows": variant.rows}
        if files is None:
            report.missing.append(summary)
        elif not files_match_record(files, recorded.get(variant.cache_hash)):
            report.corrupt.append(summary)
    version, env = triton_version(), cache_env()
    for cache_hash, entry in recorded.items():
        reasons = []
        if entry.get("triton_version") != version:
            reasons.append(f"Triton {entry.get('triton_version')} (now {version})")
        changed = sorted(k for k in set(env) | set(entry.get("env", {})) if env.get(k) != entry.get("env", {}).get(k))
        if changed:
            reasons.append("environment changed: " + ", ".join(changed))
        if reasons:
            report.stale.append({"id": cache_hash[:12], "kernel": entry.get("kernel"), "why": "; ".join(reasons)})
    return report
