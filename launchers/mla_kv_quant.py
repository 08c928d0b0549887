"""Quantized DS-MLA KV caches: write a step's tokens, and decode attention over them.

``mla_kv_cache_write`` quantizes a step's new ``[latent | rope]`` rows into their slots;
``quantized_mla_decode_attention`` is the split-KV decode of ``paged_attention.py`` (its grid
split kernel's schedule and its combine kernel) reading the quantized entries. Byte layouts:
``kv_cache_formats.py``; rounding and scale rules: ``kernels/mla_kv_quant.py``.
"""

from __future__ import annotations

import functools
import json
import math
from dataclasses import dataclass
from pathlib import Path

import torch

from ..jit import JitKernel, Launch, Target
from ..jit.core.targets import active_gpu_target
from ..jit.core.tile_fit import active_target, fit_tile, pipeline_buffers, shared_budget
from ..kernels.mla_kv_quant import mla_kv_quantize_write_kernel, quantized_mla_decode_split_kernel
from ._attention_tiles import target_name
from ._host import cdiv, next_power_of_2
from ._op import custom_op
from .kv_cache_formats import QUANTIZED_DS_MLA_FORMATS, MLAKVFormat, QuantizedMLALayout, kv_format
from .paged_attention import (
    MIN_BLOCK,
    check_block_table_and_seq_lens,
    device_sm_count,
    grid_splits,
    paged_decode_attention_combine_jit,
    smaller_split_tile,
)

LATENT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


TILES_FILE = Path(__file__).with_name("mla_kv_quant_tiles.json")


@dataclass(frozen=True)
class QuantizedTiles:
    block_n: int  # tokens per tile
    num_warps: int
    num_stages: int
    block_h: int  # most query heads per program
    parts_per_sm: int


_TILE_CHECKS = {
    "block_n": lambda v: isinstance(v, int) and v >= 16 and v & (v - 1) == 0,
    "num_warps": lambda v: v in (1, 2, 4, 8, 16),
    "num_stages": lambda v: isinstance(v, int) and 1 <= v <= 8,
    "block_h": lambda v: v in (16, 32, 64),
    "parts_per_sm": lambda v: isinstance(v, int) and 1 <= v <= 16,
}


def parse_quantized_tiles(data, source: str) -> dict[str, dict[str, QuantizedTiles]]:
    """``{target: {format: QuantizedTiles}}``; a bad entry raises one line naming it."""
    if not isinstance(data, dict) or "default" not in data:
        raise ValueError(f"{source}: needs a 'default' target entry")
    table = {}
    for target, formats in data.items():
        if target.startswith("_"):
            continue
        if not isinstance(formats, dict) or set(formats) != set(QUANTIZED_DS_MLA_FORMATS):
            raise ValueError(f"{source}: {target}: needs exactly the formats {list(QUANTIZED_DS_MLA_FORMATS)}")
        table[target] = {}
        for name, fields in formats.items():
            where = f"{source}: {target}.{name}"
            if not isinstance(fields, dict) or set(fields) != set(_TILE_CHECKS):
                raise ValueError(f"{where}: needs exactly the fields {sorted(_TILE_CHECKS)}")
            for field, ok in _TILE_CHECKS.items():
                if not ok(fields[field]):
                    raise ValueError(f"{where}.{field}: invalid value {fields[field]!r}")
            table[target][name] = QuantizedTiles(**fields)
    return table


@functools.cache
def load_quantized_tiles(path: str = str(TILES_FILE)) -> dict[str, dict[str, QuantizedTiles]]:
    with open(path) as f:
        return parse_quantized_tiles(json.load(f), Path(path).name)


def quantized_tiles(kv_cache_dtype: str) -> QuantizedTiles:
    """The declared tiles of ``kv_cache_dtype`` for the target of Triton's active driver (warm-up's
    target-only driver included): its own entry, else its backend's, else the default."""
    table = load_quantized_tiles()
    target = active_gpu_target()
    if target is None:
        return table["default"][kv_cache_dtype]
    entry = table.get(target_name(target)) or table.get(target.backend) or table["default"]
    return entry[kv_cache_dtype]


def _format_constexprs(fmt: MLAKVFormat) -> dict:
    return dict(KV_FORMAT=fmt.name, ENTRY_BYTES=fmt.entry_bytes, LATENT_DIM=fmt.kv_lora_rank,
                ROPE_DIM=fmt.rope_dim, BLOCK_ROPE=max(MIN_BLOCK, next_power_of_2(fmt.rope_dim)),
                SCALE_GROUP=fmt.scale_group, SCALE_OFFSET=fmt.scale_offset, ROPE_OFFSET=fmt.rope_offset,
                GLOBAL_SCALE_OFFSET=max(fmt.global_scale_offset, 0))


# --------------------------------------------------------------------------- write

def mla_kv_write_launch(kv_cache, slots, latent, rope, kv_cache_dtype: str) -> Launch | None:
    if slots.shape[0] == 0:
        return None
    fmt = kv_format(kv_cache_dtype, latent.shape[1], rope.shape[1])
    # The token count only sizes the grid; the cache's block stride (the layers sharing one tensor
    # make it larger than a block) is do_not_specialize: every layer count shares one binary.
    return Launch(grid=(slots.shape[0],),
                  args=(kv_cache, latent, rope, slots, kv_cache.stride(0), latent.stride(0), rope.stride(0)),
                  constexprs=dict(PAGE_SIZE=kv_cache.shape[1], **_format_constexprs(fmt)),
                  num_warps=4 if fmt.kv_lora_rank >= 256 else 1)


mla_kv_write_jit = JitKernel(mla_kv_quantize_write_kernel, mla_kv_write_launch)


def mla_kv_cache_write(kv_cache: torch.Tensor, slots: torch.Tensor, latent: torch.Tensor, rope: torch.Tensor,
                       kv_cache_dtype: str) -> None:
    """Quantize tokens ``latent [T, R]`` and ``rope [T, P]`` (fp32 / bf16 / fp16, unit stride along
    the last dim) into ``kv_cache`` (``uint8 [num_blocks, block_size, 1, entry_bytes]`` of format
    ``kv_cache_dtype``) at ``slots`` (int32 / int64 ``[T]``: block * block_size + row; negative
    slots are skipped), in place. Slots are not bounds-checked on the device."""
    if latent.dim() != 2 or rope.dim() != 2 or latent.shape[0] != rope.shape[0] != slots.shape[0]:
        raise ValueError(f"latent [T, R], rope [T, P] and slots [T] must agree, got {tuple(latent.shape)}, "
                         f"{tuple(rope.shape)}, {tuple(slots.shape)}")
    if latent.dtype not in LATENT_DTYPES or rope.dtype not in LATENT_DTYPES:
        raise ValueError(f"latent and rope must be fp32, bf16 or fp16, got {latent.dtype}, {rope.dtype}")
    if latent.stride(-1) != 1 or rope.stride(-1) != 1:
        raise ValueError("latent and rope must have a unit stride along the last dim")
    if slots.dtype not in (torch.int32, torch.int64) or slots.dim() != 1:
        raise ValueError(f"slots must be int32 or int64 [T], got {slots.dtype} {tuple(slots.shape)}")
    QuantizedMLALayout.infer(kv_cache, kv_cache_dtype, latent.shape[1], rope.shape[1])  # raises unless it fits
    mla_kv_write_jit(kv_cache, slots, latent, rope, kv_cache_dtype)


def slots_of(block_table: torch.Tensor, positions: torch.Tensor, block_size: int) -> torch.Tensor:
    """Slot (block * block_size + row) of token i at ``positions[i]`` of the request whose block table
    is row i of ``block_table`` (on the device: no host sync)."""
    positions = positions.long()
    rows = torch.arange(positions.shape[0], device=positions.device)
    return block_table[rows, positions // block_size].long() * block_size + positions % block_size


# --------------------------------------------------------------------------- decode attention

def quantized_mla_decode_metadata(seq_lens: torch.Tensor, block_table: torch.Tensor, num_heads: int,
                                  block_size: int, kv_cache_dtype: str):
    """``(None, num_splits)`` of the grid split kernel for a quantized cache: ``num_splits =
    arange(0, (batch + 1) * s, s)``, ``s`` from the batch, the block table's width and the format's tiles
    (the same rule as ``paged_attention.grid_splits``); one per step, shared by every layer."""
    if kv_cache_dtype not in QUANTIZED_DS_MLA_FORMATS:
        raise ValueError(f"unknown quantized MLA KV cache format {kv_cache_dtype!r}")
    splits = _splits(seq_lens.shape[0], block_table, block_size, num_heads, kv_cache_dtype, seq_lens.device)
    return None, torch.arange(0, (seq_lens.shape[0] + 1) * splits, splits, dtype=torch.int32, device=seq_lens.device)


def _head_tile(num_heads: int, tiles: QuantizedTiles) -> int:
    return max(MIN_BLOCK, min(next_power_of_2(num_heads), tiles.block_h))


def _splits(batch: int, block_table, block_size: int, num_heads: int, kv_cache_dtype: str, device) -> int:
    tiles = quantized_tiles(kv_cache_dtype)
    return grid_splits(batch, cdiv(num_heads, _head_tile(num_heads, tiles)), block_table.shape[1] * block_size,
                       tiles.block_n, tiles.parts_per_sm, device_sm_count(device))


def quantized_split_shared_bytes(block_h: int, block_n: int, num_stages: int, fmt: MLAKVFormat, act_bytes: int,
                                 target: Target) -> int:
    """Shared memory one program of the quantized split kernel needs on ``target`` (an estimate, checked
    against compiled binaries by the tests; kept on the safe side). The tiles are dequantized in
    registers; on NVIDIA the dots read the key tile (latent + rope, twice: as keys and in the value's
    layout), the query and the probabilities from shared memory; on AMD the latent rows of the key
    or the output (whichever has more) pass through LDS. Each pipeline buffer past the first holds
    a tile of raw entries."""
    key_row = (fmt.kv_lora_rank + fmt.rope_dim) * act_bytes
    raw = block_n * fmt.entry_bytes
    if target.is_nvidia:
        return ((pipeline_buffers(target, num_stages) - 1) * raw + 2 * block_n * key_row + block_h * key_row
                + block_h * block_n * act_bytes)
    buffers = pipeline_buffers(target, num_stages) if num_stages > 1 or str(target.arch).startswith("gfx95") else 0
    return buffers * raw + max(block_n, block_h) * fmt.kv_lora_rank * act_bytes


@functools.cache
def fitted_quantized_tile(tile: tuple[int, int, int], fmt: MLAKVFormat, act_bytes: int,
                          target: Target | None) -> tuple[int, int, int]:
    """The declared ``(num_stages, block_n, block_h)``, or the largest smaller one that fits ``target``'s
    shared memory (``paged_attention.smaller_split_tile``); the declared one without a target."""
    if target is None:
        return tile
    return fit_tile(tile, lambda t: quantized_split_shared_bytes(t[2], t[1], t[0], fmt, act_bytes, target),
                    smaller_split_tile, shared_budget(target), "quantized MLA decode tile")


def _launch_estimate(launch: Launch, target: Target) -> int:
    c = launch.constexprs
    fmt = kv_format(c["KV_FORMAT"], c["LATENT_DIM"], c["ROPE_DIM"])
    return quantized_split_shared_bytes(c["BLOCK_H"], c["BLOCK_N"], launch.num_stages, fmt,
                                        launch.args[0].element_size(), target)


def quantized_mla_decode_split_launch(q, kv_cache, block_table, seq_lens, splits: int, partial_out, partial_lse,
                                      scale: float, kv_cache_dtype: str) -> Launch | None:
    batch, num_heads, key_dim = q.shape
    if batch == 0:
        return None
    rank = partial_out.shape[-1]
    fmt = kv_format(kv_cache_dtype, rank, key_dim - rank)
    tiles = quantized_tiles(kv_cache_dtype)
    # fp32 q (exact fp32 keys: a checking path, not a serving one) keeps its tile to 16 tokens, which
    # fits in registers
    declared = (tiles.num_stages, MIN_BLOCK if q.dtype == torch.float32 else tiles.block_n,
                _head_tile(num_heads, tiles))
    stages, block_n, block_h = fitted_quantized_tile(declared, fmt, q.element_size(), active_target())
    target = active_gpu_target()
    cuda = target is not None and target.backend == "cuda"
    # The batch and the split count only size the grid and a do_not_specialize int. KEY_BARRIER (an
    # inline PTX copy of the dequantized tile, NVIDIA only) keeps the dequantization to once per tile;
    # FP8_CVT: Triton has the E4M3 type (not on NVIDIA before sm89).
    return Launch(
        grid=(batch * splits, cdiv(num_heads, block_h)),
        args=(q, kv_cache, block_table, seq_lens, partial_out, partial_lse, q.stride(0), q.stride(1),
              kv_cache.stride(0), block_table.stride(0), partial_out.stride(0), partial_out.stride(1),
              partial_lse.stride(0), float(scale) * math.log2(math.e), int(splits)),
        constexprs=dict(PAGE_SIZE=kv_cache.shape[1], NUM_HEADS=num_heads, BLOCK_H=block_h, BLOCK_N=block_n,
                        **_format_constexprs(fmt), KEY_BARRIER=cuda, FP8_CVT=not cuda or target.arch >= 89),
        num_warps=tiles.num_warps,
        num_stages=stages,
    )


quantized_mla_decode_split_jit = JitKernel(quantized_mla_decode_split_kernel, quantized_mla_decode_split_launch,
                                           shared_estimate=_launch_estimate)


def quantized_mla_decode_attention(q: torch.Tensor, kv_cache: torch.Tensor, block_table: torch.Tensor,
                                   seq_lens: torch.Tensor, scale: float, kv_cache_dtype: str, kv_lora_rank: int,
                                   metadata=None) -> torch.Tensor:
    """Decode attention of ``q [batch, num_heads, kv_lora_rank + rope_dim]`` over a quantized MLA
    cache (``uint8 [num_blocks, block_size, 1, entry_bytes]`` of format ``kv_cache_dtype``).

    ``block_table`` int32 ``[batch, max_blocks]``, ``seq_lens`` int32 ``[batch]`` (0: zeros).
    ``metadata``: ``quantized_mla_decode_metadata``'s (None: computed here). Returns ``[batch,
    num_heads, kv_lora_rank]`` in q's dtype: the value is the dequantized latent.
    """
    batch, num_heads, key_dim = q.shape
    if q.dtype not in LATENT_DTYPES or q.stride(-1) != 1:
        raise ValueError(f"q must be fp32, bf16 or fp16 with a unit stride along the head dim, got {q.dtype}")
    layout = QuantizedMLALayout.infer(kv_cache, kv_cache_dtype, kv_lora_rank, key_dim - kv_lora_rank)
    check_block_table_and_seq_lens(block_table, seq_lens, batch)
    if metadata is None:
        metadata = quantized_mla_decode_metadata(seq_lens, block_table, num_heads, layout.block_size, kv_cache_dtype)
    _, num_splits = metadata
    if tuple(num_splits.shape) != (batch + 1,):
        raise ValueError("metadata must be quantized_mla_decode_metadata's: (None, num_splits [batch + 1])")
    splits = _splits(batch, block_table, layout.block_size, num_heads, kv_cache_dtype, q.device)
    partial_out = torch.empty(batch * splits, num_heads, kv_lora_rank, dtype=torch.float32, device=q.device)
    partial_lse = torch.empty(batch * splits, num_heads, dtype=torch.float32, device=q.device)
    out = torch.empty(batch, num_heads, kv_lora_rank, dtype=q.dtype, device=q.device)
    quantized_mla_decode_split_jit(q, kv_cache, block_table, seq_lens, splits, partial_out, partial_lse, scale,
                                   kv_cache_dtype)
    paged_decode_attention_combine_jit(partial_out, partial_lse, num_splits, out)
    return out


# --------------------------------------------------------------------------- custom ops

@custom_op("tritonwarm::mla_kv_cache_write", mutates_args=("kv_cache",))
def _mla_kv_cache_write_op(kv_cache: torch.Tensor, slots: torch.Tensor, latent: torch.Tensor, rope: torch.Tensor,
                           kv_cache_dtype: str) -> None:
    mla_kv_cache_write(kv_cache, slots, latent, rope, kv_cache_dtype)


@_mla_kv_cache_write_op.register_fake
def _(kv_cache, slots, latent, rope, kv_cache_dtype):
    return None


@custom_op("tritonwarm::quantized_mla_decode_attention", mutates_args=())
def _quantized_mla_decode_attention_op(q: torch.Tensor, kv_cache: torch.Tensor, block_table: torch.Tensor,
                                       seq_lens: torch.Tensor, scale: float, kv_cache_dtype: str,
                                       kv_lora_rank: int, num_splits: torch.Tensor | None = None) -> torch.Tensor:
    metadata = None if num_splits is None else (None, num_splits)
    return quantized_mla_decode_attention(q, kv_cache, block_table, seq_lens, scale, kv_cache_dtype, kv_lora_rank,
                                          metadata)


@_quantized_mla_decode_attention_op.register_fake
def _(q, kv_cache, block_table, seq_lens, scale, kv_cache_dtype, kv_lora_rank, num_splits=None):
    return q.new_empty(q.shape[0], q.shape[1], kv_lora_rank)
