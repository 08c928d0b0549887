"""A warmed cache mounted read-only, with a writable folder for whatever serving compiles.

Triton writes every kernel it compiles into ``TRITON_CACHE_DIR``, and it creates an entry's folder
before it even looks inside it: on a read-only mount (a read-only root file system, a volume a fleet
shares) the first launch of any kernel the warmed cache lacks fails with ``OSError: [Errno 30]``
instead of compiling. That is every kernel ``torch.compile`` generates, another package's kernels,
a class no spec warmed. Two environment variables keep the mount read-only and let those compile::

    TRITON_CACHE_MANAGER=tritonwarm.jit.cache.overlay:OverlayCacheManager
    TRITONWARM_OVERLAY_DIR=/tmp/triton-overlay

``OverlayCacheManager`` is Triton's ``FileCacheManager`` reading the warmed folder first (an entry
whose group is complete there, a file that is there) and the overlay next; everything it writes goes
to the overlay, never to the warmed folder. Without ``TRITONWARM_OVERLAY_DIR`` it is Triton's own
manager, unchanged.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from triton import knobs
from triton.runtime.cache import FileCacheManager, RemoteCacheManager

from .layout import CacheError, complete_group

OVERLAY_ENV = "TRITONWARM_OVERLAY_DIR"


_owned: set[str] = set()  # overlay folders checked in this process


def refuse_unless_own_folder(folder: str) -> None:
    """The overlay is read as well as written: a folder another local account made (under ``/tmp``,
    say) would hand this server the entries it planted. It must be this account's own folder, not a
    link, and writable by no one else; it is made so (0755) when it does not exist yet (the first write)."""
    try:
        os.makedirs(folder, mode=0o755, exist_ok=True)
        st = os.lstat(folder)
    except OSError as e:
        raise CacheError(f"{OVERLAY_ENV}={folder}: {e.strerror or e}") from None
    why = ("is a symbolic link" if stat.S_ISLNK(st.st_mode) else "is not a folder" if not stat.S_ISDIR(st.st_mode)
           else f"belongs to uid {st.st_uid}, not to this account (uid {os.geteuid()})" if st.st_uid != os.geteuid()
           else f"is writable by {'its group' if st.st_mode & 0o020 else 'others'} (mode {st.st_mode & 0o777:o})"
           if st.st_mode & 0o022 else None)
    if why:
        raise CacheError(f"{OVERLAY_ENV}={folder} {why}: the overlay's entries are loaded as they are, so it must "
                         "be this serving account's own folder, writable by no one else: refused")


class OverlayCacheManager(FileCacheManager):
    """The warmed folder (``TRITON_CACHE_DIR``) read first; writes to ``TRITONWARM_OVERLAY_DIR``."""

    def __init__(self, key, override=False, dump=False):
        overlay = os.environ.get(OVERLAY_ENV)
        self.warmed_dir = None
        if override or dump or not overlay or not knobs.cache.dir:
            super().__init__(key, override=override, dump=dump)
            return
        self.key = key
        self.warmed_dir = os.path.join(knobs.cache.dir, key)
        self.overlay = os.path.abspath(overlay)
        self._trusted(create=False)  # a folder another account prepared is refused at the first lookup
        self.cache_dir = os.path.join(self.overlay, key)  # Triton's name for where it writes
        self.lock_path = os.path.join(self.cache_dir, "lock")

    def _trusted(self, *, create: bool) -> bool:
        """Whether the overlay folder exists and is this account's own (checked once a process); it
        is made when ``create`` (the first write) and refused when another account's or open."""
        if self.overlay in _owned:
            return True
        if not create and not os.path.lexists(self.overlay):
            return False
        refuse_unless_own_folder(self.overlay)
        _owned.add(self.overlay)
        return True

    def get_file(self, filename):
        if self.warmed_dir is not None and os.path.exists(os.path.join(self.warmed_dir, filename)):
            return os.path.join(self.warmed_dir, filename)
        if self.warmed_dir is not None and not self._trusted(create=False):
            return None
        return super().get_file(filename)

    def get_group(self, filename):
        if self.warmed_dir is None:
            return super().get_group(filename)
        return self.local_group(filename)

    def local_group(self, filename: str) -> dict[str, str] | None:
        """A complete group from the warmed folder, else from where this manager writes; None when
        neither has one (Triton 3.6's own lookup would hand over a partial group)."""
        overlay = self.cache_dir if self.warmed_dir is None or self._trusted(create=False) else None
        for folder in (self.warmed_dir, overlay):
            group = complete_group(folder, filename) if folder else None
            if group is not None:
                return group
        return None

    def put(self, data, filename, binary=True):
        if self.warmed_dir is not None:
            self._trusted(create=True)
        os.makedirs(self.cache_dir, exist_ok=True)  # the overlay's folder, made when it is first written
        return super().put(data, filename, binary=binary)


def overlay_in_force() -> Path | None:
    """Where Triton in this process writes what it compiles, when that is not the cache folder: the
    overlay, under ``OverlayCacheManager`` with ``TRITONWARM_OVERLAY_DIR`` set; else None."""
    overlay = os.environ.get(OVERLAY_ENV)
    return Path(overlay).absolute() if overlay and _manager_is(OverlayCacheManager) else None


def refuse_if_overlaid(cache_dir: Path) -> None:
    """Filling ``cache_dir`` (a warm-up, C launchers, tuned winners) under the overlay would write into
    the overlay instead, and the cache would lack it all."""
    overlay = overlay_in_force()
    if overlay is not None:
        raise CacheError(f"{OVERLAY_ENV}={overlay} is set with the overlay cache manager: Triton would write what "
                         f"this compiles there, not into {cache_dir}: unset {OVERLAY_ENV} for this command")


def misses_fail_here(cache_dir: Path) -> str | None:
    """Why a kernel the cache lacks would fail its first launch here instead of compiling (Triton
    writes into the folder it reads, and this process cannot write to it), or None."""
    if not Path(cache_dir).is_dir() or os.access(cache_dir, os.W_OK):
        return None
    if _manager_is(RemoteCacheManager):
        return (f"this process cannot write to {cache_dir}, and Triton's RemoteCacheManager writes every entry it "
                "reads into this folder: every lookup fails (OSError), hit or miss: serve with TRITON_CACHE_MANAGER="
                f"tritonwarm.jit.cache.remote:RedisCacheManager and {OVERLAY_ENV}=<a writable folder>")
    overlay = overlay_in_force()
    if overlay is not None:
        if _writable(overlay):
            return None
        return (f"{OVERLAY_ENV}={overlay} cannot be written either: Triton's first launch of a kernel the cache lacks "
                "fails (OSError): point it at a writable folder")
    return (f"this process cannot write to {cache_dir} (read-only, or another owner's): Triton's first launch of a "
            "kernel it lacks fails (OSError) instead of compiling: a class no spec warmed, a kernel of torch.compile "
            "or of another package: serve with TRITON_CACHE_MANAGER=tritonwarm.jit.cache.overlay:OverlayCacheManager "
            f"and {OVERLAY_ENV}=<a writable folder>")


def _manager_is(base: type) -> bool:
    """Whether ``TRITON_CACHE_MANAGER`` names ``base`` or a subclass of it (one that does not import
    names nothing: it is reported as such elsewhere)."""
    try:
        manager = knobs.cache.manager_class
    except Exception:
        return False
    return isinstance(manager, type) and issubclass(manager, base)


def _writable(folder: Path) -> bool:
    """Whether this process can create files in ``folder``, or create it (its nearest existing parent)."""
    while not folder.exists() and folder.parent != folder:
        folder = folder.parent
    return folder.is_dir() and os.access(folder, os.W_OK)
