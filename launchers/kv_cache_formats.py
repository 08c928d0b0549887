"""The quantized DS-MLA KV cache formats: one named set, each byte layout written down once.

``KV_CACHE_DTYPES`` is what an engine config's ``kv_cache_dtype`` may say: ``auto`` (the model's
dtype, ``kv_cache.py``'s ``KVCacheLayout.mla``) or one of ``QUANTIZED_DS_MLA_FORMATS``. Such a cache is
a ``uint8`` tensor ``[num_blocks, block_size, 1, entry_bytes]`` (the block/row/head indexing of
``kv_cache.py``, one latent head), each token one ``entry_bytes`` record. With DeepSeek's geometry
(``kv_lora_rank`` R = 512, ``rope_dim`` P = 64):

``fp8_ds_mla`` (656 bytes a token; bf16 is 2 * (512 + 64) = 1,152)::

    [0, R)                 latent as FP8 E4M3FN codes, one byte each             512
    [R, R + 4 * R/128)     one fp32 scale per tile of 128 latent values            16
    [.., + 2P)             RoPE part as bf16                                       128

``nvfp4_ds_mla`` (432 bytes a token)::

    [0, R/2)               latent as E2M1 codes, two per byte, low nibble first    256
    [R/2, R/2 + R/16)      one FP8 E4M3FN block scale per 16 latent values          32
    [.., + 2P)             RoPE part as bf16                                       128
    [.., + 4)              the token's fp32 global scale                             4
    [.., entry_bytes)      zero padding                                             12

Every entry is padded to a multiple of 16 bytes (``ENTRY_ALIGN``): token rows then start 16-byte
aligned (wide loads of the latent), and the row stride is in Triton's div-16 class for every
geometry (one binary, not two). fp8_ds_mla's 656 needs no padding. The global scale is NVFP4's
two-level scheme at token granularity: ``gs = 448 * 6 / amax(token latent)`` puts the token's
largest block scale at E4M3's maximum, so no token's magnitude (not known when the cache is sized;
any latent amax from 3e-35 up) saturates or underflows the block scales. It costs 4 bytes, and
with the padding 16 (432 against 416 without it: 3.7 % fewer tokens in the same memory).

The quantization rules (rounding, saturation, zero and non-finite tiles) are in
``kernels/mla_kv_quant.py``. The all-zero entry, which ``kv_block_zero`` leaves, is exactly what
quantizing a zero token writes, and dequantizes to zeros in both formats.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

QUANTIZED_DS_MLA_FORMATS = ("fp8_ds_mla", "nvfp4_ds_mla")
KV_CACHE_DTYPES = ("auto", *QUANTIZED_DS_MLA_FORMATS)
ENTRY_ALIGN = 16
FP8_TILE = 128  # fp8_ds_mla: latent values per fp32 scale
NVFP4_BLOCK = 16  # nvfp4_ds_mla: latent values per E4M3 scale


@dataclass(frozen=True)
class MLAKVFormat:
    """The byte layout of one token of a quantized DS-MLA cache (offsets in bytes from the token's
    first byte). ``scale_group``: latent values per stored scale; ``global_scale_offset`` is -1
    where the format has none."""

    name: str
    kv_lora_rank: int
    rope_dim: int
    latent_bytes: int
    scale_offset: int
    scale_group: int
    scale_bytes: int
    rope_offset: int
    global_scale_offset: int
    entry_bytes: int

    @property
    def key_dim(self) -> int:
        """Width of the logical key (and of q): ``[latent | rope]``."""
        return self.kv_lora_rank + self.rope_dim

    @property
    def num_scales(self) -> int:
        return self.kv_lora_rank // self.scale_group

    @property
    def payload_bytes(self) -> int:
        """Bytes that hold data (the entry less its alignment padding)."""
        end = self.rope_offset + 2 * self.rope_dim
        return max(end, self.global_scale_offset + 4)

    def fields(self) -> dict[str, tuple[int, int]]:
        """``{field: (start, stop)}`` bytes within one entry, padding included: they tile the entry."""
        out = {"latent": (0, self.latent_bytes),
               "scales": (self.scale_offset, self.scale_offset + self.scale_bytes),
               "rope": (self.rope_offset, self.rope_offset + 2 * self.rope_dim)}
        if self.global_scale_offset >= 0:
            out["global_scale"] = (self.global_scale_offset, self.global_scale_offset + 4)
        if self.payload_bytes < self.entry_bytes:
            out["padding"] = (self.payload_bytes, self.entry_bytes)
        return out


def _align(n: int) -> int:
    return -(-n // ENTRY_ALIGN) * ENTRY_ALIGN


@functools.cache
def kv_format(name: str, kv_lora_rank: int = 512, rope_dim: int = 64) -> MLAKVFormat:
    """The layout of format ``name`` for a latent of ``kv_lora_rank`` and a RoPE part of ``rope_dim``.

    Raises ``ValueError`` (one line) for an unknown name or a geometry the format cannot tile.
    """
    if name not in QUANTIZED_DS_MLA_FORMATS:
        raise ValueError(f"unknown quantized MLA KV cache format {name!r}: choose one of "
                         f"{', '.join(QUANTIZED_DS_MLA_FORMATS)}")
    group = FP8_TILE if name == "fp8_ds_mla" else NVFP4_BLOCK
    if kv_lora_rank < group or kv_lora_rank & (kv_lora_rank - 1):  # the kernels tile it in powers of two
        raise ValueError(f"{name} needs kv_lora_rank a power of two of at least {group}, got {kv_lora_rank}")
    if rope_dim <= 0 or rope_dim % 2:
        raise ValueError(f"{name} needs an even, positive rope_dim, got {rope_dim}")
    if name == "fp8_ds_mla":
        latent, scales = kv_lora_rank, 4 * (kv_lora_rank // FP8_TILE)
        rope_offset = latent + scales
        return MLAKVFormat(name, kv_lora_rank, rope_dim, latent, latent, FP8_TILE, scales, rope_offset, -1,
                           _align(rope_offset + 2 * rope_dim))
    latent, scales = kv_lora_rank // 2, kv_lora_rank // NVFP4_BLOCK
    rope_offset = latent + scales
    global_offset = rope_offset + 2 * rope_dim
    return MLAKVFormat(name, kv_lora_rank, rope_dim, latent, latent, NVFP4_BLOCK, scales, rope_offset,
                       global_offset, _align(global_offset + 4))


def kv_bytes_per_token(kv_cache_dtype: str, kv_lora_rank: int, rope_dim: int, dtype: torch.dtype) -> int:
    """Bytes one token takes in one layer's cache: ``auto`` stores ``[latent | rope]`` in ``dtype``."""
    if kv_cache_dtype == "auto":
        return (kv_lora_rank + rope_dim) * dtype.itemsize
    return kv_format(kv_cache_dtype, kv_lora_rank, rope_dim).entry_bytes


@dataclass(frozen=True)
class QuantizedMLALayout:
    """One layer's paged cache in a quantized format: ``uint8 [num_blocks, block_size, 1, entry_bytes]``."""

    format: MLAKVFormat
    num_blocks: int
    block_size: int

    @property
    def shape(self) -> tuple[int, int, int, int]:
        return (self.num_blocks, self.block_size, 1, self.format.entry_bytes)

    @property
    def block_bytes(self) -> int:
        return self.block_size * self.format.entry_bytes

    def block_byte_range(self, block_id: int) -> tuple[int, int]:
        """``(start, stop)`` bytes of block ``block_id`` from the start of a tensor made by ``allocate``."""
        if not 0 <= block_id < self.num_blocks:
            raise IndexError(f"block {block_id} outside [0, {self.num_blocks})")
        return block_id * self.block_bytes, (block_id + 1) * self.block_bytes

    def token_byte_range(self, block_id: int, row: int, field: str) -> tuple[int, int]:
        """``(start, stop)`` bytes of one field of the token at ``(block_id, row)``."""
        start, stop = self.format.fields()[field]
        base = self.block_byte_range(block_id)[0] + row * self.format.entry_bytes
        return base + start, base + stop

    def allocate(self, device="cpu") -> torch.Tensor:
        """A zeroed cache: every token the format's zero state (dequantizes to zeros)."""
        return torch.zeros(self.shape, dtype=torch.uint8, device=device)

    def check(self, kv_cache: torch.Tensor) -> None:
        """Raise unless ``kv_cache`` is uint8 of this shape with contiguous blocks (the kernels rely on it)."""
        if kv_cache.dtype != torch.uint8:
            raise ValueError(f"a {self.format.name} cache is uint8, got {kv_cache.dtype}")
        if tuple(kv_cache.shape) != self.shape:
            raise ValueError(f"kv_cache shape {tuple(kv_cache.shape)} is not the {self.format.name} layout's "
                             f"{self.shape}")
        entry = self.format.entry_bytes
        overlapping = self.num_blocks > 1 and kv_cache.stride(0) < self.block_bytes
        if kv_cache.stride()[1:] != (entry, entry, 1) or overlapping:
            raise ValueError(f"kv_cache blocks must be contiguous, got strides {kv_cache.stride()}")

    @classmethod
    def infer(cls, kv_cache: torch.Tensor, name: str, kv_lora_rank: int, rope_dim: int) -> QuantizedMLALayout:
        fmt = kv_format(name, kv_lora_rank, rope_dim)
        if kv_cache.dim() != 4:
            raise ValueError(f"kv_cache must be [num_blocks, block_size, 1, {fmt.entry_bytes}], "
                             f"got {tuple(kv_cache.shape)}")
        layout = cls(fmt, kv_cache.shape[0], kv_cache.shape[1])
        layout.check(kv_cache)
        return layout
