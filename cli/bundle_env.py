"""Bundles keyed for another environment: every line names the environment the bundle is for, and
the flag (``--for`` / ``--for-wheel``) that judges or makes it for a server; never a fix that fits
only the machine the command runs on."""

from __future__ import annotations

import re
from pathlib import Path


def environment_name(fp: dict, *, source: bool = True) -> str:
    """``Python 3.12, Triton 3.9.0`` and, where it was keyed for another runtime, the file that named it."""
    from ..jit.cache.env import python_name

    name = f"{python_name(fp)}, Triton {fp.get('triton', {}).get('version', '?')}"
    source = source and (fp.get("warmed_for") or {}).get("source")
    return f"{name} (keyed {for_flag(source)})" if source else name


def for_flag(source: str) -> str:
    """The flag that keys for the environment ``source`` (a wheel or a fingerprint file) describes."""
    return f"--for-wheel {source}" if str(source).endswith(".whl") else f"--for {source}"


_FIX = re.compile(r"(: every (?:\S+ )?key differs): .*$")


def bundle_differences(lines: list[str], bundle_fp: dict, runtime_fp: dict, judged: str) -> list[str]:
    """``differences`` lines for a bundle: the fix each names (for the runtime judged) replaced by one
    that fits a bundle: install it where its environment runs, or bundle for the runtime judged."""
    if not lines:
        return []
    kept = [_FIX.sub(r"\1", line) for line in lines]
    runtime = environment_name(runtime_fp, source=False)
    return kept + [f"this bundle is for {environment_name(bundle_fp)}, not {judged} ({runtime}): "
                   "install it where that runs, or warm and bundle for this one (warmup and bundle create with "
                   "the same --for / --for-wheel)"]


def keyed_elsewhere(cache_dir: Path, targets) -> str | None:
    """For ``bundle create`` without ``--for``: the environment other than this runtime's that the
    cache's entries were keyed for (``warmup --for`` / ``--for-wheel``), as a line with the flag."""
    from ..jit.cache import Manifest
    from ..jit.cache.env import current_fingerprint, same_environment

    runtime = current_fingerprint()
    for target in targets:
        for fp in Manifest(cache_dir, target.name).environments().values():
            source = (fp.get("warmed_for") or {}).get("source") if isinstance(fp, dict) else None
            if source and not same_environment(fp, runtime, target.name):
                return (f"the cache's {target.name} entries are keyed for {environment_name(fp)}, not this runtime: "
                        f"bundle them with `bundle create ... {for_flag(source)}`")
    return None
