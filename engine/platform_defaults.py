"""Engine defaults that depend on the GPU generation, as data: one frozen row per target family.

Today one default differs by platform at the engine's level: which decode batch sizes are captured as
CUDA graphs, up to a capture limit. A graph removes the per-kernel launch cost of a decode step, which
matters while a step is short; the faster the GPU, the larger the batch whose step is still short,
so the limit grows with the generation (B200: 1024; H100/H200, MI300X/MI355X: 512; A100, L40S, RTX
cards, MI250X and unknown GPUs: 256; no GPU: nothing to capture). Kernel launch defaults that differ by
target (attention split tiles, fused MoE tiles) stay beside their launchers, keyed by target.

An engine config takes its target's row wherever it leaves a field unset (``cuda_graph_batch_sizes:
None``, the default); a config that sets the field keeps its own value on every target. The lookups
are cached per process (``functools.cache``); tests that stand in another platform clear them with
``clear_platform_cache()``.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass, field
from types import MappingProxyType

from ..jit.core.targets import Target, local_target
from .config import EngineConfig


def _capture_ladder(limit: int) -> tuple[int, ...]:
    """1, 2, 4, then every 8 up to 256 and every 16 beyond, up to ``limit`` (vLLM's spacing): decode
    batches between two sizes pad to the larger one, so the padding stays under 8 (16) rows."""
    sizes = [1, 2, 4, *range(8, 256, 8), *range(256, limit + 1, 16)]
    return tuple(s for s in sizes if s <= limit)


@dataclass(frozen=True)
class PlatformDefaults:
    family: str  # jit.core.targets.Target.family, or "cpu" where there is no GPU
    max_capture_size: int  # the largest decode batch captured as a CUDA graph (0: none)
    capture_sizes: tuple[int, ...] = field(init=False)  # the sizes captured: the ladder up to the limit

    def __post_init__(self):
        object.__setattr__(self, "capture_sizes", _capture_ladder(self.max_capture_size))

    def capture_sizes_for(self, max_batch_size: int) -> tuple[int, ...]:
        """The captured sizes of an engine running at most ``max_batch_size`` requests: the ladder up to
        the smaller of the two limits, and that limit itself, so the fullest decode batch has a graph."""
        limit = min(self.max_capture_size, max_batch_size)
        sizes = tuple(s for s in self.capture_sizes if s <= limit)
        return sizes + (limit,) if limit > 0 and limit not in sizes else sizes


CPU_DEFAULTS = PlatformDefaults("cpu", max_capture_size=0)  # no CUDA graphs without a GPU
OTHER_GPU_DEFAULTS = PlatformDefaults("other", max_capture_size=256)  # a generation not in the table

FAMILY_DEFAULTS: MappingProxyType[str, PlatformDefaults] = MappingProxyType({
    row.family: row for row in (
        PlatformDefaults("ampere", max_capture_size=256),  # A100, RTX 30
        PlatformDefaults("ada", max_capture_size=256),  # L40S, RTX 40
        PlatformDefaults("hopper", max_capture_size=512),  # H100, H200
        PlatformDefaults("blackwell", max_capture_size=1024),  # B200, GB200, B300
        PlatformDefaults("blackwell-rtx", max_capture_size=256),  # RTX 50, RTX PRO (sm120)
        PlatformDefaults("cdna2", max_capture_size=256),  # MI250X
        PlatformDefaults("cdna3", max_capture_size=512),  # MI300X, MI325X
        PlatformDefaults("cdna4", max_capture_size=512),  # MI355X
    )
})


@functools.cache
def local_platform() -> Target | None:
    """The target of this machine's GPU (None: no GPU), asked once per process."""
    return local_target()


@functools.cache
def platform_defaults(target: Target | None = None) -> PlatformDefaults:
    """The defaults row of ``target``'s family; None: this machine's (the CPU row without a GPU)."""
    if target is None:
        target = local_platform()
    if target is None:
        return CPU_DEFAULTS
    return FAMILY_DEFAULTS.get(target.family, OTHER_GPU_DEFAULTS)


def clear_platform_cache() -> None:
    """Forget the cached platform and rows (after the platform was stood in for, in tests)."""
    local_platform.cache_clear()
    platform_defaults.cache_clear()


def capture_sizes(config: EngineConfig, target: Target | None = None) -> tuple[int, ...]:
    """The decode batch sizes ``config`` captures on ``target`` (None: this machine): its own, where
    it sets them (``()``: none), else its target's within its ``max_batch_size``."""
    if config.cuda_graph_batch_sizes is not None:
        return config.cuda_graph_batch_sizes
    return platform_defaults(target).capture_sizes_for(config.max_batch_size)


def for_target(config: EngineConfig, target: Target | None = None) -> EngineConfig:
    """``config`` with every field it leaves to the platform filled from ``target``'s row."""
    sizes = capture_sizes(config, target)
    if sizes == config.cuda_graph_batch_sizes:
        return config
    return dataclasses.replace(config, cuda_graph_batch_sizes=sizes)
