"""No launcher waits for the GPU: every public launcher of ``launchers/__init__.py``, called the way
a decode step calls it (no precomputed metadata), runs its host code with no device-to-host read.

The stand-in for a GPU tensor is a ``meta`` tensor (shapes, dtypes and strides, no data): any read
of its data on the host (``.item()``, ``.tolist()``, ``int()`` / ``bool()`` of a tensor, ``.cpu()``,
``nonzero`` and the like) dispatches an op this test's ``TorchDispatchMode`` refuses, naming it; so
does a tensor the host builds and copies to the device (metadata made on the CPU). Kernel launches
are recorded, not run, under the sm90 target-only driver, so launch specs read the settings a
Hopper GPU gets. Each launcher must launch at least one kernel (the grid kernel's split metadata is
one ``arange``, no kernel): a case that stops early fails.
"""

from __future__ import annotations

import inspect

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from tritonwarm import launchers as L
from tritonwarm.jit import TARGETS, JitKernel, target_driver

DEV = "meta"
aten = torch.ops.aten

# Ops whose result is host data read from a device tensor (each waits for the GPU), or whose output
# shape depends on device data (the same wait, hidden in the op).
SYNCING_OPS = {
    aten._local_scalar_dense.default, aten.equal.default, aten.is_nonzero.default, aten.nonzero.default,
    aten.nonzero_static.default, aten.masked_select.default, aten._unique2.default, aten.unique_consecutive.default,
    aten.unique_dim.default, aten.repeat_interleave.Tensor, aten.allclose.default,
}


class HostSync(AssertionError):
    pass


def _devices(tree) -> set[str]:
    found = set()

    def visit(x):
        if isinstance(x, torch.Tensor):
            found.add(x.device.type)
        elif isinstance(x, (list, tuple)):
            for y in x:
                visit(y)
        elif isinstance(x, dict):
            for y in x.values():
                visit(y)

    visit(tree)
    return found


class RefuseHostSync(TorchDispatchMode):
    """Raises on any op that reads device data on the host or moves data between host and device."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in SYNCING_OPS:
            raise HostSync(f"{func.name()}: the host reads device data (a sync)")
        inputs = _devices((args, kwargs))
        target = kwargs.get("device")
        if target is not None:  # a copy to a device named in the call (.cpu(), .to()): judged before it runs
            self._check(func, inputs - {torch.device(target).type}, {torch.device(target).type})
            return func(*args, **kwargs)
        result = func(*args, **kwargs)
        self._check(func, inputs, _devices(result))
        return result

    @staticmethod
    def _check(func, inputs: set[str], outputs: set[str]) -> None:
        if "cpu" in outputs and DEV in inputs:
            raise HostSync(f"{func.name()}: a device tensor copied to the host (a sync)")
        if DEV in outputs and "cpu" in inputs:
            raise HostSync(f"{func.name()}: a host tensor copied to the device (metadata built on the host)")


def _t(*shape, dtype=torch.bfloat16):
    return torch.empty(shape, dtype=dtype, device=DEV)


def _mla_cache(fmt_name):
    fmt = L.kv_format(fmt_name)
    return _t(64, 64, 1, fmt.entry_bytes, dtype=torch.uint8)


def _moe_weights(num_experts=8, hidden=256, inter=128):
    return _t(num_experts, 2 * inter, hidden), _t(num_experts, hidden, inter)


def _cases():
    """name -> a call of that launcher at batch 1 (decode) or a small step, as the engine calls it."""
    mla = L.KVCacheLayout.mla(64, 64, 512, 64)
    gqa = L.KVCacheLayout.gqa(64, 16, 8, 128)
    i32 = torch.int32
    w_gate_up, w_down = _moe_weights()
    route_w, route_ids = _t(4, 2, dtype=torch.float32), _t(4, 2, dtype=i32)
    fp4_up, fp4_down = _t(8, 256, 128, dtype=torch.uint8), _t(8, 256, 64, dtype=torch.uint8)
    return {
        "silu_and_mul": lambda: L.silu_and_mul(_t(4, 2 * 1408)),
        "rms_norm": lambda: L.rms_norm(_t(1, 2048), _t(2048), 1e-6, residual=_t(1, 2048)),
        "rotary_embedding": lambda: L.rotary_embedding(_t(1, dtype=torch.int64), _t(1, 16, 64), _t(1, 1, 64),
                                                       _t(4096, 64)),
        "kv_block_zero": lambda: L.kv_block_zero(_t(*mla.shape), _t(3, dtype=i32)),
        "mla_decode_metadata": lambda: L.mla_decode_metadata(_t(1, dtype=i32), 16, 64, 132),
        "paged_decode_metadata": lambda: L.paged_decode_metadata(_t(1, dtype=i32), _t(1, 64, dtype=i32), 16, 1,
                                                                 576, 64),
        "paged_decode_attention": lambda: (
            L.paged_decode_attention(_t(1, 16, 576), _t(*mla.shape), _t(1, 64, dtype=i32), _t(1, dtype=i32), 0.1,
                                     v_head_dim=512),
            L.paged_decode_attention(_t(1, 32, 128), _t(*gqa.shape), _t(1, 256, dtype=i32), _t(1, dtype=i32), 0.1)),
        "quantized_mla_decode_metadata": lambda: L.quantized_mla_decode_metadata(
            _t(1, dtype=i32), _t(1, 64, dtype=i32), 16, 64, "fp8_ds_mla"),
        "quantized_mla_decode_attention": lambda: [
            L.quantized_mla_decode_attention(_t(1, 16, 576), _mla_cache(f), _t(1, 64, dtype=i32), _t(1, dtype=i32),
                                             0.1, f, 512) for f in L.QUANTIZED_DS_MLA_FORMATS],
        "mla_kv_cache_write": lambda: [
            L.mla_kv_cache_write(_mla_cache(f), _t(1, dtype=torch.int64), _t(1, 512), _t(1, 64), f)
            for f in L.QUANTIZED_DS_MLA_FORMATS],
        "moe_topk_routing": lambda: (
            L.moe_topk_routing(_t(4, 64), 6),
            L.moe_topk_routing(_t(4, 256, dtype=torch.float32), 8, "sigmoid", True, 8, 4,
                               _t(256, dtype=torch.float32))),
        "moe_align_block_size": lambda: [L.moe_align_block_size(_t(t, 6, dtype=i32), 64, 16) for t in (1, 4096)],
        "fused_moe": lambda: L.fused_moe(_t(4, 256), w_gate_up, w_down, route_w, route_ids),
        "fused_moe_mxfp4": lambda: L.fused_moe_mxfp4(_t(4, 256), fp4_up, _t(8, 256, 8, dtype=torch.uint8), fp4_down,
                                                     _t(8, 256, 4, dtype=torch.uint8), route_w, route_ids),
        "fused_moe_nvfp4": lambda: L.fused_moe_nvfp4(
            _t(4, 256), fp4_up, _t(8, 256, 16, dtype=torch.uint8), _t(8, dtype=torch.float32), fp4_down,
            _t(8, 256, 8, dtype=torch.uint8), _t(8, dtype=torch.float32), route_w, route_ids),
        "mxfp4_quantize": lambda: L.mxfp4_quantize(_t(4, 256)),
        "mxfp4_dequantize": lambda: L.mxfp4_dequantize(_t(4, 128, dtype=torch.uint8), _t(4, 8, dtype=torch.uint8),
                                                       torch.bfloat16),
        "nvfp4_quantize": lambda: L.nvfp4_quantize(_t(4, 256), _t(dtype=torch.float32)),
        "nvfp4_dequantize": lambda: L.nvfp4_dequantize(_t(4, 128, dtype=torch.uint8),
                                                       _t(4, 16, dtype=torch.float8_e4m3fn), _t(dtype=torch.float32),
                                                       torch.bfloat16),
    }


METADATA_WITHOUT_KERNEL = {"paged_decode_metadata", "quantized_mla_decode_metadata"}


def _public_launchers() -> list[str]:
    return sorted(name for name in L.__all__ if inspect.isfunction(getattr(L, name)))


def test_every_public_launcher_has_a_case():
    assert sorted(_cases()) == _public_launchers()


@pytest.fixture
def recorded_launches(monkeypatch):
    """Kernel launches recorded instead of run; the launch-spec code (host code) still runs."""
    launched: list[str] = []
    monkeypatch.setattr(JitKernel, "launch", lambda self, launch: launched.append(self.name))
    monkeypatch.setattr(JitKernel, "_memoized_call", lambda self, inputs: (False, None))
    return launched


@pytest.mark.parametrize("name", _public_launchers())
def test_the_launcher_never_reads_device_data_on_the_host(name, recorded_launches):
    with target_driver(TARGETS["sm90"]), RefuseHostSync():
        result = _cases()[name]()
    assert recorded_launches or (name in METADATA_WITHOUT_KERNEL and result[1].device.type == DEV), \
        f"{name} launched no kernel: the case does not reach the launch"


@pytest.mark.parametrize("read, words", [
    (lambda x: x.sum().item(), "_local_scalar_dense"),
    (lambda x: x.tolist(), "copied to the host"),
    (lambda x: bool(x[0] > 0), "_local_scalar_dense|is_nonzero"),
    (lambda x: x.cpu(), "copied to the host"),
    (lambda x: torch.nonzero(x), "nonzero"),
    (lambda x: x + torch.tensor([1.0, 2.0, 3.0]).to(x.device), "copied to the device"),
])
def test_the_stand_in_catches_each_kind_of_host_read(read, words):
    """The mode is what fails the test above: it must see every way host code reads a device tensor."""
    with RefuseHostSync(), pytest.raises(HostSync, match=words):
        read(_t(3, dtype=torch.float32))


@pytest.mark.slow
def test_the_host_floor_benchmark_runs_every_launcher_on_the_cpu():
    import os
    import subprocess
    import sys
    from pathlib import Path

    bench = Path(__file__).resolve().parents[1] / "bench"
    root = Path(__file__).resolve().parents[2]
    proc = subprocess.run([sys.executable, str(bench / "host_floor.py"), "--calls", "3"], capture_output=True,
                          text=True, timeout=600,
                          env={**os.environ, "PYTHONPATH": f"{root}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "FAILED" not in proc.stdout
    for name in _public_launchers():
        assert f"| {name} " in proc.stdout, name
