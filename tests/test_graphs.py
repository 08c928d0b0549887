"""Decode CUDA graphs: the parts that need no GPU (bucketing, padding, the plan covering every
declared size, config validation), and that a padded decode step computes the same logits."""

import dataclasses

import pytest
import torch
from tritonwarm.engine.config import ENGINES, engine_config_from_dict
from tritonwarm.engine.engine import Engine
from tritonwarm.engine.graphs import graph_size, is_graph_step, pad_step
from tritonwarm.engine.kv import KVCache
from tritonwarm.engine.model import StepInputs
from tritonwarm.engine.plan import engine_plan
from tritonwarm.engine.platform_defaults import capture_sizes
from tritonwarm.engine.scheduler import Request, ScheduledBatch, Sequence
from tritonwarm.jit import TARGETS

TINY = ENGINES["tiny"]


def test_each_decode_batch_takes_the_smallest_size_that_holds_it():
    sizes = (1, 2, 4, 8, 16, 24, 32)
    for n in range(1, 40):
        got = graph_size(n, sizes)
        fitting = [s for s in sizes if s >= n]
        assert got == (min(fitting) if fitting else None)


def _step(seq_lens, tables):
    n = len(seq_lens)
    return StepInputs(
        input_ids=torch.arange(3, 3 + n, dtype=torch.int64),
        positions=torch.tensor([s - 1 for s in seq_lens], dtype=torch.int64),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32),
        block_tables=torch.tensor(tables, dtype=torch.int32),
        sample_rows=torch.arange(n, dtype=torch.int64),
    )


def test_padding_rows_read_token_zero_of_the_scratch_block():
    step = _step([5, 17, 9], [[0, 1, 0, 0, 0, 0, 0, 0], [2, 3, 0, 0, 0, 0, 0, 0], [4, 0, 0, 0, 0, 0, 0, 0]])
    padded = pad_step(step, 4, scratch_block=32)
    assert padded.input_ids.tolist() == [3, 4, 5, 0]
    assert padded.positions.tolist() == [4, 16, 8, 0]
    assert padded.seq_lens.tolist() == [5, 17, 9, 1]
    assert padded.block_tables[:3].equal(step.block_tables) and set(padded.block_tables[3].tolist()) == {32}
    assert padded.sample_rows.tolist() == [0, 1, 2, 3]
    assert pad_step(step, 3, 32).input_ids is step.input_ids  # a full graph needs no copy
    with pytest.raises(ValueError, match="does not fit"):
        pad_step(step, 2, 32)


def test_a_padded_decode_step_gives_the_same_logits():
    engine = Engine(TINY, "triton", "cpu")
    scratch = TINY.num_blocks
    kv = KVCache(dataclasses.replace(TINY, num_blocks=TINY.num_blocks + 1), "cpu")
    torch.manual_seed(0)
    kv.tensor.normal_()
    step = _step([5, 17, 9], [[0, 1] + [0] * 6, [2, 3] + [0] * 6, [4] + [0] * 7])
    want = engine.model.forward(step, kv.layers)
    got = engine.model.forward(pad_step(step, 4, scratch), kv.layers)
    assert got.shape[0] == 4
    torch.testing.assert_close(got[:3], want, atol=1e-4, rtol=1e-4)
    assert got[:3].argmax(-1).equal(want.argmax(-1))


def test_only_pure_decode_steps_replay_a_graph():
    decode = Sequence(Request(0, [1, 2], max_tokens=4), 16)
    decode.tokens.append(7)
    decode.num_computed = 2
    prefill = Sequence(Request(1, [1, 2, 3], max_tokens=4), 16)
    assert is_graph_step(ScheduledBatch(0, [(decode, 1)], []))
    assert not is_graph_step(ScheduledBatch(0, [(decode, 1), (prefill, 3)], []))
    assert not is_graph_step(ScheduledBatch(0, [], []))


def test_the_plan_traces_a_decode_step_of_every_declared_size():
    config = dataclasses.replace(TINY, cuda_graph_batch_sizes=(3,))  # 3: not one of Triton's classes
    rows = set()
    for v in engine_plan(config, "sm90").variants.values():
        rows.update(v.rows)
    assert "engine:tiny decode tokens=3 batch=3" in rows
    sizes = capture_sizes(TINY, TARGETS["sm90"])  # the preset leaves them to the target: 1, 2, 4
    assert sizes == (1, 2, 4) and {f"engine:tiny decode tokens={b} batch={b}" for b in sizes} <= set(
        r for v in engine_plan(TINY, "sm90").variants.values() for r in v.rows)


def test_cpu_and_meta_engines_capture_nothing():
    assert Engine(TINY, "triton", "meta").capture_graphs() == 0
    assert Engine(TINY, "triton", "cpu").graphs is None


@pytest.mark.parametrize("sizes, message", [([0, 2], "must lie in 1..max_batch_size"),
                                            ([1, 99], "must lie in 1..max_batch_size"),
                                            (["a"], "list of integers or null")])
def test_declared_sizes_are_validated(sizes, message):
    with pytest.raises(ValueError, match=message):
        engine_config_from_dict({"preset": "tiny", "cuda_graph_batch_sizes": sizes})


def test_declared_sizes_are_sorted_and_unique():
    config = engine_config_from_dict({"preset": "tiny", "cuda_graph_batch_sizes": [4, 1, 4]})
    assert config.cuda_graph_batch_sizes == (1, 4)
