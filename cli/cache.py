"""Inspecting and tidying a cache: ``list``, ``show``, ``du``, ``prune``, ``targets``."""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

from ..errors import printable
from ..output import mib, notes_now, say, width
from .common import (
    SHIPPED_SPECS,
    UsageError,
    add_cache_args,
    format_args,
    public_entry,
    read_cache_dir,
    short_kernel,
    target_name,
    wrap_print,
)
from .env import add_for_args, keyed_for

IR_KINDS = ("ttir", "ttgir", "llir", "ptx", "sass", "amdgcn")  # jit.pipeline.inspection.IR_KINDS (tested equal)


def add_parsers(sub) -> None:
    ls = sub.add_parser("list", help="one row per warmed variant")
    ls.add_argument("--kernel", help="only kernels whose name contains this")
    ls.add_argument("--target", help="only this target")
    add_cache_args(ls)
    ls.set_defaults(func=cmd_list)

    sh = sub.add_parser("show", help="one warmed variant in full, or its IR")
    sh.add_argument("variant", help="variant id (a prefix of it works) from `tritonwarm list`")
    sh.add_argument("--ir", choices=IR_KINDS, help="print this intermediate representation")
    add_cache_args(sh)
    sh.set_defaults(func=cmd_show)

    du = sub.add_parser("du", help="disk use per kernel and target")
    add_cache_args(du)
    du.set_defaults(func=cmd_du)

    pr = sub.add_parser("prune", help="remove variants no spec plans, a record never used, or of other Tritons")
    pr.add_argument("specs", nargs="*", metavar="SPEC_OR_DIR",
                    help="specs for --unplanned (default: every spec and engine config the cache was warmed from)")
    pr.add_argument("--target", help="only this target")
    pr.add_argument("--unplanned", action="store_true", help="variants none of the specs plans")
    pr.add_argument("--unused", metavar="RECORD", help="variants this dispatch record (JSONL) never launched")
    pr.add_argument("--other-environments", "--other-versions", dest="other_environments", action="store_true",
                    help="entries warmed under another environment than the runtime's (Triton version or "
                         "libtriton, backend, cache env); with --for / --for-wheel, the runtime is that one")
    add_for_args(pr)
    pr.add_argument("--dry-run", action="store_true", help="list what would go, remove nothing")
    add_cache_args(pr)
    pr.set_defaults(func=cmd_prune)

    t = sub.add_parser("targets", help="the targets tritonwarm compiles for")
    t.add_argument("--json", action="store_true")
    t.set_defaults(func=cmd_targets)


def cmd_list(args) -> int:
    from ..jit.pipeline.inspection import list_variants

    cache_dir = read_cache_dir(args)
    rows = list_variants(cache_dir, target=target_name(args), kernel=args.kernel)
    if args.json:
        print(json.dumps([public_entry(r) for r in rows], indent=1))
        return 0
    if not rows:
        print(f"no warmed variants in {cache_dir}")
        return 0
    table = [("ID", "TARGET", "KERNEL", "WARPS", "STAGES", "REGS", "SPILL(B)", "SHARED(B)", "ARGS")]
    for r in rows:
        res = r.get("resources") or {}
        table.append(tuple(map(printable, (r["id"], r["target"], short_kernel(r["kernel"]), r["num_warps"],
                                           r["num_stages"], res.get("registers", "-"), res.get("local", "-"),
                                           res.get("shared", "-"), format_args(r["args"])))))
    for line in _table_lines(table, width()):
        print(line)
    if any("registers" not in (r.get("resources") or {}) and r["target"].startswith("gfx") for r in rows):
        say("-: ", "REGS and SPILL of these AMD entries were not recorded (warmed by an earlier tritonwarm): "
                   "`tritonwarm warmup` again reads them from the hsaco")
    return 0


def _table_lines(table: list[tuple[str, ...]], columns: int) -> list[str]:
    """The table's rows within ``columns``: the last column (ARGS) wraps under itself where it has 30
    columns left, else on lines of its own below its row; a column too wide for the terminal (long
    kernel names) is cut, its full text left to ``--json``."""
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]) - 1)]
    others = sum(widths) + 2 * len(widths) - max(widths)
    widest = widths.index(max(widths))
    widths[widest] = max(12, min(widths[widest], columns - others))

    def cell(text: str, w: int) -> str:
        return (text if len(text) <= w else text[:w - 1] + "…").ljust(w)

    lines = []
    for row in table:
        lead = "  ".join(cell(c, w) for c, w in zip(row[:-1], widths, strict=True)) + "  "
        if columns - len(lead) >= 30:
            wrapped = textwrap.wrap(row[-1], columns - len(lead), break_long_words=False) or [""]
            lines += [lead + wrapped[0], *(" " * len(lead) + more for more in wrapped[1:])]
        else:
            lines.append(lead.rstrip())
            lines += textwrap.wrap(row[-1], columns, initial_indent="    ", subsequent_indent="    ",
                                   break_long_words=False)
    return lines


def cmd_show(args) -> int:
    from ..jit.pipeline.inspection import find_variant, variant_ir

    cache_dir = read_cache_dir(args)
    entry = find_variant(cache_dir, args.variant)
    if args.ir:
        print(variant_ir(cache_dir, entry, args.ir))
        return 0
    if args.json:
        print(json.dumps(public_entry(entry), indent=1))
        return 0
    shown = printable  # every field read from the manifest, which a bundle may have written
    print(f"variant   {shown(entry['id'])}  ({shown(entry['target'])})")
    print(f"kernel    {shown(entry['kernel'])}")
    print(f"options   num_warps={entry['num_warps']} num_stages={entry['num_stages']}")
    for name, cls in entry["args"].items():
        print(f"  {shown(name):<24} {shown(cls)}")
    if entry.get("resources"):
        print("resources " + shown(", ".join(f"{k}={v}" for k, v in entry["resources"].items())))
    print(f"triton    {shown(entry['triton_version'])}, compiled in {shown(entry.get('compile_seconds'))} s")
    print(f"entry     {Path(cache_dir) / entry['entry_dir']}")
    wrap_print("key       ", entry["key"])
    print("rows:")
    for row in entry["rows"]:
        print(f"  {shown(row)}")
    return 0


def cmd_du(args) -> int:
    from ..jit.cache.prune import disk_usage

    cache_dir = read_cache_dir(args)
    usage = disk_usage(cache_dir)
    if args.json:
        print(json.dumps({"cache_dir": str(cache_dir), **usage}, indent=1))
        return 0
    print(f"{'TARGET':<8} {'KERNEL':<40} {'VARIANTS':>8} {'SIZE':>10}")
    for row in usage["kernels"]:
        print(f"{printable(row['target']):<8} {short_kernel(row['kernel']):<40} {row['variants']:>8} "
              f"{mib(row['bytes']):>10}")
    if usage["unmanaged"]["entries"]:
        print(f"{'-':<8} {'(Triton entries no manifest lists)':<40} {usage['unmanaged']['entries']:>8} "
              f"{mib(usage['unmanaged']['bytes']):>10}")
    print(f"total {mib(usage['total_bytes'])} in {cache_dir}")
    return 0


@keyed_for
def cmd_prune(args) -> int:
    from ..jit.cache import manifests
    from ..jit.cache.prune import prune_candidates, remove, used_hashes
    from ..jit.core.targets import TARGETS

    if not (args.unplanned or args.unused or args.other_environments):
        raise UsageError("say what to prune: --unplanned, --unused RECORD and/or --other-environments")
    cache_dir = read_cache_dir(args)
    target = target_name(args)
    notes_now(cache_dir / "tritonwarm")
    planned = None
    if args.unplanned:
        names = [target] if target else [n for n in manifests(cache_dir) if n in TARGETS]
        planned = {n: _planned_hashes(cache_dir, TARGETS[n], args.specs) for n in names}
    used = used_hashes(Path(args.unused)) if args.unused else None
    doomed = prune_candidates(cache_dir, target=target, planned=planned, used=used,
                              other_environments=args.other_environments)
    if not args.dry_run:
        remove(cache_dir, doomed)
    if args.json:
        print(json.dumps({"dry_run": args.dry_run, "removed": doomed,
                          "bytes": sum(d["bytes"] for d in doomed)}, indent=1))
        return 0
    verb = "would remove" if args.dry_run else "removed"
    for d in doomed:
        print(f"{verb}  {d['id']}  {printable(d['target']):<7} {short_kernel(d['kernel'])}  ({printable(d['why'])})")
    print(f"{verb} {len(doomed)} variants, {mib(sum(d['bytes'] for d in doomed))}")
    return 0


def _planned_hashes(cache_dir, target, explicit_specs) -> set[str]:
    """What still plans entries for ``target``: the specs named, or else every spec file and engine
    config the cache was warmed from and every entry installed from a bundle (the shipped specs when it
    recorded none)."""
    from ..jit.cache.sources import PlanSources
    from ..jit.pipeline.plan import plan
    from ..jit.pipeline.specs import load_specs

    if explicit_specs:
        return set(plan(load_specs(explicit_specs), target, verify_collapse=False).variants)
    sources = PlanSources(cache_dir, target.name).read()
    if not any(sources.values()):
        return set(plan(load_specs([SHIPPED_SPECS]), target, verify_collapse=False).variants)
    present = [s for s in sources["specs"] if Path(s).is_file()]
    for gone in sorted(set(sources["specs"]) - set(present)):
        print(f"note: {gone} no longer exists: nothing plans its variants", file=sys.stderr)
    hashes = set(sources["installed"])  # installed from a bundle: planned where it was built
    if present:
        hashes |= set(plan(load_specs(present), target, verify_collapse=False).variants)
    if sources["engine_configs"]:
        from ..engine.plan import engine_plan

        for config in sources["engine_configs"]:
            hashes |= set(engine_plan(config, target).variants)
    return hashes


def cmd_targets(args) -> int:
    from ..jit.core.gpu_names import gpus_of
    from ..jit.core.targets import TARGETS, local_target

    local = local_target()
    rows = [{"name": t.name, "backend": t.backend, "arch": t.arch, "warp_size": t.warp_size, "gpus": gpus_of(t.name),
             "local": local is not None and local.name == t.name} for t in TARGETS.values()]
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    print(f"{'TARGET':<8} {'BACKEND':<7} {'ARCH':<7} GPUS (--target takes either name)")
    for r in rows:
        print(f"{r['name']:<8} {r['backend']:<7} {r['arch']!s:<7} {', '.join(r['gpus'])}"
              + ("  (this machine)" if r["local"] else ""))
    print("local    this machine's GPU" + (f": {local.name}" if local else " (none here)"))
    return 0
