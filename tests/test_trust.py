"""Trust boundaries: what a bundle, a spec file, a prepared destination or a shared folder can do.

Each test builds the hostile input for real (an archive, a folder another account owns, links in
the cache's own state folder) and checks the refusal: one line, exit 2, nothing written elsewhere."""

import gzip
import io
import json
import os
import sys
import tarfile

import pytest
from tritonwarm.cli import main
from tritonwarm.jit import TARGETS
from tritonwarm.jit.cache.bundle import HEADER_NAME, Limits, install, verify
from tritonwarm.jit.pipeline.plan import plan
from tritonwarm.jit.pipeline.specs import SpecError, load_specs
from tritonwarm.jit.pipeline.warmup import warm

SPEC = """
kernel: tritonwarm.launchers.rms_norm:rms_norm
axes:
  dtype: [bfloat16, float16]
args:
  x: {tensor: [16, 4096], dtype: $dtype}
  weight: {tensor: [4096], dtype: $dtype}
  eps: 1.0e-6
"""
ESCAPES = ("\x1b", "\r", "\x07", "\u202e")


@pytest.fixture(scope="module")
def warmed(tmp_path_factory):
    """Two rms_norm entries warmed for sm90 and bundled: the base of every hostile input here."""
    root = tmp_path_factory.mktemp("trust")
    (root / "rms.yaml").write_text(SPEC)
    the_plan = plan(load_specs([root / "rms.yaml"]), TARGETS["sm90"])
    assert warm(the_plan, root / "cache").failed == 0
    bundle = root / "good.tar.gz"
    assert main(["bundle", "create", str(bundle), str(root / "rms.yaml"), "--target", "sm90",
                 "--cache-dir", str(root / "cache")]) == 0
    with tarfile.open(bundle) as tar:
        members = [(m.name, tar.extractfile(m).read()) for m in tar.getmembers()]
    return root, the_plan, members


def _write(path, members):
    with open(path, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as gz, \
            tarfile.open(fileobj=gz, mode="w|") as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
    return path


def _with_header(members, change):
    header = json.loads(dict(members)[HEADER_NAME])
    change(header)
    return [(n, json.dumps(header).encode() if n == HEADER_NAME else d) for n, d in members]


def _one_line_refusal(capsys, *words):
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("tritonwarm: error: "), err[:500]
    for word in words:
        assert word in err, err
    return err


# ------------------------------------------------------------------ a bundle's header names modules


def test_install_imports_no_module_a_bundle_header_names(warmed, tmp_path, monkeypatch, capsys):
    """A header's ``import_path`` / ``jit_function`` name modules; building C launchers (Triton 3.6,
    and 3.7's driver utilities) once imported them, running the bundle's code at install time."""
    _, _, members = warmed
    planted = tmp_path / "planted"
    planted.mkdir()
    marker = tmp_path / "ran"
    (planted / "tw_planted_module.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
    monkeypatch.syspath_prepend(str(planted))

    def name_modules(header):
        for row in header["targets"]["sm90"].values():
            row["import_path"] = "tw_planted_module:rms_norm"
            row["jit_function"] = "tw_planted_module:kernel"
    bundle = _write(tmp_path / "b.tar.gz", _with_header(members, name_modules))
    assert main(["bundle", "install", str(bundle), "--cache-dir", str(tmp_path / "dest")]) in (0, 1)
    assert main(["check", "--target", "sm90", "--cache-dir", str(tmp_path / "dest")]) in (0, 1, 2)
    assert not marker.exists() and "tw_planted_module" not in sys.modules
    assert "this" not in sys.modules or sys.modules["this"].__name__ == "this"


def test_c_launchers_come_from_the_entries_themselves(warmed, tmp_path):
    """The launcher sources are Triton's own, from the signature the row records and the entry's
    metadata: the same sources Triton's runtime generates for the compiled kernel."""
    from tritonwarm.jit.pipeline.compile import compile_variant
    from tritonwarm.jit.serving import c_launchers

    if not c_launchers.builds_per_signature("cuda"):
        pytest.skip("this Triton builds no C launcher per kernel signature")
    root, the_plan, _ = warmed
    variants = list(the_plan.variants.values())
    from_entries = c_launchers.builder_calls(c_launchers._from_entries(variants, root / "cache"), "cuda", str(tmp_path))
    compiled = [compile_variant(v, TARGETS["sm90"], root / "cache") for v in variants]
    from_triton = c_launchers.builder_calls(compiled, "cuda", str(tmp_path))
    assert [c.source for c in from_entries] == [c.source for c in from_triton]


def test_a_signature_that_is_no_triton_type_builds_nothing(warmed):
    from tritonwarm.jit.serving import c_launchers

    root, the_plan, _ = warmed
    variant = next(iter(the_plan.variants.values()))
    data = json.loads(variant.specialization_data)
    data["signature"][next(iter(data["signature"]))] = 'i32"); system("x'
    variant = type(variant)(**{**variant.__dict__, "specialization_data": json.dumps(data)})
    with pytest.raises(ValueError, match="not a Triton type"):
        c_launchers._from_entries([variant], root / "cache")


# ------------------------------------------------------------------------------ spec files


def test_yaml_aliases_are_refused_before_anything_expands(tmp_path):
    """Nested aliases expand exponentially (nine levels: billions of nodes): refused at the first alias."""
    laughs = ["kernel: tritonwarm.launchers.rms_norm:rms_norm", 'a0: &a0 ["lol","lol","lol","lol","lol","lol"]']
    laughs += [f"a{i}: &a{i} [" + ",".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, 6)]
    spec = tmp_path / "laughs.yaml"
    spec.write_text("\n".join(laughs) + "\n")
    with pytest.raises(SpecError, match="aliases") as e:
        load_specs([spec])
    assert str(spec) in str(e.value) and ":3:" in str(e.value) and "\n" not in str(e.value)
    merge = tmp_path / "merge.yaml"
    merge.write_text("base: &b {dtype: bfloat16}\nkernel: tritonwarm.launchers.rms_norm:rms_norm\nargs:\n  <<: *b\n")
    with pytest.raises(SpecError, match="aliases"):
        load_specs([merge])


def test_a_spec_alias_is_one_line_and_exit_2(tmp_path, capsys):
    spec = tmp_path / "alias.yaml"
    spec.write_text("x: &x [1]\ny: *x\n")
    assert main(["check", str(spec), "--target", "sm90", "--cache-dir", str(tmp_path / "c")]) == 2
    _one_line_refusal(capsys, "alias.yaml:2", "aliases")


# ------------------------------------------------------------------------------ the overlay folder


@pytest.fixture
def overlay_env(tmp_path, monkeypatch):
    from tritonwarm.jit.cache import overlay

    monkeypatch.setattr(overlay, "_owned", set())
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "warmed"))  # read by Triton, never pinned
    return tmp_path / "overlay"


def _overlay_manager(folder, monkeypatch):
    from tritonwarm.jit.cache.overlay import OVERLAY_ENV, OverlayCacheManager

    monkeypatch.setenv(OVERLAY_ENV, str(folder))
    return OverlayCacheManager("ENTRYKEY")


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a folder to another account needs root")
def test_an_overlay_folder_of_another_account_is_refused(overlay_env, monkeypatch):
    """Another local account made the overlay folder first (under /tmp, say) and planted an entry:
    a server running as root must not load it."""
    from tritonwarm.jit.cache import CacheError

    overlay_env.mkdir(mode=0o755)
    (overlay_env / "ENTRYKEY").mkdir()
    os.chown(overlay_env, 65534, 65534)
    with pytest.raises(CacheError, match="belongs to uid 65534") as e:
        _overlay_manager(overlay_env, monkeypatch)
    assert "\n" not in str(e.value)


def test_an_overlay_folder_made_by_another_account_after_start_is_refused_at_its_first_use(overlay_env, monkeypatch):
    from tritonwarm.jit.cache import CacheError

    manager = _overlay_manager(overlay_env, monkeypatch)  # not there yet: nothing to check
    overlay_env.mkdir(mode=0o777)
    os.chmod(overlay_env, 0o777)
    with pytest.raises(CacheError, match="writable by its group"):
        manager.get_group("k.json")
    with pytest.raises(CacheError, match="writable by its group"):
        manager.put(b"{}", "k.json")


@pytest.mark.parametrize("mode, says", [(0o777, "writable by its group"), (0o757, "writable by others")])
def test_an_overlay_folder_others_can_write_is_refused(overlay_env, monkeypatch, mode, says):
    from tritonwarm.jit.cache import CacheError

    overlay_env.mkdir()
    os.chmod(overlay_env, mode)
    with pytest.raises(CacheError, match=says):
        _overlay_manager(overlay_env, monkeypatch)


def test_an_overlay_link_is_refused_and_a_new_one_is_made_private(overlay_env, monkeypatch, tmp_path):
    from tritonwarm.jit.cache import CacheError

    (tmp_path / "elsewhere").mkdir(mode=0o755)
    overlay_env.symlink_to(tmp_path / "elsewhere")
    with pytest.raises(CacheError, match="symbolic link"):
        _overlay_manager(overlay_env, monkeypatch)
    fresh = tmp_path / "fresh" / "overlay"
    manager = _overlay_manager(fresh, monkeypatch)
    assert manager.get_group("k.json") is None and not fresh.exists()  # nothing made until a write
    manager.put(b"{}", "k.json")
    assert (fresh / "ENTRYKEY" / "k.json").exists()
    assert fresh.stat().st_uid == os.geteuid() and not fresh.stat().st_mode & 0o022


# ------------------------------------------------------------- an entry holding another key's files


def test_check_reports_an_entry_holding_another_keys_files(warmed, tmp_path, capsys):
    """Entry B's folder holds entry A's valid files (its group and manifest row updated to match):
    every file hash agrees, but Triton would load kernel A for key B."""
    import shutil

    from tritonwarm.jit.cache import Manifest, file_sha256

    root, the_plan, _ = warmed
    cache = tmp_path / "cache"
    shutil.copytree(root / "cache", cache)
    a, b = sorted(the_plan.variants.values(), key=lambda v: v.cache_hash)
    for f in (cache / a.entry_dir).iterdir():
        if not f.name.startswith("__grp__"):
            shutil.copy(f, cache / b.entry_dir / f.name)
    for group in (cache / b.entry_dir).glob("__grp__*"):  # the copy's group names the copy's files
        children = json.loads(group.read_text())["child_paths"]
        group.write_text(json.dumps({"child_paths": {n: str(cache / b.entry_dir / n) for n in children}}))
    rows = Manifest(cache, "sm90").read()
    rows[b.cache_hash]["files"] = {n: file_sha256(cache / b.entry_dir / n) for n in rows[b.cache_hash]["files"]}
    Manifest(cache, "sm90").update({b.cache_hash: rows[b.cache_hash]})
    assert main(["check", str(root / "rms.yaml"), "--target", "sm90", "--cache-dir", str(cache)]) == 1
    assert "corrupt: 1 (" in (out := capsys.readouterr().out) and "another kernel's files" in out  # one line a cause
    assert main(["check", str(root / "rms.yaml"), "--target", "sm90", "--cache-dir", str(cache), "--verbose"]) == 1
    out = capsys.readouterr().out
    assert f"corrupt  {b.variant_id}" in out and "another kernel's files" in out


# ------------------------------------------------------------------- a damaged destination manifest


@pytest.mark.parametrize("damage", ["", "{not json", '{"format": 1, "variants": {"x": 1}}'])
def test_a_damaged_manifest_is_set_aside_and_rebuilt(warmed, tmp_path, capsys, damage):
    from tritonwarm.jit.cache import Manifest

    root, the_plan, _ = warmed
    dest = tmp_path / "dest"
    (dest / "tritonwarm").mkdir(parents=True)
    (dest / "tritonwarm" / "manifest-sm90.json").write_text(damage)
    capsys.readouterr()
    assert main(["bundle", "install", str(root / "good.tar.gz"), "--cache-dir", str(dest), "--no-c-launchers"]) == 0
    err = capsys.readouterr().err
    one_line = " ".join(line.strip() for line in err.splitlines())  # one warning, wrapped to the line width
    assert "manifest-sm90.json was damaged: set aside as manifest-sm90.json.damaged" in one_line
    assert err.count("tritonwarm: warning:") == 1
    assert (dest / "tritonwarm" / "manifest-sm90.json.damaged").read_text() == damage
    assert sorted(Manifest(dest, "sm90").read()) == sorted(v.cache_hash for v in the_plan.variants.values())
    assert main(["bundle", "install", str(root / "good.tar.gz"), "--cache-dir", str(dest), "--no-c-launchers"]) == 0
    assert "damaged" not in capsys.readouterr().err


# ------------------------------------------------------------------- control characters


def test_control_characters_from_a_bundle_are_escaped_wherever_printed(warmed, tmp_path, capsys):
    _, the_plan, members = warmed

    def poison(header):
        for row in header["targets"]["sm90"].values():
            row["kernel"] = "evil\x1b[2J\rok: all warmed\u202e"
            row["args"] = {"x\x07": "*bf16\x1b[31m aligned", "n": "i32\r\nok"}
            row["rows"] = ["row\x1b]0;title\x07"]
        header["fingerprint"]["triton"]["version"] = "9.9\x1b[2J\rok"
    bundle = _write(tmp_path / "b.tar.gz", _with_header(members, poison))
    dest = tmp_path / "dest"
    capsys.readouterr()
    assert main(["bundle", "verify", str(bundle)]) == 1  # the fingerprint differs from this runtime
    assert main(["bundle", "install", str(bundle), "--cache-dir", str(dest)]) == 0
    assert main(["list", "--cache-dir", str(dest)]) == 0
    assert main(["show", next(iter(the_plan.variants.values())).variant_id, "--cache-dir", str(dest)]) == 0
    out, err = capsys.readouterr()
    assert "9.9\\x1b[2J\\x0dok" in out + err and "evil\\x1b[2J\\x0dok" in out and "\\u202e" in out
    for escape in ESCAPES + ("\n" + "ok",):
        assert escape not in out + err


# ------------------------------------------------------------------- caps a real cache never reaches


def test_a_bundle_of_more_files_than_a_real_cache_holds_is_refused_at_its_header(warmed, tmp_path, capsys):
    """50,000 tiny files (2,000 entries of 25) would be 50,000 inodes: the header says so first."""
    import base64
    import hashlib

    _, _, members = warmed

    def swell(header):
        [(_, row)] = list(header["targets"]["sm90"].items())[:1]
        rows = header["targets"]["sm90"] = {}
        for i in range(2000):
            cache_hash = hashlib.sha256(str(i).encode()).hexdigest()
            entry_dir = base64.b32encode(bytes.fromhex(cache_hash)).decode().rstrip("=")
            files = {f"{row['entry_name']}.json": "0" * 64, **{f"f{j}.ptx": "0" * 64 for j in range(24)}}
            rows[cache_hash] = {**row, "cache_hash": cache_hash, "entry_dir": entry_dir, "files": files,
                                "id": cache_hash[:12]}
    bundle = _write(tmp_path / "many.tar.gz", _with_header(members, swell)[:1])
    assert main(["bundle", "verify", str(bundle)]) == 2
    _one_line_refusal(capsys, "50000 files, over the limit of 16000")
    assert not (tmp_path / "dest").exists()


def test_the_caps_are_above_a_real_warmed_cache(warmed):
    """A bundle's header per entry is far under every per-entry share of the caps (a large real cache,
    this project's 156 entries, is measured in docs/security.md)."""
    root, _, members = warmed
    report, limits = verify(root / "good.tar.gz"), Limits()
    header = json.dumps(json.loads(dict(members)[HEADER_NAME])["targets"], sort_keys=True, indent=1).encode()
    assert report.files / report.entries * limits.entries <= limits.files
    assert len(header) / report.entries * limits.entries <= limits.header_bytes
    assert header.count(b",") / report.entries * limits.entries <= limits.header_commas
    assert (header.count(b"[") + header.count(b"{")) / report.entries * limits.entries <= limits.header_containers


@pytest.mark.parametrize("unit, says", [(b"[],", "brackets ('[' and '{')"), (b'"ab",', "commas")])
def test_a_header_that_would_parse_into_millions_of_objects_is_refused_unparsed(warmed, tmp_path, capsys, unit, says):
    """16 MiB of "[]," parses into 400 MiB of lists: the header's commas and brackets are counted first."""
    _, _, members = warmed
    header = b'{"format": 1, "padding": [' + unit * ((6 << 20) // len(unit)) + b'0]}'
    bundle = _write(tmp_path / "b.tar.gz", [(HEADER_NAME, header)])
    assert main(["bundle", "verify", str(bundle)]) == 2
    _one_line_refusal(capsys, "holds", f"{says}, over the limit")


# ------------------------------------------------------------------- links in the state folder


@pytest.mark.parametrize("place", ["locks", "lock file", "manifest", "state folder", "hard link"])
def test_links_in_the_cache_state_folder_are_refused(warmed, tmp_path, capsys, place):
    root, _, _ = warmed
    dest, victim = tmp_path / "dest", tmp_path / "victim"
    victim.mkdir()
    (victim / "keep.txt").write_text("precious")
    state = dest / "tritonwarm"
    if place == "state folder":
        dest.mkdir()
        state.symlink_to(victim)
    else:
        state.mkdir(parents=True)
        if place == "locks":
            (state / "locks").symlink_to(victim)
        elif place == "lock file":
            (state / "manifest-sm90.lock").symlink_to(victim / "keep.txt")
        elif place == "manifest":
            (state / "manifest-sm90.json").symlink_to(victim / "keep.txt")
        else:
            os.link(victim / "keep.txt", state / "manifest-sm90.lock")
    capsys.readouterr()
    assert main(["bundle", "install", str(root / "good.tar.gz"), "--cache-dir", str(dest)]) == 2
    _one_line_refusal(capsys, "follows no link")
    assert sorted(p.name for p in victim.iterdir()) == ["keep.txt"]
    assert (victim / "keep.txt").read_text() == "precious"
    assert not [p for p in dest.iterdir() if p.name != "tritonwarm"]  # no entry moved in


def test_install_into_a_fresh_folder_still_works(warmed, tmp_path):
    root, _, _ = warmed
    report = install(root / "good.tar.gz", tmp_path / "fresh", compare_environment=False)
    assert report.installed == 2


def test_a_state_file_another_process_replaces_while_it_is_checked_is_no_refusal(tmp_path, monkeypatch):
    """A manifest or probe file listed, then replaced or removed by a concurrent warm-up (``--jobs``,
    another target) before it is looked at, is not a link and not an error."""
    from tritonwarm.jit.cache import layout

    state = tmp_path / "cache" / "tritonwarm"
    (state / "locks").mkdir(parents=True)
    (state / ".manifest-gfx942.tmp").write_text("{}")
    (state / "locks" / "a.lock").write_text("")
    real_scandir = os.scandir

    class Racing:
        """os.scandir, with each file removed right after it is listed (as another process would)."""

        def __init__(self, path):
            self.inner = real_scandir(path)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.inner.close()

        def __iter__(self):
            for item in self.inner:
                if item.is_file(follow_symlinks=False):
                    os.unlink(item.path)
                yield item

    monkeypatch.setattr(layout.os, "scandir", Racing)
    layout.refuse_links_in_state(state)  # nothing raised
    monkeypatch.undo()
    layout.ensure_writable(tmp_path / "cache")
