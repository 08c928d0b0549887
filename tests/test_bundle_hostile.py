"""Hostile bundles: each is built here, and both ``install`` and ``verify`` refuse it with exit 2 and one
line naming the member; nothing is written outside the destination, nothing already there is lost."""

import gzip
import io
import json
import tarfile

import pytest
from tritonwarm.cli import main
from tritonwarm.jit import TARGETS
from tritonwarm.jit.cache.bundle import HEADER_NAME, BundleError, Limits, install, verify
from tritonwarm.jit.pipeline.plan import plan
from tritonwarm.jit.pipeline.specs import load_specs
from tritonwarm.jit.pipeline.warmup import warm

SPEC = """
kernel: tritonwarm.launchers.rms_norm:rms_norm
axes:
  num_tokens: [16]
args:
  x: {tensor: [$num_tokens, 4096], dtype: bfloat16}
  weight: {tensor: [4096], dtype: bfloat16}
  eps: 1.0e-6
"""


@pytest.fixture(scope="module")
def good(tmp_path_factory):
    """A real one-entry bundle's members, in order: the base every hostile archive is built from."""
    root = tmp_path_factory.mktemp("good")
    (root / "rms.yaml").write_text(SPEC)
    warm(plan(load_specs([root / "rms.yaml"]), TARGETS["sm90"]), root / "cache")
    bundle = root / "good.tar.gz"
    assert main(["bundle", "create", str(bundle), str(root / "rms.yaml"), "--target", "sm90",
                 "--cache-dir", str(root / "cache")]) == 0
    with tarfile.open(bundle) as tar:
        return [(m.name, tar.extractfile(m).read()) for m in tar.getmembers()]


@pytest.fixture
def dest(tmp_path, good):
    """A destination that already holds the good bundle: what must survive every refusal."""
    path = tmp_path / "dest"
    install(_build(tmp_path / "base.tar.gz", good), path, compare_environment=False)
    return path


def _info(name, size=0, kind=tarfile.REGTYPE, link=""):
    info = tarfile.TarInfo(name)
    info.size, info.type, info.linkname, info.mode = size, kind, link, 0o644
    return info


def _build(path, members, extra=()):
    """``members``: ``(name, bytes)``; ``extra``: ``(TarInfo, bytes | None)`` appended raw."""
    with open(path, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as gz, \
            tarfile.open(fileobj=gz, mode="w|") as tar:
        for name, data in members:
            tar.addfile(_info(name, len(data)), io.BytesIO(data))
        for info, data in extra:
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return path


def _raw(info, data=b"", fmt=tarfile.PAX_FORMAT):
    """One member as tar bytes, written by hand: headers no archiver of ours would write."""
    return info.tobuf(fmt, "utf-8", "surrogateescape") + data + b"\0" * (-len(data) % 512)


def _build_raw(path, members, raw=b""):
    """``members`` (``(name, bytes)``) as ``_build`` writes them, then ``raw`` tar bytes, then the end."""
    body = b"".join(_raw(_info(name, len(data)), data) for name, data in members)
    path.write_bytes(gzip.compress(body + raw + b"\0" * 1024, mtime=0))
    return path


def _bad_checksum(name):
    block = bytearray(_raw(_info(name, 0)))
    block[148:156] = b"0000001\0"
    return bytes(block)


def _snapshot(root):
    return {str(p.relative_to(root)): (p.read_bytes() if p.is_file() else None)
            for p in sorted(root.rglob("*")) if ".lock" not in p.name and "locks" not in p.parts}


def _cubin(good):
    return next(name for name, _ in good if name.endswith(".cubin"))


def _replace(good, name, data):
    return [(n, data if n == name else d) for n, d in good]


def _header(good):
    return json.loads(dict(good)[HEADER_NAME])


def _with_header(good, header):
    return _replace(good, HEADER_NAME, json.dumps(header).encode())


def _cases(good):
    cubin = _cubin(good)
    entry = cubin.split("/")[0]
    rest = [(n, d) for n, d in good if n != cubin]
    link_to = "/etc/passwd"
    flipped = dict(good)[cubin][:-1] + bytes([dict(good)[cubin][-1] ^ 1])  # one bit of the last byte
    bad_target = _header(good)
    bad_target["targets"]["../../evil"] = bad_target["targets"].pop("sm90")
    bad_file_name = _header(good)
    row = next(iter(bad_file_name["targets"]["sm90"].values()))
    row["files"]["../../x.so"] = row["files"].pop(cubin.split("/")[1])
    bad_environments = {**_header(good), "environments": {"sm90": "not a fingerprint"}}

    metadata = next(n for n, _ in good if n.endswith(".json") and "__grp__" not in n and n != HEADER_NAME)
    other_key = json.loads(dict(good)[metadata])
    other_key["hash"] = "0" * 64  # the files of another key: Triton would load that kernel for this one
    other_bytes = json.dumps(other_key).encode()
    other_header = _header(good)
    [(_, other_row)] = other_header["targets"]["sm90"].items()
    other_row["files"][metadata.split("/")[1]] = __import__("hashlib").sha256(other_bytes).hexdigest()
    no_metadata = _header(good)
    [(_, bare_row)] = no_metadata["targets"]["sm90"].items()
    del bare_row["files"][metadata.split("/")[1]]
    crowded = _header(good)
    [(_, crowded_row)] = crowded["targets"]["sm90"].items()
    crowded_row["files"].update({f"extra{i}.ptx": "0" * 64 for i in range(13)})

    def bad_row(change):  # a row every install would copy into the manifest, and every listing read
        header = _header(good)
        rows = header["targets"]["sm90"]
        [(cache_hash, row)] = rows.items()
        rows[cache_hash] = change(row)
        return _with_header(good, header)
    return {
        "absolute path": (good, [(_info("/tritonwarm-escaped", 3), b"bad")], "absolute path"),
        "dot-dot": (good, [(_info(f"{entry}/../../escaped", 3), b"bad")], "'..'"),
        "symlink": (rest, [(_info(cubin, kind=tarfile.SYMTYPE, link=link_to), None)], "symbolic link"),
        "hard link": (rest, [(_info(cubin, kind=tarfile.LNKTYPE, link=link_to), None)], "hard link"),
        "device": (rest, [(_info(cubin, kind=tarfile.CHRTYPE), None)], "device file"),
        "fifo": (rest, [(_info(cubin, kind=tarfile.FIFOTYPE), None)], "fifo"),
        "directory": (good, [(_info(entry, kind=tarfile.DIRTYPE), None)], "directory"),
        "unlisted file": (good, [(_info(f"{entry}/extra.so", 3), b"bad")], "outside the expected layout"),
        "manifest overwrite": (good, [(_info("tritonwarm/manifest-sm90.json", 2), b"{}")], "outside the expected"),
        "duplicate member": (good, [(_info(cubin, 3), b"bad")], "appears twice"),
        "hash differs": (_replace(good, cubin, flipped), [], "sha256"),
        "missing member": (rest, [], "missing"),
        "header not first": (good[1:] + good[:1], [], "not a tritonwarm bundle"),
        "target name in header": (_with_header(good, bad_target), [], "not a target name"),
        "file name in header": (_with_header(good, bad_file_name), [], "not a cache file name"),
        "environments in header": (_with_header(good, bad_environments), [], "environments"),
        "row without kernel": (bad_row(lambda r: {k: v for k, v in r.items() if k != "kernel"}), [], "kernel: missing"),
        "row id not a string": (bad_row(lambda r: {**r, "id": None}), [], "id: None is not a string"),
        "row args not a table": (bad_row(lambda r: {**r, "args": 1}), [], "args: 1 is not a table"),
        "row of another target": (bad_row(lambda r: {**r, "target": "gfx942"}), [], "'gfx942' is filed under sm90"),
        "row of an unlisted environment": (bad_row(lambda r: {**r, "environment": "nope"}), [],
                                           "'nope' is not in environments.sm90"),
        "binary_only not a bool": (_with_header(good, {**_header(good), "binary_only": "yes"}), [],
                                   "binary_only: 'yes' is not true or false"),
        "rows holds a table": (bad_row(lambda r: {**r, "rows": [{"a": 1}]}), [], "rows: holds {'a': 1}"),
        "row without num_warps": (bad_row(lambda r: {k: v for k, v in r.items() if k != "num_warps"}), [],
                                  "num_warps: missing"),
        "row without key": (bad_row(lambda r: {k: v for k, v in r.items() if k != "key"}), [], "key: missing"),
        "num_warps a bool": (bad_row(lambda r: {**r, "num_warps": True}), [], "num_warps: True is not an integer"),
        "num_warps out of range": (bad_row(lambda r: {**r, "num_warps": 10**9}), [], "out of range"),
        "args holding a table": (bad_row(lambda r: {**r, "args": {"x": {"y": 1}}}), [], "args: holds"),
        "metadata of another key": (_with_header(_replace(good, metadata, other_bytes), other_header), [],
                                    "another kernel's files"),
        "entry without metadata": ([(n, d) for n, d in _with_header(good, no_metadata) if n != metadata], [],
                                   "Triton's metadata of the entry"),
        "too many files in an entry": (_with_header(good, crowded), [], "over the limit of 12"),
        "pax header bomb": (good, [(_info(f"{entry}/" + "a" * (1 << 20), 3), b"bad")], "pax extended header"),
        "GNU long name bomb": (good, b"raw", _raw(_info(f"{entry}/" + "b" * (1 << 20), 3), b"bad",
                                                  tarfile.GNU_FORMAT)),
        "global pax header": (good, b"raw", _raw(_info("pax_global_header", kind=tarfile.XGLTYPE))),
        "sparse member": (good, b"raw", _raw(_info(f"{entry}/x", kind=tarfile.GNUTYPE_SPARSE))),
        "bad checksum": (good, b"raw", _bad_checksum(f"{entry}/x")),
        "group naming other files": (
            [(n, json.dumps({"child_paths": {"x": "/etc/passwd"}}).encode() if "__grp__" in n else d) for n, d in good],
            [], "names other files"),
    }


CASES = ["absolute path", "dot-dot", "symlink", "hard link", "device", "fifo", "directory", "unlisted file",
         "manifest overwrite", "duplicate member", "hash differs", "missing member", "header not first",
         "target name in header", "file name in header", "environments in header", "row without kernel",
         "row id not a string", "row args not a table", "row of another target", "row of an unlisted environment",
         "binary_only not a bool", "group naming other files", "rows holds a table", "row without num_warps",
         "row without key", "num_warps a bool", "num_warps out of range", "args holding a table",
         "metadata of another key", "entry without metadata", "too many files in an entry", "pax header bomb",
         "GNU long name bomb", "global pax header", "sparse member", "bad checksum"]
RAW_WORDS = {"GNU long name bomb": "GNU long name", "global pax header": "a global pax header",
             "sparse member": "a sparse file", "bad checksum": "checksum"}


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("command", ["install", "verify"])
def test_hostile_archive_is_refused(tmp_path, good, dest, case, command, capsys):
    members, extra, words = _cases(good)[case]
    if extra == b"raw":  # (members, b"raw", tar bytes written by hand after them)
        bundle, words = _build_raw(tmp_path / "hostile.tar.gz", members, words), RAW_WORDS[case]
    else:
        bundle = _build(tmp_path / "hostile.tar.gz", members, extra)
    before_dest, before_all = _snapshot(dest), sorted(p.name for p in tmp_path.iterdir())
    capsys.readouterr()
    argv = ["bundle", command, str(bundle)] + (["--cache-dir", str(dest)] if command == "install" else [])
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("tritonwarm: error: ") and words in err, err[:2000]
    assert len(err) < 1000  # an archive chooses its names: messages quote them cut short
    assert _snapshot(dest) == before_dest  # nothing in the cache lost or added
    assert sorted(p.name for p in tmp_path.iterdir()) == before_all  # nothing written beside it
    assert not list(tmp_path.rglob("*escaped*"))
    assert not list((dest / "tritonwarm").glob(".install-*"))


def test_member_over_the_size_limit(tmp_path, good, dest):
    bundle = _build(tmp_path / "b.tar.gz", good)
    largest = max(len(data) for name, data in good if name != HEADER_NAME)
    before = _snapshot(dest)
    with pytest.raises(BundleError, match="over the limit"):
        install(bundle, dest, Limits(member_bytes=largest - 1))
    assert _snapshot(dest) == before
    assert verify(bundle, Limits(member_bytes=largest)).entries == 1  # at the limit is fine


def test_archive_over_the_size_limit(tmp_path, good, dest):
    bundle = _build(tmp_path / "b.tar.gz", good)
    before = _snapshot(dest)
    with pytest.raises(BundleError, match="the archive .* over the limit"):
        install(bundle, dest, Limits(archive_bytes=bundle.stat().st_size - 1))
    assert _snapshot(dest) == before


def test_decompression_bomb_stops_at_the_cap(tmp_path, good, dest):
    """64 MiB of zeros in a ~64 KiB archive: reading stops at the decompressed-bytes cap, not at the end."""
    bomb = b"\0" * (64 << 20)
    members = _replace(good, _cubin(good), bomb)
    bundle = _build(tmp_path / "bomb.tar.gz", members)
    assert bundle.stat().st_size < 1 << 20
    before = _snapshot(dest)
    with pytest.raises(BundleError, match="decompression bomb"):
        install(bundle, dest, Limits(total_bytes=4 << 20))
    with pytest.raises(BundleError, match="decompression bomb"):
        verify(bundle, Limits(total_bytes=4 << 20))
    assert _snapshot(dest) == before
    staged = list((dest / "tritonwarm").rglob("*.cubin"))
    assert not staged


def test_not_a_gzip_or_not_a_tar(tmp_path, capsys):
    junk = tmp_path / "junk.tar.gz"
    junk.write_bytes(b"not an archive at all")
    assert main(["bundle", "verify", str(junk)]) == 2
    plain = tmp_path / "plain.tar.gz"
    plain.write_bytes(gzip.compress(b"x" * 1000))
    assert main(["bundle", "verify", str(plain)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 2 and "junk.tar.gz" in err and "plain.tar.gz" in err


@pytest.mark.parametrize("case", ["unlisted entry", "metadata not an object", "pax header bomb"])
def test_image_of_a_hostile_bundle_is_refused_in_one_error(tmp_path, good, case):
    """Making an image reads the bundle with the same reader and member checks: a member of no entry
    the header lists, or metadata that is no JSON object, is one BundleError and leaves no blob."""
    from tritonwarm.jit.cache import oci

    metadata = next(n for n, _ in good if n.endswith(".json") and "__grp__" not in n and n != HEADER_NAME)
    members, extra, words = {
        "unlisted entry": (good, [(_info("NOTANENTRY/x.json", 2), b"{}")], "outside the expected layout"),
        "metadata not an object": (_replace(good, metadata, b"[]"), [], "not Triton's metadata"),
        "pax header bomb": (good, [(_info(metadata.split("/")[0] + "/" + "a" * (1 << 20), 3), b"bad")],
                            "pax extended header"),
    }[case]
    bundle = _build(tmp_path / "hostile.tar.gz", members, extra)
    with pytest.raises(BundleError, match=words):
        oci.bundle_to_layout(bundle, tmp_path / "image")
    assert not [p for p in (tmp_path / "image" / "blobs" / "sha256").iterdir()]


def test_a_bundle_its_readers_would_refuse_is_never_written(tmp_path, monkeypatch):
    """``bundle create`` and ``bundle merge`` refuse, before any byte, a bundle over a cap that
    ``verify`` and ``install`` hold it to, and say how many bundles the same variants fit in."""
    from tritonwarm.jit.cache import bundle

    rows = {f"{i:064x}": {"entry_dir": f"E{i}", "entry_name": "k", "files": {"k.cubin": "0" * 64, "k.json": "0" * 64}}
            for i in range(5)}
    header = {"format": 1, "targets": {"sm90": rows}}
    out = tmp_path / "b.tar.gz"

    def never_read(entry_dir, name):
        raise AssertionError("a file was read")

    for caps, expected in [
        (dict(entries=2), "5 entries, over the 2 that `bundle verify` and `bundle install` accept: make 4 bundles"),
        (dict(files=4), "10 files, over the 4 that"),
        (dict(header_bytes=100), f"bytes of {HEADER_NAME}, over the 100 that"),
        (dict(header_commas=5), f"commas in {HEADER_NAME}, over the 5 that"),
        (dict(header_containers=3), f"brackets in {HEADER_NAME}, over the 3 that"),
    ]:
        monkeypatch.setattr(bundle, "Limits", lambda caps=caps: Limits(**caps))
        with pytest.raises(BundleError) as raised:
            bundle.write(out, header, never_read)
        assert str(raised.value).startswith(f"{out}: ") and expected in str(raised.value), str(raised.value)
        assert "--shard I/" in str(raised.value) and not list(tmp_path.iterdir())
    monkeypatch.setattr(bundle, "Limits", lambda: Limits(entries=5))
    with pytest.raises(AssertionError, match="a file was read"):  # at the cap: written
        bundle.write(out, header, never_read)
    assert not list(tmp_path.iterdir())  # and what a failed write began is removed
