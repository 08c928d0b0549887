"""The shared pieces several modules rely on: the tracing protocol, tracing in worker processes,
entry folder names and older manifests, and messages that name what the user wrote."""

import json
import textwrap

import pytest
from tritonwarm.jit import TARGETS
from tritonwarm.jit.pipeline.specs import load_specs

SPEC = """
kernel: tritonwarm.launchers.rms_norm:rms_norm
axes:
  num_tokens: {range: [1, 4096], collapse: true}
  dtype: [float16, bfloat16]
args:
  x: {tensor: [$num_tokens, 2048], dtype: $dtype}
  weight: {tensor: [2048], dtype: $dtype}
"""
SILU = """
kernel: tritonwarm.launchers.activation:silu_and_mul
axes:
  n: {range: [1, 512], collapse: true}
args:
  x: {tensor: [$n, 4096], dtype: bfloat16}
"""


@pytest.fixture
def specs(tmp_path):
    (tmp_path / "a.yaml").write_text(SPEC)
    (tmp_path / "b.yaml").write_text(SILU)
    return load_specs([tmp_path])


def test_trace_rows_credits_launches_to_rows_and_reports_failures_and_empty_rows():
    import torch
    from tritonwarm.jit import fake_tensor
    from tritonwarm.jit.pipeline.plan import trace_rows
    from tritonwarm.launchers.rms_norm import rms_norm

    def boom():
        raise ValueError("needs real data")

    x, w = fake_tensor((4, 1024), torch.float16), fake_tensor((1024,), torch.float16)
    the_plan, cap = trace_rows(TARGETS["sm90"], "tritonwarm.launchers.rms_norm",
                               [("norm", lambda: rms_norm(x, w)), ("nothing", lambda: None), ("bad", boom)])
    assert the_plan.rows == 3 and len(the_plan.variants) == 1
    assert cap.keys_of("norm") == set(the_plan.variants) and cap.keys_of("nothing") == set()
    assert the_plan.unreachable == ["nothing"]
    assert the_plan.errors == ["bad: the launcher failed on fake inputs: needs real data"]
    variant = next(iter(the_plan.variants.values()))
    assert variant.rows == ["norm"] and variant.import_path == "tritonwarm.launchers.rms_norm"
    assert cap.current_row is None  # the row context is left


@pytest.mark.slow
def test_tracing_in_worker_processes_gives_the_serial_plan(specs):
    from tritonwarm.jit.pipeline.plan import plan_targets
    from tritonwarm.jit.pipeline.pool import worker_pool

    targets = [TARGETS["sm90"], TARGETS["gfx942"]]
    serial = plan_targets(specs, targets)
    with worker_pool(2, targets) as pool:
        pooled = plan_targets(specs, targets, pool=pool)
    for name in ("sm90", "gfx942"):
        assert json.dumps(pooled[name].to_json(), sort_keys=True) == json.dumps(serial[name].to_json(), sort_keys=True)
        assert serial[name].variants and serial[name].rows == 9  # 3 classes x 2 dtypes, 3 classes


def test_manifests_without_entry_dir_still_read(tmp_path):
    from tritonwarm.jit.cache import Manifest, entry_dir_name
    from tritonwarm.jit.pipeline.plan import plan

    the_plan = plan(load_specs([_write(tmp_path, SILU)]), TARGETS["sm90"], verify_collapse=False)
    variant = next(iter(the_plan.variants.values()))
    manifest = Manifest(tmp_path / "cache", "sm90")
    manifest.dir.mkdir(parents=True)
    old = variant.to_json()  # an entry as an older tritonwarm recorded it: no entry_dir
    manifest.path.write_text(json.dumps({"format": 1, "target": "sm90", "variants": {variant.cache_hash: old}}))
    entry = manifest.read()[variant.cache_hash]
    assert entry["entry_dir"] == variant.entry_dir == entry_dir_name(variant.cache_hash)


def test_an_expression_error_names_what_was_written_not_a_class():
    from tritonwarm.jit.pipeline.specs import Expr, SpecError

    where = SpecError("s.yaml", 3, "args.n", "")
    for text, words in [("a.b", "attribute access (a.b)"), ("x[0]", "indexing (a[i])"), ("1 << 3", "<<"),
                        ("[i for i in x]", "a comprehension")]:
        with pytest.raises(SpecError) as e:
            Expr(text, {"a", "x"}, where)
        assert str(e.value) == f"s.yaml:3: args.n: {words} is not allowed in expression {text!r}"


def _write(tmp_path, text):
    path = tmp_path / "spec.yaml"
    path.write_text(textwrap.dedent(text))
    return path


def test_an_engine_plan_comes_from_the_plan_store_when_nothing_changed(tmp_path, monkeypatch):
    import argparse

    from tritonwarm.cli.common import plan_all
    from tritonwarm.engine import plan as engine_plan_module

    args, target = argparse.Namespace(engine_config="tiny"), TARGETS["sm90"]
    first = plan_all(args, [], [target], cache_dir=tmp_path, verify_collapse=False)["sm90"]
    assert first.variants and first.rows

    def traced_again(*a, **k):
        raise AssertionError("the engine was traced again")

    monkeypatch.setattr(engine_plan_module, "engine_plan", traced_again)
    again = plan_all(args, [], [target], cache_dir=tmp_path, verify_collapse=False)["sm90"]
    assert json.dumps(again.to_json(), sort_keys=True) == json.dumps(first.to_json(), sort_keys=True)
    with pytest.raises(AssertionError, match="traced again"):  # --replan: no store, traced
        plan_all(args, [], [target], cache_dir=None, verify_collapse=False)


@pytest.mark.slow
def test_a_pooled_warmup_of_several_targets_writes_what_a_serial_one_writes(tmp_path, capsys):
    from tritonwarm.cli import main
    from tritonwarm.jit.cache import Manifest

    spec = _write(tmp_path, SILU)
    for jobs in ("1", "2"):
        rc = main(["warmup", str(spec), "--target", "sm90,gfx942", "--cache-dir", str(tmp_path / jobs), "--jobs", jobs,
                   "--json"])
        assert rc == 0, capsys.readouterr().err
        report = json.loads(capsys.readouterr().out)
        assert report["compiled"] == report["planned"] == 2 and report["trace_seconds"] >= 0
    for target in ("sm90", "gfx942"):
        serial, pooled = (Manifest(tmp_path / jobs, target).read() for jobs in ("1", "2"))
        assert {k: v["files"] for k, v in serial.items()} == {k: v["files"] for k, v in pooled.items()} != {}
