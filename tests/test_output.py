"""What a person reads: one line per cause with its count and at most three examples, lines as wide as
the terminal, sizes in MiB, numbers with units, notes said once and before the result, progress with
done/total, and row failures counted as failures."""

import textwrap
import time

import pytest
from tritonwarm import output
from tritonwarm.cli import main


def run(capsys, *argv):
    rc = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


def write_spec(tmp_path, text: str, name: str = "s.yaml"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


# ----------------------------------------------------------------------------- the helpers


def test_width_is_the_terminals_and_200_for_a_log(monkeypatch):
    monkeypatch.delenv("COLUMNS", raising=False)
    assert output.width() == output.NOT_A_TERMINAL == 200  # the tests' stdout is no terminal
    monkeypatch.setenv("COLUMNS", "100")
    assert output.width() == 100
    monkeypatch.setenv("COLUMNS", "5")
    assert output.width() == output.MIN_WIDTH


def test_wrapped_keeps_words_whole_and_indents_the_rest():
    lines = output.wrapped("  why: ", "word " * 30 + "/a/path/" + "x" * 80, columns=60)
    assert all(len(line) <= 60 for line in lines[:-1]) and lines[-1].strip().startswith("/a/path/")
    assert lines[0].startswith("  why: word") and all(line.startswith("      ") for line in lines[1:])


def test_fold_examples_plural_and_mib():
    folded = output.fold(["a:1", "b:1", "a:2", "c:1"], lambda s: s.split(":")[1])
    assert folded == {"1": ["a:1", "b:1", "c:1"], "2": ["a:2"]}
    assert output.examples(["k1", "k2", "k1", "k3", "k4", "k5"]) == "k1, k2, k3 and 2 more"
    assert output.plural(1, "row") == "1 row" and output.plural(2, "entry", "entries") == "2 entries"
    assert output.mib(3 * 2**20 + 2**19) == "3.50 MiB"
    pinned = [f"s.yaml#{i} (n={i}): scale_rows: config index 9 out of range" for i in range(40)]
    assert output.fold_rows([*pinned, "s.yaml: launcher: launched no kernel", "s.yaml#7 (n=7): other"]) == [
        "40 rows (s.yaml#0 (n=0) and 39 more): scale_rows: config index 9 out of range",
        "s.yaml: launcher: launched no kernel", "s.yaml#7 (n=7): other"]


# ----------------------------------------------------------------------------- rows that fail


EPSILON = """\
    launcher: tritonwarm.launchers.rms_norm:rms_norm
    axes:
      n: {range: [1, 128]}
    args:
      x: {tensor: [$n, 4096], dtype: bfloat16}
      weight: {tensor: [4096], dtype: bfloat16}
      epsilon: 1.0e-6
"""


@pytest.mark.parametrize("command", ["warmup", "check"])
def test_a_wrong_argument_name_is_one_line_naming_the_field_and_the_launchers_parameters(tmp_path, capsys, command):
    path = write_spec(tmp_path, EPSILON)  # 128 rows, each of which would raise the same TypeError
    rc, out, err = run(capsys, command, path, "--target", "sm90", "--cache-dir", tmp_path / "cache")
    assert rc == 2 and not out, out
    [line] = err.strip().splitlines()
    assert line.startswith(f"tritonwarm: error: {path}:7: args.epsilon: got an unexpected keyword argument 'epsilon'")
    assert line.endswith("the launcher is rms_norm(x, weight, eps=1e-06, residual=None)"), line


def test_a_triton_jit_kernel_named_as_the_launcher_says_the_launcher_is_the_host_function(tmp_path, capsys):
    path = write_spec(tmp_path, """\
        launcher: tritonwarm.kernels.rms_norm:rms_norm_kernel
        axes:
          n: [1, 16, 32]
        args:
          x: {tensor: [$n, 4096], dtype: bfloat16}
    """)
    rc, out, err = run(capsys, "check", path, "--target", "sm90", "--cache-dir", tmp_path / "cache")
    assert rc == 2
    [line] = err.strip().splitlines()
    assert f"{path}:1: launcher: 'tritonwarm.kernels.rms_norm:rms_norm_kernel' is a @triton.jit kernel" in line
    assert "name the Python (host) function that launches it as kernel[grid](...)" in line


FAILING_ROWS = """\
    launcher: tritonwarm.launchers.rms_norm:rms_norm
    axes:
      n: {range: [1, 64]}
    args:
      x: {tensor: [$n, 4096], dtype: bfloat16}
      weight: {tensor: [2048], dtype: bfloat16}
"""


def test_rows_failing_alike_are_one_line_with_a_count_and_count_as_failed(tmp_path, capsys):
    path = write_spec(tmp_path, FAILING_ROWS)
    cache = tmp_path / "cache"
    rc, out, err = run(capsys, "warmup", path, "--target", "sm90", "--cache-dir", cache, "-j", "1")
    assert rc == 1
    assert "sm90: 0 variants planned from 64 rows: 0 compiled, 0 already cached, 0 variants and 64 rows failed" in out
    problems = [line for line in err.splitlines() if line.startswith("problem: ")]
    assert problems == ["problem: 64 rows (s.yaml#0 (n=1) and 63 more): the launcher failed on fake inputs: weight "
                        "shape (2048,) does not match hidden size 4096"], err
    rc, out, err = run(capsys, "check", path, "--target", "sm90", "--cache-dir", cache)
    assert rc == 1 and out.count("  error: ") == 1 and "64 rows (s.yaml#0 (n=1) and 63 more)" in out, out


def test_a_capture_all_launcher_with_a_wrong_argument_fails_its_rows_in_one_line(tmp_path):
    from tritonwarm.jit import TARGETS
    from tritonwarm.jit.pipeline.plan import plan
    from tritonwarm.jit.pipeline.specs import load_specs

    path = write_spec(tmp_path, """\
        launcher: tritonwarm.examples.thirdparty_ops:mlp_block
        capture: all
        axes:
          tokens: {range: [1, 40]}
        args:
          x: {tensor: [$tokens, 1024], dtype: bfloat16}
          bias: {tensor: [1024], dtype: bfloat16}
          biass: {tensor: [1024], dtype: bfloat16}
    """)
    the_plan = plan(load_specs([path]), TARGETS["sm90"], verify_collapse=False)
    assert len(the_plan.failed_rows) == 40 and len(the_plan.errors) == 1, the_plan.errors
    assert "40 rows (s.yaml#0 (tokens=1) and 39 more): the launcher failed on fake inputs: TypeError: got an " \
           "unexpected keyword argument 'biass': the launcher is mlp_block(" in the_plan.errors[0]


# ----------------------------------------------------------------------------- line budgets

LINE_BUDGET = 20
AUTOTUNED_200_ROWS = """\
    # 200 rows of an autotuned kernel with no stored winner: each would benchmark at serving time
    launcher: tritonwarm.examples.inhouse_autotuned:scale_rows
    axes:
      n_cols: {range: [1000, 1199]}
    args:
      x: {tensor: [32, $n_cols], dtype: bfloat16}
      scale: {tensor: [32], dtype: float32}
"""


def _lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.strip()]


@pytest.mark.slow
def test_check_of_the_shipped_specs_and_a_200_row_autotuned_spec_is_within_its_line_budget(tmp_path, capsys,
                                                                                          monkeypatch):
    from tritonwarm.cli import SHIPPED_SPECS

    autotuned = write_spec(tmp_path, AUTOTUNED_200_ROWS, "autotuned.yaml")
    argv = ["check", SHIPPED_SPECS, autotuned, "--target", "sm90", "--cache-dir", tmp_path / "cache"]
    rc, out, err = run(capsys, *argv)
    assert rc == 1
    assert len(_lines(out)) <= LINE_BUDGET, out
    winners = [line for line in out.splitlines() if "winner unknown:" in line]
    assert len(winners) == 1 and "scale_rows_kernel: 200 rows" in winners[0], out
    assert "tritonwarm tune SPEC --target local" in winners[0]
    rc, verbose, _ = run(capsys, *argv, "--verbose")
    assert verbose.count("winner unknown:") == 200 and len(_lines(verbose)) > 200

    import tritonwarm.cli.warm as warm_cli  # the same plan against a shared cache that lacks it all

    monkeypatch.setattr(warm_cli, "_remote_store", lambda url: EmptyStore())
    rc, out, _ = run(capsys, *argv[:-2], "--remote", EmptyStore.url)
    assert rc == 1 and len(_lines(out)) <= LINE_BUDGET, out


def _entry(cache, kernel: str, number: int) -> dict:
    from tritonwarm.jit.cache import entry_dir_name

    cache_hash = f"{number:064x}"
    folder = cache / entry_dir_name(cache_hash)
    folder.mkdir(parents=True)
    (folder / "k.cubin").write_bytes(b"x")
    (folder / "__grp__k.json").write_text('{"child_paths": {"k.cubin": "%s"}}' % (folder / "k.cubin"))
    return {"id": cache_hash[:12], "kernel": kernel, "target": "sm90", "cache_hash": cache_hash,
            "entry_dir": folder.name, "entry_name": "k", "args": {"n": "i32"}, "rows": []}


def test_check_trace_folds_misses_and_unused_variants_within_its_line_budget(tmp_path, capsys):
    import json

    from tritonwarm.jit.cache import Manifest

    cache = tmp_path / "cache"
    entries = [_entry(cache, f"pkg.mod.kernel_{i % 7}", i) for i in range(140)]
    Manifest(cache, "sm90").update({e["cache_hash"]: e for e in entries})
    record = tmp_path / "record.jsonl"
    missed = [{"kernel": f"pkg.mod.other_{i % 5}", "target": "sm90", "variant": f"{i:012x}", "cache_hash": f"{i:064x}"
               .replace("0", "f", 1), "hit": False, "args": {"n": "i64"}, "launches": 1,
               "first": {"step": i, "requests": 1, "tokens": 1}} for i in range(1, 201)]
    record.write_text("".join(json.dumps(line) + "\n" for line in missed))
    rc, out, err = run(capsys, "check", "--trace", record, "--target", "sm90", "--cache-dir", cache)
    assert rc == 1, err
    assert len(_lines(out)) <= LINE_BUDGET, out
    assert "sm90: MISSES: 200 variants launched, 200 missed the cache, 140 warmed but never used" in out
    assert "  never used: 140 warmed variants of kernel_0, kernel_1, kernel_2 and 4 more" in out, out
    [missed] = [line for line in out.splitlines() if line.startswith("  missed: ")]
    assert missed.startswith("  missed: 200 variants ("), out
    assert " of other_1, other_2, other_3 and 2 more first at step 1 (batch=1, tokens=1): " in missed, out
    assert "  unused  " not in out
    rc, verbose, _ = run(capsys, "check", "--trace", record, "--target", "sm90", "--cache-dir", cache, "--verbose")
    assert verbose.count("  unused  ") == 140 and verbose.count("  miss  ") == 200


class EmptyStore:
    """A shared cache that answers "missing" for every entry, as an empty Redis does (no Redis needed)."""

    url = "redis://fleet:6379/0"
    key = None  # no fleet key: unauthenticated

    def inspect_entry(self, entry_dir, group_name):
        return "missing", {}, None


def test_check_remote_folds_missing_variants_within_its_line_budget(tmp_path, capsys, monkeypatch):
    """A shared cache that lacks everything: one line per cause, not one per variant."""
    import tritonwarm.cli.warm as warm_cli

    monkeypatch.setattr(warm_cli, "_remote_store", lambda url: EmptyStore())
    path = write_spec(tmp_path, """\
        launcher: tritonwarm.launchers.rms_norm:rms_norm
        axes:
          dtype: [float16, bfloat16, float32]
          n: [1, 16, 17]
          hidden: [1024, 2048, 4096]
        args:
          x: {tensor: [$n, $hidden], dtype: $dtype}
          weight: {tensor: [$hidden], dtype: $dtype}
    """)
    argv = ["check", path, "--target", "sm90", "--remote", "redis://fleet:6379/0"]
    rc, out, _ = run(capsys, *argv)
    assert rc == 1 and len(_lines(out)) <= 3, out
    assert "  missing: " in out and "variants of rms_norm_kernel: `tritonwarm warmup --push URL` pushes them" in out
    rc, verbose, _ = run(capsys, *argv, "--verbose")
    assert verbose.count("  missing  ") > 3


# ----------------------------------------------------------------------------- collapse advice

WIDE_ROWS_MODULE = '''
import triton
import triton.language as tl


@triton.jit
def scale_rows_kernel(x, n_rows, BLOCK: tl.constexpr, WIDE: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(x + i, tl.load(x + i, mask=i < n_rows) * (4 if WIDE else 2), mask=i < n_rows)


def scale_rows(x):
    """Like Liger's RMSNorm: another kernel variant from 32,768 rows on."""
    n_rows = x.shape[0]
    scale_rows_kernel[(triton.cdiv(n_rows, 128),)](x, n_rows, BLOCK=128, WIDE=n_rows >= 32768)
'''


def test_an_unsound_collapse_names_where_the_variants_change_and_the_split(tmp_path):
    from tritonwarm.jit import TARGETS
    from tritonwarm.jit.pipeline.plan import plan
    from tritonwarm.jit.pipeline.specs import load_specs

    (tmp_path / "wide_rows_lib.py").write_text(WIDE_ROWS_MODULE)
    path = write_spec(tmp_path, """\
        launcher: wide_rows_lib:scale_rows
        capture: all
        import_roots: ["."]
        axes:
          rows: {range: [1, 65536], collapse: true}
        args:
          x: {tensor: [$rows], dtype: float32}
    """)
    [problem] = plan(load_specs([path]), TARGETS["sm90"]).collapse_errors
    assert problem.startswith(f"{path}:5: axes.rows: collapse: true is unsound: rows=65536 launches other variants "
                              "than rows=16"), problem
    assert "the variants change between rows=32752 and rows=32768" in problem, problem
    assert problem.endswith("rows: {range: [1, 32767], collapse: true} and {range: [32768, 65536], collapse: true}")

    split = write_spec(tmp_path, """\
        launcher: wide_rows_lib:scale_rows
        capture: all
        import_roots: ["."]
        axes:
          rows: {range: [1, 32767], collapse: true}
        args:
          x: {tensor: [$rows], dtype: float32}
        ---
        launcher: wide_rows_lib:scale_rows
        capture: all
        import_roots: ["."]
        axes:
          rows: {range: [32768, 65536], collapse: true}
        args:
          x: {tensor: [$rows], dtype: float32}
    """, "split.yaml")
    the_plan = plan(load_specs([split]), TARGETS["sm90"])
    assert not the_plan.collapse_errors and not the_plan.errors
    assert len({v.args["WIDE"] for v in the_plan.variants.values()}) == 2  # both kernels warmed


def test_the_enumeration_limit_is_the_documented_one(tmp_path, capsys):
    from pathlib import Path

    from tritonwarm.jit.pipeline.specs import MAX_ENUMERATED_RANGE

    page = (Path(__file__).resolve().parent.parent / "docs" / "specs.md").read_text()
    assert f"at most {MAX_ENUMERATED_RANGE:,} values" in page
    path = write_spec(tmp_path, f"""\
        launcher: tritonwarm.launchers.rms_norm:rms_norm
        axes:
          n: {{range: [1, {MAX_ENUMERATED_RANGE + 1}]}}
        args:
          x: {{tensor: [$n, 64], dtype: bfloat16}}
          weight: {{tensor: [64], dtype: bfloat16}}
    """)
    rc, _, err = run(capsys, "check", path, "--target", "sm90")
    assert rc == 2 and f"{MAX_ENUMERATED_RANGE + 1} values to enumerate (at most {MAX_ENUMERATED_RANGE})" in err
    assert "split the range there" in err


# ----------------------------------------------------------------------------- a warmed cache's commands

ONE_VARIANT = """\
    launcher: tritonwarm.launchers.rms_norm:rms_norm
    axes:
      n: [16]
    args:
      x: {tensor: [$n, 4096], dtype: bfloat16}
      weight: {tensor: [4096], dtype: bfloat16}
"""


@pytest.fixture(scope="module")
def warmed_bundle(tmp_path_factory):
    """One rms_norm variant warmed for sm90, and its bundle."""
    folder = tmp_path_factory.mktemp("warmed")
    spec = write_spec(folder, ONE_VARIANT)
    cache, bundle = folder / "cache", folder / "warm.tar.gz"
    assert main(["warmup", str(spec), "--target", "sm90", "--cache-dir", str(cache), "-j", "1"]) == 0
    assert main(["bundle", "create", str(bundle), str(spec), "--target", "sm90", "--cache-dir", str(cache)]) == 0
    return spec, cache, bundle


def test_bundle_verify_opens_with_its_verdict_and_sizes_are_in_mib(warmed_bundle, capsys, monkeypatch):
    spec, cache, bundle = warmed_bundle
    capsys.readouterr()
    rc, out, _ = run(capsys, "bundle", "verify", bundle)
    lines = out.splitlines()
    assert rc == 0 and lines[0].startswith(f"{bundle}: ok: every member and hash verified"), out
    assert lines[1].startswith("  contents: 1 entry (sm90: 1), ") and lines[1].endswith(" MiB"), out
    monkeypatch.setenv("TRITON_DEFAULT_FP_FUSION", "0")  # another environment: every key differs
    rc, out, _ = run(capsys, "bundle", "verify", bundle)
    assert rc == 1 and out.splitlines()[0].startswith(f"{bundle}: PROBLEMS: "), out
    assert "this runtime would miss them" in out.splitlines()[0] and "verified:" not in out
    monkeypatch.setenv("TRITON_DEFAULT_FP_FUSION", "1")
    rc, out, _ = run(capsys, "bundle", "create", bundle.parent / "again.tar.gz", spec, "--target", "sm90",
                     "--cache-dir", cache)
    assert rc == 0 and out.rstrip().endswith(" MiB") and " MB" not in out, out


def test_list_wraps_to_the_terminal(warmed_bundle, capsys, monkeypatch):
    _, cache, _ = warmed_bundle
    capsys.readouterr()
    monkeypatch.setenv("COLUMNS", "100")
    rc, out, _ = run(capsys, "list", "--cache-dir", cache)
    assert rc == 0 and all(len(line) <= 100 for line in out.splitlines()), out
    assert "x_ptr:*bf16" in out  # the arguments are all there, on lines of their own
    assert out.split()[5:8] == ["REGS", "SPILL(B)", "SHARED(B)"]  # bytes, as cuobjdump and Triton count them
    monkeypatch.setenv("COLUMNS", "80")
    rc, out, _ = run(capsys, "list", "--cache-dir", cache)
    assert all(len(line) <= 80 for line in out.splitlines()), out
    monkeypatch.delenv("COLUMNS")
    rc, out, _ = run(capsys, "list", "--cache-dir", cache)  # a log: 200 columns
    assert all(len(line) <= 200 for line in out.splitlines()) and max(map(len, out.splitlines())) > 100, out


# ----------------------------------------------------------------------------- notes


def _merged(*argv) -> tuple[int, str]:
    """``tritonwarm ARGV`` in this process, its stdout and stderr in the order they were written."""
    import contextlib
    import io

    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer), contextlib.redirect_stderr(buffer):
        rc = main([str(a) for a in argv])
    return rc, buffer.getvalue()


def test_a_note_comes_once_before_the_result_and_once_for_a_chain_of_commands_on_one_cache(tmp_path, monkeypatch):
    """The README's set-up line chains warm-ups and an engine run on one cache: the FP-fusion note is said
    by the first command that warms the folder, before its result, and not again by the rest."""
    pytest.importorskip("triton._utils").__dict__.get("FP_FUSION_DEFAULT_WARNING") or pytest.skip(
        "this Triton does not warn of its FP fusion default")
    monkeypatch.delenv("TRITON_DEFAULT_FP_FUSION")
    spec, cache = write_spec(tmp_path, ONE_VARIANT), tmp_path / "cache"
    note = "tritonwarm: note: TRITON_DEFAULT_FP_FUSION is unset"
    rc, text = _merged("check", spec, "--target", "sm90", "--cache-dir", cache)
    assert rc == 1 and text.count(note) == 1 and text.index(note) < text.index("sm90: PROBLEMS"), text
    rc, text = _merged("warmup", spec, "--target", "sm90", "--cache-dir", cache, "-j", "1")
    assert rc == 0 and text.count(note) == 1 and text.index(note) < text.index("sm90: 1 variant planned"), text
    for argv in (["warmup", spec], ["check", spec], ["engine", "run", "--config", "tiny", "--mode", "reference",
                                                      "--requests", "1", "--max-tokens", "1"]):
        rc, text = _merged(*argv, "--cache-dir", cache, *(["--target", "sm90"] if argv[0] != "engine" else []))
        assert rc == 0 and note not in text, (argv, text)
    rc, text = _merged("check", spec, "--target", "sm90", "--cache-dir", tmp_path / "another")
    assert text.count(note) == 1  # another folder: said again
    rc, text = _merged("check", tmp_path / "no-such.yaml", "--target", "sm90", "--cache-dir", tmp_path / "another")
    assert rc == 2 and note not in text  # never beside a one-line error


def test_an_installed_variant_lists_its_arguments_in_the_kernels_signature_order(warmed_bundle, tmp_path, capsys):
    import json

    from tritonwarm.launchers.rms_norm import rms_norm_jit

    _, cache, bundle = warmed_bundle
    assert main(["bundle", "install", str(bundle), "--cache-dir", str(tmp_path / "served")]) == 0
    capsys.readouterr()
    orders = []
    for folder in (cache, tmp_path / "served"):
        assert main(["list", "--cache-dir", str(folder), "--json"]) == 0
        [row] = json.loads(capsys.readouterr().out)
        orders.append(list(row["args"]))
    signature = list(rms_norm_jit.jit_function.arg_names)
    assert orders[0] == orders[1] == [name for name in signature if name in orders[0]], orders
    assert orders[0] != sorted(orders[0])


# ----------------------------------------------------------------------------- progress in logs


def test_progress_lines_in_a_log_say_how_many_are_done(warmed_bundle, capsys, monkeypatch):
    import re

    from tritonwarm.jit.pipeline import warmup

    spec, cache, _ = warmed_bundle
    monkeypatch.setenv("TRITONWARM_PROGRESS_SECONDS", "0.005")
    capsys.readouterr()
    line = re.compile(r"tritonwarm warmup: warming sm90: [01]/1 variants \(\d+ s\)")
    seen, real_warm = [], warmup.warm

    def warm_that_lasts(*args, **kwargs):  # a warm-up of one cached variant can end before the first line:
        result = real_warm(*args, **kwargs)  # this one lasts until a line came (or 30 s), as a long one does
        deadline = time.monotonic() + 30
        while not line.search("".join(seen)) and time.monotonic() < deadline:
            time.sleep(0.01)
            seen.append(capsys.readouterr().err)
        return result

    monkeypatch.setattr(warmup, "warm", warm_that_lasts)
    assert main(["warmup", str(spec), "--target", "sm90", "--cache-dir", str(cache), "-j", "1"]) == 0
    err = "".join(seen) + capsys.readouterr().err
    assert line.search(err), err
    assert main(["engine", "run", "--config", "tiny", "--mode", "reference", "--requests", "3", "--max-tokens", "2",
                 "--cache-dir", str(cache)]) == 0
    err = capsys.readouterr().err
    assert re.search(r"tritonwarm engine run: serving: [0-3]/3 requests done, step \d+, \d+ tokens", err), err


def test_tracing_an_engine_config_alone_reads_as_words(tmp_path, capsys, monkeypatch):
    import tritonwarm.cli.common as common

    phases = []
    monkeypatch.setattr("tritonwarm.jit.pipeline.progress.set_phase", phases.append)
    args = main.__globals__["_parser"]().parse_args(["check", "--engine-config", "tiny", "--target", "sm90",
                                                     "--cache-dir", str(tmp_path)])
    common.prepare(args)
    assert phases == ["tracing the engine config tiny for sm90"]
