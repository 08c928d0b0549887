"""Registers, local memory (spills) and shared memory of a cubin, read offline with the
``cuobjdump`` Triton's wheel ships; SASS with the same tool. No GPU and no CUDA toolkit needed."""

from __future__ import annotations

import re
import subprocess
from functools import lru_cache
from pathlib import Path

_USAGE = re.compile(r"REG:(\d+)\s+STACK:(\d+)\s+SHARED:(\d+)\s+LOCAL:(\d+)")


@lru_cache(maxsize=1)
def cuobjdump() -> Path | None:
    import triton

    path = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    return path if path.exists() else None


def resource_usage(target, files: dict[str, str]) -> dict | None:
    """``{"registers", "stack", "shared", "local"}`` for an NVIDIA entry, else Triton's metadata only."""
    cubin = next((p for name, p in files.items() if name.endswith(".cubin")), None)
    tool = cuobjdump()
    if cubin is None or tool is None:
        return None
    try:
        out = subprocess.run([str(tool), "--dump-resource-usage", cubin], capture_output=True, text=True,
                             timeout=60, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    match = _USAGE.search(out)
    if not match:
        return None
    registers, stack, shared, local = map(int, match.groups())
    # Local memory in a Triton kernel is register spill space (Triton allocates no local arrays).
    return {"registers": registers, "stack": stack, "shared": shared, "local": local}


def sass(cubin: Path) -> str:
    tool = cuobjdump()
    if tool is None:
        raise LookupError("cuobjdump is not shipped with this Triton: no SASS")
    return subprocess.run([str(tool), "--dump-sass", str(cubin)], capture_output=True, text=True, timeout=120,
                          check=True).stdout
