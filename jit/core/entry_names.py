"""The folder Triton names an entry after: a leaf module, so cache code that only reads folders
imports neither torch nor the tracer."""

from __future__ import annotations

import base64


def entry_dir_name(cache_hash: str) -> str:
    """The entry folder Triton names after its disk-cache hash (base32, as ``FileCacheManager`` does)."""
    return base64.b32encode(bytes.fromhex(cache_hash)).decode().rstrip("=")
