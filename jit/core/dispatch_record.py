"""The dispatch record: one JSON line per variant a workload launched, with hit or miss.

``engine run --record FILE`` writes it; ``check --trace`` and ``prune --unused`` read it. This is the
one place that knows its fields, so a writer and a reader cannot drift, and a line that is not a
record is reported as ``file:line: not a dispatch record`` instead of failing somewhere later.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

# field -> the types a valid line may hold there; optional: "first" (the step that first needed it),
# and Triton's key, the options and the reason of a miss (records written before them lack them)
_NONE = type(None)
FIELDS: dict[str, tuple[type, ...]] = {
    "kernel": (str,), "target": (str,), "variant": (str,), "cache_hash": (str,), "hit": (bool,),
    "args": (dict,), "launches": (int,),
}
OPTIONAL: dict[str, tuple[type, ...]] = {"first": (dict, _NONE), "key": (str, _NONE), "num_warps": (int, _NONE),
                                         "num_stages": (int, _NONE), "entry_name": (str, _NONE),
                                         "why": (str, _NONE)}


def write_record(path: str | Path, lines: Iterable[dict]) -> None:
    """Write one JSON object per line; each is checked first, so a writer cannot produce a bad record."""
    checked = [_validated(line, f"{path}:{n}") for n, line in enumerate(lines, 1)]
    with open(path, "w") as f:
        for line in checked:
            f.write(json.dumps(line) + "\n")


def read_record(path: str | Path) -> list[dict]:
    """Every line of a dispatch record, validated; blank lines are skipped."""
    try:
        text = Path(path).read_text()
    except OSError as e:
        raise ValueError(f"{path}: cannot read the dispatch record: {e.strerror or e}") from None
    lines = []
    for number, raw in enumerate(text.splitlines(), 1):
        if not raw.strip():
            continue
        try:
            line = json.loads(raw)
        except ValueError:
            raise ValueError(f"{path}:{number}: not a dispatch record (not a JSON object)") from None
        lines.append(_validated(line, f"{path}:{number}"))
    return lines


def _validated(line, where: str) -> dict:
    if not isinstance(line, dict):
        raise ValueError(f"{where}: not a dispatch record (not a JSON object)")
    for name, types in {**FIELDS, **OPTIONAL}.items():
        if name not in line:
            if name in FIELDS:
                raise ValueError(f"{where}: not a dispatch record (no {name!r})")
            continue
        value = line[name]
        if not isinstance(value, types) or (bool not in types and isinstance(value, bool)):
            raise ValueError(f"{where}: not a dispatch record ({name!r} is {value!r})")
    return line
