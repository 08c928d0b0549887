"""``paged_decode_attention``: split-KV decode attention over the paged KV cache of ``kv_cache.py``.

One call = the split metadata, the split kernel (partials + log-sum-exp per split) and the combine
kernel. Which split kernel runs is declared data (``paged_attention_tiles.json``, field ``kernel``):

- ``"schedule"``: the metadata is ``mla_decode_metadata``'s ``(schedule, num_splits)``, a device
  kernel that balances blocks over the parts;
- ``"grid"``: the metadata is ``(None, num_splits)`` with ``num_splits = [0, s, 2s, ..]``: every
  request gets the same ``s`` splits, ``s`` chosen on the host by ``grid_splits`` from the batch,
  the SM count and the block table's capacity only, so no schedule kernel runs and a CUDA graph
  captured for one batch size stays valid for any lengths.

``paged_decode_metadata(seq_lens, block_table, ...)`` returns whichever the declared kernel needs;
the engine calls it once per step and passes it to every layer (``metadata=``). A caller may still
pass ``mla_decode_metadata``'s pair itself: a schedule runs the schedule kernel. Device code and the
exact algorithm: ``kernels/paged_attention.py``.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import torch

from ..jit import JitKernel, Launch, Target
from ..jit.core.tile_fit import active_target, async_mma, fit_tile, pipeline_buffers, shared_budget
from ..kernels.paged_attention import (
    paged_decode_attention_combine_kernel,
    paged_decode_attention_grid_split_kernel,
    paged_decode_attention_split_kernel,
)
from ._attention_tiles import settings_for
from ._host import cdiv, next_power_of_2
from ._op import custom_op
from .kv_cache import KVCacheLayout
from .mla_metadata import SCHEDULE_WIDTH, mla_decode_metadata

# SM count assumed when the device is not a GPU (interpreter, meta tensors while tracing). The part
# count it leads to is a runtime int that only sizes grids, so it never changes a binary.
NOMINAL_SM_COUNT = 16
MIN_BLOCK = 16  # tl.dot needs every tile dim >= 16
COMBINE_SPLITS = 16  # splits the combine kernel merges per step (one [16, value dim] fp32 tile)


def check_block_table_and_seq_lens(block_table: torch.Tensor, seq_lens: torch.Tensor, batch: int) -> None:
    """The paged decode's block table and sequence lengths, as every paged decode launcher reads them."""
    if block_table.dtype != torch.int32 or block_table.dim() != 2 or block_table.shape[0] != batch \
            or block_table.stride(-1) != 1:
        raise ValueError(f"block_table must be int32 [batch, max_blocks] with unit stride, got "
                         f"{block_table.dtype} {tuple(block_table.shape)}")
    if seq_lens.dtype != torch.int32 or tuple(seq_lens.shape) != (batch,):
        raise ValueError(f"seq_lens must be int32 [{batch}], got {seq_lens.dtype} {tuple(seq_lens.shape)}")


def _head_tile(heads_per_kv: int) -> int:
    # Query heads of one kv head share its K/V loads in one tl.dot; pad to the dot's minimum of 16
    # rows (GQA's 4 heads waste rows but not memory traffic, which is what decode is bound by).
    return max(MIN_BLOCK, min(next_power_of_2(heads_per_kv), 64))


def _key_chunks(key_dim: int) -> tuple[int, int]:
    """Main chunk = the largest power of two <= key_dim; the rest (MLA's rope 64) a padded tail."""
    main = max(MIN_BLOCK, 1 << (key_dim.bit_length() - 1))
    rest = key_dim - main
    return main, (max(MIN_BLOCK, next_power_of_2(rest)) if rest > 0 else 0)


@functools.cache
def _sm_count(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def device_sm_count(device: torch.device) -> int:
    """The GPU's SM count; ``NOMINAL_SM_COUNT`` for any other device (a count only sizes grids)."""
    if device.type != "cuda":
        return NOMINAL_SM_COUNT
    return _sm_count(device.index if device.index is not None else torch.cuda.current_device())


def _head_tiles(num_kv_heads: int, num_heads: int) -> int:
    heads_per_kv = num_heads // num_kv_heads
    return cdiv(heads_per_kv, _head_tile(heads_per_kv))


def default_num_sm_parts(device: torch.device, num_kv_heads: int, num_heads: int, key_dim: int = 0) -> int:
    """FlashMLA's rule scaled by the declared parts per SM: ``parts_per_sm * SMs // (kv heads *
    head tiles)`` parts, i.e. that many waves of the split grid.

    Independent of the batch: a small batch simply leaves trailing parts empty (they exit at once).
    """
    parts_per_sm = settings_for(key_dim).parts_per_sm if key_dim else 1
    return max(1, parts_per_sm * device_sm_count(device) // (num_kv_heads * _head_tiles(num_kv_heads, num_heads)))


def grid_splits(batch: int, programs_per_request: int, capacity_tokens: int, block_n: int, parts_per_sm: int,
                sms: int) -> int:
    """Splits per request of the grid kernel: enough programs for ``parts_per_sm`` waves over the
    SMs, ``ceil(sms * parts_per_sm / (batch * programs_per_request))``, but at most one per
    ``block_n``-token tile of the block table's capacity (the lengths are on the device; a split
    past a request's end only writes lse = -inf, which the combine skips)."""
    wanted = cdiv(sms * parts_per_sm, max(1, batch) * programs_per_request)
    return max(1, min(wanted, cdiv(capacity_tokens, block_n)))


def grid_splits_for(batch: int, block_table: torch.Tensor, block_size: int, num_kv_heads: int, num_heads: int,
                    key_dim: int, device: torch.device) -> int:
    """``grid_splits`` with the declared settings for ``key_dim`` and the device's SM count."""
    tiles = settings_for(key_dim)
    return grid_splits(batch, num_kv_heads * _head_tiles(num_kv_heads, num_heads), block_table.shape[1] * block_size,
                       tiles.block_n, tiles.parts_per_sm, device_sm_count(device))


def paged_decode_metadata(seq_lens: torch.Tensor, block_table: torch.Tensor, num_heads: int, num_kv_heads: int,
                          key_dim: int, block_size: int):
    """The split metadata the declared kernel for ``key_dim``-wide keys needs, for all layers of a step.

    ``"schedule"``: ``mla_decode_metadata``'s ``(schedule, num_splits)``. ``"grid"``: ``(None,
    num_splits)``, ``num_splits = arange(0, (batch + 1) * s, s)``, one ``arange`` and no kernel of
    ours; ``s`` depends only on the batch size, ``block_table``'s width and constants.
    """
    if settings_for(key_dim).kernel == "schedule":
        num_parts = default_num_sm_parts(seq_lens.device, num_kv_heads, num_heads, key_dim)
        return mla_decode_metadata(seq_lens, num_heads, block_size, num_parts)
    batch = seq_lens.shape[0]
    splits = grid_splits_for(batch, block_table, block_size, num_kv_heads, num_heads, key_dim, seq_lens.device)
    return None, torch.arange(0, (batch + 1) * splits, splits, dtype=torch.int32, device=seq_lens.device)


def split_shared_bytes(block_h: int, block_n: int, block_d: int, block_d_tail: int, block_dv: int,
                       value_is_key: bool, num_stages: int, item_bytes: int, target: Target) -> int:
    """Shared memory one program of a split kernel needs on ``target`` (an estimate, checked against
    compiled binaries by the tests). A K step's tiles (``block_n`` keys of ``block_d + block_d_tail``
    dims, plus the values unless ``value_is_key``) times Triton's pipeline buffers; on NVIDIA also
    the query and probability tiles the dots read, and where a 64-row matrix unit reads the value
    tile from shared memory (``async_mma``) a copy of it in that unit's layout; on AMD the query and
    probabilities stay in registers and the value (or output) rows pass through LDS to change layout.
    One stage pipelines nothing (gfx95x excepted)."""
    key_row = (block_d + block_d_tail) * item_bytes
    stage = block_n * key_row + (0 if value_is_key else block_n * block_dv * item_bytes)
    if target.is_nvidia:
        relayout = block_n * block_dv * item_bytes if async_mma(target, block_h) else 0
        # one stage pipelines nothing, but a key or value tile still passes through for the dot's layout
        staged = pipeline_buffers(target, num_stages) * stage if num_stages > 1 else \
            block_n * max(key_row, block_dv * item_bytes)
        return staged + block_h * key_row + block_h * block_n * item_bytes + relayout
    buffers = pipeline_buffers(target, num_stages) if num_stages > 1 or str(target.arch).startswith("gfx95") else 0
    return buffers * stage + max(block_n, block_h) * block_dv * item_bytes


def smaller_split_tile(tile: tuple[int, int, int]) -> tuple[int, int, int] | None:
    """``(num_stages, block_n, block_h)`` one size down: fewer stages down to 2, then fewer keys per
    step, then fewer heads per program (more head tiles), then one stage; None past the smallest."""
    stages, block_n, block_h = tile
    if stages > 2:
        return stages - 1, block_n, block_h
    if block_n > MIN_BLOCK:
        return stages, block_n // 2, block_h
    if block_h > MIN_BLOCK:
        return stages, block_n, block_h // 2
    if stages > 1:
        return 1, block_n, block_h
    return None


@functools.cache
def fitted_split_tile(tile: tuple[int, int, int], dims: tuple[int, int, int], value_is_key: bool, item_bytes: int,
                      target: Target | None) -> tuple[int, int, int]:
    """The declared ``(num_stages, block_n, block_h)``, or the largest smaller one (``smaller_split_tile``)
    that fits ``target``'s shared memory for keys / values of ``dims`` (block_d, block_d_tail, block_dv)
    in this dtype; the declared one without a target (the interpreter)."""
    if target is None:
        return tile
    return fit_tile(tile, lambda t: split_shared_bytes(t[2], t[1], *dims, value_is_key, t[0], item_bytes, target),
                    smaller_split_tile, shared_budget(target), "paged decode attention tile")


def _launch_estimate(launch: Launch, target: Target) -> int:
    """``JitKernel.shared_estimate`` of a split launch: ``split_shared_bytes`` of its constexprs."""
    c = launch.constexprs
    return split_shared_bytes(c["BLOCK_H"], c["BLOCK_N"], c["BLOCK_D"], c["BLOCK_D_TAIL"], c["BLOCK_DV"],
                              c["VALUE_IS_KEY"], launch.num_stages, launch.args[0].element_size(), target)


def _split_constexprs(q, kv_cache, value_dim: int):
    """(layout, launch constexprs, declared settings fitted to the target) shared by both split kernels."""
    batch, num_heads, key_dim = q.shape
    layout = KVCacheLayout.infer(kv_cache, key_dim, value_dim)
    heads_per_kv = num_heads // layout.num_kv_heads
    block_d, block_d_tail = _key_chunks(key_dim)
    # Token tile, warps, stages and the two loop flags are declared per target and geometry class
    # (paged_attention_tiles.json, measured per target by bench/attention_tiles.py); where the tiles
    # of a geometry (DeepSeek-V3's 128 heads: a 64-row head tile) or a dtype (fp32) would not fit the
    # target's shared memory, fewer stages, keys or heads per program (``fitted_split_tile``).
    # Shared memory per variant: `tritonwarm list`.
    tiles = settings_for(key_dim)
    block_dv = max(MIN_BLOCK, next_power_of_2(layout.value_dim))
    # The key tile can stand in for the value tile only where the value is its first BLOCK_D dims.
    value_is_key = tiles.value_is_key and layout.value_offset == 0 and block_dv == block_d \
        and layout.value_dim == block_d
    stages, block_n, block_h = fitted_split_tile((tiles.num_stages, tiles.block_n, _head_tile(heads_per_kv)),
                                                 (block_d, block_d_tail, block_dv), value_is_key, q.element_size(),
                                                 active_target())
    if (stages, block_n) != (tiles.num_stages, tiles.block_n):
        tiles = dataclasses.replace(tiles, num_stages=stages, block_n=block_n)
    constexprs = dict(PAGE_SIZE=layout.block_size, HEADS_PER_KV=heads_per_kv, KEY_DIM=key_dim,
                      VALUE_DIM=layout.value_dim, BLOCK_H=block_h, BLOCK_N=tiles.block_n,
                      BLOCK_D=block_d, BLOCK_D_TAIL=block_d_tail, BLOCK_DV=block_dv,
                      VALUE_IS_KEY=value_is_key, TABLE_AHEAD=tiles.table_ahead)
    return layout, constexprs, tiles


def _split_strides(q, kv_cache, block_table, partial_out, partial_lse):
    # block_table's row stride (the max blocks per request, a deployment setting) is
    # do_not_specialize; strides of the cache, q and the partial buffers are per-model constants
    # whose div-16 specialization pays for itself.
    return (q.stride(0), q.stride(1), kv_cache.stride(0), kv_cache.stride(1), kv_cache.stride(2),
            block_table.stride(0), partial_out.stride(0), partial_out.stride(1), partial_lse.stride(0))


def paged_decode_attention_split_launch(q, kv_cache, block_table, seq_lens, schedule, num_splits,
                                        partial_out, partial_lse, scale: float, value_dim: int) -> Launch | None:
    if q.shape[0] == 0:
        return None
    layout, constexprs, tiles = _split_constexprs(q, kv_cache, value_dim)
    # The batch only appears through the schedule and the grid.
    return Launch(
        grid=(schedule.shape[0], layout.num_kv_heads, cdiv(constexprs["HEADS_PER_KV"], constexprs["BLOCK_H"])),
        args=(q, layout.keys(kv_cache), layout.values(kv_cache), block_table, seq_lens, schedule, num_splits,
              partial_out, partial_lse, *_split_strides(q, kv_cache, block_table, partial_out, partial_lse),
              float(scale) * math.log2(math.e)),
        constexprs=dict(SCHEDULE_WIDTH=SCHEDULE_WIDTH, **constexprs),
        num_warps=tiles.num_warps,
        num_stages=tiles.num_stages,
    )


def paged_decode_attention_grid_split_launch(q, kv_cache, block_table, seq_lens, splits: int,
                                             partial_out, partial_lse, scale: float, value_dim: int) -> Launch | None:
    if q.shape[0] == 0:
        return None
    layout, constexprs, tiles = _split_constexprs(q, kv_cache, value_dim)
    # The batch and the split count only size the grid and a do_not_specialize int: one binary per
    # model geometry and dtype whatever the batch.
    return Launch(
        grid=(q.shape[0] * splits, layout.num_kv_heads, cdiv(constexprs["HEADS_PER_KV"], constexprs["BLOCK_H"])),
        args=(q, layout.keys(kv_cache), layout.values(kv_cache), block_table, seq_lens, partial_out, partial_lse,
              *_split_strides(q, kv_cache, block_table, partial_out, partial_lse),
              float(scale) * math.log2(math.e), int(splits)),
        constexprs=constexprs,
        num_warps=tiles.num_warps,
        num_stages=tiles.num_stages,
    )


def paged_decode_attention_combine_launch(partial_out, partial_lse, num_splits, out) -> Launch | None:
    batch, num_heads, value_dim = out.shape
    if batch == 0:
        return None
    block_dv = max(MIN_BLOCK, next_power_of_2(value_dim))
    # The batch only sizes the grid: one binary per model geometry and dtype. COMBINE_SPLITS splits
    # per step: the grid kernel at batch 1 gives each request a hundred or more.
    return Launch(
        grid=(batch, num_heads),
        args=(partial_out, partial_lse, num_splits, out,
              partial_out.stride(0), partial_out.stride(1), partial_lse.stride(0),
              out.stride(0), out.stride(1)),
        constexprs=dict(VALUE_DIM=value_dim, BLOCK_DV=block_dv, BLOCK_S=COMBINE_SPLITS),
        num_warps=4 if block_dv >= 512 else 2,
    )


paged_decode_attention_split_jit = JitKernel(paged_decode_attention_split_kernel, paged_decode_attention_split_launch,
                                             shared_estimate=_launch_estimate)
paged_decode_attention_grid_split_jit = JitKernel(paged_decode_attention_grid_split_kernel,
                                                  paged_decode_attention_grid_split_launch,
                                                  shared_estimate=_launch_estimate)
paged_decode_attention_combine_jit = JitKernel(paged_decode_attention_combine_kernel,
                                               paged_decode_attention_combine_launch)


def paged_decode_attention(q: torch.Tensor, kv_cache: torch.Tensor, block_table: torch.Tensor,
                           seq_lens: torch.Tensor, scale: float, metadata=None, v_head_dim: int | None = None):
    """Decode attention of ``q [batch, num_heads, key_dim]`` over a paged ``kv_cache``.

    ``kv_cache`` is ``[num_blocks, block_size, num_kv_heads, entry_dim]`` (``KVCacheLayout``):
    GQA packs ``[K | V]`` per kv head (``v_head_dim`` None or ``key_dim``); MLA has one latent kv head
    whose value is the first ``v_head_dim`` dims of its ``key_dim``-wide key. ``block_table`` int32
    ``[batch, max_blocks]``, ``seq_lens`` int32 ``[batch]`` (0 gives a zero output). ``metadata`` is
    ``paged_decode_metadata``'s (or ``mla_decode_metadata``'s ``(schedule, num_splits)``); None
    computes it here. Returns ``[batch, num_heads, value_dim]`` in q's dtype (math in fp32).
    """
    batch, num_heads, key_dim = q.shape
    layout = KVCacheLayout.infer(kv_cache, key_dim, v_head_dim)
    if num_heads % layout.num_kv_heads:
        raise ValueError(f"{num_heads} query heads do not divide into {layout.num_kv_heads} kv heads")
    if kv_cache.dtype != q.dtype:
        raise ValueError(f"kv_cache dtype {kv_cache.dtype} differs from q dtype {q.dtype}")
    if q.stride(-1) != 1:
        raise ValueError("q must have a unit stride along the head dim")
    check_block_table_and_seq_lens(block_table, seq_lens, batch)
    if metadata is None:
        metadata = paged_decode_metadata(seq_lens, block_table, num_heads, layout.num_kv_heads, key_dim,
                                         layout.block_size)
    schedule, num_splits = metadata
    if tuple(num_splits.shape) != (batch + 1,) or (schedule is not None and (
            schedule.dim() != 2 or schedule.shape[1] != SCHEDULE_WIDTH)):
        raise ValueError("metadata must be paged_decode_metadata's: (schedule [parts, 8] or None, "
                         "num_splits [batch + 1])")

    if schedule is None:  # the grid kernel: the same host rule that built num_splits
        splits = grid_splits_for(batch, block_table, layout.block_size, layout.num_kv_heads, num_heads, key_dim,
                                  q.device)
        max_splits = batch * splits
    else:  # worst case of the schedule: one split per request plus one per cut between parts
        max_splits = batch + schedule.shape[0]
    partial_out = torch.empty(max_splits, num_heads, layout.value_dim, dtype=torch.float32, device=q.device)
    partial_lse = torch.empty(max_splits, num_heads, dtype=torch.float32, device=q.device)
    out = torch.empty(batch, num_heads, layout.value_dim, dtype=q.dtype, device=q.device)
    if schedule is None:
        paged_decode_attention_grid_split_jit(q, kv_cache, block_table, seq_lens, splits,
                                              partial_out, partial_lse, scale, layout.value_dim)
    else:
        paged_decode_attention_split_jit(q, kv_cache, block_table, seq_lens, schedule, num_splits,
                                         partial_out, partial_lse, scale, layout.value_dim)
    paged_decode_attention_combine_jit(partial_out, partial_lse, num_splits, out)
    return out


@custom_op("tritonwarm::paged_decode_attention", mutates_args=())
def _paged_decode_attention_op(q: torch.Tensor, kv_cache: torch.Tensor, block_table: torch.Tensor,
                               seq_lens: torch.Tensor, scale: float,
                               schedule: torch.Tensor | None = None, num_splits: torch.Tensor | None = None,
                               v_head_dim: int | None = None) -> torch.Tensor:
    metadata = None if num_splits is None else (schedule, num_splits)
    return paged_decode_attention(q, kv_cache, block_table, seq_lens, scale, metadata, v_head_dim)


@_paged_decode_attention_op.register_fake
def _(q, kv_cache, block_table, seq_lens, scale, schedule=None, num_splits=None, v_head_dim=None):
    value_dim = q.shape[-1] if v_head_dim is None else v_head_dim
    return q.new_empty(q.shape[0], q.shape[1], value_dim)
