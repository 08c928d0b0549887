"""The folder this process's Triton reads its cache from: pointed elsewhere for a block, asked where it
is, read as a server that mounts it at another path reads it."""

from __future__ import annotations

import contextlib
import os
import threading
from pathlib import Path

from triton import knobs

_open_blocks: list[tuple[object, str]] = []  # (block, folder) of each open ``triton_cache_dir``, oldest first
_before: dict[str, str | None] = {}  # the knob's own value and TRITON_CACHE_DIR before the first block
_blocks_lock = threading.Lock()


@contextlib.contextmanager
def triton_cache_dir(path):
    """Point this process's Triton at ``path`` for the block (Triton's knob also sets
    ``TRITON_CACHE_DIR`` meanwhile); both are as they were once no block is open.

    Blocks overlap across threads (a warm-up per target, each in its own) and close in any order:
    Triton's own ``knobs.cache.scope()`` restores what it saw at entry, so a block closing last would
    leave another's folder set for the rest of the process. Here the folder is the newest open
    block's, and the process's own settings come back when the last one closes."""
    if path is None:
        yield
        return
    block = object()
    with _blocks_lock:
        if not _open_blocks:
            _before.update(knob=knobs.cache.__dict__.get("dir"), env=os.environ.get("TRITON_CACHE_DIR"))
        _open_blocks.append((block, str(path)))
        knobs.cache.dir = str(path)
    try:
        yield
    finally:
        with _blocks_lock:
            _open_blocks[:] = [(b, folder) for b, folder in _open_blocks if b is not block]
            if _open_blocks:
                knobs.cache.dir = _open_blocks[-1][1]
            else:
                _restore(_before["knob"], _before["env"])


@contextlib.contextmanager
def groups_read_as_served(cache_dir, serve_at):
    """Triton's cache lookups in this process read ``cache_dir`` as a server that mounts it at
    ``serve_at`` does: a group naming its files there finds them here. A check of a volume filled
    for another mount path (``bundle install --serve-at``) reads its entries back to look up their C
    launchers; without this Triton would miss them, compile them again (or fetch them, through a
    fleet's cache manager) and point their groups here. The manager class in use is answered too."""
    if serve_at is None:
        yield
        return
    from triton.runtime.cache import FileCacheManager

    from .layout import entry_files

    folder = Path(cache_dir).absolute()

    def reading_as_served(original):
        def get_group(self, filename):
            entry = getattr(self, "cache_dir", None)
            if entry is None or Path(entry).parent != folder or not filename.endswith(".json"):
                return original(self, filename)
            return entry_files(folder, Path(entry).name, filename[:-len(".json")], serve_at)
        return get_group

    classes = [FileCacheManager] + [c for c in [knobs.cache.manager_class] if c not in (None, FileCacheManager)]
    originals = [(cls, cls.get_group, cls.__dict__.get("get_group")) for cls in classes]
    for cls, original, _ in originals:
        cls.get_group = reading_as_served(original)
    try:
        yield
    finally:
        for cls, _, own in reversed(originals):
            if own is None:  # inherited: the class's own name goes again
                del cls.get_group
            else:
                cls.get_group = own


def _restore(knob: str | None, env: str | None) -> None:
    if knob is None:
        del knobs.cache.dir  # unset: Triton follows TRITON_CACHE_DIR, or its default
    else:
        knobs.cache.dir = knob
    if env is None:
        os.environ.pop("TRITON_CACHE_DIR", None)
    else:
        os.environ["TRITON_CACHE_DIR"] = env


def triton_reads_instead(cache_dir) -> Path | None:
    """The folder this process's Triton reads its cache from (``TRITON_CACHE_DIR``, or its default),
    when that is not ``cache_dir``: a cache warmed there is then never read."""
    read = Path(knobs.cache.dir).expanduser().resolve()
    return None if read == Path(cache_dir).expanduser().resolve() else read
