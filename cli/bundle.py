"""``tritonwarm bundle create|verify|install|merge|sign|keygen``: a warmed cache as one archive (or OCI
image) that installs anywhere, signed and verified in minisign's format."""

from __future__ import annotations

import json
import sys

from ..output import mib, plural, say
from .bundle_env import bundle_differences, environment_name
from .common import (
    SERVE_AT_HELP,
    add_cache_args,
    add_spec_args,
    cache_dir_of,
    note_where_triton_reads,
    plan_with_engine,
    prepare,
    serve_at_arg,
    wrap_print,
)
from .signing import add_oci_create_args, add_signing_parsers, add_trust_args, opened_bundle

try:  # warming for another serving environment (--for / --for-wheel), where this tritonwarm has it
    from .env import add_for_args, keyed_for
except ImportError:
    add_for_args = keyed_for = None


def add_shard_args(p) -> None:
    p.add_argument("--shard", metavar="I/N",
                   help="only shard I of N of the plan (a fixed split, balanced by compile time; the N shards "
                        "together are the whole plan); e.g. 2/4, or $((JOB_COMPLETION_INDEX+1))/N")
    p.add_argument("--shard-times", metavar="BUNDLE_OR_MANIFEST",
                   help="balance shards by the compile times recorded in this bundle or manifest-<target>.json "
                        "(every shard must be given the same file)")


def shard_of(args):
    """``(index, count, recorded seconds)`` from ``--shard``/``--shard-times``, or None; checked before planning."""
    if getattr(args, "shard", None) is None:
        if getattr(args, "shard_times", None):
            raise ValueError("--shard-times needs --shard")
        return None
    from ..jit.pipeline.shard import parse_shard, recorded_seconds

    index, count = parse_shard(args.shard)
    return index, count, recorded_seconds(args.shard_times) if args.shard_times else None


def sharded(shard, the_plan):
    """``the_plan``, or the part of it that ``shard`` (from ``shard_of``) names."""
    if shard is None:
        return the_plan
    from ..jit.pipeline.shard import shard_plan

    return shard_plan(the_plan, *shard)


def add_parsers(sub) -> None:
    b = sub.add_parser("bundle", help="pack a warmed cache into one archive; verify, install or merge archives")
    bsub = b.add_subparsers(metavar="ACTION")

    c = bsub.add_parser("create", help="write the entries the plan needs, their manifest rows and the "
                                        "environment fingerprint into one .tar.gz")
    c.add_argument("out", metavar="OUT", help="the archive to write (e.g. warm-sm90.tar.gz)")
    add_spec_args(c)
    c.add_argument("--binary-only", action="store_true",
                   help="carry only what the runtime loads (cubin/hsaco + metadata), not the IR")
    add_shard_args(c)
    add_oci_create_args(c)
    if add_for_args is not None:  # the bundle holds what warmup --for / --for-wheel keyed for that runtime
        add_for_args(c)
    c.set_defaults(func=keyed_for(cmd_create) if keyed_for is not None else cmd_create)

    v = bsub.add_parser("verify", help="check every member and hash; compare the fingerprint with this runtime "
                                        "(or the one --for / --for-wheel names)")
    v.add_argument("bundle", metavar="BUNDLE")
    v.add_argument("--json", action="store_true", help="machine-readable output")
    add_trust_args(v, verifying=True)
    if add_for_args is not None:
        add_for_args(v)
    v.set_defaults(func=keyed_for(cmd_verify) if keyed_for is not None else cmd_verify, target=None)

    i = bsub.add_parser("install", help="install into a cache folder (any path): groups rewritten for it, "
                                         "manifest merged; safe to repeat or to kill")
    i.add_argument("bundle", metavar="BUNDLE")
    i.add_argument("--no-fsync", action="store_true",
                   help="do not flush each file to disk before it goes into place (an image build, whose layer "
                        "is written out afterwards; elsewhere a power loss could leave empty files)")
    i.add_argument("--no-c-launchers", action="store_true",
                   help="do not build Triton's C launchers for this Python (Triton 3.6/3.7 build them per kernel "
                        "signature at first launch; install builds them for the entries it installed)")
    i.add_argument("--serve-at", metavar="PATH", help=SERVE_AT_HELP + ", written for PATH")
    add_cache_args(i)
    add_trust_args(i)
    if add_for_args is not None:  # installed here for a server of that environment (an image build)
        add_for_args(i)
    i.set_defaults(func=keyed_for(cmd_install) if keyed_for is not None else cmd_install, target=None)

    m = bsub.add_parser("merge", help="join bundles of shards (same environment and options) into one")
    m.add_argument("out", metavar="OUT")
    m.add_argument("bundles", nargs="+", metavar="BUNDLE")
    m.add_argument("--json", action="store_true", help="machine-readable output")
    m.set_defaults(func=cmd_merge)
    add_signing_parsers(bsub)

    b.set_defaults(func=lambda args: (b.print_help(), 2)[1])


def _print(report, args, what: str) -> None:
    if getattr(args, "json", False):
        print(json.dumps(report.to_json(), indent=1))
        return
    targets = ", ".join(f"{t}: {n}" for t, n in report.targets.items()) or "none"
    kind = "binary-only" if report.binary_only else "full"
    path = "" if what.startswith(" ") else f"{report.path}: "  # a detail line under a verdict that names it
    wrap_print(f"{what}: ", f"{path}{plural(report.entries, 'entry', 'entries')} ({targets}), "
               f"{plural(report.files, 'file')}, {kind}, {mib(report.archive_bytes)}")


def cmd_create(args) -> int:
    from ..jit.cache import check_cache_dir
    from ..jit.cache.bundle import BundleError, create
    from ..jit.cache.env import keyed_for_another
    from .bundle_env import keyed_elsewhere

    shard = shard_of(args)
    specs, targets, cache_dir = prepare(args)
    note = check_cache_dir(cache_dir, for_writing=False)
    if note:  # planning would store its plan there: a typo must not create a folder
        raise ValueError(f"cache directory {cache_dir} {note}; warm it first")
    variants, problems = {}, []
    for target in targets:
        the_plan = sharded(shard, plan_with_engine(args, specs, target, cache_dir=cache_dir))
        problems += the_plan.errors
        variants[target.name] = list(the_plan.variants.values())
    if problems:
        raise ValueError(f"the plan has errors (fix them, then warm and bundle again): {problems[0]}")
    try:
        if args.oci:  # the same bundle, written as an OCI image layout
            from .signing import create_oci

            report = create_oci(args, cache_dir, variants, create)
        else:
            report = create(args.out, cache_dir, variants, binary_only=args.binary_only)
    except BundleError as e:
        elsewhere = None if keyed_for_another() or "not warmed" not in str(e) else keyed_elsewhere(cache_dir, targets)
        if elsewhere is None:
            raise
        raise BundleError(f"{str(e).split(';')[0]} for this runtime; {elsewhere}") from None
    _print(report, args, "bundle")
    return 0


def cmd_verify(args) -> int:
    from ..jit.cache.bundle import read_header, verify
    from ..jit.cache.env import current_fingerprint, keyed_for_another

    with opened_bundle(args) as source:
        report = verify(source.path)
        bundle_fp = read_header(source.path)["fingerprint"]
    report.path = args.bundle
    runtime = current_fingerprint()
    judged = _judged(args)
    carried = not keyed_for_another() and (bundle_fp.get("warmed_for") or {}).get("source")
    differences = [] if carried else bundle_differences(report.differences, bundle_fp, runtime, judged)
    if args.json:
        print(json.dumps({**report.to_json(), "differences": differences, "judged_for": judged,
                          "bundle_environment": environment_name(bundle_fp), "signed_by": source.signed_by},
                         indent=1))
        return 1 if differences else 0
    if differences:
        verdict = (f"PROBLEMS: every member and hash verified, but its entries are keyed for another environment: "
                   f"{judged} would miss them")
    else:
        keyed = f"{environment_name(bundle_fp)}, the environment it was built for" if carried else judged
        verdict = f"ok: every member and hash verified, its entries keyed for {keyed}"
    say(f"{args.bundle}: ", verdict)  # the verdict first: the details follow
    _print(report, args, "  contents")
    if source.signed_by:
        print(f"  signature: good, by trusted key {source.signed_by}")
    for line in differences:
        wrap_print("  differs: ", line)
    if carried:  # keyed for its server on purpose: this machine's runtime says nothing of it
        here = environment_name(runtime, source=False)
        wrap_print("  environment: ", f"for {environment_name(bundle_fp)}; this runtime is {here}: judge it for a "
                   "server with --for ENV.json or --for-wheel WHEEL")
    else:
        verdict = f": {plural(len(report.differences), 'difference')}: that runtime would miss its entries"
        wrap_print("  environment: ", f"{'differs from' if differences else 'matches'} {judged} "
                   f"({environment_name(runtime, source=False)})" + (verdict if differences else ""))
    return 1 if differences else 0


def _judged(args) -> str:
    if getattr(args, "for_wheel", None):
        return f"the runtime of --for-wheel {args.for_wheel}"
    if getattr(args, "for_env", None):
        return f"the runtime of --for {args.for_env}"
    return "this runtime"


def cmd_install(args) -> int:
    from ..jit.cache.bundle import install, point_groups, read_header, serve_from
    from ..jit.cache.env import cache_manager_problem, current_fingerprint, keyed_for_another
    from ..jit.cache.overlay import OVERLAY_ENV, overlay_in_force
    from ..jit.cache.signing import SignatureError, record_install, rollback_problem

    cache_dir = cache_dir_of(args)
    serve_at = serve_at_arg(args.serve_at, cache_dir)
    durable = not args.no_fsync
    with opened_bundle(args) as source:
        rollback = source.signed_by and not args.allow_rollback and rollback_problem(cache_dir, source.fields)
        if rollback:
            raise SignatureError(f"{args.bundle}: {rollback}")
        report = install(source.path, cache_dir, durable=durable, serve_at=serve_at)
        bundle_fp = read_header(source.path)["fingerprint"]
        if source.signed_by:
            record_install(cache_dir, source.fields, durable=durable)
    report.path = args.bundle
    report.differences = bundle_differences(report.differences, bundle_fp, current_fingerprint(), _judged(args))
    manager = cache_manager_problem()  # Triton here reads and builds through another store than the folder
    overlay = overlay_in_force()  # ... or writes what it builds into another folder
    manager = manager or (overlay and (False, f"{OVERLAY_ENV}={overlay} is set (Triton builds into it)"))
    if keyed_for_another():  # this machine is not the server: its Python builds no launcher of the server's
        manager = (False, "installed for another runtime (--for / --for-wheel)")
    for line in report.set_aside + report.differences + ([f"{manager[1]}: no C launchers built"] if manager else []):
        wrap_print("tritonwarm: warning: ", line, file=sys.stderr)
    launchers = {}
    if not args.no_c_launchers and not report.differences and not manager:
        if serve_at:  # Triton reads the entries to build their launchers: here, for now
            point_groups(cache_dir, report.layout, cache_dir, durable=durable)
        launchers = _build_c_launchers(cache_dir, report.targets)
    serve_from(cache_dir, serve_at, durable=durable)  # last: from here on, entries are read where the server is
    if args.json:
        print(json.dumps({**report.to_json(), "cache_dir": str(cache_dir),
                          "serve_at": str(serve_at) if serve_at else None,
                          "c_launchers": {t: r.to_json() for t, r in launchers.items()}}, indent=1))
    else:
        wrap_print("", f"installed {report.installed}, already there {report.already} of {report.entries} entries "
                   f"into {cache_dir}" + (f", for serving at {serve_at}" if serve_at else ""))
        if source.signed_by:
            print(f"  signature: good, by trusted key {source.signed_by}")
        if serve_at:
            wrap_print("  note: ", f"its entries are read at {serve_at} only (not here): check them as that server "
                       f"reads them with `tritonwarm check --serve-at {serve_at}`")
        else:
            note_where_triton_reads(cache_dir)
        for target, launcher_report in launchers.items():
            print(f"{target}: {launcher_report.summary()}")
        for target, line in _unwarmable_utilities(cache_dir, report.targets, args, manager or report.differences):
            wrap_print(f"{target}: warning: ", line)
    return 1 if any(r.failed for r in launchers.values()) else 0


def _unwarmable_utilities(cache_dir, targets, args, not_here) -> list[tuple[str, str]]:
    """``(target, warning)`` for each target whose servers will build driver utilities this machine cannot:
    their key names where the server's driver library is, which an image build lacks. None where nothing
    is built here anyway (``not_here``: another runtime, another cache manager)."""
    from ..jit.core.targets import TARGETS
    from ..jit.serving.c_launchers import unwarmable_driver_utilities

    if args.no_c_launchers or not_here:
        return []
    found = ((name, unwarmable_driver_utilities(TARGETS[name], cache_dir)) for name in targets if name in TARGETS)
    return [(name, line) for name, line in found if line]


def _build_c_launchers(cache_dir, targets) -> dict:
    """Where this Triton builds a C launcher per kernel signature (3.6), build them now, on the serving
    machine, for its Python: the build machine cannot (its Python may differ), and the first request
    would otherwise wait for gcc. So with the driver utilities keyed by this machine's libcuda.so.1
    (3.8+): the first launch would build them, and fail on a read-only cache. Only entries this runtime
    reads are used, so nothing compiles."""
    from ..jit.cache import Manifest, entry_files
    from ..jit.cache.env import current_fingerprint, same_environment
    from ..jit.cache.manifest import entry_fingerprint
    from ..jit.core.targets import TARGETS
    from ..jit.core.trace import Variant
    from ..jit.serving.c_launchers import warm_c_launchers, warms_c_modules

    runtime, reports = current_fingerprint(), {}
    for name in targets:
        target = TARGETS.get(name)
        if target is None or not warms_c_modules(target.backend):
            continue
        manifest = Manifest(cache_dir, name)
        environments = manifest.environments()
        variants = [Variant.from_json(entry) for entry in manifest.read().values()
                    if same_environment(entry_fingerprint(entry, environments), runtime, name)
                    and entry_files(cache_dir, entry["entry_dir"], entry["entry_name"])]
        report = warm_c_launchers(variants, target, cache_dir)
        if report is not None:
            reports[name] = report
    return reports


def cmd_merge(args) -> int:
    from ..jit.cache.bundle import merge

    report = merge(args.out, args.bundles)
    _print(report, args, "merged")
    return 0
