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
    assert comment["name"] == "warm.tar.gz" and comment["targets"] == "sm90"  # the claim, signed
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


# ------------------------------------------------------------------ the signature binds the claim


def _layout_of(made, folder, tag, dtype):
    """An OCI layout holding one image, tagged ``tag``: the rms_norm entries of one dtype."""
    root, spec, _ = made
    one = folder / f"{tag}.yaml"
    one.write_text(SPEC.replace("[float16, bfloat16]", f"[{dtype}]"))
    assert main(["bundle", "create", f"oci:{folder / tag}:{tag}", str(one), "--target", "sm90", "--cache-dir",
                 str(root / "warmed"), "--oci"]) == 0
    return folder / tag


def _copy_image(source: Path, source_tag: str, dest: Path, dest_tag: str) -> None:
    """``skopeo copy oci:SOURCE:TAG oci:DEST:TAG2``, or the same by hand on the layout where skopeo is absent."""
    skopeo = shutil.which("skopeo")
    if skopeo is not None:
        subprocess.run([skopeo, "copy", "--quiet", f"oci:{source}:{source_tag}", f"oci:{dest}:{dest_tag}"],
                       check=True, capture_output=True, stdin=subprocess.DEVNULL)
        return
    import json

    for blob in (source / "blobs" / "sha256").iterdir():
        shutil.copy(blob, dest / "blobs" / "sha256" / blob.name)
    found = next(m for m in json.loads((source / "index.json").read_text())["manifests"]
                 if m["annotations"]["org.opencontainers.image.ref.name"] == source_tag)
    index = json.loads((dest / "index.json").read_text())
    index["manifests"] = [m for m in index["manifests"]
                          if m["annotations"]["org.opencontainers.image.ref.name"] != dest_tag]
    index["manifests"].append({**found, "annotations": {"org.opencontainers.image.ref.name": dest_tag}})
    (dest / "index.json").write_text(json.dumps(index))


def test_an_image_copied_under_another_signed_tag_is_refused(made, tmp_path, capsys):
    """Two images, silu and rms, both signed by one trusted key; `skopeo copy oci:B:rms oci:A:silu`:
    installing oci:A:silu must not install rms's entries with "signature: good"."""
    secret, public = keygen(tmp_path)
    a, b = _layout_of(made, tmp_path, "silu", "float16"), _layout_of(made, tmp_path, "rms", "bfloat16")
    for layout, tag in ((a, "silu"), (b, "rms")):
        assert main(["bundle", "sign", f"oci:{layout}:{tag}", "--key", str(secret)]) == 0
    trust = ["--require-signature", "--trusted-key", str(public), "--no-c-launchers"]
    assert main(["bundle", "install", f"oci:{a}:silu", "--cache-dir", str(tmp_path / "ok"), *trust]) == 0
    capsys.readouterr()
    _copy_image(b, "rms", a, "silu")
    refused(capsys, ["bundle", "install", f"oci:{a}:silu", "--cache-dir", str(tmp_path / "swapped"), *trust],
            "signed as 'rms', not as 'silu' that was asked for")
    assert not (tmp_path / "swapped").exists()
    # a registry reference asks for its tag (or, signed with --name, its repository too)
    assert signing.name_matches("rms", "127.0.0.1:5000/kernels/x:rms")
    assert signing.name_matches("kernels/x:rms", "127.0.0.1:5000/kernels/x:rms")
    assert not signing.name_matches("kernels/x:rms", "127.0.0.1:5000/kernels/y:rms")
    assert not signing.name_matches("rms", "127.0.0.1:5000/kernels/x:silu")
    # the same for a file: renamed, it is refused unless --name says what to expect
    bundle = made[2]
    renamed = tmp_path / "silu.tar.gz"
    shutil.copy(bundle, renamed)
    assert main(["bundle", "sign", str(renamed), "--key", str(secret), "--name", "rms.tar.gz"]) == 0
    refused(capsys, ["bundle", "verify", str(renamed), "--trusted-key", str(public)],
            "signed as 'rms.tar.gz', not as 'silu.tar.gz'")
    assert main(["bundle", "verify", str(renamed), "--trusted-key", str(public), "--name", "rms.tar.gz"]) == 0


def test_an_older_signed_bundle_under_the_same_name_is_refused(bundle, tmp_path, capsys, monkeypatch):
    """A rollback: the signature time, against --not-older-than and against what this cache installed."""
    import time

    secret, public = keygen(tmp_path)
    old = tmp_path / "old" / "warm.tar.gz"
    old.parent.mkdir()
    shutil.copy(bundle, old)
    now = time.time()
    monkeypatch.setattr(signing.time, "time", lambda: now - 30 * 86400)  # signed a month ago
    assert main(["bundle", "sign", str(old), "--key", str(secret)]) == 0
    monkeypatch.setattr(signing.time, "time", lambda: now)
    assert main(["bundle", "sign", str(bundle), "--key", str(secret)]) == 0
    trust = ["--require-signature", "--trusted-key", str(public), "--no-c-launchers"]
    since = time.strftime("%Y-%m-%d", time.gmtime(now - 86400))
    refused(capsys, ["bundle", "verify", str(old), "--trusted-key", str(public), "--not-older-than", since],
            "older than --not-older-than", "(a rollback?)")
    served = tmp_path / "served"
    assert main(["bundle", "install", str(bundle), "--cache-dir", str(served), *trust]) == 0
    capsys.readouterr()
    refused(capsys, ["bundle", "install", str(old), "--cache-dir", str(served), *trust],
            "older than the bundle signed", "installed here under the name 'warm.tar.gz'", "a rollback")
    assert main(["bundle", "install", str(old), "--cache-dir", str(served), *trust, "--allow-rollback"]) == 0
    assert main(["bundle", "install", str(bundle), "--cache-dir", str(served), *trust]) == 0  # the newer one again
    capsys.readouterr()
    refused(capsys, ["bundle", "verify", str(bundle), "--trusted-key", str(public), "--not-older-than", "yesterday"],
            "expected a date")


@pytest.mark.slow
def test_a_bundle_signed_for_gfx942_is_refused_where_sm90_is_asked_for(made, tmp_path, capsys):
    root, spec, _ = made
    one = tmp_path / "one.yaml"
    one.write_text(SPEC.replace("[float16, bfloat16]", "[bfloat16]"))
    assert warm(plan(load_specs([one]), TARGETS["gfx942"]), tmp_path / "amd").failed == 0
    amd = tmp_path / "warm.tar.gz"
    assert main(["bundle", "create", str(amd), str(one), "--target", "gfx942", "--cache-dir",
                 str(tmp_path / "amd")]) == 0
    secret, public = keygen(tmp_path)
    assert main(["bundle", "sign", str(amd), "--key", str(secret)]) == 0
    trust = ["--require-signature", "--trusted-key", str(public), "--no-c-launchers"]
    refused(capsys, ["bundle", "install", str(amd), "--cache-dir", str(tmp_path / "sm90"), "--target", "sm90", *trust],
            "signed for gfx942, not for sm90 that was asked for")
    assert not (tmp_path / "sm90").exists()
    assert main(["bundle", "install", str(amd), "--cache-dir", str(tmp_path / "mi300"), "--target", "mi300x",
                 *trust]) == 0
