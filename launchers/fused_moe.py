"""Fused MoE expert GEMM launcher: routed tokens in, the experts' weighted sum out; plus the
``tritonwarm::fused_moe`` op. Device code and layout in ``kernels/fused_moe.py``.

Tile configs are data: a table keyed by M, the tokens in the call, in the format of vLLM's
``fused_moe`` config files (``{"M": {"BLOCK_SIZE_M": .., "BLOCK_SIZE_N": .., "BLOCK_SIZE_K": ..,
"GROUP_SIZE_M": .., "num_warps": .., "num_stages": ..}}``), and a call uses the entry whose key is
nearest to its M (as vLLM does). Each entry is one compiled variant per GEMM, so the table *is* the
specialization set: ``warmup_specs/fused_moe.yaml`` and the engine's plan name one M per key.

A table measured on a target (``bench/fused_moe_tiles.py`` writes one per weight format) is saved as
``fused_moe_configs/<target>.json`` (``sm90.json``, dense weights) or ``<target>_mxfp4.json`` /
``<target>_nvfp4.json`` (FP4 weights, else the dense one); a call without an explicit table uses the
one of the target Triton's *active driver* reports, else ``default.json``. Warm-up traces under the
target-only driver of the target it warms, so it selects from the same table the runtime will.
``BLOCK_SIZE_M`` is also ``moe_align_block_size``'s block, so alignment and GEMM always agree.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import torch
import yaml

from ..errors import describe_error
from ..jit import JitKernel, Launch, Target
from ..jit.core.targets import active_gpu_target, target_from_gpu_target
from ..jit.core.tile_fit import active_target, async_mma, fit_tile, pipeline_buffers, shared_budget
from ..kernels.fused_moe import fused_moe_kernel, fused_moe_nvfp4_kernel
from ._host import cdiv
from ._op import custom_op
from .moe_align import moe_align_block_size

CONFIG_DIR = Path(__file__).with_name("fused_moe_configs")
DEFAULT_CONFIGS = CONFIG_DIR / "default.json"
_FIELDS = ("BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K", "GROUP_SIZE_M", "num_warps", "num_stages")


@dataclass(frozen=True)
class TileConfig:
    block_m: int
    block_n: int
    block_k: int
    group_m: int
    num_warps: int
    num_stages: int


@dataclass(frozen=True)
class TileTable:
    """Tile configs by M; ``select(m)`` is the entry of the key nearest to ``m`` (ties: the smaller)."""

    keys: tuple[int, ...]
    configs: tuple[TileConfig, ...]

    def select(self, m: int) -> TileConfig:
        # keys are few and sorted: a linear scan is cheaper than anything cleverer at this size
        best = 0
        for i, key in enumerate(self.keys):
            if abs(key - m) < abs(self.keys[best] - m):
                best = i
        return self.configs[best]

    def bucket_tokens(self, max_tokens: int) -> list[int]:
        """One M per key up to ``max_tokens`` (clamped), so that a plan reaches every entry in use."""
        return sorted({min(key, max_tokens) for key in self.keys})


@cache
def load_tile_table(path: str | Path = DEFAULT_CONFIGS) -> TileTable:
    """A JSON (vLLM's format) or YAML file of tile configs keyed by M; one-line errors name the field."""
    path = Path(path)
    try:
        text = path.read_text()
        if path.suffix in (".yaml", ".yml"):
            data = yaml.safe_load(text)
        else:
            data = json.loads(text)
    except OSError as e:
        raise ValueError(f"{path}: cannot read the tile table: {e.strerror or e}") from None
    except (ValueError, yaml.YAMLError) as e:  # not UTF-8, not JSON, not YAML
        raise ValueError(f"{path}: not a tile table: {describe_error(e)}") from None
    if not isinstance(data, dict) or not data:
        raise ValueError(f"{path}: expected a mapping of M to a tile config")
    entries = []
    for key, entry in data.items():
        if isinstance(key, bool) or not (str(key).isascii() and str(key).isdigit()) or int(key) < 1:
            raise ValueError(f"{path}: key {key!r}: not a positive integer M")
        m = int(key)
        if any(m == seen for seen, _ in entries):
            raise ValueError(f"{path}: key {key!r}: M {m} is given twice")
        if not isinstance(entry, dict):
            raise ValueError(f"{path}: {key}: expected a mapping of {', '.join(_FIELDS)}")
        missing = [f for f in _FIELDS if f not in entry]
        if missing:
            raise ValueError(f"{path}: {key}: missing {', '.join(missing)}")
        for field in _FIELDS:
            value = entry[field]
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{path}: {key}: {field} must be a positive integer, got {value!r}")
        config = TileConfig(*(entry[f] for f in _FIELDS))
        for name in ("block_m", "block_n", "block_k"):
            value = getattr(config, name)
            if value < 16 or value & (value - 1):
                raise ValueError(f"{path}: {key}: {name} {value} must be a power of two >= 16 (tl.dot)")
        if config.num_warps & (config.num_warps - 1):
            raise ValueError(f"{path}: {key}: num_warps {config.num_warps} must be a power of two")
        entries.append((m, config))
    entries.sort(key=lambda e: e[0])
    return TileTable(tuple(m for m, _ in entries), tuple(c for _, c in entries))


WEIGHT_FORMATS = ("bf16", "mxfp4", "nvfp4")  # bf16 names the dense table (any dense dtype)


def target_table_path(target_name: str, weights: str = "bf16") -> Path:
    """The table a target reads for a weight format: ``<target>_<weights>.json`` where one was
    measured for an FP4 format, else ``<target>.json`` (dense, measured), else ``default.json``."""
    for name in ([f"{target_name}_{weights}"] if weights != "bf16" else []) + [target_name]:
        path = CONFIG_DIR / f"{name}.json"
        if path.is_file():
            return path
    return DEFAULT_CONFIGS


_active: dict[str, tuple[object, TileTable]] = {}  # weights -> (the GPUTarget it was read for, its table)


def active_tile_table(weights: str = "bf16") -> TileTable:
    """The tile table of the target Triton's active driver compiles for (``active_gpu_target``), for
    the weight format (``target_table_path``); ``default.json`` where there is no driver (CPU only:
    Triton's interpreter). Kept for as long as that driver's answer (the same object) lasts, so a
    step pays one identity check and a table saved for a target is read by the next driver of that
    target."""
    target = active_gpu_target()
    if target is None:
        return load_tile_table()
    cached = _active.get(weights)
    if cached is None or cached[0] is not target:
        path = target_table_path(target_from_gpu_target(target).name, weights)
        cached = _active[weights] = (target, load_tile_table(path))
    return cached[1]


def _fp4_constexprs(packed: torch.Tensor, config: TileConfig) -> dict:
    """The FP4 kernels' two layout choices. ``SWAP`` below 64-row blocks: the weight tile becomes the
    MMA's first operand, so Hopper's 64-row warpgroup MMA runs for a 16-token block (not on sm100
    with Triton 3.6, which cannot compile it there). ``BF16_BITS``
    where the target is NVIDIA: the decoded halves are used as bf16 subnormals, which NVIDIA's bf16
    arithmetic keeps; elsewhere (AMD, Triton's interpreter) the same values go through fp32."""
    if packed.data_ptr() % 4 or any(stride % 4 for stride in packed.stride()[:2]) or packed.stride(2) != 1:
        raise ValueError(f"packed FP4 weights {tuple(packed.shape)} must have contiguous rows starting on "
                         f"4-byte boundaries (strides {tuple(packed.stride())}): they are read as int32 words")
    target = active_gpu_target()
    return dict(SWAP=_swapped(config, target), BF16_BITS=target is not None and target.backend == "cuda")


def _tcgen05(target) -> bool:
    """sm100 and later before sm120: the asynchronous MMA with its accumulator in tensor memory.
    ``target``: a tritonwarm ``Target`` or Triton's ``GPUTarget`` (both name a backend and an arch)."""
    return target is not None and target.backend == "cuda" and 100 <= int(target.arch) < 120


def _swapped(config: TileConfig, target) -> bool:
    """``SWAP`` below 64-row blocks, except for sm100's tcgen05 MMA under Triton 3.6, whose pipeliner
    fails on the swapped gated FP4 tile (an MLIR assertion in TritonGPUPipeline; 3.7 compiles it):
    there the same blocks run unswapped."""
    return config.block_m < 64 and not (_tcgen05(target) and _triton_before((3, 7)))


@cache
def _triton_before(version: tuple[int, int]) -> bool:
    import triton

    return tuple(int(part) for part in triton.__version__.split(".")[:2]) < version


WEIGHT_FORMATS = ("dense", "mxfp4", "nvfp4")


def fused_moe_shared_bytes(config: TileConfig, act_bytes: int, weight: str, gated: bool, target: Target) -> int:
    """Shared memory one program of the fused MoE GEMM needs on ``target`` (an estimate, checked
    against compiled binaries by ``bench/shared_estimates.py`` and the tests), from what Triton
    allocates for this kernel:

    - dense weights: the loads feed ``tl.dot`` as they are, so each pipeline buffer
      (``pipeline_buffers``: ``num_stages`` where an asynchronous matrix unit reads them from shared
      memory, which takes 2-byte operands only: fp32's IEEE dots run on FMA; else one fewer) holds a
      K step's ``A`` tile (BLOCK_M x BLOCK_K) and its weight tile(s), one per output (two when
      ``gated``: gate and up);
    - FP4 weights (MXFP4, NVFP4): a K step loads ``A`` and the packed weight tile(s) (two codes a
      byte, plus one scale byte per 32 or 16 values), which are reordered and decoded in registers
      before any dot. On NVIDIA the pipeliner keeps ``num_stages - 1`` buffers of them (none at one
      stage: the last stage is in registers), and the MMAs read their operands from shared memory:
      the reordered ``A`` tile and the decoded weight tile in the activation's dtype (BLOCK_N x
      BLOCK_K; one at a time, gate then up). sm100's tcgen05 MMAs run asynchronously and keep both
      weight tiles, or with ``SWAP`` (below 64-row blocks, the weights the MMA's first operand) read
      them from tensor memory while ``A`` is staged twice in shared memory.
      With ``SWAP`` the accumulator leaves tensor memory transposed and changes layout through
      shared memory (BLOCK_M x BLOCK_N, fp32) while those buffers are held.
      On AMD the pipeliner streams through LDS only a load whose one use is a dot operand: the
      ``A`` tile of an ungated GEMM (``pipeline_buffers``; gated, it feeds two dots), never the
      packed weights, which are prefetched into registers; and the operands pass through LDS on
      their way to registers one at a time: the larger of the two tiles.
    """
    m, n, k = config.block_m, config.block_n, config.block_k
    outputs = 2 if gated else 1
    a_tile = m * k * act_bytes
    if weight == "dense":
        stage = a_tile + outputs * k * n * act_bytes
        return pipeline_buffers(target, config.num_stages, async_mma(target, m) and act_bytes <= 2) * stage
    decoded = n * k * act_bytes
    if not target.is_nvidia:
        streamed = 0 if gated else pipeline_buffers(target, config.num_stages) * a_tile
        return streamed + max(a_tile, decoded)
    packed = k * n // 2 + n * k // (32 if weight == "mxfp4" else 16)
    buffered = max(config.num_stages - 1, 0) * (a_tile + outputs * packed)
    if _tcgen05(target):
        return buffered + (2 * a_tile + m * n * 4 if _swapped(config, target) else outputs * decoded + a_tile)
    return buffered + decoded + a_tile


def smaller_moe_tile(config: TileConfig, min_block_k: int = 16) -> TileConfig | None:
    """The next smaller tile to try when one does not fit: BLOCK_K halved down to 64, then fewer
    stages down to 2, BLOCK_K down to 32 (``min_block_k`` if larger), BLOCK_N down to 32, BLOCK_M
    down to 16, one stage; None past the smallest."""
    replace = dataclasses.replace
    if config.block_k > 64:
        return replace(config, block_k=config.block_k // 2)
    if config.num_stages > 2:
        return replace(config, num_stages=config.num_stages - 1)
    if config.block_k > max(min_block_k, 32):
        return replace(config, block_k=config.block_k // 2)
    if config.block_n > 32:
        return replace(config, block_n=config.block_n // 2)
    if config.block_m > 16:
        return replace(config, block_m=config.block_m // 2)
    if config.num_stages > 1:
        return replace(config, num_stages=1)
    return None


@cache
def fitted_moe_tile(config: TileConfig, act_bytes: int, weight: str, target: Target | None) -> TileConfig:
    """``config``, or the largest smaller tile (``smaller_moe_tile``) whose gate/up GEMM (the larger
    of the two) fits ``target``'s shared memory in this dtype and weight format: a table written for
    2-byte activations also serves fp32 ones. No target (the interpreter): ``config``."""
    if target is None:
        return config
    min_k = 32 if weight == "mxfp4" else 16
    return fit_tile(config, lambda c: fused_moe_shared_bytes(c, act_bytes, weight, True, target),
                    lambda c: smaller_moe_tile(c, min_k), shared_budget(target), f"fused MoE tile ({weight})")


def _launch_estimate(weight: str):
    """``JitKernel.shared_estimate`` of a GEMM launch: ``fused_moe_shared_bytes`` of its tile."""
    def estimate(launch: Launch, target: Target) -> int:
        c = launch.constexprs
        config = TileConfig(c["BLOCK_M"], c["BLOCK_N"], c["BLOCK_K"], c["GROUP_M"], launch.num_warps,
                            launch.num_stages)
        return fused_moe_shared_bytes(config, launch.args[0].element_size(), "mxfp4" if c.get("MXFP4_B") else weight,
                                      c["GATED"], target)

    return estimate


# num_valid_slots and num_m_blocks change every step: do_not_specialize, they only bound the work.
# N, K and the strides are per-model constants; TOP_K, the tile, the GEMM kind and the weight format
# are constexprs. ``b_scales`` is None for dense weights (the kernel never reads the scale pointer then).
def fused_moe_gemm_launch(a, b, b_scales, c, topk_weights, sorted_token_ids, expert_ids, num_tokens_post_padded,
                          top_k: int, gated: bool, mul_routed_weight: bool, config: TileConfig) -> Launch | None:
    num_m_blocks = expert_ids.shape[0]
    n = c.shape[1]
    k = a.shape[1]
    if num_m_blocks == 0 or n == 0:
        return None
    mxfp4 = b_scales is not None
    scales = b_scales if mxfp4 else b
    scale_strides = (b_scales.stride(0), b_scales.stride(1)) if mxfp4 else (0, 0)
    fp4 = _fp4_constexprs(b, config) if mxfp4 else {}
    return Launch(
        grid=(num_m_blocks * cdiv(n, config.block_n),),
        args=(a, b, scales, c, topk_weights, sorted_token_ids, expert_ids, num_tokens_post_padded,
              topk_weights.numel(), num_m_blocks, n, k, a.stride(0), b.stride(0), b.stride(1), *scale_strides,
              c.stride(0)),
        constexprs=dict(TOP_K=top_k, GATED=gated, MUL_ROUTED_WEIGHT=mul_routed_weight, MXFP4_B=mxfp4,
                        BLOCK_M=config.block_m, BLOCK_N=config.block_n, BLOCK_K=config.block_k,
                        GROUP_M=config.group_m, **fp4),
        num_warps=config.num_warps, num_stages=config.num_stages,
    )


fused_moe_gemm_jit = JitKernel(fused_moe_kernel, fused_moe_gemm_launch, shared_estimate=_launch_estimate("dense"))


def fused_moe_nvfp4_gemm_launch(a, b, b_scales, b_global_scales, c, topk_weights, sorted_token_ids, expert_ids,
                                num_tokens_post_padded, top_k: int, gated: bool, mul_routed_weight: bool,
                                config: TileConfig) -> Launch | None:
    """As ``fused_moe_gemm_launch``, for NVFP4 weights: scales as bytes, one fp32 global scale per expert."""
    num_m_blocks = expert_ids.shape[0]
    n = c.shape[1]
    if num_m_blocks == 0 or n == 0:
        return None
    return Launch(
        grid=(num_m_blocks * cdiv(n, config.block_n),),
        args=(a, b, b_scales, b_global_scales, c, topk_weights, sorted_token_ids, expert_ids, num_tokens_post_padded,
              topk_weights.numel(), num_m_blocks, n, a.shape[1], a.stride(0), b.stride(0), b.stride(1),
              b_scales.stride(0), b_scales.stride(1), c.stride(0)),
        constexprs=dict(TOP_K=top_k, GATED=gated, MUL_ROUTED_WEIGHT=mul_routed_weight, BLOCK_M=config.block_m,
                        BLOCK_N=config.block_n, BLOCK_K=config.block_k, GROUP_M=config.group_m,
                        **_fp4_constexprs(b, config)),
        num_warps=config.num_warps, num_stages=config.num_stages,
    )


fused_moe_nvfp4_gemm_jit = JitKernel(fused_moe_nvfp4_kernel, fused_moe_nvfp4_gemm_launch,
                                     shared_estimate=_launch_estimate("nvfp4"))


def fused_moe(hidden: torch.Tensor, w_gate_up: torch.Tensor, w_down: torch.Tensor, topk_weights: torch.Tensor,
              topk_ids: torch.Tensor, tile_table: TileTable | None = None) -> torch.Tensor:
    """``sum_k w[t, k] * down[e](silu(gate[e](x_t)) * up[e](x_t))`` with ``e = topk_ids[t, k]``.

    ``hidden`` [T, H]; ``w_gate_up`` [E, 2I, H] (gate rows then up rows); ``w_down`` [E, H, I];
    ``topk_weights`` / ``topk_ids`` [T, top_k] (the router's output). Returns [T, H] in ``hidden``'s
    dtype. Two launches of one kernel (gate/up with SiLU-and-mul fused; down times the routing
    weight), after ``moe_align_block_size`` with the tile's ``BLOCK_SIZE_M``.
    """
    num_experts, two_i, k_in = w_gate_up.shape
    return _fused_moe(hidden, w_gate_up, None, w_down, None, topk_weights, topk_ids, num_experts, two_i // 2, k_in,
                      tile_table)


def fused_moe_mxfp4(hidden: torch.Tensor, w_gate_up: torch.Tensor, w_gate_up_scales: torch.Tensor,
                    w_down: torch.Tensor, w_down_scales: torch.Tensor, topk_weights: torch.Tensor,
                    topk_ids: torch.Tensor, tile_table: TileTable | None = None) -> torch.Tensor:
    """``fused_moe`` with OCP MXFP4 expert weights as ``mxfp4_quantize`` packs them along K:
    ``w_gate_up`` uint8 [E, 2I, H/2] + scales [E, 2I, H/32], ``w_down`` uint8 [E, H, I/2] + scales
    [E, H, I/32]; H and I multiples of 32. Decoded tile by tile in registers (never in memory)."""
    num_experts, two_i, half_k = w_gate_up.shape
    if w_gate_up.dtype != torch.uint8 or w_down.dtype != torch.uint8:
        raise ValueError("MXFP4 weights are packed uint8 (mxfp4_quantize's output)")
    if w_gate_up_scales.shape != (num_experts, two_i, half_k // 16) or \
            w_down_scales.shape != (*w_down.shape[:2], w_down.shape[2] // 16):
        raise ValueError("MXFP4 scales must be [E, N, K/32] beside packed weights [E, N, K/2]")
    return _fused_moe(hidden, w_gate_up, w_gate_up_scales, w_down, w_down_scales, topk_weights, topk_ids,
                      num_experts, two_i // 2, 2 * half_k, tile_table)


def fused_moe_nvfp4(hidden: torch.Tensor, w_gate_up: torch.Tensor, w_gate_up_scales: torch.Tensor,
                    w_gate_up_global_scales: torch.Tensor, w_down: torch.Tensor, w_down_scales: torch.Tensor,
                    w_down_global_scales: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor,
                    tile_table: TileTable | None = None) -> torch.Tensor:
    """``fused_moe`` with NVFP4 expert weights as ``nvfp4_quantize`` packs them along K, one global
    scale per expert (each expert quantized with its own): ``w_gate_up`` uint8 [E, 2I, H/2] + FP8 E4M3
    scales [E, 2I, H/16] + fp32 [E]; ``w_down`` uint8 [E, H, I/2] + [E, H, I/16] + fp32 [E]; H and I
    multiples of 16. Decoded tile by tile in registers (never in memory)."""
    num_experts, two_i, half_k = w_gate_up.shape
    if w_gate_up.dtype != torch.uint8 or w_down.dtype != torch.uint8:
        raise ValueError("NVFP4 weights are packed uint8 (nvfp4_quantize's output)")
    for name, scales, packed in (("w_gate_up_scales", w_gate_up_scales, w_gate_up), ("w_down_scales", w_down_scales,
                                                                                       w_down)):
        if scales.dtype not in (torch.float8_e4m3fn, torch.uint8) or \
                tuple(scales.shape) != (*packed.shape[:2], packed.shape[2] // 8):
            raise ValueError(f"NVFP4 {name} must be float8_e4m3fn [E, N, K/16] beside packed weights [E, N, K/2], "
                             f"got {scales.dtype} {tuple(scales.shape)}")
    for name, global_scales in (("w_gate_up_global_scales", w_gate_up_global_scales),
                                ("w_down_global_scales", w_down_global_scales)):
        if global_scales.dtype != torch.float32 or tuple(global_scales.shape) != (num_experts,):
            raise ValueError(f"NVFP4 {name} must be float32 [{num_experts}] (one per expert), "
                             f"got {global_scales.dtype} {tuple(global_scales.shape)}")
    return _fused_moe(hidden, w_gate_up, w_gate_up_scales.view(torch.uint8), w_down, w_down_scales.view(torch.uint8),
                      topk_weights, topk_ids, num_experts, two_i // 2, 2 * half_k, tile_table,
                      global_scales=(w_gate_up_global_scales.contiguous(), w_down_global_scales.contiguous()))


def _fused_moe(hidden, w_gate_up, gate_up_scales, w_down, down_scales, topk_weights, topk_ids, num_experts,
               intermediate, k_in, tile_table, global_scales=None):
    num_tokens, hidden_size = hidden.shape
    mxfp4 = gate_up_scales is not None and global_scales is None
    packed = gate_up_scales is not None
    down_k = w_down.shape[2] * (2 if packed else 1)
    if k_in != hidden_size or tuple(w_down.shape[:2]) != (num_experts, hidden_size) or down_k != intermediate:
        raise ValueError(f"expert weights {tuple(w_gate_up.shape)} / {tuple(w_down.shape)} do not fit "
                         f"hidden size {hidden_size}: expected [E, 2I, H] and [E, H, I]")
    if mxfp4 and (hidden_size % 32 or intermediate % 32):
        raise ValueError(f"MXFP4 needs hidden {hidden_size} and intermediate {intermediate} to be multiples of 32")
    if global_scales is not None and (hidden_size % 16 or intermediate % 16):
        raise ValueError(f"NVFP4 needs hidden {hidden_size} and intermediate {intermediate} to be multiples of 16")
    top_k = topk_ids.shape[1]
    weight = "mxfp4" if mxfp4 else "nvfp4" if global_scales is not None else "dense"
    config = (tile_table or active_tile_table("bf16" if weight == "dense" else weight)).select(num_tokens)
    if mxfp4 and config.block_k < 32:  # one MX block of 32 per tile at least
        config = dataclasses.replace(config, block_k=32)
    config = fitted_moe_tile(config, hidden.element_size(), weight, active_target())
    if hidden.stride(1) != 1:
        hidden = hidden.contiguous()
    sorted_ids, expert_ids, post_padded = moe_align_block_size(topk_ids, num_experts, config.block_m)
    weights = topk_weights.reshape(-1)
    if weights.numel() and weights.stride(0) != 1:
        weights = weights.contiguous()
    slots = num_tokens * top_k
    act = hidden.new_empty((slots, intermediate))
    # Zeros: a slot routed to no expert of this rank (id -1) is never written and must add nothing.
    per_slot = torch.zeros((slots, hidden_size), dtype=torch.float32, device=hidden.device)
    if global_scales is None:
        fused_moe_gemm_jit(hidden, w_gate_up, gate_up_scales, act, weights, sorted_ids, expert_ids, post_padded,
                           top_k, True, False, config)
        fused_moe_gemm_jit(act, w_down, down_scales, per_slot, weights, sorted_ids, expert_ids, post_padded, 1,
                           False, True, config)
    else:
        fused_moe_nvfp4_gemm_jit(hidden, w_gate_up, gate_up_scales, global_scales[0], act, weights, sorted_ids,
                                 expert_ids, post_padded, top_k, True, False, config)
        fused_moe_nvfp4_gemm_jit(act, w_down, down_scales, global_scales[1], per_slot, weights, sorted_ids,
                                 expert_ids, post_padded, 1, False, True, config)
    return per_slot.view(num_tokens, top_k, hidden_size).sum(dim=1).to(hidden.dtype)


@custom_op("tritonwarm::fused_moe", mutates_args=())
def _fused_moe_op(hidden: torch.Tensor, w_gate_up: torch.Tensor, w_down: torch.Tensor, topk_weights: torch.Tensor,
                  topk_ids: torch.Tensor) -> torch.Tensor:
    return fused_moe(hidden, w_gate_up, w_down, topk_weights, topk_ids)


@_fused_moe_op.register_fake
def _(hidden, w_gate_up, w_down, topk_weights, topk_ids):
    return torch.empty_like(hidden)


@custom_op("tritonwarm::fused_moe_mxfp4", mutates_args=())
def _fused_moe_mxfp4_op(hidden: torch.Tensor, w_gate_up: torch.Tensor, w_gate_up_scales: torch.Tensor,
                        w_down: torch.Tensor, w_down_scales: torch.Tensor, topk_weights: torch.Tensor,
                        topk_ids: torch.Tensor) -> torch.Tensor:
    return fused_moe_mxfp4(hidden, w_gate_up, w_gate_up_scales, w_down, w_down_scales, topk_weights, topk_ids)


@_fused_moe_mxfp4_op.register_fake
def _(hidden, w_gate_up, w_gate_up_scales, w_down, w_down_scales, topk_weights, topk_ids):
    return torch.empty_like(hidden)


@custom_op("tritonwarm::fused_moe_nvfp4", mutates_args=())
def _fused_moe_nvfp4_op(hidden: torch.Tensor, w_gate_up: torch.Tensor, w_gate_up_scales: torch.Tensor,
                        w_gate_up_global_scales: torch.Tensor, w_down: torch.Tensor, w_down_scales: torch.Tensor,
                        w_down_global_scales: torch.Tensor, topk_weights: torch.Tensor,
                        topk_ids: torch.Tensor) -> torch.Tensor:
    return fused_moe_nvfp4(hidden, w_gate_up, w_gate_up_scales, w_gate_up_global_scales, w_down, w_down_scales,
                           w_down_global_scales, topk_weights, topk_ids)


@_fused_moe_nvfp4_op.register_fake
def _(hidden, w_gate_up, w_gate_up_scales, w_gate_up_global_scales, w_down, w_down_scales, w_down_global_scales,
      topk_weights, topk_ids):
    return torch.empty_like(hidden)
