"""Bundles as OCI images: the layout a registry and skopeo take, labelled as MCV/GKM kernel-cache images
are, pushed to a real registry on loopback, pulled into a fresh folder at another path and installed;
Triton's own runtime then compiles nothing. A changed byte or another key is refused in one line."""

import gzip
import hashlib
import importlib.util
import io
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tarfile
import time
import urllib.request
from pathlib import Path

import pytest
from tritonwarm.cli import main
from tritonwarm.jit import TARGETS
from tritonwarm.jit.cache import oci, signing
from tritonwarm.jit.cache.bundle import BundleError, Limits
from tritonwarm.jit.pipeline.check import check
from tritonwarm.jit.pipeline.plan import plan
from tritonwarm.jit.pipeline.specs import load_specs
from tritonwarm.jit.pipeline.warmup import warm
from tritonwarm.jit.serving.c_launchers import builds_per_signature

if importlib.util.find_spec("cryptography") is None and os.environ.get("CI") != "true":
    pytest.skip("cryptography is not installed (pip install 'tritonwarm[sign]')", allow_module_level=True)


def tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"{name} is required under CI=true (.ci/run installs it)")
        pytest.skip(f"{name} is not installed")
    return path


@pytest.fixture
def registry(tmp_path):
    """A real registry (Debian's docker-registry) on a free loopback port, storing into a temp folder."""
    exe = tool("docker-registry")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    config = tmp_path / "registry.yml"
    config.write_text(f"version: 0.1\nlog:\n  level: error\nstorage:\n  filesystem:\n    rootdirectory: "
                      f"{tmp_path / 'registry-data'}\nhttp:\n  addr: 127.0.0.1:{port}\n")
    log = open(tmp_path / "registry.log", "wb")
    proc = subprocess.Popen([exe, "serve", str(config)], stdout=log, stderr=log, stdin=subprocess.DEVNULL)
    try:
        for _ in range(200):  # bounded: 20 s at most
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/", timeout=1) as answer:
                    if answer.status == 200:
                        break
            except OSError:
                time.sleep(0.1)
            assert proc.poll() is None, (tmp_path / "registry.log").read_text()
        else:
            pytest.fail("the registry did not answer in 20 s")
        yield f"127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(timeout=20)
        log.close()


def skopeo(*args):
    proc = subprocess.run([tool("skopeo"), *args], capture_output=True, text=True, timeout=300,
                          stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def refused(capsys, argv, *needles):
    assert main(argv) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tritonwarm: error: "), captured.err
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


def _layer_members(layout: Path) -> dict[str, bytes]:
    image = oci.open_image(layout)
    with tarfile.open(image.layer, "r:gz") as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers()}


def _create(layout, spec_file, cache_dir, *extra):
    assert main(["bundle", "create", str(layout), str(spec_file), "--target", "sm90", "--cache-dir", str(cache_dir),
                 "--oci", *extra]) == 0


def test_layout_is_an_mcv_compat_image_an_operator_mounts_as_is(tmp_path, spec_file, compile_counter,
                                                                  rms_norm_runtime, capsys):
    """One layer: the cache under io.triton.cache/, MCV's manifest, the labels MCV writes; extracted as MCV
    extracts it (the cache folder at the path given to --serve-at), Triton's own lookup hits every entry."""
    target, warmed = TARGETS["sm90"], tmp_path / "warmed"
    the_plan = plan(load_specs([spec_file]), target)
    warm(the_plan, warmed)
    layout, mounted = tmp_path / "image", tmp_path / "node" / "triton-cache"
    _create(layout, spec_file, warmed, "--tag", "sm90", "--serve-at", str(mounted))
    assert f"bundle: oci:{layout}:sm90: 2 entries (sm90: 2)" in capsys.readouterr().out

    assert json.loads((layout / "oci-layout").read_text()) == {"imageLayoutVersion": "1.0.0"}
    index = json.loads((layout / "index.json").read_text())
    assert [m["annotations"]["org.opencontainers.image.ref.name"] for m in index["manifests"]] == ["sm90"]
    image = oci.open_image(layout, "sm90")
    manifest = image.manifest
    assert manifest["mediaType"] == "application/vnd.oci.image.manifest.v1+json"
    assert [layer["mediaType"] for layer in manifest["layers"]] == ["application/vnd.oci.image.layer.v1.tar+gzip"]
    header = json.loads(_layer_members(layout)["tritonwarm-bundle.json"])
    assert manifest["annotations"]["io.tritonwarm.bundle.fingerprint"] == \
        signing.fingerprint_digest(header["fingerprint"])
    assert manifest["annotations"]["io.tritonwarm.bundle.entries"] == "2"
    config_blob = layout / "blobs" / "sha256" / manifest["config"]["digest"].split(":")[1]
    config = json.loads(config_blob.read_text())
    labels = config["config"]["Labels"]
    members = _layer_members(layout)
    cache_members = {n: d for n, d in members.items() if n.startswith("io.triton.cache/")}
    assert labels["cache.triton.image/entry-count"] == "2"
    assert json.loads(labels["cache.triton.image/summary"]) == {"targets": [{"backend": "cuda", "arch": "90",
                                                                            "warp_size": 32}]}
    assert labels["cache.triton.image/cache-size-bytes"] == str(sum(map(len, cache_members.values())))
    with gzip.open(image.layer) as plain:  # the config names the uncompressed layer
        assert config["rootfs"]["diff_ids"] == [f"sha256:{hashlib.sha256(plain.read()).hexdigest()}"]
    mcv = json.loads(members["io.triton.manifest/manifest.json"])["triton"]
    assert sorted(row["hash"] for row in mcv) == sorted(the_plan.variants)
    assert set(members) == {"tritonwarm-bundle.json", "io.triton.manifest/manifest.json", *cache_members}

    shutil.rmtree(warmed)
    for name, data in cache_members.items():  # what MCV's extract does: io.triton.cache/ into the cache dir
        path = mounted / name.split("/", 1)[1]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    before = compile_counter.count
    for rows in (1, 7, 4096):
        for fused in (False, True):
            assert rms_norm_runtime(target, mounted, rows, fused).hash in the_plan.variants
    assert compile_counter.count == before


@pytest.mark.slow
def test_signed_image_through_a_registry_installs_at_another_path_and_compiles_nothing(
        tmp_path, spec_file, compile_counter, rms_norm_runtime, registry, capsys, served_from_bundle):
    minisign = tool("minisign")
    target, build = TARGETS["sm90"], tmp_path / "build"
    the_plan = plan(load_specs([spec_file]), target)
    warm(the_plan, build / "cache")
    layout = build / "image"
    _create(layout, spec_file, build / "cache", "--tag", "sm90")
    assert main(["bundle", "keygen", str(tmp_path / "k")]) == 0
    assert main(["bundle", "keygen", str(tmp_path / "other")]) == 0
    public, other_public = tmp_path / "k.pub", tmp_path / "other.pub"
    reference = f"{registry}/tritonwarm/rms:sm90"

    skopeo("copy", "--dest-tls-verify=false", f"oci:{layout}:sm90", f"docker://{reference}")  # unsigned
    refused(capsys, ["bundle", "install", reference, "--no-tls-verify", "--cache-dir", str(tmp_path / "x"),
                     "--require-signature", "--trusted-key", str(public)], "not signed", "--require-signature")
    assert main(["bundle", "sign", f"oci:{layout}:sm90", "--key", str(tmp_path / "k.key")]) == 0
    skopeo("copy", "--dest-tls-verify=false", f"oci:{layout}:sm90", f"docker://{reference}")
    shutil.rmtree(build)  # the build machine is gone
    capsys.readouterr()
    inspected = json.loads(skopeo("inspect", "--tls-verify=false", f"docker://{reference}"))
    assert inspected["Labels"]["cache.triton.image/entry-count"] == "2"

    served = tmp_path / "srv" / "cache"  # a fresh folder at another path
    assert main(["bundle", "install", reference, "--no-tls-verify", "--cache-dir", str(served),
                 "--require-signature", "--trusted-key", str(public)]) == 0
    out = capsys.readouterr().out
    assert "installed 2, already there 0 of 2" in out
    assert f"signature: good, by trusted key {signing.read_public_key(public).id_text}" in out
    report = check(plan(load_specs([spec_file]), target), served)
    assert report.ok or (served_from_bundle(report) and not builds_per_signature("cuda")), report
    assert main(["check", str(spec_file), "--target", "sm90", "--cache-dir", str(served)]) == (0 if report.ok else 1)
    before = compile_counter.count
    for rows in (1, 7, 4096):
        for fused in (False, True):
            assert rms_norm_runtime(target, served, rows, fused).hash in the_plan.variants
    assert compile_counter.count == before

    pulled = tmp_path / "pulled"  # as the docs show: minisign verifies the layer with the annotation
    skopeo("copy", "--src-tls-verify=false", f"docker://{reference}", f"oci:{pulled}:sm90")
    assert main(["bundle", "verify", f"oci:{pulled}:sm90", "--trusted-key", str(public)]) == 0
    capsys.readouterr()
    image = oci.open_image(pulled, "sm90")
    sig = tmp_path / "layer.minisig"
    sig.write_text(image.annotations[oci.SIGNATURE_ANNOTATION])
    proc = subprocess.run([minisign, "-Vm", str(image.layer), "-x", str(sig), "-p", str(public)],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr

    refused(capsys, ["bundle", "install", reference, "--no-tls-verify", "--cache-dir", str(tmp_path / "y"),
                     "--trusted-key", str(other_public)], "signed by another key")

    # one byte of the layer changed: the digest no longer matches ...
    data = bytearray(image.layer.read_bytes())
    data[len(data) // 2] ^= 0x01
    image.layer.write_bytes(bytes(data))
    refused(capsys, ["bundle", "install", f"oci:{pulled}:sm90", "--cache-dir", str(tmp_path / "y")],
            "does not match its digest")
    # ... and with the digests recomputed (whoever controls the registry can), the signature refuses it
    _redigest(pulled, image, bytes(data))
    skopeo("copy", "--dest-tls-verify=false", f"oci:{pulled}:sm90", f"docker://{registry}/tritonwarm/rms:changed")
    refused(capsys, ["bundle", "install", f"{registry}/tritonwarm/rms:changed", "--no-tls-verify", "--cache-dir",
                     str(tmp_path / "y"), "--require-signature", "--trusted-key", str(public)],
            "the signature does not match the archive")
    assert not (tmp_path / "y").exists() and not (tmp_path / "x").exists()


def _redigest(layout: Path, image, layer: bytes) -> None:
    """Store ``layer`` as the image's layer under its own digest, as a forger with the registry would."""
    digest = hashlib.sha256(layer).hexdigest()
    (layout / "blobs" / "sha256" / digest).write_bytes(layer)
    manifest = {**image.manifest, "layers": [{**image.manifest["layers"][0], "digest": f"sha256:{digest}",
                                              "size": len(layer)}]}
    raw = json.dumps(manifest).encode()
    manifest_digest = hashlib.sha256(raw).hexdigest()
    (layout / "blobs" / "sha256" / manifest_digest).write_bytes(raw)
    index = json.loads((layout / "index.json").read_text())
    index["manifests"][0].update(digest=f"sha256:{manifest_digest}", size=len(raw))
    (layout / "index.json").write_text(json.dumps(index))


def _layout_with_layer(tmp_path, members: list[tuple[tarfile.TarInfo, bytes | None]], name="hostile") -> Path:
    layout = tmp_path / name
    (layout / "blobs" / "sha256").mkdir(parents=True)
    (layout / "oci-layout").write_text('{"imageLayoutVersion": "1.0.0"}')
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz", format=tarfile.PAX_FORMAT) as tar:
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    layer = buffer.getvalue()
    (layout / "blobs" / "sha256" / hashlib.sha256(layer).hexdigest()).write_bytes(layer)
    manifest = json.dumps({"schemaVersion": 2, "mediaType": oci.MANIFEST_MEDIA_TYPE, "config": {},
                           "layers": [{"mediaType": oci.LAYER_MEDIA_TYPE, "size": len(layer),
                                       "digest": f"sha256:{hashlib.sha256(layer).hexdigest()}"}]}).encode()
    (layout / "blobs" / "sha256" / hashlib.sha256(manifest).hexdigest()).write_bytes(manifest)
    (layout / "index.json").write_text(json.dumps({"schemaVersion": 2, "manifests": [
        {"mediaType": oci.MANIFEST_MEDIA_TYPE, "size": len(manifest),
         "digest": f"sha256:{hashlib.sha256(manifest).hexdigest()}"}]}))
    return layout


def _file(name: str, data: bytes = b"x") -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    return info, data


def test_hostile_layers_and_layouts_are_refused_in_one_line(tmp_path, capsys):
    header = _file("tritonwarm-bundle.json", b"{}")
    link = tarfile.TarInfo("io.triton.cache/ABC/x.json")
    link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
    bomb = tarfile.TarInfo("io.triton.cache/ABC/" + "a" * 80)  # a pax header of over 64 KiB
    bomb.pax_headers = {"comment": "x" * (200 << 10)}
    cases = [
        ([_file("io.triton.cache/ABC/x.json")], "not a tritonwarm image"),
        ([header, _file("etc/passwd")], "outside the image's layout"),
        ([header, _file("io.triton.cache/../x")], "climbs out with '..'"),
        ([header, _file("io.triton.cache/ABC/.x")], "is not <entry folder>/<file name>"),
        ([header, _file("io.triton.cache/ABC/sub/x")], "outside the image's layout"),
        ([header, (link, None)], "not a regular file"),
        ([header, (bomb, b"")], "pax extended header of"),
        ([header], "tritonwarm-bundle.json"),  # the header itself is checked by the bundle reader
    ]
    dest = tmp_path / "dest"
    for number, (members, needle) in enumerate(cases):
        layout = _layout_with_layer(tmp_path, members, f"case{number}")
        refused(capsys, ["bundle", "install", str(layout), "--cache-dir", str(dest)], str(layout), needle)
        refused(capsys, ["bundle", "verify", f"oci:{layout}"], needle)
    assert not dest.exists() or not any(p for p in dest.iterdir() if p.name != "tritonwarm")

    layout = tmp_path / "case0"
    index = json.loads((layout / "index.json").read_text())
    index["manifests"][0]["digest"] = "sha256:../../../etc/passwd"
    (layout / "index.json").write_text(json.dumps(index))
    refused(capsys, ["bundle", "verify", str(layout)], "is not sha256:<64 hex digits>")
    refused(capsys, ["bundle", "verify", f"oci:{layout}:nosuchtag"], "no image tagged 'nosuchtag'")
    (layout / "oci-layout").unlink()
    refused(capsys, ["bundle", "verify", str(layout)], "not an OCI image layout")


def test_sources_are_told_apart(tmp_path):
    bundle = tmp_path / "warm.tar.gz"
    bundle.write_bytes(b"")
    (tmp_path / "layout").mkdir()
    assert oci.parse_source(str(bundle)) == oci.Source("bundle", bundle)
    assert oci.parse_source(str(tmp_path / "layout")) == oci.Source("layout", tmp_path / "layout")
    assert oci.parse_source(f"oci:{tmp_path}/layout:sm90") == oci.Source("layout", tmp_path / "layout", "sm90")
    assert oci.parse_source(f"oci:{tmp_path}/layout") == oci.Source("layout", tmp_path / "layout")
    assert oci.parse_source("127.0.0.1:5000/warm:sm90") == oci.Source("registry", reference="127.0.0.1:5000/warm:sm90")
    assert oci.parse_source("registry.example/team/warm:v1").kind == "registry"
    assert oci.parse_source("docker://localhost/warm:v1") == oci.Source("registry", reference="localhost/warm:v1")
    assert oci.parse_source("missing.tar.gz") == oci.Source("bundle", Path("missing.tar.gz"))
    assert oci.parse_source("sub/missing.tar.gz").kind == "bundle"


def test_pulling_without_skopeo_says_what_to_install(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    refused(capsys, ["bundle", "install", "127.0.0.1:1/warm:v1", "--cache-dir", str(tmp_path / "d")],
            "needs skopeo")


@pytest.mark.slow
def test_the_docs_commands_run_as_written(tmp_path, registry, spec_file):
    """Every bash block of docs/signed-bundles.md, in order, in a fresh folder, against a loopback registry."""
    tool("minisign")
    tool("skopeo")
    doc = Path(__file__).resolve().parent.parent / "docs" / "signed-bundles.md"
    blocks = re.findall(r"```bash\n(.*?)```", doc.read_text(), re.S)
    assert len(blocks) >= 5
    work, bin_dir = tmp_path / "work", tmp_path / "bin"
    work.mkdir()
    bin_dir.mkdir()
    shutil.copy(spec_file, work / "rms.yaml")
    wrapper = bin_dir / "tritonwarm"  # the console script, as this Python runs tritonwarm
    wrapper.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m tritonwarm "$@"\n')
    wrapper.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "REGISTRY": registry}
    proc = subprocess.run(["bash", "-euo", "pipefail", "-c", "\n".join(blocks)], cwd=work, env=env,
                          capture_output=True, text=True, timeout=900, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert proc.stdout.count("Signature and comment signature verified") == 2
    assert proc.stdout.count("signature: good, by trusted key") == 5
    assert "installed 2, already there 0 of 2 entries into" in proc.stdout
    assert "sm90: ok: 2 variants planned from " in proc.stdout and ", 0 missing" in proc.stdout


def test_layer_members_are_counted_as_they_are_read(tmp_path):
    """A layer of more members than a bundle may hold (and MCV's manifest) stops at the count, before
    the bundle it would become is written whole."""
    layout = _layout_with_layer(tmp_path, [_file("tritonwarm-bundle.json", b"{}")]
                                + [_file(f"io.triton.cache/ABC/f{i}.json") for i in range(5)])
    with pytest.raises(BundleError, match="more than 4 members"):
        oci.layer_to_bundle(oci.open_image(layout), tmp_path / "out.tar.gz", Limits(members=3))
