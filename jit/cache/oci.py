"""Bundles as OCI images: a layout folder that registries, skopeo and kernel-cache operators take as is.

An image is one layer (a gzip tar) holding:

- ``tritonwarm-bundle.json``: the bundle's header (fingerprint, manifest rows, each file's sha256);
- ``io.triton.cache/<entry dir>/<file>``: the cache relative to its root, groups included;
- ``io.triton.manifest/manifest.json``: the entries' targets, as Red Hat's MCV writes it.

The folder names and the image config's labels (``cache.triton.image/entry-count``, ``/summary``,
``/cache-size-bytes``) are those of MCV's "compat" kernel-cache images, which GKM (GPU Kernel
Manager) extracts and mounts; other members are skipped by them. Groups name their files relative to
the cache root unless ``serve_at`` gives the path the operator mounts the cache at (Triton reads
absolute paths). The manifest carries the fingerprint's digest and the entry count as annotations,
and a tritonwarm signature (minisign text over the layer blob) once ``bundle sign`` has signed it.

Installing reads the layout (or pulls a registry reference into one with ``skopeo``), checks each
blob against its digest and the signature over the layer before parsing anything in it, then turns
the layer back into a plain bundle and installs that, with every check a bundle gets.
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import io
import json
import os
import platform
import re
import shutil
import subprocess
import tarfile
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from . import signing
from .bundle import HEADER_NAME, BundleError, BundleReport, Limits, check_member, open_archive, read_header, summary
from .layout import file_mode

LAYER_MEDIA_TYPE = "application/vnd.oci.image.layer.v1.tar+gzip"
_LAYER_MEDIA_TYPES = (LAYER_MEDIA_TYPE, "application/vnd.docker.image.rootfs.diff.tar.gzip")
MANIFEST_MEDIA_TYPE = "application/vnd.oci.image.manifest.v1+json"
CONFIG_MEDIA_TYPE = "application/vnd.oci.image.config.v1+json"
CACHE_FOLDER = "io.triton.cache"  # MCV's compat layout: the cache tree, and MCV's own manifest
MCV_MANIFEST = "io.triton.manifest/manifest.json"
LABEL_PREFIX = "cache.triton.image/"  # MCV's image config labels for a Triton cache
ANNOTATION_PREFIX = "io.tritonwarm.bundle."
SIGNATURE_ANNOTATION = ANNOTATION_PREFIX + "signature"
REF_NAME = "org.opencontainers.image.ref.name"
DEFAULT_TAG = "latest"
_DIGEST = re.compile(r"sha256:([0-9a-f]{64})")
_TAG = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]{0,127}")
_PLAIN = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]{0,254}")  # a Triton entry folder or file name, no ".."
_JSON_MAX = 4 << 20  # index.json, a manifest, a config
_LIMITS = Limits()


class _Hashing(io.RawIOBase):
    """A writer that hashes and counts what passes: a blob's digest and size, a layer's diff id."""

    def __init__(self, inner):
        self.inner = inner
        self.digest, self.count = hashlib.sha256(), 0

    def writable(self) -> bool:
        return True

    def write(self, data) -> int:
        self.digest.update(data)
        self.count += len(data)
        return self.inner.write(data)


@contextlib.contextmanager
def _writing_tar_gz(out: Path):
    """``(tar, diff digest, blob digest)``: a byte-reproducible gzip tar, hashed as it is written."""
    with open(out, "wb") as raw:
        blob = _Hashing(raw)
        with gzip.GzipFile(filename="", mode="wb", fileobj=blob, mtime=0, compresslevel=6) as gz:
            diff = _Hashing(gz)
            with tarfile.open(fileobj=diff, mode="w|", format=tarfile.PAX_FORMAT) as tar:
                yield tar, diff, blob


def _add(tar: tarfile.TarFile, name: str, data: bytes | None = None, *, size: int = 0, stream=None) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = (len(data) if data is not None else size), 0o644, 0
    tar.addfile(info, io.BytesIO(data) if data is not None else stream)


# ---------------------------------------------------------------------------------------------- create


def bundle_to_layout(bundle: Path, out: Path, *, tag: str = DEFAULT_TAG, serve_at: Path | None = None,
                     limits: Limits = _LIMITS) -> BundleReport:
    """Write the image of a (trusted, just made) bundle into the OCI layout folder ``out``.

    A layout that exists gets the image added under ``tag`` (replacing an image of that tag)."""
    out, header = Path(out), read_header(bundle, limits)
    if not _TAG.fullmatch(tag):
        raise BundleError(f"tag {tag!r} is not a valid image tag")
    if serve_at is not None and not Path(serve_at).is_absolute():
        raise BundleError(f"--serve-at {str(serve_at)!r} is not an absolute path (Triton reads groups as given)")
    _prepare_layout(out)
    names = {row["entry_dir"]: row["entry_name"] for rows in header["targets"].values() for row in rows.values()}
    blobs = out / "blobs" / "sha256"
    fd, tmp = tempfile.mkstemp(dir=blobs, prefix=".layer-", suffix=".tmp")
    os.close(fd)
    entries, cache_bytes = [], 0
    try:
        with _writing_tar_gz(Path(tmp)) as (tar, diff, blob), open_archive(bundle, limits) as source:
            while (member := source.next()) is not None:
                check_member(member, bundle, limits.member_bytes)
                if member.name == HEADER_NAME:
                    _add(tar, HEADER_NAME, source.read())
                    continue
                entry_dir, _, name = member.name.partition("/")
                if entry_dir not in names or not _PLAIN.fullmatch(name):
                    raise BundleError(f"{bundle}: member {member.name[:100]!r} is outside the expected layout "
                                      "(<entry folder>/<file> of an entry the header lists); refused")
                if name.startswith("__grp__"):
                    children = _group_children(_json_member(source, member, bundle), bundle, member.name)
                    at = f"{serve_at}/" if serve_at is not None else ""
                    data = json.dumps({"child_paths": {n: f"{at}{entry_dir}/{n}" for n in children}},
                                      sort_keys=True).encode()
                    _add(tar, f"{CACHE_FOLDER}/{member.name}", data)
                    cache_bytes += len(data)
                    continue
                if name == f"{names[entry_dir][:150]}.json":
                    data = _json_member(source, member, bundle)
                    entries.append(_mcv_entry(data, bundle, member.name))
                    _add(tar, f"{CACHE_FOLDER}/{member.name}", data)
                else:
                    _add(tar, f"{CACHE_FOLDER}/{member.name}", size=member.size, stream=source)
                cache_bytes += member.size
            _add(tar, MCV_MANIFEST, json.dumps({"triton": entries}, indent=1, sort_keys=True).encode())
        layer = {"mediaType": LAYER_MEDIA_TYPE, "digest": f"sha256:{blob.digest.hexdigest()}", "size": blob.count}
        os.chmod(tmp, file_mode())
        os.replace(tmp, blobs / blob.digest.hexdigest())
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    report = summary(bundle, header)
    fingerprint = signing.fingerprint_digest(header["fingerprint"])
    labels = {
        LABEL_PREFIX + "entry-count": str(report.entries),
        LABEL_PREFIX + "summary": json.dumps({"targets": _targets(entries)}, separators=(",", ":")),
        LABEL_PREFIX + "cache-size-bytes": str(cache_bytes),
        ANNOTATION_PREFIX + "fingerprint": fingerprint,
    }
    config = {"architecture": _architecture(), "os": "linux", "config": {"Labels": labels},
              "rootfs": {"type": "layers", "diff_ids": [f"sha256:{diff.digest.hexdigest()}"]}}
    annotations = {
        ANNOTATION_PREFIX + "fingerprint": fingerprint,
        ANNOTATION_PREFIX + "entries": str(report.entries),
        ANNOTATION_PREFIX + "targets": ",".join(sorted(header["targets"])),
        LABEL_PREFIX + "variant": "compat",
        "org.opencontainers.image.title": f"tritonwarm kernel cache ({', '.join(sorted(header['targets']))})",
    }
    manifest = {"schemaVersion": 2, "mediaType": MANIFEST_MEDIA_TYPE,
                "config": _put_json(out, config, CONFIG_MEDIA_TYPE), "layers": [layer], "annotations": annotations}
    _set_tag(out, tag, _put_json(out, manifest, MANIFEST_MEDIA_TYPE))
    report.path, report.archive_bytes = f"oci:{out}:{tag}", layer["size"]
    return report


def _prepare_layout(out: Path) -> None:
    if out.exists() and not (out / "oci-layout").is_file() and (not out.is_dir() or any(out.iterdir())):
        raise BundleError(f"{out} exists and is not an OCI image layout; give a new folder")
    (out / "blobs" / "sha256").mkdir(parents=True, exist_ok=True)
    if not (out / "oci-layout").is_file():
        _write_text(out / "oci-layout", json.dumps({"imageLayoutVersion": "1.0.0"}))


def _write_text(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.chmod(tmp, file_mode())
    os.replace(tmp, path)


def _put_json(out: Path, data: dict, media_type: str) -> dict:
    """Store ``data`` as a blob; its descriptor."""
    raw = json.dumps(data, sort_keys=True, indent=1).encode()
    digest = hashlib.sha256(raw).hexdigest()
    path = out / "blobs" / "sha256" / digest
    if not path.is_file():
        _write_text(path, raw.decode())
    return {"mediaType": media_type, "digest": f"sha256:{digest}", "size": len(raw)}


def _set_tag(out: Path, tag: str, descriptor: dict, replacing: str | None = None) -> None:
    """Point ``tag`` (and only it) at ``descriptor``; ``replacing``: a manifest digest the tag replaces."""
    index = _read_json(out / "index.json", "index.json") if (out / "index.json").exists() else \
        {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json", "manifests": []}
    kept = [m for m in index.get("manifests", []) if (m.get("annotations") or {}).get(REF_NAME) != tag
            and (replacing is None or m.get("digest") != replacing)]
    index["manifests"] = kept + [{**descriptor, "annotations": {REF_NAME: tag}}]
    _write_text(out / "index.json", json.dumps(index, sort_keys=True, indent=1))


def _json_member(source, member, where) -> bytes:
    """The bytes of a member that is parsed (a group, Triton's metadata): a few KiB, capped."""
    if member.size > _JSON_MAX:
        raise BundleError(f"{where}: member {member.name[:100]!r} is over {_JSON_MAX} bytes; not a group or metadata")
    return source.read()


def _mcv_entry(metadata: bytes, where, name: str) -> dict:
    """MCV's manifest row of one entry, from Triton's metadata file."""
    try:
        data = json.loads(metadata)
    except ValueError:
        data = None
    if not isinstance(data, dict):
        raise BundleError(f"{where}: member {name[:100]!r} is not Triton's metadata (a JSON object); refused")
    target = data.get("target") if isinstance(data.get("target"), dict) else {}
    row = {"hash": data.get("hash"), "backend": target.get("backend"), "arch": str(target.get("arch")),
           "warp_size": target.get("warp_size"), "num_warps": data.get("num_warps"),
           "num_stages": data.get("num_stages"), "debug": bool(data.get("debug"))}
    if data.get("ptx_version") is not None:
        row["ptx_version"] = data["ptx_version"]
    return row


def _targets(entries: list[dict]) -> list[dict]:
    seen = {(e["backend"], e["arch"], e["warp_size"]) for e in entries}
    return [{"backend": b, "arch": a, "warp_size": w} for b, a, w in sorted(seen, key=str)]


def _architecture() -> str:
    machine = platform.machine().lower()
    return {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64"}.get(machine, machine)


# ------------------------------------------------------------------------------------------------ read


@dataclass
class Image:
    layout: Path
    tag: str | None
    manifest: dict
    manifest_descriptor: dict
    layer: Path
    layer_digest: str  # hex

    @property
    def annotations(self) -> dict:
        return self.manifest.get("annotations") or {}

    @property
    def name(self) -> str:
        return f"oci:{self.layout}" + (f":{self.tag}" if self.tag else "")


def _read_json(path: Path, what: str, digest: str | None = None) -> dict:
    try:
        if path.is_symlink():
            raise BundleError(f"{what} is a symbolic link; refused")
        with open(path, "rb") as f:
            raw = f.read(_JSON_MAX + 1)
    except OSError as e:
        raise BundleError(f"{what}: {e.strerror or e}") from None
    if len(raw) > _JSON_MAX:
        raise BundleError(f"{what} is over {_JSON_MAX} bytes; refused")
    if digest is not None and hashlib.sha256(raw).hexdigest() != digest:
        raise BundleError(f"{what} does not match its digest; the layout was altered")
    try:
        data = json.loads(raw)
    except ValueError as e:
        raise BundleError(f"{what}: not JSON ({e})") from None
    if not isinstance(data, dict):
        raise BundleError(f"{what}: not a JSON object")
    return data


def _listed(tags: list) -> str:
    """Tags as a line can show them: escaped, a few of them."""
    shown = ", ".join(repr(str(t)[:64]) for t in tags[:8])
    return (shown + (f" and {len(tags) - 8} more" if len(tags) > 8 else "")) or "none"


def _blob(layout: Path, descriptor, what: str) -> tuple[Path, str]:
    digest = descriptor.get("digest") if isinstance(descriptor, dict) else None
    match = _DIGEST.fullmatch(digest) if isinstance(digest, str) else None
    if not match:
        raise BundleError(f"{layout}: {what}: digest {str(digest)[:80]!r} is not sha256:<64 hex digits>")
    return layout / "blobs" / "sha256" / match.group(1), match.group(1)


def open_image(layout: Path, tag: str | None = None) -> Image:
    """The image tagged ``tag`` (or the only one) of an OCI layout; its manifest checked against its digest."""
    layout = Path(layout)
    if not (layout / "oci-layout").is_file():
        raise BundleError(f"{layout}: not an OCI image layout (no oci-layout file)")
    index = _read_json(layout / "index.json", f"{layout}/index.json")
    manifests = index.get("manifests")
    if not isinstance(manifests, list) or not all(isinstance(m, dict) for m in manifests):
        raise BundleError(f"{layout}/index.json: no list of manifests")
    tags = [(m.get("annotations") or {}).get(REF_NAME) for m in manifests]
    if tag is not None:
        chosen = [m for m, t in zip(manifests, tags, strict=True) if t == tag]
        if not chosen:
            raise BundleError(f"{layout}: no image tagged {tag!r} (tags: {_listed(tags)})")
    elif len(manifests) != 1:
        raise BundleError(f"{layout}: {len(manifests)} images; name one with oci:{layout}:TAG (tags: {_listed(tags)})")
    else:
        chosen = manifests
    descriptor = chosen[-1]
    path, digest = _blob(layout, descriptor, "manifest")
    manifest = _read_json(path, f"{layout}: manifest {digest[:12]}", digest)
    layers = manifest.get("layers")
    if not isinstance(layers, list) or len(layers) != 1 or not isinstance(layers[0], dict):
        raise BundleError(f"{layout}: manifest {digest[:12]}: a tritonwarm image has exactly one layer")
    if layers[0].get("mediaType") not in _LAYER_MEDIA_TYPES:
        raise BundleError(f"{layout}: layer media type {str(layers[0].get('mediaType'))[:80]!r} is not a gzip tar")
    layer, layer_digest = _blob(layout, layers[0], "layer")
    _check_blob(layer, layer_digest, layers[0].get("size"), layout)
    return Image(layout, tag, manifest, descriptor, layer, layer_digest)


def _check_blob(path: Path, digest: str, size, layout: Path) -> None:
    """The layer's bytes are its digest's: checked before anything in it is parsed."""
    what = f"{layout}: layer {digest[:12]}"
    if path.is_symlink() or not path.is_file():
        raise BundleError(f"{what}: missing or not a regular file")
    if not isinstance(size, int) or os.path.getsize(path) != size:
        raise BundleError(f"{what}: {os.path.getsize(path)} bytes, the manifest says {size}; the layout was altered")
    sha = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            sha.update(chunk)
    if sha.hexdigest() != digest:
        raise BundleError(f"{what}: the content does not match its digest; the layer was altered")


def layer_to_bundle(image: Image, out: Path, limits: Limits = _LIMITS) -> None:
    """Turn the image's layer back into a plain bundle at ``out`` (which ``install`` then checks whole)."""
    what = f"{image.name}: layer"
    with _writing_tar_gz(Path(out)) as (tar, _, _), open_archive(image.layer, limits, what, "gzip tar") as source:
        count = 0
        while (member := source.next()) is not None:
            count += 1
            if count > limits.members + 1:  # a bundle's members, and MCV's manifest
                raise BundleError(f"{what}: more than {limits.members + 1} members")
            check_member(member, what, limits.member_bytes)
            name = member.name
            if count == 1 and name != HEADER_NAME:
                raise BundleError(f"{what}: the first member is {name[:100]!r}, not {HEADER_NAME}: not a "
                                  "tritonwarm image")
            if name == HEADER_NAME:
                if member.size > limits.header_bytes:
                    raise BundleError(f"{what}: {HEADER_NAME} ({member.size} bytes) is over the limit of "
                                      f"{limits.header_bytes} bytes")
                _add(tar, HEADER_NAME, size=member.size, stream=source)
            elif name == MCV_MANIFEST:
                continue
            elif name.startswith(CACHE_FOLDER + "/") and name.count("/") == 2:
                entry_dir, file_name = name.split("/")[1:]
                if not _PLAIN.fullmatch(entry_dir) or not _PLAIN.fullmatch(file_name):
                    raise BundleError(f"{what}: member {name[:100]!r} is not <entry folder>/<file name>; refused")
                if file_name.startswith("__grp__"):  # the bundle's form: relative children (install rewrites them)
                    children = _group_children(_json_member(source, member, what), what, name)
                    _add(tar, f"{entry_dir}/{file_name}",
                         json.dumps({"child_paths": {n: f"{entry_dir}/{n}" for n in children}}).encode())
                else:
                    _add(tar, f"{entry_dir}/{file_name}", size=member.size, stream=source)
            else:
                raise BundleError(f"{what}: member {name[:100]!r} is outside the image's layout "
                                  f"({HEADER_NAME}, {CACHE_FOLDER}/<entry>/<file>, {MCV_MANIFEST}); refused")
        if count == 0:
            raise BundleError(f"{what}: empty")


def _group_children(data: bytes, what: str, name: str) -> list[str]:
    try:
        children = json.loads(data)["child_paths"]
        if isinstance(children, dict) and all(isinstance(c, str) for c in children):
            return sorted(children)
    except (ValueError, KeyError, TypeError):
        pass
    raise BundleError(f"{what}: member {name[:100]!r} is not a Triton group file; refused")


def layer_header(image: Image, limits: Limits = _LIMITS) -> dict:
    """The bundle header the layer carries (read in full through ``read_header``'s checks)."""
    with tempfile.TemporaryDirectory(prefix="tritonwarm-oci-") as tmp:
        bundle = Path(tmp) / "layer.tar.gz"
        layer_to_bundle(image, bundle, limits)
        return read_header(bundle, limits)


# ---------------------------------------------------------------------------------------------- sources


@dataclass(frozen=True)
class Source:
    kind: str  # "bundle", "layout" or "registry"
    path: Path | None = None
    tag: str | None = None
    reference: str | None = None


def parse_source(text: str) -> Source:
    """What ``bundle verify|install|sign`` were given: a bundle file, an OCI layout (a folder,
    ``oci:DIR[:TAG]``) or a registry reference (``docker://REF``, or ``HOST[:PORT]/REPO:TAG``)."""
    text = str(text)
    if text.startswith("oci:"):
        rest = text[4:]
        if Path(rest).is_dir() or ":" not in rest:
            return Source("layout", Path(rest))
        folder, tag = rest.rsplit(":", 1)
        return Source("layout", Path(folder), tag)
    if text.startswith("docker://"):
        return Source("registry", reference=text[len("docker://"):])
    path = Path(text)
    if path.is_dir():
        return Source("layout", path)
    if path.exists():
        return Source("bundle", path)
    host = text.split("/", 1)[0]
    named_host = "." in host or ":" in host or host == "localhost"  # as docker tells a registry from a path
    if "/" in text and named_host and not text.endswith((".tar.gz", ".tgz")) and not text.startswith(("/", ".")):
        return Source("registry", reference=text)
    return Source("bundle", path)


def pull(reference: str, into: Path, *, tls_verify: bool = True) -> Image:
    """Copy a registry image into an OCI layout with skopeo (the containers' own client)."""
    skopeo = shutil.which("skopeo")
    if skopeo is None:
        raise BundleError(f"pulling {reference} needs skopeo (e.g. apt-get install skopeo), or copy the image "
                          "into an OCI layout folder and give oci:DIR:TAG")
    command = [skopeo, "copy", "--quiet", f"--src-tls-verify={'true' if tls_verify else 'false'}",
               f"docker://{reference}", f"oci:{into}:{DEFAULT_TAG}"]
    try:
        proc = subprocess.run(command, capture_output=True, text=True, timeout=900, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise BundleError(f"skopeo copy docker://{reference}: no answer in 900 s") from None
    if proc.returncode != 0:
        lines = [line for line in (proc.stderr or proc.stdout).splitlines() if line.strip()]
        last = (lines[-1] if lines else "")[:300]
        raise BundleError(f"skopeo copy docker://{reference} failed: "
                          + "".join(c if c.isprintable() else repr(c)[1:-1] for c in last))
    return open_image(into, DEFAULT_TAG)


# -------------------------------------------------------------------------------------- open and sign


@dataclass
class Opened:
    path: Path  # a plain bundle file
    shown: str  # what the user named
    signed_by: str | None = None  # the trusted key's id, when a signature was checked
    signed: bool = False  # a signature was there (checked only with a trusted key)
    comment: str | None = None
    asked_name: str | None = None  # the name the source was asked for under (a tag, a reference, a file name)

    @property
    def fields(self) -> dict[str, str]:
        return signing.comment_fields(self.comment) if self.comment else {}


@contextlib.contextmanager
def opened(text: str, *, trusted_key: signing.PublicKey | None = None, require_signature: bool = False,
           signature: Path | None = None, tls_verify: bool = True, claim: signing.Claim | None = None,
           limits: Limits = _LIMITS) -> Iterator[Opened]:
    """A bundle file for any source, its signature checked (before anything in it is parsed) where a
    trusted key is given, against ``claim`` too (the name: by default the tag or reference the source
    was named by, or the file's name); with ``require_signature``, an unsigned source is refused.
    ``signed`` on the result says whether a signature was there (an unsigned source with a trusted key:
    False)."""
    if require_signature and trusted_key is None:
        raise BundleError("--require-signature needs --trusted-key PUBKEY (the key the signature must be made with)")
    source = parse_source(text)
    claim = claim or signing.Claim()
    if source.kind == "bundle":
        sig_path = Path(signature) if signature else Path(f"{source.path}{signing.SIGNATURE_SUFFIX}")
        sig = signing.read_signature(sig_path) if (signature or sig_path.exists()) else None
        if sig is None and require_signature:
            raise signing.SignatureError(f"{source.path}: not signed (no {sig_path}); refused by --require-signature")
        result = Opened(source.path, text, signed=sig is not None, asked_name=claim.name or source.path.name)
        if trusted_key is not None and sig is not None:
            _check(source.path, sig, trusted_key, text, lambda: read_header(source.path, limits), result, claim)
        yield result
        return
    with tempfile.TemporaryDirectory(prefix="tritonwarm-oci-") as tmp:
        image = pull(source.reference, Path(tmp) / "pulled", tls_verify=tls_verify) if source.kind == "registry" \
            else open_image(source.path, source.tag)
        shown = text
        if signature:
            sig = signing.read_signature(Path(signature))
        elif SIGNATURE_ANNOTATION in image.annotations:
            value = image.annotations[SIGNATURE_ANNOTATION]
            sig = signing.parse_signature(value if isinstance(value, str) else "", f"{shown}: signature annotation")
        else:
            sig = None
        if sig is None and require_signature:
            raise signing.SignatureError(f"{shown}: not signed (no {SIGNATURE_ANNOTATION} annotation); refused by "
                                         "--require-signature")
        bundle = Path(tmp) / "bundle.tar.gz"
        asked = claim.name or (source.reference if source.kind == "registry" else
                               source.tag or (image.manifest_descriptor.get("annotations") or {}).get(REF_NAME))
        result = Opened(bundle, shown, signed=sig is not None, asked_name=asked if isinstance(asked, str) else None)
        try:
            if trusted_key is not None and sig is not None:  # the layer's bytes first, then what is in it
                signing_sha = signing.check(image.layer, sig, trusted_key, shown)
                layer_to_bundle(image, bundle, limits)
                header = read_header(bundle, limits)
                fields = signing.check_binding(sig.comment, signing_sha, header["fingerprint"], shown)
                signing.check_claim(fields, header["targets"], signing.Claim(result.asked_name, claim.targets,
                                                                            claim.not_older_than), shown)
                result.signed_by, result.comment = trusted_key.id_text, sig.comment
            else:
                layer_to_bundle(image, bundle, limits)
            yield result
        except BundleError as e:  # name what the user gave, not the bundle made from its layer
            raise type(e)(str(e).replace(str(bundle), f"{shown}: layer")) from None


def _check(path: Path, sig, key, shown: str, header, result: Opened, claim: signing.Claim) -> None:
    sha = signing.check(path, sig, key, shown)
    read = header()
    fields = signing.check_binding(sig.comment, sha, read["fingerprint"], shown)
    signing.check_claim(fields, read["targets"], signing.Claim(result.asked_name, claim.targets, claim.not_older_than),
                        shown)
    result.signed_by, result.comment = key.id_text, sig.comment


def comment_for(text: str, name: str | None = None, limits: Limits = _LIMITS) -> tuple[Path, str]:
    """``(file to sign, trusted comment)``: what ``minisign -S -m FILE -t COMMENT`` should be given.
    ``name``: what the bundle is published under (default: the image's tag, or the file's name)."""
    source = parse_source(text)
    if source.kind == "registry":
        raise BundleError(f"{text}: sign the image's layout before pushing it (oci:DIR:TAG), not a registry image")
    if source.kind == "bundle":
        header = read_header(source.path, limits)
        target, published = source.path, source.path.name
    else:
        image = open_image(source.path, source.tag)
        header, target = layer_header(image, limits), image.layer
        published = source.tag or (image.manifest_descriptor.get("annotations") or {}).get(REF_NAME) or DEFAULT_TAG
    entries = summary(target, header).entries
    return target, signing.trusted_comment(signing.digests(target)[1], header["fingerprint"], entries,
                                           name or published, header["targets"],
                                           "--name" if name else "the name it is published under (or --name)")


def sign(text: str, key: signing.SecretKey, *, out: Path | None = None, name: str | None = None,
         limits: Limits = _LIMITS) -> str:
    """Sign a bundle (``BUNDLE.minisig`` beside it, or ``out``) or an OCI layout's image (the
    signature goes into its manifest's annotations; the tag then names the signed manifest).
    Returns where the signature went."""
    source = parse_source(text)
    target, comment = comment_for(text, name, limits)
    signature = signing.sign(target, key, comment)
    if source.kind == "bundle":
        where = Path(out) if out else Path(f"{source.path}{signing.SIGNATURE_SUFFIX}")
        _write_text(where.absolute(), signature)
        return str(where)
    image = open_image(source.path, source.tag)
    if out:
        _write_text(Path(out).absolute(), signature)
    manifest = {**image.manifest, "annotations": {**image.annotations, SIGNATURE_ANNOTATION: signature}}
    tag = source.tag or (image.manifest_descriptor.get("annotations") or {}).get(REF_NAME) or DEFAULT_TAG
    _set_tag(image.layout, tag, _put_json(image.layout, manifest, MANIFEST_MEDIA_TYPE),
             replacing=image.manifest_descriptor.get("digest"))
    return f"oci:{image.layout}:{tag} (manifest annotation {SIGNATURE_ANNOTATION})"


__all__ = ["CACHE_FOLDER", "Image", "LABEL_PREFIX", "MCV_MANIFEST", "Opened", "SIGNATURE_ANNOTATION", "Source",
           "bundle_to_layout", "comment_for", "layer_header", "layer_to_bundle", "open_image", "opened",
           "parse_source", "pull", "sign"]
