"""What a manifest or bundle record must hold before anything uses it.

A record's names become paths (``entry_dir``, ``entry_name``, its file names) and its fields are
printed and compared, so a hand-edited or damaged record is refused with the field it got wrong,
never followed: a folder named in it is only ever the one its cache hash names.
"""

from __future__ import annotations

import json
import re

from .layout import entry_dir_name

SHA256 = re.compile(r"[0-9a-f]{64}")
FILE_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]{0,254}")  # one plain path component
_NONE = type(None)

# Every record has these (the CLI prints them) ...
_REQUIRED = {"id": str, "kernel": str, "target": str, "entry_name": str, "entry_dir": str, "args": dict}
# ... and these, where present, hold what warm-ups write.
_OPTIONAL = {"cache_hash": str, "key": str, "specialization_data": str, "num_warps": int, "num_stages": int,
             "rows": list, "import_path": str, "jit_function": str, "files": dict, "resources": (dict, _NONE),
             "compile_seconds": (int, float, _NONE), "triton_version": (str, _NONE), "env": dict,
             "environment": (str, _NONE), "constexpr_globals": dict, "autotuned": bool,
             "shared_estimate": (int, _NONE)}


# What a bundle's row must hold, since every reader of the manifest it lands in uses them.
_COMPLETE = ("key", "specialization_data", "num_warps", "num_stages", "rows")
# Tables and lists whose items are printed, hashed or sorted: each item must be text.
_OF_TEXT = {"args": "table", "constexpr_globals": "table", "env": "table", "rows": "list"}


def plain_file_name(name) -> bool:
    """Triton's own naming of an entry's files: one path component (no separator, not absolute, no
    ``..``, not empty), of the characters a kernel name and an extension are made of."""
    return isinstance(name, str) and FILE_NAME.fullmatch(name) is not None and name not in (".", "..")


def metadata_problem(data: bytes, entry_dir: str) -> str | None:
    """What is wrong with the metadata (Triton's ``<kernel>.json``) of the entry in folder ``entry_dir``:
    Triton loads the kernel it describes, so it must name the cache hash that folder is named after
    (another key's valid files would load another kernel); None when it does."""
    try:
        named = json.loads(data).get("hash")
    except (ValueError, AttributeError, RecursionError):
        return "the entry's metadata is not a JSON table"
    if not isinstance(named, str) or not SHA256.fullmatch(named) or entry_dir_name(named) != entry_dir:
        return (f"the entry's metadata names the cache hash {str(named)[:16]!r}..., not the one its folder "
                f"{entry_dir[:16]}... is named after (another kernel's files)")
    return None


def _items_problem(value) -> str | None:
    """What is wrong with a table or list that must hold text only (JSON keys are always text)."""
    for item in value.values() if isinstance(value, dict) else value:
        if not isinstance(item, str):
            return f"holds {item!r:.40}, which is not text"
    return None


def _kind(types) -> str:
    names = [t.__name__ for t in (types if isinstance(types, tuple) else (types,)) if t is not _NONE]
    return {"str": "a string", "dict": "a table", "list": "a list", "int": "an integer"}.get(
        names[0], names[0]) if len(names) == 1 else "a number"


def record_problem(cache_hash, record, target: str, *, files_required: bool = False,
                   complete: bool = False) -> tuple[str, str] | None:
    """``(where, what is wrong)`` for the first field of ``record``, filed under ``target``, that
    cannot be trusted (where: ``<hash>.<field>``); None when every field holds what a warm-up writes.
    ``complete``: every field a warm-up writes must be there (a bundle's row)."""
    if not isinstance(cache_hash, str) or not SHA256.fullmatch(cache_hash):
        return repr(str(cache_hash)[:20]), "not a cache hash"
    where = cache_hash[:16]
    if not isinstance(record, dict):
        return where, "not a record"
    if record.get("entry_dir") != entry_dir_name(cache_hash):
        return f"{where}.entry_dir", f"{record.get('entry_dir')!r} is not the folder of that cache hash"
    for name in _REQUIRED:
        if name not in record:
            return f"{where}.{name}", "missing"
    for name in _COMPLETE if complete else ():
        if name not in record:
            return f"{where}.{name}", "missing"
    for name, types in {**_REQUIRED, **_OPTIONAL}.items():
        value = record.get(name)
        if name in record and (not isinstance(value, types) or (isinstance(value, bool) and bool not in
                                                                 (types if isinstance(types, tuple) else (types,)))):
            return f"{where}.{name}", f"{value!r:.40} is not {_kind(types)}"
        problem = _items_problem(value) if name in _OF_TEXT and name in record else None
        if problem:
            return f"{where}.{name}", problem
    for name, low in (("num_warps", 1), ("num_stages", 0)):
        if name in record and not low <= record[name] <= 1024:
            return f"{where}.{name}", f"{record[name]!r} is out of range"
    if record["target"] != target:
        return f"{where}.target", f"{record['target']!r} is filed under {target}"
    if record.get("cache_hash", cache_hash) != cache_hash:
        return f"{where}.cache_hash", f"{record['cache_hash'][:16]!r}... is not the hash it is filed under"
    if not FILE_NAME.fullmatch(record["entry_name"]):
        return f"{where}.entry_name", f"{record['entry_name'][:40]!r} is not a kernel name"
    files = record.get("files")
    if (files_required or "files" in record) and not files:  # rows written before files were hashed lack them
        return f"{where}.files", "missing"
    for name, digest in (files or {}).items():
        if not plain_file_name(name) or name.startswith("__grp__"):
            return f"{where}.files", f"{str(name)[:40]!r} is not a cache file name"
        if not isinstance(digest, str) or not SHA256.fullmatch(digest):
            return f"{where}.files.{name}", "not a sha256"
    return None
