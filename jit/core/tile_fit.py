"""Tiles that fit before compiling: a launch spec estimates the shared memory of the tile it would
pick and takes a smaller one until it fits the target Triton's active driver compiles for (warm-up's
target-only driver, or the GPU's), so warm-up and the server pick the same tile. The compiled
binary is the proof (``jit.pipeline.resources.over_limits``); these are the facts the estimates stand on.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from .targets import Target, active_gpu_target, launch_limits, target_from_gpu_target

T = TypeVar("T")


def active_target() -> Target | None:
    """The target Triton's active driver compiles for (a GPU's, or warm-up's target-only driver's);
    None where there is none (Triton's interpreter, which has no limit)."""
    gpu = active_gpu_target()
    return target_from_gpu_target(gpu) if gpu is not None else None


def shared_budget(target: Target | None) -> int | None:
    """Bytes of shared memory (AMD: LDS) one program may use on ``target`` (None: no limit), less
    the allowance for what an estimate of the tiles does not count (``SHARED_ALLOWANCE``)."""
    if target is None:
        return None
    return launch_limits(target).shared - SHARED_ALLOWANCE[target.backend]


# What Triton adds to the tiles a kernel's loop pipelines, measured on compiled binaries (Triton 3.6
# and 3.9): NVIDIA 1 KB of static shared memory (sm90, sm120), barriers (sm100, 32 bytes); gfx950
# up to 2.5 KB besides the pipeline buffers. Kept free by ``shared_budget``.
SHARED_ALLOWANCE = {"cuda": 2048, "hip": 4096}


def pipeline_buffers(target: Target, num_stages: int, async_mma: bool = False) -> int:
    """How many copies of a loop's loaded tiles Triton's software pipeliner keeps in shared memory
    (measured on compiled binaries, Triton 3.6-3.9): ``num_stages`` where the matrix unit reads its
    operands from shared memory while the next loads land (``async_mma``: sm90's wgmma and sm100's
    tcgen05, used for tiles of 64 rows or more) and on gfx95x; else ``num_stages - 1`` (the last
    stage is in registers), at least 1."""
    if (target.is_nvidia and async_mma and int(target.arch) >= 90) or str(target.arch).startswith("gfx95"):
        return max(num_stages, 1)
    return max(num_stages - 1, 1)


def async_mma(target: Target, rows: int) -> bool:
    """Whether a ``tl.dot`` of ``rows``-row tiles runs on an asynchronous matrix unit that reads its
    operands from shared memory (sm90's wgmma, sm100's tcgen05: 64 rows or more)."""
    return target.is_nvidia and 90 <= int(target.arch) < 120 and rows >= 64


def fit_tile(tile: T, need: Callable[[T], int], smaller: Callable[[T], T | None], budget: int | None,
             what: str = "tile") -> T:
    """``tile``, or the first of ``smaller(tile)``, ``smaller(smaller(tile))``, ... whose estimated
    shared memory ``need(t)`` is within ``budget`` (``shared_budget(active_target())``; None: no
    limit). A launch spec calls it with its own estimate for the target of the active driver, so
    warm-up (under the target-only driver) and the server pick the same tile. Raises ValueError
    naming the need and the budget when nothing smaller is left."""
    if budget is None:
        return tile
    current = tile
    while need(current) > budget:
        next_tile = smaller(current)
        if next_tile is None:
            raise ValueError(f"no {what} fits {budget:,} bytes of shared memory: the smallest, {current}, "
                             f"needs about {need(current):,}")
        current = next_tile
    return current
