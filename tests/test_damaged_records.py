"""A damaged or hand-edited record is refused, never followed: manifest rows, the record of what
planned a cache, a folder where an entry belongs taken by a file, spec dimensions out of range.
Each refusal is one line naming the file and the field, and nothing in the cache (or outside it) is
lost."""

import json
import shutil

import pytest
from tritonwarm.cli import main
from tritonwarm.jit import TARGETS
from tritonwarm.jit.cache import Manifest
from tritonwarm.jit.pipeline.plan import plan
from tritonwarm.jit.pipeline.specs import load_specs
from tritonwarm.jit.pipeline.warmup import warm

SPEC = """
kernel: tritonwarm.launchers.rms_norm:rms_norm
args:
  x: {tensor: [16, 4096], dtype: bfloat16}
  weight: {tensor: [4096], dtype: bfloat16}
"""


@pytest.fixture(scope="module")
def warmed(tmp_path_factory):
    """A spec and a cache holding its one variant, to be copied and damaged."""
    root = tmp_path_factory.mktemp("warmed")
    (root / "rms.yaml").write_text(SPEC)
    warm(plan(load_specs([root / "rms.yaml"]), TARGETS["sm90"]), root / "cache")
    return root


@pytest.fixture
def cache(tmp_path, warmed):
    """A copy of the warmed cache, beside it on this machine: its groups name the original's files
    (`check --same-machine`)."""
    path = tmp_path / "cache"
    shutil.copytree(warmed / "cache", path)
    return path


def _snapshot(root):
    return {str(p.relative_to(root)): (p.read_bytes() if p.is_file() else None)
            for p in sorted(root.rglob("*")) if ".lock" not in p.name and "locks" not in p.parts}


def _damage_row(cache, change):
    path = cache / "tritonwarm" / "manifest-sm90.json"
    data = json.loads(path.read_text())
    [(cache_hash, row)] = data["variants"].items()
    data["variants"][cache_hash] = change(row)
    path.write_text(json.dumps(data))
    return cache_hash


def one_error(capsys, *argv, rc=2) -> str:
    capsys.readouterr()
    assert main([str(a) for a in argv]) == rc
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tritonwarm: error: "), (out, err)
    return lines[0]


@pytest.mark.parametrize("entry_dir", ["VICTIM", "../victim", ""])
def test_prune_never_removes_a_folder_a_damaged_row_names(tmp_path, cache, capsys, entry_dir):
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "keep").write_text("precious")
    entry_dir = str(victim) if entry_dir == "VICTIM" else entry_dir
    record = tmp_path / "other-used.jsonl"
    record.write_text(_record_line(cache, cache_hash="0" * 64))  # another entry used: this one is a candidate
    cache_hash = _damage_row(cache, lambda row: {**row, "entry_dir": entry_dir})
    before = _snapshot(cache)
    line = one_error(capsys, "prune", "--unused", record, "--cache-dir", cache)
    assert f"damaged manifest: variants.{cache_hash[:16]}.entry_dir: {entry_dir!r} is not the folder" in line, line
    assert (victim / "keep").read_text() == "precious" and _snapshot(cache) == before


def test_removal_deletes_the_folder_the_hash_names_whatever_the_item_says(tmp_path, cache):
    from tritonwarm.jit.cache.prune import remove

    victim = tmp_path / "victim"
    victim.mkdir()
    [(cache_hash, row)] = Manifest(cache, "sm90").read().items()
    remove(cache, [{"target": "sm90", "cache_hash": cache_hash, "entry_dir": "../victim"}])
    assert victim.is_dir() and not (cache / row["entry_dir"]).exists()
    assert Manifest(cache, "sm90").read() == {}


@pytest.mark.parametrize("text, words", [('{"specs": "x"}', "specs: not a list of names"), ("[]", "not a table"),
                                         ('{"installed": [1]}', "installed: not a list of names")])
def test_a_damaged_record_of_what_planned_the_cache_stops_prune(cache, capsys, text, words):
    sources = cache / "tritonwarm" / "sources-sm90.json"
    sources.write_text(text)
    before = _snapshot(cache)
    line = one_error(capsys, "prune", "--unplanned", "--cache-dir", cache)
    assert f"{sources}: unreadable record of what was warmed ({words})" in line, line
    assert _snapshot(cache) == before


ROW_DAMAGE = {
    "files a string": (lambda row: {**row, "files": "x"}, "files: 'x' is not a table"),
    "row a string": (lambda row: "junk", ": not a record"),
    "no kernel": (lambda row: {k: v for k, v in row.items() if k != "kernel"}, "kernel: missing"),
    "no id": (lambda row: {k: v for k, v in row.items() if k != "id"}, "id: missing"),
    "entry_dir null": (lambda row: {**row, "entry_dir": None}, "entry_dir: None is not the folder"),
    "args an int": (lambda row: {**row, "args": 1}, "args: 1 is not a table"),
    "entry name a path": (lambda row: {**row, "entry_name": "../x"}, "entry_name: '../x' is not a kernel name"),
}


@pytest.mark.slow
@pytest.mark.parametrize("damage", list(ROW_DAMAGE))
def test_a_row_of_the_wrong_shape_is_a_damaged_manifest_warmup_rebuilds(warmed, cache, capsys, damage):
    change, words = ROW_DAMAGE[damage]
    cache_hash = _damage_row(cache, change)
    manifest = cache / "tritonwarm" / "manifest-sm90.json"
    for command in ("list", "du", "show"):
        argv = [command] + (["x"] if command == "show" else []) + ["--cache-dir", cache]
        line = one_error(capsys, *argv)
        assert f"{manifest}: damaged manifest: variants.{cache_hash[:16]}" in line and words in line, line
    spec = warmed / "rms.yaml"
    capsys.readouterr()
    assert main(["check", str(spec), "--target", "sm90", "--cache-dir", str(cache)]) == 1
    assert f"manifest: {manifest}: damaged manifest: " in capsys.readouterr().out
    assert main(["warmup", str(spec), "--target", "sm90", "--cache-dir", str(cache), "--jobs", "1"]) == 0
    assert main(["check", str(spec), "--target", "sm90", "--cache-dir", str(cache), "--same-machine"]) == 0
    assert list(Manifest(cache, "sm90").read()) == [cache_hash]


@pytest.mark.slow
def test_an_entry_folder_taken_by_a_file_is_corrupt_and_warmup_replaces_it(warmed, cache, capsys):
    [row] = Manifest(cache, "sm90").read().values()  # (Triton 3.6 also keeps its C launchers' folders there)
    entry = cache / row["entry_dir"]
    shutil.rmtree(entry)
    entry.write_text("x")
    spec = warmed / "rms.yaml"
    capsys.readouterr()
    assert main(["check", str(spec), "--target", "sm90", "--cache-dir", str(cache)]) == 1
    assert "1 corrupt" in capsys.readouterr().out
    assert main(["warmup", str(spec), "--target", "sm90", "--cache-dir", str(cache), "--jobs", "1", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["targets"][0]["repaired"] == 1
    assert entry.is_dir() and main(["check", str(spec), "--target", "sm90", "--cache-dir", str(cache),
                                    "--same-machine"]) == 0


@pytest.mark.parametrize("command", ["list", "du", "show", "prune"])
def test_reading_commands_refuse_a_file_as_the_cache(tmp_path, capsys, command):
    a_file = tmp_path / "a_file"
    a_file.write_text("hi")
    extra = {"show": ["abc"], "prune": ["--other-environments"]}.get(command, [])
    line = one_error(capsys, command, *extra, "--cache-dir", a_file)
    assert f"cache directory {a_file} is a file, not a directory" in line, line
    assert a_file.read_text() == "hi"


@pytest.mark.parametrize("argv", [["list"], ["prune", "--other-environments"]])
def test_an_unknown_target_is_refused_not_matched_against_nothing(cache, capsys, argv):
    before = _snapshot(cache)
    line = one_error(capsys, *argv, "--target", "sm91", "--cache-dir", cache)
    assert "unknown target 'sm91'" in line, line
    assert _snapshot(cache) == before


def test_check_trace_takes_no_remote_and_no_specs(tmp_path, warmed, cache, capsys):
    trace = tmp_path / "trace.jsonl"
    trace.write_text("")
    for extra in (["--remote", "redis://127.0.0.1:1/0"], [str(warmed / "rms.yaml")]):
        line = one_error(capsys, "check", *extra, "--trace", trace, "--target", "sm90", "--cache-dir", cache)
        assert "--trace checks what a dispatch record launched" in line, line


@pytest.mark.parametrize("dims, words", [
    ("[4, 99999999999999999999999]", "args.x.tensor.1: 99999999999999999999999 is not a dimension"),
    ("[-4, 4096]", "args.x.tensor.0: -4 is not a dimension"),
    ("[$n, 4096]", "args.x.tensor.0: 4611686018427387904 is not a dimension"),
    ("[1099511627776, 1099511627776]", "has 2**62 elements or more"),
])
def test_spec_dimensions_out_of_range_name_the_field(tmp_path, capsys, dims, words):
    path = tmp_path / "s.yaml"
    path.write_text(f"kernel: tritonwarm.launchers.rms_norm:rms_norm\naxes:\n  n: [{2**62}]\nargs:\n"
                    f"  x: {{tensor: {dims}, dtype: bfloat16}}\n  weight: {{tensor: [4096], dtype: bfloat16}}\n")
    line = one_error(capsys, "check", path, "--target", "sm90", "--cache-dir", tmp_path / "c")
    assert str(path) in line and words in line, line


def test_a_spec_that_is_not_utf8_names_the_file(tmp_path, capsys):
    path = tmp_path / "s.yaml"
    path.write_bytes(b"\xff\xfe\x00bad")
    line = one_error(capsys, "check", path, "--target", "sm90", "--cache-dir", tmp_path / "c")
    assert f"{path}: <file>: not UTF-8 text" in line, line


def test_sass_of_a_damaged_cubin_says_so_in_one_line(cache, capsys):
    from tritonwarm.jit.pipeline.resources import cuobjdump

    if cuobjdump() is None:
        pytest.skip("this Triton ships no cuobjdump")
    [(_, row)] = Manifest(cache, "sm90").read().items()
    cubin = cache / row["entry_dir"] / f"{row['entry_name']}.cubin"
    cubin.write_bytes(cubin.read_bytes()[:64])
    line = one_error(capsys, "show", row["id"], "--ir", "sass", "--cache-dir", cache)
    assert f"{cubin}: cuobjdump cannot read it" in line and "warmup` rebuilds it" in line, line


@pytest.mark.parametrize("damage, words", [
    (lambda data, h: data["variants"][h].update(files={}), "files: missing"),
    (lambda data, h: data["variants"][h].update(target="gfx942"), "target: 'gfx942' is filed under sm90"),
    (lambda data, h: data.update(target="gfx942"), "damaged manifest: target: 'gfx942'"),
    (lambda data, h: data["variants"].update(zz=data["variants"].pop(h)), "variants.'zz': not a cache hash"),
])
def test_a_row_that_would_hide_damage_or_land_elsewhere_is_a_damaged_manifest(warmed, cache, capsys, damage, words):
    """An empty ``files`` would let a corrupt binary pass ``check``; a row of another target would list
    one target's binary as another's; a key that is no hash names no folder."""
    path = cache / "tritonwarm" / "manifest-sm90.json"
    data = json.loads(path.read_text())
    damage(data, next(iter(data["variants"])))
    path.write_text(json.dumps(data))
    line = one_error(capsys, "list", "--cache-dir", cache)
    assert f"{path}: damaged manifest: " in line and words in line, line
    capsys.readouterr()
    assert main(["check", str(warmed / "rms.yaml"), "--target", "sm90", "--cache-dir", str(cache)]) == 1


def _record_line(cache, **change):
    [(cache_hash, row)] = Manifest(cache, "sm90").read().items()
    line = {"kernel": row["kernel"], "target": "sm90", "variant": row["id"], "cache_hash": cache_hash, "hit": True,
            "args": row["args"], "launches": 1}
    return json.dumps({**line, **change}) + "\n"


@pytest.mark.parametrize("text, words", [("", "is empty: no launch was recorded"),
                                         ("TARGET", "line 1: unknown target 'sm99'")])
def test_prune_unused_refuses_a_record_that_cannot_judge(tmp_path, cache, capsys, text, words):
    record = tmp_path / "record.jsonl"
    record.write_text(_record_line(cache, target="sm99") if text == "TARGET" else text)
    before = _snapshot(cache)
    line = one_error(capsys, "prune", "--unused", record, "--cache-dir", cache)
    assert words in line, line
    assert _snapshot(cache) == before


def test_prune_unused_judges_only_the_targets_the_record_launched_on(tmp_path, warmed, cache, capsys):
    warm(plan(load_specs([warmed / "rms.yaml"]), TARGETS["gfx942"]), cache)
    record = tmp_path / "record.jsonl"
    record.write_text(_record_line(cache, cache_hash="0" * 64))  # sm90 launched something else
    capsys.readouterr()
    assert main(["prune", "--unused", str(record), "--cache-dir", str(cache), "--json"]) == 0
    removed = json.loads(capsys.readouterr().out)["removed"]
    assert [r["target"] for r in removed] == ["sm90"] and Manifest(cache, "gfx942").read()


@pytest.mark.parametrize("kind", ["character device", "symbolic link"])
def test_env_output_writes_through_a_device_or_link_and_never_replaces_it(tmp_path, capsys, kind):
    import os
    import stat

    real = tmp_path / "real.json"
    if kind == "character device":
        out = tmp_path / "null"
        try:
            os.mknod(out, 0o666 | stat.S_IFCHR, os.makedev(1, 3))  # /dev/null's numbers
        except PermissionError:
            pytest.skip("creating a device node needs root")
    else:
        real.write_text("old")
        out = tmp_path / "link.json"
        out.symlink_to(real)
    assert main(["env", "-o", str(out)]) == 0
    if kind == "character device":
        assert stat.S_ISCHR(os.stat(out).st_mode)
    else:
        assert out.is_symlink() and json.loads(real.read_text())["triton"]["version"]
    assert one_error(capsys, "env", "-o", tmp_path).endswith(f"-o {tmp_path}: is a directory; name a file")


def test_tune_refuses_a_file_as_the_cache(tmp_path, warmed, capsys):
    a_file = tmp_path / "a_file"
    a_file.write_text("hi")
    line = one_error(capsys, "tune", warmed / "rms.yaml", "--target", "sm90", "--cache-dir", a_file)
    assert f"cache directory {a_file} is a file, not a directory" in line, line
