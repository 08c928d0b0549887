"""``check --plain``: the same question asked of Triton alone, in a process tritonwarm does not run.

``check`` answers with tritonwarm's own tracer and records; this runs ``plain_triton.py`` in a fresh
Python that imports no tritonwarm module but the kernels' own, rebuilds each planned variant's compile
request from what the cache recorded, and counts the hits of Triton's own cache lookup (its compile
listener) in the folder checked, with this environment's variables: no GPU needed, nothing compiled.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from ..cache.layout import CacheError
from .plan import Plan

SCRIPT = Path(__file__).with_name("plain_triton.py")
TIMEOUT_S = 1800


@dataclass
class PlainReport:
    """What plain Triton found for the planned variants, per target."""

    cache_dir: str
    triton: str = ""
    planned: dict[str, int] = field(default_factory=dict)  # target -> variants asked for
    hits: dict[str, int] = field(default_factory=dict)  # target -> Triton's own cache hits
    compiles: list[dict] = field(default_factory=list)  # variants Triton would compile: {id, kernel, target}
    errors: list[dict] = field(default_factory=list)  # variants it could not ask for: {id, kernel, target, why}
    other_hashes: list[dict] = field(default_factory=list)  # hits under another hash than tritonwarm planned
    imported: list[str] = field(default_factory=list)  # the tritonwarm modules the process imported (kernels only)

    @property
    def ok(self) -> bool:
        return sum(self.hits.values()) == sum(self.planned.values()) and not self.other_hashes

    def to_json(self) -> dict:
        return {**self.__dict__, "ok": self.ok}

    def lines(self) -> list[str]:
        """``plain Triton: N/N hits`` and one line per cause of a miss, with counts."""
        planned, hits = sum(self.planned.values()), sum(self.hits.values())
        split = f" ({', '.join(f'{t} {self.hits[t]}/{n}' for t, n in self.planned.items())})" \
            if len(self.planned) > 1 else ""
        lines = [f"plain Triton: {hits}/{planned} hits{split}, Triton {self.triton}'s own lookup in {self.cache_dir}, "
                 "in a process that imports no tritonwarm module but the kernels'"]
        if self.compiles:
            lines.append(f"plain Triton would compile {len(self.compiles)}: {_kernels(self.compiles)}")
        for why, count in Counter(row["why"] for row in self.errors).items():
            lines.append(f"plain Triton could not ask for {count}: {why}")
        if self.other_hashes:
            lines.append(f"plain Triton found {len(self.other_hashes)} under other hashes than the plan's: "
                         f"{_kernels(self.other_hashes)}: tritonwarm's keys and Triton's differ there")
        return lines


def _kernels(rows: list[dict]) -> str:
    counts = Counter(row["kernel"].rsplit(".", 1)[-1] for row in rows)
    return ", ".join(f"{kernel} {count}" if count > 1 else kernel for kernel, count in sorted(counts.items()))


def plain_environment(cache_dir: Path) -> dict[str, str]:
    """This environment, with Triton reading ``cache_dir``. A ``TRITON_CACHE_MANAGER`` of tritonwarm's
    own (each reads the folder) is left out, so that the process imports none of tritonwarm; another
    one stays: Triton imports it, as the server does."""
    env = {**os.environ, "TRITON_CACHE_DIR": str(cache_dir)}
    if env.get("TRITON_CACHE_MANAGER", "").split(".")[0] == "tritonwarm":
        del env["TRITON_CACHE_MANAGER"]
    return env


def plain_check(plans: list[Plan], cache_dir: Path) -> PlainReport:
    """Run the plain Triton process over every planned variant of ``plans``, reading ``cache_dir``."""
    variants, kernels = [], {}
    for the_plan in plans:
        target = the_plan.target
        for variant in the_plan.variants.values():
            kernels[variant.variant_id] = (variant.kernel, target.name, variant.cache_hash)
            variants.append({"id": variant.variant_id, "target": target.name, "cache_hash": variant.cache_hash,
                             "jit_function": variant.jit_function, "specialization_data": variant.specialization_data,
                             "gpu_target": [target.backend, target.arch, target.warp_size]})
    report = PlainReport(str(cache_dir), planned={p.target.name: len(p.variants) for p in plans},
                         hits={p.target.name: 0 for p in plans})
    with tempfile.TemporaryDirectory(prefix="tritonwarm-plain-") as scratch:
        request, result = Path(scratch, "request.json"), Path(scratch, "result.json")
        request.write_text(json.dumps({"cache_dir": str(cache_dir), "sys_path": sys.path, "variants": variants}))
        try:
            done = subprocess.run([sys.executable, "-c", SCRIPT.read_text(), str(request), str(result)],
                                  env=plain_environment(cache_dir), capture_output=True, text=True,
                                  timeout=TIMEOUT_S, cwd=scratch)
        except subprocess.TimeoutExpired:
            raise CacheError(f"the plain Triton process did not finish in {TIMEOUT_S} s") from None
        if done.returncode != 0 or not result.exists():
            last = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
            raise CacheError(f"the plain Triton process failed (exit {done.returncode}): {last}")
        found = json.loads(result.read_text())
    report.triton, report.imported = found["triton"], found["tritonwarm_modules"]
    for row in found["results"]:
        kernel, target, planned_hash = kernels[row["id"]]
        summary = {"id": row["id"], "kernel": kernel, "target": target}
        if row["outcome"] == "hit" and row.get("hash") == planned_hash:
            report.hits[target] += 1
        elif row["outcome"] == "hit":
            report.other_hashes.append({**summary, "hash": row.get("hash")})
        elif row["outcome"] == "error":
            report.errors.append({**summary, "why": row["why"]})
        else:
            report.compiles.append(summary)
    return report
