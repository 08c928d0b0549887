"""A library imported under a target stays imported for that target.

Whoever imported it (the spec's launcher module, another spec row, a module of a recorded program's
import root), a later lookup of its kernels for the same target reuses it and never runs it again:
vLLM registers an opaque type and custom ops at import and refuses a second import in one process
(``host_code_libs/registers_at_import`` does the same). Such a library warms every row, with one
process or a pool, and reading a stored plan imports nothing.
"""

import json
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from tritonwarm.cli import main

LIBS = Path(__file__).parent / "host_code_libs"


@pytest.fixture
def registering_library(tmp_path, monkeypatch):
    """A fresh copy of ``registers_at_import`` as a package of its own, and a glue module of another
    package that calls it and has a kernel of its own (as a user's glue calls vLLM's fused MoE)."""
    root = tmp_path / "libs"
    root.mkdir()
    name = f"registers_{uuid.uuid4().hex[:10]}"
    shutil.copytree(LIBS / "registers_at_import", root / name)
    (root / f"glue_{name}.py").write_text(f'''
import triton
import triton.language as tl

from {name}.ops import scale


@triton.jit
def shift_kernel(x_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) + 1, mask=offs < n)


def run(x):
    return scale(x)
''')
    monkeypatch.syspath_prepend(str(root))
    yield name
    for module in [m for m in sys.modules if name in m]:
        del sys.modules[module]


def _specs(tmp_path, name: str) -> list[str]:
    """A spec whose launcher is the glue module, and another whose rows call the library directly."""
    glue, direct = tmp_path / "glue.yaml", tmp_path / "direct.yaml"
    glue.write_text(f"""
launcher: glue_{name}:run
capture: all
axes:
  n: [1000, 4096]
args:
  x: {{tensor: [$n], dtype: float32}}
""")
    direct.write_text(f"""
launcher: {name}.ops:scale
capture: all
axes:
  n: [1000, 4096]
args:
  x: {{tensor: [$n], dtype: float16}}
""")
    return [str(glue), str(direct)]


def _warm_and_check(capsys, files: list[str], cache, jobs: str) -> dict:
    rc = main(["warmup", *files, "--target", "sm90", "--cache-dir", str(cache), "--jobs", jobs, "--json"])
    warmed = json.loads(capsys.readouterr().out)
    assert rc == 0, warmed["problems"]
    assert warmed["failed"] == 0 and warmed["compiled"] == warmed["planned"] > 0
    rc = main(["check", *files, "--target", "sm90", "--cache-dir", str(cache), "--json"])
    checked = json.loads(capsys.readouterr().out)
    assert rc == 0 and checked["targets"][0]["ok"], checked
    return warmed


@pytest.mark.parametrize("jobs", ["1", "2"])
def test_a_library_that_registers_at_import_warms_every_row_of_every_spec(tmp_path, registering_library, capsys,
                                                                          jobs):
    warmed = _warm_and_check(capsys, _specs(tmp_path, registering_library), tmp_path / "cache", jobs)
    assert warmed["planned"] == 4  # two classes of n, two dtypes


@pytest.mark.parametrize("jobs", ["1", "2"])
def test_a_recorded_program_whose_import_root_imports_the_library_warms_every_launch(tmp_path, registering_library,
                                                                                     capsys, jobs):
    """Rows of a recorded plan: the program's own module (from its import root) imports the library; the
    library's kernel, named on rows of its own, is the one that import defined."""
    name = registering_library
    pointer = {"ptr": "fp32", "aligned": True}
    launches = [(f"glue_{name}:shift_kernel", [pointer, {"int": "i32", "div16": div16}], {"BLOCK": 128})
                for div16 in (True, False)]
    launches += [(f"{name}.ops:scale_kernel", [pointer, pointer, {"int": "i32", "div16": div16}], {"BLOCK": 256})
                 for div16 in (True, False)]
    plan = tmp_path / "prog.plan.yaml"
    plan.write_text(json.dumps({
        "launcher": "tritonwarm.jit.adopt.record:replay", "capture": "all", "import_roots": ["libs"],
        "groups": {"launch": {"kernel": [k for k, _, _ in launches],
                              "call": [{"args": args, "constexprs": constexprs, "options": {"num_warps": 4},
                                        "backend": "cuda"} for _, args, constexprs in launches]}},
        "args": {"kernel": "$kernel", "call": "$call"}}))
    warmed = _warm_and_check(capsys, [str(plan)], tmp_path / "cache", jobs)
    assert warmed["planned"] == 4


def test_reading_a_stored_plan_imports_nothing(tmp_path, registering_library, capsys):
    """A second warm-up reads the plans the first stored: data, no module of the library imported."""
    files = _specs(tmp_path, registering_library)
    _warm_and_check(capsys, files, tmp_path / "cache", "1")
    program = f"""
import sys
from tritonwarm.jit import TARGETS
from tritonwarm.jit.pipeline.plan import plan
from tritonwarm.jit.pipeline.specs import load_specs

the_plan = plan(load_specs({files!r}), TARGETS["sm90"], cache_dir={str(tmp_path / "cache")!r})
print(len(the_plan.variants), sorted(m for m in sys.modules if {registering_library!r} in m))
"""
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=300,
                          env={**__import__("os").environ, "PYTHONPATH": str(tmp_path / "libs")})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "4 []"


def test_a_second_target_in_one_process_says_why_the_library_cannot_be_imported_again(tmp_path, registering_library,
                                                                                      capsys):
    """Each target needs the library imported under its own answers; one that refuses a second import
    cannot have that twice in a process. The first target warms every row; each row of the second
    names the module, the target, the library's line and what to do."""
    files = _specs(tmp_path, registering_library)
    rc = main(["warmup", *files, "--target", "sm90,gfx942", "--cache-dir", str(tmp_path / "cache"), "--jobs", "1",
               "--json"])
    warmed = json.loads(capsys.readouterr().out)
    assert rc == 1
    sm90, gfx942 = warmed["targets"]
    assert sm90["compiled"] == sm90["planned"] == 4 and sm90["failed"] == 0 and gfx942["planned"] == 0
    assert len(warmed["problems"]) == 2  # one per cause: each spec's two rows fail alike
    assert all(problem.startswith("2 rows (") for problem in warmed["problems"]), warmed["problems"]
    for problem in warmed["problems"]:
        assert f"importing glue_{registering_library} under gfx942's answers failed at " in problem \
            or f"importing {registering_library}.ops under gfx942's answers failed at " in problem
        assert "is already registered as an opaque type" in problem
        assert "imported for sm90 earlier in this process" in problem and "run one warm-up per target" in problem
