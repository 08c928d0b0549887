"""Why one variant is not in the cache, told from what the manifest records beside it.

A variant the cache lacks is named by Triton's cache hash, which says nothing about why. The entries
warmed for the same kernel under the runtime's environment do (entries of another environment are
explained once per environment by ``env.differences``):

- the entry is there, but its ``__grp__`` file names another folder's files: a cache copied or
  mounted at another path (Triton writes absolute paths into it);
- the manifest records this very hash, but its files are gone: removed since the warm-up;
- an entry with Triton's very key (same arguments, same options) sits under another hash: the only
  part of the hash left is the kernel's code (its source or a ``@triton.jit`` helper), so the cache
  was warmed by other code than the one serving, e.g. another tritonwarm release; where the
  module-level constexprs the kernel reads (in that hash too) had other values, they are named: a
  value computed at import, from an environment variable or the machine;
- otherwise the nearest entry names the arguments (specialization classes) or options that differ:
  a class that was not warmed, or options (``debug``) the warm-up did not have;
- no entry of the kernel at all: it was never warmed for this environment;
- no entry of this target at all, but manifests of others: warmed for another GPU.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from ..cache import CacheError, Manifest, entry_dir_name
from ..cache.env import current_fingerprint, same_environment
from ..cache.layout import foreign_group_folder
from ..cache.manifest import entry_fingerprint, manifests

COPIED, FILES_GONE, OTHER_CODE, OTHER_CLASS = "copied", "files gone", "other code", "other class"
OTHER_GLOBALS = "other module constants"
NOT_WARMED, OTHER_TARGET, OTHER_OPTIONS = "kernel not warmed", "other target", "other options"
_OPTIONS = ("num_warps", "num_stages")
_SHOWN = 3  # differing arguments named before "and N more"


@dataclass(frozen=True)
class MissReason:
    kind: str  # COPIED, FILES_GONE, OTHER_CODE, OTHER_GLOBALS, OTHER_CLASS, OTHER_OPTIONS, NOT_WARMED, OTHER_TARGET
    line: str  # what to print after the missing variant
    neighbour: str | None = None  # id of the recorded entry it was told from
    detail: str | None = None  # what variants missed for one cause share: the options, the original cache


class WarmedNeighbours:
    """The entries a manifest records under the runtime's environment, by kernel."""

    def __init__(self, recorded: dict[str, dict], environments: dict[str, dict], runtime: dict, target: str,
                 other_targets: Iterable[str] = (), cache_dir: str | Path | None = None,
                 serve_at: Path | None = None):
        self.target, self.other_targets = target, [t for t in other_targets if t != target]
        self.cache_dir, self.serve_at = cache_dir, serve_at  # serve_at: the cache as a server mounting it there
        self.by_kernel: dict[str, list[dict]] = defaultdict(list)
        self.recorded_any = bool(recorded)
        for cache_hash, entry in sorted(recorded.items()):
            if same_environment(entry_fingerprint(entry, environments), runtime, target):
                self.by_kernel[entry["kernel"]].append({**entry, "cache_hash": cache_hash, "options": _options(entry)})

    @classmethod
    def of_cache(cls, cache_dir: str | Path, target: str, runtime: dict | None = None,
                 recorded: dict[str, dict] | None = None) -> WarmedNeighbours:
        """From ``cache_dir``'s manifest for ``target`` (its records, where the caller read them
        already); an unreadable or damaged one explains nothing."""
        manifest = Manifest(Path(cache_dir), target)
        try:
            recorded, environments = recorded if recorded is not None else manifest.read(), manifest.environments()
        except (CacheError, OSError):  # ManifestDamaged is a CacheError
            recorded, environments = {}, {}
        return cls(recorded, environments, runtime if runtime is not None else current_fingerprint(), target,
                   list(manifests(cache_dir)), cache_dir)

    def why(self, wanted: dict) -> MissReason | None:
        """Why ``wanted`` (a variant's JSON: kernel, args, and where known cache_hash, key, num_warps,
        num_stages) is missing; None when nothing of this environment is recorded (a cold cache, or
        one warmed only under other environments)."""
        copied_from = self._copied_from(wanted)
        if copied_from:
            return MissReason(COPIED, f"its entry is here, but names its files under {copied_from} (Triton's group "
                                      "files hold absolute paths): this cache was copied or mounted from there: "
                                      "move a cache with bundle create / bundle install (--serve-at PATH when "
                                      "it is installed at another path than the server mounts it at)",
                              detail=str(Path(copied_from).parent))
        if not self.by_kernel:
            if self.other_targets and not self.recorded_any:
                return MissReason(OTHER_TARGET, f"this cache holds no entry for {self.target}, only for "
                                                f"{', '.join(self.other_targets)}: warm with --target {self.target}")
            return None
        entries = self.by_kernel.get(wanted["kernel"], [])
        if not entries:
            return MissReason(NOT_WARMED, "no variant of this kernel is warmed for this environment: warm a spec "
                                          "or engine config that launches it")
        for entry in entries:
            if entry["cache_hash"] == wanted.get("cache_hash"):
                return MissReason(FILES_GONE, "the manifest records it as warmed, but its files are gone (removed "
                                              "since the warm-up): warm up again", entry["id"])
        wanted = {**wanted, "options": _options(wanted)}
        nearest = min(entries, key=lambda entry: len(_differences(entry, wanted)))
        differing = _differences(nearest, wanted)
        if not differing and wanted.get("key") is not None and nearest.get("key") == wanted["key"]:
            constants = _named(_differing_globals(nearest, wanted))
            if constants:
                return MissReason(OTHER_GLOBALS, f"variant {nearest['id']} has Triton's same key (arguments and "
                                                 "options) under another hash, and the module-level constexprs "
                                                 f"the kernel reads differ: {constants}: "
                                                 f"{GLOBALS_ADVICE}", nearest["id"], constants)
            return MissReason(OTHER_CODE, f"variant {nearest['id']} has Triton's same key (arguments and options) "
                                          "under another hash: the kernel's code (its source or a @triton.jit "
                                          "helper) is not the code that warmed it: warm with the code that serves",
                              nearest["id"])
        if not differing:
            return MissReason(OTHER_CLASS, f"variant {nearest['id']} has the same arguments under another hash: "
                                           "other launch options, or other code of the kernel", nearest["id"])
        named = _named(differing)
        arguments = {*wanted.get("args", {}), *nearest.get("args", {})}  # an argument only one side has is one
        if not any(name in arguments or name in _OPTIONS for name, _, _ in differing):
            return MissReason(OTHER_OPTIONS, f"nearest warmed variant {nearest['id']} has the same arguments, "
                                             f"compiled with other options: {named}: serve with the options the "
                                             "warm-up had (TRITON_DEBUG, say)", nearest["id"], named)
        return MissReason(OTHER_CLASS, f"nearest warmed variant {nearest['id']} differs in {named}: this "
                                       "class was not warmed: warm a spec row that launches it", nearest["id"])

    def _copied_from(self, wanted: dict) -> str | None:
        """The folder another cache's group names, for an entry that is here but reads as missing."""
        if self.cache_dir is None or not wanted.get("cache_hash") or not wanted.get("entry_name"):
            return None
        return foreign_group_folder(Path(self.cache_dir), entry_dir_name(wanted["cache_hash"]), wanted["entry_name"],
                                    self.serve_at)


GLOBALS_ADVICE = ("values computed when the module is imported (from an environment variable, or the machine) are "
                  "part of every key of the kernel: warm where they have the serving values")


def _named(differing: list[tuple[str, object, object]]) -> str:
    """``name (warmed W, here H), ...`` for the first few, then ``and N more``."""
    named = ", ".join(f"{name} (warmed {warmed}, here {here})" for name, warmed, here in differing[:_SHOWN])
    return named + (f" and {len(differing) - _SHOWN} more" if len(differing) > _SHOWN else "")


def _differing_globals(entry: dict, wanted: dict) -> list[tuple[str, object, object]]:
    """``(name, warmed, here)`` for each module-level constexpr whose value differs, where both sides
    recorded them (entries warmed before they were recorded say nothing)."""
    warmed, here = entry.get("constexpr_globals"), wanted.get("constexpr_globals")
    if not isinstance(warmed, dict) or not isinstance(here, dict):
        return []
    return [(name, warmed.get(name, "-"), here.get(name, "-")) for name in sorted({*warmed, *here})
            if warmed.get(name) != here.get(name)]


def _differences(entry: dict, wanted: dict) -> list[tuple[str, object, object]]:
    """``(name, warmed, here)`` for each argument class and compile option (``options``, parsed once)
    that differs."""
    warmed_args, args = entry.get("args", {}), wanted.get("args", {})
    differing = [(name, warmed_args.get(name, "-"), args.get(name, "-"))
                 for name in [*args, *(n for n in warmed_args if n not in args)]
                 if warmed_args.get(name) != args.get(name)]
    warmed_options, options = entry["options"], wanted["options"]
    differing += [(name, warmed_options[name], options[name]) for name in options
                  if name in warmed_options and warmed_options[name] != options[name]]
    return differing


def _options(record: dict) -> dict:
    """The compile options Triton's key ends with (``num_warps``, ``debug``, ...); from the record's
    own fields where its key is unknown or not of that form."""
    key = record.get("key") or ""
    start = key.find("]{")
    try:
        options = ast.literal_eval(key[start + 1:]) if start >= 0 else None
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        options = None
    if isinstance(options, dict):
        return options
    return {name: record[name] for name in _OPTIONS if record.get(name) is not None}
