"""What a person reads: lines that fit the terminal, rows folded into one line per cause, numbers
with their units, and each note said once.

A command's default output is one line per cause with its count and at most ``EXAMPLES`` examples;
``--verbose`` lists the rows and ``--json`` gives everything. Every module that prints (the command
line, the engine, the check reports) builds its lines with these helpers, so the rules hold everywhere.
"""

from __future__ import annotations

import shutil
import sys
import textwrap
from collections.abc import Callable, Iterable

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


def mib(n_bytes: float) -> str:
    """A size in MiB, the one unit every command uses for sizes: ``12.34 MiB``."""
    return f"{n_bytes / 2**20:.2f} MiB"


_said: set[str] = set()


def note(text: str, file=None) -> None:
    """``tritonwarm: note: text`` on stderr, at most once per command (process), wrapped."""
    if text in _said:
        return
    _said.add(text)
    say("tritonwarm: note: ", text, file=file or sys.stderr)
