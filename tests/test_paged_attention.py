"""paged_decode_attention: split-KV decode over the paged KV cache, GQA and MLA geometries."""

import math
import pathlib
import tempfile

import pytest
import torch
from tritonwarm.jit import TARGETS, fake_tensor, trace_call
from tritonwarm.jit.cache.layout import entry_files
from tritonwarm.jit.pipeline.plan import plan
from tritonwarm.jit.pipeline.resources import resource_usage
from tritonwarm.jit.pipeline.specs import load_specs
from tritonwarm.kernels.mla_metadata import mla_decode_metadata_reference
from tritonwarm.kernels.paged_attention import paged_decode_attention_reference
from tritonwarm.launchers.kv_cache import KVCacheLayout
from tritonwarm.launchers.mla_metadata import mla_decode_metadata
from tritonwarm.launchers.paged_attention import paged_decode_attention

SPEC = pathlib.Path(__file__).parent.parent / "warmup_specs" / "paged_decode_attention.yaml"
TOL = {torch.float32: 2e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}


def make_inputs(layout, num_heads, seq_lens, dtype, seed, nan_poison=True):
    """Random q and cache; each request gets distinct shuffled blocks. With ``nan_poison``, every cache
    row no request may read (unused blocks, rows past a request's end) holds NaN."""
    g = torch.Generator().manual_seed(seed)
    cache = torch.randn(layout.shape, generator=g).to(dtype)
    blocks_per_request = [-(-n // layout.block_size) for n in seq_lens]
    width = max(blocks_per_request + [1]) + 1  # one spare column: the table is wider than needed
    order = torch.randperm(layout.num_blocks, generator=g)
    block_table = torch.full((len(seq_lens), width), 10**6, dtype=torch.int32)  # junk past the end
    readable = torch.zeros(layout.num_blocks, layout.block_size, dtype=torch.bool)
    used = 0
    for request, (length, n) in enumerate(zip(seq_lens, blocks_per_request, strict=True)):
        block_table[request, :n] = order[used:used + n].to(torch.int32)
        used += n
        for position in range(length):
            readable[block_table[request, position // layout.block_size], position % layout.block_size] = True
    if nan_poison:
        cache[~readable] = float("nan")
    q = torch.randn(len(seq_lens), num_heads, layout.key_dim, generator=g).to(dtype)
    return q, cache, block_table, torch.tensor(seq_lens, dtype=torch.int32)


def check(layout, num_heads, seq_lens, dtype, seed=0, metadata=None, v_head_dim=None, q=None):
    q_, cache, block_table, lens = make_inputs(layout, num_heads, seq_lens, dtype, seed)
    q = q_ if q is None else q
    scale = 1 / math.sqrt(layout.key_dim)
    if callable(metadata):
        metadata = metadata(lens)
    out = paged_decode_attention(q, cache, block_table, lens, scale, metadata, v_head_dim)
    expected = paged_decode_attention_reference(q, cache, block_table, lens, scale, layout)
    assert out.dtype == q.dtype and out.shape == (len(seq_lens), num_heads, layout.value_dim)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, expected, atol=TOL[dtype], rtol=TOL[dtype])
    return out


GQA = KVCacheLayout.gqa(num_blocks=24, block_size=16, num_kv_heads=2, head_dim=32)
MLA = KVCacheLayout.mla(num_blocks=24, block_size=16, kv_lora_rank=64, rope_dim=16)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("heads_per_kv", [1, 3])
def test_gqa_matches_reference(dtype, heads_per_kv):
    # lengths: one token, exactly one block, exactly two blocks, mid-block
    check(GQA, 2 * heads_per_kv, [1, 16, 32, 45], dtype, seed=heads_per_kv)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_mla_matches_reference(dtype):
    check(MLA, 4, [33, 64, 1], dtype, seed=1, v_head_dim=64)


def test_batch_one_seq_len_one():
    check(GQA, 4, [1], torch.float32)
    check(MLA, 2, [1], torch.float32, v_head_dim=64)


def schedule_without_overhead(num_parts, block_size):
    """A valid schedule that splits as much as possible (no per-split cost): many splits per request."""
    def build(seq_lens):
        return mla_decode_metadata_reference(seq_lens, num_parts, block_size, overhead=0)
    return build


@pytest.mark.parametrize("layout,v_head_dim", [(GQA, None), (MLA, 64)], ids=["gqa", "mla"])
def test_many_splits_for_one_long_request(layout, v_head_dim):
    # 7 blocks over 7 parts: one block per part, 7 partials merged.
    metadata = schedule_without_overhead(7, layout.block_size)
    schedule, num_splits = metadata(torch.tensor([100], dtype=torch.int32))
    assert num_splits.tolist() == [0, 7]
    check(layout, 4, [100], torch.float32, seed=2, metadata=metadata, v_head_dim=v_head_dim)


def test_splits_crossing_requests_and_empty_parts():
    # Parts that end mid-request and start the next, plus more parts than blocks (empty parts).
    check(GQA, 4, [40, 1, 70, 16], torch.float32, seed=3, metadata=schedule_without_overhead(5, 16))
    check(GQA, 4, [20, 3], torch.float32, seed=4, metadata=schedule_without_overhead(9, 16))


def test_device_schedule_with_splits():
    # The launcher's own schedule (overhead included) with enough parts that it does split.
    def metadata(lens):
        return mla_decode_metadata(lens, 4, 16, 6)
    schedule, num_splits = metadata(torch.tensor([360, 5], dtype=torch.int32))
    assert num_splits[1] > 1
    check(GQA, 4, [360, 5], torch.bfloat16, seed=5, metadata=metadata)


def test_zero_length_request_gives_zeros_without_nan():
    out = check(GQA, 4, [0, 17, 0], torch.float32, seed=6, metadata=schedule_without_overhead(4, 16))
    assert (out[0] == 0).all() and (out[2] == 0).all()


def test_strided_query_view():
    # q as a view of a fused projection output (row stride > heads * head_dim), as GQA engines pass it.
    g = torch.Generator().manual_seed(7)
    fused = torch.randn(3, 4 * 32 + 2 * 2 * 32, generator=g)
    q = fused[:, : 4 * 32].view(3, 4, 32)
    check(GQA, 4, [5, 30, 16], torch.float32, q=q)


def test_rejects_mismatched_inputs():
    q, cache, block_table, lens = make_inputs(GQA, 4, [5], torch.float32, 0)
    with pytest.raises(ValueError, match="dtype"):
        paged_decode_attention(q.half(), cache, block_table, lens, 0.1)
    with pytest.raises(ValueError, match="kv heads"):
        paged_decode_attention(q[:, :3], cache, block_table, lens, 0.1)
    with pytest.raises(ValueError, match="seq_lens"):
        paged_decode_attention(q, cache, block_table, lens.long(), 0.1)


def test_opcheck():
    q, cache, block_table, lens = make_inputs(MLA, 2, [20, 3], torch.float32, 8, nan_poison=False)
    schedule, num_splits = mla_decode_metadata(lens, 2, MLA.block_size, 3)
    torch.library.opcheck(torch.ops.tritonwarm.paged_decode_attention.default,
                          (q, cache, block_table, lens, 0.125, schedule, num_splits, 64))


# --------------------------------------------------------------------------- measured alternatives
# The value-is-key and table-ahead flags and the schedule-free grid kernel exist to be measured
# against the shipped settings (bench/attention_tiles.py); each must give the same answer.

def run_split_variant(layout, num_heads, seq_lens, dtype, seed, grid_splits=None, **flags):
    """The split + combine kernels with ``flags`` overriding the launch spec's constexprs; with
    ``grid_splits`` the library's grid kernel and launch spec instead, that many splits per request.
    Partial buffers start as NaN: a slot the combine reads but nobody wrote shows up. Returns (out,
    partial_out after the split kernel)."""
    from tritonwarm.jit import Launch
    from tritonwarm.launchers.paged_attention import (
        paged_decode_attention_combine_jit,
        paged_decode_attention_combine_launch,
        paged_decode_attention_grid_split_jit,
        paged_decode_attention_grid_split_launch,
        paged_decode_attention_split_jit,
        paged_decode_attention_split_launch,
    )

    q, cache, block_table, lens = make_inputs(layout, num_heads, seq_lens, dtype, seed)
    scale = 1 / math.sqrt(layout.key_dim)
    batch = len(seq_lens)
    schedule, num_splits = mla_decode_metadata(lens, num_heads, layout.block_size, 3)
    slots = batch * grid_splits if grid_splits else batch + schedule.shape[0]
    partial_out = torch.full((slots, num_heads, layout.value_dim), float("nan"))
    partial_lse = torch.full((slots, num_heads), float("nan"))
    if grid_splits:
        jit = paged_decode_attention_grid_split_jit
        launch = paged_decode_attention_grid_split_launch(q, cache, block_table, lens, grid_splits, partial_out,
                                                          partial_lse, scale, layout.value_dim)
        num_splits = torch.arange(0, (batch + 1) * grid_splits, grid_splits, dtype=torch.int32)
    else:
        jit = paged_decode_attention_split_jit
        launch = paged_decode_attention_split_launch(q, cache, block_table, lens, schedule, num_splits,
                                                     partial_out, partial_lse, scale, layout.value_dim)
    jit.launch(Launch(launch.grid, launch.args, dict(launch.constexprs, **flags), launch.num_warps,
                      launch.num_stages))
    out = torch.full((batch, num_heads, layout.value_dim), float("nan"), dtype=dtype)
    paged_decode_attention_combine_jit.launch(
        paged_decode_attention_combine_launch(partial_out, partial_lse, num_splits, out))
    expected = paged_decode_attention_reference(q, cache, block_table, lens, scale, layout)
    torch.testing.assert_close(out, expected, atol=TOL[dtype], rtol=TOL[dtype])
    return out, partial_out


@pytest.mark.parametrize("table_ahead", [False, True])
def test_mla_value_is_key(table_ahead):
    # MLA's value is the key's first 64 (= BLOCK_D) dims: the key tile doubles as the value tile.
    run_split_variant(MLA, 4, [33, 64, 1], torch.float32, 11, VALUE_IS_KEY=True, TABLE_AHEAD=table_ahead)


@pytest.mark.parametrize("block_n", [16, 32])
def test_table_ahead_gqa(block_n):
    # Block ids read one tile ahead: the last tile's look-ahead runs past the end (masked).
    run_split_variant(GQA, 4, [1, 16, 45, 70], torch.float32, 12, TABLE_AHEAD=True, BLOCK_N=block_n)


@pytest.mark.parametrize("splits", [1, 3, 5])
def test_grid_kernel_with_empty_splits(splits):
    # 5 splits of 45 tokens in 16-token tiles: 3 tiles, so splits past the end write only lse -inf;
    # a zero-length request has only empty splits and gives zeros.
    out, _ = run_split_variant(GQA, 4, [45, 0, 17], torch.float32, 13, grid_splits=splits, BLOCK_N=16,
                               TABLE_AHEAD=splits == 3)
    assert (out[1] == 0).all()
    run_split_variant(MLA, 4, [100, 5], torch.bfloat16, 14, grid_splits=splits, BLOCK_N=16, VALUE_IS_KEY=True)


@pytest.mark.parametrize("table_ahead", [False, True])
@pytest.mark.parametrize("grid_splits", [None, 3], ids=["schedule", "grid"])
def test_tiles_inside_pages(table_ahead, grid_splits):
    """Pages of two 16-token tiles: a tile is consecutive slots of one page (one block id, addresses a
    base plus fixed offsets), the second tile starting mid-page; last tiles partial, pages shuffled,
    every row no request may read NaN."""
    gqa = KVCacheLayout.gqa(num_blocks=16, block_size=32, num_kv_heads=2, head_dim=32)
    mla = KVCacheLayout.mla(num_blocks=16, block_size=32, kv_lora_rank=64, rope_dim=16)
    run_split_variant(gqa, 4, [1, 32, 45, 70, 17], torch.float32, 22, grid_splits=grid_splits, BLOCK_N=16,
                      TABLE_AHEAD=table_ahead)
    run_split_variant(mla, 4, [33, 64, 95], torch.bfloat16, 23, grid_splits=grid_splits, BLOCK_N=16,
                      VALUE_IS_KEY=True, TABLE_AHEAD=table_ahead)


def test_combine_merges_more_splits_than_one_step():
    # 40 splits per request: three combine steps of COMBINE_SPLITS, the last one partly past the
    # request's range; 330 tokens fill 21 of them (one 16-token tile each), 3 tokens fill one.
    from tritonwarm.launchers.paged_attention import COMBINE_SPLITS

    assert 40 > 2 * COMBINE_SPLITS
    run_split_variant(GQA, 4, [330, 3], torch.float32, 21, grid_splits=40, BLOCK_N=16)


def test_empty_splits_leave_their_partial_rows_unwritten_and_unread():
    """Partial rows start as NaN. The grid kernel leaves those of empty splits alone (still NaN after
    it ran), and the combine never lets them into the output (finite and equal to the reference)."""
    out, partial_out = run_split_variant(GQA, 4, [45, 0, 1], torch.float32, 16, grid_splits=4, BLOCK_N=16)
    per_request = partial_out.view(3, 4, *partial_out.shape[1:]).isnan().all(dim=-1).all(dim=-1)
    # 45 tokens = 3 tiles over 4 splits; 0 tokens: all 4 empty; 1 token: one tile, 3 empty splits
    assert per_request.tolist() == [[False, False, False, True], [True] * 4, [False, True, True, True]]
    assert torch.isfinite(out).all()


# --------------------------------------------------------------------------- the grid path, wired

def declare(monkeypatch, kernel, block_n=16, parts_per_sm=4, **fields):
    """Make every geometry class take ``kernel`` with these tiles (the interpreter's target has the
    ``default`` entry, which stays ``schedule`` in the shipped data)."""
    from tritonwarm.launchers import paged_attention
    from tritonwarm.launchers._attention_tiles import TileSettings

    settings = TileSettings(**dict(dict(kernel=kernel, block_n=block_n, num_warps=4, num_stages=1,
                                        value_is_key=False, table_ahead=False, parts_per_sm=parts_per_sm), **fields))
    monkeypatch.setattr(paged_attention, "settings_for", lambda key_dim: settings)
    return settings


def test_split_rule_as_documented():
    from tritonwarm.launchers.paged_attention import grid_splits

    # the H200 cases (132 SMs, MLA: one program per request and split; N64, 2 parts per SM)
    assert grid_splits(64, 1, 2048, 64, 2, 132) == 5  # ceil(264 / 64)
    assert grid_splits(128, 1, 8192, 64, 2, 132) == 3  # ceil(264 / 128)
    assert grid_splits(1, 1, 4096, 64, 2, 132) == 64  # 264 wanted, capped at 4096 / 64 tiles
    # more programs per request (GQA: 8 kv heads) need fewer splits; never fewer than one
    assert grid_splits(4, 8, 1 << 17, 64, 2, 132) == 9
    assert grid_splits(1024, 8, 1 << 17, 64, 2, 132) == 1
    # the cap is the capacity in tiles, rounded up
    assert grid_splits(1, 1, 65, 32, 4, 132) == 3


def test_grid_metadata_depends_on_shapes_only(monkeypatch):
    from tritonwarm.launchers.paged_attention import NOMINAL_SM_COUNT, paged_decode_metadata

    declare(monkeypatch, "grid", block_n=16, parts_per_sm=4)
    lens = torch.tensor([3, 0, 40], dtype=torch.int32)
    for width, splits in ((1, 1), (2, 2), (64, -(-NOMINAL_SM_COUNT * 4 // (3 * 2)))):
        table = torch.zeros(3, width, dtype=torch.int32)
        schedule, num_splits = paged_decode_metadata(lens, table, 4, 2, 32, 16)  # GQA: 2 kv heads, 1 tile
        assert schedule is None
        assert num_splits.tolist() == [r * splits for r in range(4)]
        # the lengths never enter: other lengths, the same metadata
        assert paged_decode_metadata(lens * 0 + 7, table, 4, 2, 32, 16)[1].tolist() == num_splits.tolist()
    declare(monkeypatch, "schedule")
    schedule, num_splits = paged_decode_metadata(lens, table, 4, 2, 32, 16)
    assert schedule is not None and schedule.shape[1] == 8


@pytest.mark.parametrize("parts_per_sm", [1, 16])  # 16: more splits than tiles for every request
@pytest.mark.parametrize("layout,num_heads,v_head_dim", [(GQA, 4, None), (GQA, 6, None), (MLA, 4, 64)],
                         ids=["gqa", "gqa3", "mla"])
def test_grid_path_matches_reference(monkeypatch, layout, num_heads, v_head_dim, parts_per_sm):
    # lengths 0, 1, a page, mid-page, several pages; then batch 1
    declare(monkeypatch, "grid", block_n=16, parts_per_sm=parts_per_sm, table_ahead=parts_per_sm == 1,
            value_is_key=v_head_dim is not None)
    check(layout, num_heads, [0, 1, 16, 45, 70], torch.float32, seed=17, v_head_dim=v_head_dim)
    check(layout, num_heads, [37], torch.bfloat16, seed=18, v_head_dim=v_head_dim)


def test_grid_path_takes_schedule_metadata_too(monkeypatch):
    # A caller's own mla_decode_metadata pair runs the schedule kernel whatever is declared.
    declare(monkeypatch, "grid")
    check(GQA, 4, [40, 1, 70, 16], torch.float32, seed=19, metadata=schedule_without_overhead(5, 16))


def test_grid_path_opcheck(monkeypatch):
    from tritonwarm.launchers.paged_attention import paged_decode_metadata

    declare(monkeypatch, "grid", block_n=16, parts_per_sm=2)
    q, cache, block_table, lens = make_inputs(MLA, 2, [20, 3], torch.float32, 20, nan_poison=False)
    schedule, num_splits = paged_decode_metadata(lens, block_table, 2, 1, MLA.key_dim, MLA.block_size)
    assert schedule is None
    torch.library.opcheck(torch.ops.tritonwarm.paged_decode_attention.default,
                          (q, cache, block_table, lens, 0.125, None, num_splits, 64))


def test_sm90_mla_launches_the_grid_kernel_and_no_schedule():
    """The shipped data: cuda:90 wide is the grid kernel (no schedule kernel launched); GQA and
    every gfx942 geometry stay on the schedule."""
    for target, name, split_kernel in (("sm90", "deepseek_mla", "paged_decode_attention_grid_split_kernel"),
                                       ("sm90", "llama_gqa", "paged_decode_attention_split_kernel"),
                                       ("gfx942", "deepseek_mla", "paged_decode_attention_split_kernel")):
        kernels = {v.kernel.rsplit(".", 1)[1] for v in trace_call(TARGETS[target], paged_decode_attention,
                                                                    *real_call_args(name))}
        expected = {split_kernel, "paged_decode_attention_combine_kernel"}
        if split_kernel == "paged_decode_attention_split_kernel":
            expected.add("mla_decode_metadata_kernel")
        assert kernels == expected, (target, name)


# --------------------------------------------------------------------------- real geometries: compile

REAL = {
    # Llama-3.1-8B: 32 q heads over 8 kv heads, head_dim 128, vLLM's 16-token blocks
    "llama_gqa": (KVCacheLayout.gqa(4096, 16, 8, 128), 32, None),
    # DeepSeek-V2-Lite MLA: 16 heads over one latent head of 512 + 64, FlashMLA's 64-token blocks
    "deepseek_mla": (KVCacheLayout.mla(4096, 64, 512, 64), 16, 512),
}
SHARED_MEMORY_LIMIT = {"sm90": 227 * 1024, "gfx942": 64 * 1024}


def real_call_args(name, batch=8, dtype=torch.bfloat16):
    layout, num_heads, v_head_dim = REAL[name]
    return (fake_tensor((batch, num_heads, layout.key_dim), dtype), fake_tensor(layout.shape, dtype),
            fake_tensor((batch, 2048), torch.int32), fake_tensor((batch,), torch.int32), 0.08, None, v_head_dim)


@pytest.mark.slow
@pytest.mark.parametrize("target", ["sm90", "gfx942"])
@pytest.mark.parametrize("name", REAL)
def test_compiles_real_geometry(compile_call, compile_cache_dir, target, name):
    compiled = {v.kernel.rsplit(".", 1)[1]: (v, c) for v, c in compile_call(target, paged_decode_attention,
                                                                             *real_call_args(name))}
    grid = target == "sm90" and name == "deepseek_mla"  # the declared cuda:90 wide kernel
    split_name = "paged_decode_attention_grid_split_kernel" if grid else "paged_decode_attention_split_kernel"
    assert set(compiled) == {split_name, "paged_decode_attention_combine_kernel"} | (
        set() if grid else {"mla_decode_metadata_kernel"})
    split, binary = compiled[split_name]
    assert binary.metadata.shared <= SHARED_MEMORY_LIMIT[target]
    # what `tritonwarm list` reports: the launch's shared memory (Triton's metadata), not the cubin's
    # static part alone (1 KB on sm90, whatever the stages take)
    usage = resource_usage(TARGETS[target], entry_files(compile_cache_dir, split.entry_dir, split.entry_name))
    assert binary.metadata.shared <= usage["shared"] <= binary.metadata.shared + 1024, usage
    assert usage["registers"] > 0  # read offline: the cubin (cuobjdump), the hsaco's kernel descriptor
    if target == "sm90":
        for kernel_name in (split_name, "paged_decode_attention_combine_kernel"):
            with tempfile.TemporaryDirectory() as tmp:
                cubin = pathlib.Path(tmp) / "kernel.cubin"
                cubin.write_bytes(compiled[kernel_name][1].asm["cubin"])
                usage = resource_usage(TARGETS[target], {cubin.name: str(cubin)})
            if usage is not None:  # cuobjdump ships with Triton's NVIDIA backend
                # No spills. The MLA settings measured fastest on an H200 (3 stages, the key tile as
                # value) keep at most a 16-byte stack frame; anything larger means the settings changed.
                assert usage["local"] == 0 and usage["stack"] <= 16, (kernel_name, usage)


def test_batch_size_never_changes_a_binary():
    for name in REAL:
        keys = {frozenset(v.key for v in trace_call(TARGETS["sm90"], paged_decode_attention,
                                                     *real_call_args(name, batch)))
                for batch in (1, 2, 16, 17, 255)}
        assert len(keys) == 1, name


@pytest.mark.parametrize("target", ["sm90", "gfx942"])
def test_warmup_spec_plans_cleanly(target):
    """Every row launches, collapsed batch sizes never change a variant: per model and dtype one split
    and one combine binary, plus the schedule kernel shared by all."""
    the_plan = plan(load_specs([SPEC]), TARGETS[target])
    assert not (the_plan.unreachable or the_plan.errors or the_plan.collapse_errors or the_plan.redundant)
    # on AMD, a KV cache over 2 GiB is another split binary (buffer ops' pointer range)
    assert len(the_plan.variants) == 2 * 2 * 2 + 1 + (0 if target == "sm90" else 2 * 2)


# --------------------------------------------------------------------------- declared tile data

def test_warmup_target_picks_its_own_tile_entry(monkeypatch):
    """The launch spec reads the target from Triton's active driver: tracing for sm90 takes the
    cuda:90 entry, gfx942 its own, and the same process on CPU tensors the default."""
    from tritonwarm.launchers import _attention_tiles as tiles

    def entry(block_n, stages, ahead):
        return {"kernel": "schedule", "block_n": block_n, "num_warps": 4, "num_stages": stages,
                "value_is_key": False, "table_ahead": ahead, "parts_per_sm": 1}

    table = tiles.parse_tiles({"default": {"wide": entry(32, 1, False), "narrow": entry(64, 2, False)},
                               "cuda:90": {"wide": entry(16, 3, True), "narrow": entry(32, 4, True)},
                               "hip:gfx942": {"wide": entry(32, 1, False), "narrow": entry(128, 1, False)}}, "test")
    monkeypatch.setattr(tiles, "load_tiles", lambda: table)
    expected = {("sm90", "llama_gqa"): ("=32", 4), ("sm90", "deepseek_mla"): ("=16", 3),
                ("gfx942", "llama_gqa"): ("=128", 1), ("gfx942", "deepseek_mla"): ("=32", 1)}
    for (target, name), (block_n, stages) in expected.items():
        split = next(v for v in trace_call(TARGETS[target], paged_decode_attention, *real_call_args(name))
                     if v.kernel.endswith("paged_decode_attention_split_kernel"))
        assert (split.args["BLOCK_N"], split.num_stages) == (block_n, stages), (target, name, split.args)
    # CPU tensors (the interpreter) take the default entry, and the answer is still right
    assert tiles.settings_for(128).block_n == 64
    check(GQA, 4, [45, 3], torch.float32, seed=15)


def test_shipped_tile_data_parses_and_names_bad_fields():
    from tritonwarm.launchers import _attention_tiles as tiles

    table = tiles.load_tiles()
    assert {"default", "cuda:90", "hip:gfx942"} <= set(table)
    good = {"kernel": "schedule", "block_n": 32, "num_warps": 4, "num_stages": 2, "value_is_key": False,
            "table_ahead": False, "parts_per_sm": 1}
    with pytest.raises(ValueError, match=r"cuda:90\.narrow\.block_n: invalid value 48"):
        tiles.parse_tiles({"default": {"wide": good, "narrow": good},
                           "cuda:90": {"wide": good, "narrow": dict(good, block_n=48)}}, "tiles.json")
    with pytest.raises(ValueError, match="default"):
        tiles.parse_tiles({"cuda:90": {"wide": good, "narrow": good}}, "tiles.json")
    with pytest.raises(ValueError, match=r"default\.wide\.kernel: invalid value 'tiles'"):
        tiles.parse_tiles({"default": {"wide": dict(good, kernel="tiles"), "narrow": good}}, "tiles.json")
    assert tiles.parse_tiles({"default": {"wide": dict(good, kernel="grid"), "narrow": good}},
                             "tiles.json")["default"]["wide"].kernel == "grid"


@pytest.mark.parametrize("splits", [None, 3])  # the launcher's own schedule; three parts over the request
@pytest.mark.parametrize("layout, v_head_dim, affected", [(GQA, None, [0, 1]), (MLA, 64, [0, 1, 2, 3])])
def test_a_non_finite_key_makes_its_request_nan_and_no_other(layout, v_head_dim, affected, splits):
    """A NaN in one key of one split: the request's heads that read it are NaN, as the reference says;
    the split is not dropped as an empty one (which would give a finite answer from the others)."""
    q, cache, table, lens = make_inputs(layout, 4, [40, 20], torch.float32, seed=3)
    layout.keys(cache)[int(table[0, 1]), 5, 0, 7] = float("nan")
    metadata = schedule_without_overhead(splits, layout.block_size)(lens) if splits else None
    out = paged_decode_attention(q, cache, table, lens, 0.1, metadata, v_head_dim)
    expected = paged_decode_attention_reference(q, cache, table, lens, 0.1, layout)
    assert expected[0, affected].isnan().all() and out[0, affected].isnan().all()
    fine = [h for h in range(4) if h not in affected]
    torch.testing.assert_close(out[0, fine], expected[0, fine], atol=TOL[torch.float32], rtol=TOL[torch.float32])
    torch.testing.assert_close(out[1], expected[1], atol=TOL[torch.float32], rtol=TOL[torch.float32])
