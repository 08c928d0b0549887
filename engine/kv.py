"""The paged KV cache: one allocation for all layers, and the block allocator that hands out blocks.

The layout is the shared one of ``launchers/kv_cache.py`` (MLA: one latent head per token), or with
``kv_cache_dtype`` a quantized DS-MLA format's (``launchers/kv_cache_formats.py``: uint8 entries). All
layers live in one tensor ``[num_blocks, num_layers, block_size, 1, entry_dim]``: block ``b`` of every
layer is one contiguous range, so a single ``kv_block_zero`` launch clears a new block in all layers
(all-zero bytes are every format's empty token), and each layer's view ``cache[:, layer]`` is a layout
tensor whose block stride is larger than one block (which the layouts allow).
"""

from __future__ import annotations

from collections import deque

import torch

from ..launchers.kv_cache import KVCacheLayout
from ..launchers.kv_cache_formats import QuantizedMLALayout, kv_bytes_per_token, kv_format
from .config import EngineConfig


class OutOfBlocks(RuntimeError):
    """More blocks asked for than are free. The scheduler preempts before it asks, so it raises this
    only for a request that is alone and still short of blocks (an allocator smaller than its config)."""


class BlockAllocator:
    """Free-list allocator of physical block ids; a block has at most one owner at a time."""

    def __init__(self, num_blocks: int):
        self.num_blocks = num_blocks
        self._free = deque(range(num_blocks))
        self._owner: dict[int, int] = {}  # block id -> request id

    @property
    def num_free(self) -> int:
        return len(self._free)

    def allocate(self, owner: int, count: int) -> list[int]:
        if count > len(self._free):
            raise OutOfBlocks(f"request {owner} needs {count} blocks, {len(self._free)} free")
        blocks = [self._free.popleft() for _ in range(count)]
        for block in blocks:
            self._owner[block] = owner
        return blocks

    def free(self, owner: int, blocks: list[int]) -> None:
        for block in blocks:
            if self._owner.get(block) != owner:
                raise RuntimeError(f"request {owner} frees block {block} it does not own")
            del self._owner[block]
            self._free.append(block)

    def owners(self) -> dict[int, int]:
        return dict(self._owner)


class KVCache:
    def __init__(self, config: EngineConfig, device):
        cfg = config.model
        if config.kv_cache_dtype == "auto":
            self.layout = KVCacheLayout.mla(config.num_blocks, config.block_size, cfg.kv_lora_rank,
                                            cfg.qk_rope_head_dim)
            dtype = config.dtype
        else:
            fmt = kv_format(config.kv_cache_dtype, cfg.kv_lora_rank, cfg.qk_rope_head_dim)
            self.layout = QuantizedMLALayout(fmt, config.num_blocks, config.block_size)
            dtype = torch.uint8
        _, block_size, heads, entry = self.layout.shape
        self.tensor = torch.zeros(config.num_blocks, cfg.num_layers, block_size, heads, entry,
                                  dtype=dtype, device=device)
        self.layers = [self.tensor[:, i] for i in range(cfg.num_layers)]
        for layer in self.layers:
            self.layout.check(layer)


def kv_cache_bytes_per_token(config: EngineConfig) -> int:
    """Bytes one token takes in the cache, all layers together."""
    cfg = config.model
    return cfg.num_layers * kv_bytes_per_token(config.kv_cache_dtype, cfg.kv_lora_rank, cfg.qk_rope_head_dim,
                                               config.dtype)


def kv_cache_tokens(config: EngineConfig, memory_bytes: int) -> int:
    """Tokens a cache of ``memory_bytes`` holds: whole blocks of ``block_size`` tokens in all layers."""
    block_bytes = kv_cache_bytes_per_token(config) * config.block_size
    return memory_bytes // block_bytes * config.block_size
