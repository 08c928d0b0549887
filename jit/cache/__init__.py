"""The warm-up cache: Triton's own entries plus what tritonwarm records beside them.

- ``layout``: the cache directory, entry folders, per-key locks;
- ``manifest``: what was warmed, per target;
- ``env``: the environment entries depend on;
- ``plans``: the plan store;
- ``prune``: disk use and removal.
"""

from .env import cache_env, triton_version
from .layout import (
    CacheError,
    ensure_writable,
    entry_dir,
    entry_files,
    file_sha256,
    resolve_cache_dir,
    variant_lock,
)
from .manifest import MANIFEST_FORMAT, Manifest, files_match_record, manifests
from .plans import PlanStore, code_fingerprint

__all__ = [
    "CacheError", "MANIFEST_FORMAT", "Manifest", "PlanStore", "cache_env", "code_fingerprint", "ensure_writable",
    "entry_dir", "entry_files", "file_sha256", "files_match_record", "manifests", "resolve_cache_dir", "triton_version", "variant_lock",
]
