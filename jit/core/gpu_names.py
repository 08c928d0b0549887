"""GPU names (h100, mi300x, ...) for the targets Triton compiles for: a user knows the GPU their
servers have, not its architecture number. Several GPUs share one target: a binary for sm90 runs on
an H100, H200, H800 or H20 alike."""

from __future__ import annotations

import difflib
import re

GPUS: dict[str, str] = {
    # NVIDIA Ampere (data centre), sm80
    "a100": "sm80", "a800": "sm80", "a30": "sm80",
    # NVIDIA Ampere (workstation, consumer), sm86
    "a10": "sm86", "a10g": "sm86", "a40": "sm86", "a6000": "sm86", "rtx3090": "sm86", "rtx3080": "sm86",
    # NVIDIA Ada, sm89
    "l4": "sm89", "l40": "sm89", "l40s": "sm89", "rtx4090": "sm89", "rtx4080": "sm89", "rtx6000ada": "sm89",
    # NVIDIA Hopper, sm90
    "h100": "sm90", "h200": "sm90", "h800": "sm90", "h20": "sm90", "gh200": "sm90",
    # NVIDIA Blackwell (data centre), sm100
    "b200": "sm100", "gb200": "sm100", "b100": "sm100",
    # NVIDIA Blackwell Ultra (data centre), sm103
    "b300": "sm103", "gb300": "sm103",
    # NVIDIA Blackwell (workstation, consumer), sm120
    "rtx5090": "sm120", "rtx5080": "sm120", "rtxpro6000": "sm120",
    # NVIDIA Blackwell (DGX Spark), sm121
    "gb10": "sm121", "dgxspark": "sm121",
    # AMD CDNA2, gfx90a
    "mi250x": "gfx90a", "mi250": "gfx90a", "mi210": "gfx90a",
    # AMD CDNA3, gfx942
    "mi300x": "gfx942", "mi300a": "gfx942", "mi325x": "gfx942",
    # AMD CDNA4, gfx950
    "mi350x": "gfx950", "mi355x": "gfx950",
}

_NOISE = re.compile(r"nvidia|amd|instinct|geforce|tesla|[^a-z0-9]")


def normalized(name: str) -> str:
    """``NVIDIA H100 80GB HBM3`` → ``h10080gbhbm3``: case, vendor words and punctuation dropped."""
    return _NOISE.sub("", name.lower())


def target_of_gpu(name: str) -> str | None:
    """The target name for a GPU name (``h100``, ``H100-SXM``, ``NVIDIA H200``, ``MI300X``); None when
    unknown. The longest known name the given one starts with wins (``a100-80gb`` is an a100, not an a10)."""
    key = normalized(name)
    if key in GPUS:
        return GPUS[key]
    for known in sorted(GPUS, key=len, reverse=True):
        if key.startswith(known):
            return GPUS[known]
    return None


def gpus_of(target: str) -> list[str]:
    """The GPU names that map to ``target``, in the table's order."""
    return [gpu for gpu, t in GPUS.items() if t == target]


def nearest(name: str, targets) -> str | None:
    """The known target or GPU name closest to a mistyped one, never one of another model: ``h10`` →
    ``h100`` and ``sm_90`` → ``sm90``, but ``b300`` is no ``b200``, ``sm103`` no ``sm100`` and ``b400``
    no ``l40``: their series or numbers, and so their compute capabilities, differ. A name is suggested
    where its letters before the first digit are the typed ones and one's digits begin the other's (a
    digit missing or one too many)."""
    series, number = _model(name)
    close = difflib.get_close_matches(name.lower(), [*targets, *GPUS], n=10, cutoff=0.5)
    for known in close:
        known_series, known_number = _model(known)
        if known_series == series and (known_number.startswith(number) or number.startswith(known_number)):
            return known
    return None


def _model(name: str) -> tuple[str, str]:
    """``(series, number)``: ``NVIDIA H100-SXM`` → ``("h", "100")``, ``sm_103`` → ``("sm", "103")``."""
    key = normalized(name)
    series = re.match(r"[a-z]*", key).group()
    return series, "".join(c for c in key if c.isdigit())
