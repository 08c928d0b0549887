"""Mutation testing of the core modules with the README's fast test selection (mutmut).

Each module is mutated alone, in its own copy of the working tree laid out as a package
(``WORK/<module>/tritonwarm/``: the repository root is the package, which mutmut cannot mutate in
place), and only the test files that reach it run, with ``-m 'not slow'``. Results stay in WORK, so
a second run tests only what changed. Prints module | mutants | killed | survived | score, where a
mutant no test reaches counts as survived.

    bash bench/mutation.sh [--work DIR] [--jobs N] [--again] [MODULE ...]     # MODULE: a name of MODULES
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MUTMUT = "3.8.1"  # the version the table in docs/testing.md was measured with

# module -> the test files (fast tests) that reach it
MODULES: dict[str, tuple[str, list[str]]] = {
    "specialization": ("jit/core/specialization.py",
                       ["test_specialization.py", "test_runtime_keys.py", "test_core_checks.py"]),
    "miss": ("jit/serving/miss.py", ["test_miss_reasons.py", "test_monitor.py", "test_core_checks.py"]),
    "manifest": ("jit/cache/manifest.py",
                 ["test_manifest_journal.py", "test_damaged_records.py", "test_warmup.py", "test_env.py",
                  "test_core_checks.py"]),
    "records": ("jit/cache/records.py", ["test_damaged_records.py", "test_env.py", "test_core_checks.py"]),
    "layout": ("jit/cache/layout.py",
               ["test_disk.py", "test_damaged_records.py", "test_core_checks.py", "test_layout_checks.py"]),
    "plan": ("jit/pipeline/plan.py",
             ["test_plan_integrity.py", "test_warmup.py", "test_core_checks.py", "test_plan_checks.py"]),
    "trace": ("jit/core/trace.py",
              ["test_runtime_keys.py", "test_record.py", "test_core_checks.py", "test_trace_checks.py"]),
    "remote": ("jit/cache/remote.py", ["test_remote_cache.py", "test_cache_manager.py", "test_remote_checks.py"]),
    "overlay": ("jit/cache/overlay.py", ["test_overlay.py", "test_readonly_cache.py", "test_trust.py"]),
    "bundle": ("jit/cache/bundle.py",
               ["test_bundle.py", "test_bundle_hostile.py", "test_bundle_shard.py", "test_bundle_checks.py"]),
    "signing": ("jit/cache/signing.py", ["test_signing.py", "test_trust.py", "test_signing_checks.py"]),
}

# Left out of mutation runs: each would cost every surviving mutant its whole run time, and fixed
# examples beside it pin the same facts (test_specialization.py's production ranges and width limits).
DESELECT = ["test_specialization.py::test_random_ints_agree_with_triton"]

PYTEST_ARGS = ["-q", "-p", "no:xdist", "-p", "no:cacheprovider", "-m", "not slow", "--import-mode=importlib",
               "-W", "ignore::UserWarning"]

# debug: mutmut prints the tests' output to mutmut.log instead of catching it (with mutmut 3.8.1 and
# pytest 9.2, its stats run ended in pytest's exit code 3, an internal error, when it caught it).
PYPROJECT = """\
[tool.mutmut]
debug = true
source_paths = ["tritonwarm"]
only_mutate = {module}
pytest_add_cli_args_test_selection = {tests}
pytest_add_cli_args = {args}
process_isolation = "forkserver"
timeout_multiplier = 10.0

[tool.pytest.ini_options]
markers = ["slow: long tests", "triton_version: can differ between Triton releases", "gpu: needs a GPU"]
"""


def tracked_files() -> list[str]:
    """The working tree's files as git sees them (tracked and new, ignored ones left out)."""
    out = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, check=True,
                         capture_output=True, text=True).stdout
    return [p for p in out.split("\0") if p and (ROOT / p).is_file()]


def prepare(work: Path, name: str) -> Path:
    """``work/name/tritonwarm/`` = the working tree; source files changed since the last run are
    copied again (mutmut then re-mutates them), its mutant results kept otherwise."""
    module, tests = MODULES[name]
    where = work / name
    package = where / "tritonwarm"
    for rel in tracked_files():
        src, dst = ROOT / rel, package / rel
        if dst.exists() and dst.read_bytes() == src.read_bytes():
            continue
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, dst)
        stale = where / "mutants" / "tritonwarm" / rel
        if stale.exists():
            stale.unlink()  # mutmut re-copies (and re-mutates) it
    selection = [f"tritonwarm/tests/{t}" for t in tests if (ROOT / "tests" / t).exists()]
    args = PYTEST_ARGS + [f"--deselect=tritonwarm/tests/{test}" for test in DESELECT]
    (where / "pyproject.toml").write_text(PYPROJECT.format(module=json.dumps([f"tritonwarm/{module}"]),
                                                           tests=json.dumps(selection), args=json.dumps(args)))
    return where


def not_killed(where: Path, env: dict) -> list[str]:
    """The mutants a previous run in ``where`` left alive (``mutmut results``: ``name: status`` lines)."""
    if not (where / "mutants").is_dir():
        return []
    out = subprocess.run([sys.executable, "-m", "mutmut", "results"], cwd=where, env=env, capture_output=True,
                         text=True).stdout
    return [line.split(":")[0].strip() for line in out.splitlines() if line.startswith("    ") and ":" in line]


def run(where: Path, jobs: int, again: bool) -> dict:
    env = {**os.environ, "PYTHONPATH": ""}
    names = not_killed(where, env) if again else []  # mutmut keeps a result until it is named again
    with open(where / "mutmut.log", "w") as log:  # progress as it goes
        proc = subprocess.run([sys.executable, "-m", "mutmut", "run", "--max-children", str(jobs), *names],
                              cwd=where, env=env, stdout=log, stderr=subprocess.STDOUT)
    if proc.returncode != 0:
        raise SystemExit(f"mutmut failed in {where} ({proc.returncode}); its output is in {where / 'mutmut.log'}")
    subprocess.run([sys.executable, "-m", "mutmut", "export-cicd-stats"], cwd=where, env=env, check=True,
                   capture_output=True)
    survivors = subprocess.run([sys.executable, "-m", "mutmut", "results"], cwd=where, env=env, check=True,
                               capture_output=True, text=True).stdout
    (where / "survivors.txt").write_text(survivors)
    return json.loads((where / "mutants" / "mutmut-cicd-stats.json").read_text())


def row(name: str, stats: dict) -> list:
    killed = stats["killed"] + stats["timeout"]  # a mutant that hangs the tests is noticed too
    total = stats["total"]
    return [MODULES[name][0], total, killed, total - killed, f"{100 * killed / total:.1f} %" if total else "-"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("modules", nargs="*", metavar="MODULE", help=f"of {', '.join(MODULES)} (default: all)")
    parser.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "tritonwarm-mutation",
                        help="where the copies and results live (kept: a rerun tests only what changed)")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1,
                        help="mutants tested at once (default: one per CPU core)")
    parser.add_argument("--again", action="store_true",
                        help="test the survivors of the last run in WORK again (after tests were added)")
    args = parser.parse_args(argv)
    unknown = [m for m in args.modules if m not in MODULES]
    if unknown:
        parser.error(f"unknown module {unknown[0]!r}: one of {', '.join(MODULES)}")
    try:
        import mutmut
    except ImportError:
        print(f"mutmut is not installed: pip install 'mutmut=={MUTMUT}'", file=sys.stderr)
        return 2
    if getattr(mutmut, "__version__", MUTMUT) != MUTMUT:
        print(f"note: mutmut {mutmut.__version__}; the documented table was measured with {MUTMUT}", file=sys.stderr)
    rows = []
    for name in args.modules or list(MODULES):
        where = prepare(args.work, name)
        print(f"mutating {MODULES[name][0]} in {where} ...", file=sys.stderr, flush=True)
        rows.append(row(name, run(where, args.jobs, args.again)))
        print("| " + " | ".join(map(str, rows[-1])) + " |", file=sys.stderr, flush=True)
    total, killed = sum(r[1] for r in rows), sum(r[2] for r in rows)
    rows.append(["total", total, killed, total - killed, f"{100 * killed / total:.1f} %" if total else "-"])
    print("| module | mutants | killed | survived | score |\n|---|---|---|---|---|")
    for r in rows:
        print("| " + " | ".join(f"`{c}`" if i == 0 and c != "total" else str(c) for i, c in enumerate(r)) + " |")
    print(f"survivors: `mutmut results` (and `mutmut show NAME`) in {args.work}/MODULE")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
