"""Signed bundles: tritonwarm's signatures are minisign's (the real ``minisign`` verifies them, and
tritonwarm verifies minisign's); each way a signature can fail is refused in one line with exit 2,
before anything from the bundle is installed."""

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from tritonwarm.cli import main
from tritonwarm.jit import TARGETS
from tritonwarm.jit.cache import signing
from tritonwarm.jit.pipeline.plan import plan
from tritonwarm.jit.pipeline.specs import load_specs
from tritonwarm.jit.pipeline.warmup import warm

if importlib.util.find_spec("cryptography") is None and os.environ.get("CI") != "true":
    pytest.skip("cryptography is not installed (pip install 'tritonwarm[sign]')", allow_module_level=True)

SPEC = """
kernel: tritonwarm.launchers.rms_norm:rms_norm
axes:
  dtype: [float16, bfloat16]
args:
  x: {tensor: [8, 4096], dtype: $dtype}
  weight: {tensor: [4096], dtype: $dtype}
"""


def tool(name: str) -> str:
    """The path of a tool the tests need: skipped where it is absent, required under CI=true."""
    path = shutil.which(name)
    if path is None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"{name} is required under CI=true (.ci/run installs it)")
        pytest.skip(f"{name} is not installed")
    return path


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """A warmed cache, its spec and a bundle of it (made once: the bundle is only read)."""
    root = tmp_path_factory.mktemp("signed")
    spec = root / "rms.yaml"
    spec.write_text(SPEC)
    warm(plan(load_specs([spec]), TARGETS["sm90"]), root / "warmed")
    bundle = root / "warm.tar.gz"
    assert main(["bundle", "create", str(bundle), str(spec), "--target", "sm90", "--cache-dir",
                 str(root / "warmed")]) == 0
    return root, spec, bundle


@pytest.fixture
def bundle(made, tmp_path):
    """A fresh copy of the bundle (no signature beside it)."""
    copy = tmp_path / "warm.tar.gz"
    shutil.copy(made[2], copy)
    return copy


def keygen(tmp_path, name="k"):
    assert main(["bundle", "keygen", str(tmp_path / name)]) == 0
    return tmp_path / f"{name}.key", tmp_path / f"{name}.pub"


def refused(capsys, argv, *needles):
    """``argv`` exits 2 with one line on stderr holding every needle; that line is returned."""
    assert main(argv) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tritonwarm: error: "), captured.err
    assert "Traceback" not in captured.err + captured.out
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


def test_tritonwarm_signs_and_minisign_verifies(bundle, tmp_path, capsys):
    minisign = tool("minisign")
    secret, public = keygen(tmp_path)
    assert oct(secret.stat().st_mode & 0o777) == "0o600"
    assert main(["bundle", "sign", str(bundle), "--key", str(secret)]) == 0
    signature = Path(f"{bundle}.minisig")
    assert signature.is_file() and "signed" in capsys.readouterr().out

    proc = subprocess.run([minisign, "-Vm", str(bundle), "-p", str(public)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "Signature and comment signature verified" in proc.stdout
    comment = signing.comment_fields(proc.stdout.split("Trusted comment: ", 1)[1].strip())
    assert comment["sha256"] == signing.digests(bundle)[1]
    header = signing.read_signature(signature)
    assert header.prehashed and comment["fingerprint"].startswith("sha256:")

    assert main(["bundle", "verify", str(bundle), "--trusted-key", str(public)]) == 0
    out = capsys.readouterr().out
    key_id = signing.read_public_key(public).id_text
    assert f"signature: good, by trusted key {key_id}" in out
    # the key can also be given as minisign -P takes it: the base64 line itself
    assert main(["bundle", "verify", str(bundle), "--trusted-key", public.read_text().splitlines()[1]]) == 0


def test_minisign_signs_and_tritonwarm_verifies(bundle, tmp_path, capsys):
    minisign = tool("minisign")
    secret, public = tmp_path / "m.key", tmp_path / "m.pub"
    subprocess.run([minisign, "-G", "-W", "-p", str(public), "-s", str(secret)], check=True, capture_output=True)
    assert main(["bundle", "sign", str(bundle), "--print-comment"]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert printed[0] == f"file: {bundle}"
    comment = printed[1].removeprefix("trusted comment: ")
    subprocess.run([minisign, "-S", "-s", str(secret), "-m", str(bundle), "-t", comment], check=True,
                   capture_output=True, stdin=subprocess.DEVNULL)
    assert main(["bundle", "verify", str(bundle), "--trusted-key", str(public), "--require-signature"]) == 0
    assert "signature: good" in capsys.readouterr().out
    dest = tmp_path / "dest"
    assert main(["bundle", "install", str(bundle), "--cache-dir", str(dest), "--require-signature",
                 "--trusted-key", str(public), "--no-c-launchers"]) == 0
    assert "installed 2" in capsys.readouterr().out

    # minisign's own trusted comment vouches for the bytes but not for the fingerprint: refused
    subprocess.run([minisign, "-S", "-s", str(secret), "-m", str(bundle)], check=True, capture_output=True,
                   stdin=subprocess.DEVNULL)
    refused(capsys, ["bundle", "verify", str(bundle), "--trusted-key", str(public)],
            "does not name the archive's sha256 and fingerprint", "--print-comment")
    # a comment that names another fingerprint than the bundle's header (the binding is checked)
    other = comment.replace("fingerprint:sha256:", "fingerprint:sha256:0")
    subprocess.run([minisign, "-S", "-s", str(secret), "-m", str(bundle), "-t", other], check=True,
                   capture_output=True, stdin=subprocess.DEVNULL)
    refused(capsys, ["bundle", "install", str(bundle), "--cache-dir", str(tmp_path / "d2"), "--trusted-key",
                     str(public)], "the bundle's fingerprint is not the one that was signed")
    assert not (tmp_path / "d2").exists()
    # ... or another archive's sha256
    other = comment.replace("sha256:", "sha256:f", 1)
    subprocess.run([minisign, "-S", "-s", str(secret), "-m", str(bundle), "-t", other], check=True,
                   capture_output=True, stdin=subprocess.DEVNULL)
    refused(capsys, ["bundle", "verify", str(bundle), "--trusted-key", str(public)], "vouches for another archive")


def test_every_bad_signature_is_refused_in_one_line_and_installs_nothing(bundle, tmp_path, capsys):
    secret, public = keygen(tmp_path)
    _, other_public = keygen(tmp_path, "other")
    dest = tmp_path / "dest"
    install = ["bundle", "install", str(bundle), "--cache-dir", str(dest), "--require-signature"]

    refused(capsys, install + ["--trusted-key", str(public)], "not signed", f"{bundle}.minisig",
            "--require-signature")
    refused(capsys, ["bundle", "verify", str(bundle), "--trusted-key", str(public)], "not signed")
    assert main(["bundle", "install", str(bundle), "--cache-dir", str(tmp_path / "unverified"),
                 "--trusted-key", str(public), "--no-c-launchers"]) == 0  # installed, and said so
    assert f"{bundle} is not signed; installing it unverified" in capsys.readouterr().err
    refused(capsys, install, "--require-signature needs --trusted-key")
    assert main(["bundle", "sign", str(bundle), "--key", str(secret)]) == 0
    capsys.readouterr()
    refused(capsys, install + ["--trusted-key", str(other_public)], "signed by another key",
            signing.read_public_key(public).id_text)

    data = bytearray(bundle.read_bytes())  # one byte changed
    data[len(data) // 2] ^= 0x01
    changed = tmp_path / "changed.tar.gz"
    changed.write_bytes(bytes(data))
    shutil.copy(f"{bundle}.minisig", f"{changed}.minisig")
    refused(capsys, ["bundle", "install", str(changed), "--cache-dir", str(dest), "--trusted-key", str(public)],
            "the signature does not match the archive")
    refused(capsys, ["bundle", "verify", str(changed), "--trusted-key", str(public)], "does not match the archive")

    lines = Path(f"{bundle}.minisig").read_text().splitlines()  # the trusted comment edited
    edited = tmp_path / "edited.minisig"
    edited.write_text("\n".join(lines[:2] + [lines[2].replace("entries:2", "entries:3")] + lines[3:]) + "\n")
    refused(capsys, install + ["--trusted-key", str(public), "--signature", str(edited)],
            "the trusted comment was changed after signing")

    for name, text, needle in [("garbage.minisig", "not a signature\n", "not a minisign signature"),
                               ("short.minisig", "\n".join([lines[0], "RUQ=", lines[2], lines[3]]), "bytes where"),
                               ("binary.minisig", None, "not text")]:
        path = tmp_path / name
        path.write_bytes(b"\xff\xfe\x00" * 10) if text is None else path.write_text(text)
        refused(capsys, install + ["--trusted-key", str(public), "--signature", str(path)], str(path), needle)
    bad_key = tmp_path / "bad.pub"
    bad_key.write_text("untrusted comment: x\nnot base64 !!\n")
    refused(capsys, install + ["--trusted-key", str(bad_key)], f"{bad_key}: public key: not base64")
    bad_key.write_text("untrusted comment: x\n" + "A" * 56 + "\n")
    refused(capsys, install + ["--trusted-key", str(bad_key)], "is not Ed25519")
    refused(capsys, install + ["--trusted-key", str(tmp_path / "absent.pub")], "cannot read the public key")
    bad_secret = tmp_path / "bad.key"
    bad_secret.write_text("untrusted comment: x\n" + secret.read_text().splitlines()[1][:-8] + "\n")
    refused(capsys, ["bundle", "sign", str(bundle), "--key", str(bad_secret)], str(bad_secret))
    assert not dest.exists()  # nothing was installed by any refused command

    assert main(install + ["--trusted-key", str(public), "--no-c-launchers"]) == 0
    assert "installed 2" in capsys.readouterr().out


def test_keygen_refuses_to_overwrite_a_key(tmp_path, capsys):
    secret, _ = keygen(tmp_path)
    before = secret.read_bytes()
    refused(capsys, ["bundle", "keygen", str(tmp_path / "k")], "exists; refusing to overwrite a key")
    assert secret.read_bytes() == before


@pytest.mark.slow
def test_an_encrypted_minisign_key_signs_with_its_password(bundle, tmp_path, capsys):
    """minisign's default keys are encrypted (scrypt, 1 GiB): tritonwarm derives the same key."""
    minisign = tool("minisign")
    secret, public = tmp_path / "e.key", tmp_path / "e.pub"
    subprocess.run([minisign, "-G", "-p", str(public), "-s", str(secret)], input="pw\npw\n", text=True,
                   check=True, capture_output=True)
    wrong = tmp_path / "wrong"
    wrong.write_text("not it\n")
    refused(capsys, ["bundle", "sign", str(bundle), "--key", str(secret), "--password-file", str(wrong)],
            "wrong password")
    password = tmp_path / "pw"
    password.write_text("pw\n")
    assert main(["bundle", "sign", str(bundle), "--key", str(secret), "--password-file", str(password)]) == 0
    proc = subprocess.run([minisign, "-Vm", str(bundle), "-p", str(public)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_without_cryptography_signing_says_what_to_install(bundle, tmp_path, capsys, monkeypatch):
    secret, public = keygen(tmp_path)
    for name in [m for m in sys.modules if m == "cryptography" or m.startswith("cryptography.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "cryptography", None)  # import cryptography raises ImportError
    refused(capsys, ["bundle", "sign", str(bundle), "--key", str(secret)], "pip install 'tritonwarm[sign]'")
