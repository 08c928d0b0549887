"""Disk use and pruning, and binary-only entries that Triton's runtime still loads."""

import json

import pytest
from tritonwarm.jit import TARGETS
from tritonwarm.jit.cache import Manifest
from tritonwarm.jit.core.dispatch_record import write_record
from tritonwarm.jit.pipeline.check import check
from tritonwarm.jit.pipeline.plan import plan
from tritonwarm.jit.pipeline.specs import load_specs
from tritonwarm.jit.pipeline.warmup import warm


@pytest.fixture
def warmed(tmp_path, dtypes_spec_file):
    spec = dtypes_spec_file
    cache = tmp_path / "cache"
    warm(plan(load_specs([spec]), TARGETS["sm90"]), cache)
    return spec, cache


@pytest.mark.slow
def test_du_counts_variants_and_bytes(run_cli, warmed):
    _, cache = warmed
    usage = json.loads(run_cli("du", "--cache-dir", cache, "--json", rc=0).stdout)
    [row] = usage["kernels"]
    assert row["target"] == "sm90" and row["variants"] == 2 and row["bytes"] > 10_000
    assert usage["total_bytes"] >= row["bytes"]


@pytest.mark.slow
def test_prune_unplanned_and_other_versions(run_cli, warmed, tmp_path):
    spec, cache = warmed
    narrower = tmp_path / "fp16_only.yaml"
    narrower.write_text(spec.read_text().replace("[float16, bfloat16]", "[float16]"))
    dry = json.loads(run_cli("prune", narrower, "--unplanned", "--cache-dir", cache, "--dry-run", "--json",
                             rc=0).stdout)
    assert len(dry["removed"]) == 1 and len(Manifest(cache, "sm90").read()) == 2  # dry run removes nothing
    done = json.loads(run_cli("prune", narrower, "--unplanned", "--cache-dir", cache, "--json", rc=0).stdout)
    [gone] = done["removed"]
    assert not (cache / gone["entry_dir"]).exists() and len(Manifest(cache, "sm90").read()) == 1
    assert check(plan(load_specs([narrower]), TARGETS["sm90"]), cache).ok

    manifest = Manifest(cache, "sm90")
    [(key, entry)] = manifest.read().items()
    manifest.update({key: {**entry, "triton_version": "2.0.0"}})
    done = json.loads(run_cli("prune", "--other-versions", "--cache-dir", cache, "--json", rc=0).stdout)
    assert [d["why"] for d in done["removed"]] == ["compiled by Triton 2.0.0"]
    run_cli("prune", "--cache-dir", cache, rc=2)  # no criterion: bad input


@pytest.mark.slow
def test_prune_what_a_dispatch_record_never_used(run_cli, warmed, tmp_path):
    _, cache = warmed
    entries = Manifest(cache, "sm90").read()
    kept = next(iter(entries))
    record = tmp_path / "record.jsonl"
    e = entries[kept]
    write_record(record, [{"kernel": e["kernel"], "target": "sm90", "variant": e["id"], "cache_hash": kept,
                           "hit": True, "args": e["args"], "launches": 1}])
    done = json.loads(run_cli("prune", "--unused", record, "--cache-dir", cache, "--json", rc=0).stdout)
    assert len(done["removed"]) == 1 and list(Manifest(cache, "sm90").read()) == [kept]
    record.write_text("not json\n")
    assert "record.jsonl:1" in run_cli("prune", "--unused", record, "--cache-dir", cache, rc=2).stderr


@pytest.mark.slow
def test_binary_only_entries_are_smaller_and_still_hit(tmp_path, dtypes_spec_file, compile_counter, rms_norm_runtime):
    spec = dtypes_spec_file
    spec.write_text(spec.read_text().replace("[float16, bfloat16]", "[bfloat16]"))
    full, slim = tmp_path / "full", tmp_path / "slim"
    specs = load_specs([spec])
    warm(plan(specs, TARGETS["sm90"]), full)
    warm(plan(specs, TARGETS["sm90"]), slim, binary_only=True)
    assert not list(slim.glob("*/*.ptx")) and list(slim.glob("*/*.cubin")) and list(full.glob("*/*.ptx"))
    size = lambda d: sum(p.stat().st_size for p in d.glob("*/*") if p.suffix != ".so")  # noqa: E731 - kernels only
    assert size(slim) < size(full) / 2
    before = compile_counter.count
    rms_norm_runtime(TARGETS["sm90"], slim, 8, fused=False)
    assert compile_counter.count == before  # Triton loads the binary-only entry without compiling
