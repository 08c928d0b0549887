"""What a manifest or bundle record must hold before anything uses it.

A record's names become paths (``entry_dir``, ``entry_name``, its file names) and its fields are
printed and compared, so a hand-edited or damaged record is refused with the field it got wrong,
never followed: a folder named in it is only ever the one its cache hash names.
"""

from __future__ import annotations

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
             "environment": (str, _NONE), "constexpr_globals": dict}


def _kind(types) -> str:
    names = [t.__name__ for t in (types if isinstance(types, tuple) else (types,)) if t is not _NONE]
    return {"str": "a string", "dict": "a table", "list": "a list", "int": "an integer"}.get(
        names[0], names[0]) if len(names) == 1 else "a number"


def record_problem(cache_hash, record, target: str, *, files_required: bool = False) -> tuple[str, str] | None:
    """``(where, what is wrong)`` for the first field of ``record``, filed under ``target``, that
    cannot be trusted (where: ``<hash>.<field>``); None when every field holds what a warm-up writes."""
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
    for name, types in {**_REQUIRED, **_OPTIONAL}.items():
        if name in record and not isinstance(record[name], types):
            return f"{where}.{name}", f"{record[name]!r:.40} is not {_kind(types)}"
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
        if not FILE_NAME.fullmatch(str(name)) or name.startswith("__grp__"):
            return f"{where}.files", f"{str(name)[:40]!r} is not a cache file name"
        if not isinstance(digest, str) or not SHA256.fullmatch(digest):
            return f"{where}.files.{name}", "not a sha256"
    return None
