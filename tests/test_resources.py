"""Launch limits: every compiled variant is compared with its target's (shared memory, registers,
threads; LDS and VGPR/SGPR counts on AMD); one over a limit fails warm-up and check (exit 1), an
autotune config over one is reported as pruned; the launch specs pick tiles that fit each target in
the launch's dtype, as their estimates say before compiling and the compiled binaries then prove."""

import contextlib
import dataclasses
import io
import json
import pathlib
import re
import shutil

import pytest
import torch
from tritonwarm.cli import main
from tritonwarm.engine.config import ENGINES
from tritonwarm.engine.plan import engine_plan
from tritonwarm.jit import TARGETS, Target, fake_tensor, trace_call
from tritonwarm.jit.cache import entry_files
from tritonwarm.jit.core.targets import DEVICES, LIMITS, launch_limits
from tritonwarm.jit.core.tile_fit import shared_budget
from tritonwarm.jit.pipeline.compile import compile_variant
from tritonwarm.jit.pipeline.hsaco import amd_kernel_descriptor
from tritonwarm.jit.pipeline.plan import plan
from tritonwarm.jit.pipeline.resources import over_limits, resource_usage
from tritonwarm.jit.pipeline.specs import load_specs
from tritonwarm.jit.pipeline.warmup import warm

HERE = pathlib.Path(__file__).parent
FIXTURES = HERE / "resource_fixtures"
SHIPPED = HERE.parent / "warmup_specs"
DEEPSEEK_V3 = FIXTURES / "deepseek_v3_mla.yaml"
RESOURCE_TARGETS = ("sm80", "sm90", "sm100", "sm120", "gfx942", "gfx950")
# Kernels whose tiles are sized from the data (tile tables, head counts, dtypes): their launch specs
# estimate the shared memory of what they pick, and fit it to the target.
TILED = ("fused_moe_kernel", "fused_moe_nvfp4_kernel", "paged_decode_attention_split_kernel",
         "paged_decode_attention_grid_split_kernel", "quantized_mla_decode_split_kernel")
TILED_LAUNCHERS = (":fused_moe", ":fused_moe_mxfp4", ":fused_moe_nvfp4", ":paged_decode_attention",
                   ":quantized_mla_decode_attention")


def test_every_target_has_limits_with_a_source_and_devices_agree():
    for name, target in TARGETS.items():
        limits = LIMITS[name]
        assert limits.source and limits.threads == 1024
        assert DEVICES[name].max_shared_mem == limits.shared  # what launch specs are told is what is checked
        assert (limits.scalar_registers is None) == target.is_nvidia
    # a target with no row of its own: its compute capability's, or its gfx generation's
    assert launch_limits(Target("sm103", "cuda", 103, 32)).shared == 232448
    assert launch_limits(Target("sm87", "cuda", 87, 32)).shared == 166912
    assert launch_limits(Target("sm121", "cuda", 121, 32)).shared == 101376
    assert launch_limits(Target("gfx1100", "hip", "gfx1100", 32)).shared == 65536


@pytest.mark.parametrize(("target", "usage", "warps", "over"), [
    ("sm90", {"shared": 232448, "registers": 255}, 8, []),  # 256 allocated x 256 threads = 65,536: full, fits
    ("sm90", {"shared": 232449}, 4, ["shared memory"]),
    ("sm90", {"registers": 255}, 16, ["register file"]),
    ("sm90", {"registers": 129}, 16, ["register file"]),  # allocated in 8s: 136 x 512 threads
    ("sm90", {"registers": 128}, 16, []),
    ("sm90", {}, 64, ["threads"]),
    ("sm100", {"tensor_memory": 513}, 4, ["tensor memory"]),
    ("gfx942", {"shared": 65537, "registers": 512, "sgprs": 108}, 4, ["LDS"]),  # one wave per SIMD
    ("gfx942", {"registers": 257}, 8, ["register file"]),  # two waves on a SIMD: 2 x 264 > 512
    ("gfx942", {"registers": 513, "sgprs": 109}, 4, ["VGPRs + AGPRs", "register file", "SGPRs"]),
    ("gfx950", {"shared": 163840}, 16, []),
])
def test_over_limits(target, usage, warps, over):
    assert [e.resource for e in over_limits(TARGETS[target], usage, warps)] == over


def _compile(target_name: str, cache_dir, fn, *args, **kwargs):
    """Trace one call for a target and compile its variants into ``cache_dir``: ``(variant, usage)`` each."""
    target = TARGETS[target_name]
    out = []
    for variant in trace_call(target, fn, *args, **kwargs):
        compile_variant(variant, target, cache_dir)
        out.append((variant, resource_usage(target, entry_files(cache_dir, variant.entry_dir, variant.entry_name))))
    return out


def test_amd_registers_and_lds_are_read_from_the_hsaco(tmp_path):
    """The kernel descriptor in the hsaco's note gives what its assembly says (VGPRs, SGPRs, LDS)."""
    from tritonwarm.launchers import rms_norm

    x, w = fake_tensor((4, 2048), torch.bfloat16), fake_tensor((2048,), torch.bfloat16)
    (variant, usage), = _compile("gfx942", tmp_path, rms_norm, x, w)
    files = entry_files(tmp_path, variant.entry_dir, variant.entry_name)
    assembly = pathlib.Path(files[f"{variant.entry_name}.amdgcn"]).read_text()
    descriptor = amd_kernel_descriptor(files[f"{variant.entry_name}.hsaco"])
    for key in (".vgpr_count", ".sgpr_count", ".group_segment_fixed_size"):
        written = int(re.search(rf"^\s*{re.escape(key)}:\s+(\d+)", assembly, re.M).group(1))
        assert descriptor[key] == written
    assert usage["registers"] == descriptor[".vgpr_count"] > 0 and usage["sgprs"] == descriptor[".sgpr_count"] > 0
    total = int(re.search(r"^; TotalNumVgprs: (\d+)", assembly, re.M).group(1))  # what the compiler counted
    assert usage["registers"] == total
    assert usage["num_warps"] == variant.num_warps and not over_limits(TARGETS["gfx942"], usage)
    assert amd_kernel_descriptor(files[f"{variant.entry_name}.json"]) is None  # not an ELF: nothing, no error



def test_an_amd_lane_holds_what_vgpr_count_says_agprs_included():
    """On CDNA2 and later LLVM's ``.vgpr_count`` is the unified file's whole use: 9 VGPRs and 32 AGPRs
    are 44 (LLVM's own test, agpr-register-count.ll), 512 is the limit itself. Adding ``.agpr_count``
    again refused a Triton 3.6 MLA decode for gfx942 that holds exactly 512."""
    from tritonwarm.jit.pipeline.resources import _amd_usage

    assert _amd_usage({".vgpr_count": 44, ".agpr_count": 32, ".sgpr_count": 20})["registers"] == 44
    full = _amd_usage({".vgpr_count": 512, ".agpr_count": 85, ".sgpr_count": 96})
    assert full["registers"] == 512 and full["agprs"] == 85
    assert not over_limits(TARGETS["gfx942"], {**full, "num_warps": 4, "shared": 0})
    over = over_limits(TARGETS["gfx942"], {**full, "registers": 513, "num_warps": 4, "shared": 0})
    assert over and over[0].resource == "VGPRs + AGPRs" and over[0].need == 513

# ----------------------------------------------------------------------------- the over-limit fixture

FIXTURE_SPEC = f"""
kernel: limit_fixture_kernels:tile_gemm
import_roots: [{FIXTURES}]
description: one GEMM tile of 64 x 128 fp16, K in steps of 128, pipelined over 2 or 6 stages
axes:
  num_stages: [2, 6]
args:
  a: {{tensor: [64, 1024], dtype: float16}}
  b: {{tensor: [1024, 128], dtype: float16}}
  c: {{tensor: [64, 128], dtype: float16}}
  num_stages: $num_stages
---
kernel: limit_fixture_kernels:tuned_gemm
import_roots: [{FIXTURES}]
description: the same GEMM autotuned over a config that fits and one that does not; the winner pinned
config: 0
args:
  a: {{tensor: [64, 1024], dtype: float16}}
  b: {{tensor: [1024, 128], dtype: float16}}
  c: {{tensor: [64, 128], dtype: float16}}
"""


@pytest.fixture(scope="module")
def fixture_cache(tmp_path_factory):
    """The fixture specs warmed for sm90 once: ``(spec file, cache dir, warm-up's exit code, its output)``."""
    folder = tmp_path_factory.mktemp("over-limit")
    spec = folder / "over_limit.yaml"
    spec.write_text(FIXTURE_SPEC)
    cache = folder / "cache"
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(["warmup", str(spec), "--target", "sm90", "--cache-dir", str(cache), "-j", "1"])
    return spec, cache, rc, out.getvalue() + err.getvalue()


def _problem_lines(output: str) -> list[str]:
    """The warm-up's ``problem:`` lines, each read flat (a line longer than the log's width wraps)."""
    problems, in_problem = [], False
    for line in output.splitlines():
        if line.startswith("problem: "):
            problems.append(line)
        elif in_problem and line.startswith("    "):
            problems[-1] += " " + line.strip()
            continue
        in_problem = line.startswith("problem: ")
    return problems


def test_warmup_fails_a_variant_over_the_limit_and_prunes_the_autotune_config(fixture_cache):
    spec, cache, rc, output = fixture_cache
    assert rc == 1
    problems = _problem_lines(output)
    assert len(problems) == 1, output
    line = problems[0]
    # the kernel, the row, what it needs against the limit, what sets it
    assert "tile_gemm_kernel" in line and "over_limit.yaml#1 (num_stages=6)" in line
    assert re.search(r"shared memory 2\d\d,\d\d\d bytes per block > 232,448", line)
    assert "BLOCK_K=128" in line and "num_stages=6" in line and "*fp16" in line
    assert "sm90: 1 autotune config over sm90's launch limits (tuned_gemm_kernel 1): pruned" in output
    assert "4 variants planned from 3 rows" in output and "1 variant failed" in output


def test_check_exits_1_on_a_cached_variant_over_the_limit(fixture_cache, capsys):
    spec, cache, _, _ = fixture_cache
    capsys.readouterr()
    assert main(["check", str(spec), "--target", "sm90", "--cache-dir", str(cache)]) == 1
    out = capsys.readouterr().out
    assert "sm90: PROBLEMS: 4 variants planned from 3 rows, 0 missing, 0 corrupt, 1 over limits" in out
    assert re.search(r"over limits: 1 \(tile_gemm_kernel\): shared memory up to 2\d\d,\d\d\d bytes per block > "
                     r"232,448 on sm90 \(\w+: BLOCK_M=64 BLOCK_N=128 BLOCK_K=128 num_warps=4 num_stages=6", out)
    assert "1 autotune config over sm90's launch limits (tuned_gemm_kernel 1): pruned" in out
    assert main(["check", str(spec), "--target", "sm90", "--cache-dir", str(cache), "--json"]) == 1
    report = json.loads(capsys.readouterr().out)["targets"][0]
    (row,) = report["over_limits"]
    (need,) = row["needs"]
    assert need["resource"] == "shared memory" and need["limit"] == 232448 and need["need"] > 232448
    assert [r["kernel"].rsplit(".", 1)[-1] for r in report["pruned"]] == ["tuned_gemm_kernel"]


def test_check_reads_the_entry_not_only_the_manifest(fixture_cache, capsys):
    """The limit is judged from the entry's own files: a cache whose records say nothing of resources
    (an older warm-up's) is checked the same."""
    from tritonwarm.jit.cache import Manifest

    spec, cache, _, _ = fixture_cache
    manifest = Manifest(cache, "sm90")
    saved = manifest.path.read_text()
    data = json.loads(saved)
    for record in data["variants"].values():
        record.pop("resources", None)
    try:
        manifest.path.write_text(json.dumps(data))
        capsys.readouterr()
        assert main(["check", str(spec), "--target", "sm90", "--cache-dir", str(cache)]) == 1
        assert "1 over limits" in capsys.readouterr().out
    finally:
        manifest.path.write_text(saved)


def test_a_spec_of_the_autotuned_kernel_alone_checks_ok(fixture_cache, tmp_path, capsys):
    spec, cache, _, _ = fixture_cache
    alone = tmp_path / "tuned.yaml"
    alone.write_text(FIXTURE_SPEC.split("---", 1)[1])
    capsys.readouterr()
    assert main(["check", str(alone), "--target", "sm90", "--cache-dir", str(cache)]) == 0
    assert "pruned" in capsys.readouterr().out


def test_a_pinned_autotune_config_over_the_limit_is_a_failure(fixture_cache, tmp_path, capsys):
    """A pinned config is stored as the winner: served without benchmarking, so the GPU's refusal is a
    crash, not a skipped config."""
    spec, cache, _, _ = fixture_cache
    copy = tmp_path / "cache"
    shutil.copytree(cache, copy)
    pinned = tmp_path / "pinned.yaml"
    pinned.write_text(FIXTURE_SPEC.split("---", 1)[1].replace("config: 0", "config: 1"))
    capsys.readouterr()
    assert main(["warmup", str(pinned), "--target", "sm90", "--cache-dir", str(copy), "-j", "1"]) == 1
    err = capsys.readouterr().err
    assert "tuned_gemm_kernel" in err and "over sm90's launch limits" in err and "pruned" not in err


def test_a_kernel_of_another_library_over_the_limit_is_checked_the_same(fixture_cache, tmp_path, capsys):
    """``capture: all`` traces a plain ``kernel[grid](...)`` launch: the same binary, the same verdict."""
    spec, cache, _, _ = fixture_cache
    direct = tmp_path / "direct.yaml"
    direct.write_text(FIXTURE_SPEC.split("---", 1)[0].replace("limit_fixture_kernels:tile_gemm",
                                                              "limit_fixture_kernels:gemm_directly")
                      .replace("import_roots", "capture: all\nimport_roots"))
    capsys.readouterr()
    assert main(["check", str(direct), "--target", "sm90", "--cache-dir", str(cache)]) == 1
    out = capsys.readouterr().out
    assert "2 variants planned from 2 rows, 0 missing" in out and "over limits: 1 (tile_gemm_kernel)" in out


# ----------------------------------------------------------------------------- tiles that fit

def _two_layers(config):
    """An engine config with its dense layers and one MoE layer only: every further layer launches the
    same tiles (the same shapes; on AMD a KV cache tensor over 2 GiB is another binary of them), and
    tracing it takes a fraction of the time."""
    layers = config.model.first_dense_layers + 1
    return dataclasses.replace(config, model=dataclasses.replace(config.model, num_layers=layers))


def _tiles(the_plan) -> set:
    return {(v.kernel, tuple(sorted((k, c) for k, c in v.args.items() if c.startswith("="))), v.num_warps,
             v.num_stages, v.shared_estimate) for v in the_plan.variants.values()}


@pytest.mark.slow
def test_two_layers_of_an_engine_launch_the_tiles_all_its_layers_do():
    lite = ENGINES["deepseek-v2-lite"]
    assert set(engine_plan(_two_layers(lite), "sm90").variants) == set(engine_plan(lite, "sm90").variants)
    assert _tiles(engine_plan(_two_layers(lite), "gfx942")) == _tiles(engine_plan(lite, "gfx942"))


@pytest.mark.parametrize("target_name", RESOURCE_TARGETS)
def test_every_tiled_variant_is_estimated_to_fit_its_target(target_name):
    """Every shipped spec row, DeepSeek-V3's MLA decode rows and both engine configs, traced (nothing
    compiled): each variant of a tiled kernel carries its estimate, and the estimate fits."""
    target = TARGETS[target_name]
    specs = [s for s in load_specs([SHIPPED, DEEPSEEK_V3]) if s.kernel_path.endswith(TILED_LAUNCHERS)]
    assert len(specs) >= 8  # the other specs launch no tiled kernel: nothing to estimate
    plans = [plan(specs, target, verify_collapse=False)]
    plans += [engine_plan(_two_layers(ENGINES[c]), target) for c in ("tiny", "deepseek-v2-lite")]
    assert all(not p.errors for p in plans), [p.errors for p in plans]
    tiled = [v for p in plans for v in p.variants.values() if v.kernel.rsplit(".", 1)[-1] in TILED]
    assert {v.kernel.rsplit(".", 1)[-1] for v in tiled} >= {"fused_moe_kernel", "quantized_mla_decode_split_kernel"}
    assert not [v.variant_id for v in tiled if v.shared_estimate is None]  # each tiled kernel estimates its launch
    budget = shared_budget(target)
    over = [(v.kernel, v.rows[0], v.shared_estimate) for v in tiled if v.shared_estimate > budget]
    assert not over, over
    # fp32 (the tiny engine) and DeepSeek-V3's 128 heads were among them
    assert any("*fp32" in v.args["a_ptr"] for v in tiled if "fused_moe" in v.kernel)
    assert any(v.args.get("HEADS_PER_KV") == "=128" for v in tiled)


def test_the_tiles_that_failed_on_the_h200_are_fitted_for_sm90():
    """The tiny engine's fp32 MoE (its sm90 table was written for 2-byte types) and DeepSeek-V3's
    128-head MLA decode (two 64-row head tiles, three stages) no longer ask for more than sm90 has."""
    tiny = engine_plan(ENGINES["tiny"], TARGETS["sm90"])
    moe = [v for v in tiny.variants.values() if v.kernel.endswith(".fused_moe_kernel")]
    assert moe and all(v.shared_estimate <= shared_budget(TARGETS["sm90"]) for v in moe)
    assert {v.args["BLOCK_K"] for v in moe} <= {"=64", "=128"}  # 256 at fp32 needed 294,912 bytes
    from tritonwarm.launchers.paged_attention import paged_decode_attention

    traced = trace_call(TARGETS["sm90"], paged_decode_attention, *_mla_decode(128))
    split = next(v for v in traced if "split" in v.kernel)
    assert split.args["BLOCK_H"] == "=64" and split.num_stages == 2  # the declared 3 stages needed 294,912


@pytest.mark.parametrize("target_name", RESOURCE_TARGETS)
def test_quantized_mla_splits_count_the_tile_that_is_launched(target_name):
    """The split count is made from the declared tile (the step's metadata knows no q); for bf16 and
    fp16 q, the dtypes that serve, the fit leaves that tile as it is on every target, for DeepSeek's
    geometry and any head count, so the splits count the tiles and head tiles that are launched."""
    from tritonwarm.launchers.kv_cache_formats import QUANTIZED_DS_MLA_FORMATS, kv_format
    from tritonwarm.launchers.mla_kv_quant import _head_tile, fitted_quantized_tile, load_quantized_tiles

    target = TARGETS[target_name]
    table = load_quantized_tiles()
    entry = table.get(f"{target.backend}:{target.arch}") or table.get(target.backend) or table["default"]
    for name in QUANTIZED_DS_MLA_FORMATS:
        tiles = entry[name]
        for num_heads in (16, 40, 128):
            declared = (tiles.num_stages, tiles.block_n, _head_tile(num_heads, tiles))
            assert fitted_quantized_tile(declared, kv_format(name), 2, target) == declared, (name, num_heads)


def _mla_decode(num_heads: int):
    """A DeepSeek MLA decode call's arguments: ``num_heads`` over one 576-wide latent head (value: 512)."""
    q, kv = fake_tensor((4, num_heads, 576), torch.bfloat16), fake_tensor((4096, 64, 1, 576), torch.bfloat16)
    return q, kv, fake_tensor((4, 2560), torch.int32), fake_tensor((4,), torch.int32), 0.07, None, 512


def test_estimates_bound_what_the_compiled_binaries_use(tmp_path):
    """The worst rows, compiled: the compiled metadata fits the target and the estimate covers it (the
    allowance ``shared_budget`` keeps free included)."""
    from tritonwarm.launchers.fused_moe import TileConfig, fitted_moe_tile, fused_moe_gemm_jit, fused_moe_nvfp4_gemm_jit
    from tritonwarm.launchers.paged_attention import paged_decode_attention

    target = TARGETS["sm90"]
    limit = launch_limits(target).shared
    # the tiny engine's largest fp32 MoE tile on sm90 (sm90.json's for 16 to 64 tokens), as the fit leaves it
    config = fitted_moe_tile(TileConfig(16, 128, 128, 1, 4, 3), 4, "dense", target)
    assert config.block_k == 64  # 128 at fp32 needed 278,528 bytes
    a, b, c = (fake_tensor(shape, torch.float32) for shape in ((64, 64), (8, 64, 64), (128, 32)))
    routing = (fake_tensor((128,), torch.float32), fake_tensor((512,), torch.int32), fake_tensor((32,), torch.int32),
               fake_tensor((1,), torch.int32))
    checked = _compile("sm90", tmp_path, fused_moe_gemm_jit, a, b, None, c, *routing, 2, True, False, config)
    checked += [pair for pair in _compile("sm90", tmp_path, paged_decode_attention, *_mla_decode(128))
                if "split" in pair[0].kernel]  # DeepSeek-V3's 128 heads
    # NVFP4 weights, whose decoded tile passes through shared memory (2.6x the pipelined bytes here)
    packed, scales = fake_tensor((8, 64, 32), torch.uint8), fake_tensor((8, 64, 4), torch.uint8)
    checked += _compile("sm90", tmp_path, fused_moe_nvfp4_gemm_jit, a.to(torch.bfloat16), packed, scales,
                        fake_tensor((8,), torch.float32), c.to(torch.bfloat16), *routing, 1, False, True,
                        TileConfig(16, 64, 64, 1, 4, 3))
    assert len(checked) == 3
    for variant, usage in checked:
        assert usage["shared"] <= limit, (variant.kernel, usage)
        assert usage["shared"] <= variant.shared_estimate + (limit - shared_budget(target)), (variant.kernel, usage)
        assert not over_limits(target, usage, variant.num_warps)


@pytest.mark.slow
@pytest.mark.parametrize("target_name", RESOURCE_TARGETS)
def test_every_variant_fits_its_target_as_compiled(tmp_path, target_name):
    """Every shipped spec row, DeepSeek-V3's MLA decode and both engine configs, compiled: 0 variants
    over a limit, and each estimate covers its binary."""
    target = TARGETS[target_name]
    the_plan = plan(load_specs([SHIPPED, DEEPSEEK_V3]), target, verify_collapse=False)
    for config in ("tiny", "deepseek-v2-lite"):
        the_plan.merge(engine_plan(ENGINES[config], target))
    result = warm(the_plan, tmp_path, jobs=2)
    assert not result.over_limits, result.over_limits
    assert result.failed == 0, result.failures
    allowance = launch_limits(target).shared - shared_budget(target)
    from tritonwarm.jit.cache import Manifest

    records = Manifest(tmp_path, target.name).read()
    for variant in the_plan.variants.values():
        usage = records[variant.cache_hash]["resources"] or {}
        if variant.shared_estimate is not None:
            assert usage["shared"] <= variant.shared_estimate + allowance, (variant.kernel, variant.args, usage)


def _largest_shared(cache_dir, target, kernel: str) -> int:
    from tritonwarm.jit.cache import Manifest

    return max(r["resources"]["shared"] for r in Manifest(cache_dir, target).read().values()
               if r["kernel"].endswith(kernel))


@pytest.mark.slow
def test_the_tiny_engine_fits_sm90_and_a_dry_run_refuses_a_variant_over_the_limit(tmp_path, engine_cli, capsys,
                                                                                   monkeypatch):
    """The engine that died on the H200 warms within sm90's limits and serves a dry run; with a limit
    below its largest MoE variant, the same dry run is refused before its first step."""
    the_plan = engine_plan(ENGINES["tiny"], TARGETS["sm90"])
    result = warm(the_plan, tmp_path, jobs=2)
    assert result.failed == 0 and not result.over_limits, result.failures
    largest = _largest_shared(tmp_path, "sm90", ".fused_moe_kernel")
    assert largest <= 232448
    argv = ["engine", "run", "--config", "tiny", "--requests", "2", "--max-tokens", "2", "--dry-run", "--target",
            "sm90", "--jit-policy", "error", "--cache-dir", str(tmp_path)]
    assert engine_cli(argv) == 0
    import tritonwarm.jit.pipeline.check as check_module

    real = check_module.over_limits
    lower = dataclasses.replace(LIMITS["sm90"], shared=largest - 1)
    monkeypatch.setattr(check_module, "over_limits",
                        lambda target, usage, warps=None: real(target, usage, warps) if target.name != "sm90" else
                        _with_limits(real, target, usage, warps, lower, monkeypatch))
    capsys.readouterr()
    assert engine_cli(argv) == 1
    err = capsys.readouterr().err
    assert "engine start refused" in err and "fused_moe_kernel" in err and f"> {largest - 1:,}" in err


def _with_limits(real, target, usage, warps, limits, monkeypatch):
    """``over_limits`` as if ``target``'s row of ``LIMITS`` were ``limits`` (tiles are not re-fitted)."""
    import tritonwarm.jit.pipeline.resources as resources

    with monkeypatch.context() as patch:
        patch.setattr(resources, "launch_limits", lambda t: limits)
        return real(target, usage, warps)
