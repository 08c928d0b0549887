"""Bundles pinned with fast tests: small caches are written here by hand, file for file as a warm-up
leaves them (Triton's entry folders and groups, tritonwarm's manifest), so that create, verify,
install, merge and the reader's checks are exercised without compiling a kernel."""

import gzip
import hashlib
import io
import json
import os
import socket
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

import pytest
from tritonwarm.jit.cache import Manifest, env
from tritonwarm.jit.cache import bundle as bundle_mod
from tritonwarm.jit.cache.bundle import (
    HEADER_NAME,
    BundleError,
    Limits,
    create,
    install,
    merge,
    point_groups,
    read_header,
    recorded_layout,
    serve_from,
    verify,
    write,
)
from tritonwarm.jit.cache.sources import PlanSources
from tritonwarm.jit.core.trace import Variant

TARGET = "sm90"
# what a runtime's fingerprint holds of what enters a key (tritonwarm.jit.cache.env.fingerprint)
WARMED_FP = {"format": 1, "triton": {"version": "3.9.0", "key_sha256": "1" * 64}, "env": {},
             "backends": {"sm90": "ptxas 13.4 -90", "gfx942": "hip tools"}}
FP_ID = env.fingerprint_id(WARMED_FP)


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _variant(i: int, name: str = "rms_norm_kernel", target: str = TARGET) -> Variant:
    return Variant(kernel=f"tritonwarm.kernels.{name}", target=target, key=f"key{i}", specialization_data="{}",
                   args={"x": "*bf16", "n": "i32"}, num_warps=4, num_stages=3, cache_hash=_sha(f"v{i}".encode()),
                   rows=[f"row{i}"], entry_name=name)


def _files(variant: Variant) -> dict[str, bytes]:
    """An entry's files as Triton writes them (its metadata names the entry's cache hash)."""
    name = variant.entry_name
    return {f"{name}.json": json.dumps({"hash": variant.cache_hash, "name": name}).encode(),
            f"{name}.cubin": b"\x7fELF cubin of " + variant.cache_hash.encode(),
            f"{name}.ptx": b"// ptx " + variant.key.encode(),
            f"{name}.source": b"# source"}


def _entry(cache_dir: Path, variant: Variant, at: Path | None = None) -> dict[str, str]:
    """Write one entry of ``cache_dir`` (its group naming its files under ``at``, default: here)."""
    folder = cache_dir / variant.entry_dir
    folder.mkdir(parents=True, exist_ok=True)
    digests = {}
    for name, data in _files(variant).items():
        (folder / name).write_bytes(data)
        digests[name] = _sha(data)
    at = cache_dir if at is None else at
    group = {"child_paths": {name: str(at / variant.entry_dir / name) for name in digests}}
    (folder / f"__grp__{variant.entry_name}.json").write_text(json.dumps(group))
    return digests


def _row(variant: Variant, digests: dict[str, str], **extra) -> dict:
    return {**variant.to_json(), "entry_dir": variant.entry_dir, "files": digests, "environment": FP_ID,
            "compile_seconds": 1.5, **extra}


def _warm(cache_dir: Path, variants, fp: dict | None = None, target: str = TARGET) -> dict[str, dict]:
    """A warmed cache holding ``variants``, recorded in ``target``'s manifest under one environment."""
    fp = WARMED_FP if fp is None else fp
    rows = {}
    for variant in variants:
        rows[variant.cache_hash] = {**_row(variant, _entry(cache_dir, variant)), "environment": env.fingerprint_id(fp)}
    manifest = Manifest(cache_dir, target)
    manifest.update(rows, environments={env.fingerprint_id(fp): fp})
    manifest.compact()
    return rows


@pytest.fixture
def runtime(monkeypatch):
    """This process's environment as the one the caches here were warmed in (computing the real one
    hashes Triton's library); a test changes the returned table to play another runtime."""
    here = json.loads(json.dumps(WARMED_FP))
    monkeypatch.setattr(env, "current_fingerprint", lambda: here)
    return here


@pytest.fixture
def warmed(tmp_path, runtime):
    """A cache with two warmed variants of one kernel: (cache folder, variants)."""
    variants = [_variant(1), _variant(2)]
    _warm(tmp_path / "warmed", variants)
    return tmp_path / "warmed", variants


@pytest.fixture
def bundled(tmp_path, warmed):
    """The bundle of ``warmed``: (path, cache folder, variants)."""
    cache_dir, variants = warmed
    out = tmp_path / "b.tar.gz"
    create(out, cache_dir, {TARGET: variants})
    return out, cache_dir, variants


def _members(path: Path) -> list[tuple[tarfile.TarInfo, bytes]]:
    with tarfile.open(path) as tar:
        return [(m, tar.extractfile(m).read()) for m in tar.getmembers()]


def _tar(path: Path, members, fmt=tarfile.PAX_FORMAT) -> Path:
    """``members``: ``(name, bytes)`` or ``(TarInfo, bytes | None)``, written in order."""
    with open(path, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as gz, \
            tarfile.open(fileobj=gz, mode="w|", format=fmt) as tar:
        for name, data in members:
            info = name if isinstance(name, tarfile.TarInfo) else tarfile.TarInfo(name)
            if not isinstance(name, tarfile.TarInfo):
                info.size = len(data)
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return path


def _rewrite(path: Path, out: Path, change_header=None, change_members=None) -> Path:
    """``path``'s members with the header (a table) and the member list changed."""
    members = [(info.name, data) for info, data in _members(path)]
    header = json.loads(members[0][1])
    if change_header is not None:
        header = change_header(header) or header
    members[0] = (HEADER_NAME, json.dumps(header).encode())
    if change_members is not None:
        members = change_members(members)
    return _tar(out, members)


def _only_row(header: dict) -> dict:
    return next(iter(header["targets"][TARGET].values()))


def _refused(path: Path, words: str, limits: Limits | None = None) -> str:
    with pytest.raises(BundleError) as raised:
        verify(path, limits or Limits())
    message = str(raised.value)
    assert words in message, message
    return message


# ---------------------------------------------------------------------------------------------- create


def test_create_packs_the_header_first_then_each_entry_with_a_relative_group(bundled):
    path, cache_dir, variants = bundled
    members = _members(path)
    names = [info.name for info, _ in members]
    assert names[0] == HEADER_NAME
    for variant in sorted(variants, key=lambda v: v.entry_dir):
        files = sorted(_files(variant))
        group = f"{variant.entry_dir}/__grp__{variant.entry_name}.json"
        start = names.index(f"{variant.entry_dir}/{files[0]}")
        assert names[start:start + len(files) + 1] == [f"{variant.entry_dir}/{n}" for n in files] + [group]
        assert json.loads(dict((i.name, d) for i, d in members)[group]) == {
            "child_paths": {n: f"{variant.entry_dir}/{n}" for n in files}}  # no path of this machine
    assert len(names) == 1 + 2 * 5
    folders = [name.split("/")[0] for name in names[1:]]
    assert folders == sorted(folders)
    assert all(info.mtime == 0 and info.mode == 0o644 and info.uname == "" for info, _ in members)
    for info, data in members[1:]:
        if "__grp__" not in info.name:
            assert data == (cache_dir / info.name).read_bytes()


def test_create_reports_what_it_packed(bundled):
    path, _, _ = bundled
    report = create(path, bundled[1], {TARGET: bundled[2]})
    assert (report.path, report.entries, report.files, report.binary_only) == (str(path), 2, 8, False)
    assert report.archive_bytes == path.stat().st_size and report.targets == {TARGET: 2}
    assert "layout" not in report.to_json() and report.to_json()["entries"] == 2


def test_create_writes_the_manifest_rows_and_their_environment(bundled, tmp_path):
    path, cache_dir, _ = bundled
    header = read_header(path)
    assert header["format"] == 1 and header["binary_only"] is False
    assert header["targets"] == {TARGET: Manifest(cache_dir, TARGET).read()}
    assert header["environments"] == {TARGET: {FP_ID: WARMED_FP}}
    assert header["fingerprint"] == WARMED_FP  # the recorded environment, not this process's
    assert list(header["targets"][TARGET]) == sorted(header["targets"][TARGET])


def test_create_is_byte_reproducible_and_keeps_the_argument_order(tmp_path, runtime):
    """Two bundles of the same entries are the same bytes, whatever order the manifest holds them in;
    an entry's arguments keep the kernel's order (the other tables are sorted)."""
    variant = _variant(1)
    variant.args = {"z_ptr": "*fp32", "a_ptr": "*fp32", "n": "i32"}
    other = _variant(2)
    _warm(tmp_path / "one", [variant, other])
    _warm(tmp_path / "two", [other, variant])
    a, b = tmp_path / "a.tar.gz", tmp_path / "b.tar.gz"
    create(a, tmp_path / "one", {TARGET: [variant, other]})
    create(b, tmp_path / "two", {TARGET: [other, variant]})
    assert a.read_bytes() == b.read_bytes()
    text = _members(a)[0][1].decode()
    assert text.index('"z_ptr"') < text.index('"a_ptr"') < text.index('"n"')
    assert text.index('"args"') < text.index('"cache_hash"') < text.index('"entry_dir"')  # keys sorted
    assert text.startswith('{\n "binary_only"')  # indented one space
    raw = a.read_bytes()
    assert raw[3] == 0 and raw[4:8] == b"\0\0\0\0"  # gzip: no file name, no time


def test_create_binary_only_keeps_the_metadata_and_the_binary(tmp_path, runtime):
    variant = _variant(1)
    _warm(tmp_path / "c", [variant])
    (tmp_path / "c" / variant.entry_dir / "x.hsaco").write_bytes(b"hsaco")  # not recorded: not carried
    out = tmp_path / "b.tar.gz"
    report = create(out, tmp_path / "c", {TARGET: [variant]}, binary_only=True)
    names = [info.name.split("/")[1] for info, _ in _members(out)[1:]]
    assert names == ["rms_norm_kernel.cubin", "rms_norm_kernel.json", "__grp__rms_norm_kernel.json"]
    header = read_header(out)
    assert header["binary_only"] is True and sorted(_only_row(header)["files"]) == names[:2]
    assert report.binary_only is True and report.files == 2


def test_create_binary_only_keeps_a_rocm_binary(tmp_path, runtime):
    variant = _variant(1, target="gfx942")
    folder = tmp_path / "c" / variant.entry_dir
    folder.mkdir(parents=True)
    files = {"k.json": json.dumps({"hash": variant.cache_hash}).encode(), "k.hsaco": b"hsaco", "k.amdgcn": b"asm"}
    for name, data in files.items():
        (folder / name).write_bytes(data)
    (folder / "__grp__k.json").write_text(json.dumps({"child_paths": {n: str(folder / n) for n in files}}))
    variant.entry_name = "k"
    row = _row(variant, {n: _sha(d) for n, d in files.items()})
    Manifest(tmp_path / "c", "gfx942").update({variant.cache_hash: row}, environments={FP_ID: WARMED_FP})
    out = tmp_path / "b.tar.gz"
    create(out, tmp_path / "c", {"gfx942": [variant]}, binary_only=True)
    assert sorted(read_header(out)["targets"]["gfx942"][variant.cache_hash]["files"]) == ["k.hsaco", "k.json"]


def test_create_refuses_a_variant_not_warmed_and_names_it(tmp_path, warmed):
    cache_dir, variants = warmed
    cold = _variant(3, name="silu_kernel")
    with pytest.raises(BundleError) as raised:
        create(tmp_path / "x.tar.gz", cache_dir, {TARGET: [*variants, cold]})
    message = str(raised.value)
    assert message.startswith(f"{TARGET} {cold.variant_id} (silu_kernel): not warmed in {cache_dir}")
    assert "run tritonwarm warmup with the same specs, targets and options first" in message
    assert not (tmp_path / "x.tar.gz").exists()


def test_create_names_a_kernel_without_a_module_as_it_is(tmp_path, warmed):
    cold = _variant(3)
    cold.kernel = "my_kernel"
    with pytest.raises(BundleError, match=rf"^{TARGET} {cold.variant_id} \(my_kernel\): not warmed in"):
        create(tmp_path / "x.tar.gz", warmed[0], {TARGET: [cold]})


def test_create_refuses_an_entry_on_disk_the_manifest_does_not_record(tmp_path, runtime):
    recorded, unrecorded = _variant(1), _variant(2)
    _warm(tmp_path / "c", [recorded])
    _entry(tmp_path / "c", unrecorded)  # Triton's files, but no row
    with pytest.raises(BundleError, match=f"{unrecorded.variant_id} .*: not warmed in"):
        create(tmp_path / "x.tar.gz", tmp_path / "c", {TARGET: [recorded, unrecorded]})


def test_create_refuses_a_damaged_entry(warmed, tmp_path):
    cache_dir, variants = warmed
    (cache_dir / variants[1].entry_dir / "rms_norm_kernel.cubin").write_bytes(b"damaged")
    with pytest.raises(BundleError) as raised:
        create(tmp_path / "x.tar.gz", cache_dir, {TARGET: variants})
    assert f"{TARGET} {variants[1].variant_id} (rms_norm_kernel): the cache entry is damaged or not this " \
           "folder's own; warm again" in str(raised.value)


def test_create_refuses_an_entry_whose_group_names_another_folders_files(tmp_path, runtime):
    """A copied cache: its group names the original's files, intact and as recorded, but not its own."""
    variant = _variant(1)
    _warm(tmp_path / "original", [variant])
    rows = Manifest(tmp_path / "original", TARGET).read()
    copy = tmp_path / "copy"
    _entry(copy, variant, at=tmp_path / "original")
    Manifest(copy, TARGET).update(rows, environments={FP_ID: WARMED_FP})
    with pytest.raises(BundleError, match="damaged or not this folder's own"):
        create(tmp_path / "x.tar.gz", copy, {TARGET: [variant]})


def test_create_reads_a_folder_installed_for_another_mount_path(bundled, tmp_path):
    """A volume filled with ``--serve-at`` names its files where the server mounts it: bundled as read there."""
    path, _, variants = bundled
    volume, mount = tmp_path / "volume", tmp_path / "srv"
    install(path, volume, compare_environment=False)
    serve_from(volume, mount)
    again = tmp_path / "again.tar.gz"
    create(again, volume, {TARGET: variants})
    assert again.read_bytes() == path.read_bytes()


def test_create_names_this_runtime_when_the_entries_span_environments(tmp_path, runtime):
    """Entries warmed under two environments: the header names this runtime's, and carries both."""
    other_fp = {**WARMED_FP, "env": {"TRITON_DEFAULT_FP_FUSION": "0"}}
    one, two = _variant(1), _variant(2)
    _warm(tmp_path / "c", [one])
    _warm(tmp_path / "c", [two], fp=other_fp)
    runtime["python"] = {"version": "3.11.0"}  # what tells this process's fingerprint from both
    out = tmp_path / "b.tar.gz"
    create(out, tmp_path / "c", {TARGET: [one, two]})
    header = read_header(out)
    assert header["fingerprint"] == runtime
    assert header["environments"][TARGET] == {FP_ID: WARMED_FP, env.fingerprint_id(other_fp): other_fp}


def test_create_names_the_one_environment_two_targets_recorded_in_any_order(tmp_path, runtime):
    """One environment, recorded by two targets' manifests with its fields in another order, is one."""
    cuda, rocm = _variant(1), _variant(2, target="gfx942")
    _warm(tmp_path / "c", [cuda])
    _warm(tmp_path / "c", [rocm], fp=dict(reversed(list(WARMED_FP.items()))), target="gfx942")
    runtime["python"] = {"version": "3.11.0"}
    out = tmp_path / "b.tar.gz"
    create(out, tmp_path / "c", {TARGET: [cuda], "gfx942": [rocm]})
    assert read_header(out)["fingerprint"] == WARMED_FP


def test_create_carries_only_the_environments_its_entries_name(tmp_path, runtime):
    other_fp = {**WARMED_FP, "env": {"TRITON_DEFAULT_FP_FUSION": "0"}}
    one, two = _variant(1), _variant(2)
    _warm(tmp_path / "c", [one])
    _warm(tmp_path / "c", [two], fp=other_fp)
    out = tmp_path / "b.tar.gz"
    create(out, tmp_path / "c", {TARGET: [two]})
    header = read_header(out)
    assert header["environments"] == {TARGET: {env.fingerprint_id(other_fp): other_fp}}
    assert header["fingerprint"] == other_fp


def test_create_of_a_row_without_environment_names_this_runtime(tmp_path, runtime):
    variant = _variant(1)
    digests = _entry(tmp_path / "c", variant)
    row = _row(variant, digests)
    del row["environment"]
    Manifest(tmp_path / "c", TARGET).update({variant.cache_hash: row})
    runtime["python"] = {"version": "3.12.1"}
    out = tmp_path / "b.tar.gz"
    create(out, tmp_path / "c", {TARGET: [variant]})
    header = read_header(out)
    assert header["fingerprint"] == runtime and header["environments"] == {TARGET: {}}


def test_a_failed_write_leaves_no_file(tmp_path, warmed):
    cache_dir, variants = warmed
    header = bundle_mod.collect(cache_dir, {TARGET: variants})

    def source(entry_dir, name):
        if name.endswith(".ptx"):
            raise OSError("disk gone")
        return cache_dir / entry_dir / name

    with pytest.raises(OSError, match="disk gone"):
        write(tmp_path / "out" / "b.tar.gz", header, source)
    assert list((tmp_path / "out").iterdir()) == []


def test_create_writes_into_a_new_folder_beside_nothing_else(tmp_path, warmed, monkeypatch):
    """The bundle is written whole next to where it goes (not in the temporary folder), then moved in."""
    cache_dir, variants = warmed
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "no-temporary-folder"))
    out = tmp_path / "dist" / "v1" / "b.tar.gz"
    create(out, cache_dir, {TARGET: variants})
    assert [p.name for p in out.parent.iterdir()] == ["b.tar.gz"] and verify(out).entries == 2


def test_a_bundle_being_written_is_a_hidden_temporary_file_beside_it(tmp_path, warmed):
    """Until it is complete, nothing is at the bundle's name: a reader never sees half a bundle."""
    cache_dir, variants = warmed
    header = bundle_mod.collect(cache_dir, {TARGET: variants})
    out = tmp_path / "dist" / "b.tar.gz"
    seen = []

    def source(entry_dir, name):
        seen.append(sorted(p.name for p in out.parent.iterdir()))
        return cache_dir / entry_dir / name

    write(out, header, source)
    assert len(seen) == 8 and all(len(names) == 1 for names in seen) and len({n[0] for n in seen}) == 1
    [temporary] = seen[0]
    assert temporary.startswith(".b.tar.gz.") and temporary.endswith(".tmp") and len(temporary) > len(".b.tar.gz..tmp")
    assert [p.name for p in out.parent.iterdir()] == ["b.tar.gz"]


def test_a_failed_write_whose_temporary_file_is_gone_reports_its_own_error(tmp_path, warmed):
    cache_dir, variants = warmed
    header = bundle_mod.collect(cache_dir, {TARGET: variants})

    def source(entry_dir, name):
        for p in tmp_path.glob(".b.tar.gz.*"):
            p.unlink()
        raise OSError("disk gone")

    with pytest.raises(OSError, match="disk gone"):
        write(tmp_path / "b.tar.gz", header, source)


def test_a_written_bundle_is_readable_by_everyone_the_umask_allows(tmp_path, warmed):
    cache_dir, variants = warmed
    old = os.umask(0o022)
    try:
        create(tmp_path / "b.tar.gz", cache_dir, {TARGET: variants})
    finally:
        os.umask(old)
    assert (tmp_path / "b.tar.gz").stat().st_mode & 0o777 == 0o644


def test_create_refuses_a_bundle_over_two_caps_with_the_shard_count_of_the_larger(tmp_path, monkeypatch):
    """The number of bundles to make is the largest any cap needs, with a quarter spare."""
    rows = {f"{i:064x}": {"entry_dir": f"E{i}", "entry_name": "k", "files": {"k.cubin": "0" * 64, "k.json": "0" * 64}}
            for i in range(10)}
    monkeypatch.setattr(bundle_mod, "Limits", lambda: Limits(entries=8, files=4))
    with pytest.raises(BundleError) as raised:
        write(tmp_path / "b.tar.gz", {"format": 1, "targets": {TARGET: rows}}, lambda *a: pytest.fail("read"))
    message = str(raised.value)
    assert "10 entries, over the 8 that" in message  # the first cap it is over is named
    assert "make 7 bundles" in message and "--shard I/7` (I = 1..7)" in message  # 20 files * 5 / (4 * 4)


def test_create_counts_both_kinds_of_bracket_against_the_readers_cap(tmp_path, monkeypatch):
    rows = {f"{i:064x}": {"entry_dir": f"E{i}", "entry_name": "k", "files": {"k.json": "0" * 64}, "rows": ["a", "b"]}
            for i in range(2)}
    header = {"format": 1, "targets": {TARGET: rows}}
    data = json.dumps(bundle_mod._canonical(header), indent=1).encode()
    braces, brackets = data.count(b"{"), data.count(b"[")
    assert brackets == 2
    monkeypatch.setattr(bundle_mod, "Limits", lambda: Limits(header_containers=braces + 1))
    with pytest.raises(BundleError, match=f": {braces + 2} brackets in {HEADER_NAME}, over the {braces + 1} that"):
        write(tmp_path / "b.tar.gz", header, lambda *a: pytest.fail("read"))


def test_a_header_whose_row_is_no_table_counts_no_files(tmp_path, monkeypatch):
    rows = {"a" * 64: "not a row", "b" * 64: {"files": "no table"}, "c" * 64: {"files": {"k": "0" * 64}}}
    assert bundle_mod._entries_and_files({"targets": {TARGET: rows}}) == (3, 1)


# ------------------------------------------------------------------------------------------- verify/read


def test_verify_reports_entries_files_and_bytes(bundled):
    path, _, variants = bundled
    report = verify(path)
    sizes = sum(len(data) for v in variants for data in _files(v).values())
    assert (report.entries, report.files, report.bytes, report.differences) == (2, 8, sizes, [])
    assert report.archive_bytes == path.stat().st_size and report.targets == {TARGET: 2}


def test_verify_names_how_this_runtime_differs(bundled, runtime):
    runtime["env"] = {"TRITON_DEFAULT_FP_FUSION": "0"}
    differences = verify(bundled[0]).differences
    assert len(differences) == 1 and differences[0].startswith("TRITON_DEFAULT_FP_FUSION: warmed with it unset")


def test_verify_compares_only_the_bundled_targets_backends(bundled, runtime):
    runtime["backends"] = {**runtime["backends"], "gfx942": "other hip tools"}  # a target the bundle lacks
    assert verify(bundled[0]).differences == []
    runtime["backends"] = {**runtime["backends"], "sm90": "ptxas 12.8 -90"}
    assert [d.split(":")[0] for d in verify(bundled[0]).differences] == ["sm90"]


def test_verify_of_a_malformed_fingerprint_says_so(bundled, tmp_path):
    out = _rewrite(bundled[0], tmp_path / "m.tar.gz", lambda h: {**h, "fingerprint": {"triton": "3.9"}})
    assert verify(out).differences == [f"{HEADER_NAME}: the fingerprint is malformed: cannot tell whether this "
                                       "runtime reads its entries"]


def test_verify_works_with_an_env_module_without_target_filtering(bundled, monkeypatch):
    """An ``env.differences`` that takes no ``targets`` (an older one) is called without it."""
    calls = []
    monkeypatch.setattr(env, "differences", lambda warmed, here: calls.append((warmed, here)) or ["x differs"])
    assert verify(bundled[0]).differences == ["x differs"] and calls == [(WARMED_FP, WARMED_FP)]


def test_read_header_reads_no_file(bundled, tmp_path):
    """Only the header is read: a bundle cut short after it still gives its rows."""
    path = bundled[0]
    data = gzip.decompress(path.read_bytes())
    cut = tmp_path / "cut.tar.gz"
    cut.write_bytes(gzip.compress(data[:2048 + len(_members(path)[0][1])]))
    assert read_header(cut)["targets"] == read_header(path)["targets"]


def test_a_missing_bundle_is_one_line_naming_it(tmp_path):
    with pytest.raises(BundleError) as raised:
        verify(tmp_path / "nope.tar.gz")
    assert str(raised.value) == f"{tmp_path / 'nope.tar.gz'}: No such file or directory"


def test_a_bundle_over_the_archive_cap_names_its_size(bundled):
    path = bundled[0]
    size = path.stat().st_size
    _refused(path, f"{path}: the archive ({size} bytes) is over the limit of {size - 1} bytes",
             Limits(archive_bytes=size - 1))
    assert verify(path, Limits(archive_bytes=size)).entries == 2  # at the cap: read


def test_an_archive_that_grows_while_read_stops_at_the_cap(bundled, monkeypatch):
    """The size is checked first, and the bytes read are counted too (a file appended to meanwhile)."""
    path = bundled[0]
    size = path.stat().st_size
    monkeypatch.setattr(bundle_mod.os.path, "getsize", lambda p: 10)
    _refused(path, f"{path}: the archive is over the limit of {size - 1} bytes", Limits(archive_bytes=size - 1))
    assert verify(path, Limits(archive_bytes=size)).entries == 2


def test_the_decompressed_cap_counts_every_byte(bundled):
    """Every byte read counts, tar headers included, up to the end-of-archive block (the padding after
    it is never read)."""
    path = bundled[0]
    with tarfile.open(path) as tar:
        read = max(m.offset_data + -(-m.size // 512) * 512 for m in tar.getmembers()) + 512
    assert verify(path, Limits(total_bytes=read)).entries == 2
    _refused(path, f"{path}: the decompressed archive (a decompression bomb?) is over the limit of {read - 1} bytes",
             Limits(total_bytes=read - 1))


def test_the_capped_reader_refuses_to_go_past_its_limit():
    reader = bundle_mod._Capped(io.BytesIO(b"0123456789"), 4, "the thing")
    buffer = bytearray(3)
    assert reader.readable() and reader.readinto(buffer) == 3 and bytes(buffer) == b"012"
    assert reader.read(1) == b"3"
    with pytest.raises(BundleError, match="^the thing is over the limit of 4 bytes$"):
        reader.read()
    assert bundle_mod._Capped(io.BytesIO(b"0123"), 4, "x").read() == b"0123"
    assert bundle_mod._Capped(io.BytesIO(b"0123"), 4, "x").read(None) == b"0123"
    with pytest.raises(BundleError):
        bundle_mod._Capped(io.BytesIO(b"01234"), 4, "x").read(-1)
    assert bundle_mod._Capped(io.BytesIO(b"0123"), 4, "x").read(0) == b""


@pytest.mark.parametrize("size", [-1, 3, 5, 6, 100])
def test_the_capped_reader_reads_at_most_one_byte_past_its_limit(size):
    """What bounds a decompression bomb's cost: past the cap, one byte more is read, never the rest."""
    inner = io.BytesIO(b"x" * 1000)
    reader = bundle_mod._Capped(inner, 4, "x")
    reader.read(3)
    with pytest.raises(BundleError):
        while reader.read(size):
            pass
    assert inner.tell() == 5


def test_not_a_gzip_names_the_archive_and_the_error(tmp_path):
    junk = tmp_path / "junk.tar.gz"
    junk.write_bytes(b"not gzip at all, long enough to be read")
    message = _refused(junk, f"{junk}: not a readable tritonwarm bundle (BadGzipFile: ")
    assert "Not a gzipped file" in message


def test_an_image_layer_is_named_as_the_caller_says(tmp_path):
    junk = tmp_path / "layer"
    junk.write_bytes(gzip.compress(b"x" * 700))
    with pytest.raises(BundleError) as raised:
        with bundle_mod.open_archive(junk, Limits(), what="layer sha256:ab", kind="image layer") as tar:
            tar.next()
    assert str(raised.value).startswith("layer sha256:ab: not a readable image layer (TarFormatError: ")


def test_an_empty_archive_has_no_header(tmp_path):
    path = _tar(tmp_path / "empty.tar.gz", [])
    with pytest.raises(BundleError, match=f"^{path}: the first member is missing"):
        read_header(path)
    assert str(pytest.raises(BundleError, verify, path).value) == \
        f"{path}: the first member is missing, not {HEADER_NAME}: not a tritonwarm bundle"


def test_a_first_member_that_is_not_the_header_is_named(tmp_path):
    path = _tar(tmp_path / "x.tar.gz", [("\x1b[2Jevil", b"{}")])
    _refused(path, f"the first member is '\\x1b[2Jevil', not {HEADER_NAME}")


def test_a_header_over_its_byte_cap_is_refused_before_it_is_read(bundled):
    path = bundled[0]
    size = len(_members(path)[0][1])
    assert verify(path, Limits(header_bytes=size)).entries == 2
    _refused(path, f"member '{HEADER_NAME}' ({size} bytes) is over the limit of {size - 1} bytes",
             Limits(header_bytes=size - 1))


def test_a_header_of_too_many_commas_or_brackets_is_not_parsed(bundled):
    path = bundled[0]
    data = _members(path)[0][1]
    commas, brackets = data.count(b","), data.count(b"[") + data.count(b"{")
    assert verify(path, Limits(header_commas=commas, header_containers=brackets)).entries == 2
    _refused(path, f"{path}: {HEADER_NAME} holds {commas} commas, over the limit of {commas - 1} (far more than a "
                   "real header)", Limits(header_commas=commas - 1))
    _refused(path, f"{HEADER_NAME} holds {brackets} brackets ('[' and '{{'), over the limit of {brackets - 1}",
             Limits(header_containers=brackets - 1))


def test_a_header_that_is_not_json_is_named(tmp_path):
    path = _tar(tmp_path / "x.tar.gz", [(HEADER_NAME, b"{not json")])
    _refused(path, f"{path}: {HEADER_NAME}: not JSON (")


def test_a_deeply_nested_header_is_refused_not_crashed(tmp_path):
    path = _tar(tmp_path / "x.tar.gz", [(HEADER_NAME, b"[" * 200_000 + b"]" * 200_000)])
    _refused(path, "not JSON", Limits(header_containers=300_000))


# ------------------------------------------------------------------------------------------ the header


@pytest.mark.parametrize("change, words", [
    (lambda h: [h], "format: not a tritonwarm bundle of format 1"),
    (lambda h: {**h, "format": 2}, "format: not a tritonwarm bundle of format 1"),
    (lambda h: {k: v for k, v in h.items() if k != "format"}, "format: not a tritonwarm bundle"),
    (lambda h: {**h, "fingerprint": None}, "fingerprint/targets: missing"),
    (lambda h: {k: v for k, v in h.items() if k != "fingerprint"}, "fingerprint/targets: missing"),
    (lambda h: {**h, "targets": []}, "fingerprint/targets: missing"),
    (lambda h: {**h, "targets": {"sm90": []}}, "targets.sm90: not a table of rows"),
    (lambda h: {**h, "targets": {"sm 90": {}}}, "targets.'sm 90': not a target name"),
    (lambda h: {**h, "targets": {"x" * 65: {}}}, f"targets.{'x' * 65!r}: not a target name"),
    (lambda h: {**h, "binary_only": 1}, "binary_only: 1 is not true or false"),
    (lambda h: {**h, "environments": []}, "environments: not a table of fingerprints per target"),
    (lambda h: {**h, "environments": {"gfx942": {}}}, "environments: not a table"),
    (lambda h: {**h, "environments": {"sm90": []}}, "environments: not a table"),
    (lambda h: {**h, "environments": {"sm90": {FP_ID: "x"}}}, "environments: not a table"),
])
def test_a_malformed_header_is_refused_naming_the_field(bundled, tmp_path, change, words):
    out = _rewrite(bundled[0], tmp_path / "bad.tar.gz", change)
    message = _refused(out, f"{out}: {HEADER_NAME}: {words}")
    assert message.count("\n") == 0


def test_a_long_field_name_is_cut_to_120_characters(bundled, tmp_path):
    name = "t" * 200
    out = _rewrite(bundled[0], tmp_path / "t.tar.gz", lambda h: {**h, "targets": {name: {}}})
    where = f"targets.{name!r}"
    _refused(out, f"{HEADER_NAME}: {where[:120]}… ({len(where) - 120} more characters): not a target name")


def test_a_row_without_files_is_refused(bundled, tmp_path):
    out = _rewrite(bundled[0], tmp_path / "bad.tar.gz", lambda h: _only_row(h).pop("files") and None)
    _refused(out, ".files: missing")


def test_a_target_name_of_64_characters_is_one(bundled, tmp_path):
    name = "t" * 64

    def rename(header):
        header["targets"] = {name: {h: {**row, "target": name} for h, row in header["targets"][TARGET].items()}}
        header["environments"] = {name: header["environments"][TARGET]}

    out = _rewrite(bundled[0], tmp_path / "t.tar.gz", rename)
    assert verify(out).targets == {name: 2}


def test_a_header_without_binary_only_or_environments_reads_as_before_they_were_written(bundled, tmp_path):
    def old(header):
        return {k: v for k, v in header.items() if k not in ("binary_only", "environments")} | {
            "targets": {TARGET: {h: {k: v for k, v in row.items() if k != "environment"}
                                 for h, row in header["targets"][TARGET].items()}}}

    out = _rewrite(bundled[0], tmp_path / "old.tar.gz", old)
    header = read_header(out)
    assert header["binary_only"] is False and header["environments"] == {}
    assert verify(out).entries == 2


def test_the_entry_and_file_caps_are_the_headers_counts(bundled):
    path = bundled[0]
    assert verify(path, Limits(entries=2, files=8)).entries == 2
    _refused(path, f"{HEADER_NAME}: targets: 2 entries, over the limit of 1 (far more than a real cache holds)",
             Limits(entries=1))
    _refused(path, f"{HEADER_NAME}: targets: 8 files, over the limit of 7 (far more than a real cache holds)",
             Limits(files=7))


def test_the_files_per_entry_cap(bundled):
    path = bundled[0]
    assert verify(path, Limits(files_per_entry=4)).entries == 2
    message = _refused(path, ".files: 4 files, over the limit of 3 (a Triton entry has under 10)",
                       Limits(files_per_entry=3))
    row_hash = min(read_header(path)["targets"][TARGET])
    assert f"targets.{TARGET}.{row_hash[:16]}.files" in message


def test_a_row_problem_names_the_row_and_field(bundled, tmp_path):
    def change(header):
        row = _only_row(header)
        row["num_stages"] = "3"

    out = _rewrite(bundled[0], tmp_path / "bad.tar.gz", change)
    row_hash = next(iter(read_header(bundled[0])["targets"][TARGET]))
    _refused(out, f"{HEADER_NAME}: targets.{TARGET}.{row_hash[:16]}.num_stages: '3' is not an integer")


def test_a_row_without_a_field_a_bundle_must_carry_is_refused(bundled, tmp_path):
    out = _rewrite(bundled[0], tmp_path / "bad.tar.gz", lambda h: _only_row(h).pop("rows") and None)
    _refused(out, ".rows: missing")


def test_a_row_without_its_metadata_file_is_refused(bundled, tmp_path):
    def change(header):
        row = _only_row(header)
        row["entry_name"] = "other_kernel"

    out = _rewrite(bundled[0], tmp_path / "bad.tar.gz", change)
    _refused(out, ".files: no 'other_kernel.json': Triton's metadata of the entry")


def test_the_metadata_name_is_cut_as_triton_cuts_it(tmp_path, runtime):
    name = "k" * 200
    variant = _variant(1, name=name)
    _warm(tmp_path / "c", [variant])
    os.rename(tmp_path / "c" / variant.entry_dir / f"{name}.json", tmp_path / "c" / variant.entry_dir / "m")
    digests = _entry(tmp_path / "d", variant)  # written anew with the full name ...
    folder = tmp_path / "d" / variant.entry_dir
    data = (folder / f"{name}.json").read_bytes()
    (folder / f"{name}.json").unlink()
    (folder / f"{name[:150]}.json").write_bytes(data)  # ... and its metadata as Triton names it
    files = {(f"{name[:150]}.json" if n == f"{name}.json" else n): d for n, d in digests.items()}
    (folder / f"__grp__{name}.json").unlink()
    (folder / f"__grp__{name[:150]}.json").write_text(json.dumps({"child_paths": {n: str(folder / n) for n in files}}))
    Manifest(tmp_path / "d", TARGET).update({variant.cache_hash: _row(variant, files)}, environments={FP_ID: WARMED_FP})
    out = tmp_path / "b.tar.gz"
    create(out, tmp_path / "d", {TARGET: [variant]})
    names = sorted(info.name.split("/")[1] for info, _ in _members(out)[1:])
    assert f"__grp__{name[:150]}.json" in names and f"{name[:150]}.json" in names
    assert install(out, tmp_path / "e", compare_environment=False).installed == 1


def test_a_row_of_an_environment_the_header_lacks_is_refused(bundled, tmp_path):
    out = _rewrite(bundled[0], tmp_path / "bad.tar.gz", lambda h: {**h, "environments": {}})
    row_hash = min(read_header(bundled[0])["targets"][TARGET])
    _refused(out, f"targets.{TARGET}.{row_hash[:16]}.environment: {FP_ID!r} is not in environments.{TARGET}")


def test_one_entry_filed_twice_must_hold_the_same_files(bundled, tmp_path, runtime):
    """The same entry under two targets: once is enough, with other files it is refused."""
    def twice(header):
        header["targets"]["gfx942"] = json.loads(json.dumps(header["targets"][TARGET]))
        for row in header["targets"]["gfx942"].values():
            row["target"] = "gfx942"
        header["environments"]["gfx942"] = header["environments"][TARGET]

    same = _rewrite(bundled[0], tmp_path / "same.tar.gz", twice)
    report = verify(same)
    assert (report.entries, report.targets) == (2, {"gfx942": 2, TARGET: 2})

    def other_files(header):
        twice(header)
        row = next(iter(header["targets"]["gfx942"].values()))
        row["files"] = {**row["files"], "rms_norm_kernel.ptx": "0" * 64}

    out = _rewrite(bundled[0], tmp_path / "other.tar.gz", other_files)
    first = next(iter(read_header(bundled[0])["targets"][TARGET]))
    _refused(out, f"{HEADER_NAME}: targets.gfx942.{first[:16]}: the same entry appears twice with different files")


# ------------------------------------------------------------------------------------------- members


def test_a_member_with_a_backslash_climb_is_refused(bundled, tmp_path):
    entry = read_header(bundled[0])["targets"][TARGET]
    entry_dir = next(iter(entry.values()))["entry_dir"]
    out = _rewrite(bundled[0], tmp_path / "x.tar.gz",
                   change_members=lambda m: m + [(f"{entry_dir}\\..\\..\\x", b"bad")])
    _refused(out, "climbs out with '..'; refused")


def test_a_member_at_the_member_cap_is_read(bundled):
    path = bundled[0]
    largest = max(len(d) for info, d in _members(path)[1:])
    assert verify(path, Limits(member_bytes=largest)).entries == 2
    _refused(path, f"bytes) is over the limit of {largest - 1} bytes", Limits(member_bytes=largest - 1))


def test_the_member_count_cap(bundled):
    path = bundled[0]
    assert verify(path, Limits(members=11)).entries == 2
    _refused(path, f"{path}: more than 10 members", Limits(members=10))


def test_a_group_or_metadata_over_its_cap_is_refused(bundled):
    path = bundled[0]
    members = {info.name: data for info, data in _members(path)}
    group = max(len(d) for n, d in members.items() if "__grp__" in n)
    metadata = max(len(d) for n, d in members.items() if n.endswith("kernel.json") and "__grp__" not in n)
    assert verify(path, Limits(json_file_bytes=max(group, metadata))).entries == 2
    message = _refused(path, f"bytes) is over the limit of {min(group, metadata)} bytes for an entry's group or "
                             "metadata", Limits(json_file_bytes=min(group, metadata)))
    assert "__grp__" in message if group > metadata else "kernel.json" in message


def _with_big_cubin(tmp_path, size: int) -> Path:
    variant = _variant(1)
    _warm(tmp_path / "c", [variant])
    cubin = tmp_path / "c" / variant.entry_dir / "rms_norm_kernel.cubin"
    cubin.write_bytes(b"c" * size)
    rows = Manifest(tmp_path / "c", TARGET).read()
    rows[variant.cache_hash]["files"]["rms_norm_kernel.cubin"] = _sha(cubin.read_bytes())
    Manifest(tmp_path / "c", TARGET).update(rows)
    out = tmp_path / "big.tar.gz"
    create(out, tmp_path / "c", {TARGET: [variant]})
    return out


def test_a_large_binary_is_not_held_to_the_json_cap(tmp_path, runtime):
    """The cubin is only hashed: the cap on the files that are parsed does not apply to it."""
    out = _with_big_cubin(tmp_path, 5000)
    assert verify(out, Limits(json_file_bytes=1000)).entries == 1


def test_metadata_larger_than_one_read_is_parsed_whole(tmp_path, runtime):
    """A caller that raises the cap on parsed files gets metadata over a MiB (read in parts) checked whole."""
    variant = _variant(1)
    _warm(tmp_path / "c", [variant])
    metadata = tmp_path / "c" / variant.entry_dir / "rms_norm_kernel.json"
    head, tail = '{"notes": "', '", "hash": "'
    notes = "n" * ((1 << 20) - 10 - len(head) - len(tail))  # the first MiB ends inside the hash
    metadata.write_text(f'{head}{notes}{tail}{variant.cache_hash}"}}')
    assert json.loads(metadata.read_text())["hash"] == variant.cache_hash
    rows = Manifest(tmp_path / "c", TARGET).read()
    rows[variant.cache_hash]["files"]["rms_norm_kernel.json"] = _sha(metadata.read_bytes())
    Manifest(tmp_path / "c", TARGET).update(rows)
    out = tmp_path / "b.tar.gz"
    create(out, tmp_path / "c", {TARGET: [variant]})
    assert verify(out, Limits(json_file_bytes=2 << 20)).entries == 1


def test_metadata_over_the_json_cap_is_named(tmp_path, runtime):
    out = _with_big_cubin(tmp_path, 5000)
    members = {info.name: data for info, data in _members(out)}
    [(name, data)] = [(n, d) for n, d in members.items() if n.endswith("/rms_norm_kernel.json")]
    assert all(len(d) > len(data) for n, d in members.items() if "__grp__" in n)
    message = _refused(out, f"member {name!r} ({len(data)} bytes) is over the limit of {len(data) - 1} bytes for an "
                            "entry's group or metadata", Limits(json_file_bytes=len(data) - 1))
    assert message.startswith(f"{out}: ")


@pytest.mark.parametrize("group", [b"not json", b"[]", b'{"other": 1}', b'{"child_paths": {}}'])
def test_a_group_naming_other_files_is_refused(bundled, tmp_path, group):
    out = _rewrite(bundled[0], tmp_path / "g.tar.gz",
                   change_members=lambda m: [(n, group if "__grp__" in n else d) for n, d in m])
    message = _refused(out, "__grp__rms_norm_kernel.json' names other files than the entry holds; refused")
    assert message.startswith(f"{out}: member '")


def test_a_changed_file_names_both_hashes(bundled, tmp_path):
    path = bundled[0]
    members = [(info.name, data) for info, data in _members(path)]
    name, data = next((n, d) for n, d in members if n.endswith(".ptx"))
    changed = data + b" "
    out = _rewrite(path, tmp_path / "c.tar.gz", change_members=lambda m: [(n, changed if n == name else d)
                                                                          for n, d in m])
    _refused(out, f"member {name!r}: sha256 {_sha(changed)[:16]}… differs from the recorded {_sha(data)[:16]}…; "
                  "the bundle is damaged or was altered")


def test_metadata_naming_another_key_names_the_member(bundled, tmp_path):
    path = bundled[0]
    members = [(info.name, data) for info, data in _members(path)]
    name = next(n for n, _ in members if n.endswith("kernel.json") and "__grp__" not in n)
    other = json.dumps({"hash": "0" * 64}).encode()

    def change_header(header):
        for row in header["targets"][TARGET].values():
            if name.startswith(row["entry_dir"] + "/"):
                row["files"]["rms_norm_kernel.json"] = _sha(other)

    out = _rewrite(path, tmp_path / "m.tar.gz", change_header,
                   lambda m: [(n, other if n == name else d) for n, d in m])
    _refused(out, f"member {name!r}: the entry's metadata names the cache hash '0000000000000000'...")


def test_a_missing_member_is_named_with_the_count(bundled, tmp_path):
    out = _rewrite(bundled[0], tmp_path / "m.tar.gz",
                   change_members=lambda m: [(n, d) for n, d in m if not n.endswith((".ptx", ".source"))])
    names = sorted(f"{v.entry_dir}/{v.entry_name}.{ext}" for v in bundled[2] for ext in ("ptx", "source"))
    _refused(out, f"member {names[0]!r} is missing (4 missing in all)")


def test_a_missing_group_is_missing(bundled, tmp_path):
    out = _rewrite(bundled[0], tmp_path / "m.tar.gz",
                   change_members=lambda m: [(n, d) for n, d in m if "__grp__" not in n])
    _refused(out, "__grp__rms_norm_kernel.json' is missing (2 missing in all)")


def test_an_unlisted_member_is_named(bundled, tmp_path):
    out = _rewrite(bundled[0], tmp_path / "m.tar.gz", change_members=lambda m: m + [("ABC/x.so", b"x")])
    _refused(out, f"{out}: member 'ABC/x.so' is outside the expected layout (<entry folder>/<file> of an entry "
                  "the header lists); refused")


def test_a_member_named_twice_is_refused(bundled, tmp_path):
    out = _rewrite(bundled[0], tmp_path / "m.tar.gz", change_members=lambda m: m + [m[1]])
    _refused(out, f"{out}: member {_members(bundled[0])[1][0].name!r} appears twice")


def test_a_member_name_from_the_archive_is_escaped_and_cut(bundled, tmp_path):
    name = "/" + "\x1b" * 300
    out = _rewrite(bundled[0], tmp_path / "m.tar.gz", change_members=lambda m: m + [(name, b"x")])
    message = _refused(out, "is an absolute path; refused")
    assert message.startswith(f"{out}: member '/")
    assert "\x1b" not in message and "\\x1b" in message and len(message) < 400


def test_a_long_member_name_is_quoted_to_120_characters(bundled, tmp_path):
    name = "/" + "n" * 300
    out = _rewrite(bundled[0], tmp_path / "m.tar.gz", change_members=lambda m: m + [(name, b"x")])
    quoted = repr(name)
    _refused(out, f"member {quoted[:120]}… ({len(quoted) - 120} more characters) is an absolute path")


@pytest.mark.parametrize("kind, words", [(tarfile.SYMTYPE, "is a symbolic link, not a regular file; refused"),
                                         (tarfile.DIRTYPE, "is a directory, not a regular file; refused")])
def test_a_member_that_is_no_regular_file_is_refused(bundled, tmp_path, kind, words):
    entry_dir = _members(bundled[0])[1][0].name.split("/")[0]
    info = tarfile.TarInfo(f"{entry_dir}/link")
    info.type, info.linkname = kind, "/etc/passwd"
    members = [(i.name, d) for i, d in _members(bundled[0])] + [(info, None)]
    out = _tar(tmp_path / "l.tar.gz", members)
    message = _refused(out, words)
    assert f"member '{entry_dir}/link" in message


def test_a_sink_that_reads_nothing_still_hashes_every_byte(bundled, tmp_path):
    """What the reader's caller leaves unread is read and hashed all the same."""
    seen = []
    header, total = bundle_mod._stream_files(bundled[0], Limits(), lambda d, n, chunks: seen.append((d, n)))
    assert total == sum(len(data) for v in bundled[2] for data in _files(v).values())
    assert len(seen) == 8 and header["targets"] == read_header(bundled[0])["targets"]
    path = bundled[0]
    name = next(i.name for i, _ in _members(path) if i.name.endswith(".cubin"))
    out = _rewrite(path, tmp_path / "x.tar.gz", change_members=lambda m: [(n, d + b"!" if n == name else d)
                                                                          for n, d in m])
    with pytest.raises(BundleError, match="differs from the recorded"):
        bundle_mod._stream_files(out, Limits(), lambda d, n, chunks: None)


def test_files_are_streamed_in_chunks(bundled, tmp_path, runtime):
    """A file over a MiB is passed on in parts of a MiB: never read whole into memory."""
    variant = _variant(1)
    _warm(tmp_path / "c", [variant])
    big = tmp_path / "c" / variant.entry_dir / "rms_norm_kernel.cubin"
    big.write_bytes(os.urandom((1 << 20) + 5))
    rows = Manifest(tmp_path / "c", TARGET).read()
    rows[variant.cache_hash]["files"]["rms_norm_kernel.cubin"] = _sha(big.read_bytes())
    Manifest(tmp_path / "c", TARGET).update(rows)
    out = tmp_path / "big.tar.gz"
    create(out, tmp_path / "c", {TARGET: [variant]})
    sizes = {}
    bundle_mod._stream_files(out, Limits(), lambda d, n, chunks: sizes.setdefault(n, [len(c) for c in chunks]))
    assert sizes["rms_norm_kernel.cubin"] == [1 << 20, 5]


# ---------------------------------------------------------------------------------------------- install


def test_install_puts_every_entry_in_place_with_groups_naming_it(bundled, tmp_path):
    path, _, variants = bundled
    dest = tmp_path / "dest"
    report = install(path, dest, compare_environment=False)
    assert (report.installed, report.already, report.entries, report.files) == (2, 0, 2, 8)
    assert report.bytes == sum(len(data) for v in variants for data in _files(v).values())
    for variant in variants:
        folder = dest / variant.entry_dir
        group = json.loads((folder / f"__grp__{variant.entry_name}.json").read_text())
        assert group == {"child_paths": {n: str(folder / n) for n in _files(variant)}}
        assert {n: (folder / n).read_bytes() for n in _files(variant)} == _files(variant)
    assert sorted(e for e, *_ in report.layout) == sorted(v.entry_dir for v in variants)
    entry_dir, entry_name, cache_hash, files = next(x for x in report.layout if x[0] == variants[0].entry_dir)
    assert (entry_name, cache_hash) == ("rms_norm_kernel", variants[0].cache_hash)
    assert files == {n: _sha(d) for n, d in _files(variants[0]).items()}
    assert not [p for p in (dest / "tritonwarm").iterdir() if p.name.startswith(".install-")]


def test_install_merges_the_manifest_with_its_environment_and_records_the_entries(bundled, tmp_path):
    path, cache_dir, variants = bundled
    dest = tmp_path / "dest"
    install(path, dest, compare_environment=False)
    manifest = Manifest(dest, TARGET)
    assert manifest.read() == Manifest(cache_dir, TARGET).read()
    assert manifest.environments() == {FP_ID: WARMED_FP}
    assert not manifest.journal.exists()  # folded into the file
    assert sorted(PlanSources(dest, TARGET).read()["installed"]) == sorted(v.cache_hash for v in variants)


def test_install_of_rows_without_environments(bundled, tmp_path):
    def old(header):
        header["environments"] = {}
        for row in header["targets"][TARGET].values():
            row.pop("environment")

    out = _rewrite(bundled[0], tmp_path / "old.tar.gz", old)
    dest = tmp_path / "dest"
    install(out, dest, compare_environment=False)
    assert len(Manifest(dest, TARGET).read()) == 2 and Manifest(dest, TARGET).environments() == {}


def test_install_twice_leaves_the_entries_alone(bundled, tmp_path):
    path, _, variants = bundled
    dest = tmp_path / "dest"
    install(path, dest, compare_environment=False)
    stamps = {p: p.stat().st_mtime_ns for p in dest.glob("*/*")}
    again = install(path, dest, compare_environment=False)
    assert (again.installed, again.already) == (0, 2)
    assert {p: p.stat().st_mtime_ns for p in dest.glob("*/*")} == stamps


def test_install_replaces_a_damaged_entry_and_a_foreign_one(bundled, tmp_path):
    path, _, variants = bundled
    dest = tmp_path / "dest"
    install(path, dest, compare_environment=False)
    (dest / variants[0].entry_dir / "rms_norm_kernel.ptx").write_bytes(b"damaged")
    report = install(path, dest, compare_environment=False)
    assert (report.installed, report.already) == (1, 1)
    assert (dest / variants[0].entry_dir / "rms_norm_kernel.ptx").read_bytes() == _files(variants[0])[
        "rms_norm_kernel.ptx"]
    elsewhere = tmp_path / "elsewhere"
    install(path, elsewhere, compare_environment=False)
    group = dest / variants[1].entry_dir / "__grp__rms_norm_kernel.json"
    group.write_text(json.dumps({"child_paths": {n: str(elsewhere / variants[1].entry_dir / n)
                                                 for n in _files(variants[1])}}))  # intact files, not its own
    report = install(path, dest, compare_environment=False)
    assert (report.installed, report.already) == (1, 1)
    assert str(dest) in group.read_text()


def test_install_replaces_a_file_or_a_link_where_an_entry_goes(bundled, tmp_path):
    path, _, variants = bundled
    dest = tmp_path / "dest"
    dest.mkdir()
    (dest / variants[0].entry_dir).write_text("not a folder")
    (dest / variants[1].entry_dir).symlink_to(tmp_path / "nowhere")
    report = install(path, dest, compare_environment=False)
    assert report.installed == 2
    assert all((dest / v.entry_dir).is_dir() and not (dest / v.entry_dir).is_symlink() for v in variants)


def test_install_reports_differences_only_when_asked(bundled, tmp_path, runtime):
    runtime["env"] = {"TRITON_DEFAULT_FP_FUSION": "0"}
    assert install(bundled[0], tmp_path / "a", compare_environment=False).differences == []
    differences = install(bundled[0], tmp_path / "b").differences
    assert len(differences) == 1 and "TRITON_DEFAULT_FP_FUSION" in differences[0]


def _flushed(monkeypatch) -> set[int]:
    """The inodes of what ``os.fsync`` is called on from now on."""
    inodes = set()
    real = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: inodes.add(os.fstat(fd).st_ino) or real(fd))
    return inodes


def _entry_files(cache_dir, variants) -> set[int]:
    return {p.stat().st_ino for v in variants for p in (cache_dir / v.entry_dir).iterdir() if "__grp__" not in p.name}


def test_install_flushes_each_file_and_the_folder_unless_told_not_to(bundled, tmp_path, monkeypatch):
    flushed = _flushed(monkeypatch)
    report = install(bundled[0], tmp_path / "a", compare_environment=False, durable=False)
    assert report.installed == 2
    files = _entry_files(tmp_path / "a", bundled[2])
    assert len(files) == 8 and not files & flushed and (tmp_path / "a").stat().st_ino not in flushed
    install(bundled[0], tmp_path / "b", compare_environment=False)
    files = _entry_files(tmp_path / "b", bundled[2])
    assert files <= flushed and (tmp_path / "b").stat().st_ino in flushed
    flushed.clear()
    install(bundled[0], tmp_path / "b", compare_environment=False)
    assert (tmp_path / "b").stat().st_ino not in flushed  # nothing moved in: the folder is not flushed


def test_a_refused_bundle_moves_nothing_into_the_cache(bundled, tmp_path):
    path, _, _ = bundled
    dest = tmp_path / "dest"
    install(path, dest, compare_environment=False)
    before = sorted(str(p.relative_to(dest)) for p in dest.rglob("*") if "locks" not in p.parts)
    out = _rewrite(path, tmp_path / "bad.tar.gz", change_members=lambda m: m[:-1])
    with pytest.raises(BundleError, match="is missing"):
        install(out, tmp_path / "fresh", compare_environment=False)
    assert not list((tmp_path / "fresh").glob("*/*.cubin"))
    assert not [p for p in (tmp_path / "fresh" / "tritonwarm").iterdir() if p.name.startswith(".install-")]
    with pytest.raises(BundleError):
        install(out, dest, compare_environment=False)
    assert sorted(str(p.relative_to(dest)) for p in dest.rglob("*") if "locks" not in p.parts) == before


def test_install_sets_a_damaged_manifest_aside_and_rebuilds_it(bundled, tmp_path):
    path, _, _ = bundled
    dest = tmp_path / "dest"
    (dest / "tritonwarm").mkdir(parents=True)
    (dest / "tritonwarm" / f"manifest-{TARGET}.json").write_text("{damaged")
    report = install(path, dest, compare_environment=False)
    manifest = dest / "tritonwarm" / f"manifest-{TARGET}.json"
    assert report.set_aside == [f"{manifest} was damaged: set aside as manifest-{TARGET}.json.damaged and rebuilt "
                                "from the entries this bundle installs (a warm-up with the specs records any others "
                                "again)"]
    assert (dest / "tritonwarm" / f"manifest-{TARGET}.json.damaged").read_text() == "{damaged"
    assert len(Manifest(dest, TARGET).read()) == 2
    assert install(path, dest, compare_environment=False).set_aside == []


def test_install_stages_in_a_folder_named_after_this_host_and_process(bundled, tmp_path, monkeypatch):
    """What a later install recognises as a killed install's leftovers, by host and process id."""
    state = tmp_path / "dest" / "tritonwarm"
    seen = set()
    real = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: seen.update(p.name for p in state.glob(".install-*")) or real(fd))
    install(bundled[0], tmp_path / "dest", compare_environment=False)
    [staging] = seen
    assert staging.startswith(f".install-{socket.gethostname()}-{os.getpid()}-")
    assert not list(state.glob(".install-*"))


def test_install_removes_the_staging_of_a_killed_install_only(bundled, tmp_path):
    """A staging folder of an install on this host whose process is gone is removed; a running one's
    (left untouched, process and folder), another host's, or one whose name does not parse, is left."""
    dest = tmp_path / "dest"
    state = dest / "tritonwarm"
    state.mkdir(parents=True)
    host = socket.gethostname()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    alive = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        folders = {"dead": state / f".install-{host}-{dead.pid}-abc", "alive": state / f".install-{host}-{alive.pid}-x",
                   "other host": state / f".install-{host}x-{dead.pid}-abc", "odd": state / f".install-{host}-pid-x"}
        for folder in folders.values():
            (folder / "E").mkdir(parents=True)
        install(bundled[0], dest, compare_environment=False)
        assert {what for what, folder in folders.items() if folder.exists()} == {"alive", "other host", "odd"}
        assert alive.poll() is None  # only asked whether it runs
    finally:
        alive.kill()
        alive.wait()


def test_install_for_a_mount_path_counts_an_entry_named_there_as_intact(bundled, tmp_path):
    path, _, variants = bundled
    volume, mount = tmp_path / "volume", tmp_path / "srv"
    install(path, volume, compare_environment=False)
    assert serve_from(volume, mount) == 2
    group = volume / variants[0].entry_dir / "__grp__rms_norm_kernel.json"
    named = group.read_text()
    assert str(mount / variants[0].entry_dir / "rms_norm_kernel.cubin") in named
    report = install(path, volume, compare_environment=False, serve_at=mount)
    assert (report.installed, report.already) == (0, 2) and group.read_text() == named
    report = install(path, volume, compare_environment=False, serve_at=tmp_path / "other")
    assert report.installed == 2  # named for another mount path: put in place again, for here


def test_install_for_a_mount_path_replaces_a_damaged_entry_named_there(bundled, tmp_path):
    path, _, variants = bundled
    volume, mount = tmp_path / "volume", tmp_path / "srv"
    install(path, volume, compare_environment=False)
    serve_from(volume, mount)
    (volume / variants[0].entry_dir / "rms_norm_kernel.cubin").write_bytes(b"damaged")
    report = install(path, volume, compare_environment=False, serve_at=mount)
    assert (report.installed, report.already) == (1, 1)


# ----------------------------------------------------------------------------------- serving elsewhere


def test_serve_from_points_every_recorded_entry_there_and_back(bundled, tmp_path):
    path, _, variants = bundled
    folder, mount = tmp_path / "folder", tmp_path / "srv"
    install(path, folder, compare_environment=False)
    assert serve_from(folder, None) == 0 and not (folder / "tritonwarm" / "serve-at.json").exists()
    assert serve_from(folder, mount) == 2
    assert json.loads((folder / "tritonwarm" / "serve-at.json").read_text()) == {"path": str(mount)}

    def named_at():
        return {str(Path(p).parent.parent) for v in variants for p in json.loads(
            (folder / v.entry_dir / "__grp__rms_norm_kernel.json").read_text())["child_paths"].values()}

    assert named_at() == {str(mount)}
    assert serve_from(folder, mount) == 0  # already there: nothing rewritten
    assert serve_from(folder, None) == 2 and named_at() == {str(folder)}
    assert not (folder / "tritonwarm" / "serve-at.json").exists()


def test_serve_from_a_relative_folder_names_absolute_paths(bundled, tmp_path, monkeypatch):
    install(bundled[0], tmp_path / "folder", compare_environment=False)
    monkeypatch.chdir(tmp_path)
    serve_from(Path("folder"), tmp_path / "srv")
    assert serve_from(Path("folder"), None) == 2
    group = next((tmp_path / "folder").glob("*/__grp__*.json"))
    assert all(p.startswith(str(tmp_path / "folder")) for p in json.loads(group.read_text())["child_paths"].values())


def test_recorded_layout_lists_every_manifest_row_with_files(bundled, tmp_path):
    path, cache_dir, variants = bundled
    folder = tmp_path / "folder"
    install(path, folder, compare_environment=False)
    other = _variant(7, target="gfx942")
    digests = _entry(folder, other)
    old = {**_row(other, digests), "target": "gfx942"}
    del old["files"]
    Manifest(folder, "gfx942").update({other.cache_hash: old})  # a row written before files were recorded
    layout = recorded_layout(folder)
    assert sorted(layout) == sorted((v.entry_dir, v.entry_name, v.cache_hash, {n: _sha(d) for n, d in
                                                                               _files(v).items()}) for v in variants)


def test_point_groups_skips_a_pruned_entry_and_replaces_a_damaged_group(bundled, tmp_path):
    path, _, variants = bundled
    folder = tmp_path / "folder"
    report = install(path, folder, compare_environment=False)
    gone = tmp_path / "pruned"
    os.rename(folder / variants[0].entry_dir, gone)
    group = folder / variants[1].entry_dir / "__grp__rms_norm_kernel.json"
    group.write_text('{"child_paths": [1]}')
    assert point_groups(folder, report.layout, tmp_path / "srv") == 1
    assert not (folder / variants[0].entry_dir).exists()
    assert json.loads(group.read_text())["child_paths"] == {
        n: str(tmp_path / "srv" / variants[1].entry_dir / n) for n in sorted(_files(variants[1]))}
    group.write_text("not json")
    assert point_groups(folder, report.layout, folder) == 1
    assert point_groups(folder, report.layout, folder) == 0


def test_point_groups_writes_durably_only_when_asked(bundled, tmp_path, monkeypatch):
    path = bundled[0]
    folder = tmp_path / "folder"
    report = install(path, folder, compare_environment=False)
    calls = []
    real = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: calls.append(fd) or real(fd))
    point_groups(folder, report.layout, tmp_path / "a", durable=False)
    assert calls == []
    point_groups(folder, report.layout, tmp_path / "b")
    assert len(calls) == 2


def test_serve_from_writes_durably_only_when_asked(bundled, tmp_path, monkeypatch):
    folder = tmp_path / "folder"
    install(bundled[0], folder, compare_environment=False)
    calls = []
    real = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: calls.append(fd) or real(fd))
    serve_from(folder, tmp_path / "a", durable=False)
    assert calls == []
    serve_from(folder, tmp_path / "b")
    assert len(calls) == 3  # the recorded path, then each group


# ------------------------------------------------------------------------------------------------ merge


def _shard(tmp_path, name, variants, fp=None, binary_only=False):
    cache_dir = tmp_path / f"cache-{name}"
    _warm(cache_dir, variants, fp)
    out = tmp_path / f"{name}.tar.gz"
    create(out, cache_dir, {TARGET: variants}, binary_only=binary_only)
    return out


def test_merge_of_shards_equals_one_bundle_of_all(tmp_path, runtime):
    variants = [_variant(i) for i in range(4)]
    whole = _shard(tmp_path, "whole", variants)
    shards = [_shard(tmp_path, "a", variants[:1]), _shard(tmp_path, "b", variants[1:3]),
              _shard(tmp_path, "c", variants[3:])]
    out = tmp_path / "out" / "dist" / "merged.tar.gz"
    report = merge(out, shards)
    assert out.read_bytes() == whole.read_bytes()
    assert (report.entries, report.files, report.targets) == (4, 16, {TARGET: 4})
    assert report.archive_bytes == out.stat().st_size
    assert [p.name for p in out.parent.iterdir()] == ["merged.tar.gz"]  # no temporary folder left


def _shard_of_rows(tmp_path, name, variant, **row):
    """The bundle of one entry whose manifest row holds ``row``'s fields."""
    cache_dir = tmp_path / f"cache-{name}"
    recorded = {**_row(variant, _entry(cache_dir, variant)), **row}
    Manifest(cache_dir, TARGET).update({variant.cache_hash: recorded}, environments={FP_ID: WARMED_FP})
    out = tmp_path / f"{name}.tar.gz"
    create(out, cache_dir, {TARGET: [variant]})
    return out


def test_merge_joins_the_rows_of_an_entry_in_two_shards(tmp_path, runtime):
    """An entry two shards both warmed lists the spec rows of both; its compile time is the one a
    shard recorded (a shard that found it cached recorded none)."""
    variant = _variant(1)
    a = _shard_of_rows(tmp_path, "a", variant, rows=["row5", "row1"], compile_seconds=None)
    b = _shard_of_rows(tmp_path, "b", variant, rows=["row9", "row1"], compile_seconds=2.5)
    c = _shard_of_rows(tmp_path, "c", variant, rows=["row0"], compile_seconds=None)
    for order, seconds in (([a, b], 2.5), ([b, a], 2.5), ([a, c], None)):
        row = read_header(merge(tmp_path / "m.tar.gz", order).path)["targets"][TARGET][variant.cache_hash]
        assert row["compile_seconds"] == seconds, order
    row = read_header(merge(tmp_path / "m.tar.gz", [a, b, c]).path)["targets"][TARGET][variant.cache_hash]
    assert row["rows"] == ["row0", "row1", "row5", "row9"] and row["compile_seconds"] == 2.5
    assert {k: v for k, v in row.items() if k not in ("rows", "compile_seconds")} == {
        k: v for k, v in read_header(a)["targets"][TARGET][variant.cache_hash].items()
        if k not in ("rows", "compile_seconds")}
    d = _shard_of_rows(tmp_path, "d", variant, compile_seconds=3.0)
    row = read_header(merge(tmp_path / "m.tar.gz", [d, b]).path)["targets"][TARGET][variant.cache_hash]
    assert row["compile_seconds"] == 3.0  # the first one recorded


def test_merge_refuses_an_entry_with_other_contents(tmp_path, runtime):
    variant = _variant(1)
    a = _shard(tmp_path, "a", [variant])
    b_cache = tmp_path / "cache-b"
    _warm(b_cache, [variant])
    cubin = b_cache / variant.entry_dir / "rms_norm_kernel.cubin"
    cubin.write_bytes(b"other")
    rows = Manifest(b_cache, TARGET).read()
    rows[variant.cache_hash]["files"]["rms_norm_kernel.cubin"] = _sha(b"other")
    Manifest(b_cache, TARGET).update(rows)
    b = tmp_path / "b.tar.gz"
    create(b, b_cache, {TARGET: [variant]})
    with pytest.raises(BundleError) as raised:
        merge(tmp_path / "m.tar.gz", [a, b])
    assert str(raised.value) == f"{b}: entry {variant.cache_hash[:12]} has other file contents than an earlier " \
                                "bundle's"
    assert not (tmp_path / "m.tar.gz").exists()


def test_merge_refuses_another_environment_naming_the_difference(tmp_path, runtime):
    a = _shard(tmp_path, "a", [_variant(1)])
    other_fp = {**WARMED_FP, "env": {"TRITON_DEFAULT_FP_FUSION": "0"}}
    b = _shard(tmp_path, "b", [_variant(2)], fp=other_fp)
    with pytest.raises(BundleError) as raised:
        merge(tmp_path / "m.tar.gz", [a, b])
    assert str(raised.value).startswith(f"{b}: warmed in another environment than {a}: TRITON_DEFAULT_FP_FUSION: "
                                        "warmed with it unset, this runtime has '0'")


def test_merge_names_the_differing_fields_when_no_line_says_more(tmp_path, runtime):
    """Fingerprints whose key material differs in a way no difference line describes: each part that
    differs is named, a part only one of them has too."""
    a = _shard(tmp_path, "a", [_variant(1)])
    other_fp = {**WARMED_FP, "triton": {**WARMED_FP["triton"], "key_sha256": "2" * 64}, "build": {"cc": "gcc"}}
    b = _shard(tmp_path, "b", [_variant(2)], fp=other_fp)
    with pytest.raises(BundleError) as raised:
        merge(tmp_path / "m.tar.gz", [a, b])
    assert str(raised.value) == f"{b}: warmed in another environment than {a}: build differs; triton differs"


def test_merge_accepts_the_same_environment_written_otherwise(tmp_path, runtime):
    """Fingerprints that differ in what enters no key (the Python's build tools) are one environment."""
    a = _shard(tmp_path, "a", [_variant(1)])
    b = _shard(tmp_path, "b", [_variant(2)], fp={**WARMED_FP, "build": {"c_compiler": "clang"}})
    assert merge(tmp_path / "m.tar.gz", [a, b]).entries == 2


def test_merge_refuses_a_malformed_fingerprint(tmp_path, runtime):
    a = _shard(tmp_path, "a", [_variant(1)])
    b = _rewrite(_shard(tmp_path, "b", [_variant(2)]), tmp_path / "bad.tar.gz",
                 lambda h: {**h, "fingerprint": {"triton": {}}})
    with pytest.raises(BundleError) as raised:
        merge(tmp_path / "m.tar.gz", [a, b])
    assert str(raised.value) == f"{b}: {HEADER_NAME}: fingerprint: malformed"


def test_merge_refuses_shards_bundled_differently(tmp_path, runtime):
    a = _shard(tmp_path, "a", [_variant(1)])
    b = _shard(tmp_path, "b", [_variant(2)], binary_only=True)
    with pytest.raises(BundleError) as raised:
        merge(tmp_path / "m.tar.gz", [a, b])
    assert str(raised.value) == f"{b}: binary-only is True, {a} has False; bundle every shard the same way"


def test_merge_keeps_each_targets_environments(tmp_path, runtime):
    a = _shard(tmp_path, "a", [_variant(1)])
    rocm = _variant(2, target="gfx942")
    cache_dir = tmp_path / "cache-rocm"
    _warm(cache_dir, [rocm], target="gfx942")
    b = tmp_path / "b.tar.gz"
    create(b, cache_dir, {"gfx942": [rocm]})
    header = read_header(merge(tmp_path / "m.tar.gz", [a, b]).path)
    assert header["environments"] == {TARGET: {FP_ID: WARMED_FP}, "gfx942": {FP_ID: WARMED_FP}}
    assert sorted(header["targets"]) == ["gfx942", TARGET]


def test_merge_of_nothing_is_refused(tmp_path):
    with pytest.raises(BundleError) as raised:
        merge(tmp_path / "m.tar.gz", [])
    assert str(raised.value) == "merge: no bundles given"


def test_merge_works_beside_its_output_not_in_the_temporary_folder(tmp_path, runtime, monkeypatch):
    """The shards are unpacked next to the merged bundle (the system's temporary folder may be small)."""
    shards = [_shard(tmp_path, "a", [_variant(1)]), _shard(tmp_path, "b", [_variant(2)])]
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "no-temporary-folder"))
    assert merge(tmp_path / "m.tar.gz", shards).entries == 2
