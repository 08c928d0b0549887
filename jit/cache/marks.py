"""A mark a warm-up leaves in the cache while it runs: one that outlives its warm-up (Ctrl-C, SIGTERM,
``kill -9``, a machine that went away) tells ``check`` the cache is partly filled, and what to do."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import time
from pathlib import Path

from .layout import _running, write_json_atomic

MARKS = "warmups"


def _folder(cache_dir: Path) -> Path:
    return Path(cache_dir) / "tritonwarm" / MARKS


@contextlib.contextmanager
def warmup_mark(cache_dir: Path):
    """Inside the block a mark names this warm-up; it goes when the block ends (problems included:
    the warm-up ran to its end), with the marks of earlier warm-ups that did not, since this one ran
    again; and on an error, which the warm-up reports itself. On Ctrl-C it stays, as on a signal or
    a ``kill -9``, which end the process before any of this runs."""
    folder = _folder(cache_dir)
    mark = folder / f"{os.getpid()}-{time.time_ns()}.json"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        write_json_atomic(mark, {"pid": os.getpid(), "host": socket.gethostname(), "started": time.time()})
    except OSError:
        mark = None  # a cache that cannot take the mark cannot take entries either: warm-up says so
    try:
        yield
    except Exception:
        if mark is not None:
            with contextlib.suppress(OSError):
                mark.unlink()
        raise
    for old in unfinished(cache_dir):
        if old["path"] == mark or not old["running"]:
            with contextlib.suppress(OSError):
                old["path"].unlink()


def unfinished(cache_dir: Path) -> list[dict]:
    """The marks of warm-ups that did not end: ``{path, started, host, running}``, oldest first
    (``running``: its process is alive on this machine, or it ran on another one)."""
    found = []
    for path in sorted(_folder(cache_dir).glob("*.json")):
        try:
            data = json.loads(path.read_text())
            started, host, pid = float(data["started"]), str(data["host"]), int(data["pid"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
        here = host == socket.gethostname()
        found.append({"path": path, "started": started, "host": host, "running": not here or _running(pid)})
    return sorted(found, key=lambda m: m["started"])


def interrupted_line(cache_dir: Path) -> str | None:
    """What ``check`` says of the warm-ups that did not finish, or None."""
    marks = [m for m in unfinished(cache_dir) if not m["path"].name.startswith(f"{os.getpid()}-")]
    if not marks:
        return None
    m = marks[-1]
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(m["started"]))
    if m["host"] != socket.gethostname():
        return f"the warm-up of {when} on {m['host']} did not finish (interrupted, or running there): run it again"
    if m["running"]:
        return f"the warm-up of {when} is still running: check when it has finished"
    return f"the warm-up of {when} was interrupted: run it again"
