"""Warm-up split across machines: shards 1/4..4/4, each warmed into its own cache and bundled, merge
into exactly one full warm-up's bundle. Manifest rows compare byte for byte except ``compile_seconds``,
a wall-clock measurement that differs between any two runs (two full warm-ups too)."""

import gzip
import io
import json
import tarfile

import pytest
from tritonwarm.cli import main
from tritonwarm.jit import TARGETS
from tritonwarm.jit.cache.bundle import HEADER_NAME, install, read_header
from tritonwarm.jit.core.trace import Variant
from tritonwarm.jit.pipeline.check import check
from tritonwarm.jit.pipeline.plan import plan
from tritonwarm.jit.pipeline.shard import assign, parse_shard, recorded_seconds, shard_plan
from tritonwarm.jit.pipeline.specs import load_specs

SPEC = """
kernel: tritonwarm.launchers.rms_norm:rms_norm
axes:
  num_tokens: [16]
  hidden: [1024, 2048, 4096, 8192]
  fused: [false, true]
args:
  x: {tensor: [$num_tokens, $hidden], dtype: bfloat16}
  weight: {tensor: [$hidden], dtype: bfloat16}
  eps: 1.0e-6
  residual: {tensor: [$num_tokens, $hidden], dtype: bfloat16, when: $fused}
"""


def _members(path):
    with tarfile.open(path) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers()}


def _without_seconds(rows):
    return {h: json.dumps({k: v for k, v in row.items() if k != "compile_seconds"}, sort_keys=True)
            for h, row in rows.items()}


@pytest.mark.slow
def test_four_shards_merged_equal_one_full_warmup(tmp_path, capsys, served_from_bundle):
    spec = tmp_path / "rms.yaml"
    spec.write_text(SPEC)
    common = [str(spec), "--target", "sm90", "-j1"]
    full = tmp_path / "full"
    assert main(["warmup", *common, "--cache-dir", str(full)]) == 0
    assert main(["bundle", "create", str(tmp_path / "full.tar.gz"), str(spec), "--target", "sm90",
                 "--cache-dir", str(full)]) == 0
    shards = []
    for index in range(1, 5):
        cache = tmp_path / f"shard{index}"
        assert main(["warmup", *common, "--cache-dir", str(cache), "--shard", f"{index}/4"]) == 0
        out = tmp_path / f"shard{index}.tar.gz"
        assert main(["bundle", "create", str(out), str(spec), "--target", "sm90", "--cache-dir", str(cache),
                     "--shard", f"{index}/4"]) == 0
        shards.append(out)
    assert main(["bundle", "merge", str(tmp_path / "merged.tar.gz"), *map(str, shards)]) == 0

    parts = [set(read_header(s)["targets"]["sm90"]) for s in shards]
    assert all(len(p) == 2 for p in parts)  # 8 variants, 2 per shard, no overlap
    whole, merged = read_header(tmp_path / "full.tar.gz"), read_header(tmp_path / "merged.tar.gz")
    assert set().union(*parts) == set(whole["targets"]["sm90"]) and len(whole["targets"]["sm90"]) == 8
    assert merged["fingerprint"] == whole["fingerprint"]
    assert _without_seconds(merged["targets"]["sm90"]) == _without_seconds(whole["targets"]["sm90"])
    for rows in (merged["targets"]["sm90"], whole["targets"]["sm90"]):
        assert all(row["compile_seconds"] > 0 for row in rows.values())
    full_files, merged_files = _members(tmp_path / "full.tar.gz"), _members(tmp_path / "merged.tar.gz")
    full_files.pop(HEADER_NAME), merged_files.pop(HEADER_NAME)
    assert merged_files == full_files  # every entry's every file, byte for byte

    # the next split can be balanced by the times this warm-up recorded: still a partition of the plan
    times = recorded_seconds(tmp_path / "full.tar.gz")
    assert set(times) == set(whole["targets"]["sm90"]) and all(t > 0 for t in times.values())
    the_plan = plan(load_specs([spec]), TARGETS["sm90"])
    timed = [set(shard_plan(the_plan, i, 4, times).variants) for i in range(1, 5)]
    assert sum(map(len, timed)) == 8 and set().union(*timed) == set(the_plan.variants)

    served = tmp_path / "served"
    install(tmp_path / "merged.tar.gz", served, compare_environment=False)
    assert served_from_bundle(check(plan(load_specs([spec]), TARGETS["sm90"]), served))

    # the split does not depend on what is cached: on the full cache shard 2 is the same two variants
    capsys.readouterr()
    assert main(["warmup", *common, "--cache-dir", str(full), "--shard", "2/4", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert (result["planned"], result["compiled"], result["cached"]) == (2, 0, 2)


@pytest.mark.slow
def test_merge_refuses_another_environment(tmp_path, capsys):
    spec = tmp_path / "rms.yaml"
    spec.write_text(SPEC.replace("[1024, 2048, 4096, 8192]", "[1024]").replace("[false, true]", "[false]"))
    assert main(["warmup", str(spec), "--target", "sm90", "-j1", "--cache-dir", str(tmp_path / "c")]) == 0
    good = tmp_path / "good.tar.gz"
    assert main(["bundle", "create", str(good), str(spec), "--target", "sm90", "--cache-dir", str(tmp_path / "c")]) == 0
    members = _members(good)
    header = json.loads(members[HEADER_NAME])
    header["fingerprint"]["env"]["TRITON_DEFAULT_FP_FUSION"] = "0"
    members[HEADER_NAME] = json.dumps(header).encode()
    other = tmp_path / "other.tar.gz"
    with open(other, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb") as gz, \
            tarfile.open(fileobj=gz, mode="w|") as t:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))
    capsys.readouterr()
    assert main(["bundle", "merge", str(tmp_path / "m.tar.gz"), str(good), str(other)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "TRITON_DEFAULT_FP_FUSION" in err and "other.tar.gz" in err
    assert not (tmp_path / "m.tar.gz").exists()


def _variants(n):
    return [Variant(kernel=f"k{i % 3}", target="sm90", key="", specialization_data="", args={}, num_warps=4,
                    num_stages=3, cache_hash=f"{i:064x}") for i in range(n)]


def test_assignment_is_a_partition_fixed_by_the_plan_alone():
    variants = _variants(23)
    for count in (1, 2, 4, 7, 30):
        shards = assign(variants, count)
        hashes = [v.cache_hash for shard in shards for v in shard]
        assert sorted(hashes) == sorted(v.cache_hash for v in variants)  # each variant exactly once
        assert max(map(len, shards)) - min(map(len, shards)) <= 1
        again = assign(list(reversed(variants)), count)  # the order the plan lists them in does not matter
        assert [[v.cache_hash for v in s] for s in again] == [[v.cache_hash for v in s] for s in shards]


def test_recorded_times_balance_the_shards():
    variants = _variants(9)
    seconds = {variants[0].cache_hash: 8.0, **{v.cache_hash: 1.0 for v in variants[1:]}}
    shards = assign(variants, 2, seconds)
    heavy = next(s for s in shards if variants[0] in s)
    assert len(heavy) == 1 and len(next(s for s in shards if s is not heavy)) == 8  # 8 s against 8 × 1 s
    # unknown times: the kernel's median (k0 variants are 0, 3, 6: one known at 8 s, others 1 s)
    partial = {variants[0].cache_hash: 8.0, variants[3].cache_hash: 2.0}
    assert sum(len(s) for s in assign(variants, 3, partial)) == 9


def test_shard_plan_keeps_findings_and_reads_times(tmp_path):
    from tritonwarm.jit.pipeline.plan import Plan

    variants = _variants(5)
    the_plan = Plan(TARGETS["sm90"], {v.cache_hash: v for v in variants}, rows=5, errors=["row: boom"])
    parts = [shard_plan(the_plan, i, 2) for i in (1, 2)]
    assert sorted(len(p.variants) for p in parts) == [2, 3] and all(p.errors == ["row: boom"] for p in parts)
    manifest = tmp_path / "manifest-sm90.json"
    manifest.write_text(json.dumps({"format": 1, "variants": {variants[0].cache_hash: {"compile_seconds": 3.5}}}))
    assert recorded_seconds(manifest) == {variants[0].cache_hash: 3.5}
    fingerprint = tmp_path / "serving.json"  # the wrong file: refused, not read as no times at all
    fingerprint.write_text(json.dumps({"format": 1, "triton": {}}))
    with pytest.raises(ValueError, match="serving.json: not a manifest"):
        recorded_seconds(fingerprint)


@pytest.mark.slow
@pytest.mark.parametrize("text", ["0/4", "5/4", "x", "1/0", ""])
def test_bad_shard_is_one_line(text, tmp_path, capsys):
    with pytest.raises(ValueError, match="--shard"):
        parse_shard(text)
    assert main(["warmup", "--target", "sm90", "--cache-dir", str(tmp_path), "--shard", text]) == 2
    assert capsys.readouterr().err.count("\n") == 1
