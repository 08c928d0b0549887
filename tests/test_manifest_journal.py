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


@pytest.mark.parametrize("content, why", [
    (b"", "empty"),
    (b"  \n", "empty"),
    (b'{"format": 1, "variants": {', None),  # not JSON, with what the parser says
    (b"[]", "not a tritonwarm manifest of format 1"),
    (b'{"format": 2, "variants": {}}', "not a tritonwarm manifest of format 1"),
    (b'{"format": 1}', "not a tritonwarm manifest of format 1"),
    (b'{"format": 1, "variants": []}', "not a tritonwarm manifest of format 1"),
    (b'{"format": 1, "target": "gfx942", "variants": {}}', "target: 'gfx942' in the manifest of sm90"),
    (b'{"format": 1, "variants": {}, "generation": "3"}', "generation: '3' is not an integer"),
    (b'{"format": 1, "variants": {}, "generation": true}', "generation: True is not an integer"),
])
def test_a_manifest_file_that_is_not_one_is_named_with_what_is_wrong(tmp_path, content, why):
    manifest = Manifest(tmp_path, "sm90")
    manifest.dir.mkdir()
    manifest.path.write_bytes(content)
    if why is None:
        with pytest.raises(ValueError) as parsed:
            json.loads(content)
        why = f"not JSON ({parsed.value})"
    with pytest.raises(ManifestDamaged) as raised:
        manifest.read()
    assert str(raised.value) == f"{manifest.path}: damaged manifest: {why}; `tritonwarm warmup` rebuilds it"
    assert manifest.environments() == {}  # what reads only the environments finds none, and goes on


def test_what_a_manifest_file_leaves_out_reads_as_nothing_recorded(tmp_path):
    """No file yet, no target or generation (a manifest of an older tritonwarm), environments that are
    not a table, a record written before its folder's name was: all read, none refused."""
    manifest = Manifest(tmp_path, "sm90")
    assert manifest.read() == {} and manifest.environments() == {}
    cache_hash, record = _record(1)
    del record["entry_dir"]
    manifest.dir.mkdir()
    manifest.path.write_text(json.dumps({"format": 1, "variants": {cache_hash: record}, "environments": [1]}))
    assert Manifest(tmp_path, "sm90").read()[cache_hash]["entry_dir"] == entry_dir_name(cache_hash)
    assert Manifest(tmp_path, "sm90").environments() == {}
    manifest.update(dict([_record(2)]))  # extends generation 0
    assert sorted(Manifest(tmp_path, "sm90").read()) == [cache_hash, _record(2)[0]]


def test_an_unreadable_manifest_says_so_in_one_line(tmp_path):
    from tritonwarm.jit.cache.layout import CacheError

    manifest = Manifest(tmp_path, "sm90")
    manifest.path.mkdir(parents=True)  # a folder where the file should be
    with pytest.raises(CacheError) as raised:
        manifest.read()
    assert str(raised.value) == f"{manifest.path}: unreadable manifest: Is a directory"


@pytest.mark.parametrize("header", [
    b"not json\n", b'{"journal": 2, "generation": 0}\n', b'{"journal": 1, "generation": "0"}\n',
    b'{"journal": 1}\n', b"[1]\n", b'{"generation": 0}\n'])
def test_a_journal_whose_first_line_is_no_header_is_damage(tmp_path, header):
    manifest = Manifest(tmp_path, "sm90")
    manifest.dir.mkdir()
    manifest.journal.write_bytes(header + json.dumps({"set": dict([_record(1)])}).encode() + b"\n")
    with pytest.raises(ManifestDamaged) as raised:
        manifest.read()
    assert str(raised.value) == (f"{manifest.journal}: damaged manifest journal: its first line is not a journal "
                                 "header of format 1; `tritonwarm warmup` rebuilds it")


def test_a_journal_line_that_is_no_change_is_named_by_its_line_number(tmp_path):
    manifest = Manifest(tmp_path, "sm90")
    manifest.update(dict([_record(1)]))
    with open(manifest.journal, "ab") as f:
        f.write(b'["not", "a change"]\n')
    with pytest.raises(ManifestDamaged) as raised:
        manifest.read()
    assert str(raised.value) == (f"{manifest.journal}: damaged manifest journal: line 3 is not a change tritonwarm "
                                 "writes; `tritonwarm warmup` rebuilds it")


def test_a_damaged_manifest_is_set_aside_with_its_journal_and_a_sound_one_is_left(tmp_path):
    manifest = Manifest(tmp_path, "sm90")
    manifest.update(dict([_record(1)]))
    assert manifest.set_aside_damaged() is None and manifest.journal.exists()
    manifest.compact()
    manifest.update(dict([_record(2)]))
    manifest.path.write_text("{")
    aside = manifest.set_aside_damaged()
    assert aside == manifest.path.with_name("manifest-sm90.json.damaged") and aside.read_text() == "{"
    assert manifest.journal.with_name("manifest-sm90.journal.damaged").exists()
    assert not manifest.path.exists() and not manifest.journal.exists() and manifest.read() == {}
    manifest.path.write_text("[]")  # damaged, with no journal beside it
    assert manifest.set_aside_damaged() == aside and aside.read_text() == "[]"


def test_a_writer_appends_an_environment_once_per_journal(tmp_path):
    environments = {"e1": {"triton": {"version": "3.9.0"}}}
    manifest = Manifest(tmp_path, "sm90")
    for number in (1, 2):
        manifest.update(dict([_record(number)]), environments=environments)
    header, first, second = manifest.journal.read_bytes().splitlines()
    assert json.loads(first)["environments"] == environments and json.loads(second)["environments"] == {}
    assert first == json.dumps(json.loads(first), separators=(",", ":")).encode()  # one compact line a record
    manifest.compact()
    manifest.update(dict([_record(3)]), environments=environments)  # a new journal names them again
    assert json.loads(manifest.journal.read_bytes().splitlines()[1])["environments"] == environments
    assert Manifest(tmp_path, "sm90").environments() == environments


def test_environments_read_again_once_another_writer_changed_the_manifest(tmp_path):
    reader = Manifest(tmp_path, "sm90")
    reader.update(dict([_record(1)]), environments={"e1": {"triton": {"version": "3.9.0"}}})
    assert list(reader.environments()) == ["e1"]
    _, second = _record(2)
    Manifest(tmp_path, "sm90").update({_record(2)[0]: {**second, "environment": "e2"}},
                                      environments={"e2": {"triton": {"version": "3.9.0"}}})
    assert list(reader.environments()) == ["e1", "e2"]


def test_the_journal_is_written_with_the_caches_file_mode_and_never_through_a_link(tmp_path):
    from tritonwarm.jit.cache.layout import CacheError, file_mode

    manifest = Manifest(tmp_path, "sm90")
    manifest.update(dict([_record(1)]))
    assert manifest.journal.stat().st_mode & 0o777 == file_mode()
    manifest.compact()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.write_text("kept\n")
    manifest.journal.symlink_to(elsewhere)
    with pytest.raises(CacheError, match=r"^cannot write .*manifest-sm90\.journal: Too many levels of symbolic links"):
        manifest.update(dict([_record(2)]))
    assert elsewhere.read_text() == "kept\n"


@pytest.mark.parametrize("errno_name, message", [("ENOSPC", "disk full: cannot write {}: no space left on device"),
                                                 ("EACCES", "cannot write {}: Permission denied")])
def test_a_record_that_cannot_be_written_leaves_the_journal_as_it_was(tmp_path, monkeypatch, errno_name, message):
    import errno

    from tritonwarm.jit.cache.layout import CacheError

    manifest = Manifest(tmp_path, "sm90")
    manifest.update(dict([_record(1)]))
    before = manifest.journal.read_bytes()

    def fails(fd):
        raise OSError(getattr(errno, errno_name), os.strerror(getattr(errno, errno_name)))

    monkeypatch.setattr(os, "fsync", fails)
    with pytest.raises(CacheError) as raised:
        manifest.update(dict([_record(2)]))
    assert str(raised.value) == message.format(manifest.journal)
    assert manifest.journal.read_bytes() == before  # what was written of the record is no record
    monkeypatch.undo()
    assert list(Manifest(tmp_path, "sm90").read()) == [_record(1)[0]]


@pytest.mark.parametrize("errno_name, message", [("ENOSPC", "disk full: cannot write {}: no space left on device"),
                                                 ("EACCES", "cannot write {}: Permission denied")])
def test_a_compaction_that_cannot_write_keeps_the_journal(tmp_path, monkeypatch, errno_name, message):
    import errno

    from tritonwarm.jit.cache import manifest as module
    from tritonwarm.jit.cache.layout import CacheError

    manifest = Manifest(tmp_path, "sm90")
    manifest.update(dict([_record(1)]))

    def fails(*args, **kwargs):
        raise OSError(getattr(errno, errno_name), os.strerror(getattr(errno, errno_name)))

    monkeypatch.setattr(module, "write_json_atomic", fails)
    with pytest.raises(CacheError) as raised:
        manifest.compact()
    assert str(raised.value) == message.format(manifest.path)
    assert manifest.journal.exists() and list(Manifest(tmp_path, "sm90").read()) == [_record(1)[0]]


def test_a_compaction_writes_the_file_durably_in_its_format(tmp_path, monkeypatch):
    synced = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: synced.append(fd) or real_fsync(fd))
    manifest = Manifest(tmp_path, "sm90")
    manifest.update(dict([_record(1)]))
    synced.clear()
    manifest.compact()
    assert synced  # the file's bytes reach the disk before it replaces the old one
    assert manifest.path.read_text().startswith('{\n "format": 1,\n "target": "sm90",\n "generation": 1,\n')


def test_records_merge_with_records_that_name_no_rows_and_removals_of_unknown_keys(tmp_path):
    manifest = Manifest(tmp_path, "sm90")
    cache_hash, record = _record(1)
    manifest.update({cache_hash: {k: v for k, v in record.items() if k != "rows"}})
    manifest.update({cache_hash: record}, remove=[f"{9:064x}"])
    manifest.update({cache_hash: {k: v for k, v in record.items() if k != "rows"}})
    assert Manifest(tmp_path, "sm90").read()[cache_hash]["rows"] == record["rows"]


@pytest.mark.parametrize("content, end", [
    (b"header\n" + b"x" * 5000, 7),  # the newline a whole chunk back
    (b"h\n" + b"y" * 4094 + b"\n" + b"z" * 10, 4097),  # at the first byte of the last chunk
    (b"\n" + b"z" * 4095, 1),  # at the file's first byte
    (b"x" * 4097 + b"\n", 4098),
])
def test_the_end_of_the_last_whole_line_is_found_across_chunks(content, end):
    import io

    from tritonwarm.jit.cache.manifest import _end_of_last_line

    assert _end_of_last_line(io.BytesIO(content), len(content)) == end


def test_an_environment_that_names_no_triton_still_judges_a_record_that_names_no_version():
    from tritonwarm.jit.cache.manifest import entry_fingerprint

    table = {"e1": {"env": {"TRITON_DEBUG": "1"}}}
    assert entry_fingerprint({"environment": "e1"}, table) is table["e1"]
    assert entry_fingerprint({"environment": "e1", "triton_version": "3.9.0"}, table)["triton"] == {"version": "3.9.0"}


def test_a_damaged_journal_beside_no_manifest_file_is_set_aside(tmp_path):
    manifest = Manifest(tmp_path, "sm90")
    manifest.dir.mkdir()
    manifest.journal.write_bytes(b"not a header\n")
    assert manifest.set_aside_damaged() == manifest.path.with_name("manifest-sm90.json.damaged")
    assert manifest.journal.with_name("manifest-sm90.journal.damaged").exists() and not manifest.journal.exists()


def test_a_short_record_after_a_long_stale_or_torn_journal_leaves_no_old_bytes(tmp_path):
    """The next writer cuts what it does not extend (a journal already folded in, a torn last line)
    down to what it keeps before appending, however short its own line is."""
    manifest = Manifest(tmp_path, "sm90")
    manifest.update(dict([_record(1), _record(2)]))
    stale = manifest.journal.read_bytes()
    manifest.compact()
    manifest.journal.write_bytes(stale)  # a compaction killed before it removed the journal
    manifest.update(remove=[_record(2)[0]])  # a line of a few bytes
    journal = manifest.journal.read_bytes()
    assert journal.count(b"\n") == 2 and journal.endswith(b"\n")  # the header and that line, nothing after
    assert list(Manifest(tmp_path, "sm90").read()) == [_record(1)[0]]
    with open(manifest.journal, "ab") as f:  # a writer killed mid-line, 4 KB into it
        f.write(json.dumps({"set": dict([_record(3)])}).encode()[:4000])
    manifest.update(remove=[_record(1)[0]])
    lines = manifest.journal.read_bytes().split(b"\n")
    assert len(lines) == 4 and lines[-1] == b"" and Manifest(tmp_path, "sm90").read() == {}


def test_a_file_with_no_newline_has_no_whole_line():
    import io

    from tritonwarm.jit.cache.manifest import _end_of_last_line

    assert _end_of_last_line(io.BytesIO(b"x" * 5000), 5000) == 0
