"""The fleet key: an HMAC-SHA256 secret that every writer and reader of the shared cache holds.

Redis content is otherwise unauthenticated: whoever can write to the server can pair an entry's
metadata with another variant's binary, and every hash still agrees. With a key, what a writer
pushes carries a MAC that binds the entry's cache key and file name to the bytes' sha256 (for an
entry's group: to every child's sha256); a reader refuses what does not verify. A shared secret,
not a signature, because every serving process is a writer too: what it compiles after a miss is
pushed, so each would need the signing key anyway (docs/fleet-cache.md).

The key is found in ``TRITONWARM_REDIS_KEY`` (the secret itself) or in the file that
``TRITONWARM_REDIS_KEY_FILE`` names, beside ``TRITONWARM_REDIS_URL``; at least 32 characters, e.g.
``openssl rand -hex 32``.
"""

from __future__ import annotations

import hashlib
import hmac
import os
from dataclasses import dataclass

from ...errors import clipped
from .layout import CacheError

KEY_ENV = "TRITONWARM_REDIS_KEY"
KEY_FILE_ENV = "TRITONWARM_REDIS_KEY_FILE"
MIN_KEY_CHARS = 32
_MAX_KEY_FILE = 4096
SCHEME = "hmac-sha256"
_DOMAIN = b"tritonwarm fleet cache v1"  # a MAC made for this purpose only


class FleetKeyError(CacheError):
    """A key that cannot be used: both variables set, an unreadable file, too short."""


@dataclass(frozen=True)
class FleetKey:
    secret: bytes
    where: str  # which variable or file it came from, for messages

    @property
    def key_id(self) -> str:
        """A short public name of the key, so that a MAC made with another key says so."""
        return hashlib.sha256(_DOMAIN + b" key id\0" + self.secret).hexdigest()[:12]

    def tag(self, entry: str, name: str, digest: str) -> str:
        """The MAC binding ``entry`` (Triton's cache key folder), the file ``name`` and its sha256."""
        message = b"\0".join([_DOMAIN, entry.encode(), name.encode(), digest.encode()])
        return f"{SCHEME}:{self.key_id}:{hmac.new(self.secret, message, hashlib.sha256).hexdigest()}"

    def problem(self, tag, entry: str, name: str, digest: str) -> str | None:
        """Why ``tag`` does not vouch for this file of this entry; None when it does."""
        if tag is None:
            return "not signed with the fleet key (no MAC: pushed without a key)"
        if isinstance(tag, bytes):
            tag = tag.decode("ascii", "replace")
        if not isinstance(tag, str) or tag.count(":") != 2 or not tag.startswith(SCHEME + ":"):
            return f"its MAC {clipped(str(tag), 40)!r} is not {SCHEME}:<key id>:<hex>"
        key_id = tag.split(":")[1]
        if key_id != self.key_id:
            return f"signed with another fleet key (key id {clipped(key_id, 16)}; this one is {self.key_id})"
        if not hmac.compare_digest(tag, self.tag(entry, name, digest)):
            return "its MAC does not verify with the fleet key (changed after it was pushed)"
        return None


def fleet_key() -> FleetKey | None:
    """The key this process's environment names, or None (Redis content then goes unauthenticated)."""
    value, file = os.environ.get(KEY_ENV), os.environ.get(KEY_FILE_ENV)
    if value and file:
        raise FleetKeyError(f"both {KEY_ENV} and {KEY_FILE_ENV} are set: give the fleet key once")
    if file:
        try:
            with open(file, "rb") as f:
                data = f.read(_MAX_KEY_FILE + 1)
        except OSError as e:
            raise FleetKeyError(f"{KEY_FILE_ENV}={clipped(file, 200)}: cannot read the fleet key: "
                                f"{e.strerror or e}") from None
        if len(data) > _MAX_KEY_FILE:
            raise FleetKeyError(f"{KEY_FILE_ENV}={clipped(file, 200)}: over {_MAX_KEY_FILE} bytes; not a key file")
        return _checked(data.strip(), f"{KEY_FILE_ENV}={clipped(file, 200)}")
    if value:
        return _checked(value.strip().encode(), KEY_ENV)
    return None


def _checked(secret: bytes, where: str) -> FleetKey:
    if len(secret) < MIN_KEY_CHARS:
        raise FleetKeyError(f"{where}: the fleet key has {len(secret)} characters, fewer than {MIN_KEY_CHARS} "
                            "(make one with: openssl rand -hex 32)")
    return FleetKey(secret, where)


__all__ = ["FleetKey", "FleetKeyError", "KEY_ENV", "KEY_FILE_ENV", "MIN_KEY_CHARS", "fleet_key"]
