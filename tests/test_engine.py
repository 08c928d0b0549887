"""The serving engine on the CPU: Triton (interpreter) vs reference tokens, the scheduler's
invariants, configs, weights files, metrics and the ``engine run`` command."""

import dataclasses
import json
import os
import re
import struct
from pathlib import Path

import pytest
import torch
from tritonwarm.engine.config import ENGINES, engine_config_from_dict, load_engine_config
from tritonwarm.engine.engine import Engine
from tritonwarm.engine.kv import BlockAllocator, OutOfBlocks
from tritonwarm.engine.runner import make_workload, serve
from tritonwarm.engine.scheduler import Request, Scheduler
from tritonwarm.engine.weights import random_weights, write_safetensors

TINY = ENGINES["tiny"]


def _prompt(seed, length, vocab=TINY.model.vocab_size):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab - 1, (length,), generator=g).tolist()


def test_triton_generates_the_same_tokens_as_the_reference():
    # Different prompt lengths arriving at different steps: a prompt longer than the token budget
    # (37 > 32) is prefilled in two chunks, while other requests decode in the same steps; the
    # fifth request waits for batch room (max_batch_size 4).
    lengths, arrivals, max_tokens = [5, 37, 1, 18, 9], [0, 0, 1, 3, 3], [6, 4, 5, 4, 3]
    requests = [Request(i, _prompt(i, n), m, (TINY.model.vocab_size - 1,), a)
                for i, (n, a, m) in enumerate(zip(lengths, arrivals, max_tokens, strict=True))]
    reference = serve(TINY, requests, mode="reference").result
    triton = serve(TINY, requests, mode="triton")
    assert triton.result.outputs == reference.outputs
    assert [len(o) for o in reference.outputs] == max_tokens
    assert len({t for o in reference.outputs for t in o}) > 10  # real, varied generations
    assert triton.monitor.launches  # it really went through the kernels
    assert triton.result.steps == reference.steps


def test_the_engine_serves_from_the_cache_it_checked(tmp_path, monkeypatch):
    """Triton's runtime reads ``knobs.cache.dir``; the engine checks and monitors ``--cache-dir`` (or
    its default): while it serves, they are one folder, whatever sets ``TRITON_CACHE_DIR`` meanwhile, and
    the process's setting is restored after."""
    from triton import knobs

    seen = []

    def run(self, requests, monitor, sampler=None):
        seen.append(knobs.cache.dir)
        os.environ["TRITON_CACHE_DIR"] = str(tmp_path / "inductor")  # what torch.compile's first kernel does, if unset
        seen.append(knobs.cache.dir)

    monkeypatch.setattr(Engine, "run", run)
    monkeypatch.delenv("TRITON_CACHE_DIR")
    before = knobs.cache.dir
    serve(TINY, [Request(0, _prompt(0, 3), 1, (), 0)], mode="triton", policy="error", cache_dir=tmp_path / "c")
    assert seen == [str((tmp_path / "c").absolute())] * 2
    monkeypatch.delenv("TRITON_CACHE_DIR", raising=False)  # (serving put the environment back already)
    assert knobs.cache.dir == before


def test_triton_generates_the_same_tokens_with_the_grid_split_kernel(monkeypatch):
    """The engine with the grid split kernel declared (as cuda:90 declares it for MLA; the CPU takes
    the default entry, so it is declared here): one metadata per step, the same tokens."""
    from tritonwarm.launchers import paged_attention
    from tritonwarm.launchers._attention_tiles import TileSettings

    grid = TileSettings("grid", block_n=16, num_warps=4, num_stages=1, value_is_key=False, table_ahead=True,
                        parts_per_sm=2)
    monkeypatch.setattr(paged_attention, "settings_for", lambda key_dim: grid)
    requests = [Request(i, _prompt(10 + i, n), m, (), a)
                for i, (n, a, m) in enumerate(zip([5, 37, 1], [0, 0, 1], [4, 3, 4], strict=True))]
    triton = serve(TINY, requests, mode="triton")
    assert triton.result.outputs == serve(TINY, requests, mode="reference").result.outputs
    launched = {k.rsplit(".", 1)[-1] for k in triton.monitor.launches}
    assert "paged_decode_attention_grid_split_kernel" in launched
    assert not launched & {"mla_decode_metadata_kernel", "paged_decode_attention_split_kernel"}


def _check_invariants(scheduler: Scheduler, allocator: BlockAllocator):
    live = [seq for seq in scheduler.running]
    tables = [b for seq in live for b in seq.block_table]
    assert len(tables) == len(set(tables)), "a block is shared by two live requests"
    owners = allocator.owners()
    assert sorted(owners) == sorted(tables)
    for seq in live:
        assert all(owners[b] == seq.request_id for b in seq.block_table)
        assert len(seq.block_table) * scheduler.config.block_size >= seq.num_computed
    for seq in scheduler.waiting:  # waiting (never admitted, or preempted): no KV, no blocks
        assert not seq.block_table and seq.num_computed == 0
    assert allocator.num_free + len(owners) == allocator.num_blocks
    assert len(set(allocator._free)) == allocator.num_free and not set(allocator._free) & set(owners)


def _drive(config, requests, fake_token=lambda seq: 7, admission="preempt"):
    """Run the scheduler with a stand-in model; check the invariants after every step."""
    allocator = BlockAllocator(config.num_blocks)
    scheduler = Scheduler(config, allocator, admission)
    steps, pending = [], sorted(requests, key=lambda r: r.arrival_step)
    step = 0
    while pending or scheduler.has_work:
        assert step < 1000, "no progress"
        while pending and pending[0].arrival_step <= step:
            scheduler.add(pending.pop(0))
        batch = scheduler.schedule(step)
        if batch is not None:
            assert batch.num_tokens <= config.max_num_tokens
            assert len(batch.work) <= config.max_batch_size
            assert len(set(batch.new_blocks)) == len(batch.new_blocks)
            assert all(allocator.owners()[b] in {s.request_id for s, _ in batch.work} for b in batch.new_blocks)
            sampled = {seq.request_id: fake_token(seq) for seq, n in batch.work
                       if seq.num_computed + n == len(seq.tokens)}
            steps.append(([(seq.request_id, n) for seq, n in batch.work],
                          sorted(s.request_id for s in scheduler.waiting)))
            scheduler.update(batch, sampled)
        elif scheduler.running:
            pytest.fail(f"step {step}: requests running and nothing scheduled")
        _check_invariants(scheduler, allocator)
        step += 1
    assert allocator.num_free == config.num_blocks and not allocator.owners()  # every block freed
    return scheduler, steps


def test_reserve_admission_makes_a_request_that_does_not_fit_wait():
    """The rule before preemption (``admission="reserve"``, kept for the benchmark): a request is
    admitted only when its whole length fits beside what running requests may still claim."""
    config = dataclasses.replace(TINY, num_blocks=4, max_num_tokens=16, max_batch_size=4)
    big = Request(0, [1] * 40, 5)  # 44 cached tokens at most: 3 of the 4 blocks
    tiny = Request(1, [1] * 3, 2, arrival_step=1)  # 1 block: fits beside the big one
    small = Request(2, [1] * 20, 4, arrival_step=2)  # 2 blocks: must wait until the big one is done
    scheduler, steps = _drive(config, [big, tiny, small], admission="reserve")
    assert [seq.request_id for seq in scheduler.finished] == [1, 0, 2]
    # The 40-token prompt went in chunks within the 16-token budget, then one token per step.
    assert [n for work, _ in steps for rid, n in work if rid == 0] == [16, 16, 8, 1, 1, 1, 1]
    with_big = [dict(work) for work, _ in steps if 0 in dict(work)]
    assert all(2 not in ids for ids in with_big) and any(1 in ids for ids in with_big)
    assert any(2 in waiting for _, waiting in steps)
    assert all(len(seq.output) == seq.request.max_tokens for seq in scheduler.finished)
    assert scheduler.num_preemptions == 0


def test_under_pressure_the_newest_request_is_preempted_and_recomputed():
    config = dataclasses.replace(TINY, block_size=4, num_blocks=4, max_num_tokens=16, max_batch_size=4)
    allocator = BlockAllocator(config.num_blocks)
    scheduler = Scheduler(config, allocator)
    a, b, c = (scheduler.add(Request(i, [i + 1] * n, 8)) for i, n in enumerate([4, 4, 8]))
    batch = scheduler.schedule(0)  # all three fit now (1 + 1 + 2 blocks): nothing is reserved
    assert [(s.request_id, n) for s, n in batch.work] == [(0, 4), (1, 4), (2, 8)] and allocator.num_free == 0
    scheduler.update(batch, {0: 10, 1: 11, 2: 12})
    c_blocks = list(c.block_table)
    # a's and b's next tokens start new blocks: c, the newest, gives its two back and waits first in line
    batch = scheduler.schedule(1)
    assert [(s.request_id, n) for s, n in batch.work] == [(0, 1), (1, 1)]
    assert sorted(batch.new_blocks) == sorted(c_blocks)
    assert scheduler.running == [a, b] and list(scheduler.waiting) == [c]
    assert c.tokens == [3] * 8 + [12] and c.num_computed == 0 and not c.block_table  # its token kept
    assert (c.num_preemptions, scheduler.num_preemptions) == (1, 1)
    _check_invariants(scheduler, allocator)
    scheduler.update(batch, {0: 10, 1: 11})
    # once the others finish, c comes back and prefills its prompt and its generated token again
    a.request.max_tokens = b.request.max_tokens = 3
    finished = scheduler.update(scheduler.schedule(2), {0: 10, 1: 11})
    assert finished == [a, b] and allocator.num_free == 4
    batch = scheduler.schedule(3)
    assert [(s.request_id, n) for s, n in batch.work] == [(2, 9)] and scheduler.running == [c]


def test_preemption_keeps_the_batch_full_and_every_request_finishes():
    config = dataclasses.replace(TINY, block_size=4, num_blocks=6, max_num_tokens=16, max_batch_size=4)
    requests = [Request(i, [1] * (3 + 2 * i), 9, arrival_step=i // 2) for i in range(6)]
    scheduler, steps = _drive(config, requests)
    assert sorted(seq.request_id for seq in scheduler.finished) == list(range(6))
    assert all(len(seq.output) == 9 for seq in scheduler.finished)
    assert scheduler.num_preemptions > 0
    assert sum(seq.num_preemptions for seq in scheduler.finished) == scheduler.num_preemptions
    _, reserved = _drive(config, requests, admission="reserve")
    assert len(steps) < len(reserved)  # the same work in fewer steps: more requests run at once
    assert max(len(work) for work, _ in steps) > max(len(work) for work, _ in reserved)


def test_a_request_that_cannot_fit_alone_is_an_error_not_a_livelock():
    scheduler = Scheduler(TINY, BlockAllocator(TINY.num_blocks))
    with pytest.raises(ValueError, match="can never fit"):  # refused when added
        scheduler.add(Request(0, [1] * 100, 100))
    # An allocator smaller than the config says (blocks held outside the scheduler): once the request
    # is alone and still short of blocks, scheduling raises instead of preempting it forever.
    config = dataclasses.replace(TINY, max_num_tokens=16, max_batch_size=4)
    scheduler = Scheduler(config, BlockAllocator(2))
    seq = scheduler.add(Request(0, [1] * 40, 2))
    for step in range(2):  # 16 + 16 prompt tokens: two blocks
        scheduler.update(scheduler.schedule(step), {})
    with pytest.raises(OutOfBlocks, match="request 0 alone needs 3 blocks; the allocator has 2"):
        scheduler.schedule(2)
    assert seq.num_preemptions == 0


def _pressure_workload():
    # block_size 4: three requests of 9 to 12 tokens need up to 3 blocks each; 4 blocks hold two at once
    rows = zip([6, 3, 7], [6, 6, 5], [0, 0, 1], strict=True)  # prompt length, max_tokens, arrival step
    return [Request(i, _prompt(i, n), m, (), a) for i, (n, m, a) in enumerate(rows)]


def _preemption_metrics(report) -> dict:
    from prometheus_client.parser import text_string_to_metric_families
    from tritonwarm.engine.metrics import EngineMetrics

    metrics = EngineMetrics()
    metrics.observe(report)
    return {s.name + "".join(f"{{{k}={v}}}" for k, v in s.labels.items()): s.value
            for family in text_string_to_metric_families(metrics.text()) for s in family.samples
            if "preemptions" in s.name}


def test_under_kv_pressure_every_request_finishes_with_the_tokens_of_ample_kv():
    """Recompute is exact: requests preempted (their KV dropped, prompt + generated tokens prefilled
    again on readmission) generate, through the kernels in Triton's interpreter, the tokens they
    generate when the cache holds everything; the metrics count every preemption once."""
    ample = dataclasses.replace(TINY, block_size=4, num_blocks=16, max_model_len=32)
    requests = _pressure_workload()
    roomy = serve(ample, requests, mode="triton")
    pressed = serve(dataclasses.replace(ample, num_blocks=4), requests, mode="triton")
    assert pressed.result.outputs == roomy.result.outputs
    assert [len(o) for o in pressed.result.outputs] == [r.max_tokens for r in requests]
    assert roomy.result.preemptions == 0 < pressed.result.preemptions
    assert pressed.result.steps > roomy.result.steps
    samples = _preemption_metrics(pressed)
    assert samples["tritonwarm_request_preemptions_sum"] == samples["tritonwarm_engine_preemptions_total"] \
        == pressed.result.preemptions
    assert samples["tritonwarm_request_preemptions_count"] == len(requests)
    assert samples["tritonwarm_request_preemptions_bucket{le=0.0}"] == pressed.result.request_preemptions.count(0)
    assert samples["tritonwarm_request_preemptions_bucket{le=+Inf}"] == len(requests)


@pytest.mark.parametrize("num_blocks", [3, 5])
def test_recompute_is_exact_at_every_cache_size(num_blocks):
    ample = dataclasses.replace(TINY, block_size=4, num_blocks=16, max_model_len=32)
    requests = _pressure_workload() + [Request(3, _prompt(3, 8), 5, (), 2), Request(4, _prompt(4, 2), 9, (), 2)]
    want = Engine(ample, "reference", "cpu").run(requests)
    got = Engine(dataclasses.replace(ample, num_blocks=num_blocks), "reference", "cpu").run(requests)
    assert got.outputs == want.outputs and want.preemptions == 0 < got.preemptions
    assert sum(got.request_preemptions) == got.preemptions


def test_stop_token_finishes_early_and_frees_blocks():
    config = dataclasses.replace(TINY, num_blocks=8)
    requests = [Request(0, [1] * 10, 50, stop_token_ids=(9,)), Request(1, [2] * 4, 4)]
    scheduler, _ = _drive(config, requests, fake_token=lambda seq: 9 if len(seq.output) == 2 else 5)
    assert {seq.request_id: seq.output for seq in scheduler.finished} == {0: [5, 5, 9], 1: [5, 5, 9, 5]}


def test_requests_that_can_never_fit_are_refused():
    scheduler = Scheduler(TINY, BlockAllocator(TINY.num_blocks))
    with pytest.raises(ValueError, match="can never fit"):
        scheduler.add(Request(0, [1] * TINY.max_model_len, 1))
    with pytest.raises(OutOfBlocks):
        BlockAllocator(2).allocate(0, 3)
    allocator = BlockAllocator(2)
    blocks = allocator.allocate(0, 1)
    with pytest.raises(RuntimeError, match="does not own"):
        allocator.free(1, blocks)


def test_config_files(tmp_path):
    path = tmp_path / "engine.yaml"
    path.write_text("model: {preset: tiny, num_layers: 1}\nmax_batch_size: 2\ndtype: bfloat16\n")
    config = load_engine_config(path)
    assert config.model.num_layers == 1 and config.model.hidden_size == 64
    assert config.max_batch_size == 2 and config.dtype == torch.bfloat16
    json_path = tmp_path / "engine.json"
    json_path.write_text(json.dumps({"preset": "deepseek-v2-lite", "max_batch_size": 8}))
    assert load_engine_config(json_path).model.kv_lora_rank == 512
    with pytest.raises(ValueError, match="unknown engine field"):
        engine_config_from_dict({"model": "tiny", "max_batch": 3})
    with pytest.raises(ValueError, match="unknown engine config"):
        load_engine_config("no-such-preset")


@pytest.mark.parametrize("text,message", [
    ("model: {preset: tiny, hidden_size: -3}", "model: hidden_size must be a positive integer, got -3"),
    ("model: {preset: tiny, num_shared_experts: -1}", "num_shared_experts must be a non-negative integer"),
    ("model: {hidden_size: 64}", "model: missing field(s) vocab_size"),
    ("model: {preset: tiny, top_k: 9}", "top_k 9 > num_experts 8"),
    # YAML gives whatever was written: each wrong type is named with its field, before anything runs
    ("model: tiny\nmax_batch_size: 2.5", "max_batch_size must be an integer, got 2.5"),
    ("model: tiny\nnum_blocks: 1e30", "num_blocks must be an integer, got '1e30'"),  # a string in YAML 1.1
    ("model: tiny\nmax_model_len: true", "max_model_len must be an integer, got True"),
    ("model: tiny\nseed: x", "seed must be an integer, got 'x'"),
    ("model: tiny\nmoe_tile_configs: 5", "moe_tile_configs must be a string or null, got 5"),
    ("model: {preset: tiny, rms_norm_eps: x}", "model: rms_norm_eps must be a number, got 'x'"),
    ("model: {preset: tiny, rope_is_neox: 3}", "model: rope_is_neox must be true or false, got 3"),
    ("model: {preset: tiny, name: 5}", "model: name must be a string, got 5"),
    ("model: {preset: tiny, num_expert_group: 2.0}", "num_expert_group must be an integer or null, got 2.0"),
    # the router's settings are checked with the model, not at its first launch
    ("model: {preset: tiny, scoring: foo}", "model: scoring must be one of softmax, sigmoid, got 'foo'"),
    ("model: {preset: tiny, num_expert_group: 3}", "num_expert_group=3 must divide num_experts=8"),
    ("model: {preset: tiny, topk_group: null}", "num_expert_group and topk_group go together"),
    # the tile table: a relative path is the config file's neighbour, and a bad one is named now
    ("model: tiny\nmoe_tile_configs: nope.json", "nope.json: cannot read the tile table: No such file"),
    ("model: tiny\nmoe_tile_configs: table.json", "table.json: 1: num_warps 3 must be a power of two"),
    ("x: [", "not an engine config: while parsing"),
])
def test_bad_config_files_name_the_file_and_field(tmp_path, text, message):
    path = tmp_path / "bad.yaml"
    path.write_text(text + "\n")
    (tmp_path / "table.json").write_text(json.dumps({"1": {
        "BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 32, "BLOCK_SIZE_K": 32, "GROUP_SIZE_M": 1, "num_warps": 3,
        "num_stages": 2}}))
    with pytest.raises(ValueError) as error:
        load_engine_config(path)
    assert str(error.value).startswith(f"{path}: ") and message in str(error.value)
    assert "\n" not in str(error.value)


def test_a_relative_tile_table_is_the_config_files_neighbour(tmp_path, monkeypatch):
    table = {"1": {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 32, "BLOCK_SIZE_K": 32, "GROUP_SIZE_M": 1,
                   "num_warps": 4, "num_stages": 2}}
    (tmp_path / "conf").mkdir()
    (tmp_path / "conf" / "tiles.json").write_text(json.dumps(table))
    (tmp_path / "conf" / "engine.yaml").write_text("model: tiny\nmoe_tile_configs: tiles.json\n")
    monkeypatch.chdir(tmp_path)  # not the config's folder
    config = load_engine_config("conf/engine.yaml")
    assert Path(config.moe_tile_configs).resolve() == (tmp_path / "conf" / "tiles.json").resolve()


def test_config_files_that_cannot_be_read_are_named(tmp_path):
    binary = tmp_path / "engine.yaml"
    binary.write_bytes(b"\xff\xfe")
    with pytest.raises(ValueError, match=f"^{binary}: not an engine config: 'utf-8' codec"):
        load_engine_config(binary)
    broken = tmp_path / "engine.json"
    broken.write_text("{")
    with pytest.raises(ValueError, match=f"^{broken}: not an engine config: Expecting"):
        load_engine_config(broken)


def test_weights_load_from_safetensors(tmp_path):
    config = dataclasses.replace(TINY, seed=3)
    write_safetensors(tmp_path / "model.safetensors", random_weights(config.model, torch.float32, "cpu", 3))
    requests = make_workload(config, 3, 3, seed=1, max_prompt=12)
    from_file = Engine(config, "reference", "cpu", weights_path=tmp_path / "model.safetensors").run(requests)
    seeded = Engine(config, "reference", "cpu").run(requests)
    other = Engine(dataclasses.replace(config, seed=4), "reference", "cpu").run(requests)
    assert from_file.outputs == seeded.outputs != other.outputs
    bad = random_weights(config.model, torch.float32, "cpu", 3)
    del bad["lm_head.weight"]
    write_safetensors(tmp_path / "bad.safetensors", bad)
    with pytest.raises(ValueError, match="missing"):
        Engine(config, "reference", "cpu", weights_path=tmp_path / "bad.safetensors")


def _safetensors(header, tail=b""):
    text = json.dumps(header).encode()
    return struct.pack("<Q", len(text)) + text + tail


@pytest.mark.parametrize("data, words", [
    (b"", "0 bytes, shorter than the 8-byte header length"),
    (struct.pack("<Q", 10**12) + b"{}", "a header of 1000000000000 bytes in a file of 10"),
    (struct.pack("<Q", 3) + b"abc", "the header is not JSON"),
    (_safetensors([]), "the header is not a table"),
    (_safetensors({"a": {"dtype": "Q9", "shape": [1], "data_offsets": [0, 4]}}, bytes(4)), "a: unsupported dtype 'Q9'"),
    (_safetensors({"a": {"dtype": "F32", "shape": [1]}}, bytes(4)), "a: malformed entry"),
    (_safetensors({"a": {"dtype": "F32", "shape": [100], "data_offsets": [0, 400]}}, bytes(8)),
     "a: data_offsets [0, 400] do not hold shape [100] of F32 within the file"),
], ids=["empty", "header past the end", "not json", "not a table", "dtype", "no offsets", "data past the end"])
def test_a_file_that_is_not_safetensors_is_named_with_what_is_wrong(tmp_path, data, words):
    from tritonwarm.engine.weights import read_safetensors

    path = tmp_path / "w.safetensors"
    path.write_bytes(data)
    with pytest.raises(ValueError) as e:
        read_safetensors(path)
    assert str(e.value).startswith(f"{path}: not a safetensors file: {words}"), e.value




def test_engine_run_command_json_and_metrics(engine_cli, tmp_path, capsys):
    metrics = tmp_path / "metrics.prom"
    rc = engine_cli(["engine", "run", "--config", "tiny", "--requests", "3", "--max-tokens", "2", "--mode",
                      "reference", "--json", "--metrics", str(metrics)])
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    assert len(out["outputs"]) == 3 and all(len(o) == 2 for o in out["outputs"])
    assert out["serve_compiles"] == 0 and out["generated_tokens"] == 6
    text = metrics.read_text()
    assert "tritonwarm_serve_compiles_total 0.0" in text
    assert "tritonwarm_engine_generated_tokens_total 6.0" in text
    with pytest.raises(ValueError, match="go together"):
        engine_cli(["engine", "run", "--dry-run"])
    with pytest.raises(ValueError, match="needs --mode triton"):
        engine_cli(["engine", "run", "--dry-run", "--target", "sm90", "--mode", "reference", "--jit-policy", "off"])


def test_the_documented_exposition_is_what_engine_run_writes(engine_cli, tmp_path, monkeypatch):
    """docs/scheduling.md shows a run under KV pressure and its preemption metrics: the same command
    writes the same lines (the client's ``_created`` timestamps aside)."""
    page = (Path(__file__).resolve().parent.parent / "docs" / "scheduling.md").read_text()
    command = re.search(r"^tritonwarm (engine run --config pressed.yaml .*)$", page, re.M).group(1).split()
    documented = re.search(r"```text\n(.*?)```", page, re.S).group(1).splitlines()
    (tmp_path / "pressed.yaml").write_text("preset: tiny\nnum_blocks: 4\n")
    monkeypatch.chdir(tmp_path)
    assert engine_cli(command) == 0
    written = [line for line in (tmp_path / "metrics.prom").read_text().splitlines()
               if "preemptions" in line and "_created" not in line]
    assert written == documented


@pytest.mark.parametrize("argv, words", [
    (["--weights", "NOWHERE/w.safetensors"], "--weights NOWHERE/w.safetensors: no such file or directory"),
    (["--dry-run", "--target", "sm90", "--weights", "NOWHERE/w.safetensors"], "no such file or directory"),
    (["--record", "DIR"], "--record DIR: is a directory; name a file"),
    (["--metrics", "FILE/m.prom"], "FILE is not a directory"),
    (["--requests", "99999999999999999999"], "--requests 99999999999999999999: at most 100000"),
])
def test_engine_run_refuses_bad_paths_and_counts_before_serving(engine_cli, tmp_path, monkeypatch, argv, words):
    from tritonwarm.engine import runner

    (tmp_path / "DIR").mkdir()
    (tmp_path / "FILE").write_text("")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(runner, "serve", lambda *a, **k: pytest.fail("served before refusing"))
    with pytest.raises(ValueError) as e:
        engine_cli(["engine", "run", "--mode", "reference", *argv])
    assert words in str(e.value)
