"""Model and engine configuration: presets, and YAML/JSON files of the same fields.

A config file holds EngineConfig fields; its ``model`` is a preset name or a mapping of ModelConfig
fields (``preset: NAME`` in it starts from that preset)::

    model: deepseek-v2-lite
    max_batch_size: 32
    max_num_tokens: 1024
    dtype: bfloat16
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

import torch
import yaml

from ..errors import describe_error
from ..launchers.fused_moe import load_tile_table
from ..launchers.kv_cache_formats import KV_CACHE_DTYPES, kv_format
from ..launchers.moe_routing import SCORINGS, check_groups

_POSITIVE = ("vocab_size", "hidden_size", "num_layers", "num_heads", "kv_lora_rank", "qk_nope_head_dim",
             "qk_rope_head_dim", "v_head_dim", "num_experts", "top_k", "moe_intermediate_size")
_NON_NEGATIVE = ("num_shared_experts", "first_dense_layers", "intermediate_size")

# What each annotation admits. A config file gives whatever YAML parsed (``2.5``, ``"x"``, ``1e30`` is a
# string in YAML 1.1), and a wrong type must be named with its field, not fail later inside torch.
_ADMITS = {
    "int": ((int,), "an integer"),
    "int | None": ((int, type(None)), "an integer or null"),
    "float": ((int, float), "a number"),
    "bool": ((bool,), "true or false"),
    "str": ((str,), "a string"),
    "str | None": ((str, type(None)), "a string or null"),
}


def _check_types(config) -> None:
    """Every field with a plain annotation holds a value of that type (a bool is not an integer here)."""
    for field in dataclasses.fields(config):
        if field.type not in _ADMITS:
            continue
        value = getattr(config, field.name)
        types, kind = _ADMITS[field.type]
        if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
            raise ValueError(f"{field.name} must be {kind}, got {value!r}")


@dataclass(frozen=True)
class ModelConfig:
    """A DeepSeek-V2-style decoder: MLA attention and a routed MoE with shared experts."""

    name: str
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    kv_lora_rank: int  # MLA latent width, cached per token
    qk_nope_head_dim: int
    qk_rope_head_dim: int  # the rotated part, cached per token beside the latent
    v_head_dim: int
    num_experts: int  # routed experts
    top_k: int
    num_shared_experts: int  # run on every token, as one MLP of num_shared * moe_intermediate
    moe_intermediate_size: int
    first_dense_layers: int = 0  # DeepSeek's first_k_dense_replace: plain MLP layers first
    intermediate_size: int = 0  # width of those dense MLPs
    scoring: str = "softmax"  # router scoring: softmax | sigmoid
    num_expert_group: int | None = None  # grouped top-k (None: no groups)
    topk_group: int | None = None
    correction_bias: bool = False  # DeepSeek-V3's e_score_correction_bias
    renormalize: bool = False  # DeepSeek's norm_topk_prob
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_is_neox: bool = False  # DeepSeek rotates interleaved pairs (gpt-j style)

    def __post_init__(self):
        _check_types(self)
        for name in _POSITIVE + _NON_NEGATIVE:
            value = getattr(self, name)
            if value < (name in _POSITIVE):
                kind = "a positive" if name in _POSITIVE else "a non-negative"
                raise ValueError(f"{name} must be {kind} integer, got {value!r}")
        if self.top_k > self.num_experts:
            raise ValueError(f"{self.name}: top_k {self.top_k} > num_experts {self.num_experts}")
        if self.scoring not in SCORINGS:
            raise ValueError(f"scoring must be one of {', '.join(SCORINGS)}, got {self.scoring!r}")
        check_groups(self.num_experts, self.top_k, self.num_expert_group, self.topk_group, self.correction_bias)
        if self.first_dense_layers and not self.intermediate_size:
            raise ValueError(f"{self.name}: first_dense_layers needs intermediate_size")


MODELS = {
    m.name: m
    for m in (
        # CPU-sized: runs through Triton's interpreter in seconds. Grouped sigmoid routing with a
        # correction bias, so the engine exercises that path of moe_topk_routing too.
        ModelConfig("tiny", vocab_size=256, hidden_size=64, num_layers=2, num_heads=4, kv_lora_rank=32,
                    qk_nope_head_dim=16, qk_rope_head_dim=16, v_head_dim=16, num_experts=8, top_k=2,
                    num_shared_experts=1, moe_intermediate_size=32, scoring="sigmoid", num_expert_group=4,
                    topk_group=2, correction_bias=True, renormalize=True),
        # deepseek-ai/DeepSeek-V2-Lite's config.json (YaRN rope scaling left out: plain rope).
        ModelConfig("deepseek-v2-lite", vocab_size=102400, hidden_size=2048, num_layers=27, num_heads=16,
                    kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128,
                    num_experts=64, top_k=6, num_shared_experts=2, moe_intermediate_size=1408,
                    first_dense_layers=1, intermediate_size=10944, scoring="softmax", renormalize=False),
    )
}


@dataclass(frozen=True)
class EngineConfig:
    """What the engine serves with: it fixes every compiled variant the engine can launch."""

    model: ModelConfig
    max_batch_size: int = 8  # running requests at once
    max_num_tokens: int = 64  # tokens per step (prefill chunks and decodes together)
    block_size: int = 16  # tokens per KV-cache block
    num_blocks: int = 64  # KV-cache blocks (per layer)
    max_model_len: int = 256  # prompt + generated tokens of one request
    dtype: torch.dtype = torch.float32
    seed: int = 0  # weights, when not loaded from a file
    # The fused MoE GEMM's tile configs by tokens in the step (vLLM's fused_moe JSON format); None:
    # the library's table. Its keys are token counts the warm-up plan steps through.
    moe_tile_configs: str | None = None
    # Decode batch sizes captured as CUDA graphs at start-up (GPU only; part of the warm-up plan). A
    # decode step of n requests replays the smallest size >= n; larger and mixed steps run eagerly.
    # None: the target's defaults (platform_defaults.py); () captures none.
    cuda_graph_batch_sizes: tuple[int, ...] | None = None
    # How the MLA latent cache stores a token: "auto" (``dtype``) or a quantized DS-MLA format
    # (launchers/kv_cache_formats.py: fp8_ds_mla, nvfp4_ds_mla).
    kv_cache_dtype: str = "auto"

    def __post_init__(self):
        _check_types(self)
        if not isinstance(self.model, ModelConfig):
            raise ValueError(f"model must be a ModelConfig, got {self.model!r}")
        for name in ("max_batch_size", "max_num_tokens", "block_size", "num_blocks", "max_model_len"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        sizes = self.cuda_graph_batch_sizes
        if sizes is not None:
            if not isinstance(sizes, (list, tuple)) or not all(isinstance(b, int) and not isinstance(b, bool)
                                                                for b in sizes):
                raise ValueError(f"cuda_graph_batch_sizes must be a list of integers or null, got {sizes!r}")
            if any(b < 1 or b > self.max_batch_size for b in sizes):
                raise ValueError(f"cuda_graph_batch_sizes {list(sizes)} must lie in 1..max_batch_size "
                                 f"({self.max_batch_size})")
            object.__setattr__(self, "cuda_graph_batch_sizes", tuple(sorted(set(sizes))))
        if self.moe_tile_configs is not None:
            load_tile_table(self.moe_tile_configs)  # a bad table is named now, not at the first MoE layer
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ValueError(f"kv_cache_dtype must be one of {', '.join(KV_CACHE_DTYPES)}, got {self.kv_cache_dtype!r}")
        if self.kv_cache_dtype != "auto":  # the format must tile this model's latent
            kv_format(self.kv_cache_dtype, self.model.kv_lora_rank, self.model.qk_rope_head_dim)
        if self.max_batch_size > self.max_num_tokens:
            raise ValueError("max_batch_size must not exceed max_num_tokens: every running request "
                             "decodes one token per step")

    @property
    def max_blocks_per_request(self) -> int:
        return -(-self.max_model_len // self.block_size)


# Decode graph sizes: the target's (tiny: 1, 2, 4; deepseek-v2-lite: 1, 2, 4, 8, 16, 24, 32 on a GPU).
ENGINES = {
    "tiny": EngineConfig(MODELS["tiny"], max_batch_size=4, max_num_tokens=32, block_size=16, num_blocks=32,
                         max_model_len=128, dtype=torch.float32),
    "deepseek-v2-lite": EngineConfig(MODELS["deepseek-v2-lite"], max_batch_size=32, max_num_tokens=1024,
                                     block_size=64, num_blocks=2048, max_model_len=4096, dtype=torch.bfloat16),
}


def load_engine_config(name_or_path: str | Path | EngineConfig) -> EngineConfig:
    """A preset name (``tiny``, ``deepseek-v2-lite``) or a YAML/JSON file of EngineConfig fields."""
    if isinstance(name_or_path, EngineConfig):
        return name_or_path
    if str(name_or_path) in ENGINES:
        return ENGINES[str(name_or_path)]
    path = Path(name_or_path)
    if not path.is_file():
        raise ValueError(f"unknown engine config {str(name_or_path)!r}: a preset ({', '.join(ENGINES)}) "
                         "or a YAML/JSON file")
    try:
        text = path.read_text()
        data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except OSError as e:
        raise ValueError(f"{path}: cannot read the engine config: {e.strerror or e}") from None
    except (ValueError, yaml.YAMLError) as e:  # not UTF-8, not JSON, not YAML
        raise ValueError(f"{path}: not an engine config: {describe_error(e)}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a mapping of engine config fields")
    tiles = data.get("moe_tile_configs")
    if isinstance(tiles, str):  # a relative table path is the config file's neighbour
        data["moe_tile_configs"] = str(path.parent / tiles)
    return engine_config_from_dict(data, where=str(path))


def engine_config_from_dict(data: dict, where: str = "config") -> EngineConfig:
    data = dict(data)
    preset = data.pop("preset", None)
    if preset is not None and preset not in ENGINES:
        raise ValueError(f"{where}: unknown preset {preset!r}: choose one of {', '.join(ENGINES)}")
    base = ENGINES.get(preset) if preset is not None else None
    model = data.pop("model", base.model.name if base else None)
    if model is None:
        raise ValueError(f"{where}: missing 'model' (a preset name or a mapping of model fields)")
    fields = {f.name for f in dataclasses.fields(EngineConfig)} - {"model"}
    unknown = set(data) - fields
    if unknown:
        raise ValueError(f"{where}: unknown engine field(s) {', '.join(sorted(unknown))}; "
                         f"known: {', '.join(sorted(fields))}")
    if "dtype" in data:
        data["dtype"] = parse_dtype(data["dtype"])
    values = dataclasses.asdict(base) if base else {}
    values.pop("model", None)
    if base:
        values["dtype"] = base.dtype
    values.update(data)
    if base and "cuda_graph_batch_sizes" not in data and base.cuda_graph_batch_sizes is not None:
        # the preset's own sizes, within this batch limit
        limit = values.get("max_batch_size", base.max_batch_size)
        values["cuda_graph_batch_sizes"] = tuple(b for b in base.cuda_graph_batch_sizes if b <= limit)
    model_config = _model_from(model, where)
    try:
        return EngineConfig(model=model_config, **values)
    except ValueError as e:
        raise ValueError(f"{where}: {e}") from None


def _model_from(model, where: str) -> ModelConfig:
    if isinstance(model, str):
        if model not in MODELS:
            raise ValueError(f"{where}: unknown model {model!r}: choose one of {', '.join(MODELS)} or give its fields")
        return MODELS[model]
    if not isinstance(model, dict):
        raise ValueError(f"{where}: 'model' must be a preset name or a mapping")
    model = dict(model)
    preset = model.pop("preset", None)
    fields = {f.name for f in dataclasses.fields(ModelConfig)}
    unknown = set(model) - fields
    if unknown:
        raise ValueError(f"{where}: unknown model field(s) {', '.join(sorted(unknown))}")
    if preset is not None:
        try:
            return dataclasses.replace(_model_from(preset, where), **model)
        except (TypeError, ValueError) as e:
            raise ValueError(f"{where}: model: {e}") from None
    model.setdefault("name", "custom")
    missing = [f.name for f in dataclasses.fields(ModelConfig)
               if f.default is dataclasses.MISSING and f.name not in model]
    if missing:
        raise ValueError(f"{where}: model: missing field(s) {', '.join(missing)} "
                         f"(or start from a preset: 'preset: {next(iter(MODELS))}')")
    try:
        return ModelConfig(**model)
    except (TypeError, ValueError) as e:
        raise ValueError(f"{where}: model: {e}") from None


def parse_dtype(name) -> torch.dtype:
    dtypes = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
    if isinstance(name, torch.dtype):
        return name
    if name not in dtypes:
        raise ValueError(f"unknown dtype {name!r}: choose one of {', '.join(dtypes)}")
    return dtypes[name]
