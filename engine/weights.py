"""Model weights under Hugging Face DeepSeek-V2 names: seeded random, or read from safetensors.

Keeping the checkpoint's own names means a real DeepSeek-V2-Lite checkpoint (a directory of
``*.safetensors`` shards) loads with no conversion step. The reader and writer are the few lines
the safetensors format needs (an 8-byte header length, a JSON header, raw little-endian data), so
the engine adds no dependency for them.
"""

from __future__ import annotations

import json
import math
import mmap
import os
import struct
import warnings
from pathlib import Path

import torch

from ..jit.pipeline.progress import set_phase
from .config import ModelConfig

_ST_DTYPES = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16, "I32": torch.int32,
              "I64": torch.int64}


def weight_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor of the checkpoint, by name."""
    h, heads = cfg.hidden_size, cfg.num_heads
    shapes = {"model.embed_tokens.weight": (cfg.vocab_size, h), "model.norm.weight": (h,),
              "lm_head.weight": (cfg.vocab_size, h)}
    for i in range(cfg.num_layers):
        p = f"model.layers.{i}."
        shapes.update({
            p + "input_layernorm.weight": (h,),
            p + "post_attention_layernorm.weight": (h,),
            p + "self_attn.q_proj.weight": (heads * (cfg.qk_nope_head_dim + cfg.qk_rope_head_dim), h),
            p + "self_attn.kv_a_proj_with_mqa.weight": (cfg.kv_lora_rank + cfg.qk_rope_head_dim, h),
            p + "self_attn.kv_a_layernorm.weight": (cfg.kv_lora_rank,),
            p + "self_attn.kv_b_proj.weight": (heads * (cfg.qk_nope_head_dim + cfg.v_head_dim), cfg.kv_lora_rank),
            p + "self_attn.o_proj.weight": (h, heads * cfg.v_head_dim),
        })
        if i < cfg.first_dense_layers:
            shapes.update(_mlp(p + "mlp.", h, cfg.intermediate_size))
            continue
        shapes[p + "mlp.gate.weight"] = (cfg.num_experts, h)
        if cfg.correction_bias:
            shapes[p + "mlp.gate.e_score_correction_bias"] = (cfg.num_experts,)
        for e in range(cfg.num_experts):
            shapes.update(_mlp(f"{p}mlp.experts.{e}.", h, cfg.moe_intermediate_size))
        if cfg.num_shared_experts:
            shapes.update(_mlp(p + "mlp.shared_experts.", h, cfg.num_shared_experts * cfg.moe_intermediate_size))
    return shapes


def _mlp(prefix: str, hidden: int, inter: int) -> dict[str, tuple[int, int]]:
    return {prefix + "gate_proj.weight": (inter, hidden), prefix + "up_proj.weight": (inter, hidden),
            prefix + "down_proj.weight": (hidden, inter)}


def random_weights(cfg: ModelConfig, dtype: torch.dtype, device, seed: int) -> dict[str, torch.Tensor]:
    """Seeded weights scaled so activations stay O(1) and logits spread over a few units (greedy
    argmax then has no near-ties). On ``meta`` nothing is generated: only shapes."""
    device = torch.device(device)
    if device.type == "meta":
        return {name: torch.empty(shape, dtype=dtype, device=device) for name, shape in weight_shapes(cfg).items()}
    gen = torch.Generator(device=device).manual_seed(seed)
    out = {}
    shapes = weight_shapes(cfg)
    for i, (name, shape) in enumerate(shapes.items()):
        set_phase(f"generating random weights: {i}/{len(shapes)} tensors")
        if name.endswith("norm.weight") or name.endswith("layernorm.weight"):
            w = 1.0 + 0.1 * torch.randn(shape, generator=gen, device=device)
        elif name.endswith("correction_bias"):
            w = 0.1 * torch.randn(shape, generator=gen, device=device)
        elif name == "model.embed_tokens.weight":
            w = torch.randn(shape, generator=gen, device=device)
        else:
            gain = 3.0 if name == "lm_head.weight" else 1.0
            w = torch.randn(shape, generator=gen, device=device) * (gain / math.sqrt(shape[-1]))
        out[name] = w.to(dtype)
    return out


def load_weights(path: str | Path, cfg: ModelConfig, dtype: torch.dtype, device) -> dict[str, torch.Tensor]:
    """A safetensors file, or a directory of shards, checked against the config's names and shapes."""
    path = Path(path)
    files = sorted(path.glob("*.safetensors")) if path.is_dir() else [path]
    if not files:
        raise ValueError(f"no .safetensors files in {path}")
    tensors: dict[str, torch.Tensor] = {}
    for file in files:
        tensors.update(read_safetensors(file))
    expected = weight_shapes(cfg)
    missing = [n for n in expected if n not in tensors]
    if missing:
        raise ValueError(f"{path}: {len(missing)} tensors missing for model {cfg.name}, e.g. {missing[0]}")
    for name, shape in expected.items():
        if tuple(tensors[name].shape) != shape:
            raise ValueError(f"{path}: {name} has shape {tuple(tensors[name].shape)}, config needs {shape}")
    return {name: tensors[name].to(device=device, dtype=dtype) for name in expected}


def read_safetensors(path: str | Path) -> dict[str, torch.Tensor]:
    """Every tensor of one safetensors file. A file that is not one is refused, naming it and what is
    wrong; nothing is read outside its data section."""
    path = Path(path)

    def bad(why: str) -> ValueError:
        return ValueError(f"{path}: not a safetensors file: {why}")

    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size < 8:
                raise bad(f"{size} bytes, shorter than the 8-byte header length")
            data = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    except OSError as e:
        raise ValueError(f"{path}: cannot read weights: {e.strerror or e}") from None
    (header_len,) = struct.unpack("<Q", data[:8])
    if header_len > size - 8:
        raise bad(f"a header of {header_len} bytes in a file of {size}")
    try:
        header = json.loads(data[8:8 + header_len])
    except ValueError:
        raise bad("the header is not JSON") from None
    if not isinstance(header, dict):
        raise bad("the header is not a table")
    start = 8 + header_len
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        if not isinstance(info, dict) or info.get("dtype") not in _ST_DTYPES:
            raise bad(f"{name}: unsupported dtype {info.get('dtype') if isinstance(info, dict) else info!r}")
        dtype = _ST_DTYPES[info["dtype"]]
        try:
            begin, end = (int(x) for x in info["data_offsets"])
            shape = [int(x) for x in info["shape"]]
        except (KeyError, TypeError, ValueError):
            raise bad(f"{name}: malformed entry {str(info)[:80]}") from None
        if not 0 <= begin <= end <= size - start or end - begin != math.prod(shape) * dtype.itemsize:
            raise bad(f"{name}: data_offsets [{begin}, {end}] do not hold shape {shape} of {info['dtype']} "
                      f"within the file")
        with warnings.catch_warnings():  # the read-only mapping is copied at once: nothing writes to it
            warnings.filterwarnings("ignore", message="The given buffer is not writable")
            raw = torch.frombuffer(data, dtype=torch.uint8, count=end - begin, offset=start + begin) \
                if end > begin else torch.empty(0, dtype=torch.uint8, device="cpu")
        out[name] = raw.view(dtype).reshape(shape).clone()
    return out


def write_safetensors(path: str | Path, tensors: dict[str, torch.Tensor]) -> None:
    names = {v: k for k, v in _ST_DTYPES.items()}
    header, blobs, offset = {}, [], 0
    for name, t in tensors.items():
        blob = t.detach().contiguous().cpu().view(torch.uint8).numpy().tobytes()
        header[name] = {"dtype": names[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)  # data starts 8-byte aligned, as the format recommends
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        for blob in blobs:
            f.write(blob)
