"""Fast dispatch must launch exactly the compiled kernel Triton's own path would pick, for every
kernel of the library (every row of every shipped spec), and defer to Triton for anything new."""

import pathlib

import pytest
import torch
from tritonwarm.jit import TARGETS
from tritonwarm.jit.cache.triton_dir import triton_cache_dir
from tritonwarm.jit.core.kernel import FakeLaunchSink, Launch, fake_launches
from tritonwarm.jit.core.targets import target_driver
from tritonwarm.jit.pipeline.specs import load_specs

SPECS = pathlib.Path(__file__).parent.parent / "warmup_specs"


class Recorder(FakeLaunchSink):
    def __init__(self):
        self.launches = []

    def launch(self, kernel, launch, target):
        self.launches.append((kernel, launch))


def materialize(value):
    """A CPU tensor with the meta tensor's dtype, shape, strides and alignment class."""
    if isinstance(value, torch.Tensor) and value.device.type == "meta":
        span = value.storage_offset() + sum((s - 1) * st for s, st in zip(value.shape, value.stride(), strict=True)) + 1
        base = torch.zeros(max(span, 1) + 16, dtype=value.dtype)
        shift = (-base.data_ptr() // base.element_size()) % (16 // base.element_size() or 1)  # 16-byte aligned start
        return base[shift:].as_strided(value.shape, value.stride(), shift + value.storage_offset())
    return value


def library_launches():
    recorder = Recorder()
    with fake_launches(recorder, TARGETS["sm90"]):
        for spec in load_specs([SPECS]):
            if not spec.applies_to(TARGETS["sm90"]):
                continue  # AMD-only rows (KV caches over 2 GiB) would be materialized for nothing
            for row in spec.rows():
                args, kwargs = spec.call_arguments(row.values)
                spec.launcher(*args, **kwargs)
    return recorder.launches


def stub(kernel):
    """No driver here: make the compiled kernel's launch a no-op (both paths call the same one)."""
    calls = []  # what each call passed, tensors by address: holding the tensors would keep every launch's alive
    kernel._run = lambda *args: calls.append(tuple(a.data_ptr() if isinstance(a, torch.Tensor) else a for a in args))
    kernel.function, kernel.module = 0, object()
    return calls


@pytest.mark.slow
def test_fast_path_picks_tritons_kernel_for_every_library_launch(compile_cache_dir):
    launches = library_launches()
    kernels = {kernel.name for kernel, _ in launches}
    assert len(kernels) >= 5 and len(launches) > 50
    fast_hits = 0
    with target_driver(TARGETS["sm90"]), triton_cache_dir(compile_cache_dir):
        for kernel, meta_launch in launches:
            launch = Launch(meta_launch.grid, tuple(materialize(a) for a in meta_launch.args),
                            meta_launch.constexprs, meta_launch.num_warps, meta_launch.num_stages,
                            meta_launch.options)
            expected = kernel.jit_function.run(*launch.args, grid=launch.grid, warmup=True, **launch.kwargs())
            calls = stub(expected)
            kernel.fast.launch(launch)  # first time: Triton's path, remembered
            chosen = kernel.fast.chosen_kernel(launch)
            assert chosen is not None and chosen.hash == expected.hash, kernel.name
            assert kernel.fast.launch(launch) is expected  # second time: the direct call
            assert len(calls) == 2 and calls[0][9:] == calls[1][9:]  # same arguments both ways
            fast_hits += 1
    assert fast_hits == len(launches)


@pytest.mark.slow
def test_new_classes_go_through_triton(compile_cache_dir):
    from tritonwarm.launchers.rms_norm import rms_norm_jit, rms_norm_launch

    x, w = torch.randn(4, 64), torch.randn(64)
    with target_driver(TARGETS["sm90"]), triton_cache_dir(compile_cache_dir):
        aligned = rms_norm_launch(x, w, torch.empty_like(x), 1e-6)
        unaligned_x = torch.randn(4 * 64 + 1)[1:].view(4, 64)
        unaligned = rms_norm_launch(unaligned_x, w, torch.empty_like(x), 1e-6)
        k_aligned = rms_norm_jit.jit_function.run(*aligned.args, grid=aligned.grid, warmup=True, **aligned.kwargs())
        stub(k_aligned)
        rms_norm_jit.fast.launch(aligned)
        assert rms_norm_jit.fast.chosen_kernel(unaligned) is None  # another class: not in the fast cache
        k_unaligned = rms_norm_jit.jit_function.run(*unaligned.args, grid=unaligned.grid, warmup=True,
                                                    **unaligned.kwargs())
        stub(k_unaligned)
        assert rms_norm_jit.fast.launch(unaligned) is k_unaligned and k_unaligned.hash != k_aligned.hash
        assert rms_norm_jit.fast.chosen_kernel(unaligned) is k_unaligned


@pytest.mark.parametrize("value,expected", [(1, -1), (16, 1), (17, 0), (-16, 1), (2**31, 3), (2**31 + 1, 2),
                                            (2**63, 5), (2**63 + 3, 4)])
def test_int_classes_match_tritons(value, expected):
    from tritonwarm.jit.core.dispatch import _classifier
    from tritonwarm.jit.core.specialization import scalar_class

    code = _classifier((int,), [(True, True)])((value,))[0]
    assert code == expected
    names = {-1: "one", 0: "i32", 1: "i32:div16", 2: "i64", 3: "i64:div16", 4: "u64", 5: "u64:div16"}
    assert names[code] == scalar_class(value)


@pytest.mark.slow
def test_hip_storages_over_2gib_are_another_class(compile_cache_dir):
    """HIP's buffer ops mark pointers into storages of at most 2 GiB: a view of a larger storage is
    another compiled kernel, and the fast path must not hand it the small storage's."""
    from tritonwarm.launchers.rms_norm import rms_norm_jit, rms_norm_launch

    w = torch.randn(64)
    small = torch.randn(4, 64)
    large = torch.empty(2**31 // 4 + 1024)[:256].view(4, 64)  # untouched pages: no real memory
    with target_driver(TARGETS["gfx942"]), triton_cache_dir(compile_cache_dir):
        launches = [rms_norm_launch(x, w, torch.empty_like(small), 1e-6) for x in (small, large)]
        kernels = [rms_norm_jit.jit_function.run(*la.args, grid=la.grid, warmup=True, **la.kwargs())
                   for la in launches]
        assert kernels[0].hash != kernels[1].hash  # Triton's own choice differs
        stub(kernels[0])
        rms_norm_jit.fast.launch(launches[0])
        assert rms_norm_jit.fast.chosen_kernel(launches[1]) is None  # not the small storage's kernel
        stub(kernels[1])
        assert rms_norm_jit.fast.launch(launches[1]) is kernels[1]
        assert rms_norm_jit.fast.chosen_kernel(launches[1]) is kernels[1]


class _Counter:
    def __init__(self):
        self.launches = 0

    def count_launch(self, kernel):
        self.launches += 1


@pytest.mark.slow
def test_memo_replays_the_kernel_triton_picks_per_input_key(compile_cache_dir, monkeypatch):
    """A memoized launch is bound once per input key (alignment and scalars included) to the kernel
    Triton's own path picked, and replays it with the same arguments Triton passed."""
    from tritonwarm.jit import JitKernel
    from tritonwarm.jit.core import kernel as kernel_module
    from tritonwarm.kernels.rms_norm import rms_norm_kernel
    from tritonwarm.launchers.rms_norm import rms_norm_launch

    monkeypatch.setattr(kernel_module, "_wants_interpreter", lambda args: False)  # CPU tensors, stubbed launch
    memoized = JitKernel(rms_norm_kernel, rms_norm_launch, name="test.memo.rms_norm", memoize=True)
    w = torch.randn(64)
    aligned = torch.randn(4, 64)
    unaligned = torch.randn(4 * 64 + 1)[1:].view(4, 64)
    counter = _Counter()
    token = kernel_module.launch_observer.set(counter)
    try:
        with target_driver(TARGETS["sm90"]), triton_cache_dir(compile_cache_dir):
            hashes = []
            for x in (aligned, unaligned):
                out = torch.empty_like(aligned)
                launch = rms_norm_launch(x, w, out, 1e-6)
                expected = memoized.jit_function.run(*launch.args, grid=launch.grid, warmup=True, **launch.kwargs())
                calls = stub(expected)
                entries = len(memoized.memo.entries)
                assert memoized(x, w, out, 1e-6) is expected  # first: the spec, then Triton's path
                assert len(memoized.memo.entries) == entries + 1
                assert memoized(x, w, out, 1e-6) is expected  # then the bound launch
                assert memoized(x, w, out, 1e-5) is expected  # another eps: another key, same kernel
                assert len(calls) == 3
                assert calls[0][:3] == calls[1][:3] and calls[0][9:] == calls[1][9:]
                assert calls[2][9:] == calls[0][9:][:8] + (1e-5,) + calls[0][9:][9:]  # eps is the 9th argument
                hashes.append(expected.hash)
            assert hashes[0] != hashes[1]  # the alignment class picked another kernel, and the memo followed
    finally:
        kernel_module.launch_observer.reset(token)
    assert counter.launches == 6
    held = [value for replay in memoized.memo.entries.values() for value in replay.args[2]]
    assert not any(isinstance(value, torch.Tensor) for value in held)  # no tensor kept alive by the memo


@pytest.mark.slow
def test_memo_leaves_alone_a_spec_that_makes_its_own_tensors(compile_cache_dir, monkeypatch):
    from tritonwarm.jit import JitKernel
    from tritonwarm.jit.core import kernel as kernel_module
    from tritonwarm.kernels.rms_norm import rms_norm_kernel
    from tritonwarm.launchers.rms_norm import rms_norm_launch

    monkeypatch.setattr(kernel_module, "_wants_interpreter", lambda args: False)
    viewing = JitKernel(rms_norm_kernel, lambda x, w, out, eps: rms_norm_launch(x[:, :], w, out, eps),
                        name="test.memo.view", memoize=True)
    x, w = torch.randn(4, 64), torch.randn(64)
    out = torch.empty_like(x)
    with target_driver(TARGETS["sm90"]), triton_cache_dir(compile_cache_dir):
        launch = rms_norm_launch(x, w, out, 1e-6)
        expected = viewing.jit_function.run(*launch.args, grid=launch.grid, warmup=True, **launch.kwargs())
        calls = stub(expected)
        assert viewing(x, w, out, 1e-6) is expected and viewing(x, w, out, 1e-6) is expected
    assert not viewing.memo.entries and len(calls) == 2  # launched both times, never bound


def test_memo_keys_every_input_a_spec_may_read():
    from tritonwarm.jit.core.dispatch import _input_keyer

    x = torch.randn(4, 64)
    key = _input_keyer((torch.Tensor, float, type(None)))
    base = key((x, 1e-6, None))
    assert key((x.clone(), 1e-6, None)) == base  # same metadata: same key
    for other in (x.double(), x[:2], x.t(), torch.randn(4 * 64 + 1)[1:].view(4, 64)):
        assert key((other, 1e-6, None)) != base  # dtype, shape, strides, alignment
    assert key((x, 1e-5, None)) != base
    assert _input_keyer((torch.Tensor, list)) is None  # not keyed: the plain path


def test_device_query_skips_torchs_python_layers(monkeypatch):
    """Triton 3.6's drivers answer ``torch.cuda.current_device`` (Python around one C call that lazy-inits
    itself); a launch asks the C call directly. Any other driver query is used as it is."""
    from tritonwarm.jit.core import dispatch

    def c_query():
        return 3

    monkeypatch.setattr(torch._C, "_cuda_getDevice", c_query, raising=False)
    monkeypatch.setattr(dispatch, "_DEVICE_QUERIES", {})

    class Triton36Driver:
        get_current_device = staticmethod(torch.cuda.current_device)

    class OwnQueryDriver:
        @staticmethod
        def get_current_device():
            return 5

    assert dispatch.current_device(Triton36Driver()) == 3
    assert dispatch.current_device(OwnQueryDriver()) == 5
