"""Fast tests of the overlay cache manager (a read-only warmed cache, a writable folder for what serving
compiles), beside the slow scenarios of tests/test_readonly_cache.py that run Triton through it."""

import json
import os

import pytest
from tritonwarm.jit.cache import overlay
from tritonwarm.jit.cache.layout import CacheError
from tritonwarm.jit.cache.overlay import OVERLAY_ENV, OverlayCacheManager, refuse_if_overlaid, refuse_unless_own_folder

KEY = "K" * 52
MANAGER = "tritonwarm.jit.cache.overlay:OverlayCacheManager"


@pytest.fixture
def folders(tmp_path, monkeypatch):
    """A warmed cache holding one complete entry (a group and its two files) and an overlay not made yet."""
    warmed, over = tmp_path / "warmed", tmp_path / "overlay"
    entry = warmed / KEY
    entry.mkdir(parents=True)
    for name in ("k.cubin", "k.json"):
        (entry / name).write_text(name)
    group = {"child_paths": {n: str(entry / n) for n in ("k.cubin", "k.json")}}
    (entry / "__grp__k.json").write_text(json.dumps(group))
    monkeypatch.setenv("TRITON_CACHE_DIR", str(warmed))
    monkeypatch.setenv(OVERLAY_ENV, str(over))
    monkeypatch.setattr(overlay, "_owned", set())
    return warmed, over


def test_without_an_overlay_it_is_tritons_own_manager(folders, monkeypatch):
    warmed, _ = folders
    monkeypatch.delenv(OVERLAY_ENV)
    manager = OverlayCacheManager(KEY)
    assert manager.warmed_dir is None and manager.cache_dir == str(warmed / KEY)
    assert manager.get_group("k.json") == {n: str(warmed / KEY / n) for n in ("k.cubin", "k.json")}


def test_the_warmed_folder_is_read_first_and_every_write_goes_to_the_overlay(folders):
    warmed, over = folders
    manager = OverlayCacheManager(KEY)
    assert manager.cache_dir == str(over / KEY)
    assert manager.get_file("k.cubin") == str(warmed / KEY / "k.cubin")
    assert manager.get_group("k.json") == {n: str(warmed / KEY / n) for n in ("k.cubin", "k.json")}
    assert manager.get_file("other.cubin") is None and not over.exists()  # a lookup makes no overlay
    written = manager.put(b"new", "other.cubin")
    assert written == str(over / KEY / "other.cubin") and (over / KEY / "other.cubin").read_bytes() == b"new"
    assert not (warmed / KEY / "other.cubin").exists() and (over.stat().st_mode & 0o777) == 0o755
    assert manager.get_file("other.cubin") == written  # the overlay is read next


def test_a_group_is_taken_only_whole_from_the_warmed_folder_then_the_overlay(folders):
    warmed, over = folders
    (warmed / KEY / "k.cubin").unlink()  # the warmed group is partial now
    manager = OverlayCacheManager(KEY)
    assert manager.get_group("k.json") is None
    for name in ("k.cubin", "k.json"):
        manager.put(name.encode(), name)
    manager.put(json.dumps({"child_paths": {n: str(over / KEY / n) for n in ("k.cubin", "k.json")}}),
                "__grp__k.json", binary=False)
    assert manager.get_group("k.json") == {n: str(over / KEY / n) for n in ("k.cubin", "k.json")}


@pytest.mark.parametrize("make, why", [
    (lambda p: p.symlink_to(p.parent), "is a symbolic link"),
    (lambda p: (p.mkdir(), p.chmod(0o775)), "is writable by its group (mode 775)"),
    (lambda p: (p.mkdir(), p.chmod(0o757)), "is writable by others (mode 757)"),
])
def test_an_overlay_folder_someone_else_could_plant_entries_in_is_refused(tmp_path, make, why):
    folder = tmp_path / "overlay"
    make(folder)
    with pytest.raises(CacheError) as raised:
        refuse_unless_own_folder(str(folder))
    assert str(raised.value) == (f"{OVERLAY_ENV}={folder} {why}: the overlay's entries are loaded as they are, so "
                                 "it must be this serving account's own folder, writable by no one else: refused")


def test_an_overlay_path_that_is_a_file_is_named_in_one_line(tmp_path):
    (tmp_path / "overlay").write_text("")
    with pytest.raises(CacheError) as raised:
        refuse_unless_own_folder(str(tmp_path / "overlay"))
    assert str(raised.value) == f"{OVERLAY_ENV}={tmp_path / 'overlay'}: File exists"


def test_a_planted_overlay_is_refused_at_the_first_lookup(folders):
    _, over = folders
    over.mkdir()
    over.chmod(0o757)
    with pytest.raises(CacheError, match="is writable by others"):
        OverlayCacheManager(KEY)
    over.chmod(0o755)
    assert OverlayCacheManager(KEY).get_file("missing.cubin") is None


def test_a_command_that_fills_the_cache_refuses_to_run_under_the_overlay(folders, monkeypatch, tmp_path):
    _, over = folders
    refuse_if_overlaid(tmp_path / "cache")  # Triton's own manager: nothing to refuse
    monkeypatch.setenv("TRITON_CACHE_MANAGER", MANAGER)
    assert overlay.overlay_in_force() == over
    with pytest.raises(CacheError) as raised:
        refuse_if_overlaid(tmp_path / "cache")
    assert str(raised.value) == (f"{OVERLAY_ENV}={over} is set with the overlay cache manager: Triton would write "
                                 f"what this compiles there, not into {tmp_path / 'cache'}: unset {OVERLAY_ENV} for "
                                 "this command")
    monkeypatch.delenv(OVERLAY_ENV)
    assert overlay.overlay_in_force() is None


def test_a_folder_not_made_yet_is_writable_where_its_nearest_parent_is(tmp_path):
    assert overlay._writable(tmp_path / "a" / "b" / "c")
    (tmp_path / "file").write_text("")
    assert not overlay._writable(tmp_path / "file" / "below")  # its nearest existing "parent" is a file
    assert os.access(tmp_path, os.W_OK)


def test_where_a_miss_would_fail_instead_of_compiling_it_is_said_with_the_fix(folders, monkeypatch, tmp_path):
    """A cache this process cannot write (a read-only mount; tests run as root, so the check is answered
    for it): under Triton's own manager and the remote one a miss fails; under the overlay it compiles,
    unless the overlay cannot be written either."""
    warmed, over = folders
    unwritable = {str(warmed)}
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda path, mode: str(path) not in unwritable and real_access(path, mode))
    assert overlay.misses_fail_here(tmp_path / "absent") is None and overlay.misses_fail_here(tmp_path) is None
    assert overlay.misses_fail_here(warmed) == (
        f"this process cannot write to {warmed} (read-only, or another owner's): Triton's first launch of a kernel "
        "it lacks fails (OSError) instead of compiling: a class no spec warmed, a kernel of torch.compile or of "
        f"another package: serve with TRITON_CACHE_MANAGER={MANAGER} and {OVERLAY_ENV}=<a writable folder>")
    monkeypatch.setenv("TRITON_CACHE_MANAGER", "triton.runtime.cache:RemoteCacheManager")
    assert overlay.misses_fail_here(warmed) == (
        f"this process cannot write to {warmed}, and Triton's RemoteCacheManager writes every entry it reads into "
        "this folder: every lookup fails (OSError), hit or miss: serve with TRITON_CACHE_MANAGER="
        f"tritonwarm.jit.cache.remote:RedisCacheManager and {OVERLAY_ENV}=<a writable folder>")
    monkeypatch.setenv("TRITON_CACHE_MANAGER", MANAGER)
    assert overlay.misses_fail_here(warmed) is None  # the overlay (not made yet) can be: misses compile there
    unwritable.add(str(tmp_path))  # the overlay's nearest existing folder
    assert overlay.misses_fail_here(warmed) == (
        f"{OVERLAY_ENV}={over} cannot be written either: Triton's first launch of a kernel the cache lacks fails "
        "(OSError): point it at a writable folder")


def test_the_overlay_is_made_owner_writable_only_whatever_the_umask(folders):
    _, over = folders
    old = os.umask(0)
    try:
        OverlayCacheManager(KEY).put(b"x", "k.cubin")
    finally:
        os.umask(old)
    assert over.stat().st_mode & 0o777 == 0o755


def test_the_manager_names_its_key_lock_and_folders_as_tritons_does(folders):
    _, over = folders
    manager = OverlayCacheManager(KEY)
    assert (manager.key, manager.lock_path) == (KEY, str(over / KEY / "lock"))


def test_overrides_and_dumps_are_tritons_own(folders, monkeypatch, tmp_path):
    monkeypatch.setenv("TRITON_OVERRIDE_DIR", str(tmp_path / "override"))
    monkeypatch.setenv("TRITON_DUMP_DIR", str(tmp_path / "dump"))
    for kwargs, folder in ((dict(override=True), "override"), (dict(dump=True), "dump")):
        manager = OverlayCacheManager(KEY, **kwargs)
        assert manager.warmed_dir is None and manager.cache_dir == str(tmp_path / folder / KEY), kwargs


def test_an_overlay_checked_once_is_trusted_for_the_process_and_read(folders):
    _, over = folders
    written = OverlayCacheManager(KEY).put(b"new", "other.cubin")
    overlay._owned.clear()  # a later process: the overlay exists and is this account's own
    assert OverlayCacheManager(KEY).get_file("other.cubin") == written
    over.chmod(0o757)  # checked once a process: not again at every lookup
    assert OverlayCacheManager(KEY).get_file("other.cubin") == written


def test_a_cache_manager_that_does_not_import_is_no_overlay(folders, monkeypatch):
    monkeypatch.setenv("TRITON_CACHE_MANAGER", "no_such_module:Manager")
    assert overlay.overlay_in_force() is None
