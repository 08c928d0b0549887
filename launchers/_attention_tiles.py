"""The declared split-kernel settings of paged decode attention, per target and geometry class.

``paged_attention_tiles.json`` is the single source: the launch spec asks ``settings_for`` which
entry applies. The target comes from Triton's active driver, so under ``tritonwarm warmup --target
sm90`` (the target-only driver) the spec picks the ``cuda:90`` entries and on a real GPU those of
that GPU; a host with no driver (the interpreter on a CPU host) takes ``default``.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path

from ..jit.core.targets import active_gpu_target

TILES_FILE = Path(__file__).with_name("paged_attention_tiles.json")
GEOMETRY_CLASSES = ("wide", "narrow")
WIDE_KEY_DIM = 256  # keys wider than this (MLA's 576) are "wide"
# "schedule": the device-scheduled split kernel (mla_decode_metadata's parts); "grid": one program
# per (request, split), the split count chosen on the host from the batch (no schedule kernel).
KERNELS = ("schedule", "grid")


@dataclass(frozen=True)
class TileSettings:
    kernel: str
    block_n: int
    num_warps: int
    num_stages: int
    value_is_key: bool
    table_ahead: bool
    parts_per_sm: int


_CHECKS = {
    "kernel": lambda v: v in KERNELS,
    "block_n": lambda v: isinstance(v, int) and v >= 16 and v & (v - 1) == 0,
    "num_warps": lambda v: v in (1, 2, 4, 8, 16),
    "num_stages": lambda v: isinstance(v, int) and 1 <= v <= 8,
    "value_is_key": lambda v: isinstance(v, bool),
    "table_ahead": lambda v: isinstance(v, bool),
    "parts_per_sm": lambda v: isinstance(v, int) and 1 <= v <= 16,
}


def parse_tiles(data: dict, source: str) -> dict[str, dict[str, TileSettings]]:
    """``{target: {geometry class: TileSettings}}``; a bad field raises one line naming it."""
    if not isinstance(data, dict) or "default" not in data:
        raise ValueError(f"{source}: needs a 'default' target entry")
    table = {}
    for target, classes in data.items():
        if target.startswith("_"):
            continue
        if not isinstance(classes, dict) or set(classes) != set(GEOMETRY_CLASSES):
            raise ValueError(f"{source}: {target}: needs exactly the geometry classes {list(GEOMETRY_CLASSES)}")
        table[target] = {}
        for klass, fields in classes.items():
            where = f"{source}: {target}.{klass}"
            if not isinstance(fields, dict) or set(fields) != set(_CHECKS):
                raise ValueError(f"{where}: needs exactly the fields {sorted(_CHECKS)}")
            for name, ok in _CHECKS.items():
                if not ok(fields[name]):
                    raise ValueError(f"{where}.{name}: invalid value {fields[name]!r}")
            table[target][klass] = TileSettings(**fields)
    return table


@functools.cache
def load_tiles(path: str = str(TILES_FILE)) -> dict[str, dict[str, TileSettings]]:
    with open(path) as f:
        return parse_tiles(json.load(f), Path(path).name)


def target_name(gpu_target) -> str:
    """Triton's ``GPUTarget`` as the data file names it: ``cuda:90``, ``hip:gfx942``."""
    return f"{gpu_target.backend}:{gpu_target.arch}"


def settings_for(key_dim: int) -> TileSettings:
    """The declared settings for keys ``key_dim`` wide on the target of Triton's active driver
    (``active_gpu_target``), whatever the tensors' device: CPU tensors under warm-up's target-only
    driver must get the entry a GPU of that target gets (their keys are compared). No driver (the
    interpreter on a CPU host): the default entry."""
    klass = "wide" if key_dim > WIDE_KEY_DIM else "narrow"
    tiles = load_tiles()
    target = active_gpu_target()
    entries = tiles["default"] if target is None else tiles.get(target_name(target), tiles["default"])
    return entries[klass]
