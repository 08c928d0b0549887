"""Which fused MoE tile table the engine launches with, and that its warm-up plan for a target traces
exactly that table's buckets and tile variants (tracing only: nothing is compiled)."""

import dataclasses
import json
import re

import pytest
from tritonwarm.engine.config import ENGINES
from tritonwarm.engine.model import engine_tile_table, plan_token_counts
from tritonwarm.engine.plan import engine_plan
from tritonwarm.launchers.fused_moe import load_tile_table, target_table_path

LITE = ENGINES["deepseek-v2-lite"]
_TILE_ARGS = ("BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M")


def _fused_tiles(the_plan) -> set[tuple[int, ...]]:
    return {tuple(int(v.args[a].lstrip("=")) for a in _TILE_ARGS)
            for v in the_plan.variants.values() if v.kernel.endswith(".fused_moe_kernel")}


def _expected_tiles(table, max_tokens: int) -> set[tuple[int, ...]]:
    chosen = {table.select(m) for m in range(1, max_tokens + 1)}
    return {(c.block_m, c.block_n, c.block_k, c.group_m) for c in chosen}


def _step_token_counts(the_plan) -> set[int]:
    return {int(re.search(r"tokens=(\d+)", row).group(1)) for v in the_plan.variants.values() for row in v.rows}


@pytest.fixture(scope="module")
def sm90_plan():
    the_plan = engine_plan(LITE, "sm90")
    assert not the_plan.errors and not the_plan.unreachable
    return the_plan


def test_sm90_plan_traces_the_sm90_table(sm90_plan):
    sm90, default = load_tile_table(target_table_path("sm90")), load_tile_table()
    assert target_table_path("sm90").name == "sm90.json" and sm90 != default
    expected = _expected_tiles(sm90, LITE.max_num_tokens)
    assert expected != _expected_tiles(default, LITE.max_num_tokens)  # else this test could not fail
    assert _fused_tiles(sm90_plan) == expected
    # every bucket of sm90's table is a traced step size; default.json's own buckets are not needed
    counts = _step_token_counts(sm90_plan)
    assert set(sm90.bucket_tokens(LITE.max_num_tokens)) <= counts
    assert set(default.bucket_tokens(LITE.max_num_tokens)) - set(sm90.bucket_tokens(LITE.max_num_tokens)) - counts


def test_without_a_driver_the_engine_uses_default_json():
    default = load_tile_table()
    assert engine_tile_table(LITE) is default  # CPU only: Triton's interpreter, no target driver
    assert set(default.bucket_tokens(LITE.max_num_tokens)) <= set(plan_token_counts(LITE))


def test_explicit_moe_tile_configs_win_on_sm90(tmp_path):
    table = {"1": {"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 32, "BLOCK_SIZE_K": 32, "GROUP_SIZE_M": 2,
                   "num_warps": 4, "num_stages": 2}}
    path = tmp_path / "tiles.json"
    path.write_text(json.dumps(table))
    config = dataclasses.replace(LITE, moe_tile_configs=str(path))
    assert engine_tile_table(config) is load_tile_table(str(path))
    the_plan = engine_plan(config, "sm90")
    assert not the_plan.errors
    assert _fused_tiles(the_plan) == {(64, 32, 32, 2)}
