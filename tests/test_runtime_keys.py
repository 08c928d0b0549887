"""Warmed keys equal runtime keys: for every shipped spec row and target, the key Triton computes for
the fake inputs warm-up traces equals the key it computes for real (CPU) tensors of the same dtype,
shape, strides, storage offset and storage size, under the same target-only driver. Nothing compiles:
both keys are read from Triton's own ``jit_cache_hook``."""

from pathlib import Path

import pytest
import torch
import triton
import triton.language as tl
from triton import knobs
from triton._C.libtriton import native_specialize_impl
from tritonwarm.jit import TARGETS, JitKernel, Launch, trace_call
from tritonwarm.jit.core.kernel import fake_launches
from tritonwarm.jit.core.specialization import as_kernel_arg, cpu_twin, fake_tensor
from tritonwarm.jit.core.targets import target_driver
from tritonwarm.jit.core.trace import Capture
from tritonwarm.jit.pipeline.specs import find_spec_files, load_specs

SPEC_DIR = Path(__file__).resolve().parents[1] / "warmup_specs"


def _keys(spec, target, args, kwargs) -> set[tuple[str, str]]:
    cap = Capture()
    with fake_launches(cap, target):
        spec.launcher(*args, **kwargs)
    return {(v.kernel, v.key) for v in cap.variants.values()}


@pytest.fixture(scope="module")
def shipped_specs():
    return load_specs(find_spec_files([SPEC_DIR]))


@pytest.mark.parametrize("target_name", ["sm90", "gfx942", "gfx950"])
def test_every_shipped_row_warms_the_key_real_tensors_get(shipped_specs, target_name):
    target = TARGETS[target_name]
    rows = mismatched = 0
    first = None
    for spec in shipped_specs:
        if not spec.applies_to(target):
            continue
        for row in spec.rows():
            args, kwargs = spec.call_arguments(row.values)
            warmed = _keys(spec, target, args, kwargs)
            runtime = _keys(spec, target, cpu_twin(args), cpu_twin(kwargs))
            rows += 1
            assert warmed, f"{row.label} launches nothing"
            if warmed != runtime:
                mismatched += 1
                first = first or (row.label, sorted(warmed - runtime), sorted(runtime - warmed))
    assert rows > 20
    assert mismatched == 0, f"{mismatched} of {rows} rows warm other keys than real tensors get; first: {first}"


def _hip_attr(value) -> str:
    from triton.backends.amd.compiler import HIPBackend

    return native_specialize_impl(HIPBackend, value, False, True, True)[1]


def test_pointer_range_follows_the_storage_size_as_for_real_tensors():
    """HIP marks a tensor of at most 2 GiB (of storage, not of the view) with the pointer range."""
    limit = 2**31 - 1
    for storage_bytes in (limit, limit + 1):
        fake_base = torch.empty(storage_bytes, dtype=torch.uint8, device="meta")
        fake_view = fake_base[:64]
        real_view = torch.empty(storage_bytes, dtype=torch.uint8)[:64]
        assert _hip_attr(as_kernel_arg(fake_view)) == _hip_attr(real_view)
        assert ("S" in _hip_attr(real_view)) == (storage_bytes <= limit)


def test_cpu_twin_keeps_layout_and_storage():
    fake = fake_tensor((3, 5), torch.bfloat16, stride=(8, 1), aligned=False)
    real = cpu_twin({"x": [fake, 2]})["x"][0]
    assert real.device.type == "cpu" and real.dtype == fake.dtype
    assert (real.shape, real.stride(), real.storage_offset()) == (fake.shape, fake.stride(), fake.storage_offset())
    assert real.untyped_storage().nbytes() == fake.untyped_storage().nbytes()


def test_the_comparison_sees_a_fake_without_storage_size(shipped_specs, monkeypatch):
    """Control: fakes that carry only dtype and address (as before) warm other gfx keys, same sm90 keys."""
    from tritonwarm.jit.core import kernel

    class AddressOnly:
        def __init__(self, fake):
            self.dtype, self.address = fake.dtype, fake.address

        def data_ptr(self):
            return self.address

    original = kernel.as_kernel_arg
    monkeypatch.setattr(kernel, "as_kernel_arg", lambda v: AddressOnly(original(v)) if original(v) is not v else v)
    spec = next(s for s in shipped_specs if s.kernel_path.endswith(":rms_norm"))
    args, kwargs = spec.call_arguments(spec.rows()[0].values)
    for name, same in (("sm90", True), ("gfx942", False)):
        target = TARGETS[name]
        assert (_keys(spec, target, args, kwargs) == _keys(spec, target, cpu_twin(args), cpu_twin(kwargs))) == same


@triton.jit
def _mode_kernel(out_ptr, MODE: tl.constexpr):
    if MODE == "bf16":
        tl.store(out_ptr, 1)
    else:
        tl.store(out_ptr, 2)


_mode = JitKernel(_mode_kernel, lambda out, mode: Launch(grid=(1,), args=(out,), constexprs={"MODE": mode}))


def _compile_request(mode: str) -> dict:
    """Triton's own compile request for ``_mode`` with MODE=mode on sm90 (nothing compiled)."""
    seen = []

    def hook(*, compile, **_):
        seen.append(compile)
        return True

    with target_driver(TARGETS["sm90"]), knobs.runtime.scope():
        knobs.runtime.jit_cache_hook = hook
        _mode_kernel.run(torch.empty(1, dtype=torch.int32, device="meta"), MODE=mode, grid=(1,), warmup=True)
    return seen[0]


def test_preload_reads_a_dtype_named_string_back_as_a_dtype(tmp_path):
    """The Triton fact behind the refusal below: the runtime compiles MODE="bf16" as the string, but
    ``JITFunction.preload`` (what warm-up compiles from) gets a ``tl.dtype`` back: a different kernel
    under the same cache hash, which the runtime would load."""
    from triton.compiler import ASTSource
    from triton.compiler import compile as triton_compile
    from tritonwarm.jit.cache.triton_dir import triton_cache_dir

    request = _compile_request("bf16")
    target = TARGETS["sm90"]
    with target_driver(target), triton_cache_dir(tmp_path / "runtime"):
        source = ASTSource(_mode_kernel, request["signature"], request["constants"], request["configs"][0])
        runtime = triton_compile(source, target=target.gpu_target)
    with target_driver(target) as fake, triton_cache_dir(tmp_path / "warmup"):
        preloaded = _mode_kernel.preload(request["specialization_data"])
        _mode_kernel.device_caches.pop(fake.device, None)
    assert runtime.hash == preloaded.hash
    assert runtime.asm["ptx"] != preloaded.asm["ptx"]


def test_a_dtype_named_string_constexpr_is_refused_while_tracing():
    out = fake_tensor((1,), torch.int32)
    with pytest.raises(ValueError, match=r"constexpr MODE='bf16' names a Triton dtype"):
        trace_call(TARGETS["sm90"], _mode, out, "bf16")
    assert trace_call(TARGETS["sm90"], _mode, out, "bf16_lines")  # any other string is warmed as it is


def test_a_custom_pipeline_is_keyed_as_tritons_own_compile_keys_it(compile_call):
    """A custom pass pipeline (``knobs.runtime.add_stages_inspection_hook``) enters Triton 3.7+'s disk
    key: warm-up's hash must follow, or every entry is filed where the runtime never looks."""
    from triton.compiler import compile as triton_compile
    from tritonwarm.launchers.rms_norm import rms_norm

    x, weight = fake_tensor((8, 1024), torch.bfloat16), fake_tensor((1024,), torch.bfloat16)
    [(plain, _)] = compile_call("sm90", rms_norm, x, weight)

    def hook(*args):  # no arguments: the (key, hash) Triton keys on; else the backend's stages call
        return None if args else ("custom-pipeline-v1", "c0ffee")

    with knobs.runtime.scope():
        knobs.runtime.add_stages_inspection_hook = hook
        [(hooked, _)] = compile_call("sm90", rms_norm, x, weight)  # asserts Triton's hash is the traced one
    keyed = "add_stages_inspection_hook" in triton_compile.__code__.co_names
    assert (hooked.cache_hash != plain.cache_hash) == keyed


@triton.jit
def _scale_kernel(x_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) * 2, mask=offs < n)


_scale = JitKernel(_scale_kernel, lambda x, warps: Launch(grid=(1,), args=(x, x.numel()), constexprs={"BLOCK": 32},
                                                          num_warps=warps, num_stages=1))


@pytest.mark.parametrize("warps", [1, 4])
@pytest.mark.parametrize(("n", "cls"), [(1, "one"), (16, "i32:div16"), (17, "i32")])
@pytest.mark.parametrize("aligned", [True, False])
def test_a_one_warp_kernel_at_one_and_sixteen_warms_the_key_real_tensors_get(warps, n, cls, aligned):
    """The smallest launches production makes: one warp, one element (a batch of one), and 16."""
    x = fake_tensor((n,), torch.float16, aligned=aligned)
    [warmed] = trace_call(TARGETS["sm90"], _scale, x, warps)
    [runtime] = trace_call(TARGETS["sm90"], _scale, cpu_twin(x), warps)
    assert warmed.key == runtime.key and warmed.cache_hash == runtime.cache_hash
    assert (warmed.num_warps, warmed.num_stages) == (warps, 1) and f"'num_warps': {warps}" in warmed.key
    assert warmed.args["n"] == cls
    assert warmed.args["x_ptr"] == ("*fp16 aligned" if aligned else "*fp16 unaligned")
