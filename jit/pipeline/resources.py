"""Registers, local memory (spills) and shared memory of a compiled entry, read offline: the cubin
through the ``cuobjdump`` Triton's wheel ships (SASS with the same tool), shared memory also from
Triton's own metadata. No GPU and no CUDA toolkit needed."""

from __future__ import annotations

import json
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
    """What one program of an entry occupies: ``registers``, ``stack`` and spill (``local``) bytes
    from an NVIDIA cubin, and ``shared`` bytes for any target.

    ``shared`` is Triton's launch-time shared memory (the ``shared`` of the entry's metadata, which
    its launcher passes as dynamic shared memory: pipeline stages, layout conversions) plus the
    cubin's static part, which is all the cubin shows: 1 KB for an sm90 kernel whose pipeline
    stages take 160 KB."""
    usage: dict = {}
    metadata = next((p for name, p in files.items() if name.endswith(".json") and not name.startswith("__grp__")),
                    None)
    try:
        dynamic = int(json.loads(Path(metadata).read_text())["shared"]) if metadata else None
    except (OSError, ValueError, KeyError, TypeError):
        dynamic = None
    cubin = next((p for name, p in files.items() if name.endswith(".cubin")), None)
    tool = cuobjdump()
    static = 0
    if cubin is not None and tool is not None:
        try:
            out = subprocess.run([str(tool), "--dump-resource-usage", cubin], capture_output=True, text=True,
                                 timeout=60, check=True).stdout
        except (OSError, subprocess.SubprocessError):
            out = ""
        match = _USAGE.search(out)
        if match:
            registers, stack, static, local = map(int, match.groups())
            # Local memory in a Triton kernel is register spill space (Triton allocates no local arrays).
            usage.update(registers=registers, stack=stack, local=local)
    if dynamic is not None:
        usage["shared"] = dynamic + static
    elif "registers" in usage:
        usage["shared"] = static
    return usage or None


def sass(cubin: Path) -> str:
    tool = cuobjdump()
    if tool is None:
        raise LookupError("cuobjdump is not shipped with this Triton: no SASS")
    done = subprocess.run([str(tool), "--dump-sass", str(cubin)], capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        why = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
        raise LookupError(f"{cubin}: cuobjdump cannot read it ({why}): a damaged entry; "
                          "`tritonwarm check` finds it, `tritonwarm warmup` rebuilds it")
    return done.stdout
