"""Checking: a plan against the cache, as the runtime would see it: what serving would compile, what
is damaged, what the specs cannot reach, and why a warmed cache misses.

The plan's keys are computed for the runtime's environment (this process's, or the one given with
``--for``), so entries warmed under other environments may sit beside them without failing the
check; when planned variants are missing and such entries exist, each way their environment differs
from the runtime's is named in one line, with its fix.
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from ...errors import clipped
from ..cache import (
    Manifest,
    ManifestDamaged,
    UnreadableEntry,
    entry_files,
    entry_path,
    files_match_record,
    serve_at_of,
)
from ..cache.env import (
    cache_bypassed,
    cache_manager_problem,
    current_fingerprint,
    differences,
    fingerprint_id,
    keyed_for_another,
    same_environment,
)
from ..cache.failures import failed_compiles
from ..cache.layout import foreign_group_folder
from ..cache.manifest import entry_fingerprint, manifests
from ..cache.marks import interrupted_line
from ..cache.records import metadata_problem
from ..cache.remote import held_by_fleet
from ..cache.triton_dir import groups_read_as_served
from ..serving.c_launchers import missing_c_launchers, unwarmable_driver_utilities
from ..serving.miss import (
    COPIED,
    FILES_GONE,
    GLOBALS_ADVICE,
    OTHER_CODE,
    OTHER_GLOBALS,
    OTHER_OPTIONS,
    OTHER_TARGET,
    WarmedNeighbours,
)
from .plan import Plan
from .resources import entry_usage, over_limit_row, over_limits


@dataclass
class CheckReport:
    target: str
    planned: int
    rows: int = 0  # the spec rows (and engine steps) planned
    missing: list[dict] = field(default_factory=list)
    stale: list[dict] = field(default_factory=list)  # entries of other environments: never read here
    corrupt: list[dict] = field(default_factory=list)
    unreachable: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    collapse_errors: list[str] = field(default_factory=list)
    redundant: list[str] = field(default_factory=list)
    unknown_winners: list[str] = field(default_factory=list)  # autotuned calls serving would benchmark
    notes: list[str] = field(default_factory=list)
    environment: str = ""  # the runtime's fingerprint id
    other_environments: list[dict] = field(default_factory=list)  # {id, entries, differences}
    reasons: list[str] = field(default_factory=list)  # why planned variants are missing, one line each
    missing_c_launchers: list[str] = field(default_factory=list)  # C modules Triton would build at first launch
    c_launcher_fix: str | None = None
    driver_utilities: str | None = None  # a C module the server builds at its first launch, unknown here: a warning
    unreadable: list[dict] = field(default_factory=list)  # entry folders that exist but cannot be read
    manifest_problem: str | None = None  # a damaged manifest: no entry's content hash can be checked
    bypassed: str | None = None  # this runtime does not serve the folder (TRITON_ALWAYS_COMPILE, _CACHE_MANAGER)
    from_fleet: list[dict] = field(default_factory=list)  # not local, but Redis holds them: fetched at first lookup
    serve_at: str | None = None  # checked as a server that mounts the folder there reads it
    read_elsewhere: list[dict] = field(default_factory=list)  # hits only because another folder here has the files
    interrupted: str | None = None  # a warm-up into this folder that did not finish
    over_limits: list[dict] = field(default_factory=list)  # cached, but over the target's launch limits
    pruned: list[dict] = field(default_factory=list)  # autotune configs over a limit: the autotuner skips them

    @property
    def ok(self) -> bool:
        return not (self.missing or self.corrupt or self.unreachable or self.errors or self.collapse_errors
                    or self.unknown_winners or self.missing_c_launchers or self.unreadable
                    or self.manifest_problem or self.bypassed or self.read_elsewhere
                    or self.interrupted or self.over_limits)

    def to_json(self) -> dict:
        return {**self.__dict__, "ok": self.ok}


def _metadata_mismatch(files: dict[str, str], variant) -> str | None:
    """Why the entry's own metadata says it is another kernel (it names another cache hash than the
    folder it is in: Triton would load that kernel here), or None."""
    path = files.get(f"{variant.entry_name[:150]}.json")
    try:
        with open(path or "", "rb") as f:
            data = f.read(1 << 20)
    except OSError:
        return None  # a missing metadata file reads as a miss to Triton: files_match_record says so
    return metadata_problem(data, variant.entry_dir)


def check(the_plan: Plan, cache_dir: Path, runtime: dict | None = None, *, serve_at: Path | None = None,
          same_machine: bool = False) -> CheckReport:
    """Plan vs cache: what serving would compile, what is damaged, what the spec cannot reach, and why.

    ``serve_at``: check as a server that mounts ``cache_dir`` at that path reads it (an init container
    that filled the volume with ``bundle install --serve-at``). An entry whose group file names its
    files in another folder (a ``cp -r`` of a cache) hits here only while that folder exists: a
    problem, unless ``same_machine`` (the copy is served where the original stays), then a note."""
    target = the_plan.target
    runtime = runtime if runtime is not None else current_fingerprint()
    report = CheckReport(target.name, len(the_plan.variants), the_plan.rows, unreachable=list(the_plan.unreachable),
                         errors=list(the_plan.errors), collapse_errors=list(the_plan.collapse_errors),
                         redundant=list(the_plan.redundant), notes=list(the_plan.notes),
                         environment=fingerprint_id(runtime, target.name),
                         bypassed=None if keyed_for_another() else cache_bypassed(),
                         serve_at=str(serve_at) if serve_at else None)
    report.interrupted = interrupted_line(cache_dir)
    manifest = Manifest(cache_dir, target.name)
    try:
        recorded = manifest.read()
    except ManifestDamaged as e:
        report.manifest_problem, recorded = str(e), {}
    intact, wanted = [], {}
    for variant in the_plan.variants.values():
        summary = {"id": variant.variant_id, "kernel": variant.kernel, "args": variant.args, "rows": variant.rows}
        try:
            files = entry_files(cache_dir, variant.entry_dir, variant.entry_name, serve_at)
        except UnreadableEntry as e:
            report.unreadable.append({**summary, "why": str(e)})
            continue
        if files is None:
            stray = entry_path(cache_dir, variant.entry_dir)
            if stray.exists() and not stray.is_dir():  # the entry's name taken by a file: warmup replaces it
                report.corrupt.append(summary)
            else:
                report.missing.append(summary)
                wanted[variant.variant_id] = variant.to_json()
        elif not files_match_record(files, recorded.get(variant.cache_hash)):
            report.corrupt.append(summary)
        elif (why := _metadata_mismatch(files, variant)) is not None:
            report.corrupt.append({**summary, "why": why})
        else:
            intact.append(variant)
            _judge_resources(report, target, variant, files, recorded.get(variant.cache_hash))
            elsewhere = None if serve_at else foreign_group_folder(cache_dir, variant.entry_dir, variant.entry_name,
                                                                   by_path=True)
            if elsewhere is not None:
                same = _same_folder(elsewhere, entry_path(cache_dir, variant.entry_dir))
                report.read_elsewhere.append({**summary, "folder": os.path.dirname(elsewhere), "same_folder": same})
    marked = serve_at_of(cache_dir)
    if marked is not None and serve_at is None:  # installed for the server's path (`--serve-at`), seen here too
        installed_for = [row for row in report.read_elsewhere if Path(row["folder"]) == marked]
        report.read_elsewhere = [row for row in report.read_elsewhere if Path(row["folder"]) != marked]
        if installed_for:
            report.notes.append(_served_elsewhere(marked, None))
    if report.read_elsewhere:
        lines = _read_elsewhere(report.read_elsewhere, cache_dir)
        if same_machine:
            report.notes += lines
            report.read_elsewhere = []
        else:
            report.reasons += lines
    fleet = held_by_fleet(v for v in the_plan.variants.values() if v.variant_id in wanted)
    report.from_fleet = [m for m in report.missing if wanted[m["id"]]["cache_hash"] in fleet]
    report.missing = [m for m in report.missing if wanted[m["id"]]["cache_hash"] not in fleet]
    manager = cache_manager_problem()
    if manager is None:  # Triton reads the entries back to look their launchers up: as the server would
        with groups_read_as_served(cache_dir, serve_at):
            report.missing_c_launchers, report.c_launcher_fix = missing_c_launchers(intact, target, cache_dir)
    else:  # Triton looks them up through that manager, not the folder
        report.notes.append(f"C launchers not looked up: {manager[1]}")
    if the_plan.variants and manager is None:
        report.driver_utilities = unwarmable_driver_utilities(target, cache_dir)
    environments = manifest.environments()
    others: dict[str, dict] = {}
    for cache_hash, entry in recorded.items():
        warmed = entry_fingerprint(entry, environments)
        if same_environment(warmed, runtime, target.name):
            continue
        lines = differences(warmed, runtime, targets=[target.name]) or [
            "warmed under another environment (fingerprint recorded without its key material)"]
        other = others.setdefault(entry.get("environment") or "unrecorded",
                                  {"id": entry.get("environment"), "entries": 0, "differences": lines})
        other["entries"] += 1
        report.stale.append({"id": cache_hash[:12], "kernel": entry.get("kernel"), "why": "; ".join(lines)})
    report.other_environments = list(others.values())
    if report.missing:
        for other in report.other_environments:
            report.reasons += [line for line in other["differences"] if line not in report.reasons]
    mounted_elsewhere = bool(report.missing) and marked != serve_at
    if mounted_elsewhere:
        report.reasons.insert(0, _served_elsewhere(marked, serve_at))
    if report.missing:
        _say_failed_compiles(report, wanted, failed_compiles(cache_dir, target.name))
    if report.missing and not report.manifest_problem:  # a damaged manifest tells nothing of its entries
        neighbours = WarmedNeighbours(recorded, environments, runtime, target.name, manifests(cache_dir), cache_dir,
                                      serve_at)
        _explain_missing(report, wanted, neighbours, copies_explained=mounted_elsewhere)
    return report


def _judge_resources(report: CheckReport, target, variant, files: dict[str, str], record: dict | None) -> None:
    """An intact entry over the target's launch limits: the GPU refuses to load it (a server crashes at
    its first launch), unless an autotuner chooses among it and others (then it skips it: pruned)."""
    excess = over_limits(target, entry_usage(target, files, record), variant.num_warps)
    if excess:
        row = over_limit_row(variant.to_json(), excess)
        (report.pruned if variant.autotuned else report.over_limits).append(row)


def _same_folder(a, b) -> bool:
    """The same folder under two paths (a bind mount, a link): not a copy."""
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def _read_elsewhere(rows: list[dict], cache_dir: Path) -> list[str]:
    """One line for entries whose files are read from another folder (a copied cache), one for entries
    whose group files name this very folder by another path (a symbolic link or a bind mount)."""
    lines = []
    copied = [row for row in rows if not row.get("same_folder")]
    if copied:
        folders = Counter(row["folder"] for row in copied)
        folder, _ = folders.most_common(1)[0]
        more = f" (and {len(folders) - 1} other folders)" if len(folders) > 1 else ""
        lines.append(f"{_variants(len(copied))} read from {folder}{more}, not from {cache_dir}: its group files "
                     "name files there (a copied cache): a server without that folder misses them: move a cache with "
                     "`tritonwarm bundle create` + `bundle install` (`--serve-at PATH` for another mount path); on "
                     "this machine: `check --same-machine`")
    second = [row for row in rows if row.get("same_folder")]
    if second:
        root = Path(second[0]["folder"])  # the cache folder the groups name
        real = os.path.realpath(cache_dir)
        how = (f"a symbolic link: its real path is {real}" if real != str(cache_dir)
               else "a bind mount, or another mount of it")
        lines.append(f"{_variants(len(second))} named by their group files under {root}: the same folder as "
                     f"{cache_dir} by another path ({how}): a server "
                     f"that sees it only at {cache_dir} misses them all: install the bundle for that path "
                     f"(`tritonwarm bundle install BUNDLE --cache-dir {root} --serve-at {cache_dir}`), or serve it at "
                     f"{root}; where both paths are seen: `check --same-machine`")
    return lines


def _served_elsewhere(marked: Path | None, serve_at: Path | None) -> str:
    """Why entries installed for one mount path miss at another (``bundle install --serve-at``)."""
    if serve_at is None:
        return (f"this folder is installed for a server that mounts it at {marked} (`bundle install --serve-at "
                f"{marked}`): Triton reads its entries there only: check it as that server reads it, with "
                f"`tritonwarm check --serve-at {marked}`")
    where = f"for a server that mounts it at {marked}" if marked else "to serve where it is"
    return f"this folder is installed {where}, not at {serve_at}: install the bundle with `--serve-at {serve_at}`"


COMPILE_FAILED = "compile failed"


def _say_failed_compiles(report: CheckReport, wanted: dict[str, dict], failed: dict[str, dict]) -> None:
    """Missing variants a warm-up tried and could not compile: that cause, and the error, one line for
    each kernel and error with its count (not "not warmed")."""
    shared: Counter[tuple[str, str]] = Counter()
    rows: dict[tuple[str, str], str] = {}
    for summary in report.missing:
        record = failed.get(wanted[summary["id"]]["cache_hash"])
        if record is None:
            continue
        error = clipped(record["error"])
        summary["why"], summary["cause"] = f"the warm-up could not compile it: {error}", COMPILE_FAILED
        key = (clipped(record["kernel"]), error)
        shared[key] += 1
        rows.setdefault(key, f", first {clipped(record['rows'][0])}" if record["rows"] else "")
    report.reasons += [f"{kernel}: {_variants(count)} missing: the warm-up could not compile "
                       f"{'it' if count == 1 else 'them'}{rows[kernel, error]}: {error}"
                       for (kernel, error), count in shared.items()]


def _explain_missing(report: CheckReport, wanted: dict[str, dict], neighbours: WarmedNeighbours, *,
                     copies_explained: bool = False) -> None:
    """Each missing variant's own reason (``why``), and one line in ``reasons`` for each cause that
    misses many variants at once: another target warmed, a copied cache, files removed, other
    compile options, a kernel's code that is not the warmed code. ``copies_explained``: the folder's
    mount path is named already, so entries naming their files elsewhere need no line of their own."""
    shared: Counter[tuple[str, tuple[str, ...]]] = Counter()
    for summary in report.missing:
        if summary.get("cause"):  # told already (a compile that failed)
            continue
        reason = neighbours.why(wanted[summary["id"]])
        if reason is None:
            continue
        if reason.kind == OTHER_TARGET:  # the same for every variant: said once
            report.reasons.append(reason.line)
            return
        summary["why"], summary["cause"] = reason.line, reason.kind
        if reason.kind in _SHARED_CAUSES and not (copies_explained and reason.kind == COPIED):
            detail = (summary["kernel"],) if reason.kind == OTHER_CODE else (
                (summary["kernel"], reason.detail) if reason.kind == OTHER_GLOBALS else
                (reason.detail or "", str(neighbours.serve_at or neighbours.cache_dir)) if reason.kind == COPIED else
                (reason.detail or "",))
            shared[reason.kind, detail] += 1
    report.reasons += [_SHARED_CAUSES[kind](_variants(count), *detail) for (kind, detail), count in shared.items()]


_SHARED_CAUSES = {
    COPIED: lambda variants, folder, served: (
        f"{variants} in a cache copied or mounted from {folder}: Triton's group files name the files there by "
        f"absolute path, and a server reading {served} misses them: move a cache with `tritonwarm bundle create` / "
        f"`bundle install`, for the path the server reads (`bundle install BUNDLE --serve-at {served}` where it is "
        "installed at another path)"),
    FILES_GONE: lambda variants, _: (
        f"{variants} recorded as warmed, but the files are gone (removed since the warm-up): warm up again"),
    OTHER_OPTIONS: lambda variants, options: (
        f"{variants} warmed with other compile options: {options}: serve with the options the warm-up had "
        "(TRITON_DEBUG, say)"),
    OTHER_CODE: lambda variants, kernel: (
        f"{kernel}: {variants} cached for Triton's same keys under other hashes: the kernel's code is not the code "
        "that warmed this cache (another tritonwarm release, or an edited kernel or @triton.jit helper): warm with "
        "the code that serves"),
    OTHER_GLOBALS: lambda variants, kernel, constants: (
        f"{kernel}: {variants} cached for Triton's same keys under other hashes, warmed with other values of the "
        f"module-level constexprs the kernel reads: {constants}: {GLOBALS_ADVICE}"),
}


def _variants(count: int) -> str:
    return "1 planned variant is" if count == 1 else f"{count} planned variants are"
