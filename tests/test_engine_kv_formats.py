"""The engine with a quantized DS-MLA KV cache (``kv_cache_dtype``): token-identical to its reference
mode with the same quantization on the CPU (interpreter), the config field checked like every other,
warmed and checked through the engine's own plan, and ``engine run``'s KV report."""

import json

import pytest
import torch
from tritonwarm.engine.config import engine_config_from_dict, load_engine_config
from tritonwarm.engine.kv import kv_cache_bytes_per_token, kv_cache_tokens
from tritonwarm.engine.plan import engine_plan
from tritonwarm.engine.runner import serve
from tritonwarm.engine.scheduler import Request
from tritonwarm.launchers.kv_cache_formats import QUANTIZED_DS_MLA_FORMATS

# fp8_ds_mla tiles the latent in 128s: the tiny model with a 128-wide latent (one tile), one layer.
TINY_MODEL = {"preset": "tiny", "kv_lora_rank": 128, "num_layers": 1}
QUANTIZED_KERNELS = {"mla_kv_quantize_write_kernel", "quantized_mla_decode_split_kernel"}
BF16_ATTENTION = {"mla_decode_metadata_kernel", "paged_decode_attention_split_kernel",
                  "paged_decode_attention_grid_split_kernel"}


def _config(kv_cache_dtype, **fields):
    return engine_config_from_dict({"model": TINY_MODEL, "preset": "tiny", "kv_cache_dtype": kv_cache_dtype,
                                    **fields})


def _requests(vocab):
    g = torch.Generator().manual_seed(5)
    # a 37-token prompt is prefilled in two chunks (budget 32) while the other request decodes
    return [Request(i, torch.randint(0, vocab - 1, (n,), generator=g).tolist(), m, (), a)
            for i, (n, a, m) in enumerate([(5, 0, 3), (37, 1, 2)])]


@pytest.mark.parametrize("kv_cache_dtype", QUANTIZED_DS_MLA_FORMATS)
def test_triton_generates_the_same_tokens_as_the_reference_in_each_format(kv_cache_dtype):
    config = _config(kv_cache_dtype)
    requests = _requests(config.model.vocab_size)
    reference = serve(config, requests, mode="reference").result
    triton = serve(config, requests, mode="triton")
    assert triton.result.outputs == reference.outputs and [len(o) for o in reference.outputs] == [3, 2]
    launched = {k.rsplit(".", 1)[-1] for k in triton.monitor.launches}
    assert QUANTIZED_KERNELS <= launched and not launched & BF16_ATTENTION


def test_kv_cache_dtype_is_checked_with_the_config(tmp_path):
    for text, words in [
        ("model: tiny\nkv_cache_dtype: int8", "kv_cache_dtype must be one of auto, fp8_ds_mla, nvfp4_ds_mla, "
                                              "got 'int8'"),
        ("model: tiny\nkv_cache_dtype: fp8_ds_mla", "fp8_ds_mla needs kv_lora_rank a power of two of at least 128, "
                                                    "got 32"),
        ("model: tiny\nkv_cache_dtype: 8", "kv_cache_dtype must be a string, got 8"),
    ]:
        path = tmp_path / "engine.yaml"
        path.write_text(text + "\n")
        with pytest.raises(ValueError) as error:
            load_engine_config(path)
        assert str(error.value) == f"{path}: {words}"
    assert load_engine_config("tiny").kv_cache_dtype == "auto"
    (tmp_path / "ok.yaml").write_text("preset: deepseek-v2-lite\nkv_cache_dtype: nvfp4_ds_mla\n")
    assert load_engine_config(tmp_path / "ok.yaml").kv_cache_dtype == "nvfp4_ds_mla"


def test_bytes_per_token_and_tokens_in_memory():
    lite = {"preset": "deepseek-v2-lite"}
    per_layer = {}
    for kv_cache_dtype in ("auto", *QUANTIZED_DS_MLA_FORMATS):
        config = engine_config_from_dict({**lite, "kv_cache_dtype": kv_cache_dtype})
        per_layer[kv_cache_dtype] = kv_cache_bytes_per_token(config) // config.model.num_layers
        tokens = kv_cache_tokens(config, 80 * 2**30)
        assert tokens % config.block_size == 0
        assert tokens * kv_cache_bytes_per_token(config) <= 80 * 2**30
        assert (tokens + config.block_size) * kv_cache_bytes_per_token(config) > 80 * 2**30
    assert per_layer == {"auto": 1152, "fp8_ds_mla": 656, "nvfp4_ds_mla": 432}


def test_engine_run_reports_kv_bytes_and_tokens(engine_cli, tmp_path, capsys):
    path = tmp_path / "engine.yaml"
    path.write_text(json.dumps({"model": TINY_MODEL, "preset": "tiny", "kv_cache_dtype": "nvfp4_ds_mla"}))
    assert engine_cli(["engine", "run", "--config", str(path), "--requests", "1", "--max-tokens", "1",
                       "--mode", "reference", "--json", "--kv-memory-gib", "0.5"]) == 0
    out = json.loads(capsys.readouterr().out)
    # 128-wide latent as 64 bytes of E2M1 + 8 scale bytes, 16 RoPE dims as 32 bytes, 4 bytes of global
    # scale: 108, padded to 112
    assert out["kv_cache_dtype"] == "nvfp4_ds_mla" and out["kv_bytes_per_token_layer"] == 112
    assert out["kv_cache_tokens"] == 32 * 16 and out["kv_tokens_at_memory"] == 2**29 // (112 * 16) * 16
    assert engine_cli(["engine", "run", "--config", str(path), "--requests", "1", "--max-tokens", "1",
                       "--mode", "reference"]) == 0
    assert "KV cache nvfp4_ds_mla: 112 bytes per token and layer" in capsys.readouterr().out
    with pytest.raises(ValueError, match="--kv-memory-gib -1.0: a size in GiB"):
        engine_cli(["engine", "run", "--kv-memory-gib", "-1"])


@pytest.mark.parametrize("target", ["sm90", "sm100", "gfx942"])
def test_the_warm_up_plan_of_each_format_holds_its_kernels(target):
    for kv_cache_dtype in QUANTIZED_DS_MLA_FORMATS:
        config = engine_config_from_dict({"preset": "deepseek-v2-lite", "kv_cache_dtype": kv_cache_dtype})
        the_plan = engine_plan(config, target)
        assert not the_plan.errors and not the_plan.unreachable
        kernels = {v.kernel.rsplit(".", 1)[-1] for v in the_plan.variants.values()}
        assert QUANTIZED_KERNELS | {"kv_block_zero_kernel", "paged_decode_attention_combine_kernel"} <= kernels
        assert not kernels & BF16_ATTENTION
        formats = {v.args["KV_FORMAT"] for v in the_plan.variants.values() if "KV_FORMAT" in v.args}
        assert len(formats) == 1 and kv_cache_dtype in formats.pop()


@pytest.mark.slow
def test_a_warmed_quantized_engine_serves_with_no_compile(tmp_path):
    """Warm the plan of a fp8_ds_mla engine for sm90, then a dry run under --jit-policy error: nothing missing."""
    from tritonwarm.jit.pipeline.warmup import warm

    config = _config("fp8_ds_mla")
    result = warm(engine_plan(config, "sm90"), tmp_path)
    assert result.failed == 0, result.failures
    report = serve(config, _requests(config.model.vocab_size), mode="triton", policy="error",
                   dry_run_target="sm90", cache_dir=tmp_path)
    assert report.serve_compiles == 0 and not report.startup_missing
