"""The paged KV cache layout, defined once for the kernels and the serving engine.

Per layer the cache is ONE tensor::

    kv_cache[num_blocks, block_size, num_kv_heads, entry_dim]

A *block* (a page) holds ``block_size`` consecutive tokens of one request; a request's logical token
``t`` lives in physical block ``block_table[request, t // block_size]`` at row ``t % block_size``.
For each (block, row, kv head) there is one *entry* of ``entry_dim`` elements holding that token's
key and value for that head:

- key   = ``entry[0 : key_dim]``
- value = ``entry[value_offset : value_offset + value_dim]``

Two geometries use it:

- GQA (``KVCacheLayout.gqa``): K and V packed side by side, ``entry_dim = 2 * head_dim``,
  ``value_offset = head_dim``. One gather per token brings both.
- MLA (``KVCacheLayout.mla``): one latent "head" per token, ``entry = [kv_lora_rank | rope_dim]``;
  the key is the whole entry (``key_dim = kv_lora_rank + rope_dim``) and the value is the first
  ``kv_lora_rank`` dims of the same bytes (``value_offset = 0``), as FlashMLA stores it.

The rows, heads and entries of one block are contiguous (strides ``[*, num_kv_heads * entry_dim,
entry_dim, 1]``), so a block is one contiguous byte range; the block stride may be larger than a
block (a layer carved out of a bigger allocation), which is why kernels take it as an argument.
Everything here is plain PyTorch and shape-only, so it also works on meta tensors.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class KVCacheLayout:
    num_blocks: int
    block_size: int
    num_kv_heads: int
    key_dim: int
    value_dim: int
    value_offset: int

    def __post_init__(self):
        for name in ("num_blocks", "block_size", "num_kv_heads", "key_dim", "value_dim"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.value_offset < 0:
            raise ValueError(f"value_offset must be >= 0, got {self.value_offset}")

    # ------------------------------------------------------------------ constructors

    @classmethod
    def gqa(cls, num_blocks: int, block_size: int, num_kv_heads: int, head_dim: int) -> KVCacheLayout:
        """K and V of each kv head packed in one entry: ``[key (head_dim) | value (head_dim)]``."""
        return cls(num_blocks, block_size, num_kv_heads, head_dim, head_dim, head_dim)

    @classmethod
    def mla(cls, num_blocks: int, block_size: int, kv_lora_rank: int, rope_dim: int) -> KVCacheLayout:
        """One latent head: key = ``[latent | rope]``, value = the latent part of the same bytes."""
        return cls(num_blocks, block_size, 1, kv_lora_rank + rope_dim, kv_lora_rank, 0)

    @classmethod
    def infer(cls, kv_cache: torch.Tensor, key_dim: int, value_dim: int | None = None) -> KVCacheLayout:
        """The layout of an existing cache tensor, given the query/key width (and the value width).

        ``value_dim=None`` means GQA packing (value as wide as the key, after it). With ``value_dim``
        given, an entry of exactly ``key_dim`` holds the value inside the key (MLA), and an entry of
        ``key_dim + value_dim`` holds the value after the key.
        """
        if kv_cache.dim() != 4:
            raise ValueError("kv_cache must be [num_blocks, block_size, num_kv_heads, entry_dim], "
                             f"got {tuple(kv_cache.shape)}")
        num_blocks, block_size, num_kv_heads, entry_dim = kv_cache.shape
        value_dim = key_dim if value_dim is None else value_dim
        if entry_dim == key_dim + value_dim:
            value_offset = key_dim
        elif entry_dim == key_dim and value_dim <= key_dim:
            value_offset = 0
        else:
            raise ValueError(f"entry_dim {entry_dim} fits neither a packed [key {key_dim} | value {value_dim}] "
                             f"entry nor a value inside a {key_dim}-wide key")
        layout = cls(num_blocks, block_size, num_kv_heads, key_dim, value_dim, value_offset)
        layout.check(kv_cache)
        return layout

    # ------------------------------------------------------------------ geometry

    @property
    def entry_dim(self) -> int:
        return max(self.key_dim, self.value_offset + self.value_dim)

    @property
    def shape(self) -> tuple[int, int, int, int]:
        return (self.num_blocks, self.block_size, self.num_kv_heads, self.entry_dim)

    @property
    def block_numel(self) -> int:
        """Elements in one block: what ``kv_block_zero`` clears and a block's byte range spans."""
        return self.block_size * self.num_kv_heads * self.entry_dim

    def block_byte_range(self, block_id: int, dtype: torch.dtype) -> tuple[int, int]:
        """``(start, stop)`` bytes of block ``block_id`` from the start of a tensor made by ``allocate``."""
        if not 0 <= block_id < self.num_blocks:
            raise IndexError(f"block {block_id} outside [0, {self.num_blocks})")
        size = self.block_numel * dtype.itemsize
        return block_id * size, (block_id + 1) * size

    def check(self, kv_cache: torch.Tensor) -> None:
        """Raise unless ``kv_cache`` has this shape and contiguous blocks (the kernels rely on both)."""
        if tuple(kv_cache.shape) != self.shape:
            raise ValueError(f"kv_cache shape {tuple(kv_cache.shape)} is not the layout's {self.shape}")
        _, token_stride, head_stride, dim_stride = kv_cache.stride()
        if (dim_stride, head_stride, token_stride) != (1, self.entry_dim, self.num_kv_heads * self.entry_dim):
            raise ValueError(f"kv_cache blocks must be contiguous, got strides {kv_cache.stride()}")
        if self.num_blocks > 1 and kv_cache.stride(0) < self.block_numel:
            raise ValueError(f"kv_cache block stride {kv_cache.stride(0)} overlaps blocks of {self.block_numel}")

    # ------------------------------------------------------------------ tensors

    def allocate(self, dtype: torch.dtype, device="cpu", *, zero: bool = False) -> torch.Tensor:
        """One layer's cache tensor."""
        make = torch.zeros if zero else torch.empty
        return make(self.shape, dtype=dtype, device=device)

    def keys(self, kv_cache: torch.Tensor) -> torch.Tensor:
        """View ``[num_blocks, block_size, num_kv_heads, key_dim]`` of the keys (no copy)."""
        return kv_cache[..., : self.key_dim]

    def values(self, kv_cache: torch.Tensor) -> torch.Tensor:
        """View ``[num_blocks, block_size, num_kv_heads, value_dim]`` of the values (no copy)."""
        return kv_cache[..., self.value_offset : self.value_offset + self.value_dim]

    def slots(self, block_table: torch.Tensor, positions: torch.Tensor,
              request_ids: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Physical ``(block, row)`` of each token: token ``i`` is request ``request_ids[i]``'s logical
        position ``positions[i]`` (``request_ids`` defaults to ``arange``: one token per request)."""
        positions = positions.long()
        if request_ids is None:
            request_ids = torch.arange(positions.shape[0], device=positions.device)
        blocks = block_table[request_ids.long(), positions // self.block_size].long()
        return blocks, positions % self.block_size

    def write(self, kv_cache: torch.Tensor, block_table: torch.Tensor, positions: torch.Tensor,
              key: torch.Tensor, value: torch.Tensor | None = None,
              request_ids: torch.Tensor | None = None) -> None:
        """Store new tokens in place: ``key [tokens, num_kv_heads, key_dim]`` and, for a packed layout,
        ``value [tokens, num_kv_heads, value_dim]``. For MLA the value is part of the key: pass none."""
        self.check(kv_cache)
        value_in_key = self.value_offset + self.value_dim <= self.key_dim
        if value_in_key and value is not None:
            raise ValueError("this layout stores the value inside the key: pass value=None")
        if not value_in_key and value is None:
            raise ValueError("this layout stores the value apart from the key: pass value")
        blocks, rows = self.slots(block_table, positions, request_ids)
        self.keys(kv_cache)[blocks, rows] = key.to(kv_cache.dtype)
        if value is not None:
            self.values(kv_cache)[blocks, rows] = value.to(kv_cache.dtype)
