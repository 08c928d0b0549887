"""The warm-up cache: Triton's own entries plus what tritonwarm records beside them.

- ``layout``: the cache directory, entry folders, per-key locks;
- ``manifest``: what was warmed, per target;
- ``env``: the environment entries depend on;
- ``plans``: the plan store;
- ``remote`` / ``overlay``: cache managers a server names in ``TRITON_CACHE_MANAGER`` (a fleet's
  Redis; a read-only warmed folder with a writable overlay);
- ``fleet_key`` / ``binary``: what a reader of Redis checks beyond hashes (a fleet key's MAC; the
  binary against its metadata);
- ``prune``: disk use and removal.
"""

from .env import cache_env, triton_version
from .layout import (
    CacheError,
    UnreadableEntry,
    check_cache_dir,
    disk_full,
    ensure_writable,
    entry_dir_name,
    entry_files,
    entry_path,
    file_sha256,
    refuse_if_served_elsewhere,
    remove_stale_temporaries,
    resolve_cache_dir,
    serve_at_of,
    variant_lock,
)
from .manifest import MANIFEST_FORMAT, Manifest, ManifestDamaged, files_match_record, manifests
from .plans import PlanStore, code_fingerprint

__all__ = [
    "CacheError", "MANIFEST_FORMAT", "Manifest", "ManifestDamaged", "PlanStore", "UnreadableEntry", "cache_env",
    "check_cache_dir", "code_fingerprint", "disk_full", "ensure_writable", "entry_dir_name", "entry_files",
    "entry_path", "file_sha256", "files_match_record", "manifests", "refuse_if_served_elsewhere",
    "remove_stale_temporaries", "resolve_cache_dir", "serve_at_of", "triton_version", "variant_lock",
]
