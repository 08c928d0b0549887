"""What a person reads: lines that fit the terminal, rows folded into one line per cause, numbers
with their units, and each note said once.

A command's default output is one line per cause with its count and at most ``EXAMPLES`` examples;
``--verbose`` lists the rows and ``--json`` gives everything. Every module that prints (the command
line, the engine, the check reports) builds its lines with these helpers, so the rules hold everywhere.
"""

from __future__ import annotations

import hashlib
import re
import shutil
import sys
import textwrap
from collections.abc import Callable, Iterable
from pathlib import Path

from .errors import printable

NOT_A_TERMINAL = 200  # columns when output goes to a file or a pipe: logs keep long lines whole
MIN_WIDTH = 40
EXAMPLES = 3  # examples a folded line names


def width() -> int:
    """Columns a line may take: ``$COLUMNS``, else the terminal's, else ``NOT_A_TERMINAL``."""
    return max(MIN_WIDTH, shutil.get_terminal_size((NOT_A_TERMINAL, 24)).columns)


def wrapped(prefix: str, text: str, columns: int | None = None) -> list[str]:
    """``prefix + text`` as lines of at most ``columns`` (default ``width()``), continuation lines
    indented under the prefix; ``text`` (which may hold names a cache, a bundle or Redis chose) with
    its control characters escaped. A word longer than a line (a path) is kept whole."""
    columns = columns or width()
    line = prefix + printable(text)
    if len(line) <= columns:
        return [line]
    indent = " " * (len(prefix) - len(prefix.lstrip()) + 4)
    return textwrap.wrap(line, columns, subsequent_indent=indent, break_long_words=False,
                         break_on_hyphens=False) or [line]


def say(prefix: str, text: str, file=None) -> None:
    """Print ``prefix + text`` wrapped to the terminal (see ``wrapped``)."""
    print("\n".join(wrapped(prefix, text)), file=file)


def plural(count: int, noun: str, nouns: str | None = None) -> str:
    """``1 row``, ``3 rows``; ``nouns`` for an irregular plural (``1 entry``, ``2 entries``)."""
    return f"{count} {noun if count == 1 else nouns or noun + 's'}"


def examples(names: Iterable[str], limit: int = EXAMPLES) -> str:
    """``a, b, c and 4 more``: the distinct names in their first order, at most ``limit`` of them."""
    distinct = list(dict.fromkeys(names))
    shown = ", ".join(distinct[:limit])
    return shown + (f" and {len(distinct) - limit} more" if len(distinct) > limit else "")


def fold(items: Iterable, cause: Callable[[object], str]) -> dict[str, list]:
    """``{cause: [items]}`` in the order each cause first appears: one line per key, with its count."""
    folded: dict[str, list] = {}
    for item in items:
        folded.setdefault(cause(item), []).append(item)
    return folded


_ROW = re.compile(r"(?P<row>[^\s:]+#\d+ \([^()]*\)): (?P<rest>.+)", re.S)  # a spec row's label, then what happened


def fold_rows(lines: Iterable[str]) -> list[str]:
    """Lines that start with a spec row's label (``s.yaml#3 (n=16): ...``) and say the same after it,
    as one line: ``12 rows (s.yaml#0 (n=1) and 11 more): ...``; every other line as it is."""
    folded: dict[str, list[str]] = {}
    for line in lines:
        match = _ROW.fullmatch(line)
        folded.setdefault(match.group("rest") if match else line, []).append(match.group("row") if match else "")
    out = []
    for rest, rows in folded.items():
        if len(rows) == 1 or not rows[0]:
            out += [f"{row}: {rest}" if row else rest for row in rows]
        else:
            out.append(f"{len(rows)} rows ({examples(rows, 1)}): {rest}")
    return out


def mib(n_bytes: float) -> str:
    """A size in MiB, the one unit every command uses for sizes: ``12.34 MiB``."""
    return f"{n_bytes / 2**20:.2f} MiB"


_said: set[str] = set()
_waiting: list[tuple[str, bool]] = []  # (note, kept per folder) until the command's work begins
_per_folder: set[str] = set()


def note(text: str, file=None) -> None:
    """``tritonwarm: note: text`` on stderr, at most once per command (process), wrapped."""
    if text in _said:
        return
    _said.add(text)
    say("tritonwarm: note: ", text, file=file or sys.stderr)


def note_later(text: str, *, per_folder: bool = False) -> None:
    """A note to say before the result, once the command's input is known good (``notes_now``):
    never beside a one-line error. ``per_folder``: a note on what the cache folder's keys carry,
    said once per folder (see ``notes_now``)."""
    if text not in (t for t, _ in _waiting):
        _waiting.append((text, per_folder))
    if per_folder:
        _per_folder.add(text)


def notes_now(folder: Path | None = None) -> None:
    """Say the waiting notes, once each. A per-folder note is left out where ``folder`` (a cache's
    own state folder) records it as said: a chain of commands on one cache (the README's set-up line)
    says it once, in the first command that warmed the folder (``remember_notes``)."""
    for text, per_folder in _waiting:
        if not (per_folder and folder is not None and _marker(folder, text).exists()):
            note(text)
    _waiting.clear()


def remember_notes(folder: Path) -> None:
    """Record the per-folder notes said in this command as said for ``folder`` (a command that wrote
    there); best effort: a folder that cannot be written hears them again."""
    for text in _said & _per_folder:
        marker = _marker(folder, text)
        try:
            marker.parent.mkdir(parents=True, exist_ok=True)
            marker.write_text(text + "\n")
        except OSError:
            pass


def new_command() -> None:
    """A command starts (``tritonwarm.cli.main``): no note said or waiting yet."""
    _said.clear()
    _waiting.clear()


def drop_notes() -> None:
    """Forget the waiting notes (the command failed: its one-line error stands alone)."""
    _waiting.clear()


def _marker(folder: Path, text: str) -> Path:
    return Path(folder) / "notes" / hashlib.sha256(text.encode()).hexdigest()[:16]
