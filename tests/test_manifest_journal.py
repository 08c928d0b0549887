"""The manifest's bookkeeping: recording a variant costs the same however many are recorded, and
concurrent writers, a killed writer or a killed compaction lose nothing that was recorded."""

import json
import multiprocessing
import os

import pytest
from tritonwarm.jit.cache import Manifest, ManifestDamaged
from tritonwarm.jit.cache.layout import entry_dir_name


def _record(number: int, rows=("spec.yaml#1 (n=1)",), compile_seconds=0.5) -> tuple[str, dict]:
    """A record of the size and shape a warm-up writes (~4 KB, most of it Triton's specialization data)."""
    cache_hash = f"{number:064x}"
    return cache_hash, {
        "id": cache_hash[:12], "kernel": "pkg.kernels.k", "target": "sm90", "entry_name": "k",
        "entry_dir": entry_dir_name(cache_hash), "args": {f"a{i}": "*bf16 aligned" for i in range(10)},
        "cache_hash": cache_hash, "key": "[('*bf16', 'D')]" * 12, "num_warps": 4, "num_stages": 3,
        "rows": list(rows), "specialization_data": json.dumps({"options": "x" * 2000}),
        "files": {f"k.{ext}": "ab" * 32 for ext in ("cubin", "ptx", "ttir", "ttgir", "llir", "json")},
        "compile_seconds": compile_seconds, "triton_version": "3.9.0", "env": {}, "environment": "e1",
    }


def _io_bytes() -> int:
    """Bytes this process has read and written through system calls (Linux's /proc/self/io)."""
    with open("/proc/self/io") as f:
        counts = dict(line.split(": ") for line in f.read().splitlines())
    return int(counts["rchar"]) + int(counts["wchar"])


@pytest.mark.skipif(not os.path.exists("/proc/self/io"), reason="counts bytes through Linux's /proc/self/io")
def test_recording_the_2000th_variant_reads_and_writes_what_the_100th_does(tmp_path, monkeypatch):
    monkeypatch.setattr(os, "fsync", lambda fd: None)  # counts no byte; spared to keep the test short
    manifest = Manifest(tmp_path, "sm90")
    environments = {"e1": {"triton": {"version": "3.9.0"}, "env": {"X": "y" * 4000}}}
    cost = {}
    for number in range(1, 2001):
        cache_hash, record = _record(number)
        before = _io_bytes()
        manifest.update({cache_hash: record}, environments=environments)
        cost[number] = _io_bytes() - before
    assert manifest.journal.stat().st_size > 4_000_000  # 2,000 records of ~4 KB are on disk ...
    assert cost[2000] <= 2 * cost[100], cost  # ... and recording the last read and wrote no more of them
    assert cost[100] < 20_000, cost  # one record's worth, not the manifest's
    recorded = Manifest(tmp_path, "sm90").read()
    assert len(recorded) == 2000 and recorded[f"{2000:064x}"]["rows"] == ["spec.yaml#1 (n=1)"]
    assert list(Manifest(tmp_path, "sm90").environments()) == ["e1"]


def test_compaction_folds_the_journal_into_the_file_and_later_records_extend_it(tmp_path):
    manifest = Manifest(tmp_path, "sm90")
    first, second = _record(1), _record(2)
    manifest.update(dict([first, second]))
    manifest.compact()
    assert not manifest.journal.exists()
    data = json.loads(manifest.path.read_text())
    assert data["generation"] == 1 and sorted(data["variants"]) == sorted([first[0], second[0]])
    manifest.update({first[0]: _record(1, rows=["spec.yaml#2 (n=2)"], compile_seconds=None)[1]},
                    remove=[second[0]])
    recorded = Manifest(tmp_path, "sm90").read()
    assert list(recorded) == [first[0]]
    assert recorded[first[0]]["rows"] == ["spec.yaml#1 (n=1)", "spec.yaml#2 (n=2)"]  # rows joined
    assert recorded[first[0]]["compile_seconds"] == 0.5  # a record found cached keeps its compile time


def test_a_journal_that_changes_nothing_leaves_the_file_as_it_was(tmp_path):
    """Recording again what is recorded (an install or warm-up run twice) folds into no new file:
    the same bytes and generation, the journal gone; a record that changes does rewrite it."""
    manifest = Manifest(tmp_path, "sm90")
    manifest.update(dict([_record(1)]), environments={"e1": {"triton": {"version": "3.9.0"}}})
    manifest.compact()
    written, stamp = manifest.path.read_bytes(), manifest.path.stat().st_mtime_ns
    manifest.update(dict([_record(1)]), environments={"e1": {"triton": {"version": "3.9.0"}}})
    manifest.compact()
    assert not manifest.journal.exists()
    assert manifest.path.read_bytes() == written and manifest.path.stat().st_mtime_ns == stamp
    manifest.update(dict([_record(1, rows=["spec.yaml#2 (n=2)"])]))
    manifest.compact()
    assert json.loads(manifest.path.read_text())["generation"] == 2


def test_a_writer_killed_mid_line_loses_only_that_line(tmp_path):
    manifest = Manifest(tmp_path, "sm90")
    manifest.update(dict([_record(1)]))
    with open(manifest.journal, "ab") as f:  # what a kill in the middle of a write leaves
        f.write(json.dumps({"set": dict([_record(2)])}).encode()[:500])
    assert list(Manifest(tmp_path, "sm90").read()) == [_record(1)[0]]
    manifest.update(dict([_record(3)]))  # the next writer cuts the torn line off first
    assert sorted(Manifest(tmp_path, "sm90").read()) == [_record(1)[0], _record(3)[0]]
    assert manifest.journal.read_bytes().count(b"\n") == 3  # header and two records, nothing torn


def test_a_compaction_killed_before_removing_the_journal_replays_nothing_twice(tmp_path):
    manifest = Manifest(tmp_path, "sm90")
    manifest.update(dict([_record(1), _record(2)]))
    journal = manifest.journal.read_bytes()
    manifest.compact()
    manifest.update(remove=[_record(1)[0]])
    manifest.compact()
    manifest.journal.write_bytes(journal)  # the folded journal, as a kill before its removal leaves it
    assert list(Manifest(tmp_path, "sm90").read()) == [_record(2)[0]]  # the removed record stays removed
    manifest.update(dict([_record(3)]))  # a writer starts a journal of the current generation
    assert sorted(Manifest(tmp_path, "sm90").read()) == [_record(2)[0], _record(3)[0]]


def test_a_manifest_written_before_journals_is_read_and_extended(tmp_path):
    manifest = Manifest(tmp_path, "sm90")
    manifest.dir.mkdir(parents=True)
    old = {"format": 1, "target": "sm90", "variants": dict([_record(1)]), "environments": {}}
    manifest.path.write_text(json.dumps(old, indent=1))
    manifest.update(dict([_record(2)]))
    assert sorted(Manifest(tmp_path, "sm90").read()) == [_record(1)[0], _record(2)[0]]
    manifest.compact()
    assert sorted(json.loads(manifest.path.read_text())["variants"]) == [_record(1)[0], _record(2)[0]]


@pytest.mark.parametrize("damage", [b"not json\n", b'{"journal": 1, "generation": 1}\n{"set": [1, 2]}\n'])
def test_a_damaged_journal_is_named_and_set_aside_with_the_file(tmp_path, damage):
    manifest = Manifest(tmp_path, "sm90")
    manifest.update(dict([_record(1)]))
    manifest.compact()
    manifest.journal.write_bytes(damage)
    with pytest.raises(ManifestDamaged, match=f"{manifest.journal}: damaged manifest journal: "):
        manifest.read()
    assert manifest.environments() == {}
    manifest.set_aside_damaged()
    assert (tmp_path / "tritonwarm" / "manifest-sm90.journal.damaged").read_bytes() == damage
    assert manifest.read() == {}


def _write_many(cache_dir, first, count, compact_every):
    manifest = Manifest(cache_dir, "sm90")
    for number in range(first, first + count):
        manifest.update(dict([_record(number)]))
        manifest.update({_record(0)[0]: _record(0, rows=[f"row {number}"])[1]})  # every writer adds a row
        if compact_every and number % compact_every == 0:
            manifest.compact()


def test_concurrent_writers_and_compactions_lose_nothing(tmp_path):
    context = multiprocessing.get_context("fork")
    writers = [context.Process(target=_write_many, args=(tmp_path, 1 + 100 * i, 60, 17 if i % 2 else 0))
               for i in range(4)]
    for writer in writers:
        writer.start()
    for writer in writers:
        writer.join(120)
        assert writer.exitcode == 0
    expected = {_record(n)[0] for i in range(4) for n in range(1 + 100 * i, 61 + 100 * i)} | {_record(0)[0]}
    recorded = Manifest(tmp_path, "sm90").read()
    assert set(recorded) == expected
    assert len(recorded[_record(0)[0]]["rows"]) == 240  # every writer's every row, none lost


def test_a_record_is_judged_under_the_environment_it_names_or_else_under_what_it_says_itself():
    """``check`` compares the environment a variant was warmed under with the server's: the one the
    record names in the table, unless the record's own Triton version disagrees with it (a record
    older than the table, or one copied between caches), when the record's own words are taken."""
    from tritonwarm.jit.cache.manifest import entry_fingerprint

    table = {"e1": {"triton": {"version": "3.9.0"}, "env": {"TRITON_DEBUG": "1"}},
             "e2": {"triton": {"version": "3.6.0"}, "env": {}}}
    own = {"TRITON_DEFAULT_FP_FUSION": "0"}
    assert entry_fingerprint({"environment": "e1", "triton_version": "3.9.0", "env": own}, table) is table["e1"]
    assert entry_fingerprint({"environment": "e2", "env": own}, table) is table["e2"]  # no version recorded
    disagreeing = {"environment": "e1", "triton_version": "3.6.0", "env": own}
    assert entry_fingerprint(disagreeing, table) == {"triton": {"version": "3.6.0"}, "env": own}
    for unnamed in ({"triton_version": "3.9.0", "env": own}, {"environment": "e9", "triton_version": "3.9.0"}):
        expected = {"triton": {"version": "3.9.0"}, "env": unnamed.get("env", {})}
        assert entry_fingerprint(unnamed, table) == expected, unnamed
    assert entry_fingerprint({"environment": "", "triton_version": "3.9.0"}, {"": table["e1"]}) is table["e1"]


def test_every_target_with_a_manifest_or_only_a_journal_is_found(tmp_path):
    """A warm-up killed before its first compaction leaves only a journal: its target still counts."""
    from tritonwarm.jit.cache.manifest import manifests

    Manifest(tmp_path, "sm90").update(dict([_record(1)]))
    Manifest(tmp_path, "sm90").compact()
    Manifest(tmp_path, "gfx942").update(dict([_record(2)]))  # a journal alone
    (tmp_path / "tritonwarm" / "manifest-sm80.lock").write_text("")
    found = manifests(tmp_path)
    assert list(found) == ["gfx942", "sm90"]
    assert [m.target for m in found.values()] == ["gfx942", "sm90"] and found["sm90"].cache_dir == tmp_path
    assert manifests(tmp_path / "none") == {}
