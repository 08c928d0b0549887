"""The fused MoE expert GEMM in Triton's interpreter against its PyTorch reference; the tile table
as data (selection, errors, the warm-up spec covering every entry); the custom op."""

import dataclasses
import importlib
import json
from pathlib import Path

import pytest
import torch
import yaml
from tritonwarm.jit import TARGETS
from tritonwarm.jit.core.kernel import fake_launches
from tritonwarm.jit.core.specialization import cpu_twin
from tritonwarm.jit.core.targets import target_driver
from tritonwarm.jit.core.trace import Capture
from tritonwarm.jit.pipeline.plan import plan
from tritonwarm.jit.pipeline.specs import load_specs
from tritonwarm.kernels.fused_moe import fused_moe_mxfp4_reference, fused_moe_nvfp4_reference, fused_moe_reference
from tritonwarm.launchers.fp4 import mxfp4_quantize, nvfp4_quantize
from tritonwarm.launchers.fused_moe import (
    CONFIG_DIR,
    TileConfig,
    TileTable,
    active_tile_table,
    fitted_moe_tile,
    fused_moe,
    fused_moe_mxfp4,
    fused_moe_nvfp4,
    load_tile_table,
    target_table_path,
)

SPEC = Path(__file__).parent.parent / "warmup_specs" / "fused_moe.yaml"
SMALL = TileTable((1,), (TileConfig(16, 16, 16, 2, 4, 2),))  # small tiles: several column and K blocks


def moe_inputs(num_tokens, hidden, intermediate, experts, top_k, dtype, seed, ids=None):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(num_tokens, hidden, generator=g).to(dtype)
    w_gate_up = (torch.randn(experts, 2 * intermediate, hidden, generator=g) / hidden**0.5).to(dtype)
    w_down = (torch.randn(experts, hidden, intermediate, generator=g) / intermediate**0.5).to(dtype)
    weights = torch.rand(num_tokens, top_k, generator=g)
    if ids is None:
        ids = torch.stack([torch.randperm(experts, generator=g)[:top_k] for _ in range(num_tokens)]).to(torch.int32)
    return x, w_gate_up, w_down, weights, ids


def assert_matches(inputs, table=SMALL):
    got = fused_moe(*inputs, tile_table=table)
    want = fused_moe_reference(*inputs)
    assert got.shape == want.shape and got.dtype == want.dtype
    if want.dtype == torch.float32:  # the same fp32 products, summed in another order
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    else:
        # the fp32 sums run in another order, so the intermediate activation, rounded to the dtype,
        # can differ by one ulp; carried through the down projection
        torch.testing.assert_close(got.float(), want.float(), atol=2e-2, rtol=2e-2)
    return got


# (tokens, hidden, intermediate, experts, top_k): tokens off the block (16), K and N off their tiles
@pytest.mark.parametrize("shape, dtype, seed", [
    ((1, 32, 16, 4, 1), torch.float32, 0),
    ((5, 48, 24, 8, 2), torch.float32, 1),
    ((19, 32, 40, 6, 3), torch.bfloat16, 2),
    ((33, 64, 32, 8, 2), torch.float32, 3),
])
def test_matches_reference(shape, dtype, seed):
    assert_matches(moe_inputs(*shape, dtype, seed))


def test_random_shapes():
    g = torch.Generator().manual_seed(7)
    for trial in range(3):
        tokens = int(torch.randint(1, 24, (), generator=g))
        hidden = 16 * int(torch.randint(1, 4, (), generator=g))
        inter = 8 * int(torch.randint(1, 6, (), generator=g))
        experts = int(torch.randint(2, 9, (), generator=g))
        top_k = int(torch.randint(1, min(experts, 4) + 1, (), generator=g))
        assert_matches(moe_inputs(tokens, hidden, inter, experts, top_k, torch.float32, 100 + trial))


def test_experts_without_tokens_and_dropped_slots():
    # experts 1, 2 and 4 receive nothing; id -1 (an expert of another rank) contributes nothing
    ids = torch.tensor([[0, 3], [3, -1], [5, 0], [-1, -1], [0, 5]], dtype=torch.int32)
    inputs = moe_inputs(5, 32, 16, 6, 2, torch.float32, 4, ids=ids)
    out = assert_matches(inputs)
    assert torch.count_nonzero(out[3]) == 0


def test_all_tokens_on_one_expert_spans_blocks():
    ids = torch.full((21, 2), 2, dtype=torch.int32)
    ids[:, 1] = 1
    assert_matches(moe_inputs(21, 32, 16, 4, 2, torch.float32, 5, ids=ids))


def test_default_table_runs_at_a_bucket():
    assert_matches(moe_inputs(3, 64, 32, 8, 2, torch.float32, 6), table=load_tile_table())


def test_tile_selection_is_nearest_key():
    table = load_tile_table()
    keys = table.keys
    assert list(keys) == sorted(keys)
    for i, key in enumerate(keys):
        assert table.select(key) is table.configs[i]
    assert table.select(10**6) is table.configs[-1] and table.select(0) is table.configs[0]
    for m in range(1, 5000, 37):
        nearest = min(keys, key=lambda k: (abs(k - m), k))
        assert table.select(m) is table.configs[keys.index(nearest)]
    assert table.bucket_tokens(100) == sorted({min(k, 100) for k in keys})


def _warmed_configs(variants) -> set[TileConfig]:
    return {TileConfig(*(int(v.args[name][1:]) for name in ("BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M")),
                       v.num_warps, v.num_stages) for v in variants}


def test_warmup_spec_names_every_key_of_every_table():
    keys = sorted({key for path in CONFIG_DIR.glob("*.json") for key in load_tile_table(path).keys})
    documents = list(yaml.safe_load_all(SPEC.read_text()))
    assert len(documents) == 3  # bf16, MXFP4 and NVFP4 weights
    for spec in documents:
        assert spec["axes"]["num_tokens"] == keys


@pytest.mark.parametrize("target_name, table_file", [("sm90", "sm90.json"), ("gfx942", "default.json")])
def test_each_target_warms_exactly_its_own_table(target_name, table_file):
    assert target_table_path(target_name).name == table_file
    tables = {fmt: load_tile_table(target_table_path(target_name, fmt)) for fmt in ("bf16", "mxfp4", "nvfp4")}
    the_plan = plan(load_specs([SPEC]), TARGETS[target_name])
    assert not the_plan.errors and not the_plan.unreachable
    gemm = [v for v in the_plan.variants.values() if v.kernel.endswith("fused_moe_kernel")]
    dense = [v for v in gemm if v.args["MXFP4_B"] == "=False"]
    mxfp4 = [v for v in gemm if v.args["MXFP4_B"] == "=True"]
    nvfp4 = [v for v in the_plan.variants.values() if v.kernel.endswith("fused_moe_nvfp4_kernel")]
    target = TARGETS[target_name]

    def fitted(fmt, weight):  # each entry of the format's table as the launcher fits it to the target (bf16)
        return {fitted_moe_tile(c if weight != "mxfp4" or c.block_k >= 32 else dataclasses.replace(c, block_k=32),
                                2, weight, target) for c in tables[fmt].configs}

    if target_name == "gfx942":  # default.json's 4-stage tiles need more than its 64 KB of LDS
        assert fitted("bf16", "dense") != set(tables["bf16"].configs)
    # gate/up and down for each distinct fitted entry of each format's table; NVFP4 on NVIDIA targets only
    formats = (("bf16", "dense", dense), ("mxfp4", "mxfp4", mxfp4))
    for fmt, weight, variants in formats + ((("nvfp4", "nvfp4", nvfp4),) if target.is_nvidia else ()):
        assert _warmed_configs(variants) == fitted(fmt, weight), fmt
        assert len(variants) == 2 * len(fitted(fmt, weight)), fmt
    if not target.is_nvidia:
        assert nvfp4 == []


def test_fp4_formats_read_their_own_table_where_one_was_measured(tmp_path, monkeypatch):
    module = importlib.import_module("tritonwarm.launchers.fused_moe")
    monkeypatch.setattr(module, "CONFIG_DIR", tmp_path)
    monkeypatch.setattr(module, "DEFAULT_CONFIGS", tmp_path / "default.json")
    entry = {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 128, "GROUP_SIZE_M": 1, "num_warps": 4,
             "num_stages": 3}
    for name in ("default", "sm90", "sm90_nvfp4"):
        (tmp_path / f"{name}.json").write_text(json.dumps({"1": entry}))
    assert target_table_path("sm90", "nvfp4").name == "sm90_nvfp4.json"
    assert target_table_path("sm90", "mxfp4").name == "sm90.json"  # none measured: the dense one
    assert target_table_path("sm90").name == "sm90.json"
    assert target_table_path("sm100", "nvfp4").name == "default.json"
    (tmp_path / "sm90_nvfp4.json").write_text(json.dumps({"1": {**entry, "BLOCK_SIZE_N": 128}}))
    load_tile_table.cache_clear()
    with target_driver(TARGETS["sm90"]):
        assert active_tile_table("nvfp4").configs == (TileConfig(16, 128, 128, 1, 4, 3),)
        assert active_tile_table("mxfp4").configs == (TileConfig(16, 64, 128, 1, 4, 3),)


def test_the_active_table_follows_the_driver_target(tmp_path, monkeypatch):
    assert active_tile_table() == load_tile_table()  # no GPU driver here: the interpreter's default
    with target_driver(TARGETS["sm90"]):
        assert active_tile_table() == load_tile_table(CONFIG_DIR / "sm90.json")
    with target_driver(TARGETS["gfx942"]):
        assert active_tile_table() == load_tile_table()
    # a table saved for a target is picked up by the next driver of that target
    monkeypatch.setattr(importlib.import_module("tritonwarm.launchers.fused_moe"), "CONFIG_DIR", tmp_path)
    entry = {"BLOCK_SIZE_M": 32, "BLOCK_SIZE_N": 32, "BLOCK_SIZE_K": 32, "GROUP_SIZE_M": 2, "num_warps": 2,
             "num_stages": 2}
    (tmp_path / "gfx942.json").write_text(json.dumps({"8": entry}))
    with target_driver(TARGETS["gfx942"]):
        assert active_tile_table().configs == (TileConfig(32, 32, 32, 2, 2, 2),)


def _launched_keys(spec, target, args, kwargs) -> set[tuple[str, str]]:
    cap = Capture()
    with fake_launches(cap, target):
        spec.launcher(*args, **kwargs)
    return {(v.kernel, v.key) for v in cap.variants.values() if v.kernel.endswith(("fused_moe_kernel",
                                                                                      "fused_moe_nvfp4_kernel"))}


def test_sm90_warms_the_keys_its_runtime_launches_at_every_bucket():
    """Per row (one M bucket of sm90's table): the keys warm-up traces equal the keys Triton computes
    for real CPU tensors of the same layout under the same driver, and over all rows they are exactly
    the sm90 table's entries (both GEMMs, each weight format)."""
    table = load_tile_table(CONFIG_DIR / "sm90.json")
    assert table != load_tile_table()  # otherwise this would not tell the two tables apart
    target = TARGETS["sm90"]
    warmed_all = set()
    for spec in load_specs([SPEC]):
        per_config = {}
        for row in spec.rows():
            args, kwargs = spec.call_arguments(row.values)
            warmed = _launched_keys(spec, target, args, kwargs)
            assert warmed == _launched_keys(spec, target, cpu_twin(args), cpu_twin(kwargs)), row.label
            assert len(warmed) == 2  # gate/up and down
            per_config.setdefault(table.select(row.values["num_tokens"]), set()).update(warmed)
            warmed_all |= warmed
        assert set(per_config) == set(table.configs)
    assert len(warmed_all) == 3 * 2 * len(set(table.configs))


def mxfp4_inputs(num_tokens, hidden, intermediate, experts, top_k, dtype, seed, ids=None):
    x, w_gate_up, w_down, weights, ids = moe_inputs(num_tokens, hidden, intermediate, experts, top_k,
                                                    torch.float32, seed, ids)
    return (x.to(dtype), *mxfp4_quantize(w_gate_up), *mxfp4_quantize(w_down), weights, ids)


@pytest.mark.parametrize("shape, dtype, seed", [
    ((5, 64, 32, 4, 2), torch.float32, 10),
    ((19, 32, 64, 6, 3), torch.bfloat16, 11),
])
def test_mxfp4_weights_match_the_dequantized_reference(shape, dtype, seed):
    inputs = mxfp4_inputs(*shape, dtype, seed)
    got = fused_moe_mxfp4(*inputs, tile_table=SMALL)  # BLOCK_K 16 is raised to one MX block (32)
    want = fused_moe_mxfp4_reference(*inputs)
    atol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(got.float(), want.float(), atol=atol, rtol=atol)


def test_mxfp4_with_an_expert_without_tokens():
    ids = torch.tensor([[0, 3], [3, -1], [0, 0]], dtype=torch.int32)
    inputs = mxfp4_inputs(3, 64, 32, 5, 2, torch.float32, 12, ids=ids)
    torch.testing.assert_close(fused_moe_mxfp4(*inputs, tile_table=load_tile_table()),
                               fused_moe_mxfp4_reference(*inputs), atol=1e-5, rtol=1e-5)


def test_mxfp4_shapes_are_checked():
    x, gp, gs, dp, ds, w, ids = mxfp4_inputs(2, 64, 32, 2, 1, torch.float32, 13)
    with pytest.raises(ValueError, match="scales must be"):
        fused_moe_mxfp4(x, gp, gs[..., :1], dp, ds, w, ids)
    with pytest.raises(ValueError, match="packed uint8"):
        fused_moe_mxfp4(x, gp.float(), gs, dp, ds, w, ids)


def nvfp4_inputs(num_tokens, hidden, intermediate, experts, top_k, dtype, seed, ids=None):
    """Each expert quantized with its own global scale (448 * 6 / amax), as checkpoints store them."""
    x, w_gate_up, w_down, weights, ids = moe_inputs(num_tokens, hidden, intermediate, experts, top_k,
                                                    torch.float32, seed, ids)

    def quantize(w):
        global_scales = (448.0 * 6.0 / w.abs().amax(dim=(1, 2))).float()
        pairs = [nvfp4_quantize(w[e], global_scales[e]) for e in range(w.shape[0])]
        return torch.stack([p for p, _ in pairs]), torch.stack([s for _, s in pairs]), global_scales

    return (x.to(dtype), *quantize(w_gate_up), *quantize(w_down), weights, ids)


@pytest.mark.parametrize("shape, dtype, seed, table", [
    ((5, 64, 32, 4, 2), torch.float32, 20, SMALL),
    ((19, 32, 48, 6, 3), torch.bfloat16, 21, SMALL),  # intermediate 48: K off a 32-wide tile
    ((7, 64, 32, 8, 2), torch.bfloat16, 22, None),  # the table this machine's runtime picks
])
def test_nvfp4_weights_match_the_dequantized_reference(shape, dtype, seed, table):
    inputs = nvfp4_inputs(*shape, dtype, seed)
    assert not torch.equal(inputs[3][0], inputs[3][1])  # experts have their own global scales
    got = fused_moe_nvfp4(*inputs, tile_table=table)
    want = fused_moe_nvfp4_reference(*inputs)
    atol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(got.float(), want.float(), atol=atol, rtol=atol)


def test_nvfp4_with_dropped_slots_and_idle_experts():
    ids = torch.tensor([[0, 3], [3, -1], [0, 0]], dtype=torch.int32)
    inputs = nvfp4_inputs(3, 64, 32, 5, 2, torch.float32, 23, ids=ids)
    torch.testing.assert_close(fused_moe_nvfp4(*inputs, tile_table=SMALL), fused_moe_nvfp4_reference(*inputs),
                               atol=1e-5, rtol=1e-5)


def test_nvfp4_shapes_are_checked():
    x, gp, gs, gg, dp, ds, dg, w, ids = nvfp4_inputs(2, 64, 32, 2, 1, torch.float32, 24)
    with pytest.raises(ValueError, match="w_gate_up_scales must be"):
        fused_moe_nvfp4(x, gp, gs[..., :1], gg, dp, ds, dg, w, ids)
    with pytest.raises(ValueError, match="w_down_global_scales must be float32"):
        fused_moe_nvfp4(x, gp, gs, gg, dp, ds, dg[:1], w, ids)
    with pytest.raises(ValueError, match="packed uint8"):
        fused_moe_nvfp4(x, gp.float(), gs, gg, dp, ds, dg, w, ids)


@pytest.mark.parametrize("data, message", [
    ({"x": {}}, "key 'x': not a positive integer M"),
    ({"1": {"BLOCK_SIZE_M": 16}}, "missing BLOCK_SIZE_N"),
    ({"1": {"BLOCK_SIZE_M": 8, "BLOCK_SIZE_N": 16, "BLOCK_SIZE_K": 16, "GROUP_SIZE_M": 1, "num_warps": 4,
            "num_stages": 2}}, "block_m 8 must be a power of two"),
    ([], "expected a mapping"),
    ({"1.5": {}}, "key '1.5': not a positive integer M"),
    ({"0": {}}, "key '0': not a positive integer M"),
    ({"²": {}}, "key '²': not a positive integer M"),  # a digit to str.isdigit, not to int()
    ({"1": 3}, "1: expected a mapping of BLOCK_SIZE_M"),
    ({"1": {"BLOCK_SIZE_M": "16", "BLOCK_SIZE_N": 16, "BLOCK_SIZE_K": 16, "GROUP_SIZE_M": 1, "num_warps": 4,
            "num_stages": 2}}, "BLOCK_SIZE_M must be a positive integer, got '16'"),
    ({"1": {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 16, "BLOCK_SIZE_K": 16, "GROUP_SIZE_M": 1, "num_warps": 4,
            "num_stages": 0}}, "num_stages must be a positive integer, got 0"),
    ({"1": {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 16, "BLOCK_SIZE_K": 16, "GROUP_SIZE_M": 1, "num_warps": 6,
            "num_stages": 2}}, "num_warps 6 must be a power of two"),
])
def test_bad_tile_tables_name_file_and_field(tmp_path, data, message):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match=message) as info:
        load_tile_table(path)
    assert str(path) in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize("content, message", [
    (b"{", "not a tile table: Expecting property name"),
    (b"\xff", "not a tile table: 'utf-8' codec"),
    (None, "cannot read the tile table: No such file or directory"),
])
def test_unreadable_tile_tables_name_the_file(tmp_path, content, message):
    path = tmp_path / "bad.json"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(ValueError, match=message) as info:
        load_tile_table(path)
    assert str(info.value).startswith(f"{path}: ")


@pytest.mark.parametrize("path", sorted(CONFIG_DIR.glob("*.json")), ids=lambda p: p.name)
def test_shipped_tables_are_vllm_format(path):
    data = json.loads(path.read_text())
    load_tile_table(path)
    assert all(set(v) == {"BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K", "GROUP_SIZE_M", "num_warps", "num_stages"}
               for v in data.values())


def test_opcheck():
    inputs = moe_inputs(3, 32, 16, 4, 2, torch.float32, 8)
    torch.library.opcheck(torch.ops.tritonwarm.fused_moe.default, inputs)
    torch.library.opcheck(torch.ops.tritonwarm.fused_moe_mxfp4.default, mxfp4_inputs(3, 32, 32, 4, 2, torch.float32, 9))
    nvfp4_op = torch.ops.tritonwarm.fused_moe_nvfp4.default
    x, gp, gs, gg, dp, ds, dg, w, ids = nvfp4_inputs(3, 32, 16, 4, 2, torch.float32, 25)
    torch.library.opcheck(nvfp4_op, (x, gp, gs.view(torch.uint8), gg, dp, ds.view(torch.uint8), dg, w, ids))
    # the schema check compares inputs with allclose, which has no float8 kernel on the CPU
    checks = ("test_autograd_registration", "test_faketensor", "test_aot_dispatch_static", "test_aot_dispatch_dynamic")
    torch.library.opcheck(nvfp4_op, (x, gp, gs, gg, dp, ds, dg, w, ids), test_utils=checks)


def _bf16(bits) -> torch.Tensor:
    return torch.as_tensor(bits, dtype=torch.int32).to(torch.int16).view(torch.bfloat16)


def test_the_bf16_decode_is_exact_for_every_code_and_scale():
    """The arithmetic of the NVIDIA decode (``BF16_BITS``), which Triton's interpreter cannot run (it
    flushes bf16 subnormals): a nibble's bit pattern times the scales built from a scale byte, in
    bf16 with subnormals kept (as NVIDIA's bf16 multiply and torch's CPU bf16 both do), equals the
    dequantized value, for all 16 codes and every scale byte."""
    codes = torch.arange(16, dtype=torch.int32)
    nibble = _bf16(((codes & 8) << 12) | ((codes & 7) << 6))[:, None]  # what _fp4_planes leaves per half
    e2m1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], dtype=torch.float64)[codes & 7]
    e2m1 = torch.where(codes >= 8, -e2m1, e2m1)[:, None]
    # MXFP4: every E8M0 byte, 2**(min(e, 128) - 1) then 2**(max(e, 128) - 128), NaN for 0xFF
    e = torch.arange(256, dtype=torch.int32)
    scale = _bf16((torch.clamp(e, max=128) + 126) << 7)
    scale2 = _bf16(torch.where(e == 255, 0x7FC0, (torch.clamp(e, min=128) - 1) << 7))
    got = nibble * scale[None, :] * scale2[None, :]
    want = (e2m1 * torch.pow(2.0, (e - 127).double())[None, :]).to(torch.bfloat16)
    want[:, 255] = float("nan")
    torch.testing.assert_close(got, want, rtol=0, atol=0, equal_nan=True)
    # NVFP4: every E4M3 byte, its bits in bf16 times 2**119 twice; the tile is e2m1 * e4m3 * 2**-8
    c = torch.arange(256, dtype=torch.int32)
    e4m3 = ((c & 0x80) << 8) | ((c & 0x7F) << 4)
    scale = _bf16(e4m3) * _bf16(246 << 7) * _bf16(246 << 7)
    scale = torch.where((c & 0x7F) == 0x7F, float("nan"), scale.float()).to(torch.bfloat16)
    got = nibble * scale[None, :]
    want = (e2m1 * c.to(torch.uint8).view(torch.float8_e4m3fn).double()[None, :] / 256).to(torch.bfloat16)
    torch.testing.assert_close(got, want, rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("fmt", ["mxfp4", "nvfp4"])
def test_fp4_decode_is_exact_against_dense_weights_on_every_code(fmt):
    """One expert, weights that use every FP4 code under scales 2**-6 .. 2**6 apart; token t is the
    one-hot row t, so each gate/up output is one decoded weight, exact (fp32 activations): what
    differs from the reference is only SiLU's rounding (another formula), far below one FP4 step."""
    g = torch.Generator().manual_seed(30)
    hidden, inter = 32, 32
    magnitudes = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
    values = magnitudes[torch.randint(0, 8, (1, 2 * inter, hidden), generator=g)]
    values = values * torch.where(torch.rand(values.shape, generator=g) < 0.5, -1.0, 1.0)
    block = 32 if fmt == "mxfp4" else 16
    exps = torch.randint(-6, 7, (1, 2 * inter, hidden // block), generator=g).float()
    w_gate_up = values * torch.pow(2.0, exps).repeat_interleave(block, dim=2)
    w_down = torch.randn(1, hidden, inter, generator=g)
    x = torch.zeros(hidden, hidden)
    x[torch.arange(hidden), torch.arange(hidden)] = 1.0  # token t selects column t of each weight row
    ids = torch.zeros(hidden, 1, dtype=torch.int32)
    weights = torch.ones(hidden, 1)
    if fmt == "mxfp4":
        inputs = (x, *mxfp4_quantize(w_gate_up), *mxfp4_quantize(w_down), weights, ids)
        got, want = fused_moe_mxfp4(*inputs, tile_table=SMALL), fused_moe_mxfp4_reference(*inputs)
    else:
        gs = torch.ones(1)
        inputs = (x, *nvfp4_quantize(w_gate_up[0], gs[0]), gs, *nvfp4_quantize(w_down[0], gs[0]), gs, weights, ids)
        inputs = (inputs[0], inputs[1][None], inputs[2][None], inputs[3], inputs[4][None], inputs[5][None],
                  *inputs[6:])
        got, want = fused_moe_nvfp4(*inputs, tile_table=SMALL), fused_moe_nvfp4_reference(*inputs)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=2e-4)


@pytest.mark.parametrize("target_name, triton_3_6, swapped", [
    ("sm90", True, True), ("sm100", False, True), ("sm100", True, False), ("sm103", True, False),
    ("gfx942", True, True)])
def test_fp4_blocks_under_64_rows_swap_except_on_sm100_with_triton_3_6(monkeypatch, target_name, triton_3_6,
                                                                       swapped):
    """Triton 3.6 cannot compile the swapped gated FP4 tile for sm100/sm103 (its pipeliner asserts);
    there the same block runs unswapped, elsewhere it swaps below 64 rows."""
    launcher = importlib.import_module("tritonwarm.launchers.fused_moe")
    monkeypatch.setattr(launcher, "_triton_before", lambda version: triton_3_6 and version == (3, 7))
    packed = torch.zeros(8, 64, 32, dtype=torch.uint8)
    with target_driver(TARGETS[target_name]):
        assert launcher._fp4_constexprs(packed, TileConfig(16, 64, 64, 1, 4, 3))["SWAP"] is swapped
        assert launcher._fp4_constexprs(packed, TileConfig(64, 128, 64, 8, 8, 3))["SWAP"] is False


def test_the_triton_version_is_compared_as_numbers():
    import triton
    from tritonwarm.launchers.fused_moe import _triton_before

    major, minor = (int(p) for p in triton.__version__.split(".")[:2])
    assert _triton_before((major, minor + 1)) and not _triton_before((major, minor))
    assert _triton_before((major, 10)) is (minor < 10)  # 3.10 comes after 3.9
