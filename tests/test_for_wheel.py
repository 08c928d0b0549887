"""Warming for another environment: compile with this Triton, key as a runtime with another libtriton
(another Python's wheel of the same release) will, and prove it with Triton's own runtime path: a
process whose ``triton_key()`` is the serving one finds every entry and compiles nothing."""

import hashlib
import json
import os
import platform
import sysconfig
import zipfile
from pathlib import Path

import pytest
import triton
from triton.runtime import cache as triton_cache
from tritonwarm.cli import main
from tritonwarm.jit import TARGETS
from tritonwarm.jit.cache import Manifest
from tritonwarm.jit.cache.env import fingerprint, fingerprint_id, libtriton_path, ptxas_build
from tritonwarm.jit.cache.serving import fingerprint_from_wheel, load_fingerprint, serving_environment
from tritonwarm.jit.pipeline.check import check
from tritonwarm.jit.pipeline.plan import plan
from tritonwarm.jit.pipeline.specs import load_specs
from tritonwarm.jit.pipeline.warmup import warm
from tritonwarm.jit.serving.c_launchers import builds_c_modules

SERVING_LIBTRITON = b"\x7fELF libtriton of another Python's wheel"
SERVING_EXT_SUFFIX = ".cpython-312-x86_64-linux-gnu.so"  # the serving Python of these fixtures: 3.12


def c_modules_left_missing() -> bool:
    """Triton 3.6 and 3.7 build C modules for the serving Python: a build machine on another Python
    lacks its headers and leaves them missing; on the serving Python itself the warm-up builds them."""
    return builds_c_modules("cuda") and sysconfig.get_config_var("EXT_SUFFIX") != SERVING_EXT_SUFFIX


@pytest.fixture(scope="module")
def serving_key():
    """What a Triton with SERVING_LIBTRITON computes: this key, libtriton's digest replaced."""
    with open(libtriton_path(), "rb") as f:
        local = hashlib.sha256(f.read()).hexdigest()
    key = triton_cache.triton_key()
    assert key.count(local) == 1
    return key.replace(local, hashlib.sha256(SERVING_LIBTRITON).hexdigest())


def make_wheel(path: Path, *, version: str | None = None, replace: dict[str, bytes] | None = None,
               tag: str = "cp312-cp312-manylinux_2_27_x86_64") -> Path:
    """A Triton wheel for Python 3.12: this Triton's Python files and another libtriton."""
    root = Path(triton.__file__).resolve().parent
    replace = replace or {}
    with zipfile.ZipFile(path, "w") as wheel:
        for file in sorted(root.rglob("*.py")):
            member = f"triton/{file.relative_to(root).as_posix()}"
            wheel.writestr(member, replace.get(member, file.read_bytes()))
        wheel.writestr("triton/_C/libtriton.so", SERVING_LIBTRITON)
        info = f"triton-{version or triton.__version__}.dist-info"
        wheel.writestr(f"{info}/METADATA", f"Name: triton\nVersion: {version or triton.__version__}\n")
        wheel.writestr(f"{info}/WHEEL", f"Wheel-Version: 1.0\nTag: {tag}\n")
    return path


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    return make_wheel(tmp_path_factory.mktemp("wheel") / "triton-cp312.whl")


@pytest.fixture
def env_json(tmp_path, serving_key):
    """A fingerprint as `tritonwarm env -o` writes it on the serving image: Python 3.12, FP fusion off."""
    fp = fingerprint()
    fp["python"] = {**fp["python"], "version": "3.12.3", "ext_suffix": ".cpython-312-x86_64-linux-gnu.so"}
    fp["triton"] = {**fp["triton"], "libtriton_sha256": hashlib.sha256(SERVING_LIBTRITON).hexdigest(),
                    "key_sha256": hashlib.sha256(serving_key.encode()).hexdigest()}
    fp["env"] = {"TRITON_DEFAULT_FP_FUSION": "false"}
    path = tmp_path / "serving.json"
    path.write_text(json.dumps(fp))
    return path


@pytest.mark.slow
def test_warm_for_env_json_is_what_that_runtime_reads(tmp_path, spec_file, env_json, serving_key, compile_counter,
                                                     rms_norm_runtime, monkeypatch):
    target, cache = TARGETS["sm90"], tmp_path / "cache"
    specs = load_specs([spec_file])
    local_plan = plan(specs, target, cache_dir=cache)  # stored: the serving plan must not reuse it
    fp = load_fingerprint(env_json)
    with serving_environment(fp, targets=["sm90"], source=str(env_json)):
        assert triton_cache.triton_key() == serving_key
        served_plan = plan(specs, target, cache_dir=cache)  # through the plan store too
        result = warm(served_plan, cache, jobs=2)  # forked workers compile under the serving key
    assert (result.compiled, result.failed) == (2, 0), result.failures
    assert len(served_plan.variants) == 2 and set(served_plan.variants).isdisjoint(local_plan.variants)
    assert triton_cache.triton_key() != serving_key  # put back

    manifest = Manifest(cache, "sm90")
    [(env_id, recorded)] = manifest.environments().items()
    assert env_id == fingerprint_id(fp) and recorded["warmed_for"]["source"] == str(env_json)
    assert recorded["python"]["version"] == "3.12.3"
    assert {e["environment"] for e in manifest.read().values()} == {env_id}
    assert set(manifest.read()) == set(served_plan.variants)

    # this process, as it is, would miss everything, and check says why
    report = check(plan(specs, target), cache)
    assert len(report.missing) == 2
    assert any(r.startswith("warmed with Python 3.12's libtriton") for r in report.reasons), report.reasons
    assert any(r.startswith("TRITON_DEFAULT_FP_FUSION: warmed with 'false', this runtime has") for r in report.reasons)

    # the serving runtime: Triton's own triton_key() is the serving one, its env the serving env
    monkeypatch.setattr(triton_cache, "triton_key", lambda: serving_key)
    monkeypatch.setenv("TRITON_DEFAULT_FP_FUSION", "0")
    served = check(plan(specs, target), cache)
    assert not (served.missing or served.corrupt or served.other_environments), served
    # Triton's C modules (3.6, 3.7) are built for the serving Python, whose headers a cross-warm lacks:
    # check lists them apart, and that is all it finds
    assert bool(served.missing_c_launchers) == c_modules_left_missing()
    assert served.ok == (not served.missing_c_launchers)
    before = compile_counter.count
    for rows in (1, 37, 4096):
        for fused in (False, True):
            assert rms_norm_runtime(target, cache, rows, fused).hash in served_plan.variants
    assert compile_counter.count == before  # every launch found its entry: nothing compiled
    # the keys are Triton's own: what that runtime compiles into an empty cache is named as planned
    for fused in (False, True):
        assert rms_norm_runtime(target, tmp_path / "empty", 5, fused).hash in served_plan.variants
    assert compile_counter.count == before + 2


@pytest.mark.slow
def test_warmup_for_wheel_from_the_command_line(tmp_path, spec_file, wheel, serving_key, compile_counter,
                                                rms_norm_runtime, monkeypatch, capsys):
    fp = fingerprint_from_wheel(wheel)
    assert fp["triton"]["key_sha256"] == hashlib.sha256(serving_key.encode()).hexdigest()
    assert fp["python"]["version"] == "3.12" and fp["wheel"]["tags"] == ["cp312-cp312-manylinux_2_27_x86_64"]
    cache = tmp_path / "cache"
    local_plan = plan(load_specs([spec_file]), TARGETS["sm90"], cache_dir=cache)  # in the plan store now
    assert main(["warmup", str(spec_file), "--target", "sm90", "--cache-dir", str(cache), "--for-wheel", str(wheel),
                 "--jobs", "1"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"keying for {wheel.name}: Python 3.12's libtriton") and "2 compiled" in out
    assert set(Manifest(cache, "sm90").read()).isdisjoint(local_plan.variants)  # not the stored local plan
    [recorded] = Manifest(cache, "sm90").environments().values()
    assert recorded["warmed_for"]["source"] == wheel.name

    # on a Triton that builds C modules (3.6, 3.7) check lists the ones only the serving Python can build
    assert main(["check", str(spec_file), "--target", "sm90", "--cache-dir", str(cache), "--for-wheel",
                 str(wheel)]) == (1 if c_modules_left_missing() else 0)
    assert " 0 missing" in capsys.readouterr().out
    monkeypatch.setattr(triton_cache, "triton_key", lambda: serving_key)
    before = compile_counter.count
    for fused in (False, True):
        rms_norm_runtime(TARGETS["sm90"], cache, 100, fused)
    assert compile_counter.count == before


def _refused(capsys, *argv) -> str:
    assert main(list(argv)) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and err.startswith("tritonwarm: error: ")
    return err


def test_refusals_are_one_line_and_compile_nothing(tmp_path, spec_file, env_json, compile_counter, capsys):
    cache = tmp_path / "cache"
    warm_args = ["warmup", str(spec_file), "--target", "sm90", "--cache-dir", str(cache)]

    other_version = make_wheel(tmp_path / "old.whl", version="3.0.0")
    assert f"Triton 3.0.0, this Triton is {triton.__version__}" in _refused(
        capsys, *warm_args, "--for-wheel", str(other_version))

    patched = make_wheel(tmp_path / "patched.whl",
                         replace={"triton/compiler/compiler.py": b"# a patched build\n"})
    assert "triton/compiler/compiler.py differs from this Triton's" in _refused(
        capsys, *warm_args, "--for-wheel", str(patched))

    other_machine = "s390x" if platform.machine() == "aarch64" else "aarch64"
    arm = make_wheel(tmp_path / "arm.whl", tag=f"cp312-cp312-manylinux_2_28_{other_machine}")
    assert f"arm.whl: a wheel for {other_machine} (tag cp312-cp312-manylinux_2_28_{other_machine}), this machine " \
           f"is {platform.machine()}: its ptxas, whose --version every CUDA key hashes, is another build" in _refused(
               capsys, *warm_args, "--for-wheel", str(arm))

    corrupt = tmp_path / "corrupt.whl"
    corrupt.write_bytes(b"PK\x03\x04 not really a zip")
    assert "corrupt.whl: not a readable wheel" in _refused(capsys, *warm_args, "--for-wheel", str(corrupt))

    bad_json = tmp_path / "bad.json"
    bad_json.write_text("{not json")
    assert "bad.json: not JSON" in _refused(capsys, *warm_args, "--for", str(bad_json))

    fp = json.loads(env_json.read_text())
    for field, edit, message in [
        ("key_sha256", "abc", "field triton.key_sha256: 'abc' is not a sha256 hex digest"),
        ("key_sha256", "0" * 64, "triton.key_sha256 is not the key of this Triton"),
        ("version", "3.0.0", f"Triton 3.0.0, this Triton is {triton.__version__}"),
        ("sources_sha256", "1" * 64, "hashed Python sources differ"),
    ]:
        edited = tmp_path / f"{field}.json"
        edited.write_text(json.dumps({**fp, "triton": {**fp["triton"], field: edit}}))
        assert message in _refused(capsys, *warm_args, "--for", str(edited))
    edited = tmp_path / "patched.json"
    sources = {**fp["triton_sources"], "language/core.py": "2" * 64}
    edited.write_text(json.dumps({**fp, "triton": {**fp["triton"], "sources_sha256": "3" * 64},
                                  "triton_sources": sources}))
    assert "differ from this Triton's (triton/language/core.py first;" in _refused(
        capsys, *warm_args, "--for", str(edited))
    no_env = tmp_path / "env.json"
    no_env.write_text(json.dumps({**fp, "env": ["TRITON_DEFAULT_FP_FUSION"]}))
    assert "field env: not an object of strings" in _refused(capsys, *warm_args, "--for", str(no_env))
    no_python = tmp_path / "python.json"
    no_python.write_text(json.dumps({k: v for k, v in fp.items() if k != "python"}))
    assert "field python: missing or not an object" in _refused(capsys, *warm_args, "--for", str(no_python))
    no_suffix = tmp_path / "suffix.json"
    no_suffix.write_text(json.dumps({**fp, "python": {"version": "3.12.3"}}))
    assert "field python.ext_suffix: missing" in _refused(capsys, *warm_args, "--for", str(no_suffix))
    other_ptxas = tmp_path / "ptxas.json"
    other_ptxas.write_text(json.dumps({**fp, "backends": {**fp["backends"], "sm90": "ptxas release 11.8, V11.8.89"}}))
    assert "sm90's compiler backend is ptxas 11.8.89" in _refused(capsys, *warm_args, "--for", str(other_ptxas))

    assert compile_counter.count == 0 and not (cache / "tritonwarm" / "manifest-sm90.json").exists()
    assert triton_cache.triton_key.__name__ == "triton_key"  # never left installed


def _aarch64_server(fp: dict, target: str) -> tuple[dict, str]:
    """``fp`` as `tritonwarm env -o` writes it on an aarch64 server (a GH200) with this very Triton
    release: its wheel bundles the same ptxas release built for aarch64, whose --version differs in
    its "Built on" stamp only. Returns the fingerprint and that ptxas's --version text."""
    local = fp["backends"][target]
    built = ptxas_build(local)["built"]
    text = local.rsplit("-", 1)[0].replace(f"Built on {built}", "Built on Tue_Jan_01_00:00:00_PST_2030")
    return {**fp, "platform": "linux-aarch64", "backends": {**fp["backends"], target: f"{text}-90"},
            "python": {**fp["python"], "ext_suffix": fp["python"]["ext_suffix"].replace("x86_64", "aarch64")}}, text


@pytest.mark.slow
def test_warm_for_an_aarch64_server_keys_with_its_ptxas(tmp_path, spec_file, compile_counter, rms_norm_runtime,
                                                        monkeypatch, capsys):
    """An x86_64 build machine warms for an aarch64 server: the same binaries (this ptxas compiles; the
    two builds of one release give identical cubins), keyed with the server's ptxas --version text."""
    fp, text = _aarch64_server(fingerprint(), "sm90")
    if fp["backends"]["sm90"] == fingerprint()["backends"]["sm90"]:
        pytest.skip("this ptxas prints no build stamp")
    serving = tmp_path / "gh200.json"
    serving.write_text(json.dumps(fp))
    target, cache, local_cache = TARGETS["sm90"], tmp_path / "cache", tmp_path / "local"
    assert main(["warmup", str(spec_file), "--target", "sm90", "--cache-dir", str(cache), "--for", str(serving),
                 "--jobs", "2"]) == 0  # forked workers key as the server too
    out = capsys.readouterr().out  # C launchers (3.6, 3.7) are machine code for the server: built there
    assert ("the serving platform is linux-aarch64" in out) == builds_c_modules("cuda"), out
    assert main(["warmup", str(spec_file), "--target", "sm90", "--cache-dir", str(local_cache)]) == 0
    capsys.readouterr()
    cubins = {p.read_bytes() for p in cache.glob("*/*.cubin")}
    assert len(cubins) == 2 and cubins == {p.read_bytes() for p in local_cache.glob("*/*.cubin")}
    assert not set(os.listdir(cache)) & set(os.listdir(local_cache)) - {"tritonwarm"}  # other keys, same binaries

    # this x86_64 process misses them all, and check says why, naming both builds
    report = check(plan(load_specs([spec_file]), target), cache)
    assert len(report.missing) == 2
    assert any("the same release built" in r and "linux-aarch64" in r for r in report.reasons), report.reasons
    # the server: Triton's own CUDA backend hashes its ptxas's --version (its own mock knob stands in)
    from triton.backends.nvidia import compiler as nvidia

    forget = getattr(nvidia.get_ptxas_version, "cache_clear", lambda: None)  # Triton memoizes the text
    before = compile_counter.count
    monkeypatch.setenv("TRITON_MOCK_PTX_VERSION", text)
    forget()
    try:
        for rows in (1, 37, 4096):
            assert rms_norm_runtime(target, cache, rows, False).hash in {e["cache_hash"] for e in
                                                                         Manifest(cache, "sm90").read().values()}
        assert compile_counter.count == before
    finally:
        monkeypatch.delenv("TRITON_MOCK_PTX_VERSION")
        forget()
    rms_norm_runtime(target, cache, 5, False)  # control: keyed with this machine's ptxas, it compiles
    assert compile_counter.count == before + 1
