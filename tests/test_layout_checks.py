"""The cache's on-disk layout, pinned with fast tests on real folders: where the cache is, what a
complete Triton entry is, which group names another folder, which state files are refused, and the
one-line errors that say what to fix."""

import errno
import hashlib
import json
import os
import stat
import sys
import time
import types
from pathlib import Path

import pytest
from tritonwarm.jit.cache import layout
from tritonwarm.jit.cache.layout import (
    CacheError,
    UnreadableEntry,
    check_cache_dir,
    complete_group,
    disk_full,
    ensure_writable,
    entry_files,
    entry_path,
    file_mode,
    file_sha256,
    foreign_group_folder,
    old_default_cache_dir,
    old_default_note,
    record_serve_at,
    refuse_if_served_elsewhere,
    refuse_links_in_state,
    remove_stale_temporaries,
    resolve_cache_dir,
    serve_at_of,
    triton_default_cache_dir,
    variant_lock,
    write_json_atomic,
)

NO_SUCH_PID = 2**31 - 1  # above any pid_max: no process has it
ENTRY = "ENTRYHASH"


# --- the cache directory's path -------------------------------------------------------------------------------------


def test_a_file_as_the_cache_directory_is_refused_naming_it(tmp_path):
    file = tmp_path / "cache"
    file.write_text("")
    for for_writing in (True, False):
        with pytest.raises(CacheError, match=f"cache directory {file} is a file, not a directory"):
            check_cache_dir(file, for_writing=for_writing)


def test_an_existing_cache_directory_is_fine_for_reading_and_writing(tmp_path):
    assert check_cache_dir(tmp_path, for_writing=False) is None
    assert check_cache_dir(tmp_path, for_writing=True) is None


def test_a_missing_cache_directory_is_created_by_warmup_and_noted_by_readers(tmp_path):
    missing = tmp_path / "a" / "b" / "cache"
    assert check_cache_dir(missing, for_writing=True) is None
    assert check_cache_dir(missing, for_writing=False) == "does not exist: nothing was warmed there"


def test_a_cache_directory_under_a_file_names_the_file_in_the_way(tmp_path):
    blocker = tmp_path / "blocker"
    blocker.write_text("")
    deep = blocker / "a" / "b" / "cache"
    with pytest.raises(CacheError) as raised:
        check_cache_dir(deep, for_writing=True)
    assert str(raised.value) == f"cannot create cache directory {deep}: {blocker} is a file, not a directory"
    with pytest.raises(CacheError) as raised:
        check_cache_dir(deep, for_writing=False)
    assert str(raised.value) == f"cannot read cache directory {deep}: {blocker} is a file, not a directory"


def test_a_full_disk_is_told_apart_from_other_errors():
    assert disk_full(OSError(errno.ENOSPC, "No space left on device"))
    assert not disk_full(OSError(errno.EACCES, "Permission denied"))
    assert not disk_full(ValueError("no errno"))


# --- processes and Triton's leftover temporaries ---------------------------------------------------------------------


@pytest.fixture
def live_pid():
    """A running process of this user (not this one): probing it must leave it running."""
    import subprocess

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    yield child
    child.kill()
    child.wait()


def test_a_process_of_another_user_counts_as_running(monkeypatch):
    def refused(pid, sig):
        raise PermissionError(errno.EPERM, "Operation not permitted")

    monkeypatch.setattr(layout.os, "kill", refused)
    assert layout._running(12345)


def test_running_asks_without_a_signal(live_pid):
    import subprocess

    assert layout._running(live_pid.pid)
    with pytest.raises(subprocess.TimeoutExpired):  # still running: no signal was delivered
        live_pid.wait(timeout=0.3)


def test_a_finished_process_is_not_running():
    assert not layout._running(NO_SUCH_PID)


def _temporary(cache, name, age_s, entry="ENTRY"):
    folder = cache / entry / name
    folder.mkdir(parents=True)
    (folder / "kernel.cubin").write_bytes(b"partial")
    past = time.time() - age_s
    os.utime(folder, (past, past))
    return folder


def test_an_old_temporary_of_a_finished_process_is_removed_and_counted(tmp_path):
    gone = _temporary(tmp_path, f"tmp.pid_{NO_SUCH_PID}_abc", age_s=120)
    other = _temporary(tmp_path, f"tmp.pid_{NO_SUCH_PID - 1}_def", age_s=120)
    (tmp_path / "ENTRY" / "kernel.json").write_text("{}")  # the entry's own files stay
    assert remove_stale_temporaries(tmp_path) == 2
    assert not gone.exists() and not other.exists()
    assert (tmp_path / "ENTRY" / "kernel.json").exists()


def test_a_recent_temporary_or_one_of_a_running_process_is_kept(tmp_path, live_pid):
    recent = _temporary(tmp_path, f"tmp.pid_{NO_SUCH_PID}_abc", age_s=30)
    running = _temporary(tmp_path, f"tmp.pid_{live_pid.pid}_def", age_s=3600)
    assert remove_stale_temporaries(tmp_path) == 0
    assert recent.exists() and running.exists()
    assert remove_stale_temporaries(tmp_path, min_age_s=10) == 1  # the age is the caller's to choose
    assert not recent.exists() and running.exists()


def test_a_temporary_is_left_over_from_sixty_seconds_on(tmp_path, monkeypatch):
    now = 1_800_000_000
    monkeypatch.setattr(layout, "time", types.SimpleNamespace(time=lambda: now))
    folder = tmp_path / "ENTRY" / f"tmp.pid_{NO_SUCH_PID}_abc"
    folder.mkdir(parents=True)
    os.utime(folder, ns=((now - 59) * 10**9, (now - 59) * 10**9))
    assert remove_stale_temporaries(tmp_path) == 0
    os.utime(folder, ns=((now - 60) * 10**9, (now - 60) * 10**9))
    assert remove_stale_temporaries(tmp_path) == 1


def test_a_temporary_whose_name_holds_no_pid_is_left_alone(tmp_path):
    odd = _temporary(tmp_path, "tmp.pid_x_abc", age_s=3600)
    assert remove_stale_temporaries(tmp_path) == 0
    assert odd.exists()


def test_one_sweep_removes_every_leftover_whatever_else_it_finds(tmp_path, live_pid):
    kept = [_temporary(tmp_path, f"tmp.pid_{NO_SUCH_PID}_{i}", 5, f"r{i}") for i in range(4)]
    kept += [_temporary(tmp_path, f"tmp.pid_{live_pid.pid}_{i}", 3600, f"p{i}") for i in range(4)]
    kept += [_temporary(tmp_path, f"tmp.pid_x{i}_{i}", 3600, f"n{i}") for i in range(4)]
    gone = [_temporary(tmp_path, f"tmp.pid_{NO_SUCH_PID}_{i}", 3600, f"g{i}") for i in range(3)]
    assert remove_stale_temporaries(tmp_path) == 3
    assert all(folder.exists() for folder in kept) and not any(folder.exists() for folder in gone)


def test_a_file_named_like_a_temporary_is_not_counted_and_stops_nothing(tmp_path):
    (tmp_path / "A").mkdir()
    stray = tmp_path / "A" / f"tmp.pid_{NO_SUCH_PID}_x"
    stray.write_text("")
    past = time.time() - 3600
    os.utime(stray, (past, past))
    folder = _temporary(tmp_path, f"tmp.pid_{NO_SUCH_PID}_abc", age_s=3600)
    assert remove_stale_temporaries(tmp_path) == 1
    assert not folder.exists()


# --- which cache folder -----------------------------------------------------------------------------------------------


def test_an_explicit_cache_dir_wins_over_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("TRITONWARM_CACHE_DIR", str(tmp_path / "env"))
    assert resolve_cache_dir(tmp_path / "explicit") == tmp_path / "explicit"
    assert resolve_cache_dir() == tmp_path / "env"
    assert resolve_cache_dir("") == tmp_path / "env"


def test_a_cache_dir_is_made_absolute_and_expands_the_home_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    assert resolve_cache_dir("~/warm") == tmp_path / "home" / "warm"
    assert resolve_cache_dir("rel") == tmp_path / "rel"
    monkeypatch.setenv("TRITONWARM_CACHE_DIR", "~/fromenv")
    assert resolve_cache_dir() == tmp_path / "home" / "fromenv"


def test_without_a_choice_the_cache_is_the_folder_triton_reads(tmp_path, monkeypatch):
    monkeypatch.delenv("TRITONWARM_CACHE_DIR")
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton"))
    assert resolve_cache_dir() == tmp_path / "triton" == triton_default_cache_dir()
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TRITON_CACHE_DIR", "~/t")
    assert triton_default_cache_dir() == tmp_path / "home" / "t"
    monkeypatch.setenv("TRITON_CACHE_DIR", "rel")
    assert triton_default_cache_dir() == tmp_path / "rel"


@pytest.fixture
def triton_without_knobs(monkeypatch):
    """Triton before 3.4: no ``knobs.cache`` (and, where it is gone, no ``default_cache_dir`` either)."""
    import triton

    monkeypatch.setattr(triton, "knobs", types.SimpleNamespace(), raising=False)
    monkeypatch.setitem(sys.modules, "triton.runtime.cache", None)
    return monkeypatch


def test_an_older_triton_reads_triton_cache_dir(tmp_path, triton_without_knobs):
    triton_without_knobs.setenv("TRITON_CACHE_DIR", str(tmp_path / "t"))
    assert triton_default_cache_dir() == tmp_path / "t"


def test_an_older_triton_defaults_under_triton_home_then_home(tmp_path, triton_without_knobs):
    triton_without_knobs.delenv("TRITON_CACHE_DIR")
    triton_without_knobs.setenv("TRITON_HOME", str(tmp_path / "th"))
    assert triton_default_cache_dir() == tmp_path / "th" / ".triton" / "cache"
    triton_without_knobs.delenv("TRITON_HOME")
    triton_without_knobs.setenv("HOME", str(tmp_path / "home"))
    assert triton_default_cache_dir() == tmp_path / "home" / ".triton" / "cache"


def test_an_older_triton_with_default_cache_dir_is_asked_for_it(tmp_path, monkeypatch):
    import triton

    monkeypatch.setattr(triton, "knobs", types.SimpleNamespace(), raising=False)
    monkeypatch.delenv("TRITON_CACHE_DIR")
    monkeypatch.setitem(sys.modules, "triton.runtime.cache",
                        types.SimpleNamespace(default_cache_dir=lambda: str(tmp_path / "asked")))
    assert triton_default_cache_dir() == tmp_path / "asked"


@pytest.fixture
def old_default(tmp_path, monkeypatch):
    """tritonwarm's old default folder, under a cache home of the test's own (Linux: XDG_CACHE_HOME)."""
    if not sys.platform.startswith("linux"):
        pytest.skip("the user cache folder is XDG_CACHE_HOME's on Linux only")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.delenv("TRITONWARM_CACHE_DIR")
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton"))
    return tmp_path / "xdg" / "tritonwarm" / "triton"


def test_the_old_default_is_tritonwarms_user_cache_folder(old_default):
    assert old_default_cache_dir() == old_default


def _warmed_manifest(cache):
    (cache / "tritonwarm").mkdir(parents=True)
    (cache / "tritonwarm" / "manifest-sm90.json").write_text("{}")


def test_a_cache_left_in_the_old_default_folder_is_noted_with_both_ways_out(old_default, tmp_path):
    _warmed_manifest(old_default)
    note = old_default_note()
    new = tmp_path / "triton"
    assert note.startswith("note: ")
    assert f"warmed {old_default};" in note and f"Triton reads {new}:" in note
    assert f"--cache-dir {old_default} " in note and f"TRITON_CACHE_DIR={old_default})" in note


def test_no_old_default_note_when_the_old_folder_warmed_nothing(old_default):
    assert old_default_note() is None
    (old_default / "tritonwarm").mkdir(parents=True)
    (old_default / "tritonwarm" / "plans.json").write_text("{}")  # not a manifest
    assert old_default_note() is None


def test_no_old_default_note_when_a_folder_was_named(old_default, tmp_path, monkeypatch):
    _warmed_manifest(old_default)
    assert old_default_note(tmp_path / "chosen") is None
    monkeypatch.setenv("TRITONWARM_CACHE_DIR", str(tmp_path / "chosen"))
    assert old_default_note() is None


def test_no_old_default_note_when_triton_reads_the_old_folder(old_default, monkeypatch):
    _warmed_manifest(old_default)
    monkeypatch.setenv("TRITON_CACHE_DIR", str(old_default))
    assert old_default_note() is None


# --- writing into the cache ----------------------------------------------------------------------------------------


def test_a_writable_cache_is_created_and_keeps_no_probe(tmp_path):
    cache = tmp_path / "a" / "cache"
    ensure_writable(cache)
    ensure_writable(cache)  # again: the folder exists
    assert (cache / "tritonwarm").is_dir()
    assert list((cache / "tritonwarm").iterdir()) == []


def test_a_cache_that_takes_no_file_fails_early_and_says_serving_works(tmp_path, monkeypatch):
    """A read-only mount: the probe file cannot be created in the cache's own state folder."""
    probed = []

    def read_only(*args, **kwargs):
        probed.append(kwargs.get("dir"))
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(layout.tempfile, "mkstemp", read_only)
    with pytest.raises(CacheError) as raised:
        ensure_writable(tmp_path)
    assert str(raised.value) == f"cannot warm into {tmp_path}: Read-only file system (serving from it still works)"
    assert probed == [tmp_path / "tritonwarm"]


def test_a_write_failure_without_strerror_is_still_said(tmp_path, monkeypatch):
    def failing(*args, **kwargs):
        raise OSError("quota exceeded")

    monkeypatch.setattr(layout.tempfile, "mkstemp", failing)
    with pytest.raises(CacheError, match=r"cannot warm into .*: quota exceeded \(serving"):
        ensure_writable(tmp_path)


def test_ensure_writable_refuses_a_file_as_the_cache_and_a_link_as_its_state(tmp_path):
    file = tmp_path / "file"
    file.write_text("")
    with pytest.raises(CacheError, match="is a file, not a directory"):
        ensure_writable(file)
    with pytest.raises(CacheError, match=f"cannot create cache directory {file / 'sub'}: {file} is a file"):
        ensure_writable(file / "sub")
    cache = tmp_path / "cache"
    cache.mkdir()
    (tmp_path / "elsewhere").mkdir()
    (cache / "tritonwarm").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(CacheError, match="is a symbolic link"):
        ensure_writable(cache)
    assert list((tmp_path / "elsewhere").iterdir()) == []


# --- links in tritonwarm's own state folder ---------------------------------------------------------------------------


@pytest.fixture
def state(tmp_path):
    folder = tmp_path / "cache" / "tritonwarm"
    (folder / "locks").mkdir(parents=True)
    (folder / "locks" / "a.lock").write_text("")
    (folder / "manifest-sm90.json").write_text("{}")
    (tmp_path / "target").write_text("victim")
    return folder


def _refusal(folder) -> str:
    with pytest.raises(CacheError) as raised:
        refuse_links_in_state(folder)
    return str(raised.value)


def test_a_plain_state_folder_or_none_at_all_passes(state, tmp_path):
    refuse_links_in_state(state)
    refuse_links_in_state(tmp_path / "never-made")


def test_the_state_folder_as_a_symbolic_link_is_refused_with_the_fix(state, tmp_path):
    link = tmp_path / "other" / "tritonwarm"
    link.parent.mkdir()
    link.symlink_to(state)
    message = _refusal(link)
    assert message.startswith(f"{link} is a symbolic link: ")
    assert f"writes its own state in {link} and follows no link there" in message
    assert message.endswith("there; remove it (or use another cache folder)")


def test_the_state_folder_as_a_file_is_refused(tmp_path):
    file = tmp_path / "tritonwarm"
    file.write_text("")
    assert _refusal(file).startswith(f"{file} is not a folder: ")


def test_the_state_folder_under_a_file_is_said_in_one_line(tmp_path):
    (tmp_path / "file").write_text("")
    message = _refusal(tmp_path / "file" / "tritonwarm")
    assert message == f"{tmp_path / 'file' / 'tritonwarm'}: {os.strerror(errno.ENOTDIR)}"


def test_a_symbolic_link_among_the_state_files_is_refused_naming_it(state, tmp_path):
    link = state / "manifest-sm100.json"
    link.symlink_to(tmp_path / "target")
    assert _refusal(state).startswith(f"{link} is a symbolic link: ")
    assert (tmp_path / "target").read_text() == "victim"


def test_a_dangling_symbolic_link_in_a_state_subfolder_is_refused(state, tmp_path):
    link = state / "locks" / "b.lock"
    link.symlink_to(tmp_path / "not-there")
    assert _refusal(state).startswith(f"{link} is a symbolic link: ")


def test_a_symbolic_link_to_a_folder_is_refused_not_followed(state, tmp_path):
    (tmp_path / "dir").mkdir()
    link = state / "plans"
    link.symlink_to(tmp_path / "dir")
    assert _refusal(state).startswith(f"{link} is a symbolic link: ")


def test_a_hard_link_among_the_state_files_is_refused_naming_it(state, tmp_path):
    link = state / "locks" / "c.lock"
    os.link(tmp_path / "target", link)
    assert _refusal(state).startswith(f"{link} is a hard link to another file: ")
    assert f"writes its own state in {state} " in _refusal(state)


def test_a_hard_link_at_the_top_of_the_state_folder_is_refused(state, tmp_path):
    link = state / "manifest-sm100.json"
    os.link(tmp_path / "target", link)
    assert _refusal(state).startswith(f"{link} is a hard link to another file")


def test_only_the_state_folder_and_its_subfolders_are_checked(state, tmp_path):
    """Deeper folders are no state tritonwarm opens for writing, and a bundle's staging folder
    (``.install-*``) is checked when it is installed: links there are not refused here."""
    (state / "plans" / "deeper").mkdir(parents=True)
    (state / "plans" / "deeper" / "link").symlink_to(tmp_path / "target")
    (state / ".install-123" / "ENTRY").mkdir(parents=True)
    (state / ".install-123" / "link").symlink_to(tmp_path / "target")
    os.link(tmp_path / "target", state / ".install-123" / "hard")
    refuse_links_in_state(state)
    (state / "install-123").mkdir()
    (state / "install-123" / "link").symlink_to(tmp_path / "target")
    assert _refusal(state).startswith(f"{state / 'install-123' / 'link'} is a symbolic link")


def test_a_state_folder_removed_while_it_is_checked_is_said(state, monkeypatch):
    def gone(path):
        raise FileNotFoundError(errno.ENOENT, "No such file or directory")

    monkeypatch.setattr(layout.os, "scandir", gone)
    assert _refusal(state) == f"{state}: removed while it was checked"


def test_a_state_subfolder_removed_while_it_is_checked_is_no_refusal(state, monkeypatch):
    real = os.scandir

    def subfolder_gone(path):
        if path != str(state):
            raise FileNotFoundError(errno.ENOENT, "No such file or directory")
        return real(path)

    monkeypatch.setattr(layout.os, "scandir", subfolder_gone)
    refuse_links_in_state(state)


def test_an_unreadable_state_folder_is_said_with_the_reason(state, monkeypatch):
    def denied(path):
        raise PermissionError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(layout.os, "scandir", denied)
    assert _refusal(state) == f"{state}: Permission denied"


def test_an_error_without_strerror_is_said_too(state, monkeypatch):
    def denied(path):
        raise OSError("odd failure")

    monkeypatch.setattr(layout.os, "scandir", denied)
    assert _refusal(state) == f"{state}: odd failure"

    def lstat_denied(path):
        raise OSError("lstat failure")

    monkeypatch.setattr(layout.os, "lstat", lstat_denied)
    assert _refusal(state) == f"{state}: lstat failure"


def test_a_state_file_removed_since_it_was_listed_has_no_names(state):
    with os.scandir(state) as found:
        items = {item.name: item for item in found}
    (state / "manifest-sm90.json").unlink()
    assert layout._links(items["manifest-sm90.json"]) == 0
    with os.scandir(state / "locks") as found:
        [lock] = list(found)
    assert layout._links(lock) == 1


# --- where a server mounts the cache ----------------------------------------------------------------------------------


def test_a_cache_marked_for_another_path_says_where(tmp_path):
    cache = tmp_path / "cache"
    (cache / "tritonwarm").mkdir(parents=True)
    record_serve_at(cache, Path("/srv/models/../cache"))
    marker = cache / "tritonwarm" / "serve-at.json"
    assert json.loads(marker.read_text()) == {"path": "/srv/models/../cache"}
    assert serve_at_of(cache) == Path("/srv/cache")
    record_serve_at(cache, Path("/srv/cache"), durable=False)
    assert serve_at_of(cache) == Path("/srv/cache")


def test_a_cache_marked_for_its_own_path_or_unmarked_serves_where_it_is(tmp_path):
    cache = tmp_path / "cache"
    (cache / "tritonwarm").mkdir(parents=True)
    assert serve_at_of(cache) is None
    record_serve_at(cache, cache / "x" / "..")
    assert serve_at_of(cache) is None
    record_serve_at(cache, None)
    assert not (cache / "tritonwarm" / "serve-at.json").exists()
    record_serve_at(cache, None)  # nothing to remove: no error
    assert serve_at_of(tmp_path / "never-made") is None


def test_a_cache_path_through_a_file_has_no_marker(tmp_path):
    (tmp_path / "file").write_text("")
    assert serve_at_of(tmp_path / "file") is None


@pytest.mark.parametrize("text", ['{"path": "relative/dir"}', '{"other": "/srv"}', "[1]", "not json", '{"path": 7}'])
def test_a_damaged_serve_at_marker_is_refused_with_the_fix(tmp_path, text):
    (tmp_path / "tritonwarm").mkdir()
    marker = tmp_path / "tritonwarm" / "serve-at.json"
    marker.write_text(text)
    with pytest.raises(CacheError) as raised:
        serve_at_of(tmp_path)
    message = str(raised.value)
    assert message.startswith(f"{marker} is damaged (no absolute \"path\")")
    assert "install the bundle again with --serve-at PATH" in message


def test_an_unreadable_serve_at_marker_names_it_and_why(tmp_path):
    marker = tmp_path / "tritonwarm" / "serve-at.json"
    marker.mkdir(parents=True)
    with pytest.raises(CacheError) as raised:
        serve_at_of(tmp_path)
    assert str(raised.value) == f"{marker} is unreadable: {os.strerror(errno.EISDIR)}"


def test_warming_a_cache_served_elsewhere_is_refused_with_both_ways_out(tmp_path):
    cache = tmp_path / "cache"
    (cache / "tritonwarm").mkdir(parents=True)
    refuse_if_served_elsewhere(cache)  # unmarked: nothing raised
    record_serve_at(cache, Path("/srv/cache"))
    with pytest.raises(CacheError) as raised:
        refuse_if_served_elsewhere(cache)
    message = str(raised.value)
    assert message.startswith(f"{cache} is installed for a server that mounts it at /srv/cache (bundle install "
                              "--serve-at)")
    assert "--serve-at): Triton here reads none of its entries, and compiling here would point them back here: " \
           "warm where it is served (TRITON_CACHE_DIR=/srv/cache), or into another folder" in message


# --- Triton's entries and groups -----------------------------------------------------------------------------------


def _entry(cache, kernel="add_kernel", names=("add_kernel.cubin", "add_kernel.json"), folder=None, entry=ENTRY):
    """An entry folder with its files and the ``__grp__`` file naming them in ``folder`` (its own by default)."""
    here = cache / entry
    here.mkdir(parents=True, exist_ok=True)
    for name in names:
        (here / name).write_bytes(b"x")
    named = Path(folder) if folder is not None else here
    children = {name: str(named / name) for name in names}
    (here / f"__grp__{kernel[:150]}.json").write_text(json.dumps({"child_paths": children}))
    return here, children


def test_an_entry_path_is_the_folder_named_after_its_hash(tmp_path):
    assert entry_path(tmp_path, ENTRY) == tmp_path / ENTRY
    assert entry_path(str(tmp_path), ENTRY) == tmp_path / ENTRY


def test_a_complete_entry_lists_its_files(tmp_path):
    _, children = _entry(tmp_path)
    assert entry_files(tmp_path, ENTRY, "add_kernel") == children
    assert complete_group(str(tmp_path / ENTRY), "add_kernel.json") == children


def test_a_long_kernel_name_finds_its_group_by_the_first_150_characters(tmp_path):
    long = "k" * 200
    _, children = _entry(tmp_path, kernel=long)
    assert entry_files(tmp_path, ENTRY, long) == children
    assert foreign_group_folder(tmp_path, ENTRY, long) is None
    _entry(tmp_path / "copy", kernel=long, folder=tmp_path / "orig" / ENTRY)
    assert foreign_group_folder(tmp_path / "copy", ENTRY, long) == str(tmp_path / "orig" / ENTRY)


def test_an_entry_missing_a_file_its_group_names_is_a_miss(tmp_path):
    here, _ = _entry(tmp_path)
    (here / "add_kernel.cubin").unlink()
    assert entry_files(tmp_path, ENTRY, "add_kernel") is None
    assert complete_group(str(here), "add_kernel.json") is None


def test_an_entry_without_a_group_or_folder_is_a_miss(tmp_path):
    assert entry_files(tmp_path, ENTRY, "add_kernel") is None
    (tmp_path / ENTRY).mkdir()
    assert entry_files(tmp_path, ENTRY, "add_kernel") is None
    assert complete_group(str(tmp_path / ENTRY), "add_kernel.json") is None
    assert entry_files(tmp_path, ENTRY, "other_kernel") is None


def test_an_entry_folder_taken_by_a_file_is_a_miss(tmp_path):
    (tmp_path / ENTRY).write_text("")
    assert entry_files(tmp_path, ENTRY, "add_kernel") is None
    assert complete_group(str(tmp_path / ENTRY), "add_kernel.json") is None


@pytest.mark.parametrize("text", ["not json", '{"other": {}}', "[]", '{"child_paths": ["a"]}',
                                  '{"child_paths": "a"}'])
def test_a_damaged_group_is_a_miss(tmp_path, text):
    here, _ = _entry(tmp_path)
    (here / "__grp__add_kernel.json").write_text(text)
    assert entry_files(tmp_path, ENTRY, "add_kernel") is None
    assert complete_group(str(here), "add_kernel.json") is None
    assert foreign_group_folder(tmp_path, ENTRY, "add_kernel") is None


def test_a_group_naming_a_non_path_is_a_miss_for_a_cache_manager(tmp_path):
    here, _ = _entry(tmp_path)
    (here / "__grp__add_kernel.json").write_text(json.dumps({"child_paths": {"a": 7}}))
    assert complete_group(str(here), "add_kernel.json") is None


def test_an_unreadable_entry_is_not_a_miss_and_names_its_folder(tmp_path):
    group = tmp_path / ENTRY / "__grp__add_kernel.json"
    group.mkdir(parents=True)  # reading it fails with an error that is no missing file
    with pytest.raises(UnreadableEntry) as raised:
        entry_files(tmp_path, ENTRY, "add_kernel")
    assert str(raised.value) == f"entry {tmp_path / ENTRY} is unreadable: {os.strerror(errno.EISDIR)}"
    assert complete_group(str(tmp_path / ENTRY), "add_kernel.json") is None  # inside Triton: a miss


def test_a_server_mounting_the_cache_elsewhere_finds_entries_its_groups_name_there(tmp_path):
    served = tmp_path / "srv"
    here, _ = _entry(tmp_path, folder=served / ENTRY)
    assert entry_files(tmp_path, ENTRY, "add_kernel") is None  # here, the group names files that are not here
    assert entry_files(tmp_path, ENTRY, "add_kernel", serve_at=served) == {
        "add_kernel.cubin": str(here / "add_kernel.cubin"), "add_kernel.json": str(here / "add_kernel.json")}
    assert entry_files(tmp_path, ENTRY, "add_kernel", serve_at=str(served)) is not None
    (here / "add_kernel.json").unlink()
    assert entry_files(tmp_path, ENTRY, "add_kernel", serve_at=served) is None


def test_a_group_naming_another_folder_than_the_servers_is_a_miss_there(tmp_path):
    _entry(tmp_path, folder=tmp_path / "other" / ENTRY)
    assert entry_files(tmp_path, ENTRY, "add_kernel", serve_at=tmp_path / "srv") is None
    here, _ = _entry(tmp_path / "b")
    assert entry_files(tmp_path / "b", ENTRY, "add_kernel", serve_at=tmp_path / "srv") is None


def test_a_group_with_one_file_elsewhere_is_a_miss_for_the_server(tmp_path):
    served = tmp_path / "srv"
    here, _ = _entry(tmp_path, folder=served / ENTRY)
    group = json.loads((here / "__grp__add_kernel.json").read_text())
    group["child_paths"]["add_kernel.json"] = str(tmp_path / "else" / ENTRY / "add_kernel.json")
    (here / "__grp__add_kernel.json").write_text(json.dumps(group))
    assert entry_files(tmp_path, ENTRY, "add_kernel", serve_at=served) is None
    group["child_paths"]["add_kernel.json"] = 7
    (here / "__grp__add_kernel.json").write_text(json.dumps(group))
    assert entry_files(tmp_path, ENTRY, "add_kernel", serve_at=served) is None


def test_a_group_of_the_entrys_own_folder_names_no_other(tmp_path):
    _entry(tmp_path)
    assert foreign_group_folder(tmp_path, ENTRY, "add_kernel") is None
    assert foreign_group_folder(tmp_path, ENTRY, "add_kernel", by_path=True) is None
    assert foreign_group_folder(tmp_path, ENTRY, "missing_kernel") is None


def test_a_copied_cache_names_the_folder_its_groups_were_written_in(tmp_path):
    original = tmp_path / "original"
    _entry(tmp_path / "copy", folder=original / ENTRY)
    assert foreign_group_folder(tmp_path / "copy", ENTRY, "add_kernel") == str(original / ENTRY)
    assert foreign_group_folder(tmp_path / "copy", ENTRY, "add_kernel", by_path=True) == str(original / ENTRY)


def test_the_first_foreign_folder_in_order_is_named(tmp_path):
    here = tmp_path / "c" / ENTRY
    here.mkdir(parents=True)
    children = {"b": str(tmp_path / "zz" / "b"), "a": str(tmp_path / "aa" / "a"), "own": str(here / "own")}
    (here / "__grp__k.json").write_text(json.dumps({"child_paths": children}))
    assert foreign_group_folder(tmp_path / "c", ENTRY, "k") == str(tmp_path / "aa")
    assert foreign_group_folder(tmp_path / "c", ENTRY, "k", by_path=True) == str(tmp_path / "aa")


def test_the_entrys_own_folder_named_through_a_link_is_foreign_only_by_path(tmp_path):
    """Through a symbolic link the folder is the same on this machine, but a server that sees only
    the cache folder cannot follow the link."""
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "link").symlink_to(real)
    _entry(real, folder=tmp_path / "link" / ENTRY)
    assert foreign_group_folder(real, ENTRY, "add_kernel") is None
    assert foreign_group_folder(real, ENTRY, "add_kernel", by_path=True) == str(tmp_path / "link" / ENTRY)
    assert foreign_group_folder(tmp_path / "link", ENTRY, "add_kernel", by_path=True) is None


def test_a_relative_cache_dir_compares_its_groups_as_absolute_paths(tmp_path, monkeypatch):
    _entry(tmp_path / "c")
    monkeypatch.chdir(tmp_path)
    assert foreign_group_folder(Path("c"), ENTRY, "add_kernel", by_path=True) is None
    assert foreign_group_folder(Path("c"), ENTRY, "add_kernel") is None


def test_a_group_written_with_dots_in_its_path_is_the_same_folder(tmp_path):
    _entry(tmp_path / "c", folder=tmp_path / "c" / "x" / ".." / ENTRY)
    assert foreign_group_folder(tmp_path / "c", ENTRY, "add_kernel", by_path=True) is None
    assert foreign_group_folder(tmp_path / "c", ENTRY, "add_kernel", serve_at=tmp_path / "c") is None


def test_an_entry_served_elsewhere_names_a_group_that_is_not_at_the_server(tmp_path):
    served = tmp_path / "srv"
    _entry(tmp_path / "c", folder=served / ENTRY)
    assert foreign_group_folder(tmp_path / "c", ENTRY, "add_kernel", served) is None
    assert foreign_group_folder(tmp_path / "c", ENTRY, "add_kernel") == str(served / ENTRY)
    _entry(tmp_path / "d")
    assert foreign_group_folder(tmp_path / "d", ENTRY, "add_kernel", served) == str(tmp_path / "d" / ENTRY)


# --- files, locks, atomic writes -------------------------------------------------------------------------------------


def test_file_sha256_hashes_every_byte_of_a_large_file(tmp_path):
    data = os.urandom((1 << 20) + 12345)
    path = tmp_path / "big.bin"
    path.write_bytes(data)
    assert file_sha256(path) == hashlib.sha256(data).hexdigest()
    assert file_sha256(str(path)) == hashlib.sha256(data).hexdigest()
    (tmp_path / "empty").write_bytes(b"")
    assert file_sha256(tmp_path / "empty") == hashlib.sha256(b"").hexdigest()


def test_a_variant_lock_is_a_file_per_key_under_the_state_folder(tmp_path):
    cache = tmp_path / "new" / "cache"
    key = "a" * 32 + "b" * 32
    with variant_lock(cache, key):
        assert [p.name for p in (cache / "tritonwarm" / "locks").iterdir()] == ["a" * 32 + ".lock"]
    with variant_lock(cache, key):  # taken again once released
        pass


def test_a_variant_lock_excludes_another_process(tmp_path):
    import subprocess

    cache = tmp_path / "cache"
    with variant_lock(cache, "c" * 64):
        lock = cache / "tritonwarm" / "locks" / ("c" * 32 + ".lock")
        probe = ("import sys, filelock\n"
                 "try:\n    filelock.FileLock(sys.argv[1], timeout=0).acquire()\nexcept filelock.Timeout:\n"
                 "    sys.exit(3)\n")
        assert subprocess.run([sys.executable, "-c", probe, str(lock)]).returncode == 3
    assert subprocess.run([sys.executable, "-c", probe, str(lock)]).returncode == 0


def test_new_files_get_the_mode_a_plain_open_would(tmp_path):
    previous = os.umask(0o022)
    try:
        assert file_mode() == 0o644  # the usual umask: readable by all, no one executes it
        os.umask(0o027)
        assert file_mode() == 0o640
        assert os.umask(0o027) == 0o027  # the umask is left as it was
        write_json_atomic(tmp_path / "a.json", {"x": 1})
        assert stat.S_IMODE((tmp_path / "a.json").stat().st_mode) == 0o640
    finally:
        os.umask(previous)


def test_an_atomic_write_replaces_the_file_whole_and_leaves_no_temporary(tmp_path):
    path = tmp_path / "data.json"
    path.write_text("old")
    write_json_atomic(path, {"a": [1, 2]}, durable=True)
    assert json.loads(path.read_text()) == {"a": [1, 2]}
    assert path.read_text() == '{"a": [1, 2]}'
    write_json_atomic(path, {"a": 1}, indent=2)
    assert path.read_text() == '{\n  "a": 1\n}'
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data.json"]


def test_a_failed_atomic_write_keeps_the_old_file_and_removes_its_temporary(tmp_path):
    path = tmp_path / "data.json"
    path.write_text('{"old": true}')
    with pytest.raises(TypeError):
        write_json_atomic(path, {"bad": object()})
    assert path.read_text() == '{"old": true}'
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data.json"]


def test_an_atomic_write_keeps_its_temporary_beside_the_file(tmp_path, monkeypatch):
    """Renamed into place, the temporary must be on the file's own filesystem: the system's temporary
    folder (here one that does not exist) plays no part."""
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "no-such-tmp"))
    (tmp_path / "state").mkdir()
    write_json_atomic(tmp_path / "state" / "a.json", {"a": 1})
    assert json.loads((tmp_path / "state" / "a.json").read_text()) == {"a": 1}


def test_an_atomic_write_is_fsynced_only_when_durable(tmp_path, monkeypatch):
    synced = []
    real = os.fsync
    monkeypatch.setattr(layout.os, "fsync", lambda fd: synced.append(fd) or real(fd))
    write_json_atomic(tmp_path / "a.json", {})
    assert synced == []
    write_json_atomic(tmp_path / "a.json", {}, durable=True)
    assert len(synced) == 1
    (tmp_path / "tritonwarm").mkdir()
    record_serve_at(tmp_path, Path("/srv"))  # a marker is durable by default
    assert len(synced) == 2
