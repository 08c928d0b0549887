"""Time from reading a hostile spec file to its one-line error, against a normal spec, past start-up.

Each spec is loaded in this process after the imports (``load_specs``), so the figure is what the
spec costs, not Python's start-up. Before the limits, the 40 KB nested list ran 36 to 42 s into a
recursion error and the chain of ``+`` failed in Python's parser; neither named the file.

    python bench/hostile_specs.py
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(__file__))
from _common import table  # noqa: E402

HEAD = "launcher: tritonwarm.launchers.rms_norm:rms_norm\naxes:\n  a: [1]\n"
NORMAL = HEAD + "args:\n  x: {tensor: [16, 4096], dtype: bfloat16}\n  weight: {tensor: [4096], dtype: bfloat16}\n"


def specs() -> dict[str, str]:
    depth = 20_000
    return {
        "normal rms_norm spec": NORMAL,
        "40 KB of nested lists": HEAD + "args:\n  x: " + "[" * depth + "1" + "]" * depth + "\n",
        "80 mappings nested by indentation": HEAD + "args:\n" + "".join("  " * (i + 1) + f"k{i}:\n" for i in range(80))
        + "  " * 81 + "v: 1\n",
        "21 KB chain of + in one expression": HEAD + "args:\n  x: $" + "+".join(["a"] * 10_500) + "\n",
        "900 unary minus in one expression": HEAD + "args:\n  x: $" + "-" * 900 + "a\n",
    }


def main() -> None:
    from tritonwarm.jit.pipeline.specs import SpecError, load_specs

    rows, baseline = [], None
    with tempfile.TemporaryDirectory(prefix="tritonwarm-specs-") as tmp:
        load_specs([_write(Path(tmp), "warm.yaml", NORMAL)])  # imports the launcher once
        for label, text in specs().items():
            path = _write(Path(tmp), "spec.yaml", text)
            started = time.perf_counter()
            try:
                load_specs([path])
                said = "ok"
            except SpecError as e:
                said = str(e).replace(f"{path}", "spec.yaml")
            seconds = time.perf_counter() - started
            baseline = baseline or seconds
            rows.append((label, f"{len(text) / 1000:.1f}", f"{seconds:.3f}", f"{seconds / baseline:.1f}", said[:100]))
    table("Time to load a spec file, or refuse it (past start-up)", ["spec", "KB", "s", "x normal", "says"], rows,
          "python bench/hostile_specs.py")


def _write(folder: Path, name: str, text: str) -> Path:
    path = folder / name
    path.write_text(text)
    return path


if __name__ == "__main__":
    main()
