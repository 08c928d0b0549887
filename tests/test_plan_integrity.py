"""What a warm-up may trust: stored plans only while every traced kernel's source is unchanged and the
file is as written; `prune --unplanned` only what no recorded plan (specs and engine configs) needs;
files readable by whoever the umask lets read them."""

import json
import os
import stat
import subprocess
import sys

import pytest
from tritonwarm.jit import TARGETS
from tritonwarm.jit.cache import Manifest, PlanStore
from tritonwarm.jit.pipeline.plan import plan
from tritonwarm.jit.pipeline.specs import load_specs
from tritonwarm.jit.pipeline.warmup import warm


def tritonwarm(*args, rc=0, env=None):
    proc = subprocess.run([sys.executable, "-m", "tritonwarm", *map(str, args)], capture_output=True, text=True,
                          timeout=600, env=env)
    assert proc.returncode == rc, proc.stdout + proc.stderr
    return proc


@pytest.mark.slow
def test_editing_a_kernel_in_another_module_recompiles_it(custom_kernel, tmp_path):
    code, spec, env = custom_kernel
    cache = tmp_path / "cache"
    first = json.loads(tritonwarm("warmup", spec, "--target", "sm90", "--cache-dir", cache, "--json", env=env).stdout)
    again = json.loads(tritonwarm("warmup", spec, "--target", "sm90", "--cache-dir", cache, "--json", env=env).stdout)
    assert (first["compiled"], again["compiled"], again["cached"]) == (1, 0, 1)

    kernels = code / "edited_kernels.py"
    kernels.write_text(kernels.read_text().replace("x + 1.0", "x + 2.0"))
    edited = json.loads(tritonwarm("warmup", spec, "--target", "sm90", "--cache-dir", cache, "--json", env=env).stdout)
    assert edited["compiled"] == 1, edited
    tritonwarm("check", spec, "--target", "sm90", "--cache-dir", cache, env=env)


TILES_PACKAGE = {
    "__init__.py": "",
    "kernels.py": """
import triton
import triton.language as tl


@triton.jit
def scale(x_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) * 2.0, mask=offs < n)
""",
    "warps.py": "def warps_for(block):\n    return 4\n",
    "launch.py": """
import json
import os
from pathlib import Path

import triton
from tritonwarm.jit import JitKernel, Launch

from .kernels import scale
from .warps import warps_for


def _launch(x):
    table = json.loads(Path(__file__).with_name("tiles.json").read_text())
    block = int(os.environ.get("TILES_BLOCK") or table["BLOCK"])
    return Launch(grid=(triton.cdiv(x.numel(), block),), args=(x, x.numel()), constexprs=dict(BLOCK=block),
                  num_warps=warps_for(block))


scale_jit = JitKernel(scale, _launch)


def launcher(x):
    return scale_jit(x)
""",
    "tiles.json": '{"BLOCK": 256}',
}


@pytest.mark.slow
def test_editing_a_tile_table_a_helper_or_a_variable_the_launcher_reads_traces_it_again(tmp_path):
    """A stored plan is read back only while the launcher's package (code and JSON data) and the
    environment variables it read are unchanged: a tuned tile table dropped in must be warmed, not
    answered from the plan of the old one."""
    package = tmp_path / "code" / "tiles_pkg"
    package.mkdir(parents=True)
    for name, text in TILES_PACKAGE.items():
        (package / name).write_text(text)
    spec = tmp_path / "tiles.yaml"
    spec.write_text("kernel: tiles_pkg.launch:launcher\nargs:\n  x: {tensor: [4096], dtype: float32}\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(tmp_path / "code"),
                                                                     os.environ.get("PYTHONPATH")]))}
    cache = tmp_path / "cache"

    def warmup():
        out = tritonwarm("warmup", spec, "--target", "sm90", "--cache-dir", cache, "--json", env=env).stdout
        return json.loads(out)["compiled"]

    assert (warmup(), warmup()) == (1, 0)
    (package / "tiles.json").write_text('{"BLOCK": 512}')
    assert warmup() == 1
    (package / "warps.py").write_text("def warps_for(block):\n    return 8\n")
    assert warmup() == 1
    env["TILES_BLOCK"] = "1024"
    assert (warmup(), warmup()) == (1, 0)
    del env["TILES_BLOCK"]
    assert warmup() == 0  # the plan of the table's block, stored before, is good again
    tritonwarm("check", spec, "--target", "sm90", "--cache-dir", cache, env=env)


def test_the_shipped_tile_tables_are_part_of_the_code_a_plan_is_keyed_by():
    import importlib
    from pathlib import Path

    from tritonwarm.jit.cache.plans import traced_files

    fused_moe = importlib.import_module("tritonwarm.launchers.fused_moe")
    _attention_tiles = importlib.import_module("tritonwarm.launchers._attention_tiles")
    root = Path(fused_moe.__file__).resolve().parents[1]
    tables = [_attention_tiles.TILES_FILE.resolve(), *sorted(fused_moe.CONFIG_DIR.resolve().glob("*.json"))]
    assert len(tables) >= 3 and set(tables) <= set(traced_files(root))
    assert not any(part in ("tests", "bench") for path in traced_files(root) for part in path.relative_to(root).parts)


def test_a_stored_plan_altered_by_hand_is_traced_again(tmp_path, dtypes_spec_file):
    spec_file = dtypes_spec_file
    specs, target, cache = load_specs([spec_file]), TARGETS["sm90"], tmp_path / "cache"
    traced = plan(specs, target, cache_dir=cache)
    [stored] = (cache / "tritonwarm" / "plans").glob("*.json")
    data = json.loads(stored.read_text())
    data["plan"]["variants"] = data["plan"]["variants"][:1]  # still valid JSON, and wrong
    stored.write_text(json.dumps(data))

    again = plan(specs, target, cache_dir=cache)
    assert set(again.variants) == set(traced.variants) and len(traced.variants) == 2


def test_a_stored_plan_is_traced_again_when_a_kernel_source_key_changed(tmp_path, dtypes_spec_file, monkeypatch):
    from tritonwarm.jit.pipeline import plan as planning

    spec_file = dtypes_spec_file
    specs, target, cache = load_specs([spec_file]), TARGETS["sm90"], tmp_path / "cache"
    plan(specs, target, cache_dir=cache)
    [stored] = (cache / "tritonwarm" / "plans").glob("*.json")
    [(kernel, source_key)] = json.loads(stored.read_text())["kernels"].items()
    from tritonwarm.jit.core.kernel import JitKernel

    assert source_key == JitKernel.lookup(kernel).jit_function.cache_key

    traced = []
    original = planning._plan_spec
    monkeypatch.setattr(planning, "_plan_spec", lambda *a: traced.append(1) or original(*a))
    plan(specs, target, cache_dir=cache)
    assert traced == []  # unchanged: read back
    monkeypatch.setattr(planning, "_source_key", lambda name, target=None: "edited")
    plan(specs, target, cache_dir=cache)
    assert traced == [1]


@pytest.mark.slow
def test_prune_unplanned_keeps_what_an_engine_config_warmed(custom_kernel, tmp_path):
    _, spec, env = custom_kernel
    cache = tmp_path / "cache"
    tritonwarm("warmup", "--engine-config", "tiny", "--target", "sm90", "--cache-dir", cache, env=env)
    tritonwarm("warmup", spec, "--target", "sm90", "--cache-dir", cache, env=env)
    before = set(Manifest(cache, "sm90").read())

    kept = json.loads(tritonwarm("prune", "--unplanned", "--cache-dir", cache, "--json", env=env).stdout)
    assert kept["removed"] == [] and set(Manifest(cache, "sm90").read()) == before
    tritonwarm("check", "--engine-config", "tiny", "--target", "sm90", "--cache-dir", cache, env=env)

    spec.unlink()  # nothing plans the custom kernel any more: its variant goes, the engine's stay
    gone = json.loads(tritonwarm("prune", "--unplanned", "--cache-dir", cache, "--json", env=env).stdout)
    assert [d["kernel"].rsplit(".", 1)[-1] for d in gone["removed"]] == ["add_const"]
    tritonwarm("check", "--engine-config", "tiny", "--target", "sm90", "--cache-dir", cache, env=env)


@pytest.mark.slow
def test_manifest_and_plans_follow_the_umask(tmp_path, dtypes_spec_file):
    spec_file = dtypes_spec_file
    spec_file.write_text(spec_file.read_text().replace("[float16, bfloat16]", "[float16]"))
    cache = tmp_path / "cache"
    previous = os.umask(0o022)
    try:
        warm(plan(load_specs([spec_file]), TARGETS["sm90"], cache_dir=cache), cache)
    finally:
        os.umask(previous)
    files = [Manifest(cache, "sm90").path, *PlanStore(cache).dir.glob("*.json")]
    assert len(files) == 2
    for path in files:
        assert stat.S_IMODE(path.stat().st_mode) == 0o644, path


@pytest.mark.slow
def test_prune_unplanned_keeps_what_a_bundle_installed(custom_kernel, tmp_path, monkeypatch):
    from tritonwarm.jit.cache import bundle

    code, spec, env = custom_kernel
    monkeypatch.syspath_prepend(str(code))
    built = tmp_path / "built"
    the_plan = plan(load_specs([spec]), TARGETS["sm90"])
    warm(the_plan, built)
    archive = tmp_path / "cache.tar.gz"
    bundle.create(archive, built, {"sm90": the_plan.variants.values()})
    served = tmp_path / "served"
    bundle.install(archive, served, compare_environment=False)

    kept = json.loads(tritonwarm("prune", "--unplanned", "--cache-dir", served, "--json", env=env).stdout)
    assert kept["removed"] == [] and set(Manifest(served, "sm90").read()) == set(the_plan.variants)


def test_environment_reads_are_recorded_per_block_and_the_environment_is_restored(monkeypatch):
    from tritonwarm.jit.pipeline.plan import environment_reads

    monkeypatch.setenv("TW_TEST_SET", "1")
    before = type(os.environ).__getitem__
    with environment_reads() as outer:
        with environment_reads() as inner:
            os.environ.get("TW_TEST_UNSET")
        assert os.getenv("TW_TEST_SET") == "1" and "TW_TEST_OTHER" not in os.environ
    os.environ.get("TW_TEST_AFTER")
    assert inner == {"TW_TEST_UNSET": None}
    assert outer == {"TW_TEST_UNSET": None, "TW_TEST_SET": "1", "TW_TEST_OTHER": None}
    assert type(os.environ).__getitem__ is before
