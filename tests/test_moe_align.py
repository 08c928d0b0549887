from pathlib import Path

import pytest
import torch
from tritonwarm.jit import TARGETS, capture, class_reps, fake_tensor, trace_call
from tritonwarm.kernels.moe_align import moe_align_block_size_reference
from tritonwarm.launchers import moe_align as align
from tritonwarm.launchers.moe_align import moe_align_block_size
from tritonwarm.launchers.moe_routing import moe_topk_routing

# Each path called directly, whatever the launcher's rule would pick for the size.
PATHS = {
    "single": align.align_single,
    "count_place": align.align_count_place,
    "count_place_small_tiles": lambda f, e, b: align.align_count_place(f, e, b, one_hot=1024, num_warps=4),
    "three_kernels": align.align_three_kernels,
    "expert_scan": align.align_expert_scan,
}


def assert_align_matches(topk_ids, num_experts, block_size, path=None):
    if path is None:
        got = moe_align_block_size(topk_ids, num_experts, block_size)
    else:
        got = PATHS[path](topk_ids.reshape(-1), num_experts, block_size)
    want = moe_align_block_size_reference(topk_ids, num_experts, block_size)
    for name, g, w in zip(("sorted_token_ids", "expert_ids", "num_tokens_post_padded"), got, want, strict=True):
        assert g.dtype == torch.int32, name
        torch.testing.assert_close(g, w, atol=0, rtol=0, msg=lambda m, name=name: f"{name}: {m}")
    return got


def random_ids(num_tokens, top_k, num_experts, seed, dtype=torch.int32, experts_used=None):
    g = torch.Generator().manual_seed(seed)
    pool = torch.arange(num_experts) if experts_used is None else torch.tensor(experts_used)
    return pool[torch.randint(len(pool), (num_tokens, top_k), generator=g)].to(dtype)


def test_hand_computed_example():
    ids = torch.tensor([[1, 0], [1, 2]], dtype=torch.int32)
    sorted_ids, expert_ids, post = moe_align_block_size(ids, 4, 4)
    s = 4  # sentinel: numel
    assert sorted_ids.tolist() == [1, s, s, s, 0, 2, s, s, 3, s, s, s, s, s, s, s]
    assert expert_ids.tolist() == [0, 1, 2, -1]
    assert post.tolist() == [12]


# (num_tokens, top_k, num_experts, block_size): engine geometries; sizes that span several tiles
# (and several scan steps) for each expert count; numel not a multiple of block_size.
@pytest.mark.parametrize("num_tokens, top_k, num_experts, block_size", [
    (1, 6, 64, 16),
    (5, 6, 64, 64),
    (200, 6, 64, 16),
    (3, 2, 8, 16),
    (1500, 2, 8, 64),
    (1, 8, 256, 64),
    (200, 8, 256, 128),
    (7, 4, 60, 32),
    (33, 6, 160, 16),
])
@pytest.mark.parametrize("path", PATHS)
def test_matches_reference(num_tokens, top_k, num_experts, block_size, path):
    ids = random_ids(num_tokens, top_k, num_experts, seed=num_tokens * 31 + num_experts)
    ids.view(-1)[::37] = -1  # dropped slots (another expert-parallel rank) everywhere, tail included
    assert_align_matches(ids, num_experts, block_size, path)


@pytest.mark.parametrize("path", PATHS)
def test_empty_experts_and_all_to_one_expert(path):
    assert_align_matches(random_ids(50, 6, 64, seed=1, experts_used=[3, 17, 63]), 64, 16, path)
    for expert in (0, 255):
        _, expert_ids, post = assert_align_matches(torch.full((40, 8), expert, dtype=torch.int32), 256, 64, path)
        assert post.item() == 320 and expert_ids[:5].tolist() == [expert] * 5 and expert_ids[5] == -1


def test_launcher_switches_path_at_the_declared_sizes():
    # Mixtral geometry (8 experts, top-2): one program up to SINGLE_MAX_NUMEL slots, count -> place
    # beyond; DeepSeek-V3 (256 experts) takes count -> expert scan -> scatter once the count table is large.
    last_single = align.SINGLE_MAX_NUMEL // 2
    assert align.path_token_counts(2, 8, 16384) == [last_single, last_single + 1]
    for tokens, path in [(last_single, "single"), (last_single + 1, "count_place")]:
        assert align.align_path(tokens * 2, 8) == path
        with capture(TARGETS["sm90"]) as cap:
            moe_align_block_size(fake_tensor((tokens, 2), torch.int32), 8, 16)
        assert cap.launches == {"single": 1, "count_place": 2}[path]
        assert_align_matches(random_ids(tokens, 2, 8, seed=tokens), 8, 16)
    assert align.align_path(16384 * 8, 256) == "expert_scan"
    with capture(TARGETS["sm90"]) as cap:
        moe_align_block_size(fake_tensor((16384, 8), torch.int32), 256, 64)
    assert cap.launches == 3
    assert {v[0].rsplit(".", 1)[1] for v in cap.variants} == {
        "moe_align_count_kernel", "moe_align_expert_scan_kernel", "moe_align_segment_scatter_kernel"}


@pytest.mark.parametrize("num_tokens, num_experts, block_size", [(300, 60, 16), (1000, 8, 64), (300, 256, 16)])
def test_expert_scan_over_several_steps_and_slices(monkeypatch, num_tokens, num_experts, block_size):
    # Small scan steps and slices so that a test-sized input spans several steps of every scan
    # program and a last expert slice that is partly empty (60 = 7 * 8 + 4 experts).
    monkeypatch.setattr(align, "SCAN_TILES_PER_STEP", 2)
    monkeypatch.setattr(align, "SCAN_EXPERTS", 8)
    ids = random_ids(num_tokens, 6, num_experts, seed=num_experts, experts_used=range(1, num_experts, 3))
    ids.view(-1)[::29] = -1
    ids.view(-1)[5::41] = num_experts  # out of range: dropped
    tiles = align._tiling(ids.numel(), num_experts)[2]
    assert tiles > 2 * align.SCAN_TILES_PER_STEP
    first = assert_align_matches(ids, num_experts, block_size, "expert_scan")
    again = align.align_expert_scan(ids.reshape(-1), num_experts, block_size)
    assert all(torch.equal(a, b) for a, b in zip(first, again, strict=True))  # deterministic: no atomics


def test_int64_and_strided_ids():
    assert_align_matches(random_ids(20, 8, 256, seed=2, dtype=torch.int64), 256, 32)
    wide = random_ids(20, 8, 64, seed=3)
    assert_align_matches(wide[:, :6], 64, 16)  # row stride 8: flattened with a copy


def test_ids_outside_the_experts_are_dropped():
    ids = torch.tensor([[2, -1], [3, 2], [1, 9]], dtype=torch.int32)  # -1 (another EP rank), 9 >= num_experts
    sorted_ids, expert_ids, post = assert_align_matches(ids, 4, 2)
    s = 6
    assert sorted_ids.tolist() == [4, s, 0, 3, 2, s, s, s, s, s]
    assert expert_ids.tolist() == [1, 2, 3, -1, -1] and post.item() == 6


def test_zero_tokens():
    sorted_ids, expert_ids, post = moe_align_block_size(torch.empty(0, 6, dtype=torch.int32), 64, 16)
    assert sorted_ids.shape == (64 * 15,) and (sorted_ids == 0).all()
    assert (expert_ids == -1).all() and post.item() == 0


def test_feeds_on_router_output():
    logits = torch.randn(9, 64, generator=torch.Generator().manual_seed(4)).bfloat16()
    _, topk_ids = moe_topk_routing(logits, 6)
    assert_align_matches(topk_ids, 64, 16)


def test_runs_on_meta_tensors():
    with capture(TARGETS["sm90"]) as cap:
        sorted_ids, expert_ids, post = moe_align_block_size(fake_tensor((37, 8), torch.int32), 256, 64)
    assert sorted_ids.shape == (37 * 8 + 256 * 63,) and expert_ids.shape == (-(-(37 * 8 + 256 * 63) // 64),)
    assert post.shape == (1,) and cap.launches == 1  # 296 slots: the single-program path


def test_opcheck():
    ids = random_ids(5, 2, 8, seed=5)
    torch.library.opcheck(torch.ops.tritonwarm.moe_align_block_size.default, (ids, 8, 16))


# --------------------------------------------------------------------------- warm-up and compile

# The combinations warmup_specs/moe_align_block_size.yaml declares: (num_experts, top_k).
SPEC_MODELS = [(64, 6), (8, 2), (256, 8)]


def traced_keys(num_experts, top_k, token_counts, block_sizes=(16, 32, 64, 128)):
    keys = set()
    for num_tokens in token_counts:
        for block_size in block_sizes:
            variants = trace_call(TARGETS["sm90"], moe_align_block_size,
                                  fake_tensor((num_tokens, top_k), torch.int32), num_experts, block_size)
            keys |= {(v.kernel, v.key) for v in variants}
    return keys


@pytest.mark.parametrize("num_experts, top_k", SPEC_MODELS)
def test_batch_size_only_picks_the_path(num_experts, top_k):
    # Inside a path neither the token count nor the block size adds a variant: one per kernel.
    edges = align.path_token_counts(top_k, num_experts, 16384)
    keys = traced_keys(num_experts, top_k, [*class_reps(1, 16384).values(), 17, 1000, 16384, *edges])
    paths = {align.align_path(t * top_k, num_experts) for t in (1, 16384, *edges)}
    per_path = {"single": 1, "count_place": 2, "expert_scan": 3}
    assert len(keys) == sum(per_path[p] for p in paths)


def test_spec_file_covers_every_path():
    from tritonwarm.jit.pipeline import specs
    path = Path(__file__).resolve().parents[1] / "warmup_specs" / "moe_align_block_size.yaml"
    variants = {}
    for spec in specs.load_spec_file(path):
        for row in spec.rows():
            args, kwargs = spec.call_arguments(row.values)
            with capture(TARGETS["sm90"]) as cap:
                spec.launcher(*args, **kwargs)
            assert cap.launches in (1, 2, 3), row.label
            model = (args[1] if args else kwargs["num_experts"])
            variants.setdefault(model, set()).update(cap.variants)  # keyed (kernel name, key)
    for num_experts, top_k in SPEC_MODELS:
        edges = align.path_token_counts(top_k, num_experts, 16384)
        assert variants[num_experts] == traced_keys(num_experts, top_k, [1, 16384, *edges]), num_experts


@pytest.mark.slow
@pytest.mark.parametrize("target", ["sm90", "gfx942"])
@pytest.mark.parametrize("num_experts, top_k, num_tokens, kernels", [
    (64, 6, 64, ["single"]),
    (64, 6, 1000, ["count", "place"]),
    (256, 8, 8192, ["count", "expert_scan", "segment_scatter"]),
])
def test_compiles(compile_call, target, num_experts, top_k, num_tokens, kernels):
    compiled = compile_call(target, moe_align_block_size, fake_tensor((num_tokens, top_k), torch.int32),
                            num_experts, 64)
    assert sorted(v.kernel.rsplit(".", 1)[1] for v, _ in compiled) == [f"moe_align_{k}_kernel" for k in kernels]
    assert all(v.args.get("numel", "i32") == "i32" for v, _ in compiled)  # do_not_specialize
