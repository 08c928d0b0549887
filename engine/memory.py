"""What an engine needs in memory, what this machine has, and what a GPU run used at its peak.

Without a GPU the engine builds its weights in host memory. DeepSeek-V2-Lite's are 29 GiB of bf16: on a
smaller machine the kernel's OOM killer ends the process minutes later, with no word. So before any
weight is made, ``refuse_if_it_cannot_fit`` compares the bytes the engine will hold with the memory
available (``MemAvailable``, and the headroom of a cgroup limit, whichever is smaller) and refuses
in one line that points to the dry run, which proves a cache on meta tensors and allocates nothing.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch

from .config import EngineConfig
from .kv import kv_cache_bytes_per_token
from .weights import weight_shapes

GIB = 2**30


def weight_bytes(config: EngineConfig) -> int:
    """Bytes of the model's weights in the config's dtype."""
    return sum(math.prod(shape) for shape in weight_shapes(config.model).values()) * config.dtype.itemsize


def engine_bytes(config: EngineConfig) -> int:
    """Bytes an engine holds once built, and at its peak while building: the weights, the KV cache,
    one layer's fused expert copies (made before that layer's originals are dropped) and the fp32
    draw of the largest random tensor."""
    cfg = config.model
    kv = config.num_blocks * config.block_size * kv_cache_bytes_per_token(config)
    shapes = weight_shapes(cfg)
    layer_experts = 3 * cfg.num_experts * cfg.hidden_size * cfg.moe_intermediate_size * config.dtype.itemsize
    largest_draw = max(math.prod(shape) for shape in shapes.values()) * 4
    return weight_bytes(config) + kv + layer_experts + largest_draw


def available_bytes() -> int | None:
    """Host memory a new allocation can get now: ``MemAvailable``, or less under a cgroup limit; None
    where neither can be read (then nothing is refused)."""
    found = []
    meminfo = _read("/proc/meminfo")
    for line in (meminfo or "").splitlines():
        if line.startswith("MemAvailable:"):
            found.append(int(line.split()[1]) * 1024)
    for limit_file, usage_file, stat_file, inactive in (
            ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current", "/sys/fs/cgroup/memory.stat",
             "inactive_file"),  # cgroup v2
            ("/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory/memory.usage_in_bytes",
             "/sys/fs/cgroup/memory/memory.stat", "total_inactive_file")):  # cgroup v1
        limit, usage = _read(limit_file), _read(usage_file)
        if not (limit and usage and limit.strip().isdigit() and usage.strip().isdigit()):
            continue
        if int(limit) >= 2**60:  # "no limit" (v1 writes a huge number, v2 "max")
            continue
        stat = dict(line.split() for line in (_read(stat_file) or "").splitlines() if len(line.split()) == 2)
        reclaimable = int(stat.get(inactive, 0)) if stat.get(inactive, "0").isdigit() else 0
        found.append(max(int(limit) - int(usage) + reclaimable, 0))
    return min(found) if found else None


def _read(path: str) -> str | None:
    try:
        return Path(path).read_text()
    except OSError:
        return None


def refuse_if_it_cannot_fit(config: EngineConfig, available: int | None = None) -> None:
    """Raise ``ValueError`` (one line) when a CPU engine of ``config`` would not fit in host memory."""
    available = available_bytes() if available is None else available
    need = engine_bytes(config)
    if available is None or need <= available:
        return
    dtype = str(config.dtype).removeprefix("torch.")
    raise ValueError(
        f"engine {config.model.name}: {weight_bytes(config) / GIB:.1f} GiB of {dtype} weights ({need / GIB:.1f} GiB "
        f"with the KV cache, while building) do not fit the {available / GIB:.1f} GiB of memory available, "
        f"and there is no GPU; prove a warmed cache on this machine with a dry run instead: "
        f"--dry-run --target TARGET (meta tensors, nothing allocated)")


class GpuPeak:
    """Peak GPU memory of one run: PyTorch's allocator, reset when entered (no-op without CUDA)."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.allocated: int | None = None
        self.reserved: int | None = None

    def __enter__(self):
        if self.cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        return self

    def __exit__(self, *exc):
        if self.cuda:
            torch.cuda.synchronize()
            self.allocated = torch.cuda.max_memory_allocated()
            self.reserved = torch.cuda.max_memory_reserved()
        return False
