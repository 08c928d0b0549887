"""Bundles: a warmed cache packed, deleted, installed at another path; Triton's own runtime then
compiles nothing there (counted at the compiler). Installs are idempotent and survive SIGKILL."""

import json
import multiprocessing
import os
import random
import shutil
import signal
import tarfile
import time
from pathlib import Path

import pytest
from tritonwarm.cli import main
from tritonwarm.jit import TARGETS
from tritonwarm.jit.cache import CacheError, Manifest
from tritonwarm.jit.cache.bundle import HEADER_NAME, install, read_header, verify
from tritonwarm.jit.pipeline.check import check
from tritonwarm.jit.pipeline.plan import plan
from tritonwarm.jit.pipeline.specs import load_specs
from tritonwarm.jit.pipeline.warmup import warm
from tritonwarm.jit.serving.c_launchers import builds_per_signature


def _bundle(out, spec_file, cache_dir, *extra):
    assert main(["bundle", "create", str(out), str(spec_file), "--target", "sm90", "--cache-dir", str(cache_dir),
                 *extra]) == 0


def _members(path):
    with tarfile.open(path) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers()}


@pytest.mark.slow
@pytest.mark.parametrize("binary_only", [False, True])
def test_round_trip_to_another_path_compiles_nothing(tmp_path, spec_file, compile_counter, rms_norm_runtime,
                                                     binary_only, capsys, served_from_bundle):
    target, warmed = TARGETS["sm90"], tmp_path / "warmed"
    the_plan = plan(load_specs([spec_file]), target)
    assert warm(the_plan, warmed).compiled == 2
    bundle = tmp_path / "warm.tar.gz"
    _bundle(bundle, spec_file, warmed, *(["--binary-only"] if binary_only else []))
    shutil.rmtree(warmed)  # the original is gone: nothing can be read from it any more

    members = _members(bundle)
    assert all(not name.startswith("/") and str(tmp_path) not in data.decode(errors="replace")
               for name, data in members.items() if name.endswith(".json"))  # relative paths only
    kept = {name.rsplit(".", 1)[-1] for name in members if "/" in name and "__grp__" not in name}
    assert kept == ({"cubin", "json"} if binary_only else {"cubin", "json", "ptx", "ttir", "ttgir", "llir", "source"})

    served = tmp_path / "srv" / "cache"
    assert main(["bundle", "install", str(bundle), "--cache-dir", str(served)]) == 0
    out = capsys.readouterr().out
    assert "installed 2, already there 0 of 2" in out
    # the tests' TRITON_CACHE_DIR is another folder: the runtime here would not read what was installed
    assert f"note: Triton in this environment reads {os.environ['TRITON_CACHE_DIR']}: serve with " \
           f"TRITON_CACHE_DIR={served}" in out
    # where Triton builds a C launcher per signature (3.6), install builds them, for this Python
    assert ("sm90: C launchers: 3 needed: 3 built" in out) == builds_per_signature("cuda"), out  # + cuda_utils
    report = check(plan(load_specs([spec_file]), target), served)
    assert report.ok or (served_from_bundle(report) and not builds_per_signature("cuda")), report
    for group in served.glob("*/__grp__*.json"):
        assert all(p.startswith(str(served) + os.sep) for p in json.loads(group.read_text())["child_paths"].values())

    before = compile_counter.count
    for rows in (1, 7, 4096):
        for fused in (False, True):
            assert rms_norm_runtime(target, served, rows, fused).hash in the_plan.variants
    assert compile_counter.count == before
    rms_norm_runtime(target, tmp_path / "empty", 3, False)  # control: an empty cache does compile
    assert compile_counter.count == before + 1


@pytest.mark.slow
def test_install_for_a_server_that_mounts_the_folder_elsewhere(tmp_path, spec_file, compile_counter, rms_norm_runtime,
                                                              capsys, served_from_bundle):
    """An init container fills a volume at one path, the server mounts it at another: ``--serve-at`` writes
    Triton's groups (absolute paths) for the server's path, after building the C launchers where installed."""
    target, warmed = TARGETS["sm90"], tmp_path / "warmed"
    the_plan = plan(load_specs([spec_file]), target)
    warm(the_plan, warmed)
    bundle = tmp_path / "warm.tar.gz"
    _bundle(bundle, spec_file, warmed)
    volume, mount = tmp_path / "init" / "cache", tmp_path / "srv" / "cache"
    install_cmd = ["bundle", "install", str(bundle), "--cache-dir", str(volume), "--serve-at", str(mount)]

    assert main(install_cmd[:5] + ["--serve-at", "srv/cache"]) == 2  # relative: Triton would read it from its cwd
    assert "--serve-at 'srv/cache' is not an absolute path" in capsys.readouterr().err
    assert not volume.exists()

    assert main(install_cmd) == 0
    out = " ".join(capsys.readouterr().out.split())  # lines over 200 characters are wrapped
    assert f"installed 2, already there 0 of 2 entries into {volume}, for serving at {mount}" in out
    assert f"check them as that server reads them with `tritonwarm check --serve-at {mount}`" in out
    assert ("sm90: C launchers: 3 needed: 3 built" in out) == builds_per_signature("cuda"), out
    here = check(plan(load_specs([spec_file]), target), volume)  # Triton reads nothing at the install path
    assert len(here.missing) == 2 and all(f"names its files under {mount}/" in m["why"] for m in here.missing)
    assert here.reasons == [f"this folder is installed for a server that mounts it at {mount} (`bundle install "
                            f"--serve-at {mount}`): Triton reads its entries there only: check it as that server "
                            f"reads it, with `tritonwarm check --serve-at {mount}`"]
    there = check(plan(load_specs([spec_file]), target), volume, serve_at=mount)  # ... and all at the mount path
    assert there.ok or (served_from_bundle(there) and not builds_per_signature("cuda")), there

    assert main(install_cmd) == 0  # a repeated init step leaves every entry
    assert "installed 0, already there 2 of 2" in capsys.readouterr().out

    mount.parent.mkdir()
    os.rename(volume, mount)  # the server's mount
    report = check(plan(load_specs([spec_file]), target), mount)
    assert report.ok or (served_from_bundle(report) and not builds_per_signature("cuda")), report
    before = compile_counter.count
    for rows in (1, 7, 4096):
        for fused in (False, True):
            assert rms_norm_runtime(target, mount, rows, fused).hash in the_plan.variants
    assert compile_counter.count == before


@pytest.mark.slow
def test_a_volume_for_another_mount_path_is_checked_as_served_there_and_never_warmed_here(
        tmp_path, spec_file, compile_counter, capsys, monkeypatch):
    """In the init container, ``check --serve-at`` reads the volume as the server will. A warm-up there, or a
    server started there, would compile every entry it misses and point its group here, which the server
    would then miss in turn: refused, with nothing compiled or rewritten."""
    import torch
    from tritonwarm.engine.config import ENGINES
    from tritonwarm.engine.engine import Engine
    from tritonwarm.engine.runner import serve
    from tritonwarm.jit.core import targets

    warmed = tmp_path / "warmed"
    warm(plan(load_specs([spec_file]), TARGETS["sm90"]), warmed)
    bundle = tmp_path / "warm.tar.gz"
    _bundle(bundle, spec_file, warmed)
    volume, mount = tmp_path / "volume", tmp_path / "srv" / "cache"
    assert main(["bundle", "install", str(bundle), "--cache-dir", str(volume), "--serve-at", str(mount)]) == 0
    capsys.readouterr()
    check_cmd = ["check", str(spec_file), "--target", "sm90", "--cache-dir", str(volume)]
    groups = {group: group.read_bytes() for group in volume.glob("*/__grp__*.json")}
    before = compile_counter.count

    assert main(check_cmd) == 1  # Triton here reads nothing of it
    assert f"why: this folder is installed for a server that mounts it at {mount}" in capsys.readouterr().out
    assert main(check_cmd + ["--serve-at", str(mount), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["serve_at"] == str(mount) and report["targets"][0]["planned"] == 2
    with monkeypatch.context() as fleet:  # a server reading through the fleet's cache manager: the same
        fleet.setenv("TRITON_CACHE_MANAGER", "tritonwarm.jit.cache.remote:RedisCacheManager")
        assert main(check_cmd + ["--serve-at", str(mount)]) == 0
    capsys.readouterr()
    assert {group: group.read_bytes() for group in volume.glob("*/__grp__*.json")} == groups  # (Triton 3.6 looked)
    assert main(check_cmd + ["--serve-at", str(tmp_path / "elsewhere")]) == 1  # not the path it was installed for
    out = " ".join(capsys.readouterr().out.split())  # lines over 200 characters are wrapped
    assert (f"why: this folder is installed for a server that mounts it at {mount}, not at {tmp_path / 'elsewhere'}: "
            f"install the bundle with `--serve-at {tmp_path / 'elsewhere'}`") in out
    cubin = next(volume.glob("*/*.cubin"))
    good = cubin.read_bytes()
    cubin.write_bytes(b"damaged")  # what the server would load is checked, as served there
    assert main(check_cmd + ["--serve-at", str(mount)]) == 1
    assert "  corrupt: 1 " in capsys.readouterr().out
    cubin.write_bytes(good)
    assert main(check_cmd + ["--serve-at", "srv/cache"]) == 2
    assert "--serve-at 'srv/cache' is not an absolute path" in capsys.readouterr().err

    assert main(["warmup", str(spec_file), "--target", "sm90", "--cache-dir", str(volume)]) == 2
    err = capsys.readouterr().err
    assert f"{volume} is installed for a server that mounts it at {mount} (bundle install --serve-at)" in err
    assert f"warm where it is served (TRITON_CACHE_DIR={mount}), or into another folder" in err
    with pytest.raises(CacheError, match="installed for a server that mounts it at"):
        warm(plan(load_specs([spec_file]), TARGETS["sm90"]), volume)  # the library's own entry point too
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # a server with a GPU, started on the volume
    monkeypatch.setattr(targets, "local_target", lambda: TARGETS["sm90"])
    monkeypatch.setattr(Engine, "__init__", lambda *a, **k: pytest.fail("started serving"))
    with pytest.raises(CacheError, match=f"mounts it at {mount}"):
        serve(ENGINES["tiny"], [], cache_dir=volume)
    assert compile_counter.count == before
    assert {group: group.read_bytes() for group in volume.glob("*/__grp__*.json")} == groups

    again = tmp_path / "again.tar.gz"  # bundled from where it was installed, as the server reads it
    _bundle(again, spec_file, volume)
    assert {n: d for n, d in _members(again).items() if n.endswith(".cubin")} == \
        {n: d for n, d in _members(bundle).items() if n.endswith(".cubin")}

    (volume / "tritonwarm" / "serve-at.json").write_text('{"path": "srv/cache"}')
    assert main(check_cmd) == 2
    assert "serve-at.json is damaged (no absolute \"path\"): install the bundle again with --serve-at PATH" \
        in capsys.readouterr().err


@pytest.mark.slow
def test_a_folder_serves_at_one_path(tmp_path, spec_file, capsys, served_from_bundle):
    """Installing for a mount path points every entry the folder records there, not only the bundle's (a
    warm-up's, an earlier bundle's); installing for another path, or for here, moves them all."""
    warmed = tmp_path / "warmed"
    warm(plan(load_specs([spec_file]), TARGETS["sm90"]), warmed)
    bundle = tmp_path / "warm.tar.gz"
    _bundle(bundle, spec_file, warmed)
    other_spec = tmp_path / "other" / "rms.yaml"
    other_spec.parent.mkdir()
    other_spec.write_text("kernel: tritonwarm.launchers.rms_norm:rms_norm\naxes:\n  dtype: [float16, float32]\n"
                          "args:\n  x: {tensor: [8, 4096], dtype: $dtype}\n  weight: {tensor: [4096], dtype: $dtype}\n")
    other = plan(load_specs([other_spec]), TARGETS["sm90"])
    folder = tmp_path / "folder"
    assert warm(other, folder).compiled == 2  # entries no bundle carries
    install_cmd = ["bundle", "install", str(bundle), "--cache-dir", str(folder), "--no-c-launchers"]

    def named_at():
        return {str(Path(p).parent.parent) for group in folder.glob("*/__grp__*.json")
                for p in json.loads(group.read_text())["child_paths"].values()}

    for at in (tmp_path / "a", tmp_path / "b"):
        assert main(install_cmd + ["--serve-at", str(at)]) == 0
        assert named_at() == {str(at)}, at
        assert check(other, folder, serve_at=at).missing == []
    assert main(install_cmd) == 0  # and back: served where it is
    assert named_at() == {str(folder)}
    assert not (folder / "tritonwarm" / "serve-at.json").exists()
    assert check(other, folder).missing == []
    assert served_from_bundle(check(plan(load_specs([spec_file]), TARGETS["sm90"]), folder))  # (--no-c-launchers)
    capsys.readouterr()


@pytest.mark.slow
def test_install_is_idempotent_and_repairs_damage(tmp_path, spec_file, served_from_bundle):
    warmed, served = tmp_path / "warmed", tmp_path / "served"
    warm(plan(load_specs([spec_file]), TARGETS["sm90"]), warmed)
    bundle = tmp_path / "b.tar.gz"
    _bundle(bundle, spec_file, warmed)
    first = install(bundle, served, compare_environment=False)
    assert (first.installed, first.already) == (2, 0)
    manifest = (served / "tritonwarm" / "manifest-sm90.json").read_bytes()
    cubins = sorted(served.glob("*/*.cubin"))
    stamps = [p.stat().st_mtime_ns for p in cubins]
    second = install(bundle, served, compare_environment=False)
    assert (second.installed, second.already) == (0, 2)
    assert [p.stat().st_mtime_ns for p in cubins] == stamps
    assert (served / "tritonwarm" / "manifest-sm90.json").read_bytes() == manifest

    cubins[0].write_bytes(b"damaged")  # a damaged entry is replaced, the intact one left alone
    third = install(bundle, served, compare_environment=False)
    assert (third.installed, third.already) == (1, 1)
    assert served_from_bundle(check(plan(load_specs([spec_file]), TARGETS["sm90"]), served))
    assert not list((served / "tritonwarm").glob(".install-*"))  # no staging left behind


@pytest.mark.slow
def test_a_copied_cache_is_not_bundled_and_a_copy_is_replaced(tmp_path, spec_file):
    """A plain copy's groups still name the original's files: it is neither bundled nor kept by install."""
    warmed = tmp_path / "warmed"
    warm(plan(load_specs([spec_file]), TARGETS["sm90"]), warmed)
    copy = tmp_path / "copy"
    shutil.copytree(warmed, copy)
    assert main(["bundle", "create", str(tmp_path / "x.tar.gz"), str(spec_file), "--target", "sm90",
                 "--cache-dir", str(copy)]) == 2
    bundle = tmp_path / "b.tar.gz"
    _bundle(bundle, spec_file, warmed)
    report = install(bundle, copy, compare_environment=False)
    assert report.installed == 2  # the copy's entries read the original's files: replaced
    shutil.rmtree(warmed)
    assert check(plan(load_specs([spec_file]), TARGETS["sm90"]), copy).ok


@pytest.mark.slow
def test_bundle_is_reproducible_and_verify_names_environment_differences(tmp_path, spec_file, capsys, monkeypatch):
    warmed = tmp_path / "warmed"
    warm(plan(load_specs([spec_file]), TARGETS["sm90"]), warmed)
    a, b = tmp_path / "a.tar.gz", tmp_path / "b.tar.gz"
    _bundle(a, spec_file, warmed)
    _bundle(b, spec_file, warmed)
    assert a.read_bytes() == b.read_bytes()
    header = read_header(a)
    rows = header["targets"]["sm90"]
    assert rows == Manifest(warmed, "sm90").read()  # the manifest's rows, unchanged
    report = verify(a)
    assert (report.entries, report.files, report.differences) == (2, 14, [])

    capsys.readouterr()
    assert main(["bundle", "verify", str(a)]) == 0
    monkeypatch.setenv("TRITON_DEFAULT_FP_FUSION", "0")
    assert main(["bundle", "verify", str(a)]) == 1
    out = capsys.readouterr().out
    assert "TRITON_DEFAULT_FP_FUSION: warmed with" in out and "1 difference" in out


def test_create_refuses_what_is_not_warmed(tmp_path, spec_file, capsys):
    (tmp_path / "cold").mkdir()
    assert main(["bundle", "create", str(tmp_path / "x.tar.gz"), str(spec_file), "--target", "sm90",
                 "--cache-dir", str(tmp_path / "cold")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "not warmed in" in err
    assert not (tmp_path / "x.tar.gz").exists()
    # a cache directory that does not exist (a typo) is named, and not created
    assert main(["bundle", "create", str(tmp_path / "x.tar.gz"), str(spec_file), "--target", "sm90",
                 "--cache-dir", str(tmp_path / "typo")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"cache directory {tmp_path / 'typo'} does not exist" in err, err
    assert not (tmp_path / "typo").exists() and not (tmp_path / "x.tar.gz").exists()


def _run_child(target, args, delay: float | None) -> tuple[int, float]:
    """``target(*args)`` in a forked process, SIGKILLed after ``delay`` seconds (None: left to finish);
    its exit code and the seconds it ran."""
    child = multiprocessing.get_context("fork").Process(target=target, args=args)
    t0 = time.perf_counter()
    child.start()
    if delay is not None:
        time.sleep(delay)
        os.kill(child.pid, signal.SIGKILL)
    child.join()
    return child.exitcode, time.perf_counter() - t0


def _install_in_child(bundle, served):
    install(bundle, served, compare_environment=False)
    os._exit(0)


@pytest.mark.slow
def test_sigkill_during_install_leaves_a_usable_cache(tmp_path, spec_file, served_from_bundle):
    """10 installs killed at random moments: each entry is whole or absent; installing again completes."""
    warmed = tmp_path / "warmed"
    specs = load_specs([spec_file])
    warm(plan(specs, TARGETS["sm90"]), warmed)
    bundle = tmp_path / "b.tar.gz"
    _bundle(bundle, spec_file, warmed)
    header = read_header(bundle)

    def run_child(served, delay):
        return _run_child(_install_in_child, (bundle, served), delay)

    code, duration = run_child(tmp_path / "timing", None)
    assert code == 0
    rng = random.Random(1234)
    killed = interrupted = 0
    for trial in range(10):
        served = tmp_path / f"served{trial}"
        code, _ = run_child(served, rng.uniform(0, 0.9 * duration))
        killed += code == -signal.SIGKILL
        for rows in header["targets"].values():
            for row in rows.values():
                folder = served / row["entry_dir"]
                if folder.exists():  # whole, as Triton would load it, or not there at all
                    group = json.loads((folder / f"__grp__{row['entry_name']}.json").read_text())
                    assert sorted(group["child_paths"]) == sorted(row["files"])
        if (served / "tritonwarm").exists():
            Manifest(served, "sm90").read()  # never half a manifest
        unmerged = not (served / "tritonwarm" / "manifest-sm90.json").exists()
        report = install(bundle, served, compare_environment=False)
        interrupted += code == -signal.SIGKILL and (report.installed > 0 or unmerged)
        assert report.installed + report.already == 2
        assert served_from_bundle(check(plan(specs, TARGETS["sm90"]), served))
        assert not list((served / "tritonwarm").glob(".install-*"))
    assert killed >= 3 and interrupted >= 1, (killed, interrupted)  # the kills did land mid-install


def _install_for_serving_in_child(bundle, volume, mount):
    os._exit(main(["bundle", "install", str(bundle), "--cache-dir", str(volume), "--serve-at", str(mount)]))


@pytest.mark.slow
def test_sigkill_during_an_install_for_another_mount_path(tmp_path, spec_file, served_from_bundle):
    """Installs for serving elsewhere killed at random moments: every group names a whole entry, here or
    there; installing again points them all there."""
    warmed = tmp_path / "warmed"
    specs = load_specs([spec_file])
    warm(plan(specs, TARGETS["sm90"]), warmed)
    bundle = tmp_path / "b.tar.gz"
    _bundle(bundle, spec_file, warmed)
    rows = [row for table in read_header(bundle)["targets"].values() for row in table.values()]

    def run_child(volume, mount, delay):
        return _run_child(_install_for_serving_in_child, (bundle, volume, mount), delay)

    code, duration = run_child(tmp_path / "timing", tmp_path / "timing-mount", None)
    assert code == 0
    rng, killed = random.Random(4321), 0
    for trial in range(6):
        volume, mount = tmp_path / f"volume{trial}", tmp_path / f"mount{trial}"
        code, _ = run_child(volume, mount, rng.uniform(0, 0.9 * duration))
        killed += code == -signal.SIGKILL
        for row in rows:
            group = volume / row["entry_dir"] / f"__grp__{row['entry_name']}.json"
            if group.exists():  # names every file of the entry, here or where it will be served
                children = json.loads(group.read_text())["child_paths"]
                assert sorted(children) == sorted(row["files"])
                assert {os.path.dirname(p) for p in children.values()} in (
                    {str(volume / row["entry_dir"])}, {str(mount / row["entry_dir"])})
        assert run_child(volume, mount, None)[0] == 0
        os.rename(volume, mount)
        report = check(plan(specs, TARGETS["sm90"]), mount)
        assert report.ok or served_from_bundle(report), report  # (C launchers: built where Triton builds them)
    assert killed >= 3, killed


@pytest.mark.slow
def test_header_comes_first(tmp_path, spec_file):
    warmed = tmp_path / "warmed"
    warm(plan(load_specs([spec_file]), TARGETS["sm90"]), warmed)
    bundle = tmp_path / "b.tar.gz"
    _bundle(bundle, spec_file, warmed)
    with tarfile.open(bundle) as tar:
        names = tar.getnames()
    assert names[0] == HEADER_NAME and len(names) == 1 + 2 * 8


@pytest.mark.slow
def test_concurrent_installs_of_one_bundle(tmp_path, spec_file, served_from_bundle):
    """Four processes install at once: per-key locks, one manifest merge at a time, a complete cache."""
    warmed, served = tmp_path / "warmed", tmp_path / "served"
    specs = load_specs([spec_file])
    warm(plan(specs, TARGETS["sm90"]), warmed)
    bundle = tmp_path / "b.tar.gz"
    _bundle(bundle, spec_file, warmed)
    context = multiprocessing.get_context("fork")
    children = [context.Process(target=_install_in_child, args=(bundle, served)) for _ in range(4)]
    for child in children:
        child.start()
    for child in children:
        child.join()
    assert [c.exitcode for c in children] == [0] * 4
    assert served_from_bundle(check(plan(specs, TARGETS["sm90"]), served))
    assert len(Manifest(served, "sm90").read()) == 2
    assert not list((served / "tritonwarm").glob(".install-*"))
