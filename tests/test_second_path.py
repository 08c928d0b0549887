"""One cache folder under two paths. Triton's group files name each file by the absolute path the cache
was filled at, and a server looks there: a server that sees the folder only at another path (a
container given a bind mount of it, a symbolic link resolved when the volume was mounted) misses every
entry. `check` at that other path says so, unless told the server sees both (`--same-machine`)."""

import os
import shutil
import subprocess
import sys

import pytest
from tritonwarm.jit import TARGETS
from tritonwarm.jit.pipeline.check import check
from tritonwarm.jit.pipeline.plan import plan
from tritonwarm.jit.pipeline.specs import load_specs
from tritonwarm.jit.pipeline.warmup import warm

SM90 = TARGETS["sm90"]


def test_a_symbolic_link_to_the_cache_is_a_second_path(tmp_path, dtypes_spec_file):
    the_plan = plan(load_specs([dtypes_spec_file]), SM90)
    filled, link = tmp_path / "a", tmp_path / "b"
    warm(the_plan, filled)
    link.symlink_to(filled)
    assert check(the_plan, filled).ok
    report = check(the_plan, link)
    assert not report.ok and report.missing == [] and len(report.read_elsewhere) == 2
    assert report.reasons == [
        f"2 planned variants are named by their group files under {filled}: the same folder as {link} by another "
        f"path (a symbolic link: its real path is {filled}): a server that sees it only at {link} misses them all: "
        f"install the bundle for that path (`tritonwarm bundle install BUNDLE --cache-dir {filled} --serve-at "
        f"{link}`), or serve it at {filled}; where both paths are seen: `check --same-machine`"]
    same = check(the_plan, link, same_machine=True)
    assert same.ok and same.notes[-1] == report.reasons[0]


def _namespace_works() -> bool:
    if shutil.which("unshare") is None:
        return False
    probe = subprocess.run(["unshare", "-rm", "sh", "-c", "mount -t tmpfs none /mnt"], capture_output=True)
    return probe.returncode == 0


def in_namespace(mounts: str, *args, cwd=None) -> subprocess.CompletedProcess:
    """``tritonwarm ARGS`` in a mount namespace of its own (nothing outside it sees its mounts), after
    the shell commands ``mounts``."""
    command = f"{mounts} && exec \"$@\""
    return subprocess.run(["unshare", "-rm", "sh", "-c", command, "sh", sys.executable, "-m", "tritonwarm",
                           *map(str, args)], capture_output=True, text=True, timeout=900, cwd=cwd)


@pytest.mark.slow
@pytest.mark.skipif(not _namespace_works(), reason="no mount namespaces here (unshare -rm)")
def test_a_bind_mount_is_a_second_path_and_the_server_that_sees_only_it_is_told_its_own_path(
        tmp_path, dtypes_spec_file, run_cli):
    """Installed into /srv/a, served from a read-only bind mount of it at /srv/b (a container that
    sees only /srv/b). The fix is the install for the path the server reads: `--serve-at /srv/b`."""
    build, bundle, a, b = tmp_path / "build", tmp_path / "warm.tar.gz", tmp_path / "a", tmp_path / "b"
    spec = [dtypes_spec_file, "--target", "sm90"]
    run_cli("warmup", *spec, "--cache-dir", build, "-j", "1", rc=0)
    run_cli("bundle", "create", bundle, *spec, "--cache-dir", build, rc=0)
    run_cli("bundle", "install", bundle, "--cache-dir", a, rc=0)
    b.mkdir()
    bind = f"mount --bind {a} {b} && mount -o remount,bind,ro {b}"
    hide_a = f"{bind} && mount -t tmpfs none {a}"  # the server's view: /srv/b only

    seen = in_namespace(bind, "check", *spec, "--cache-dir", b)
    assert seen.returncode == 1, seen.stdout + seen.stderr
    flat = " ".join(seen.stdout.split())
    assert (f"why: 2 planned variants are named by their group files under {a}: the same folder as {b} by another "
            "path (a bind mount, or another mount of it)") in flat, flat
    assert f"--cache-dir {a} --serve-at {b}" in flat
    assert in_namespace(bind, "check", *spec, "--cache-dir", b, "--same-machine").returncode == 0

    server = in_namespace(hide_a, "check", *spec, "--cache-dir", b, "--plain")
    assert server.returncode == 1, server.stdout + server.stderr
    flat = " ".join(server.stdout.split())
    assert "sm90: PROBLEMS: 2 variants planned from 2 rows, 2 missing" in flat, flat
    assert "plain Triton: 0/2 hits" in flat, flat
    assert f"--serve-at {b}" in flat and f"--serve-at {a}" not in flat, flat  # never a path the user did not give

    run_cli("bundle", "install", bundle, "--cache-dir", a, "--serve-at", b, rc=0)  # the fix
    served = in_namespace(hide_a, "check", *spec, "--cache-dir", b, "--plain")
    assert served.returncode == 0, served.stdout + served.stderr
    assert "sm90: ok: 2 variants planned from 2 rows, 0 missing" in served.stdout, served.stdout
    assert "plain Triton: 2/2 hits" in served.stdout, served.stdout
    for mounts, rc in ((bind, 0), ("true", 1)):  # where it was filled: installed for the server, a note while b is seen
        at_a = in_namespace(mounts, "check", *spec, "--cache-dir", a)
        assert at_a.returncode == rc, at_a.stdout + at_a.stderr
        assert f"this folder is installed for a server that mounts it at {b}" in " ".join(at_a.stdout.split())
    assert not os.path.ismount(b)  # nothing outside the namespaces saw a mount
