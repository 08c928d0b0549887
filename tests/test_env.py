"""The serving environment as data: the fingerprint is read from Triton's own key material, manifests
record it, ``check`` judges the runtime's environment and names each difference, and ``prune`` removes
what other environments warmed."""

import hashlib
import json
import os

import pytest
from triton._C.libtriton import get_cache_invalidating_env_vars
from triton.compiler.compiler import make_backend
from triton.runtime import cache as triton_cache
from tritonwarm.cli import main
from tritonwarm.jit import TARGETS
from tritonwarm.jit.cache import Manifest
from tritonwarm.jit.cache import env as env_module
from tritonwarm.jit.pipeline.check import check
from tritonwarm.jit.pipeline.plan import plan
from tritonwarm.jit.pipeline.specs import load_specs
from tritonwarm.jit.pipeline.warmup import warm


@pytest.fixture
def specs(dtypes_spec_file):
    return load_specs([dtypes_spec_file])


def test_fingerprint_is_tritons_own_key_material(monkeypatch):
    fp = env_module.fingerprint()
    key = triton_cache.triton_key()
    assert fp["triton"]["key_sha256"] == hashlib.sha256(key.encode()).hexdigest()
    with open(env_module.libtriton_path(), "rb") as f:
        assert fp["triton"]["libtriton_sha256"] == hashlib.sha256(f.read()).hexdigest()
    # the hashed Python sources, walked as Triton walks them, rebuild Triton's key exactly
    sources = env_module.hashed_sources()
    first_language = next(i for i, (path, _) in enumerate(sources) if path.startswith("language/"))
    digests = [d for _, d in sources]
    rebuilt = fp["triton"]["version"] + "-".join(
        digests[:first_language] + [fp["triton"]["libtriton_sha256"]] + digests[first_language:])
    assert rebuilt == key and sources[0][0] == "runtime/cache.py"
    assert fp["backends"]["sm90"] == str(make_backend(TARGETS["sm90"].gpu_target).hash())
    assert fp["build"]["python_headers"] == os.path.exists(os.path.join(fp["build"]["python_include"], "Python.h"))

    # the names come from Triton's knobs, judged by Triton's own get_cache_invalidating_env_vars
    monkeypatch.delenv("TRITON_DEFAULT_FP_FUSION", raising=False)
    names = env_module.cache_env_names()
    assert {"TRITON_DEFAULT_FP_FUSION", "TRITON_DISABLE_LINE_INFO"} <= set(names)
    assert "TRITON_CACHE_DIR" not in names  # a knob, but not part of any key
    unset = env_module.fingerprint()
    assert "TRITON_DEFAULT_FP_FUSION" in unset["env_unset"] and "TRITON_DEFAULT_FP_FUSION" not in unset["env"]
    monkeypatch.setenv("TRITON_DEFAULT_FP_FUSION", "0")
    set_ = env_module.fingerprint()
    assert set_["env"] == get_cache_invalidating_env_vars() and "TRITON_DEFAULT_FP_FUSION" in set_["env"]
    assert "TRITON_DEFAULT_FP_FUSION" not in set_["env_unset"]
    assert env_module.fingerprint_id(set_) != env_module.fingerprint_id(unset)


def test_differences_name_each_part_with_both_values():
    runtime = env_module.fingerprint()
    other = json.loads(json.dumps(runtime))
    other["python"]["version"] = "3.12.3"
    other["triton"]["libtriton_sha256"] = "28daaa70" + "0" * 56
    other["triton"]["key_sha256"] = "1" * 64
    other["env"] = {**runtime["env"], "TRITON_DEFAULT_FP_FUSION": "false"}
    other["backends"] = {**runtime["backends"], "sm90": "ptxas: Cuda compilation tools, release 12.1, V12.1.105-90"}
    lines = env_module.differences(other, runtime, targets=["sm90"])
    py = ".".join(runtime["python"]["version"].split(".")[:2])
    assert any(line.startswith("warmed with Python 3.12's libtriton (28daaa70…), this runtime has "
                               f"Python {py}'s") and f"warm with Python {py} or use warmup --for" in line
               for line in lines), lines
    assert any(line.startswith("sm90: warmed with ptxas 12.1.105") for line in lines), lines
    fusion = runtime["env"].get("TRITON_DEFAULT_FP_FUSION")
    assert any(line.startswith(f"TRITON_DEFAULT_FP_FUSION: warmed with 'false', this runtime has "
                               f"{'it unset' if fusion is None else repr(fusion)}: every key") for line in lines)
    assert len(lines) == 3
    older = {**other, "triton": {**other["triton"], "version": "3.5.0"}}
    assert env_module.differences(older, runtime)[0].startswith(
        f"warmed with Triton 3.5.0, this runtime has Triton {runtime['triton']['version']}")
    patched = {**runtime, "triton": {**runtime["triton"], "sources_sha256": "4" * 64},
               "triton_sources": {**runtime["triton_sources"], "compiler/compiler.py": "5" * 64}}
    [line] = env_module.differences(patched, runtime)
    assert "Python sources differ from the ones warmed with (triton/compiler/compiler.py first;" in line
    assert env_module.differences(runtime, runtime) == []

    stamp = env_module.ptxas_build(runtime["backends"]["sm90"])
    if stamp:  # the same ptxas release built for another machine architecture: only the stamp differs
        arm = {**runtime, "platform": "linux-aarch64", "backends": {**runtime["backends"], "sm90": runtime[
            "backends"]["sm90"].replace(stamp["built"], "Tue_Jan_01_00:00:00_PST_2030")}}
        [line] = env_module.differences(runtime, arm, targets=["sm90"])
        assert line.startswith("sm90: warmed with ptxas "), line
        assert (f"built {stamp['built']} on {runtime['platform']}, this runtime has the same release built "
                "Tue_Jan_01_00:00:00_PST_2030 on linux-aarch64") in line, line
        assert line.endswith("warm with --for FILE, FILE written here by `tritonwarm env -o FILE`")


def test_env_command_prints_and_writes_the_fingerprint(tmp_path, capsys):
    out = tmp_path / "serving.json"
    assert main(["env", "-o", str(out)]) == 0
    written = json.loads(out.read_text())
    assert written["triton"] == env_module.fingerprint()["triton"]
    assert env_module.fingerprint_id(written) in capsys.readouterr().out
    assert main(["env", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["backends"].keys() == written["backends"].keys()
    assert main(["env"]) == 0
    text = capsys.readouterr().out
    assert "libtriton" in text and "sm90" in text and "Python headers" in text
    stamp = env_module.ptxas_build(written["backends"]["sm90"])
    assert stamp is None or f" built {stamp['built']}: " in text  # which build of ptxas: it enters the key
    from tritonwarm.jit.core.targets import local_target

    if local_target() is None:
        assert "GPU          none: warm for the serving GPU's target by name" in text


def test_env_names_the_target_of_this_machines_gpu(monkeypatch, capsys):
    import torch
    from tritonwarm.jit import TARGETS
    from tritonwarm.jit.core import targets

    monkeypatch.setattr(targets, "local_target", lambda: TARGETS["sm90"])
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *_: "NVIDIA H200")
    assert main(["env"]) == 0
    assert "GPU          NVIDIA H200: target sm90 (--target local warms it)" in capsys.readouterr().out


@pytest.mark.slow
def test_a_cache_warmed_under_two_environments_checks_ok_under_each(tmp_path, specs, monkeypatch):
    target, cache = TARGETS["sm90"], tmp_path / "cache"
    envs = {}
    for value in ("1", "0"):
        monkeypatch.setenv("TRITON_DEFAULT_FP_FUSION", value)
        envs[value] = plan(specs, target)
        assert warm(envs[value], cache).compiled == 2
    assert set(envs["1"].variants).isdisjoint(envs["0"].variants)
    manifest = Manifest(cache, "sm90")
    assert len(manifest.read()) == 4 and len(manifest.environments()) == 2
    for entry in manifest.read().values():
        assert manifest.environments()[entry["environment"]]["env"]["TRITON_DEFAULT_FP_FUSION"] in ("false", "true")

    for value in ("1", "0"):
        monkeypatch.setenv("TRITON_DEFAULT_FP_FUSION", value)
        report = check(plan(specs, target), cache)
        assert report.ok and not report.missing, report.to_json()
        [other] = report.other_environments
        assert other["entries"] == 2 and "TRITON_DEFAULT_FP_FUSION" in other["differences"][0]
        assert not report.reasons  # nothing is missing: nothing to explain

    monkeypatch.delenv("TRITON_DEFAULT_FP_FUSION")
    report = check(plan(specs, target), cache)
    assert not report.ok and len(report.missing) == 2
    assert sorted(report.reasons) == [
        "TRITON_DEFAULT_FP_FUSION: warmed with 'false', this runtime has it unset: every key differs: "
        "set it identically when warming and serving",
        "TRITON_DEFAULT_FP_FUSION: warmed with 'true', this runtime has it unset: every key differs: "
        "set it identically when warming and serving",
    ]


@pytest.mark.slow
def test_check_names_the_difference_on_the_command_line(tmp_path, dtypes_spec_file, monkeypatch, capsys):
    spec = dtypes_spec_file
    cache = tmp_path / "cache"
    monkeypatch.setenv("TRITON_DEFAULT_FP_FUSION", "0")
    assert main(["warmup", str(spec), "--target", "sm90", "--cache-dir", str(cache), "--jobs", "1"]) == 0
    monkeypatch.setenv("TRITON_DEFAULT_FP_FUSION", "1")
    monkeypatch.setenv("TRITON_CACHE_DIR", str(cache))  # Triton here reads the folder checked: no note
    capsys.readouterr()
    assert main(["check", str(spec), "--target", "sm90", "--cache-dir", str(cache)]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"cache: {cache}"  # the folder it checked comes first
    assert out[1].startswith("sm90: PROBLEMS: 2 variants planned from ") and ", 2 missing" in out[1]
    assert out[2] == ("  why: TRITON_DEFAULT_FP_FUSION: warmed with 'false', this runtime has 'true': every key "
                      "differs: set it identically when warming and serving")


@pytest.mark.slow
def test_prune_other_environments_keeps_the_runtimes(tmp_path, specs, monkeypatch, capsys):
    target, cache = TARGETS["sm90"], tmp_path / "cache"
    kept = {}
    for value in ("0", "1"):
        monkeypatch.setenv("TRITON_DEFAULT_FP_FUSION", value)
        kept[value] = plan(specs, target)
        warm(kept[value], cache)
    capsys.readouterr()
    # a plan judges its own environment's entries only: what was warmed for the other one stays
    assert main(["prune", str(tmp_path / "rms.yaml"), "--unplanned", "--cache-dir", str(cache), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["removed"] == []
    assert main(["prune", "--other-environments", "--cache-dir", str(cache), "--json"]) == 0  # runtime: "1"
    removed = json.loads(capsys.readouterr().out)["removed"]
    assert sorted(r["cache_hash"] for r in removed) == sorted(kept["0"].variants)
    assert all(r["why"].startswith("warmed under another environment (TRITON_DEFAULT_FP_FUSION: warmed with 'false'")
               for r in removed)
    assert not any((cache / r["entry_dir"]).exists() for r in removed)
    manifest = Manifest(cache, "sm90")
    assert sorted(manifest.read()) == sorted(kept["1"].variants) and len(manifest.environments()) == 1
    assert check(plan(specs, target), cache).ok
    monkeypatch.setenv("TRITON_DEFAULT_FP_FUSION", "0")  # the old name still works, from the other side
    assert main(["prune", "--other-versions", "--cache-dir", str(cache), "--json"]) == 0
    assert len(json.loads(capsys.readouterr().out)["removed"]) == 2 and not manifest.read()


@pytest.mark.slow
def test_a_manifest_without_environments_stays_readable(tmp_path, specs):
    target, cache = TARGETS["sm90"], tmp_path / "cache"
    the_plan = plan(specs, target)
    warm(the_plan, cache)
    manifest = Manifest(cache, "sm90")
    data = json.loads(manifest.path.read_text())
    for entry in data["variants"].values():  # as written before environments were recorded
        del entry["environment"]
    del data["environments"]
    manifest.path.write_text(json.dumps(data))
    assert manifest.environments() == {}
    report = check(plan(specs, target), cache)
    assert report.ok and not report.other_environments
    again = warm(plan(specs, target), cache)
    assert (again.compiled, again.cached) == (0, 2)
    # an update merges under the lock: old records keep theirs, a new environment joins the table
    fp = env_module.fingerprint()
    key = next(iter(the_plan.variants))
    manifest.update({key: {**manifest.read()[key], "environment": env_module.fingerprint_id(fp)}},
                    environments={env_module.fingerprint_id(fp): fp})
    assert list(manifest.environments()) == [env_module.fingerprint_id(fp)] and len(manifest.read()) == 2
