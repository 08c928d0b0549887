"""Fast tests of the checks the core makes for a user, each beside the slow scenario that covers it end
to end: a binary whose checksum does not match is corrupt, a cache copied to another path is named as
copied, concurrent warm-ups merge their spec rows into one manifest record without losing any."""

import json
import os
import shutil
import threading
from pathlib import Path

import pytest
from tritonwarm.jit import TARGETS
from tritonwarm.jit.cache import entry_files
from tritonwarm.jit.cache.layout import entry_dir_name, file_sha256
from tritonwarm.jit.cache.manifest import Manifest, files_match_record
from tritonwarm.jit.cache.records import metadata_problem, plain_file_name, record_problem
from tritonwarm.jit.pipeline.check import check
from tritonwarm.jit.pipeline.plan import plan
from tritonwarm.jit.pipeline.specs import load_specs
from tritonwarm.jit.pipeline.warmup import warm
from tritonwarm.jit.serving.miss import COPIED, WarmedNeighbours

SM90 = TARGETS["sm90"]
FP16 = """
kernel: tritonwarm.launchers.rms_norm:rms_norm
args:
  x: {tensor: [8, 4096], dtype: float16}
  weight: {tensor: [4096], dtype: float16}
"""


# ------------------------------------------------------------------ checksums


@pytest.fixture
def binary(tmp_path):
    path = tmp_path / "k.cubin"
    path.write_bytes(b"\x7fELF" + bytes(range(256)) * 4)
    return path


def test_files_match_what_the_manifest_recorded(binary):
    recorded = {"files": {"k.cubin": file_sha256(binary)}}
    assert files_match_record({"k.cubin": str(binary)}, recorded)
    assert files_match_record({"k.cubin": str(binary), "k.json": "/nowhere"}, recorded)  # only recorded files count
    # records older than the files' hashes say nothing to check against
    assert files_match_record({"k.cubin": str(binary)}, None)
    assert files_match_record({"k.cubin": str(binary)}, {"id": "x"})


def test_a_flipped_byte_a_missing_or_unreadable_file_does_not_match(binary, tmp_path):
    recorded = {"files": {"k.cubin": file_sha256(binary)}}
    data = bytearray(binary.read_bytes())
    data[200] ^= 0xFF
    tampered = tmp_path / "tampered.cubin"
    tampered.write_bytes(bytes(data))
    assert not files_match_record({"k.cubin": str(tampered)}, recorded)
    assert not files_match_record({}, recorded)  # the group no longer names it
    assert not files_match_record({"k.cubin": str(tmp_path / "gone.cubin")}, recorded)
    assert not files_match_record({"k.cubin": str(tmp_path)}, recorded)  # a folder where the file was
    two = {"files": {"k.cubin": file_sha256(binary), "k.json": "0" * 64}}
    assert not files_match_record({"k.cubin": str(binary), "k.json": str(binary)}, two)  # the second one differs


# ------------------------------------------------------------------ copied caches


def _entry(folder: Path, cache_hash: str, name: str, files_at: Path) -> None:
    """An entry folder whose group file names ``name``'s files under ``files_at``."""
    entry = folder / entry_dir_name(cache_hash)
    entry.mkdir(parents=True)
    (entry / f"__grp__{name}.json").write_text(json.dumps(
        {"child_paths": {f"{name}.cubin": str(files_at / f"{name}.cubin")}}))


def test_a_miss_of_an_entry_whose_group_names_another_folder_is_told_as_copied(tmp_path):
    cache, original, runtime = tmp_path / "cache", tmp_path / "original" / "xyz", {"triton": {"version": "3.9.0"}}
    cache_hash = "ab" * 32
    _entry(cache, cache_hash, "k", original)
    wanted = {"kernel": "m.k", "args": {}, "cache_hash": cache_hash, "entry_name": "k"}
    reason = WarmedNeighbours({}, {}, runtime, "sm90", cache_dir=cache).why(wanted)
    assert (reason.kind, reason.detail) == (COPIED, str(original.parent))
    assert reason.line.startswith(f"its entry is here, but names its files under {original} (Triton's group files "
                                  "hold absolute paths): this cache was copied or mounted from there: move a cache "
                                  "with bundle create / bundle install (--serve-at PATH")
    # told only from the cache's own folder: without one, or without the name of the files, nothing to read
    assert WarmedNeighbours({}, {}, runtime, "sm90").why(wanted) is None
    assert WarmedNeighbours({}, {}, runtime, "sm90", cache_dir=cache).why({**wanted, "entry_name": ""}) is None
    # an entry naming its own folder is not a copy
    here = tmp_path / "here"
    _entry(here, cache_hash, "k", here / entry_dir_name(cache_hash))
    assert WarmedNeighbours({}, {}, runtime, "sm90", cache_dir=here).why(wanted) is None
    # a server that mounts the cache at /srv/cache reads the group's paths as written
    served = Path("/srv/cache")
    mounted = tmp_path / "mounted"
    _entry(mounted, cache_hash, "k", served / entry_dir_name(cache_hash))
    assert WarmedNeighbours({}, {}, runtime, "sm90", cache_dir=mounted, serve_at=served).why(wanted) is None
    assert WarmedNeighbours({}, {}, runtime, "sm90", cache_dir=mounted).why(wanted).kind == COPIED


# ------------------------------------------------------------------ manifest rows


def _record(cache_hash: str, **fields) -> dict:
    return {"id": cache_hash[:12], "kernel": "m.k", "target": "sm90", "entry_name": "k",
            "entry_dir": entry_dir_name(cache_hash), "args": {"n": "i32"}, **fields}


def test_concurrent_writers_merge_their_rows_into_one_record(tmp_path):
    """Eight warm-ups of specs sharing a variant, each writing its own row at once: none is lost."""
    cache_hash = "cd" * 32
    barrier = threading.Barrier(8)
    errors = []

    def writer(n):
        try:
            barrier.wait()
            Manifest(tmp_path, "sm90").update({cache_hash: _record(cache_hash, rows=[f"spec{n}.yaml:0"])})
        except Exception as e:  # noqa: BLE001 (reported below)
            errors.append(e)

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    [record] = Manifest(tmp_path, "sm90").read().values()
    assert record["rows"] == [f"spec{n}.yaml:0" for n in range(8)]


def test_an_update_merges_rows_keeps_compile_time_and_drops_unnamed_environments(tmp_path):
    manifest = Manifest(tmp_path, "sm90")
    a, b = "aa" * 32, "bb" * 32
    manifest.update({a: _record(a, rows=["s.yaml:1", "s.yaml:0"], compile_seconds=3.5, environment="e1"),
                     b: _record(b, rows=["t.yaml:0"], environment="e2")},
                    environments={"e1": {"triton": {"version": "3.9.0"}}, "e2": {"triton": {"version": "3.6.0"}}})
    manifest.update({a: _record(a, rows=["s.yaml:0", "u.yaml:2"], compile_seconds=None, environment="e1")})
    read = manifest.read()
    assert read[a]["rows"] == ["s.yaml:0", "s.yaml:1", "u.yaml:2"]  # union, sorted
    assert read[a]["compile_seconds"] == 3.5  # found cached now: the time it took stays
    manifest.update({a: _record(a, rows=[], compile_seconds=1.0, environment="e1")})
    assert manifest.read()[a]["compile_seconds"] == 1.0  # compiled again: the new time
    assert set(manifest.environments()) == {"e1", "e2"}
    manifest.update(remove=[b])
    assert list(manifest.read()) == [a] and set(manifest.environments()) == {"e1"}  # e2 went with its last entry
    manifest.compact()  # the journal folded into the file a plain reader opens
    on_disk = json.loads(manifest.path.read_text())
    assert (on_disk["format"], on_disk["target"]) == (1, "sm90") and list(on_disk["variants"]) == [a]


# ------------------------------------------------------------------ records a manifest or bundle holds

H = "ef" * 32
GOOD = {"id": H[:12], "kernel": "m.k", "target": "sm90", "entry_name": "k_kernel", "entry_dir": entry_dir_name(H),
        "args": {"n": "i32"}, "cache_hash": H, "key": "K", "specialization_data": "{}", "num_warps": 4,
        "num_stages": 1, "rows": ["s.yaml:0"], "files": {"k_kernel.cubin": "0" * 64}, "resources": None,
        "compile_seconds": 1.5, "triton_version": "3.9.0", "env": {}, "environment": None,
        "constexpr_globals": {}, "autotuned": False, "shared_estimate": None}


def test_a_record_as_a_warmup_writes_it_is_trusted():
    assert record_problem(H, GOOD, "sm90") is None
    assert record_problem(H, GOOD, "sm90", complete=True, files_required=True) is None
    bare = {k: GOOD[k] for k in ("id", "kernel", "target", "entry_name", "entry_dir", "args")}
    assert record_problem(H, bare, "sm90") is None  # rows written before files were hashed
    assert record_problem(H, {**GOOD, "num_warps": 1, "num_stages": 0}, "sm90") is None  # a 1-warp kernel
    assert record_problem(H, {**GOOD, "num_warps": 1024, "num_stages": 1024}, "sm90") is None
    assert record_problem(H, {**GOOD, "compile_seconds": 2, "resources": {"registers": 32}}, "sm90") is None


@pytest.mark.parametrize(("cache_hash", "change", "expected"), [
    ("AB" * 32, {}, ("'ABABABABABABABABABAB'", "not a cache hash")),
    (H + "0", {}, (f"'{H[:20]}'", "not a cache hash")),
    (H, {"entry_dir": "../elsewhere"}, (f"{H[:16]}.entry_dir", "'../elsewhere' is not the folder of that cache hash")),
    (H, {"kernel": None}, (f"{H[:16]}.kernel", "None is not a string")),
    (H, {"args": []}, (f"{H[:16]}.args", "[] is not a table")),
    (H, {"args": {"n": 3}}, (f"{H[:16]}.args", "holds 3, which is not text")),
    (H, {"rows": "s.yaml:0"}, (f"{H[:16]}.rows", "'s.yaml:0' is not a list")),
    (H, {"rows": [7]}, (f"{H[:16]}.rows", "holds 7, which is not text")),
    (H, {"num_warps": True}, (f"{H[:16]}.num_warps", "True is not an integer")),
    (H, {"num_warps": "4"}, (f"{H[:16]}.num_warps", "'4' is not an integer")),
    (H, {"num_warps": 0}, (f"{H[:16]}.num_warps", "0 is out of range")),
    (H, {"num_warps": 1025}, (f"{H[:16]}.num_warps", "1025 is out of range")),
    (H, {"num_stages": -1}, (f"{H[:16]}.num_stages", "-1 is out of range")),
    (H, {"num_stages": 1025}, (f"{H[:16]}.num_stages", "1025 is out of range")),
    (H, {"compile_seconds": "1"}, (f"{H[:16]}.compile_seconds", "'1' is not a number")),
    (H, {"autotuned": 1}, (f"{H[:16]}.autotuned", "1 is not bool")),
    (H, {"shared_estimate": 1.5}, (f"{H[:16]}.shared_estimate", "1.5 is not an integer")),
    (H, {"target": "gfx942"}, (f"{H[:16]}.target", "'gfx942' is filed under sm90")),
    (H, {"cache_hash": "12" * 32}, (f"{H[:16]}.cache_hash", "'1212121212121212'... is not the hash it is filed under")),
    (H, {"entry_name": "../k"}, (f"{H[:16]}.entry_name", "'../k' is not a kernel name")),
    (H, {"files": {}}, (f"{H[:16]}.files", "missing")),
    (H, {"files": {"../k.cubin": "0" * 64}}, (f"{H[:16]}.files", "'../k.cubin' is not a cache file name")),
    (H, {"files": {"__grp__k.json": "0" * 64}}, (f"{H[:16]}.files", "'__grp__k.json' is not a cache file name")),
    (H, {"files": {"..": "0" * 64}}, (f"{H[:16]}.files", "'..' is not a cache file name")),
    (H, {"files": {"k.cubin": "0" * 63}}, (f"{H[:16]}.files.k.cubin", "not a sha256")),
    (H, {"files": {"k.cubin": None}}, (f"{H[:16]}.files.k.cubin", "not a sha256")),
])
def test_a_record_field_that_cannot_be_trusted_is_named_with_what_is_wrong(cache_hash, change, expected):
    assert record_problem(cache_hash, {**GOOD, **change}, "sm90") == expected


def test_a_long_value_is_cut_to_forty_characters_in_the_message():
    long = "x" * 60
    assert record_problem(H, {**GOOD, "rows": long}, "sm90") == (f"{H[:16]}.rows", f"'{'x' * 39} is not a list")
    assert record_problem(H, {**GOOD, "rows": [7 * 10**50]}, "sm90")[1] == f"holds {'7' + '0' * 39}, which is not text"
    assert record_problem(H, {**GOOD, "entry_name": "../" + long}, "sm90")[1] == (
        f"{('../' + long)[:40]!r} is not a kernel name")
    assert record_problem(H, {**GOOD, "files": {"/" + long: "0" * 64}}, "sm90")[1] == (
        f"{('/' + long)[:40]!r} is not a cache file name")


def test_a_record_without_a_field_every_reader_needs_names_it():
    for name in ("id", "kernel", "target", "entry_name", "args"):
        assert record_problem(H, {k: v for k, v in GOOD.items() if k != name}, "sm90") == (f"{H[:16]}.{name}",
                                                                                            "missing")
    for name in ("key", "specialization_data", "num_warps", "num_stages", "rows"):  # what a bundle's row must hold
        partial = {k: v for k, v in GOOD.items() if k != name}
        assert record_problem(H, partial, "sm90") is None
        assert record_problem(H, partial, "sm90", complete=True) == (f"{H[:16]}.{name}", "missing")
    no_files = {k: v for k, v in GOOD.items() if k != "files"}
    assert record_problem(H, no_files, "sm90", files_required=True) == (f"{H[:16]}.files", "missing")
    assert record_problem(H, "a row", "sm90") == (H[:16], "not a record")


def test_metadata_must_name_the_hash_its_folder_is_named_after():
    folder = entry_dir_name(H)
    assert metadata_problem(json.dumps({"hash": H, "name": "k"}).encode(), folder) is None
    other = "12" * 32
    assert metadata_problem(json.dumps({"hash": other}).encode(), folder) == (
        f"the entry's metadata names the cache hash '{other[:16]}'..., not the one its folder {folder[:16]}... is "
        "named after (another kernel's files)")
    assert "names the cache hash 'None'..." in metadata_problem(b"{}", folder)
    assert "names the cache hash 'ABABABABABABABAB'..." in metadata_problem(json.dumps({"hash": "AB" * 32}).encode(),
                                                                           entry_dir_name("ab" * 32))
    for data in (b"not json", b"[1, 2]", b"\xff"):
        assert metadata_problem(data, folder) == "the entry's metadata is not a JSON table"


def test_a_plain_file_name_is_one_path_component():
    assert all(plain_file_name(n) for n in ("k.cubin", "_k.json", "k-1.hsaco", "a" * 255))
    assert not any(plain_file_name(n) for n in ("", ".", "..", "a/b", "/k", ".hidden", "a" * 256, None, 3, "k\n"))


# ------------------------------------------------------------------ the same through check, on a real warm-up


@pytest.fixture(scope="module")
def warmed(tmp_path_factory):
    """A cache warmed (sm90) for rms_norm on float16, and its plan; tests put back what they change."""
    root = tmp_path_factory.mktemp("warmed")
    spec = root / "fp16.yaml"
    spec.write_text(FP16)
    cache = root / "cache"
    warm(plan(load_specs([spec]), SM90, cache_dir=cache), cache)
    return cache, spec


def test_check_reports_a_binary_whose_checksum_does_not_match_as_corrupt(warmed):
    cache, spec = warmed
    the_plan = plan(load_specs([spec]), SM90)
    [variant] = the_plan.variants.values()
    cubin = Path(entry_files(cache, variant.entry_dir, variant.entry_name)[f"{variant.entry_name}.cubin"])
    original = cubin.read_bytes()
    assert check(the_plan, cache).ok
    try:
        cubin.write_bytes(original[:200] + b"\xde\xad\xbe\xef" + original[204:])  # same size, other bytes
        report = check(the_plan, cache)
        assert [c["id"] for c in report.corrupt] == [variant.variant_id]
        assert not report.ok and not report.missing
    finally:
        cubin.write_bytes(original)
    assert check(the_plan, cache).ok

def test_check_names_a_cache_copied_to_another_path(warmed, tmp_path):
    cache, spec = warmed
    copy, aside = tmp_path / "copy", tmp_path / "aside"
    shutil.copytree(cache, copy)
    os.rename(cache, aside)  # the original is gone: Triton's group files name files there
    try:
        report = check(plan(load_specs([spec]), SM90), copy)
    finally:
        os.rename(aside, cache)
    [missing] = report.missing
    assert missing["cause"] == COPIED
    assert f"its entry is here, but names its files under {cache}/" in missing["why"]
    assert report.reasons == [f"1 planned variant is in a cache copied or mounted from {cache}: Triton's group "
                              f"files name the files there by absolute path, and a server reading {copy} misses "
                              "them: move a cache with `tritonwarm bundle create` / `bundle install`, for the "
                              f"path the server reads (`bundle install BUNDLE --serve-at {copy}` where it is "
                              "installed at another path)"]


# ------------------------------------------------------------------ the mutation script


def test_the_mutation_script_names_modules_and_test_files_that_exist():
    import importlib.util

    root = Path(__file__).resolve().parents[1]
    spec = importlib.util.spec_from_file_location("mutation_bench", root / "bench" / "mutation.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    for module, tests in script.MODULES.values():
        assert (root / module).is_file(), module
        assert tests and all((root / "tests" / t).is_file() for t in tests), tests
    for test in script.DESELECT:
        assert (root / "tests" / test.split("::")[0]).is_file(), test
    with pytest.raises(SystemExit) as refused:
        script.main(["no_such_module"])
    assert refused.value.code == 2
