"""Host code of libraries tritonwarm did not write, warmed as the server runs it.

Each library in ``host_code_libs/`` asks where it runs, at call time or at import time, and derives
Triton keys from the answers. The judge is the serving process played on this machine
(``play_server``): the module imported afresh under the target's answers, the wrapper run on REAL
CPU tensors that host code sees on ``cuda``, Triton's own binder computing every key, Triton's cache
manager looking it up in the warmed folder. Warm-up must leave no miss the judge sees, and ``check``
must say ok exactly then.
"""

import shutil
import sys
import uuid
from pathlib import Path

import pytest
import torch
from tritonwarm.jit import TARGETS
from tritonwarm.jit.adopt.play_server import playing_server
from tritonwarm.jit.adopt.winners import pin_winners, probe_winners
from tritonwarm.jit.pipeline.check import check
from tritonwarm.jit.pipeline.plan import plan
from tritonwarm.jit.pipeline.specs import SpecError, load_specs
from tritonwarm.jit.pipeline.warmup import warm

LIBS = Path(__file__).parent / "host_code_libs"
BOTH = ["sm90", "gfx942"]


@pytest.fixture
def library(tmp_path, monkeypatch):
    """``library("device_branch")`` → the name of a fresh copy of that module under a package of its own."""
    root = tmp_path / "libs"

    def copy(name: str) -> str:
        package = f"hostlib_{uuid.uuid4().hex[:10]}"
        (root / package).mkdir(parents=True)
        (root / package / "__init__.py").write_text("")
        source = LIBS / name
        if source.is_dir():
            shutil.copytree(source, root / package / name)
        else:
            shutil.copy(LIBS / f"{name}.py", root / package / f"{name}.py")
        return f"{package}.{name}"

    monkeypatch.syspath_prepend(str(root))
    yield copy
    for name in [n for n in sys.modules if n.startswith("hostlib_")]:
        del sys.modules[name]


def warm_and_check(tmp_path, spec_text: str, target_name: str):
    """Plan, warm (and pin what the spec pins), then check, as ``warmup`` and ``check`` do."""
    spec = tmp_path / f"spec-{uuid.uuid4().hex[:6]}.yaml"
    spec.write_text(spec_text)
    target, cache = TARGETS[target_name], tmp_path / "cache"
    specs = load_specs([spec])
    the_plan = plan(specs, target)
    result = warm(the_plan, cache)
    assert result.failed == 0, result.failures
    assert not pin_winners(specs, target, cache).errors
    report = check(the_plan, cache)
    report.unknown_winners += probe_winners(specs, target, cache).unknown
    return report, cache


def judged(target_name: str, cache, module: str, call):
    """The played server's misses for ``call(module)``, and how many launches it made."""
    with playing_server(TARGETS[target_name], cache) as served:
        served.call(call, served.import_module(module), served)
    return served.misses, len(served.launches)


@pytest.mark.parametrize("target_name", BOTH)
def test_a_device_type_branch_and_an_sm_count_constexpr_take_the_gpu_path(tmp_path, library, target_name):
    module = library("device_branch")
    report, cache = warm_and_check(tmp_path, f"""
launcher: {module}:scale
capture: all
axes:
  n: [1000, 4096]
args:
  x: {{tensor: [$n], dtype: float32}}
""", target_name)
    assert report.ok, report.to_json()
    sms = {"sm90": 132, "gfx942": 304}[target_name]
    for n in (1000, 4096):
        misses, launches = judged(target_name, cache, module, lambda m, s, n=n: m.scale(s.tensor(torch.ones(n))))
        assert launches == 1 and misses == []
    args = {a for v in plan(load_specs([tmp_path / next(p.name for p in tmp_path.glob("spec-*"))]),
                            TARGETS[target_name]).variants.values() for a in v.args.values()}
    assert {"=1024", f"={sms}"} <= args



@pytest.mark.parametrize("device", ["meta", "cuda"])
@pytest.mark.parametrize("target_name", BOTH)
def test_a_dry_run_record_takes_the_gpu_path_of_a_device_type_branch(tmp_path, library, target_name, device):
    """A program recorded as a dry run, with ``--device meta`` or as it runs on the server (``cuda``):
    the library's wrapper sees ``cuda`` and the target's SM count, so the plan's keys are the server's."""
    from tritonwarm.jit.adopt.imports import import_afresh
    from tritonwarm.jit.adopt.record import read_record, recording, write_plan

    module, record, plan_file = library("device_branch"), tmp_path / "record.jsonl", tmp_path / "prog.plan.yaml"
    with recording(record, target_name):  # what ``tritonwarm record --target T -- python prog.py`` runs
        program_library = import_afresh(module)
        for n in (1000, 4096):
            program_library.scale(torch.ones(n, device=device))
    recorded = read_record(record)
    assert not recorded.errors and len(recorded.rows) == 2
    write_plan(recorded.rows, plan_file, ["prog.py"], target_name)
    the_plan = plan(load_specs([plan_file]), TARGETS[target_name])
    assert not the_plan.errors

    with playing_server(TARGETS[target_name], tmp_path / "empty") as served:
        served_library = served.import_module(module)
        for n in (1000, 4096):
            served.call(served_library.scale, served.tensor(torch.ones(n)))
    assert {x.cache_hash for x in served.launches} == set(the_plan.variants)

def test_an_import_time_probe_gives_each_targets_configs_and_its_pinned_winner_the_servers_key(tmp_path, library):
    """One process warms sm90, then gfx942, then sm90 again: each sees the module as its server imports it."""
    module = library("import_probe")
    spec = f"""
launcher: {module}:add_one
capture: all
config: 0
axes:
  n: [4096]
args:
  x: {{tensor: [$n], dtype: float32}}
"""
    for target_name in (*BOTH, "sm90"):
        report, cache = warm_and_check(tmp_path, spec, target_name)
        assert report.ok, report.to_json()
        warmed = plan(load_specs(list(tmp_path.glob("spec-*.yaml"))[:1]), TARGETS[target_name]).variants.values()
        # both of the GPU's configs warmed (the server's autotuner may pick either), none of this machine's
        assert sorted(v.args["BLOCK"] for v in warmed) == ["=256", "=512"]
        assert {v.num_warps for v in warmed} == ({8} if target_name == "gfx942" else {4, 8})
    for target_name in BOTH:  # the pinned winner read (no benchmark), its variant warmed
        misses, launches = judged(target_name, cache, module, lambda m, s: m.add_one(s.tensor(torch.zeros(4096))))
        assert misses == [] and launches == 1
    sys.modules.pop(module, None)  # as this machine imports it (no GPU): the list no server has
    assert [c.kwargs["BLOCK"] for c in __import__(module, fromlist=["x"]).CONFIGS] == [64]


@pytest.mark.parametrize("target_name", BOTH)
def test_a_package_that_replaces_triton_jit_without_a_driver_hears_that_one_is_active(
        tmp_path, library, target_name):
    module = library("placeholder_pkg") + ".ops"
    report, cache = warm_and_check(tmp_path, f"""
launcher: {module}:fill
capture: all
axes:
  value: [1, 7]
args:
  out: {{tensor: [1000], dtype: int32}}
  value: $value
""", target_name)
    assert report.ok, report.to_json()
    assert report.planned == 2
    for value in (1, 7):
        misses, launches = judged(target_name, cache, module,
                                  lambda m, s, v=value: m.fill(s.tensor(torch.zeros(1000, dtype=torch.int32)), v))
        assert misses == [] and launches == 1


@pytest.mark.parametrize("target_name", BOTH)
def test_a_library_that_asks_the_gpu_at_import_imports_and_takes_the_servers_values(
        tmp_path, library, target_name):
    module = library("asks_gpu_at_import")
    report, cache = warm_and_check(tmp_path, f"""
launcher: {module}:count
capture: all
args:
  x: {{tensor: [5000], dtype: int32}}
""", target_name)
    assert report.ok, report.to_json()
    assert [v.args["NEW_GPU"] for v in plan(load_specs(list(tmp_path.glob("spec-*.yaml"))),
                                            TARGETS[target_name]).variants.values()] == ["=True"]
    misses, launches = judged(target_name, cache, module,
                              lambda m, s: m.count(s.tensor(torch.ones(5000, dtype=torch.int32))))
    assert misses == [] and launches == 1


INDEX_SPEC = """
launcher: {module}:gather_rows
capture: all
args:
  x: {{tensor: [64, 100], dtype: bfloat16}}
  idx: {{tensor: [4], dtype: int64{values}}}
"""


@pytest.mark.parametrize("target_name", BOTH)
def test_item_on_an_index_tensor_reads_the_values_the_spec_gives(tmp_path, library, target_name):
    module = library("index_values")
    report, cache = warm_and_check(tmp_path, INDEX_SPEC.format(module=module, values=", values: [0, 3, 5, 9]"),
                                   target_name)
    assert report.ok, report.to_json()
    misses, launches = judged(target_name, cache, module, lambda m, s: m.gather_rows(
        s.tensor(torch.zeros(64, 100, dtype=torch.bfloat16)), s.tensor(torch.tensor([0, 3, 5, 9]))))
    assert misses == [] and launches == 1


def test_without_the_values_the_error_names_the_users_line_and_the_field(tmp_path, library, run_cli):
    module = library("index_values")
    spec = tmp_path / "index.yaml"
    spec.write_text(INDEX_SPEC.format(module=module, values=""))
    the_plan = plan(load_specs([spec]), TARGETS["sm90"])
    source = sys.modules[module].__file__
    line = next(i for i, text in enumerate(open(source), 1) if ".item()" in text)
    assert len(the_plan.errors) == 1, the_plan.errors
    error = the_plan.errors[0]
    assert f"{source}:{line}: .item() reads the values of a tensor warm-up only fakes" in error
    assert "args.idx.values" in error
    report = check(the_plan, tmp_path / "cache")
    assert not report.ok and report.errors == the_plan.errors
    import os

    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path / "libs"), *sys.path])}
    proc = run_cli("check", spec, "--target", "sm90", "--cache-dir", tmp_path / "cache", rc=1, env=env)
    assert f"{source}:{line}: .item()" in proc.stdout and "args.idx.values" in proc.stdout


def test_values_that_do_not_fit_the_shape_are_refused_at_load(tmp_path, library):
    module = library("index_values")
    spec = tmp_path / "index.yaml"
    spec.write_text(INDEX_SPEC.format(module=module, values=", values: [0, 3]"))
    with pytest.raises(SpecError, match=r"index.yaml:\d+: args.idx.values: 2 values for a tensor of shape \[4\]"):
        load_specs([spec])


def test_a_capture_all_module_is_not_run_when_the_spec_is_loaded(tmp_path, library):
    module = library("asks_gpu_at_import")
    spec = tmp_path / "s.yaml"
    spec.write_text(f"launcher: {module}:count\ncapture: all\nargs:\n  x: {{tensor: [8], dtype: int32}}\n")
    load_specs([spec])
    assert module not in sys.modules
    package = library("gpu_init_pkg")  # nor the package around it, whose __init__ asks the GPU
    inner = tmp_path / "p.yaml"
    inner.write_text(f"launcher: {package}.ops:zero\ncapture: all\nargs:\n  out: {{tensor: [300], dtype: int32}}\n")
    [loaded] = load_specs([inner])
    assert package not in sys.modules
    for target_name, major in (("sm90", 9), ("gfx942", 9), ("sm100", 10)):
        the_plan = plan([loaded], TARGETS[target_name])
        assert not the_plan.errors and [v.args["MAJOR"] for v in the_plan.variants.values()] == [f"={major}"]
    missing = tmp_path / "m.yaml"
    missing.write_text(spec.read_text().replace(module, module + "_gone"))
    with pytest.raises(SpecError, match=r"m.yaml:1: launcher: cannot import"):
        load_specs([missing])


def test_warmup_and_check_commands_in_worker_processes(tmp_path, library, run_cli):
    """``warmup --jobs 2`` traces and compiles in worker processes, which import the library for
    each target afresh; ``check`` then says ok, and the played servers of both targets hit every key."""
    import os

    module = library("import_probe")
    spec = tmp_path / "probe.yaml"
    spec.write_text(f"launcher: {module}:add_one\ncapture: all\nconfig: 1\n"
                    "args:\n  x: {tensor: [4096], dtype: float32}\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path / "libs"), *sys.path])}
    cache = tmp_path / "cache"
    run_cli("warmup", spec, "--target", "sm90,gfx942", "--jobs", "2", "--cache-dir", cache, rc=0, env=env)
    proc = run_cli("check", spec, "--target", "sm90,gfx942", "--cache-dir", cache, rc=0, env=env)
    for target in ("sm90", "gfx942"):
        assert f"{target}: ok: 2 variants planned from 1 row, 0 missing" in proc.stdout, proc.stdout
    for target_name in BOTH:
        misses, launches = judged(target_name, cache, module, lambda m, s: m.add_one(s.tensor(torch.zeros(4096))))
        assert misses == [] and launches == 1


@pytest.mark.parametrize("target_name", BOTH)
def test_what_host_code_sees_of_tensors_and_the_device(target_name):
    from triton import backends
    from triton._C.libtriton import native_specialize_impl
    from triton.backends.amd.compiler import HIPBackend
    from triton.runtime import driver
    from tritonwarm.jit.adopt.imports import target_answers
    from tritonwarm.jit.core.server_tensors import ServerTensor, backing_device, server_tensors
    from tritonwarm.jit.core.specialization import fake_tensor

    target = TARGETS[target_name]
    before = torch.cuda.is_available, torch.version.hip
    with target_answers(target):
        x = ServerTensor(fake_tensor((4, 8), torch.float16, aligned=False))
        assert (x.device, x.device.type, x.device.index, x.get_device()) == (torch.device("cuda", 0), "cuda", 0, 0)
        assert (x.is_cuda, x.is_cpu, x.is_meta) == (True, False, False)
        made = [torch.empty_like(x), torch.empty(3, device=x.device), x.new_zeros(2), torch.arange(3).cuda(),
                torch.ones(2).to("cuda"), torch.zeros(2, device="cuda"), x.view(-1)[3:], x.float()]
        assert all(isinstance(t, ServerTensor) and backing_device(t).type == "meta" for t in made)
        assert type(torch.ones(2)) is torch.Tensor  # made on the CPU: as on the server
        assert x.data_ptr() % 16 == 2 and made[0].data_ptr() == 0  # the unaligned view, the aligned new tensor
        with torch.cuda.device(x.device.index):
            torch.cuda.synchronize()
        active = {name for name, b in backends.backends.items() if b.driver.is_active()}
        assert active == {"nvidia" if target.is_nvidia else "amd"}
        assert driver.active.get_current_target() == target.gpu_target
        props = torch.cuda.get_device_properties(x.device)
        assert (props.multi_processor_count, torch.cuda.get_device_capability()) == (
            {"sm90": (132, (9, 0)), "gfx942": (304, (9, 4))}[target_name])
    assert (torch.cuda.is_available, torch.version.hip) == before
    real = torch.empty(2**20, dtype=torch.uint8)
    for storage, view in ((real, real[16:]), (torch.empty(2**20, dtype=torch.uint8, device="meta"), None)):
        view = storage[16:] if view is None else view
        with server_tensors("cpu"):  # the pointer-range class follows the storage, as for a real tensor
            assert native_specialize_impl(HIPBackend, ServerTensor(view), False, True, True)[1] == "DS"


def test_the_docs_example_runs(tmp_path, library):
    """docs/host-code.md: its spec warms the library, and its played server hits every key."""
    import re

    text = (Path(__file__).parents[1] / "docs" / "host-code.md").read_text()
    spec_text = re.search(r"```yaml\n(.*?)```", text, re.S).group(1)
    python = re.search(r"```python\n(.*?)```", text, re.S).group(1)
    module = library("index_values")
    cache = tmp_path / "cache"
    report, cache = warm_and_check(tmp_path, spec_text.replace("mylib.ops", module), "sm90")
    assert report.ok, report.to_json()
    exec(python.replace("mylib.ops", module).replace('"cache"', repr(str(cache))), {})  # noqa: S102


def test_an_import_that_fails_names_the_spec_the_module_the_target_and_the_line(tmp_path, library):
    module = library("fails_at_import")
    spec = tmp_path / "f.yaml"
    spec.write_text(f"launcher: {module}:launch\ncapture: all\nargs:\n  x: {{tensor: [8], dtype: int32}}\n")
    [error] = plan(load_specs([spec]), TARGETS["sm90"]).errors
    source = str(tmp_path / "libs" / module.replace(".", "/")) + ".py"
    assert (f"{spec}:1: launcher: importing {module} under sm90's answers failed at {source}:5: "
            "this build needs a Blackwell GPU") in error


@pytest.mark.parametrize("target_name", BOTH)
def test_server_tensors_get_the_keys_real_tensors_get(target_name):
    """Every class Triton reads of a tensor (alignment; on HIP the storage's pointer range, at most
    2 GiB or not) is the same for a warm-up ServerTensor and a real CPU tensor dressed the same way;
    and host code sees of it what it sees of torch's own fake cuda tensors (FakeTensorMode)."""
    import triton
    import triton.language as tl
    from torch._subclasses.fake_tensor import FakeTensorMode
    from tritonwarm.jit.core.server_tensors import ServerTensor, plain
    from tritonwarm.jit.core.specialization import cpu_twin, fake_tensor
    from tritonwarm.jit.core.trace import Capture, tracing

    @triton.jit
    def copy_kernel(x_ptr, n, BLOCK: tl.constexpr):
        offs = tl.arange(0, BLOCK)
        tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=offs < n), mask=offs < n)

    seen = {}
    for storage in (64, 2**31 - 1, 2**31 + 15):
        for aligned in (True, False):
            fake = ServerTensor(torch.empty(storage, dtype=torch.uint8, device="meta")[1 - aligned:][:16])
            real = cpu_twin(fake)
            assert type(real) is ServerTensor and plain(real).device.type == "cpu"
            keys = []
            for tensor in (fake, real):
                cap = Capture()
                with tracing(cap, TARGETS[target_name], all_kernels=True):
                    copy_kernel[(1,)](tensor, 16, BLOCK=16)
                keys.append({v.key for v in cap.variants.values()})
            assert keys[0] == keys[1] and len(keys[0]) == 1
            seen[storage, aligned] = keys[0]
    assert seen[64, True] != seen[64, False]
    assert (seen[64, True] == seen[2**31 + 15, True]) == (target_name == "sm90")  # HIP's pointer range
    with FakeTensorMode():  # (on a CPU-only torch it makes them, but cannot even slice them)
        theirs = torch.empty(4, 8, dtype=torch.float16, device="cuda")
    ours = ServerTensor(fake_tensor((4, 8), torch.float16))
    for attribute in ("device", "is_cuda", "is_cpu", "shape", "dtype"):
        assert getattr(ours, attribute) == getattr(theirs, attribute), attribute
    assert (ours.stride(), ours.storage_offset(), ours.untyped_storage().nbytes()) == (
        theirs.stride(), theirs.storage_offset(), theirs.untyped_storage().nbytes())


def test_values_from_an_expression_and_nested_lists_keep_the_layout(tmp_path):
    from tritonwarm.jit.core.server_tensors import ServerTensor, plain

    spec = tmp_path / "v.yaml"
    spec.write_text("""
launcher: tritonwarm.examples.thirdparty_ops:softmax
capture: all
axes:
  last: [7, 9]
args:
  idx: {tensor: [3], dtype: int32, values: "$[0, 2, last]", aligned: false}
  counts: {tensor: [2, 2], dtype: int64, values: [[1, 2], [3, 4]], stride: [1, 2]}
""")
    [loaded] = load_specs([spec])
    args = [loaded.call_arguments(row.values)[1] for row in loaded.rows()]
    assert [a["idx"].tolist() for a in args] == [[0, 2, 7], [0, 2, 9]]
    idx, counts = args[0]["idx"], args[0]["counts"]
    assert type(idx) is ServerTensor and idx.is_cuda and plain(idx).device.type == "cpu"
    assert idx.storage_offset() == 1 and idx.data_ptr() % 16 != 0  # aligned: false, as for a fake
    assert counts.stride() == (1, 2) and counts.tolist() == [[1, 2], [3, 4]]
