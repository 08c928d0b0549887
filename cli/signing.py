"""``bundle sign|keygen``, the trust flags of ``bundle verify|install`` and ``bundle create --oci``."""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
from pathlib import Path

from .common import UsageError


def add_oci_create_args(p) -> None:
    p.add_argument("--oci", action="store_true",
                   help="write OUT as an OCI image layout folder (or oci:DIR:TAG) instead of a .tar.gz: one layer, "
                        "labelled as Red Hat MCV / GKM kernel-cache images are; push it with skopeo")
    p.add_argument("--tag", default=None, help="with --oci: the image's tag in the layout (default: latest)")
    p.add_argument("--serve-at", dest="oci_serve_at", metavar="PATH",
                   help="with --oci: the path an operator mounts the extracted cache at (Triton's groups in the "
                        "layer name their files there; tritonwarm's install rewrites them anyway)")


def add_trust_args(p, *, verifying: bool = False) -> None:
    """``verifying``: with --trusted-key, a missing signature is refused (verify asks for it); install
    warns and goes on unless --require-signature."""
    p.set_defaults(key_requires_signature=verifying)
    p.add_argument("--trusted-key", metavar="PUBKEY",
                   help="check the signature (BUNDLE.minisig, or an OCI image's annotation) with this minisign "
                        "public key file (or key); a bad signature is refused (verify: a missing one too)")
    p.add_argument("--require-signature", action="store_true",
                   help="refuse a bundle or image that is not signed by --trusted-key")
    p.add_argument("--signature", metavar="SIG", help="the minisign signature file (default: BUNDLE.minisig)")
    p.add_argument("--name", dest="signed_name", metavar="NAME",
                   help="the name the signature must name (default: the tag or registry reference given, or the "
                        "bundle file's name)")
    p.add_argument("--target", metavar="T[,T...]",
                   help="the targets the signature must name (a bundle signed for gfx942 is refused for sm90)")
    p.add_argument("--not-older-than", metavar="DATE",
                   help="refuse a signature made before DATE (2026-12-04, 2026-12-04T10:00:00 UTC, or unix seconds)")
    if not verifying:
        p.add_argument("--allow-rollback", action="store_true",
                       help="install a bundle signed before the one installed here under the same name")
    p.add_argument("--no-tls-verify", action="store_true",
                   help="pull a registry reference over plain HTTP or unverified TLS (a registry on loopback)")


def add_signing_parsers(bsub) -> None:
    s = bsub.add_parser("sign", help="sign a bundle or OCI image (minisign format; the signature covers the "
                                      "archive's digest and the fingerprint it was warmed for)")
    s.add_argument("bundle", metavar="BUNDLE", help="a bundle file, or an OCI layout (oci:DIR[:TAG])")
    s.add_argument("--key", metavar="SECRET_KEY",
                   help="a minisign secret key (tritonwarm bundle keygen, or minisign -G)")
    s.add_argument("--password-file", metavar="FILE", help="the password of an encrypted secret key (else asked for)")
    s.add_argument("--out", metavar="SIG", help="where to write the signature (default: BUNDLE.minisig)")
    s.add_argument("--name", metavar="NAME",
                   help="the name it is published under, which installs must ask for (default: the image's tag, or "
                        "the bundle file's name); e.g. kernels/rms:sm90 to bind the repository too")
    s.add_argument("--print-comment", action="store_true",
                   help="print the file to sign and the trusted comment for `minisign -S -m FILE -t COMMENT`, "
                        "and sign nothing")
    s.set_defaults(func=cmd_sign)

    k = bsub.add_parser("keygen", help="make a minisign key pair (secret key unencrypted: keep it secret)")
    k.add_argument("prefix", metavar="PREFIX", help="writes PREFIX.key (mode 0600) and PREFIX.pub")
    k.set_defaults(func=cmd_keygen)


@contextlib.contextmanager
def opened_bundle(args):
    """The bundle file behind ``args.bundle`` (a file, an OCI layout, a registry image), checked against
    ``--trusted-key`` / ``--require-signature`` before anything in it is read."""
    from ..jit.cache import oci, signing

    key = signing.read_public_key(args.trusted_key) if getattr(args, "trusted_key", None) else None
    require = getattr(args, "require_signature", False) or (key is not None and args.key_requires_signature)
    with oci.opened(args.bundle, trusted_key=key, require_signature=require, signature=getattr(args, "signature", None),
                    tls_verify=not getattr(args, "no_tls_verify", False), claim=claim_of(args)) as source:
        if key is not None and not source.signed:
            print(f"tritonwarm: warning: {args.bundle} is not signed; installing it unverified "
                  "(--require-signature refuses it)", file=sys.stderr)
        yield source


def claim_of(args):
    """What ``--name``, ``--target`` and ``--not-older-than`` ask of a signature."""
    from ..jit.cache import signing
    from ..jit.core.targets import resolve_targets

    name = getattr(args, "signed_name", None)
    targets = getattr(args, "target", None)
    since = getattr(args, "not_older_than", None)
    return signing.Claim(signing.check_name(name) if name is not None else None,
                         tuple(t.name for t in resolve_targets(targets)) if targets else (),
                         signing.parse_date(since) if since is not None else None)


def create_oci(args, cache_dir, variants, create):
    """``bundle create --oci``: the bundle, then its image in the layout folder."""
    from ..jit.cache import oci

    out, tag = str(args.out), args.tag
    if out.startswith("oci:"):
        out = out[4:]
        if ":" in out and not Path(out).is_dir():
            out, tag_in_name = out.rsplit(":", 1)
            tag = tag or tag_in_name
    if args.oci_serve_at is not None and not os.path.isabs(args.oci_serve_at):
        raise UsageError(f"--serve-at {args.oci_serve_at!r} is not an absolute path: Triton's group files name "
                         "absolute paths")
    with tempfile.TemporaryDirectory(prefix="tritonwarm-oci-") as tmp:
        bundle = Path(tmp) / "bundle.tar.gz"
        create(bundle, cache_dir, variants, binary_only=args.binary_only)
        return oci.bundle_to_layout(bundle, Path(out), tag=tag or oci.DEFAULT_TAG,
                                    serve_at=Path(args.oci_serve_at) if args.oci_serve_at else None)


def cmd_sign(args) -> int:
    from ..jit.cache import oci, signing

    if args.print_comment:
        target, comment = oci.comment_for(args.bundle, args.name)
        print(f"file: {target}")
        print(f"trusted comment: {comment}")
        return 0
    if not args.key:
        raise UsageError("bundle sign needs --key SECRET_KEY (or --print-comment)")
    password = None
    if args.password_file:
        try:
            password = Path(args.password_file).read_text().splitlines()[0]
        except (OSError, IndexError, UnicodeDecodeError) as e:
            raise UsageError(f"--password-file {args.password_file}: cannot read a password ({e})") from None
    key = signing.read_secret_key(args.key, password)
    where = oci.sign(args.bundle, key, out=args.out, name=args.name)
    print(f"signed {args.bundle} with key {key.public.id_text}: {where}")
    return 0


def cmd_keygen(args) -> int:
    from ..jit.cache import signing

    secret, public = Path(f"{args.prefix}.key"), Path(f"{args.prefix}.pub")
    key = signing.generate(secret, public)
    print(f"key {key.id_text}: secret key {secret} (keep it secret), public key {public}")
    print(f"  verify with: minisign -Vm BUNDLE -p {public}, or tritonwarm bundle verify BUNDLE --trusted-key {public}")
    return 0
