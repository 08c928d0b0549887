"""Bad input, as a user or an adversary gives it: each case ends in exit 2 (or 1 for a check that
found a problem) and one line naming the file and line, the field or the path, and the value."""

import errno
import os
import subprocess
import sys
import textwrap
import time
import tracemalloc

import pytest
from tritonwarm.cli import main

RMS = "kernel: tritonwarm.launchers.rms_norm:rms_norm\n"


def run(capsys, *argv):
    """``tritonwarm ARGV`` in this process: (exit code, stdout, stderr lines)."""
    rc = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err.strip().splitlines()


def one_error(capsys, *argv, rc=2) -> str:
    code, out, err = run(capsys, *argv)
    assert code == rc, (code, out, err)
    assert len(err) == 1 and "Traceback" not in err[0], err
    assert err[0].startswith("tritonwarm: error: "), err
    return err[0]


def spec(tmp_path, text, name="s.yaml"):
    """Write a spec; the body after an unindented ``kernel:`` line may be indented (it is dedented)."""
    head, _, body = text.partition("\n")
    path = tmp_path / name
    path.write_text(head + "\n" + textwrap.dedent(body))
    return path


def test_unknown_dtype_in_an_axis_list_names_its_line_at_validation(tmp_path, capsys):
    path = spec(tmp_path, RMS + """\
        axes:
          n: [16]
          dtype: [bfloat16, float17]
        args:
          x: {tensor: [$n, 128], dtype: $dtype}
          weight: {tensor: [128], dtype: $dtype}
    """)
    line = one_error(capsys, "check", path, "--target", "sm90", "--cache-dir", tmp_path)
    assert f"{path}:4: axes.dtype.1: unknown dtype 'float17'" in line, line


def test_unknown_dtype_from_an_expression_names_the_field(tmp_path, capsys):
    path = spec(tmp_path, RMS + """\
        axes:
          n: [16]
          wide: [false, true]
        args:
          x: {tensor: [$n, 128], dtype: "$'float32' if wide else 'float17'"}
          weight: {tensor: [128], dtype: bfloat16}
    """)
    line = one_error(capsys, "check", path, "--target", "sm90", "--cache-dir", tmp_path)
    assert f"{path}:6: args.x.dtype: unknown dtype 'float17'" in line, line


def test_a_huge_range_is_refused_from_its_count_before_anything_is_built(tmp_path, capsys):
    path = spec(tmp_path, RMS + f"""\
        axes:
          n: {{range: [1, {2**40}]}}
        args:
          x: {{tensor: [$n, 128], dtype: bfloat16}}
          weight: {{tensor: [128], dtype: bfloat16}}
    """)
    tracemalloc.start()
    try:
        line = one_error(capsys, "check", path, "--target", "sm90", "--cache-dir", tmp_path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert f"{path}:3: axes.n.range: {2**40} values to enumerate" in line and "collapse: true" in line, line
    assert peak < 50 * 2**20, f"{peak} bytes allocated: the range was built before it was counted"


def test_a_cross_product_of_too_many_rows_is_refused(tmp_path, capsys):
    path = spec(tmp_path, RMS + """\
        axes:
          n: {range: [1, 4000]}
          m: {range: [1, 4000]}
        args:
          x: {tensor: [$n, $m], dtype: bfloat16}
          weight: {tensor: [$m], dtype: bfloat16}
    """)
    line = one_error(capsys, "check", path, "--target", "sm90", "--cache-dir", tmp_path)
    assert f"{path}:2: axes: 16000000 rows" in line and "at most" in line, line


@pytest.mark.parametrize("expr, fragment", [
    ("9**9**9**9", "9**387420489 is too large"),
    ("(2**200) * (2**200)", "is too large"),
    ("'x' * 10**9", "too large"),
    ("n // 0", "by zero"),
])
def test_expression_arithmetic_is_bounded_and_fails_in_one_line(tmp_path, capsys, expr, fragment):
    path = spec(tmp_path, RMS + f"""\
        axes:
          n: [16]
        args:
          x: {{tensor: [$n, 128], dtype: bfloat16}}
          weight: {{tensor: [128], dtype: bfloat16}}
          eps: ${expr}
    """)
    line = one_error(capsys, "check", path, "--target", "sm90", "--cache-dir", tmp_path)
    assert f"{path}:7: args.eps: ${expr} fails for (n=16)" in line and fragment in line, line


def test_bounded_arithmetic_still_reaches_every_integer_class():
    from tritonwarm.jit.pipeline.specs import Expr, SpecError

    where = SpecError("s.yaml", 1, "args.n", "")
    assert Expr("2**64 - 1", set(), where)({}) == 2**64 - 1
    assert Expr("n * 2**40", {"n"}, where)({"n": 3}) == 3 * 2**40
    assert Expr("2 ** -1", set(), where)({}) == 0.5


def test_a_builtin_as_the_launcher_names_the_field_and_what_is_expected(tmp_path, capsys):
    path = spec(tmp_path, "kernel: os:system\naxes:\n  n: [1]\nargs: [$n]\n")
    line = one_error(capsys, "check", path, "--target", "sm90", "--cache-dir", tmp_path)
    assert f"{path}:1: kernel: 'os:system' is a built-in function: expected 'module:function'" in line, line


def test_a_launcher_that_launches_no_triton_kernel_is_an_error_check_reports(tmp_path, capsys):
    path = spec(tmp_path, "kernel: posixpath:join\naxes:\n  n: [1]\nargs: [a, b]\n")
    (tmp_path / "cache").mkdir()
    rc, out, _ = run(capsys, "check", path, "--target", "sm90", "--cache-dir", tmp_path / "cache")
    assert rc == 1
    assert f"error: {path}: kernel: posixpath:join launched no Triton kernel in any of its 1 rows" in out, out


def test_a_python_yaml_tag_names_its_line(tmp_path, capsys):
    path = spec(tmp_path, RMS + """\
        axes:
          n: [16]
        args:
          x: {tensor: [$n, 128], dtype: bfloat16}
          weight: !!python/name:os.system
    """)
    line = one_error(capsys, "check", path, "--target", "sm90", "--cache-dir", tmp_path)
    assert f"{path}:6: args.weight: unsupported YAML tag !!python/name:os.system" in line, line


def test_a_python_object_tag_on_a_mapping_names_its_line(tmp_path, capsys):
    path = spec(tmp_path, RMS + "axes: !!python/object:argparse.Namespace {n: [1]}\nargs: []\n")
    line = one_error(capsys, "check", path, "--target", "sm90", "--cache-dir", tmp_path)
    assert f"{path}:2: axes: unsupported YAML tag !!python/object:argparse.Namespace" in line, line


def test_a_directory_with_no_specs_is_bad_input(tmp_path, capsys):
    empty = tmp_path / "specs"
    empty.mkdir()
    (empty / "notes.txt").write_text("not a spec")
    line = one_error(capsys, "warmup", empty, "--target", "sm90", "--cache-dir", tmp_path / "c")
    assert f"{empty}: <directory>: no specs in it" in line, line
    assert not (tmp_path / "c").exists()


@pytest.mark.parametrize("garbage", ["garbage", '{"kernel": 1}', "[1, 2]", '{"kernel": "k"}'])
def test_a_garbage_line_in_a_dispatch_record_names_its_line(tmp_path, capsys, garbage):
    from tritonwarm.jit.core.dispatch_record import FIELDS

    good = {"kernel": "k", "target": "sm90", "variant": "abc", "cache_hash": "ab" * 32, "hit": True, "args": {},
            "launches": 1}
    assert set(good) == set(FIELDS)
    import json

    record = tmp_path / "record.jsonl"
    record.write_text(json.dumps(good) + "\n\n" + garbage + "\n")
    (tmp_path / "cache").mkdir()
    for argv in (["check", "--trace", record], ["prune", "--unused", record, "--dry-run"]):
        line = one_error(capsys, *argv, "--cache-dir", tmp_path / "cache")
        assert f"{record}:3: not a dispatch record" in line, line


def test_records_round_trip_through_the_one_format(tmp_path):
    from tritonwarm.jit.core.dispatch_record import read_record, write_record

    lines = [{"kernel": "k", "target": "sm90", "variant": "abc", "cache_hash": "ab" * 32, "hit": False,
              "args": {"n": "i32"}, "launches": 3, "first": None}]
    write_record(tmp_path / "r.jsonl", lines)
    assert read_record(tmp_path / "r.jsonl") == lines
    with pytest.raises(ValueError, match=r"r2.jsonl:1: not a dispatch record \('hit' is 1\)"):
        write_record(tmp_path / "r2.jsonl", [{**lines[0], "hit": 1}])


@pytest.mark.parametrize("command", ["warmup", "check"])
def test_a_cache_dir_that_is_a_file_or_missing_says_what_is_wrong(tmp_path, capsys, command):
    path = spec(tmp_path, RMS + "args:\n  x: {tensor: [4, 128], dtype: bfloat16}\n  weight: {tensor: [128], "
                                "dtype: bfloat16}\n")
    a_file = tmp_path / "a_file"
    a_file.write_text("")
    line = one_error(capsys, command, path, "--target", "sm90", "--cache-dir", a_file)
    assert f"cache directory {a_file} is a file, not a directory" in line, line
    line = one_error(capsys, command, path, "--target", "sm90", "--cache-dir", a_file / "below")
    verb = "create" if command == "warmup" else "read"
    assert f"cannot {verb} cache directory {a_file / 'below'}: {a_file} is a file, not a directory" in line, line
    if command == "check":  # not warmed yet: everything is missing, and the path is named as such
        rc, out, _ = run(capsys, command, path, "--target", "sm90", "--cache-dir", tmp_path / "nowhere")
        assert rc == 1 and f"cache: {tmp_path / 'nowhere'} (does not exist: nothing was warmed there)" in out, out
        assert "1 missing" in out, out


def test_jobs_zero_says_so_without_a_class_name(capsys):
    line = one_error(capsys, "warmup", "--jobs", "0", "--target", "sm90")
    assert line == "tritonwarm: error: --jobs must be at least 1, got 0", line


def test_messages_carry_no_class_names_unless_the_message_is_empty():
    from tritonwarm.cli.common import UsageError
    from tritonwarm.errors import describe_error
    from tritonwarm.jit.cache import CacheError

    assert describe_error(UsageError("--jobs must be at least 1")) == "--jobs must be at least 1"
    assert describe_error(CacheError("disk full")) == "disk full"
    assert describe_error(KeyError("no such variant")) == "no such variant"
    assert describe_error(OSError(errno.ENOSPC, "No space left on device")) == "[Errno 28] No space left on device"
    assert describe_error(TypeError("f() takes 2 arguments")) == "TypeError: f() takes 2 arguments"
    assert describe_error(AssertionError()) == "AssertionError"


# --------------------------------------------------------------------------- the cache under stress


def _one_variant_spec(tmp_path):
    return spec(tmp_path, RMS + """\
        axes:
          dtype: [float16, bfloat16]
        args:
          x: {tensor: [8, 4096], dtype: $dtype}
          weight: {tensor: [4096], dtype: $dtype}
    """)


def test_a_full_disk_stops_at_the_first_write_and_the_next_run_cleans_up(tmp_path, monkeypatch):
    from tritonwarm.jit import TARGETS
    from tritonwarm.jit.cache import CacheError
    from tritonwarm.jit.pipeline import warmup as warmup_module
    from tritonwarm.jit.pipeline.plan import plan
    from tritonwarm.jit.pipeline.specs import load_specs

    cache = tmp_path / "cache"
    the_plan = plan(load_specs([_one_variant_spec(tmp_path)]), TARGETS["sm90"])
    assert len(the_plan.variants) == 2
    attempts = []

    def full_disk(variant, target, cache_dir, binary_only=False):
        # what Triton's FileCacheManager.put leaves when the write fails: its temporary folder
        leftover = cache_dir / variant.entry_dir / f"tmp.pid_{2**22 + 7}_deadbeef"  # no such process
        leftover.mkdir(parents=True)
        attempts.append(leftover)
        raise OSError(errno.ENOSPC, "No space left on device", str(leftover / "k.cubin"))

    monkeypatch.setattr(warmup_module, "compile_variant", full_disk)
    with pytest.raises(CacheError) as failure:
        warmup_module.warm(the_plan, cache, jobs=1)
    message = str(failure.value)
    assert len(attempts) == 1, "kept compiling after the disk was full"
    assert message.startswith(f"disk full: no space left on device writing {attempts[0] / 'k.cubin'}"), message
    assert "\n" not in message

    old = time.time() - 3600
    os.utime(attempts[0], (old, old))
    fresh_leftover = cache / "SOMEENTRY" / f"tmp.pid_{os.getpid()}_alive"  # a live writer's: kept
    fresh_leftover.mkdir(parents=True)
    monkeypatch.setattr(warmup_module, "compile_variant", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("x")))
    warmup_module.warm(the_plan, cache, jobs=1)
    assert not attempts[0].exists() and fresh_leftover.exists()


@pytest.mark.slow
def test_a_full_disk_stops_a_pooled_warmup_too(tmp_path, monkeypatch):
    """Workers fork after the patch, so they inherit it; the first failure cancels what has not started."""
    from tritonwarm.jit import TARGETS
    from tritonwarm.jit.cache import CacheError
    from tritonwarm.jit.pipeline import warmup as warmup_module
    from tritonwarm.jit.pipeline.plan import plan
    from tritonwarm.jit.pipeline.pool import worker_pool
    from tritonwarm.jit.pipeline.specs import load_specs

    path = spec(tmp_path, RMS + """\
        axes:
          dtype: [float16, bfloat16]
          hidden: [256, 512, 1024, 2048, 4096, 8192]
        args:
          x: {tensor: [8, $hidden], dtype: $dtype}
          weight: {tensor: [$hidden], dtype: $dtype}
    """)
    target, cache = TARGETS["sm90"], tmp_path / "cache"
    the_plan = plan(load_specs([path]), target)
    assert len(the_plan.variants) == 12

    def full_disk(variant, target, cache_dir, binary_only=False):
        leftover = cache_dir / variant.entry_dir / f"tmp.pid_{os.getpid()}_x"
        leftover.mkdir(parents=True)
        time.sleep(2)
        raise OSError(errno.ENOSPC, "No space left on device", str(leftover / "k.cubin"))

    monkeypatch.setattr(warmup_module, "compile_variant", full_disk)
    with worker_pool(2, [target]) as pool, pytest.raises(CacheError, match="^disk full: no space left on device"):
        warmup_module.warm(the_plan, cache, jobs=2, pool=pool)
    attempts = list(cache.glob("*/tmp.pid_*"))
    # the two running and the few the pool had already handed to its workers (4-7 seen), never all 12:
    # without the stop, every one of them would be attempted
    assert 1 <= len(attempts) < 12, f"{len(attempts)} of 12 compiles attempted after the disk was full"


def test_a_full_disk_while_writing_the_manifest_names_it(tmp_path, monkeypatch):
    from tritonwarm.jit.cache import CacheError, Manifest
    from tritonwarm.jit.cache.layout import entry_dir_name

    def record(cache_hash):
        return {cache_hash: {"id": cache_hash[:12], "kernel": "k", "target": "sm90", "entry_name": "k",
                             "entry_dir": entry_dir_name(cache_hash), "args": {}}}

    manifest = Manifest(tmp_path, "sm90")
    manifest.update(record("cd" * 32))

    def no_space(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    with monkeypatch.context() as patched:  # recording a variant: one line appended to the journal
        patched.setattr("tritonwarm.jit.cache.manifest.os.fsync", no_space)
        with pytest.raises(CacheError, match=f"disk full: cannot write {manifest.journal}: no space left on device"):
            manifest.update(record("ab" * 32))
    recorded = manifest.journal.read_bytes()
    assert b"ab" * 32 not in recorded and b"cd" * 32 in recorded  # the failed line is no record; the others stay
    monkeypatch.setattr("tritonwarm.jit.cache.manifest.json.dump", no_space)  # folding the journal into the file
    with pytest.raises(CacheError, match=f"disk full: cannot write {manifest.path}: no space left on device"):
        manifest.compact()
    assert not list(manifest.dir.glob(".manifest-*"))  # no temporary left behind
    assert manifest.journal.read_bytes() == recorded  # and nothing recorded lost


@pytest.mark.slow
@pytest.mark.parametrize("damage", ["", "{not json", '{"format": 1, "variants": []}'])
def test_a_damaged_manifest_fails_check_and_warmup_rebuilds_it_from_verified_entries(tmp_path, capsys, damage):
    path = _one_variant_spec(tmp_path)
    cache = tmp_path / "cache"
    assert main(["warmup", str(path), "--target", "sm90", "--cache-dir", str(cache), "--jobs", "1"]) == 0
    manifest = cache / "tritonwarm" / "manifest-sm90.json"
    good = manifest.read_text()
    from tritonwarm.jit.cache import Manifest

    entries = Manifest(cache, "sm90").read()
    # one entry altered while the manifest was damaged: with no record to compare, only a fresh
    # compile can tell, and it must not be kept
    altered = next(iter(entries.values()))
    cubin = cache / altered["entry_dir"] / f"{altered['entry_name']}.cubin"
    data = bytearray(cubin.read_bytes())
    data[300:304] = b"\xde\xad\xbe\xef"
    cubin.write_bytes(bytes(data))
    manifest.write_text(damage)
    capsys.readouterr()

    rc, out, _ = run(capsys, "check", path, "--target", "sm90", "--cache-dir", cache)
    assert rc == 1
    assert f"manifest: {manifest}: damaged manifest: " in out, out

    rc, out, err = run(capsys, "warmup", path, "--target", "sm90", "--cache-dir", cache, "--jobs", "1", "--json")
    assert rc == 0, err
    import json

    result = json.loads(out)["targets"][0]
    assert (result["repaired"], result["verified"]) == (1, 1), result
    assert result["manifest_set_aside"] == str(manifest) + ".damaged"
    assert (cache / "tritonwarm" / "manifest-sm90.json.damaged").read_text() == damage
    rebuilt = Manifest(cache, "sm90").read()
    before = json.loads(good)["variants"]
    assert {k: v["files"] for k, v in rebuilt.items()} == {k: v["files"] for k, v in before.items()}
    assert main(["check", str(path), "--target", "sm90", "--cache-dir", str(cache)]) == 0


def test_an_unreadable_entry_is_reported_as_unreadable_with_its_path(tmp_path, capsys, monkeypatch):
    """Tests run as root here, where permission bits do not stop reads: the read itself fails."""
    from tritonwarm.jit import TARGETS
    from tritonwarm.jit.cache import Manifest
    from tritonwarm.jit.pipeline.plan import plan
    from tritonwarm.jit.pipeline.specs import load_specs

    path = _one_variant_spec(tmp_path)
    cache = tmp_path / "cache"
    variants = list(plan(load_specs([path]), TARGETS["sm90"]).variants.values())
    victim = variants[0]
    folder = cache / victim.entry_dir
    folder.mkdir(parents=True)
    group = folder / f"__grp__{victim.entry_name}.json"
    group.write_text("{}")
    Manifest(cache, "sm90").update({})  # the cache exists
    original = type(group).read_text

    def read_text(self, *args, **kwargs):
        if self.parent == folder:
            raise PermissionError(errno.EACCES, "Permission denied", str(self))
        return original(self, *args, **kwargs)

    monkeypatch.setattr(type(group), "read_text", read_text)
    rc, out, _ = run(capsys, "check", path, "--target", "sm90", "--cache-dir", cache, "--verbose")
    assert rc == 1
    out = " ".join(out.split())  # lines over 200 characters are wrapped
    assert f"unreadable {victim.variant_id} rms_norm_kernel entry {folder} is unreadable: Permission denied" \
        in out, out
    assert f"missing {victim.variant_id}" not in out

    import tritonwarm.jit.pipeline.warmup as warmup_module

    compiled = []
    monkeypatch.setattr(warmup_module, "_warm_one", lambda variant, *a, **k: compiled.append(variant) or
                        ("compiled", {"files": {}, "resources": None, "compile_seconds": 0.0}))
    rc, out, err = run(capsys, "warmup", path, "--target", "sm90", "--cache-dir", cache, "--jobs", "1")
    assert rc == 1
    problems = " ".join(" ".join(err).split())  # lines over 200 characters are wrapped
    assert f"{victim.variant_id}: entry {folder} is unreadable: Permission denied" in problems, err
    assert [v.variant_id for v in compiled] == [variants[1].variant_id]  # the other one still warmed


# --------------------------------------------------------------------------- small things a newcomer meets


def test_version_and_engine_run_help_shows_defaults(capsys):
    from tritonwarm import __version__

    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0 and capsys.readouterr().out.strip() == f"tritonwarm {__version__}"
    with pytest.raises(SystemExit):
        main(["engine", "run", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "(default: tiny)" in text and "(default: 8)" in text and "(default: warn)" in text


def test_parser_choices_mirror_the_modules_they_stand_for():
    from tritonwarm.cli.cache import IR_KINDS
    from tritonwarm.engine import cli as engine_cli
    from tritonwarm.engine.ops import OPS
    from tritonwarm.jit.pipeline.inspection import IR_KINDS as INSPECTION_IR_KINDS
    from tritonwarm.jit.serving.monitor import POLICIES

    assert IR_KINDS == INSPECTION_IR_KINDS
    assert engine_cli.POLICIES == POLICIES and sorted(engine_cli.MODES) == sorted(OPS)


@pytest.mark.slow
def test_help_and_argument_errors_import_neither_torch_nor_triton():
    code = ("import sys\nfrom tritonwarm.cli import main\n"
            "for argv in (['--help'], ['warmup', '--help'], ['engine', 'run', '--help'], ['warmup', '--jobs', 'x']):\n"
            "    try:\n        main(argv)\n    except SystemExit:\n        pass\n"
            "print(sorted(m for m in ('torch', 'triton', 'tritonwarm.jit', 'tritonwarm.engine.ops') "
            "if m in sys.modules))\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "[]", proc.stdout


def test_check_prints_the_cache_and_lists_rows_that_repeat_others_when_verbose(tmp_path, capsys):
    path = spec(tmp_path, RMS + """\
        axes:
          n: [16, 32]
        args:
          x: {tensor: [$n, 4096], dtype: bfloat16}
          weight: {tensor: [4096], dtype: bfloat16}
    """)
    cache = tmp_path / "cache"
    cache.mkdir()
    rc, out, _ = run(capsys, "check", path, "--target", "sm90", "--cache-dir", cache)
    assert rc == 1 and f"cache: {cache}" in out and "(1 of them only repeat other rows' variants)" in out
    assert "repeats other rows:" not in out
    rc, out, _ = run(capsys, "check", path, "--target", "sm90", "--cache-dir", cache, "--verbose")
    assert "  repeats other rows: s.yaml#1 (n=32)" in out, out


def test_list_says_why_an_earlier_amd_entry_has_no_register_figures(tmp_path, capsys):
    from tritonwarm.jit.cache import Manifest

    entry = {"id": "abc", "target": "gfx942", "kernel": "k.rms_norm_kernel", "num_warps": 4, "num_stages": 2,
             "args": {"n": "i32"}, "resources": {"shared": 16384}, "cache_hash": "ab" * 32,
             "entry_name": "rms_norm_kernel"}
    Manifest(tmp_path, "gfx942").update({"ab" * 32: entry})
    rc, out, err = run(capsys, "list", "--cache-dir", tmp_path)
    assert rc == 0, err
    lines = out.strip().splitlines()
    assert lines[-1].startswith("-: REGS and SPILL of these AMD entries were not recorded"), out
    assert lines[1].split()[5:8] == ["-", "-", "16384"], out  # shared memory is Triton's own figure
