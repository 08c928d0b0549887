"""Autograd on the server's tensors: a training step warms as the server runs it.

Libraries branch on autograd: Liger-Kernel's cross entropy launches its training variant
(``HAS_GRADIENTS=_input.requires_grad``), every ``torch.autograd.Function`` launches its backward
kernels from Python with grid sizes read off the gradient's device. A ``ServerTensor`` keeps
``requires_grad``, ``grad_fn`` and ``.grad`` as a plain tensor does, and the gradients reaching a
backward are the server's too. The judge is the serving process played on this machine
(``play_server``: real CPU tensors seen on ``cuda``, Triton's own binder computing each key): the
keys of a spec with ``requires_grad:`` and of a dry-run ``record`` must be the keys it asks for.
"""

import copy
import importlib.util
import os
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from tritonwarm.jit import TARGETS
from tritonwarm.jit.adopt.imports import import_afresh
from tritonwarm.jit.adopt.play_server import playing_server
from tritonwarm.jit.adopt.record import read_record, recording, write_plan
from tritonwarm.jit.core.server_tensors import DataDependentError, ServerTensor, server_tensors
from tritonwarm.jit.pipeline.check import check
from tritonwarm.jit.pipeline.plan import plan
from tritonwarm.jit.pipeline.specs import SpecError, load_specs

LIBS = Path(__file__).parent / "host_code_libs"
BOTH = ["sm90", "gfx942"]


def server_keys(tmp_path, target_name: str, module: str, step) -> set[str]:
    """The cache hashes the played server asks for when it runs ``step(library)``, the library imported
    as the server's process imports it."""
    with playing_server(TARGETS[target_name], tmp_path / "server-cache") as served:
        step(served.import_module(module))
    assert served.launches, "the server launched nothing: the judge judges nothing"
    return {launch.cache_hash for launch in served.launches}


def dry_run_plan(tmp_path, target_name: str, module: str, step) -> Path:
    """What ``tritonwarm record --target T -- python prog.py`` writes for a program running ``step(library)``."""
    record, plan_file = tmp_path / "record.jsonl", tmp_path / "prog.plan.yaml"
    with recording(record, target_name):
        step(import_afresh(module))
    recorded = read_record(record)
    assert not recorded.errors, recorded.errors
    write_plan(recorded.rows, plan_file, ["python", "prog.py"], target_name, recorded.roots)
    return plan_file


def planned_keys(spec_file: Path, target_name: str) -> set[str]:
    the_plan = plan(load_specs([spec_file]), TARGETS[target_name])
    assert not the_plan.errors, the_plan.errors
    return set(the_plan.variants)


# --------------------------------------------------------------------------- autograd as plain tensors have it


class Probe(torch.autograd.Function):
    """A library's Function: its backward asks the gradient where it lives and allocates beside it."""

    seen: list = []

    @staticmethod
    def forward(ctx, x, w):
        ctx.save_for_backward(x, w)
        Probe.seen.append(("forward sees", x.requires_grad, torch.is_grad_enabled(), x.device.type))
        return x * w

    @staticmethod
    def backward(ctx, grad):
        x, w = ctx.saved_tensors
        scratch = torch.empty(grad.shape, dtype=grad.dtype, device=grad.device)
        Probe.seen.append(("backward sees", grad.device.type, grad.is_cuda == (grad.device.type == "cuda"),
                           scratch.device.type, tuple(grad.shape)))
        return grad * w, (grad * x).sum(0)


def training_step(device: str) -> list:
    """What host code can observe of autograd in one training step, devices named as they appear."""
    seen = []

    def state(name, t):
        grad = t.grad if t.is_leaf else None  # a non-leaf's .grad: None, and a warning
        seen.append((name, t.requires_grad, t.is_leaf, t.grad_fn is None, t.device.type,
                     None if grad is None else tuple(grad.shape), None if grad is None else grad.device.type))

    x = torch.randn(4, 8, device=device, requires_grad=True)
    w = torch.ones(8, device=device).requires_grad_()
    b = torch.zeros(8, device=device)
    b.requires_grad = True
    for name, t in ("x", x), ("w", w), ("b", b):
        state(name, t)
    h = x * 2 + b
    state("h", h)
    y = Probe.apply(h, w)
    state("y", y)
    y.backward(torch.ones_like(y))
    for name, t in ("x", x), ("w", w), ("b", b):
        state(f"{name} after backward", t)
    seen.append(("the same .grad on every read", x.grad is x.grad))
    with torch.no_grad():
        state("under no_grad", x * 2)
    with torch.inference_mode():
        z = x * 2
        seen.append(("under inference_mode", z.requires_grad, z.is_inference()))
    (g,) = torch.autograd.grad((x * x).sum(), x)
    seen.append(("torch.autograd.grad", tuple(g.shape), g.device.type, g.requires_grad))
    c = h.detach()
    seen.append(("in place and contiguous give the tensor itself", c.add_(1) is c, c.contiguous() is c))
    layer = torch.nn.Linear(8, 3, device=device)
    optimizer = torch.optim.Adam(layer.parameters(), lr=0.1)
    layer(x).square().mean().backward()
    state("weight", layer.weight)
    optimizer.step()
    optimizer.zero_grad()
    state("weight after a step", layer.weight)
    seen.append(("a Parameter", isinstance(layer.weight, torch.nn.Parameter),
                 "exp_avg" in optimizer.state[layer.weight]))
    twin = copy.deepcopy(layer)
    twin(x).sum().backward()
    state("weight of a deep copy", twin.weight)
    seen.append(("a copy's own", twin.weight is not layer.weight, isinstance(twin.weight, torch.nn.Parameter)))
    x.grad = None
    state("x after .grad = None", x)
    seen += Probe.seen
    Probe.seen.clear()
    return seen


def _named(seen: list, device_type: str) -> list:
    return [tuple("DEVICE" if v == device_type else v for v in row) for row in seen]


@pytest.mark.parametrize("program_device, dry_run", [("cuda", False), ("cuda", True), ("meta", True)])
def test_server_tensors_have_the_autograd_state_plain_tensors_have(program_device, dry_run):
    """requires_grad (factory, requires_grad_(), the attribute), grad_fn, .grad, a Function's forward and
    backward, no_grad, inference_mode, torch.autograd.grad, nn.Linear, an Adam step and a deep copy of
    the model: what host code sees on a ServerTensor is what it sees on plain CPU tensors, with cuda for
    the device."""
    expected = _named(training_step("cpu"), "cpu")
    with server_tensors("meta", meta_as_cuda=dry_run):
        seen = _named(training_step(program_device), "cuda")
    assert seen == expected
    assert ("backward sees", "DEVICE", True, "DEVICE", (4, 8)) in seen  # the gradient reached it as the server's


def test_gradients_are_server_tensors_of_the_tensor_they_belong_to():
    with server_tensors("meta"):
        x = torch.randn(3, 5, device="cuda", requires_grad=True)
        (x * x).sum().backward()
        assert type(x) is ServerTensor and type(x.grad) is ServerTensor and x.grad.device == torch.device("cuda", 0)
        assert x.grad.as_subclass(torch.Tensor).is_meta  # a fake: no memory


# --------------------------------------------------------------------------- a library's training branches


def _train(sizes, device: str = "cuda"):
    def step(lib):
        for n in sizes:
            for train in (True, False):
                lib.train_step(torch.randn(n, device=device, requires_grad=train))

    return step


@pytest.mark.parametrize("target_name", BOTH)
def test_a_spec_with_requires_grad_warms_the_training_keys_the_server_asks_for(tmp_path, monkeypatch, target_name):
    """``requires_grad: $train``: the forward's HAS_GRAD variant and the backward kernel, whose grid and
    per-program count come from the SM count of the gradient's device, are the server's keys."""
    monkeypatch.syspath_prepend(str(LIBS))
    spec = tmp_path / "train.yaml"
    spec.write_text("launcher: training_branch:train_step\ncapture: all\naxes: {n: [37, 40000], train: [true, false]}\n"
                    "args: [{tensor: [$n], dtype: float32, requires_grad: $train}]\n")
    planned = planned_keys(spec, target_name)
    assert planned == server_keys(tmp_path, target_name, "training_branch", _train((37, 40000)))
    kernels = [v.kernel.rsplit(".", 1)[-1] for v in plan(load_specs([spec]), TARGETS[target_name]).variants.values()]
    assert sorted(kernels) == ["scale_backward"] * 2 + ["scale_forward"] * 4  # 2 size classes; HAS_GRAD true, false

    spec.write_text(spec.read_text().replace("requires_grad: $train", "requires_grad: false"))
    assert len(planned_keys(spec, target_name)) == 2  # without it: the inference variants only, the silent miss


@pytest.mark.parametrize("device", ["cuda", "meta"])
def test_a_dry_run_record_of_a_training_step_records_the_servers_launches(tmp_path, monkeypatch, device):
    monkeypatch.syspath_prepend(str(LIBS))
    plan_file = dry_run_plan(tmp_path, "sm90", "training_branch", _train((37, 40000), device))
    assert planned_keys(plan_file, "sm90") == server_keys(tmp_path, "sm90", "training_branch", _train((37, 40000)))


# --------------------------------------------------------------------------- the spec field


@pytest.mark.parametrize("value, words", [
    ("maybe", "args.0.requires_grad: 'maybe': must be true, false or a $expression"),
    ("$n", "args.0.requires_grad: $n gives 8: must be true or false"),
])
def test_a_requires_grad_that_is_no_boolean_is_named_with_file_line_field_and_value(tmp_path, value, words):
    spec = tmp_path / "bad.yaml"
    spec.write_text(f"launcher: os.path:join\naxes: {{n: [8]}}\nargs:\n  - {{tensor: [$n], dtype: float32, "
                    f"requires_grad: {value}}}\n")
    with pytest.raises(SpecError) as raised:
        load_specs([spec])
    assert str(raised.value) == f"{spec}:4: {words}"


def test_an_integer_tensor_cannot_require_grad(tmp_path):
    spec = tmp_path / "bad.yaml"
    spec.write_text("launcher: os.path:join\nargs:\n  - {tensor: [4], dtype: int64, requires_grad: true}\n")
    with pytest.raises(SpecError, match=r"bad.yaml:3: args.0.requires_grad: a int64 tensor cannot require grad: "
                                        "only floating-point and complex tensors can"):
        load_specs([spec])


# --------------------------------------------------------------------------- what a dry run cannot do


READS = {".item()": "t.sum().item()", ".tolist()": "t.tolist()", ".cpu()": "t.cpu()", ".to('cpu')": "t.to('cpu')",
         "torch.equal": "torch.equal(t, t)"}


@pytest.mark.parametrize("what", READS)
def test_a_dry_run_that_reads_a_device_tensor_names_the_programs_line_and_what_to_do(tmp_path, what):
    program = tmp_path / "reading_program.py"
    program.write_text(f"import torch\n\n\ndef run():\n    t = torch.ones(4, device='meta')\n    {READS[what]}\n")
    spec = importlib.util.spec_from_file_location(f"reading_program_{tmp_path.name}", program)
    spec.loader.exec_module(module := importlib.util.module_from_spec(spec))

    with server_tensors("meta", meta_as_cuda=True), pytest.raises(DataDependentError) as raised:
        module.run()
    assert str(raised.value) == (
        f"{program}:6: {what} reads the values of a device tensor ([{'' if what == '.item()' else 4}] float32), which "
        "a dry run does not have: record this program on a machine with the GPU (tritonwarm record without "
        "--target), or leave this read out of a dry run")
    with server_tensors("meta", meta_as_cuda=True):
        t = torch.ones(4, device="cuda")
        assert torch.ones(4).tolist() == [1.0] * 4 and t.to("meta").shape == (4,)  # host tensors, other devices


# --------------------------------------------------------------------------- partial plans


def test_a_plan_recorded_from_a_failed_program_fails_planning_until_recorded_again(tmp_path):
    rows = [{"kernel": "tritonwarm.kernels.rms_norm:rms_norm_kernel", "call": {}}]
    plan_file = tmp_path / "prog.plan.yaml"
    write_plan(rows, plan_file, ["python", "prog.py"], "sm90", partial="the program exited with status 1")
    the_plan = plan(load_specs([plan_file]), TARGETS["sm90"])
    assert f"{plan_file}: a partial plan (the program exited with status 1): it lacks launches the program makes; " \
           "record the program again" in the_plan.errors
    assert not check(the_plan, tmp_path / "cache").ok

    plan_file.write_text(plan_file.read_text().replace("partial: the program", "partial: 3 #"))
    with pytest.raises(SpecError, match="partial: 3: must be a string"):
        load_specs([plan_file])


PROGRAM = textwrap.dedent("""
    import sys
    import torch
    import triton
    import triton.language as tl


    @triton.jit
    def double(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) * 2, mask=offs < n)


    if __name__ == "__main__":
        for n in (100, 4096):
            x = torch.randn(n, device="cuda")
            y = torch.empty_like(x)
            double[(triton.cdiv(n, 128),)](x, y, n, BLOCK=128)
            print(y.sum().item())  # logging: a read of the device's data
    """)


@pytest.mark.slow
def test_a_dry_run_stops_at_a_read_in_one_line_and_its_partial_plan_fails_warmup_and_check(tmp_path, run_cli):
    program, plan_file, cache = tmp_path / "prog.py", tmp_path / "prog.plan.yaml", tmp_path / "cache"
    program.write_text(PROGRAM)
    line = PROGRAM.splitlines().index("        print(y.sum().item())  # logging: a read of the device's data") + 1
    proc = run_cli("record", "-o", plan_file, "--target", "sm90", "--", sys.executable, program, rc=1)
    told = [t for t in proc.stderr.splitlines() if "dry run stopped" in t or "Traceback" in t]
    assert told == [f"tritonwarm record: the dry run stopped at {program}:{line}: .item() reads the values of a "
                    "device tensor ([] float32), which a dry run does not have: record this program on a machine "
                    "with the GPU (tritonwarm record without --target), or leave this read out of a dry run"]
    assert proc.stderr.splitlines()[-1] == (
        f"recorded 1 launches of 1 kernels (dry run for sm90) -> {plan_file}; the program exited with status 1: the "
        "plan holds what it launched before; the plan is marked partial: warmup and check of it fail until the "
        "program is recorded again")
    for command in (["warmup", "--jobs", "1"], ["check"]):
        proc = run_cli(*command, plan_file, "--target", "sm90", "--cache-dir", cache, rc=1)
        assert "a partial plan (the program exited with status 1)" in proc.stdout + proc.stderr

    program.write_text(PROGRAM.replace("print(y.sum().item())", "print(y.shape)"))
    run_cli("record", "-o", plan_file, "--target", "sm90", "--", sys.executable, program, rc=0)
    assert "partial" not in plan_file.read_text()
    run_cli("warmup", plan_file, "--target", "sm90", "--cache-dir", cache, "--jobs", "1", rc=0)
    run_cli("check", plan_file, "--target", "sm90", "--cache-dir", cache, rc=0)


# --------------------------------------------------------------------------- Liger-Kernel, unmodified


@pytest.fixture
def liger():
    """Liger-Kernel's ops package, by name (the test extra installs it; not imported here: the played
    server and the dry run import it under the target's answers, as the serving process does)."""
    if importlib.util.find_spec("liger_kernel") is None:
        if os.environ.get("CI") == "true":  # the test extra installs it: CI runs these tests
            pytest.fail("liger-kernel is not installed: pip install -e '.[test]'")
        pytest.skip("liger-kernel is not installed (pip install -e '.[test]')")
    return "liger_kernel.ops"


LIGER_ROWS = [(1, 256), (37, 2048), (300, 4096)]  # rows, hidden
LIGER_ROPE = [(1, 8, 2, 37, 64), (2, 32, 8, 128, 128)]  # batch, q heads, kv heads, sequence, head dim


def liger_training(device: str):
    """A training step through Liger's RMSNorm, SwiGLU and RoPE Functions, as a user's program calls
    them: inputs that require grad, forward, backward (seeded, and through torch's own ops)."""

    def step(ops):
        for dtype in (torch.bfloat16, torch.float32):
            for rows, hidden in LIGER_ROWS:
                x = torch.randn(rows, hidden, dtype=dtype, device=device, requires_grad=True)
                w = torch.ones(hidden, dtype=dtype, device=device).requires_grad_()
                y = ops.rms_norm.LigerRMSNormFunction.apply(x, w, 1e-6)
                y.backward(torch.randn_like(y))
                a, b = (torch.randn(rows, hidden, dtype=dtype, device=device, requires_grad=True) for _ in "ab")
                ops.swiglu.LigerSiLUMulFunction.apply(a, b).float().pow(2).mean().backward()
                assert x.grad.shape == x.shape and w.grad.shape == w.shape and b.grad.shape == b.shape
            for batch, heads, kv_heads, seq, head_dim in LIGER_ROPE:
                q = torch.randn(batch, heads, seq, head_dim, dtype=dtype, device=device, requires_grad=True)
                k = torch.randn(batch, kv_heads, seq, head_dim, dtype=dtype, device=device, requires_grad=True)
                cos, sin = (torch.randn(1, seq, head_dim, dtype=dtype, device=device) for _ in "cs")
                q2, k2 = ops.rope.LigerRopeFunction.apply(q, k, cos, sin)
                (q2.float().sum() + k2.float().sum()).backward()
                assert q.grad.shape == q.shape and k.grad.shape == k.shape

    return step


@pytest.mark.parametrize("device", ["meta", pytest.param("cuda", marks=pytest.mark.slow)])
def test_a_dry_run_record_of_liger_functions_forward_and_backward_is_the_servers_plan(tmp_path, liger, device):
    plan_file = dry_run_plan(tmp_path, "sm90", liger, liger_training(device))
    planned = planned_keys(plan_file, "sm90")
    assert planned == server_keys(tmp_path, "sm90", liger, liger_training("cuda"))
    kernels = {v.kernel.rsplit(".", 1)[-1] for v in plan(load_specs([plan_file]), TARGETS["sm90"]).variants.values()}
    assert {"_rms_norm_backward_kernel", "_swiglu_backward_kernel", "_triton_rope"} <= kernels


CROSS_ENTROPY_SPEC = """
launcher: liger_kernel.ops.cross_entropy:LigerCrossEntropyFunction.apply
capture: all
axes: {train: [true, false], dtype: [bfloat16, float32]}
groups: {size: {rows: [4, 37], vocab: [1000, 32000]}}
args:
  - {tensor: [$rows, $vocab], dtype: $dtype, requires_grad: $train}
  - {tensor: [$rows], dtype: int64, values: '$[3] * rows'}
  - null
---
launcher: liger_kernel.ops.cross_entropy:cross_entropy_backward
capture: all
axes: {dtype: [bfloat16, float32]}
groups: {size: {rows: [4, 37], vocab: [1000, 32000]}}
args: [{tensor: [$rows, $vocab], dtype: $dtype}, {tensor: [], dtype: $dtype, values: [2.0]}]
"""


def cross_entropy_training(ops):
    """Liger's cross entropy on logits that require grad (training) or not, and a scaled loss's backward."""
    for dtype in (torch.bfloat16, torch.float32):
        for rows, vocab in ((4, 1000), (37, 32000)):
            for train in (True, False):
                logits = torch.randn(rows, vocab, dtype=dtype, device="cuda", requires_grad=train)
                target = torch.full((rows,), 3, device="cuda")
                loss = ops.cross_entropy.LigerCrossEntropyFunction.apply(logits, target, None)[0]
                if train:
                    (loss * 2.0).backward()
                    assert logits.grad.shape == logits.shape


@pytest.mark.slow
@pytest.mark.parametrize("target_name", BOTH)
def test_a_cross_entropy_spec_with_requires_grad_warms_the_servers_training_keys(tmp_path, liger, target_name):
    spec = tmp_path / "cross_entropy.yaml"
    spec.write_text(CROSS_ENTROPY_SPEC)
    server = server_keys(tmp_path, target_name, liger, cross_entropy_training)
    the_plan = plan(load_specs([spec]), TARGETS[target_name])
    assert not the_plan.errors and set(the_plan.variants) == server
    assert {v.args.get("HAS_GRADIENTS") for v in the_plan.variants.values()} == {"=True", "=False", None}

    spec.write_text(CROSS_ENTROPY_SPEC.replace("requires_grad: $train", "requires_grad: false"))
    assert planned_keys(spec, target_name) < server  # the training variants: what a spec could not say


@pytest.mark.slow
def test_a_dry_run_that_liger_stops_with_a_read_names_the_program_and_the_librarys_line(tmp_path, liger):
    program = tmp_path / "ce_program.py"
    program.write_text(textwrap.dedent("""
        import torch
        from liger_kernel.ops.cross_entropy import LigerCrossEntropyFunction


        def run():
            logits = torch.randn(4, 1000, device="cuda", requires_grad=True)
            return LigerCrossEntropyFunction.apply(logits, torch.full((4,), 3, device="cuda"), None)
        """))
    spec = importlib.util.spec_from_file_location(f"ce_program_{tmp_path.name}", program)
    with recording(tmp_path / "record.jsonl", "sm90"), pytest.raises(DataDependentError) as raised:
        spec.loader.exec_module(module := importlib.util.module_from_spec(spec))
        module.run()
    message = str(raised.value)
    assert message.startswith(f"{program}:8 (at ") and "liger_kernel/ops/cross_entropy.py:" in message
    assert message.endswith("or warm that library call from a spec that gives the tensor's values (values:)")


@pytest.mark.slow
@pytest.mark.parametrize("device", ["cuda", "meta"])
def test_tritonwarm_record_of_a_training_program_records_every_launch_the_server_makes(tmp_path, liger, run_cli,
                                                                                    device):
    """``examples/adopt_liger_train_prog.py``: stopped at its first backward before; now the dry run's plan is
    the played server's launches, every one (as it runs on the server, and with ``--device meta``)."""
    from tritonwarm.examples.adopt_liger_train_prog import run

    plan_file = tmp_path / "train.plan.yaml"
    proc = run_cli("record", "-o", plan_file, "--target", "sm90", "--", sys.executable, "-m",
                   "tritonwarm.examples.adopt_liger_train_prog", "--device", device, rc=0)
    assert "partial" not in proc.stdout + plan_file.read_text()
    planned = planned_keys(plan_file, "sm90")
    assert planned == server_keys(tmp_path, "sm90", liger, lambda ops: run("cuda", ops))
    assert f"recorded {len(planned)} launches of " in proc.stdout  # one key per distinct launch
