"""The warmed folder served whatever ``TRITON_CACHE_DIR`` says, for engines that set it themselves.

torch.compile's Inductor points ``TRITON_CACHE_DIR`` at its own folder when the variable is unset
(set it, and Inductor leaves it). SGLang, and vLLM before 0.33, set it always, to a folder of their
compile cache, before the model's kernels launch: no value the serving environment gives reaches
Triton. Both leave ``TRITON_CACHE_MANAGER`` alone, and Triton resolves that class at every lookup::

    TRITON_CACHE_MANAGER=tritonwarm.jit.cache.warmed:WarmedCacheManager
    TRITONWARM_CACHE_DIR=/opt/triton-cache

``WarmedCacheManager`` is Triton's ``FileCacheManager`` reading the warmed folder
(``TRITONWARM_CACHE_DIR``, the folder tritonwarm's own commands use) first: an entry whose group is
complete there, a file that is there. Whatever it lacks is looked up, and everything Triton writes
goes, where ``TRITON_CACHE_DIR`` says, as with Triton's own manager; the warmed folder is never
written (it may be read-only). Without ``TRITONWARM_CACHE_DIR`` it is Triton's own manager, unchanged.
"""

from __future__ import annotations

import os
from pathlib import Path

from triton import knobs
from triton.runtime.cache import FileCacheManager

from .layout import complete_group

WARMED_ENV = "TRITONWARM_CACHE_DIR"
MANAGER = "tritonwarm.jit.cache.warmed:WarmedCacheManager"


class WarmedCacheManager(FileCacheManager):
    """``TRITONWARM_CACHE_DIR`` read first; the rest, and every write, where Triton's own manager goes."""

    def __init__(self, key, override=False, dump=False):
        warmed = os.environ.get(WARMED_ENV)
        self.warmed_dir = None
        if override or dump or not warmed or not knobs.cache.dir or _same(warmed, knobs.cache.dir):
            super().__init__(key, override=override, dump=dump)
            return
        self.key = key
        self.warmed_dir = os.path.join(os.path.abspath(os.path.expanduser(warmed)), key)
        self.cache_dir = os.path.join(knobs.cache.dir, key)  # where Triton's own manager reads and writes
        self.lock_path = os.path.join(self.cache_dir, "lock")  # (its folder is made at the first write)

    def get_file(self, filename):
        if self.warmed_dir is not None and os.path.exists(os.path.join(self.warmed_dir, filename)):
            return os.path.join(self.warmed_dir, filename)
        return super().get_file(filename)

    def get_group(self, filename):
        if self.warmed_dir is None:
            return super().get_group(filename)
        return complete_group(self.warmed_dir, filename) or complete_group(self.cache_dir, filename)

    def put(self, data, filename, binary=True):
        os.makedirs(self.cache_dir, exist_ok=True)
        return super().put(data, filename, binary=binary)


def _same(a: str, b: str) -> bool:
    return Path(a).expanduser().absolute() == Path(b).expanduser().absolute()


def warmed_folder_in_force() -> Path | None:
    """The folder Triton in this process reads first: ``TRITONWARM_CACHE_DIR`` under ``WarmedCacheManager``
    (or a subclass) named by ``TRITON_CACHE_MANAGER``; None otherwise (Triton reads ``TRITON_CACHE_DIR``)."""
    warmed = os.environ.get(WARMED_ENV)
    if not warmed:
        return None
    try:
        manager = knobs.cache.manager_class
    except Exception:  # one that does not import is reported as such elsewhere
        return None
    if isinstance(manager, type) and issubclass(manager, WarmedCacheManager):
        return Path(warmed).expanduser().absolute()
    return None
