"""Signing's checks, pinned with fast tests that call its functions directly: minisign's key and
signature formats (read and refused), encrypted keys and their passwords, the trusted comment's binding
of archive, fingerprint, name and targets, rollbacks, and the refusal each failure gives. No ``minisign``
binary is needed: keys are made by the package's own keygen, or written here in minisign's documented
format from a fixed Ed25519 seed."""

import base64
import errno
import hashlib
import importlib.util
import io
import json
import os
import re
import sys
from pathlib import Path

import pytest
from tritonwarm.jit.cache import signing
from tritonwarm.jit.cache.signing import Claim, SignatureError

needs_crypto = pytest.mark.skipif(importlib.util.find_spec("cryptography") is None and os.environ.get("CI") != "true",
                                  reason="cryptography is not installed (pip install 'tritonwarm[sign]')")

SEED = bytes(range(1, 33))
KEY_ID = bytes.fromhex("0123456789abcdef")
SALT = bytes(range(100, 132))
FINGERPRINT = {"triton": "3.9.0", "python": "3.11", "backends": ["cuda"]}


def refusal(call, *args, **kwargs) -> str:
    """The one-line message ``call`` refuses with."""
    with pytest.raises(SignatureError) as info:
        call(*args, **kwargs)
    message = str(info.value)
    assert "\n" not in message
    return message


def public_half(seed: bytes) -> bytes:
    from cryptography.hazmat.primitives.asymmetric import ed25519

    return ed25519.Ed25519PrivateKey.from_private_bytes(seed).public_key().public_bytes_raw()


def secret_key_file(path: Path, *, seed=SEED, key_id=KEY_ID, public=None, kdf=b"\0\0", chk=b"B2", ops=0, mem=0,
                    stream=bytes(104), checksum=None, extra=b"") -> Path:
    """A minisign secret key: alg, kdf, checksum alg, salt, opslimit, memlimit (little-endian), then
    key id, seed, public key and BLAKE2b-256 checksum, XORed with the scrypt stream when encrypted."""
    secret = seed + (public if public is not None else public_half(seed))
    if checksum is None:
        checksum = hashlib.blake2b(b"Ed" + key_id + secret, digest_size=32).digest()
    keynum = bytes(a ^ b for a, b in zip(key_id + secret + checksum, stream, strict=True))
    blob = b"Ed" + kdf + chk + SALT + ops.to_bytes(8, "little") + mem.to_bytes(8, "little") + keynum + extra
    path.write_text(f"untrusted comment: a test key\n{base64.b64encode(blob).decode()}\n")
    return path


def encrypted_key_file(path: Path, password: str, ops: int, mem: int, log_n: int, p: int) -> Path:
    """A key encrypted as minisign does, with the scrypt parameters libsodium picks for ``ops``/``mem``
    given here by hand (N=2^log_n, r=8, p), as checked against libsodium's crypto_pwhash_scryptsalsa208sha256."""
    stream = hashlib.scrypt(password.encode(), salt=SALT, n=1 << log_n, r=8, p=p, maxmem=1 << 28, dklen=104)
    return secret_key_file(path, kdf=b"Sc", ops=ops, mem=mem, stream=stream)


def public_key_line(key_id=KEY_ID, key=bytes(32), alg=b"Ed", extra=b"") -> str:
    return base64.b64encode(alg + key_id + key + extra).decode()


@pytest.fixture
def keys(tmp_path):
    """A key pair from the package's own keygen."""
    secret, public = tmp_path / "k.key", tmp_path / "k.pub"
    signing.generate(secret, public)
    return signing.read_secret_key(secret), signing.read_public_key(public)


# ------------------------------------------------------------------------------------ public keys


def test_a_public_key_file_of_one_line_holds_just_the_key(tmp_path):
    path = tmp_path / "one.pub"
    path.write_text(public_key_line() + "\n")
    assert signing.read_public_key(path) == signing.PublicKey(KEY_ID, bytes(32))


def test_a_public_key_file_whose_first_line_is_no_comment_is_refused(tmp_path):
    path = tmp_path / "two.pub"
    path.write_text("release key\n" + public_key_line() + "\n")
    message = refusal(signing.read_public_key, path)
    assert f"{path}: not a minisign public key (an 'untrusted comment:' line, then the key)" in message


def test_a_public_key_file_up_to_64_kib_is_read_and_a_longer_one_refused(tmp_path):
    text = "untrusted comment: padded\n" + public_key_line() + "\n"
    path = tmp_path / "padded.pub"
    path.write_text(text + "\n" * (65536 - len(text)))
    assert path.stat().st_size == 65536 and signing.read_public_key(path).key_id == KEY_ID
    path.write_text(text + "\n" * (65537 - len(text)))
    assert refusal(signing.read_public_key, path) == f"{path}: not a minisign public key (over 65536 bytes)"


def test_an_absent_key_file_says_why_it_cannot_be_read(tmp_path, monkeypatch):
    """A name made of base64 letters that is no file is still taken as a file (a key is 56 letters)."""
    monkeypatch.chdir(tmp_path)
    message = refusal(signing.read_public_key, "releasekey")
    assert message == f"releasekey: cannot read the public key: {os.strerror(errno.ENOENT)}"


def test_a_file_named_like_a_key_is_read_as_a_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    name = "A" * 56  # base64 of 42 zero bytes: no Ed25519 key
    Path(name).write_text("untrusted comment: x\n" + public_key_line() + "\n")
    assert signing.read_public_key(name).key_id == KEY_ID


def test_a_key_given_inline_is_named_public_key_in_its_refusal():
    message = refusal(signing.read_public_key, public_key_line(alg=b"RS"))
    assert message == "public key: algorithm b'RS' is not Ed25519 ('Ed')"


def test_a_public_key_of_the_wrong_length_or_padding_is_refused(tmp_path):
    path = tmp_path / "long.pub"
    path.write_text("untrusted comment: x\n" + public_key_line(extra=b"abc") + "\n")
    assert refusal(signing.read_public_key, path) == f"{path}: public key: 45 bytes where minisign writes 42"
    path.write_text("untrusted comment: x\nAAAAA\n")  # base64 letters, but not a whole number of groups
    assert refusal(signing.read_public_key, path) == f"{path}: public key: not base64"


# ------------------------------------------------------------------------------------ secret keys


@needs_crypto
def test_a_secret_key_written_in_minisigns_format_is_read(tmp_path):
    key = signing.read_secret_key(secret_key_file(tmp_path / "plain.key"))
    assert key.key_id == KEY_ID and key.secret[:32] == SEED and key.public.key == public_half(SEED)


@needs_crypto
def test_an_unencrypted_key_with_a_zero_checksum_is_read_and_a_wrong_one_is_damaged(tmp_path):
    """Keys written without a checksum (all zero) are accepted when not encrypted; any other wrong
    checksum is damage."""
    path = secret_key_file(tmp_path / "zero.key", checksum=bytes(32))
    assert signing.read_secret_key(path).key_id == KEY_ID
    path = secret_key_file(tmp_path / "bad.key", checksum=b"\x01" * 32)
    assert refusal(signing.read_secret_key, path) == f"{path}: the secret key does not check out: damaged"


@needs_crypto
def test_a_secret_key_whose_halves_do_not_match_is_refused(tmp_path):
    path = secret_key_file(tmp_path / "halves.key", public=public_half(bytes(32)))
    message = refusal(signing.read_secret_key, path)
    assert message == f"{path}: the secret key is damaged (its two halves do not match)"


def test_a_secret_key_file_that_is_not_minisigns_is_refused(tmp_path):
    path = tmp_path / "k.key"
    line = base64.b64encode(b"Ed\0\0B2" + bytes(152)).decode()
    for text in (f"my key\n{line}\n", f"untrusted comment: x\n{line}\n{line}\n"):
        path.write_text(text)
        message = refusal(signing.read_secret_key, path)
        assert message == f"{path}: not a minisign secret key (an 'untrusted comment:' line, then the key)"
    assert refusal(signing.read_secret_key, tmp_path / "absent.key").startswith(
        f"{tmp_path / 'absent.key'}: cannot read the secret key: ")


def test_a_secret_key_of_other_algorithms_or_length_is_refused(tmp_path):
    path = secret_key_file(tmp_path / "b3.key", chk=b"B3", public=bytes(32))
    message = refusal(signing.read_secret_key, path)
    assert message == f"{path}: secret key algorithms b'Ed'/b'B3' are not minisign's Ed25519/BLAKE2b"
    path = secret_key_file(tmp_path / "xx.key", kdf=b"Xx", public=bytes(32))
    message = refusal(signing.read_secret_key, path)
    assert message == f"{path}: secret key encryption b'Xx' is not minisign's scrypt ('Sc') or none"
    path = secret_key_file(tmp_path / "long.key", public=bytes(32), extra=b"abc")
    assert refusal(signing.read_secret_key, path) == f"{path}: secret key: 161 bytes where minisign writes 158"


# libsodium's choice of (log2 N, p) for minisign's stored opslimit and memlimit (r is always 8):
# N from the opslimit while it is below memlimit / 32, else N from the memlimit and p from the opslimit.
SCRYPT_LIMITS = [
    pytest.param(32768, 1 << 24, 10, 1, id="N-from-opslimit"),
    pytest.param(1000, 1 << 24, 10, 1, id="opslimit-raised-to-32768"),
    pytest.param(64000, 1 << 21, 10, 1, id="opslimit-just-below-memlimit/32"),
    pytest.param(32768, 1 << 20, 10, 1, id="opslimit-equal-to-memlimit/32"),
    pytest.param(32768, (1 << 20) + 1, 10, 1, id="memlimit-not-a-multiple-of-32"),
    pytest.param(1 << 16, 1 << 20, 10, 2, id="N-from-memlimit-p-from-opslimit"),
    pytest.param(1 << 19, 1 << 20, 10, 16, id="p-16"),
    pytest.param(1 << 20, 1 << 26, 15, 1, id="32-MiB-past-OpenSSLs-default"),
    pytest.param(1 << 22, 1 << 28, 17, 1, id="128-MiB-past-the-64-MiB-allowance"),
]


@needs_crypto
@pytest.mark.parametrize("ops, mem, log_n, p", SCRYPT_LIMITS)
def test_an_encrypted_key_decrypts_with_the_scrypt_parameters_libsodium_picks(tmp_path, ops, mem, log_n, p):
    path = encrypted_key_file(tmp_path / "e.key", "pw", ops, mem, log_n, p)
    key = signing.read_secret_key(path, "pw")
    assert key.key_id == KEY_ID and key.secret[:32] == SEED


@needs_crypto
def test_a_wrong_password_is_named_as_such(tmp_path):
    path = encrypted_key_file(tmp_path / "e.key", "pw", 32768, 1 << 24, 10, 1)
    assert refusal(signing.read_secret_key, path, "not it") == f"{path}: the secret key does not check out: " \
                                                              "wrong password"


@pytest.mark.parametrize("ops, mem, says", [
    (1 << 26, 1 << 32, "N=2^21, p=1"),  # 2 GiB: more than minisign's keys (N=2^20) and Python's scrypt allow
    (557056, 1 << 20, "N=2^10, p=17"),
    (32768, 2048, "N=2^1, p=512"),
    (1 << 63, 1 << 20, "N=2^10, p=134217727"),  # p capped as libsodium caps it
])
def test_scrypt_limits_past_minisigns_are_refused_before_deriving(tmp_path, ops, mem, says):
    path = secret_key_file(tmp_path / "costly.key", kdf=b"Sc", ops=ops, mem=mem, public=bytes(32))
    message = refusal(signing.read_secret_key, path, "pw")
    assert message == f"{path}: the secret key's scrypt limits ({says}) are beyond minisign's"


class _Stdin(io.StringIO):
    def __init__(self, text: str, tty: bool = False):
        super().__init__(text)
        self.tty = tty

    def isatty(self):
        return self.tty


@needs_crypto
@pytest.mark.parametrize("password", [" two words ", "ends in X"])
def test_the_password_is_the_line_on_stdin_without_its_line_end(tmp_path, monkeypatch, password):
    """Spaces and letters at either end are part of the password; only ``\\r\\n`` is the line's end."""
    path = encrypted_key_file(tmp_path / "e.key", password, 32768, 1 << 24, 10, 1)
    monkeypatch.setattr(sys, "stdin", _Stdin(password + "\r\n"))
    monkeypatch.setattr(signing.getpass, "getpass", lambda prompt: pytest.fail("no terminal to ask on"))
    assert signing.read_secret_key(path).key_id == KEY_ID


@needs_crypto
def test_on_a_terminal_the_password_is_asked_for_naming_the_key(tmp_path, monkeypatch):
    path = encrypted_key_file(tmp_path / "e.key", "pw", 32768, 1 << 24, 10, 1)
    prompts = []
    monkeypatch.setattr(sys, "stdin", _Stdin("not the password\n", tty=True))
    monkeypatch.setattr(signing.getpass, "getpass", lambda prompt: prompts.append(prompt) or "pw")
    assert signing.read_secret_key(path).key_id == KEY_ID
    assert prompts == [f"Password for {path}: "]


@pytest.mark.parametrize("stdin", [None, _Stdin("")], ids=["no-stdin", "empty-stdin"])
def test_an_encrypted_key_without_a_password_says_how_to_give_one(tmp_path, monkeypatch, stdin):
    path = encrypted_key_file(tmp_path / "e.key", "pw", 32768, 1 << 24, 10, 1)
    monkeypatch.setattr(sys, "stdin", stdin)
    message = refusal(signing.read_secret_key, path)
    assert message == f"{path}: the secret key is encrypted: give its password (--password-file, or on stdin)"


# ------------------------------------------------------------------------------------ signatures


def signature_text(comment="tritonwarm-bundle\tsha256:00", alg=b"ED", sig_len=64, global_len=64) -> str:
    return (f"untrusted comment: x\n{base64.b64encode(alg + KEY_ID + bytes(sig_len)).decode()}\n"
            f"trusted comment: {comment}\n{base64.b64encode(bytes(global_len)).decode()}\n")


def test_a_signature_parses_into_its_parts_and_a_legacy_one_is_not_prehashed():
    sig = signing.parse_signature(signature_text(), "s")
    assert (sig.key_id, sig.prehashed, sig.comment) == (KEY_ID, True, "tritonwarm-bundle\tsha256:00")
    assert signing.parse_signature(signature_text(alg=b"Ed"), "s").prehashed is False


@pytest.mark.parametrize("lines", [
    lambda ls: ls + ["one more line"],
    lambda ls: ["not a comment"] + ls[1:],
    lambda ls: ls[:2] + ["comment: no trusted prefix"] + ls[3:],
], ids=["five-lines", "first-not-untrusted-comment", "third-not-trusted-comment"])
def test_a_signature_not_laid_out_as_minisigns_is_refused(lines):
    text = "\n".join(lines(signature_text().splitlines()))
    assert refusal(signing.parse_signature, text, "w.minisig") == (
        "w.minisig: not a minisign signature (untrusted comment, signature, trusted comment, comment signature)")


def test_a_signature_of_another_algorithm_or_a_short_comment_signature_is_refused():
    message = refusal(signing.parse_signature, signature_text(alg=b"RS"), "w.minisig")
    assert message == "w.minisig: signature algorithm b'RS' is not minisign's Ed25519"
    message = refusal(signing.parse_signature, signature_text(global_len=63), "w.minisig")
    assert message == "w.minisig: comment signature: 63 bytes where minisign writes 64"


def test_a_signature_line_with_excess_padding_is_not_base64():
    """Base64 is read strictly: a 74-byte signature ends in one ``=``, two are refused."""
    lines = signature_text().splitlines()
    assert lines[1].endswith("=") and not lines[1].endswith("==")
    text = "\n".join([lines[0], lines[1] + "=", *lines[2:]])
    assert refusal(signing.parse_signature, text, "w.minisig") == "w.minisig: signature: not base64"


def test_an_unreadable_signature_file_is_named(tmp_path):
    missing = tmp_path / "w.minisig"
    assert refusal(signing.read_signature, missing) == (
        f"{missing}: cannot read the signature: {os.strerror(errno.ENOENT)}")


def test_a_file_that_cannot_be_hashed_is_named_with_the_reason(tmp_path):
    missing = tmp_path / "gone.tar.gz"
    assert refusal(signing.digests, missing) == f"{missing}: {os.strerror(errno.ENOENT)}"


@needs_crypto
def test_a_trusted_comment_of_more_than_one_line_is_not_signed(tmp_path, keys):
    archive = tmp_path / "a"
    archive.write_bytes(b"archive")
    for comment in ("one\ntwo", "one\rtwo"):
        assert refusal(signing.sign, archive, keys[0], comment) == "a trusted comment is one line"


@needs_crypto
def test_a_digest_given_to_sign_is_what_is_signed(tmp_path, keys):
    """``sign`` signs the BLAKE2b digest it is given (computed once by its caller), not the file again."""
    archive = tmp_path / "a"
    archive.write_bytes(b"archive")
    text = signing.sign(tmp_path / "not-there", keys[0], "c", blake=signing.digests(archive)[0])
    sha = signing.check(archive, signing.parse_signature(text, "s"), keys[1], "s")
    assert sha == hashlib.sha256(b"archive").hexdigest()


@needs_crypto
def test_a_legacy_signature_is_refused_with_how_to_sign_again(tmp_path, keys):
    archive = tmp_path / "a"
    archive.write_bytes(b"archive")
    sig = signing.parse_signature(signing.sign(archive, keys[0], "c"), "s")
    legacy = signing.Signature(sig.key_id, False, sig.signature, sig.comment, sig.global_signature)
    message = refusal(signing.check, archive, legacy, keys[1], "w.minisig")
    assert message == ("w.minisig: a legacy (not prehashed) minisign signature; sign again with "
                       "`tritonwarm bundle sign` or minisign 0.10 or later")


@needs_crypto
def test_a_changed_archive_is_refused_naming_both_causes(tmp_path, keys):
    archive = tmp_path / "a"
    archive.write_bytes(b"archive")
    sig = signing.parse_signature(signing.sign(archive, keys[0], "c"), "s")
    archive.write_bytes(b"archivE")
    message = refusal(signing.check, archive, sig, keys[1], "w.minisig")
    assert message.endswith("it was changed after signing (or the signature is another file's)")


# ------------------------------------------------------------------------------------ trusted comments


def test_the_fingerprint_digest_is_the_sha256_of_sorted_compact_ascii_json():
    """Anyone can recompute it from a header, and signatures made before stay valid: keys sorted, no
    spaces, non-ASCII escaped."""
    fingerprint = {"triton": "3.9", "backends": ["cuda", "é"], "python": {"minor": 11, "major": 3}}
    canonical = b'{"backends":["cuda","\\u00e9"],"python":{"major":3,"minor":11},"triton":"3.9"}'
    assert signing.fingerprint_digest(fingerprint) == "sha256:" + hashlib.sha256(canonical).hexdigest()


def test_comment_fields_are_tab_separated_and_a_value_may_hold_spaces():
    fields = signing.comment_fields("tritonwarm-bundle\tnote:made by hand\tname:a\tname:b")
    assert fields == {"note": "made by hand", "name": "a"}  # the first of a repeated field counts


def _comment(sha="ab" * 32, fingerprint=None, name="warm.tar.gz", targets=("sm90",)):
    return signing.trusted_comment(sha, FINGERPRINT if fingerprint is None else fingerprint, 2, name, targets)


def test_a_comment_binds_archive_and_fingerprint_and_refuses_either_changed():
    sha = "ab" * 32
    comment = _comment(sha)
    assert signing.check_binding(comment, sha, FINGERPRINT, "w")["entries"] == "2"
    other = "cd" * 32
    assert refusal(signing.check_binding, comment, other, FINGERPRINT, "w") == (
        f"w: the signature vouches for another archive (sha256 {sha[:16]}…, this one is {other[:16]}…)")
    changed = {**FINGERPRINT, "python": "3.12"}
    digest, signed = signing.fingerprint_digest(changed), signing.fingerprint_digest(FINGERPRINT)
    assert refusal(signing.check_binding, comment, sha, changed, "w") == (
        f"w: the bundle's fingerprint is not the one that was signed ({digest[:23]} vs signed {signed[:23]})")


def test_a_fingerprint_that_is_not_json_is_reported_as_unreadable():
    message = refusal(signing.check_binding, _comment(), "ab" * 32, {"x": {1, 2}}, "w")
    assert "(unreadable vs signed sha256:" in message


@pytest.mark.parametrize("comment", [
    "tritonwarm-bundle\tfingerprint:sha256:00",  # no sha256
    "tritonwarm-bundle\tsha256:" + "ab" * 32,  # no fingerprint
    "other-tool\tsha256:{sha}\tfingerprint:{fp}",  # both, but not tritonwarm's comment
], ids=["no-sha256", "no-fingerprint", "other-kind"])
def test_a_comment_that_is_not_tritonwarms_is_refused_with_how_to_sign(comment):
    comment = comment.format(sha="ab" * 32, fp=signing.fingerprint_digest(FINGERPRINT))
    message = refusal(signing.check_binding, comment, "ab" * 32, FINGERPRINT, "w")
    assert message == ("w: the trusted comment does not name the archive's sha256 and fingerprint (sign with "
                       "`tritonwarm bundle sign`, or give minisign -t the line `tritonwarm bundle sign "
                       "--print-comment` prints)")


def test_a_name_no_bundle_is_published_under_is_refused_naming_the_option():
    message = refusal(signing.check_name, "two words")
    assert message == ("--name 'two words' is not a name a bundle is published under (letters, digits, "
                       "and . _ - : / @ +, at most 256)")
    assert refusal(signing.check_name, None).startswith("--name 'None' is not a name")
    long = "x" * 300
    assert f"--name '{'x' * 80}' is not" in refusal(signing.check_name, long)
    message = refusal(signing.trusted_comment, "ab" * 32, FINGERPRINT, 1, "a b", ["sm90"], "the image's tag")
    assert message.startswith("the image's tag 'a b' is not a name")
    assert refusal(signing.trusted_comment, "ab" * 32, FINGERPRINT, 1, "a b", ["sm90"]).startswith("--name 'a b'")


def test_a_comment_for_several_targets_is_checked_against_all_of_them():
    fields = signing.comment_fields(_comment(targets=["sm90", "gfx942"]))
    assert fields["targets"] == "gfx942,sm90"
    signing.check_claim(fields, ["sm90", "gfx942"], Claim(targets=("sm90", "gfx942")), "w")
    message = refusal(signing.check_claim, fields, ["sm90"], Claim(), "w")
    assert message == "w: the bundle's targets (sm90) are not the ones that were signed (gfx942, sm90)"


def test_a_claim_against_the_signed_name_and_targets():
    fields = signing.comment_fields(_comment(targets=["sm90", "sm100"]))
    message = refusal(signing.check_claim, fields, ["sm90", "sm100"], Claim(targets=("mi300x", "gfx942")), "w")
    assert message == "w: signed for sm100, sm90, not for mi300x, gfx942 that was asked for (--target)"
    empty = {**fields, "targets": ""}
    assert refusal(signing.check_claim, empty, [], Claim(targets=("sm90",)), "w") == (
        "w: signed for no target, not for sm90 that was asked for (--target)")
    assert refusal(signing.check_claim, empty, ["sm90"], Claim(), "w") == (
        "w: the bundle's targets (sm90) are not the ones that were signed (none)")
    assert refusal(signing.check_claim, fields, ["sm90", "sm100", "gfx942"], Claim(), "w") == (
        "w: the bundle's targets (gfx942, sm100, sm90) are not the ones that were signed (sm100, sm90)")


def test_a_long_signed_or_asked_name_is_shown_cut_to_100_characters():
    signed, asked = "s" * 150, "a" * 150
    fields = signing.comment_fields(_comment(name=signed))
    message = refusal(signing.check_claim, fields, ["sm90"], Claim(name=asked), "w")
    assert message == (f"w: signed as {signed[:100]!r}, not as {asked[:100]!r} that was asked for (a tag or file "
                       "swapped for another signed one?); --name NAME names what to expect")


def test_a_signature_by_an_older_tritonwarm_names_no_claim_and_is_refused():
    fields = signing.comment_fields(_comment())
    del fields["targets"]
    message = refusal(signing.check_claim, fields, ["sm90"], Claim(), "w")
    assert message == ("w: the signature does not name the name and targets it was published for (signed by an "
                       "older tritonwarm): sign it again with `tritonwarm bundle sign`")


def test_a_port_is_not_part_of_a_signed_repository_name():
    assert not signing.name_matches("5000/kernels/x", "127.0.0.1:5000/kernels/x")
    assert signing.name_matches("kernels/x", "127.0.0.1:5000/kernels/x")


# ------------------------------------------------------------------------------------ time and rollbacks


def test_the_signed_time_is_unix_seconds_or_none():
    assert signing.signed_at({"timestamp": "1764806400"}) == 1764806400
    assert signing.signed_at({"timestamp": "9" * 15}) == 10**15 - 1
    for fields in ({}, {"timestamp": "soon"}, {"timestamp": "-5"}, {"timestamp": "9" * 16}):
        assert signing.signed_at(fields) is None, fields


def test_times_are_shown_in_utc():
    assert signing.shown_time(0) == "1970-01-01 00:00:00 UTC"
    assert signing.shown_time(1764843000) == "2025-12-04 10:10:00 UTC"


@pytest.mark.parametrize("text, unix", [
    ("1764806400", 1764806400),
    (" 2025-12-04 ", 1764806400),
    ("2025-12-04T10:00:00", 1764842400),
    ("2025-12-04T10:00:00Z", 1764842400),
    ("2025-12-04 10:00:00", 1764842400),
])
def test_not_older_than_takes_a_date_a_utc_time_or_unix_seconds(text, unix):
    assert signing.parse_date(text) == unix


def test_not_older_than_refuses_anything_else_naming_the_forms():
    message = refusal(signing.parse_date, "yesterday, or maybe the day before that one")
    assert message == ("--not-older-than 'yesterday, or maybe the day before that ': expected a date (2026-12-04), "
                       "a UTC time (2026-12-04T10:00:00) or unix seconds")


def test_not_older_than_refuses_older_signatures_and_takes_one_signed_at_the_limit():
    fields = {"name": "warm.tar.gz", "targets": "sm90", "timestamp": "1764806400"}
    signing.check_claim(fields, ["sm90"], Claim(not_older_than=1764806400), "w")
    message = refusal(signing.check_claim, fields, ["sm90"], Claim(not_older_than=1764806401), "w")
    assert message == ("w: signed 2025-12-04 00:00:00 UTC, older than --not-older-than 2025-12-04 00:00:01 UTC "
                       "(a rollback?)")
    untimed = {"name": "warm.tar.gz", "targets": "sm90"}
    message = refusal(signing.check_claim, untimed, ["sm90"], Claim(not_older_than=0), "w")
    assert message == ("w: signed at no time it names, older than --not-older-than 1970-01-01 00:00:00 UTC "
                       "(a rollback?)")


def _record(cache: Path) -> Path:
    return cache / "tritonwarm" / signing.INSTALLED_RECORD


def test_an_install_older_than_the_one_recorded_is_a_rollback(tmp_path):
    (tmp_path / "tritonwarm").mkdir()
    name = "n" * 150
    signing.record_install(tmp_path, {"name": name, "timestamp": "1764806400"})
    assert signing.rollback_problem(tmp_path, {"name": name, "timestamp": "1764806400"}) is None
    message = signing.rollback_problem(tmp_path, {"name": name, "timestamp": "1764720000"})
    assert message == ("signed 2025-12-03 00:00:00 UTC, older than the bundle signed 2025-12-04 00:00:00 UTC "
                       f"installed here under the name {name[:100]!r} (a rollback; --allow-rollback installs it "
                       "anyway)")
    message = signing.rollback_problem(tmp_path, {"name": name})
    assert message.startswith("signed at no time it names, older than the bundle signed 2025-12-04 00:00:00 UTC ")


def test_the_record_keeps_the_newest_time_per_name_one_per_line(tmp_path):
    (tmp_path / "tritonwarm").mkdir()
    signing.record_install(tmp_path, {"name": "a", "timestamp": "200"})
    signing.record_install(tmp_path, {"name": "a", "timestamp": "100"})
    signing.record_install(tmp_path, {"name": "b", "timestamp": "300"})
    text = _record(tmp_path).read_text()
    assert json.loads(text) == {"a": 200, "b": 300}
    assert [line.strip() for line in text.splitlines()] == ["{", '"a": 200,', '"b": 300', "}"]


def test_nothing_is_recorded_without_a_name_or_a_time(tmp_path):
    (tmp_path / "tritonwarm").mkdir()
    signing.record_install(tmp_path, {"timestamp": "200"})
    signing.record_install(tmp_path, {"name": "a"})
    signing.record_install(tmp_path, {"name": "", "timestamp": "200"})
    assert not _record(tmp_path).exists()


def test_the_record_is_synced_to_disk_unless_asked_not_to(tmp_path, monkeypatch):
    (tmp_path / "tritonwarm").mkdir()
    synced = []
    monkeypatch.setattr(os, "fsync", synced.append)
    signing.record_install(tmp_path, {"name": "a", "timestamp": "200"})
    assert len(synced) == 1
    signing.record_install(tmp_path, {"name": "a", "timestamp": "200"})  # the same again: nothing to write
    assert len(synced) == 1
    signing.record_install(tmp_path, {"name": "a", "timestamp": "300"}, durable=False)
    assert len(synced) == 1 and json.loads(_record(tmp_path).read_text()) == {"a": 300}


@pytest.mark.parametrize("content, says", [
    (b"{not json", "is unreadable or damaged ("),
    (b"[1, 2]", "is damaged (not a table)"),
    (b'{"a": "' + b"x" * (1 << 20) + b'"}', "is unreadable or damaged ("),  # past 1 MiB: not read whole
    (('{"a": "' + "\u00e9" * 600_000 + '"}').encode(), "is unreadable or damaged ("),  # 1.2 MB in 0.6 M letters
])
def test_a_damaged_record_is_refused_with_how_to_start_again(tmp_path, content, says):
    _record(tmp_path).parent.mkdir()
    _record(tmp_path).write_bytes(content)
    message = refusal(signing.rollback_problem, tmp_path, {"name": "a", "timestamp": "1"})
    assert message.startswith(f"{_record(tmp_path)} {says}")
    assert message.endswith(": remove it to start the record again")


# ------------------------------------------------------------------------------------ cryptography


def test_without_cryptography_keygen_says_which_package_to_install(tmp_path, monkeypatch):
    for name in [m for m in sys.modules if m == "cryptography" or m.startswith("cryptography.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "cryptography", None)  # import cryptography raises ImportError
    message = refusal(signing.generate, tmp_path / "k.key", tmp_path / "k.pub")
    assert re.fullmatch(r"signing and verifying bundles needs the 'cryptography' package: "
                        r"pip install 'tritonwarm\[sign\]'", message)
    assert not (tmp_path / "k.key").exists()
