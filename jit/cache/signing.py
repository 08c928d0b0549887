"""Signed bundles, in minisign's format, so any minisign verifies what tritonwarm signs and back.

A signature is minisign's prehashed Ed25519 (``ED``): the key signs the BLAKE2b-512 digest of the
archive, then signs that signature together with a *trusted comment*. tritonwarm's trusted comment
names the archive's sha256, the digest of the environment fingerprint the bundle was warmed for, the
name it is published under (an image's tag or repository, a file's name) and its targets, so a valid
signature binds them all: the archive cannot be swapped, its header cannot claim another environment,
and it cannot be installed under another name (a tag swapped in a registry) or for other targets. Its
timestamp refuses rollbacks: ``--not-older-than DATE``, and a minimum per name recorded where it was
installed (as TUF's clients record the latest version they trusted). The signature file sits beside the archive
(``warm.tar.gz.minisig``), as minisign expects it. Verification needs no parsing of the archive: the
signature is checked over its bytes first, the header is read only after that.

Key files are minisign's: ``keygen`` writes an unencrypted secret key (as ``minisign -G -W``), and
encrypted minisign keys are read with their password (scrypt, as minisign derives it).
"""

from __future__ import annotations

import base64
import getpass
import hashlib
import json
import os
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from .bundle import BundleError

SIGNATURE_SUFFIX = ".minisig"
COMMENT_KIND = "tritonwarm-bundle"
_MAX_FILE = 64 << 10  # key and signature files are a few hundred bytes
_SECRET_LEN = 158  # alg(2) kdf(2) chk(2) salt(32) ops(8) mem(8) key id(8) secret(64) checksum(32)
_B64 = re.compile(r"[A-Za-z0-9+/]+={0,2}")


class SignatureError(BundleError):
    """A signature, key or signed bundle that is refused: one line naming the file and why."""


def _ed25519():
    try:
        from cryptography.hazmat.primitives.asymmetric import ed25519
    except ImportError:
        raise SignatureError("signing and verifying bundles needs the 'cryptography' package: "
                             "pip install 'tritonwarm[sign]'") from None
    return ed25519


@dataclass(frozen=True)
class PublicKey:
    key_id: bytes  # 8 bytes, as minisign stores them (it prints them little-endian)
    key: bytes  # 32

    @property
    def id_text(self) -> str:
        return self.key_id[::-1].hex().upper()

    def line(self) -> str:
        return base64.b64encode(b"Ed" + self.key_id + self.key).decode()


@dataclass(frozen=True)
class SecretKey:
    key_id: bytes
    secret: bytes  # 64: Ed25519 seed + public key, as libsodium keeps it

    @property
    def public(self) -> PublicKey:
        return PublicKey(self.key_id, self.secret[32:])


def _read_small(path: Path, what: str) -> list[str]:
    try:
        with open(path, "rb") as f:
            data = f.read(_MAX_FILE + 1)
    except OSError as e:
        raise SignatureError(f"{path}: cannot read the {what}: {e.strerror or e}") from None
    if len(data) > _MAX_FILE:
        raise SignatureError(f"{path}: not a minisign {what} (over {_MAX_FILE} bytes)")
    try:
        return data.decode("utf-8").splitlines()
    except UnicodeDecodeError:
        raise SignatureError(f"{path}: not a minisign {what} (not text)") from None


def _b64(text: str, length: int | None, where: str) -> bytes:
    text = text.strip()
    if not _B64.fullmatch(text):
        raise SignatureError(f"{where}: not base64")
    try:
        data = base64.b64decode(text, validate=True)
    except ValueError:
        raise SignatureError(f"{where}: not base64") from None
    if length is not None and len(data) != length:
        raise SignatureError(f"{where}: {len(data)} bytes where minisign writes {length}")
    return data


def read_public_key(spec: str | os.PathLike) -> PublicKey:
    """A minisign public key file, or the key itself (the base64 line ``minisign -P`` takes)."""
    path = Path(spec)
    text = str(spec)
    if path.exists() or len(text) != 56 or not _B64.fullmatch(text):  # 56: the base64 of a 42-byte key
        lines = [line for line in _read_small(path, "public key") if line.strip()]
        if len(lines) == 2 and lines[0].startswith("untrusted comment:"):
            text = lines[1]
        elif len(lines) == 1:
            text = lines[0]
        else:
            raise SignatureError(f"{path}: not a minisign public key (an 'untrusted comment:' line, then the key)")
        where = f"{path}: public key"
    else:
        where = "public key"
    data = _b64(text, 42, where)
    if data[:2] != b"Ed":
        raise SignatureError(f"{where}: algorithm {data[:2]!r} is not Ed25519 ('Ed')")
    return PublicKey(data[2:10], data[10:])


def read_secret_key(path: str | os.PathLike, password: str | None = None) -> SecretKey:
    """A minisign secret key; an encrypted one is decrypted with ``password`` (asked for when None)."""
    path = Path(path)
    lines = [line for line in _read_small(path, "secret key") if line.strip()]
    if len(lines) != 2 or not lines[0].startswith("untrusted comment:"):
        raise SignatureError(f"{path}: not a minisign secret key (an 'untrusted comment:' line, then the key)")
    data = _b64(lines[1], _SECRET_LEN, f"{path}: secret key")
    alg, kdf, chk = data[:2], data[2:4], data[4:6]
    if alg != b"Ed" or chk != b"B2":
        raise SignatureError(f"{path}: secret key algorithms {alg!r}/{chk!r} are not minisign's Ed25519/BLAKE2b")
    keynum = data[54:158]
    if kdf == b"Sc":
        if password is None:
            password = _ask_password(path)
        stream = _scrypt(password, data[6:38], int.from_bytes(data[38:46], "little"),
                         int.from_bytes(data[46:54], "little"), path)
        keynum = bytes(a ^ b for a, b in zip(keynum, stream, strict=True))
    elif kdf != b"\0\0":
        raise SignatureError(f"{path}: secret key encryption {kdf!r} is not minisign's scrypt ('Sc') or none")
    key_id, secret, checksum = keynum[:8], keynum[8:72], keynum[72:]
    expected = hashlib.blake2b(alg + key_id + secret, digest_size=32).digest()
    if checksum != expected and not (kdf == b"\0\0" and checksum == bytes(32)):
        raise SignatureError(f"{path}: the secret key does not check out: " +
                             ("wrong password" if kdf == b"Sc" else "damaged"))
    seed_public = _ed25519().Ed25519PrivateKey.from_private_bytes(secret[:32]).public_key().public_bytes_raw()
    if seed_public != secret[32:]:
        raise SignatureError(f"{path}: the secret key is damaged (its two halves do not match)")
    return SecretKey(key_id, secret)


def _ask_password(path: Path) -> str:
    prompt = f"Password for {path}: "
    if sys.stdin is not None and sys.stdin.isatty():
        return getpass.getpass(prompt)
    line = sys.stdin.readline() if sys.stdin is not None else ""
    if not line:
        raise SignatureError(f"{path}: the secret key is encrypted: give its password (--password-file, or on stdin)")
    return line.rstrip("\r\n")


def _scrypt(password: str, salt: bytes, opslimit: int, memlimit: int, path: Path) -> bytes:
    """The 104-byte stream minisign XORs its secret key with: libsodium's scryptsalsa208sha256 with the
    N, r, p it picks from the stored limits."""
    opslimit, r = max(opslimit, 32768), 8
    if opslimit < memlimit // 32:
        p, max_n = 1, opslimit // (r * 4)
    else:
        max_n = memlimit // (r * 128)
    log_n = 1
    while log_n < 63 and (1 << log_n) <= max_n // 2:
        log_n += 1
    if opslimit >= memlimit // 32:
        p = min((opslimit // 4) // (1 << log_n), 0x3FFFFFFF) // r
    # minisign's own keys use N=2^20, p=1 (1 GiB); refuse what would take hours, or need 2 GiB, which
    # Python's scrypt cannot be given
    if log_n > 20 or p > 16:
        raise SignatureError(f"{path}: the secret key's scrypt limits (N=2^{log_n}, p={p}) are beyond minisign's")
    memory = 128 * r * ((1 << log_n) + p + 2) + (64 << 20)  # at most 1 GiB and 64 MiB
    return hashlib.scrypt(password.encode(), salt=salt, n=1 << log_n, r=r, p=p, maxmem=memory, dklen=104)


def generate(secret_path: Path, public_path: Path) -> PublicKey:
    """A new key pair as ``minisign -G -W`` writes it (secret key unencrypted, mode 0600)."""
    ed = _ed25519()
    secret_path, public_path = Path(secret_path), Path(public_path)
    for path in (secret_path, public_path):
        if path.exists():
            raise SignatureError(f"{path} exists; refusing to overwrite a key")
    private = ed.Ed25519PrivateKey.generate()
    seed = private.private_bytes_raw()
    key_id = os.urandom(8)
    secret = seed + private.public_key().public_bytes_raw()
    checksum = hashlib.blake2b(b"Ed" + key_id + secret, digest_size=32).digest()
    blob = b"Ed" + b"\0\0" + b"B2" + bytes(32 + 8 + 8) + key_id + secret + checksum
    public = SecretKey(key_id, secret).public
    fd = os.open(secret_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(f"untrusted comment: tritonwarm secret key {public.id_text}\n{base64.b64encode(blob).decode()}\n")
    public_path.write_text(f"untrusted comment: minisign public key {public.id_text}\n{public.line()}\n")
    return public


# ------------------------------------------------------------------------------------------- signatures


def digests(path: Path) -> tuple[bytes, str]:
    """``(BLAKE2b-512, sha256 hex)`` of a file, in one pass: what minisign signs, what the comment names."""
    blake, sha = hashlib.blake2b(digest_size=64), hashlib.sha256()
    try:
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                blake.update(chunk)
                sha.update(chunk)
    except OSError as e:
        raise SignatureError(f"{path}: {e.strerror or e}") from None
    return blake.digest(), sha.hexdigest()


def fingerprint_digest(fingerprint: dict) -> str:
    """The digest of an environment fingerprint as a bundle's header records it (canonical JSON)."""
    canonical = json.dumps(fingerprint, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return "sha256:" + hashlib.sha256(canonical.encode()).hexdigest()


_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.:/@+\-]{0,255}")  # an image reference, a tag or a file name


def check_name(name: str, where: str = "--name") -> str:
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise SignatureError(f"{where} {str(name)[:80]!r} is not a name a bundle is published under (letters, digits, "
                             "and . _ - : / @ +, at most 256)")
    return name


def trusted_comment(archive_sha256: str, fingerprint: dict, entries: int, name: str, targets,
                    name_from: str = "--name") -> str:
    """What tritonwarm's signatures vouch for beyond the archive's bytes (one line, tab-separated)."""
    return "\t".join([COMMENT_KIND, f"sha256:{archive_sha256}", f"fingerprint:{fingerprint_digest(fingerprint)}",
                      f"entries:{entries}", f"name:{check_name(name, name_from)}",
                      f"targets:{','.join(sorted(targets))}", f"timestamp:{int(time.time())}"])


def sign(path: Path, key: SecretKey, comment: str, blake: bytes | None = None) -> str:
    """The text of a minisign signature file for ``path`` (prehashed Ed25519, the comment signed too)."""
    if "\n" in comment or "\r" in comment:
        raise SignatureError("a trusted comment is one line")
    private = _ed25519().Ed25519PrivateKey.from_private_bytes(key.secret[:32])
    blake = blake if blake is not None else digests(path)[0]
    signature = private.sign(blake)
    global_signature = private.sign(signature + comment.encode())
    return (f"untrusted comment: signature from tritonwarm secret key {key.public.id_text}\n"
            f"{base64.b64encode(b'ED' + key.key_id + signature).decode()}\n"
            f"trusted comment: {comment}\n{base64.b64encode(global_signature).decode()}\n")


@dataclass(frozen=True)
class Signature:
    key_id: bytes
    prehashed: bool
    signature: bytes
    comment: str
    global_signature: bytes


def parse_signature(text: str, where: str) -> Signature:
    lines = [line for line in text.splitlines() if line.strip()]
    if len(lines) != 4 or not lines[0].startswith("untrusted comment:") or \
            not lines[2].startswith("trusted comment: "):
        raise SignatureError(f"{where}: not a minisign signature (untrusted comment, signature, trusted comment, "
                             "comment signature)")
    data = _b64(lines[1], 74, f"{where}: signature")
    if data[:2] not in (b"ED", b"Ed"):
        raise SignatureError(f"{where}: signature algorithm {data[:2]!r} is not minisign's Ed25519")
    return Signature(data[2:10], data[:2] == b"ED", data[10:], lines[2][len("trusted comment: "):],
                     _b64(lines[3], 64, f"{where}: comment signature"))


def read_signature(path: Path) -> Signature:
    return parse_signature("\n".join(_read_small(Path(path), "signature")), str(path))


def check(path: Path, sig: Signature, key: PublicKey, where: str) -> str:
    """Verify ``sig`` over the file at ``path`` with ``key``; return the archive's sha256 (hex).

    Raises one line for: another key, a legacy (non-prehashed) signature, a changed file, a changed
    trusted comment."""
    if sig.key_id != key.key_id:
        raise SignatureError(f"{where}: signed by another key (key id {sig.key_id[::-1].hex().upper()}; the "
                             f"trusted key is {key.id_text})")
    if not sig.prehashed:
        raise SignatureError(f"{where}: a legacy (not prehashed) minisign signature; sign again with "
                             "`tritonwarm bundle sign` or minisign 0.10 or later")
    ed = _ed25519()
    from cryptography.exceptions import InvalidSignature

    public = ed.Ed25519PublicKey.from_public_bytes(key.key)
    blake, sha = digests(path)
    try:
        public.verify(sig.signature, blake)
    except InvalidSignature:
        raise SignatureError(f"{where}: the signature does not match the archive: it was changed after signing "
                             "(or the signature is another file's)") from None
    try:
        public.verify(sig.global_signature, sig.signature + sig.comment.encode())
    except InvalidSignature:
        raise SignatureError(f"{where}: the trusted comment was changed after signing") from None
    return sha


def comment_fields(comment: str) -> dict[str, str]:
    fields = {}
    for part in comment.split("\t"):
        name, sep, value = part.partition(":")
        if sep:
            fields.setdefault(name, value)
    return fields


def check_binding(comment: str, archive_sha256: str, fingerprint, where: str) -> dict[str, str]:
    """The trusted comment must name this archive's sha256 and its header's fingerprint."""
    fields = comment_fields(comment)
    if not comment.startswith(COMMENT_KIND + "\t") or "fingerprint" not in fields or "sha256" not in fields:
        raise SignatureError(f"{where}: the trusted comment does not name the archive's sha256 and fingerprint "
                             "(sign with `tritonwarm bundle sign`, or give minisign -t the line "
                             "`tritonwarm bundle sign --print-comment` prints)")
    if fields["sha256"] != archive_sha256:
        raise SignatureError(f"{where}: the signature vouches for another archive (sha256 {fields['sha256'][:16]}…, "
                             f"this one is {archive_sha256[:16]}…)")
    try:
        actual = fingerprint_digest(fingerprint)
    except (TypeError, ValueError):
        actual = "unreadable"
    if fields["fingerprint"] != actual:
        raise SignatureError(f"{where}: the bundle's fingerprint is not the one that was signed "
                             f"({actual[:23]} vs signed {fields['fingerprint'][:23]})")
    return fields


@dataclass(frozen=True)
class Claim:
    """What the one installing asks for: the name (a tag, a reference, a file name), the targets, and
    how old a signature may be. None: not asked."""

    name: str | None = None
    targets: tuple[str, ...] = ()
    not_older_than: int | None = None  # unix time


def name_matches(signed: str, asked: str) -> bool:
    """Whether the name a signature names is the one asked for: the same, or the end of it at a
    component boundary (signed ``kernels/rms:sm90`` for ``registry:5000/kernels/rms:sm90``), or its
    tag alone (signed ``sm90``, a layout's tag, for ``registry:5000/kernels/rms:sm90``)."""
    if signed == asked or asked.endswith("/" + signed):
        return True
    return "/" not in signed and ":" not in signed and "/" in asked and asked.rpartition(":")[2] == signed


def signed_at(fields: dict[str, str]) -> int | None:
    value = fields.get("timestamp", "")
    return int(value) if value.isdigit() and len(value) < 16 else None


def shown_time(unix: int) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(unix))


def check_claim(fields: dict[str, str], header_targets, claim: Claim, where: str) -> None:
    """The signed name, targets and time against the bundle's header and what was asked for."""
    if "name" not in fields or "targets" not in fields:
        raise SignatureError(f"{where}: the signature does not name the name and targets it was published for "
                             "(signed by an older tritonwarm): sign it again with `tritonwarm bundle sign`")
    signed_targets = sorted(t for t in fields["targets"].split(",") if t)
    if signed_targets != sorted(header_targets):
        raise SignatureError(f"{where}: the bundle's targets ({', '.join(sorted(header_targets))}) are not the ones "
                             f"that were signed ({', '.join(signed_targets) or 'none'})")
    if claim.name is not None and not name_matches(fields["name"], claim.name):
        raise SignatureError(f"{where}: signed as {fields['name'][:100]!r}, not as {claim.name[:100]!r} that was "
                             "asked for (a tag or file swapped for another signed one?); --name NAME names what to "
                             "expect")
    missing = [t for t in claim.targets if t not in signed_targets]
    if missing:
        raise SignatureError(f"{where}: signed for {', '.join(signed_targets) or 'no target'}, not for "
                             f"{', '.join(missing)} that was asked for (--target)")
    at = signed_at(fields)
    if claim.not_older_than is not None and (at is None or at < claim.not_older_than):
        raise SignatureError(f"{where}: signed {shown_time(at) if at is not None else 'at no time it names'}, older "
                             f"than --not-older-than {shown_time(claim.not_older_than)} (a rollback?)")


INSTALLED_RECORD = "signed-installs.json"  # in <cache>/tritonwarm/: name → the newest signature time installed


def rollback_problem(cache_dir, fields: dict[str, str]) -> str | None:
    """Why installing a bundle signed at ``fields``' time under its name would roll back what this cache
    had installed under that name (TUF's rule: never trust older than what was trusted before)."""
    recorded = _installed(cache_dir).get(fields.get("name"))
    at = signed_at(fields)
    if isinstance(recorded, int) and (at is None or at < recorded):
        return (f"signed {shown_time(at) if at is not None else 'at no time it names'}, older than the bundle "
                f"signed {shown_time(recorded)} installed here under the name {fields['name'][:100]!r} "
                "(a rollback; --allow-rollback installs it anyway)")
    return None


def record_install(cache_dir, fields: dict[str, str], *, durable: bool = True) -> None:
    """Remember the newest signature time installed under the signed name."""
    from .layout import write_json_atomic

    at, name = signed_at(fields), fields.get("name")
    if at is None or not name:
        return
    installed = _installed(cache_dir)
    if not isinstance(installed.get(name), int) or installed[name] < at:
        installed[name] = at
        write_json_atomic(Path(cache_dir) / "tritonwarm" / INSTALLED_RECORD, installed, indent=1, durable=durable)


def _installed(cache_dir) -> dict:
    path = Path(cache_dir) / "tritonwarm" / INSTALLED_RECORD
    try:
        with open(path, "rb") as f:
            data = json.loads(f.read(_MAX_FILE * 16))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as e:
        raise SignatureError(f"{path} is unreadable or damaged ({e}): remove it to start the record again") from None
    if not isinstance(data, dict):
        raise SignatureError(f"{path} is damaged (not a table): remove it to start the record again")
    return data


def parse_date(text: str) -> int:
    """``--not-older-than``: a date (``2026-12-04``), a UTC date and time (``2026-12-04T10:00:00``) or unix seconds."""
    import calendar

    text = str(text).strip()
    if text.isdigit():
        return int(text)
    for pattern in ("%Y-%m-%d", "%Y-%m-%dT%H:%M:%S", "%Y-%m-%dT%H:%M:%SZ", "%Y-%m-%d %H:%M:%S"):
        try:
            return calendar.timegm(time.strptime(text, pattern))
        except ValueError:
            continue
    raise SignatureError(f"--not-older-than {text[:40]!r}: expected a date (2026-12-04), a UTC time "
                         "(2026-12-04T10:00:00) or unix seconds")


__all__ = ["COMMENT_KIND", "Claim", "INSTALLED_RECORD", "PublicKey", "SIGNATURE_SUFFIX", "SecretKey", "Signature",
           "SignatureError", "check", "check_binding", "check_claim", "check_name", "comment_fields", "digests",
           "fingerprint_digest", "generate", "name_matches", "parse_date", "parse_signature", "read_public_key",
           "read_secret_key", "read_signature", "record_install", "rollback_problem", "sign", "signed_at",
           "trusted_comment"]
