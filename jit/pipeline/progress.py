"""A line on stderr every few seconds while a command works, saying what it is doing: a long warm-up
or an engine run on a CPU must never sit silent for minutes (vLLM #54529).

Commands name their phase with ``set_phase``; a tqdm bar, where one is drawn, pauses the lines.
``TRITONWARM_PROGRESS_SECONDS`` sets the interval (default 10; 0 turns the lines off).
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time

_state = {"phase": None, "paused": 0}
_lock = threading.Lock()


def set_phase(text: str | None) -> None:
    """What the command is doing now, for the next progress line."""
    _state["phase"] = text


@contextlib.contextmanager
def paused():
    """No progress lines inside the block (a progress bar draws its own)."""
    with _lock:
        _state["paused"] += 1
    try:
        yield
    finally:
        with _lock:
            _state["paused"] -= 1


def interval() -> float:
    try:
        return max(0.0, float(os.environ.get("TRITONWARM_PROGRESS_SECONDS", "10")))
    except ValueError:
        return 10.0


@contextlib.contextmanager
def heartbeat(label: str):
    """Inside the block, ``label: phase (N s)`` on stderr every ``interval()`` seconds, the first one
    after the interval too: a command that ends sooner prints nothing."""
    every = interval()
    if not every:
        yield
        return
    start, stop = time.monotonic(), threading.Event()

    def beat():
        while not stop.wait(every):
            if _state["paused"]:
                continue
            with contextlib.suppress(OSError, ValueError):  # a closed pipe: the reader left
                print(f"{label}: {_state['phase'] or 'working'} ({time.monotonic() - start:.0f} s)", file=sys.stderr,
                      flush=True)

    thread = threading.Thread(target=beat, name="tritonwarm-progress", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=1)
        set_phase(None)
