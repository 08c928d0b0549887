"""The paged KV cache layout (launchers/kv_cache.py) and kv_block_zero on it."""

import pathlib

import pytest
import torch
from tritonwarm.jit import TARGETS, fake_tensor, trace_call
from tritonwarm.jit.pipeline.plan import plan
from tritonwarm.jit.pipeline.specs import load_specs
from tritonwarm.kernels.kv_block_zero import kv_block_zero_reference
from tritonwarm.launchers.kv_block_zero import kv_block_zero
from tritonwarm.launchers.kv_cache import KVCacheLayout

SPEC = pathlib.Path(__file__).parent.parent / "warmup_specs" / "kv_block_zero.yaml"
SMALL_LAYOUTS = {
    "gqa": KVCacheLayout.gqa(num_blocks=12, block_size=16, num_kv_heads=2, head_dim=32),
    "mla": KVCacheLayout.mla(num_blocks=10, block_size=16, kv_lora_rank=64, rope_dim=16),
}


def random_cache(layout, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(layout.shape, generator=g).to(dtype)


# --------------------------------------------------------------------------- layout


def test_gqa_entries_pack_key_then_value():
    layout = KVCacheLayout.gqa(num_blocks=4, block_size=16, num_kv_heads=8, head_dim=128)
    assert layout.shape == (4, 16, 8, 256) and layout.block_numel == 16 * 8 * 256
    cache = torch.arange(layout.block_numel * 4, dtype=torch.float32).view(layout.shape)
    keys, values = layout.keys(cache), layout.values(cache)
    assert keys.shape == values.shape == (4, 16, 8, 128)
    # Views, not copies; key and value of one (block, row, head) are the two halves of its entry.
    assert keys.data_ptr() == cache.data_ptr()
    assert values.data_ptr() == cache.data_ptr() + 128 * cache.element_size()
    torch.testing.assert_close(torch.cat([keys[2, 5, 3], values[2, 5, 3]]), cache[2, 5, 3], rtol=0, atol=0)


def test_mla_value_is_the_latent_part_of_the_key():
    layout = KVCacheLayout.mla(num_blocks=4, block_size=64, kv_lora_rank=512, rope_dim=64)
    assert layout.shape == (4, 64, 1, 576)
    assert (layout.key_dim, layout.value_dim, layout.value_offset) == (576, 512, 0)
    cache = torch.randn(layout.shape)
    assert layout.values(cache).data_ptr() == layout.keys(cache).data_ptr()
    torch.testing.assert_close(layout.values(cache), layout.keys(cache)[..., :512], rtol=0, atol=0)


def test_infer_recovers_both_geometries_and_rejects_others():
    gqa = KVCacheLayout.gqa(3, 16, 2, 32)
    mla = KVCacheLayout.mla(3, 16, 64, 16)
    assert KVCacheLayout.infer(gqa.allocate(torch.float16), 32) == gqa
    assert KVCacheLayout.infer(mla.allocate(torch.float16), 80, 64) == mla
    with pytest.raises(ValueError, match="fits neither"):
        KVCacheLayout.infer(gqa.allocate(torch.float16), 48)
    with pytest.raises(ValueError, match="contiguous"):
        KVCacheLayout.infer(gqa.allocate(torch.float16).transpose(1, 2).contiguous().transpose(1, 2), 32)


def test_write_puts_each_token_at_its_block_table_slot():
    layout = SMALL_LAYOUTS["gqa"]
    cache = layout.allocate(torch.float32, zero=True)
    block_table = torch.tensor([[7, 2, 9], [4, 11, 0]], dtype=torch.int32)
    positions = torch.tensor([0, 17, 33, 15])  # request 0 pos 0, 17, 33; request 1 pos 15
    request_ids = torch.tensor([0, 0, 0, 1])
    g = torch.Generator().manual_seed(0)
    key = torch.randn(4, 2, 32, generator=g)
    value = torch.randn(4, 2, 32, generator=g)
    layout.write(cache, block_table, positions, key, value, request_ids=request_ids)
    expected = torch.zeros(layout.shape)
    for token, (block, row) in enumerate([(7, 0), (2, 1), (9, 1), (4, 15)]):
        expected[block, row, :, :32] = key[token]
        expected[block, row, :, 32:] = value[token]
    torch.testing.assert_close(cache, expected, rtol=0, atol=0)


def test_mla_write_takes_no_separate_value():
    layout = SMALL_LAYOUTS["mla"]
    cache = layout.allocate(torch.float32, zero=True)
    block_table = torch.tensor([[3], [5]], dtype=torch.int32)
    latent = torch.randn(2, 1, 80)
    layout.write(cache, block_table, torch.tensor([4, 0]), latent)  # one token per request
    torch.testing.assert_close(cache[3, 4], latent[0], rtol=0, atol=0)
    torch.testing.assert_close(cache[5, 0], latent[1], rtol=0, atol=0)
    with pytest.raises(ValueError, match="inside the key"):
        layout.write(cache, block_table, torch.tensor([4, 0]), latent, latent[..., :64])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_block_byte_range_is_the_blocks_storage(dtype):
    layout = SMALL_LAYOUTS["mla"]
    cache = layout.allocate(dtype)
    for block in (0, 3, layout.num_blocks - 1):
        start, stop = layout.block_byte_range(block, dtype)
        assert start == cache[block].data_ptr() - cache.data_ptr()
        assert stop - start == cache[block].numel() * cache.element_size()
    with pytest.raises(IndexError):
        layout.block_byte_range(layout.num_blocks, dtype)


# --------------------------------------------------------------------------- kv_block_zero


def zeroed_by_byte_range(cache, layout, block_ids):
    """The expected result built from the layout's byte ranges, independent of the kernel's indexing."""
    expected = cache.clone()
    raw = expected.view(-1).view(torch.uint8)
    for block in block_ids.tolist():
        if block >= 0:
            start, stop = layout.block_byte_range(block, cache.dtype)
            raw[start:stop] = 0
    return expected


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("name", ["gqa", "mla"])
def test_zeroes_exactly_those_blocks(name, dtype):
    layout = SMALL_LAYOUTS[name]
    cache = random_cache(layout, dtype, seed=len(name))
    block_ids = torch.tensor([5, 0, layout.num_blocks - 1, 5], dtype=torch.int32)  # repeats are harmless
    expected = zeroed_by_byte_range(cache, layout, block_ids)
    kv_block_zero(cache, block_ids)
    assert torch.equal(cache.view(-1).view(torch.uint8), expected.view(-1).view(torch.uint8))  # every byte
    torch.testing.assert_close(cache, kv_block_zero_reference(expected, block_ids), rtol=0, atol=0)
    assert (cache[[5, 0, layout.num_blocks - 1]] == 0).all() and (cache[1:5] != 0).any()


def test_negative_ids_are_padding():
    layout = SMALL_LAYOUTS["gqa"]
    cache = random_cache(layout, torch.float32, seed=3)
    block_ids = torch.tensor([-1, 2, -1], dtype=torch.int32)
    expected = zeroed_by_byte_range(cache, layout, torch.tensor([2]))
    kv_block_zero(cache, block_ids)
    torch.testing.assert_close(cache, expected, rtol=0, atol=0)


def test_layer_view_with_larger_block_stride_spares_the_other_layer():
    layout = SMALL_LAYOUTS["mla"]
    # [num_blocks, 2 layers, ...]: each layer's cache is a view whose block stride is two blocks.
    both = torch.randn(layout.num_blocks, 2, *layout.shape[1:])
    layer0, layer1 = both[:, 0], both[:, 1]
    layout.check(layer1)
    before0, before1 = layer0.clone(), layer1.clone()
    block_ids = torch.tensor([1, 8], dtype=torch.int32)
    kv_block_zero(layer1, block_ids)
    torch.testing.assert_close(layer0, before0, rtol=0, atol=0)
    torch.testing.assert_close(layer1, kv_block_zero_reference(before1, block_ids), rtol=0, atol=0)


def test_no_ids_launch_nothing():
    cache = fake_tensor(SMALL_LAYOUTS["gqa"].shape, torch.bfloat16)
    assert trace_call(TARGETS["sm90"], kv_block_zero, cache, fake_tensor((0,), torch.int32)) == []


def test_rejects_wrong_id_dtype():
    with pytest.raises(ValueError, match="int32"):
        kv_block_zero(torch.zeros(2, 4), torch.tensor([0]))


def test_opcheck():
    layout = SMALL_LAYOUTS["gqa"]
    cache = random_cache(layout, torch.float32, seed=4)
    torch.library.opcheck(torch.ops.tritonwarm.kv_block_zero.default, (cache, torch.tensor([3, 1], dtype=torch.int32)))


@pytest.mark.slow
@pytest.mark.parametrize("target", ["sm90", "gfx942"])
def test_compiles_for_both_model_geometries(compile_call, target):
    variants = set()
    for layout in (KVCacheLayout.gqa(4096, 16, 8, 128), KVCacheLayout.mla(4096, 64, 512, 64)):
        cache = fake_tensor(layout.shape, torch.bfloat16)
        [(variant, _)] = compile_call(target, kv_block_zero, cache, fake_tensor((32,), torch.int32))
        assert variant.args["block_stride"] == "i32:div16" and variant.args["BLOCK"] == "=4096"
        variants.add(variant.cache_hash)
    assert len(variants) == 1  # what lets the spec list one geometry only


@pytest.mark.parametrize("target", ["sm90", "gfx942"])
def test_warmup_spec_plans_cleanly(target):
    """Every row launches, the id count never changes the variant: one binary per dtype, bf16, fp16
    and the quantized MLA formats' uint8 (on AMD, two: a cache over 2 GiB is another binary there)."""
    the_plan = plan(load_specs([SPEC]), TARGETS[target])
    assert not (the_plan.unreachable or the_plan.errors or the_plan.collapse_errors or the_plan.redundant)
    assert len(the_plan.variants) == (3 if target == "sm90" else 6)
