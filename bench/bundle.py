"""Bundle size and install time per cache entry, full vs binary-only, against a plain ``cp -r`` of the
same cache measured in the same run (which is not usable at its new path: its groups name the old one).

    python bench/bundle.py [--targets sm90] [--jobs 2] [--repeat 3] [--cache-dir WARMED]

Warms the shipped specs into a temporary cache (or uses ``--cache-dir``), bundles it both ways, and
installs each bundle into fresh folders ``--repeat`` times (best time kept). "install (API)" is
``bundle.install`` in this process: extract, check every hash, flush each file to disk (not with
``--no-fsync``), move into place, merge the manifest; ``cp -r`` flushes nothing.
"install (CLI)" is the ``tritonwarm bundle install`` command as a user runs it: a new Python, Triton's
import, and the environment fingerprint (which hashes Triton's ~0.5 GB library) included.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(__file__))
from _common import table, tritonwarm  # noqa: E402


def _tree_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def _best(repeat: int, fn) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def _row(name, n, archive, raw, create, install_s, cli, cp_seconds, usable) -> list:
    return [name, n, f"{archive / 2**20:.2f}", f"{archive / n / 1024:.1f}", f"{raw / n / 1024:.1f}", create,
            f"{install_s * 1000:.0f}", f"{install_s / n * 1000:.2f}", cli, f"{install_s / cp_seconds:.2f}", usable]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--targets", default="sm90")
    p.add_argument("--jobs", default="2")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--cache-dir", help="an already warmed cache (of the shipped specs for --targets)")
    args = p.parse_args()
    from tritonwarm.jit.cache.bundle import install

    with tempfile.TemporaryDirectory(prefix="bench-bundle-") as tmp:
        tmp = Path(tmp)
        cache = Path(args.cache_dir) if args.cache_dir else tmp / "warmed"
        if not args.cache_dir:
            tritonwarm("warmup", "--target", args.targets, "--cache-dir", str(cache), "-j", args.jobs, "--json")
        entries_bytes = sum(_tree_bytes(d) for d in cache.iterdir() if d.is_dir() and d.name != "tritonwarm")

        def copy():
            target = tmp / f"cp-{time.perf_counter_ns()}"
            subprocess.run(["cp", "-r", str(cache), str(target)], check=True)
            shutil.rmtree(target)

        cp_seconds = _best(args.repeat, copy)
        rows, n = [], None
        for variant in ("full", "binary-only"):
            out = tmp / f"{variant}.tar.gz"
            extra = ["--binary-only"] if variant == "binary-only" else []
            create_s, _ = tritonwarm("bundle", "create", str(out), "--target", args.targets, "--cache-dir", str(cache),
                                     *extra)
            _, report = tritonwarm("bundle", "verify", str(out), "--json")
            n = report["entries"]

            def api_install(out=out, durable=True):
                dest = tmp / f"api-{time.perf_counter_ns()}"
                install(out, dest, compare_environment=False, durable=durable)
                shutil.rmtree(dest)

            api_s = _best(args.repeat, api_install)
            nosync_s = _best(args.repeat, lambda out=out: api_install(out, durable=False))
            cli_times = []
            for _ in range(args.repeat):
                dest = tmp / f"cli-{time.perf_counter_ns()}"
                cli_times.append(tritonwarm("bundle", "install", str(out), "--cache-dir", str(dest))[0])
                shutil.rmtree(dest)
            size = out.stat().st_size
            rows.append(_row(variant, n, size, report["bytes"], f"{create_s:.2f}", api_s, f"{min(cli_times):.2f}",
                             cp_seconds, "yes"))
            rows.append(_row(f"{variant}, --no-fsync", n, size, report["bytes"], "-", nosync_s, "-", cp_seconds, "yes"))
        rows.append(_row("baseline: cp -r of the cache", n, entries_bytes, entries_bytes, "-", cp_seconds, "-",
                         cp_seconds, "no (groups name the old path)"))
    table(f"Bundles of the shipped specs for {args.targets} (best of {args.repeat})",
          ["variant", "entries", "archive MiB", "KiB/entry (gz)", "KiB/entry (raw)", "create s", "install ms (API)",
           "ms/entry", "install s (CLI)", "install / cp -r", "usable at a new path"],
          rows, f"python bench/bundle.py --targets {args.targets} --repeat {args.repeat}")


if __name__ == "__main__":
    main()
