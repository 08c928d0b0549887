"""Helpers shared by the benchmarks: run the CLI, print a table."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time


def tritonwarm(*args: str, env: dict | None = None) -> tuple[float, dict | None]:
    """Run ``python -m tritonwarm ARGS``; returns (wall seconds, parsed --json output or None)."""
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "tritonwarm", *args], capture_output=True, text=True,
                          env={**os.environ, **(env or {})})
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"tritonwarm {' '.join(args)} failed ({proc.returncode}): {proc.stderr.strip()}")
    return wall, (json.loads(proc.stdout) if "--json" in args else None)


def one_line(e: BaseException, limit: int = 160) -> str:
    """An exception as one table cell or log line: its type and the first line of its message."""
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {(text[0] if text else '')[:limit]}"


def table(title: str, header: list[str], rows: list[list], command: str) -> None:
    cells = [header] + [[str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    print(f"\n{title}\n$ {command}\n")
    print("| " + " | ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)) + " |")
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for row in cells[1:]:
        print("| " + " | ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) + " |")


def save_json(path: str | None, data) -> None:
    """Write a benchmark's figures as JSON (``--json PATH``); nothing when no path was given."""
    if path:
        with open(path, "w") as f:
            json.dump(data, f, indent=1, default=str)
