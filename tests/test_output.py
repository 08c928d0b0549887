"""What a person reads: one line per cause with its count and at most three examples, lines as wide as
the terminal, sizes in MiB, numbers with units, notes said once and before the result, progress with
done/total, and row failures counted as failures."""

import textwrap

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
    from tritonwarm.jit.plan import plan
    from tritonwarm.jit.specs import load_specs

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
