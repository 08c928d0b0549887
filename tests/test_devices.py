"""Every tensor the library creates follows its input's device.

A tensor made without ``device=`` lands on the CPU, and on a GPU the next op that mixes it with
the input's device fails ("Expected all tensors to be on the same device"). The CPU test suite
cannot see that by running alone, so two checks catch the class of bug: a static one over the
source (every factory call names its device) and a runtime one (the references, run under a
function mode that rejects a factory call made without a device from the library's code).
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest
import torch
from torch.overrides import TorchFunctionMode

PACKAGE = Path(__file__).resolve().parents[1]
FACTORIES = {"tensor", "arange", "zeros", "ones", "full", "empty", "randn", "rand", "randint", "linspace",
             "eye", "empty_strided", "as_tensor"}
CHECKED = ("kernels", "launchers", "engine")


def _factory_calls_without_device(path: Path, root: Path = PACKAGE):
    tree = ast.parse(path.read_text(), str(path))
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in FACTORIES
                and isinstance(node.func.value, ast.Name) and node.func.value.id == "torch"
                and not any(k.arg == "device" for k in node.keywords)):
            yield f"{path.relative_to(root)}:{node.lineno}: torch.{node.func.attr}(...) without device="


def test_every_factory_call_names_its_device():
    problems = [p for folder in CHECKED for path in sorted((PACKAGE / folder).rglob("*.py"))
                for p in _factory_calls_without_device(path)]
    assert not problems, "\n".join(problems)


def test_the_static_check_sees_a_missing_device(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("import torch\nx = torch.zeros(3, dtype=torch.int32)\ny = torch.ones(2, device=x.device)\n")
    assert [p.split(":")[1] for p in _factory_calls_without_device(bad, tmp_path)] == ["2"]


class DeviceFollowsInput(TorchFunctionMode):
    """Rejects a factory call without ``device=`` made directly from the library's own code."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if name in FACTORIES and kwargs.get("device") is None:
            caller = Path(sys._getframe(1).f_code.co_filename).resolve()
            try:
                folder = caller.relative_to(PACKAGE).parts[0]
            except ValueError:  # torch's own code, or a test's
                folder = None
            if folder in CHECKED:
                raise AssertionError(f"{caller.name}:{sys._getframe(1).f_lineno}: torch.{name} without device=")
        return func(*args, **kwargs)


def _reference_calls():
    from tritonwarm.kernels import fp4, mla_metadata, moe_align, moe_routing, paged_attention
    from tritonwarm.launchers.kv_cache import KVCacheLayout

    torch.manual_seed(0)
    x = torch.randn(3, 64)
    yield "mxfp4", lambda: fp4.mxfp4_dequantize_reference(*fp4.mxfp4_quantize_reference(x), torch.float32)
    g = torch.tensor(2.0)
    yield "nvfp4", lambda: fp4.nvfp4_dequantize_reference(*fp4.nvfp4_quantize_reference(x, g), g, torch.float32)
    logits = torch.randn(5, 8)
    yield "routing", lambda: moe_routing.moe_topk_routing_reference(logits, 2, "sigmoid", True, 4, 2, torch.zeros(8))
    ids = torch.randint(0, 4, (5, 2), dtype=torch.int32)
    yield "align", lambda: moe_align.moe_align_block_size_reference(ids, 4, 4)
    lens = torch.tensor([5, 0, 17], dtype=torch.int32)
    yield "metadata", lambda: mla_metadata.mla_decode_metadata_reference(lens, 4, 16, 1)
    layout = KVCacheLayout.gqa(num_blocks=4, block_size=16, num_kv_heads=1, head_dim=16)
    cache = torch.randn(layout.shape)
    tables = torch.arange(6, dtype=torch.int32).view(3, 2) % 4
    q = torch.randn(3, 2, 16)
    yield "attention", lambda: paged_attention.paged_decode_attention_reference(q, cache, tables, lens, 0.25, layout)


@pytest.mark.parametrize("name", [name for name, _ in _reference_calls()])
def test_references_create_tensors_on_the_input_device(name):
    call = dict(_reference_calls())[name]
    with DeviceFollowsInput():
        call()


def test_the_runtime_check_rejects_a_missing_device(monkeypatch):
    from tritonwarm.kernels import moe_align

    def careless(topk_ids, num_experts, block_size):
        return torch.zeros(3)

    careless.__code__ = careless.__code__.replace(co_filename=moe_align.__file__)
    with DeviceFollowsInput(), pytest.raises(AssertionError, match="without device="):
        careless(None, 1, 1)
