"""Where the cache lives: its directory, Triton's entry folders, per-key locks.

The compiled binaries are **Triton's own disk-cache entries** (``<dir>/<base32 hash>/...``), so
Triton's runtime finds them with no help once it reads the same directory. tritonwarm's own files
live beside them under ``<dir>/tritonwarm/``.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import shutil
import stat
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import platformdirs
from filelock import FileLock

from ..core.entry_names import entry_dir_name  # noqa: F401 (the folder Triton names after a hash: cache modules use it)

LOCK_TIMEOUT_S = 600


class CacheError(RuntimeError):
    pass


class UnreadableEntry(CacheError):
    """An entry folder that exists but cannot be read: neither missing nor servable."""


def check_cache_dir(cache_dir: Path, *, for_writing: bool) -> str | None:
    """Say what is wrong with the cache directory's path, in one line, before anything uses it.

    A path that is a file, or lies under one, is an error. A directory that does not exist yet is
    fine for warming (it is created) and, for reading, returns a note: nothing was warmed there.
    """
    path = Path(cache_dir)
    if path.exists() and not path.is_dir():
        raise CacheError(f"cache directory {path} is a file, not a directory")
    if path.exists():
        return None
    parent = path.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        verb = "create" if for_writing else "read"
        raise CacheError(f"cannot {verb} cache directory {path}: {parent} is a file, not a directory")
    return None if for_writing else "does not exist: nothing was warmed there"


def disk_full(e: BaseException) -> bool:
    return isinstance(e, OSError) and e.errno == errno.ENOSPC


def remove_stale_temporaries(cache_dir: Path, min_age_s: float = 60.0) -> int:
    """Remove the ``<entry>/tmp.pid_<pid>_<id>`` folders Triton leaves when a write fails (a full disk).

    Triton writes each file into such a folder and renames it into place, so one lives for a moment;
    a folder whose process is gone from this machine and that is older than ``min_age_s`` is left over.
    """
    removed = 0
    now = time.time()
    for folder in Path(cache_dir).glob("*/tmp.pid_*"):
        try:
            pid = int(folder.name[len("tmp.pid_"):].split("_", 1)[0])
            if now - folder.stat().st_mtime < min_age_s or _running(pid):
                continue
        except (ValueError, OSError):
            continue
        shutil.rmtree(folder, ignore_errors=True)
        removed += not folder.exists()
    return removed


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # exists, owned by someone else
    return True


def resolve_cache_dir(explicit: str | os.PathLike | None = None) -> Path:
    """``--cache-dir`` > ``TRITONWARM_CACHE_DIR`` > the folder a plain Triton process reads.

    That last one is Triton's own ``knobs.cache.dir``: the user's ``TRITON_CACHE_DIR`` when set (read,
    never written: vLLM #48806 overwrote it), else Triton's default (``~/.triton/cache``). So the
    default warm-up fills what the user's own Triton program reads, with no variable set.
    """
    for candidate in (explicit, os.environ.get("TRITONWARM_CACHE_DIR")):
        if candidate:
            return Path(candidate).expanduser().absolute()
    return triton_default_cache_dir()


def triton_default_cache_dir() -> Path:
    """The folder Triton in this process reads and writes: ``TRITON_CACHE_DIR``, else its default, as
    Triton itself says (``knobs.cache.dir`` on 3.4+, ``default_cache_dir()`` before)."""
    try:
        from triton import knobs

        folder = knobs.cache.dir
    except (ImportError, AttributeError):
        folder = os.environ.get("TRITON_CACHE_DIR")
        if not folder:
            try:
                from triton.runtime.cache import default_cache_dir

                folder = default_cache_dir()
            except ImportError:
                folder = os.path.join(os.environ.get("TRITON_HOME") or os.path.expanduser("~"), ".triton", "cache")
    return Path(folder).expanduser().absolute()


def old_default_cache_dir() -> Path:
    """Where tritonwarm warmed by default before it warmed Triton's own folder."""
    return Path(platformdirs.user_cache_dir("tritonwarm")) / "triton"


def old_default_note(explicit: str | os.PathLike | None = None) -> str | None:
    """One line for a user whose cache is still in tritonwarm's old default folder, when the folder
    chosen now is the new default (nothing named it) and that old folder holds warmed entries."""
    if explicit or os.environ.get("TRITONWARM_CACHE_DIR"):
        return None
    old, new = old_default_cache_dir(), triton_default_cache_dir()
    if old == new or not any((old / "tritonwarm").glob("manifest-*.json")):
        return None
    return (f"note: an earlier tritonwarm warmed {old}; Triton reads {new}: warm again, "
            f"or use that cache with --cache-dir {old} (serve it with TRITON_CACHE_DIR={old})")


def ensure_writable(cache_dir: Path) -> None:
    """Fail early, in one line, when the cache cannot take new entries (a read-only mount, say).

    Serving from such a cache works: Triton only reads it.
    """
    check_cache_dir(cache_dir, for_writing=True)
    folder = Path(cache_dir) / "tritonwarm"
    refuse_links_in_state(folder)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(dir=folder, prefix=".probe-")
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise CacheError(f"cannot warm into {cache_dir}: {e.strerror or e} (serving from it still works)") from None


def refuse_links_in_state(folder: Path) -> None:
    """tritonwarm opens its locks, manifests and staging folders in ``<cache>/tritonwarm/`` for writing
    (a lock file is created and truncated): a symbolic or hard link there, placed by whoever else can
    write the folder, would have them written at its target. Refuse it, in one line, before anything
    is opened; the folder itself, its entries and theirs are checked, without following a link."""
    def refuse(path: str, what: str):
        raise CacheError(f"{path} is {what}: tritonwarm writes its own state in {folder} and follows no link "
                         "there; remove it (or use another cache folder)")

    try:
        st = os.lstat(folder)
    except FileNotFoundError:
        return
    except OSError as e:
        raise CacheError(f"{folder}: {e.strerror or e}") from None
    if stat.S_ISLNK(st.st_mode):
        refuse(str(folder), "a symbolic link")
    if not stat.S_ISDIR(st.st_mode):
        refuse(str(folder), "not a folder")
    pending = [(str(folder), 0)]
    while pending:
        where, depth = pending.pop()
        try:
            with os.scandir(where) as found:
                for item in found:
                    if item.is_symlink():
                        refuse(item.path, "a symbolic link")
                    if item.is_dir(follow_symlinks=False):
                        if depth < 1 and not item.name.startswith(".install-"):  # locks/, plans/ ...
                            pending.append((item.path, depth + 1))
                    elif item.is_file(follow_symlinks=False) and _links(item) > 1:
                        refuse(item.path, "a hard link to another file")
        except FileNotFoundError:
            if where == str(folder):
                raise CacheError(f"{where}: removed while it was checked") from None
            # a scratch folder another warm-up removed between listing and reading: nothing to refuse
        except OSError as e:
            raise CacheError(f"{where}: {e.strerror or e}") from None


def _links(item: os.DirEntry) -> int:
    """How many names the file has; 0 for a file removed since it was listed (another process's
    manifest, probe or lock replaced or deleted in the meantime: nothing to refuse)."""
    try:
        return item.stat(follow_symlinks=False).st_nlink
    except FileNotFoundError:
        return 0


SERVE_AT_FILE = "serve-at.json"


def serve_at_of(cache_dir: Path) -> Path | None:
    """Where a server mounts this folder, when ``bundle install --serve-at`` filled it for another
    path than its own; None when it serves where it is. Triton here reads none of its entries then."""
    marker = Path(cache_dir) / "tritonwarm" / SERVE_AT_FILE
    try:
        at = json.loads(marker.read_text())["path"]
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as e:
        raise CacheError(f"{marker} is unreadable: {e.strerror or e}") from None
    except (ValueError, KeyError, TypeError):
        at = None
    if not isinstance(at, str) or not os.path.isabs(at):
        raise CacheError(f"{marker} is damaged (no absolute \"path\"): install the bundle again with --serve-at PATH")
    at = Path(os.path.normpath(at))
    return None if at == Path(cache_dir).absolute() else at


def record_serve_at(cache_dir: Path, at: Path | None, *, durable: bool = True) -> None:
    """Say where the server mounts this folder (None: where it is), before its groups are pointed there."""
    marker = Path(cache_dir) / "tritonwarm" / SERVE_AT_FILE
    if at is None:
        marker.unlink(missing_ok=True)
    else:
        write_json_atomic(marker, {"path": str(at)}, durable=durable)


def refuse_if_served_elsewhere(cache_dir: Path) -> None:
    """A compile here would rewrite the groups of the entries it finds missing to name this path, and
    the server that mounts the folder elsewhere would miss them: warm where it serves."""
    at = serve_at_of(cache_dir)
    if at is not None:
        raise CacheError(f"{cache_dir} is installed for a server that mounts it at {at} (bundle install --serve-at): "
                         "Triton here reads none of its entries, and compiling here would point them back here: "
                         f"warm where it is served (TRITON_CACHE_DIR={at}), or into another folder")


def entry_path(cache_dir: Path, entry_dir: str) -> Path:
    return Path(cache_dir) / entry_dir


def entry_files(cache_dir: Path, entry_dir: str, kernel_name: str,
                serve_at: Path | None = None) -> dict[str, str] | None:
    """The files of a complete Triton entry (its ``__grp__`` group), or None: the runtime's view.

    Mirrors ``FileCacheManager.get_group``: a missing or damaged group file, or a group naming a
    file that does not exist, reads as a miss. A folder that exists but cannot be read raises
    ``UnreadableEntry`` naming it: that is a permission or disk problem, not a missing variant.
    ``serve_at``: the view of a server that mounts ``cache_dir`` there; the group must name its
    files there, and they are looked for here.
    """
    group = entry_path(cache_dir, entry_dir) / f"__grp__{kernel_name[:150]}.json"
    try:
        children = json.loads(group.read_text())["child_paths"]
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as e:
        raise UnreadableEntry(f"entry {group.parent} is unreadable: {e.strerror or e}") from None
    except (ValueError, KeyError, TypeError):
        return None
    if not isinstance(children, dict):
        return None
    if serve_at is not None:
        children = _as_mounted(children, Path(serve_at) / entry_dir, entry_path(cache_dir, entry_dir))
    if children is None or not all(os.path.exists(p) for p in children.values()):
        return None
    return children


def complete_group(entry_folder: str, filename: str) -> dict[str, str] | None:
    """A cache manager's view of one entry's group (``__grp__<filename>``): its files when every one
    exists, else None (Triton 3.6 would hand over a partial group). Nothing raises: inside Triton's
    lookup any failure is a miss, and Triton compiles."""
    try:
        with open(os.path.join(entry_folder, "__grp__" + filename)) as f:
            children = json.load(f)["child_paths"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not isinstance(children, dict) or not all(isinstance(p, str) and os.path.exists(p) for p in children.values()):
        return None
    return children


def _as_mounted(children: dict, served: Path, here: Path) -> dict[str, str] | None:
    """A group's paths under ``served`` (the entry as the server mounts it) as paths ``here``; None
    when one names another folder, which that server would not find."""
    if not all(isinstance(p, str) and Path(p).parent == served for p in children.values()):
        return None
    return {name: str(here / Path(p).name) for name, p in children.items()}


def foreign_group_folder(cache_dir: Path, entry_dir: str, kernel_name: str,
                         serve_at: Path | None = None, *, by_path: bool = False) -> str | None:
    """The folder an entry's ``__grp__`` file names its files in, when that is not the entry's own
    folder (at ``serve_at``, where given): a cache copied or mounted at another path (Triton writes
    absolute paths there). ``by_path``: also the entry's own folder named by another path (a symbolic
    link, a bind mount), which a server that sees only ``cache_dir`` cannot follow."""
    here = entry_path(cache_dir, entry_dir)
    try:
        children = json.loads((here / f"__grp__{kernel_name[:150]}.json").read_text())["child_paths"]
        folders = {os.path.dirname(p) for p in children.values()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    if serve_at is not None or by_path:  # a path on the server: compared as written
        at = Path(os.path.normpath(Path(serve_at or cache_dir).absolute() / entry_dir))
        foreign = sorted(f for f in folders if Path(os.path.normpath(f)) != at)
    else:
        foreign = sorted(f for f in folders if Path(f) != here and Path(f).resolve() != here.resolve())
    return foreign[0] if foreign else None


def file_sha256(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


@contextlib.contextmanager
def variant_lock(cache_dir: Path, cache_hash: str):
    """One compile per key across processes: Triton itself takes no lock (Triton #2688)."""
    locks = Path(cache_dir) / "tritonwarm" / "locks"
    locks.mkdir(parents=True, exist_ok=True)
    with FileLock(str(locks / f"{cache_hash[:32]}.lock"), timeout=LOCK_TIMEOUT_S):
        yield


_umask_lock = threading.Lock()


def file_mode() -> int:
    """The mode a plain ``open()`` would give a new file: 0o666 less the process umask.

    ``mkstemp`` creates files 0600, which would lock the account a server runs under out of a
    shared cache's manifest; the atomic writers below give their files this mode instead.
    """
    with _umask_lock:
        umask = os.umask(0o022)
        os.umask(umask)
    return 0o666 & ~umask


def write_json_atomic(path: Path, data: Any, *, indent: int | None = None, durable: bool = False) -> None:
    """Write ``data`` as JSON to ``path`` all at once: readers see the old file or the new one.

    A temporary file in the same folder is renamed over ``path``; ``durable`` also fsyncs it first.
    """
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}-", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=indent)
            f.flush()
            if durable:
                os.fsync(f.fileno())
        os.chmod(tmp, file_mode())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
