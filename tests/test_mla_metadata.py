"""mla_decode_metadata: the device-side split-KV schedule against its definition."""

import pathlib

import pytest
import torch
from tritonwarm.jit import TARGETS, fake_tensor, trace_call
from tritonwarm.jit.pipeline.plan import plan
from tritonwarm.jit.pipeline.specs import load_specs
from tritonwarm.kernels.mla_metadata import mla_decode_metadata_reference
from tritonwarm.launchers.mla_metadata import mla_decode_metadata, split_overhead_blocks

SPEC = pathlib.Path(__file__).parent.parent / "warmup_specs" / "mla_decode_metadata.yaml"


def schedule_of(seq_lens, block_size, num_parts):
    seq_lens = torch.tensor(seq_lens, dtype=torch.int32)
    got = mla_decode_metadata(seq_lens, 16, block_size, num_parts)
    expected = mla_decode_metadata_reference(seq_lens, num_parts, block_size, split_overhead_blocks(block_size))
    return got, expected


def check_invariants(seq_lens, block_size, schedule, num_splits):
    """What the attention kernels rely on, read off the tensors alone: every block of every request is
    owned by exactly one part, parts own contiguous ascending ranges, and each request's splits are
    numbered 0..k-1 with k = num_splits[r+1] - num_splits[r]."""
    blocks = [-(-n // block_size) for n in seq_lens]
    owners = {}
    splits_seen = {r: [] for r in range(len(seq_lens))}
    previous_end = (0, 0)
    for part, (b_req, b_block, e_req, e_block, b_split) in enumerate(schedule[:, :5].tolist()):
        if e_req < b_req:
            continue  # no work
        assert (b_req, b_block) >= previous_end  # contiguous, in order
        for request in range(b_req, e_req + 1):
            lo = b_block if request == b_req else 0
            hi = e_block if request == e_req else blocks[request]
            assert 0 <= lo < hi <= blocks[request] or (blocks[request] == 0 and request not in (b_req, e_req))
            for block in range(lo, hi):
                assert (request, block) not in owners
                owners[(request, block)] = part
            if hi > lo:
                splits_seen[request].append(b_split if request == b_req else 0)
        previous_end = (e_req, e_block)
    assert set(owners) == {(r, b) for r, n in enumerate(blocks) for b in range(n)}
    counts = torch.diff(num_splits).tolist()
    assert num_splits[0] == 0
    for request, seen in splits_seen.items():
        assert sorted(seen) == list(range(counts[request])), (request, seen)
    assert num_splits[-1] <= len(seq_lens) + schedule.shape[0] - 1 or not seq_lens


CASES = {
    "one_request": ([1000], 16, 8),
    "one_request_one_part": ([37], 64, 1),
    "length_one_requests": ([1, 1, 1, 1, 1], 16, 3),
    "block_boundaries": ([16, 32, 64, 128], 16, 4),
    "more_parts_than_blocks": ([5, 20], 16, 40),
    "zero_length_requests": ([0, 100, 0, 0, 300, 0], 16, 6),
    "all_zero_length": ([0, 0, 0], 64, 4),
    "empty_batch": ([], 64, 4),
    "long_request_many_splits": ([40000, 64, 3], 64, 16),
    "block_size_one": ([3, 500, 1], 1, 5),
}


@pytest.mark.parametrize("name", CASES)
def test_matches_reference_and_invariants(name):
    seq_lens, block_size, num_parts = CASES[name]
    (schedule, num_splits), (ref_schedule, ref_splits) = schedule_of(seq_lens, block_size, num_parts)
    torch.testing.assert_close(schedule, ref_schedule, rtol=0, atol=0)
    torch.testing.assert_close(num_splits, ref_splits, rtol=0, atol=0)
    check_invariants(seq_lens, block_size, schedule, num_splits)


def test_long_request_is_split_and_balanced():
    # 625 + 1 + 1 blocks of 64 tokens, overhead 5 blocks per request: 642 units over 16 parts gives a
    # payload of ceil(642 / 16) + 5 = 46 units; part 0 pays the long request's overhead (41 blocks),
    # the next 12 parts take 46 blocks each, part 13 the rest of it plus both short requests.
    (schedule, num_splits), _ = schedule_of([40000, 64, 3], 64, 16)
    owned = []
    for b_req, b_block, e_req, e_block, _ in schedule[:, :5].tolist():
        owned.append(0 if e_req < b_req else (625 if e_req > 0 else e_block) - b_block)
    assert owned[:13] == [41] + [46] * 12
    assert owned[13] == 625 - 41 - 46 * 12 and schedule[13, 2] == 2
    assert torch.diff(num_splits).tolist() == [14, 1, 1]
    assert (schedule[14:, 2] == -1).all()  # nothing left for the last parts


@pytest.mark.parametrize("seed", range(3))
def test_random_batches_cross_chunk_boundaries(seed):
    # > 64 requests and > 32 parts: the kernel's request chunks and part programs both carry over.
    g = torch.Generator().manual_seed(seed)
    batch = int(torch.randint(65, 200, (1,), generator=g))
    seq_lens = torch.randint(0, 3000, (batch,), generator=g)
    seq_lens[torch.rand(batch, generator=g) < 0.1] = 0
    num_parts = int(torch.randint(33, 140, (1,), generator=g))
    block_size = [16, 64][seed % 2]
    (schedule, num_splits), (ref_schedule, ref_splits) = schedule_of(seq_lens.tolist(), block_size, num_parts)
    torch.testing.assert_close(schedule, ref_schedule, rtol=0, atol=0)
    torch.testing.assert_close(num_splits, ref_splits, rtol=0, atol=0)
    check_invariants(seq_lens.tolist(), block_size, schedule, num_splits)


def test_rejects_bad_arguments():
    with pytest.raises(ValueError, match="int32"):
        mla_decode_metadata(torch.tensor([3]), 16, 64, 4)
    with pytest.raises(ValueError, match="num_sm_parts"):
        mla_decode_metadata(torch.tensor([3], dtype=torch.int32), 16, 64, 0)


def test_opcheck():
    seq_lens = torch.tensor([100, 1, 64, 0], dtype=torch.int32)
    torch.library.opcheck(torch.ops.tritonwarm.mla_decode_metadata.default, (seq_lens, 16, 64, 5))


@pytest.mark.slow
@pytest.mark.parametrize("target", ["sm90", "gfx942"])
def test_compiles(compile_call, target):
    [(variant, _)] = compile_call(target, mla_decode_metadata, fake_tensor((37,), torch.int32), 16, 64, 132)
    assert variant.args["batch"] == "i32" and variant.args["num_parts"] == "i32"  # do_not_specialize


def test_batch_parts_and_block_size_class_share_one_binary():
    keys = set()
    for batch, parts, block_size in [(1, 1, 64), (16, 132, 64), (17, 66, 16), (1000, 16, 32)]:
        [variant] = trace_call(TARGETS["sm90"], mla_decode_metadata, fake_tensor((batch,), torch.int32), 16,
                               block_size, parts)
        keys.add(variant.key)
    assert len(keys) == 1


@pytest.mark.parametrize("target", ["sm90", "gfx942"])
def test_warmup_spec_plans_cleanly(target):
    the_plan = plan(load_specs([SPEC]), TARGETS[target])
    assert not (the_plan.unreachable or the_plan.errors or the_plan.collapse_errors or the_plan.redundant)
    assert len(the_plan.variants) == 1
