"""Cheap identity checks of an entry's GPU binary against its metadata, read from the ELF itself.

A cubin (NVIDIA) and a hsaco (AMD) are ELF files: the kernel is a function symbol of the name
Triton's metadata records, and a cubin's ``.nv.info`` attributes hold the threads per block it was
built for (``.reqntid``: ``num_warps`` × warp size) and its register count (at most ``maxnreg``
where the metadata sets one). These catch another kernel's binary under intact metadata, and
another variant's where ``num_warps`` differs; two variants of one kernel with the same warps share
all of it (the fleet key catches those). Triton's shared memory is dynamic: only the metadata
records it, the binary has nothing to compare it with. No tool is needed: the ELF is read here.
"""

from __future__ import annotations

import json
import struct

_ELF_MAGIC = b"\x7fELF"
_SHT_SYMTAB = 2
_STT_FUNC = 2
_EIATTR_REQNTID = 0x10
_EIATTR_REGCOUNT = 0x2F
_EIFMT_NVAL, _EIFMT_BVAL, _EIFMT_HVAL, _EIFMT_SVAL = 1, 2, 3, 4
BINARY_SUFFIXES = (".cubin", ".hsaco")


class _NotElf(ValueError):
    pass


def _sections(data: bytes) -> list[tuple[str, int, int, int, int]]:
    """``(name, type, offset, size, link)`` of each section of a 64-bit little-endian ELF."""
    if data[:4] != _ELF_MAGIC or len(data) < 64 or data[4] != 2 or data[5] != 1:
        raise _NotElf("not a 64-bit little-endian ELF file")
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    if shentsize != 64 or shoff + shnum * 64 > len(data) or shstrndx >= max(shnum, 1):
        raise _NotElf("its section table lies outside the file")
    raw = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * 64) for i in range(shnum)]
    names_at, names_size = raw[shstrndx][4], raw[shstrndx][5]
    if names_at + names_size > len(data):
        raise _NotElf("its section names lie outside the file")
    sections = []
    for name, kind, _, _, offset, size, link, *_ in raw:
        if kind != 8 and offset + size > len(data):  # 8: NOBITS (no bytes in the file)
            raise _NotElf("a section lies outside the file")
        sections.append((_string(data, names_at + name, names_at + names_size), kind, offset, size, link))
    return sections


def _string(data: bytes, start: int, end: int) -> str:
    stop = data.find(b"\0", start, end)
    return data[start:stop if stop >= 0 else end].decode("utf-8", "replace")


def _functions(data: bytes, sections) -> dict[str, int]:
    """Defined function symbols: name → symbol index."""
    found = {}
    for _, kind, offset, size, link in sections:
        if kind != _SHT_SYMTAB or link >= len(sections):
            continue
        strings_at, strings_size = sections[link][2], sections[link][3]
        for index in range(size // 24):
            name, info, _, shndx, _, _ = struct.unpack_from("<IBBHQQ", data, offset + index * 24)
            if info & 0xF == _STT_FUNC and shndx != 0:
                found[_string(data, strings_at + name, strings_at + strings_size)] = index
    return found


def _attributes(data: bytes, offset: int, size: int):
    """``(attribute, value bytes)`` of a ``.nv.info`` section."""
    at, end = offset, offset + size
    while at + 2 <= end:
        fmt, attribute = data[at], data[at + 1]
        at += 2
        if fmt == _EIFMT_SVAL:
            if at + 2 > end:
                return
            length, = struct.unpack_from("<H", data, at)
            yield attribute, data[at + 2:at + 2 + length]
            at += 2 + length
        elif fmt == _EIFMT_HVAL:
            yield attribute, data[at:at + 2]
            at += 2
        elif fmt == _EIFMT_BVAL:
            yield attribute, data[at:at + 1]
            at += 2
        elif fmt == _EIFMT_NVAL:
            at += 2
        else:
            return


def binary_facts(data: bytes, kernel: str) -> dict:
    """What the ELF says of ``kernel``: ``functions`` (all defined), and for a cubin ``threads`` and
    ``registers`` where it records them. Raises ``ValueError`` for a file that is no ELF."""
    sections = _sections(data)
    functions = _functions(data, sections)
    facts: dict = {"functions": sorted(functions)}
    by_name = {name: (offset, size) for name, _, offset, size, _ in sections}
    if f".nv.info.{kernel}" in by_name:
        for attribute, value in _attributes(data, *by_name[f".nv.info.{kernel}"]):
            if attribute == _EIATTR_REQNTID and len(value) >= 4 and len(value) % 4 == 0:
                threads = 1
                for n in struct.unpack(f"<{len(value) // 4}I", value):
                    threads *= max(n, 1)
                facts["threads"] = threads
    if ".nv.info" in by_name and kernel in functions:
        for attribute, value in _attributes(data, *by_name[".nv.info"]):
            if attribute == _EIATTR_REGCOUNT and len(value) == 8:
                symbol, count = struct.unpack("<II", value)
                if symbol == functions[kernel]:
                    facts["registers"] = count
    return facts


def binary_problem(files: dict[str, bytes], metadata_name: str) -> str | None:
    """Why the entry's binary is not the kernel its metadata describes; None when nothing shows it."""
    try:
        metadata = json.loads(files[metadata_name])
    except (KeyError, ValueError, RecursionError):
        return None  # the metadata check says what is wrong with it
    kernel = metadata.get("name") if isinstance(metadata, dict) else None
    binaries = [n for n in files if n.endswith(BINARY_SUFFIXES)]
    if not isinstance(kernel, str) or not binaries:
        return None
    for name in binaries:
        try:
            facts = binary_facts(files[name], kernel)
        except (ValueError, struct.error):
            continue  # not an ELF file: no kernel of another name can be seen in it (and Triton cannot load it)
        if kernel not in facts["functions"]:
            shown = ", ".join(facts["functions"][:3]) or "none"
            return f"its {name} defines kernel {shown}, not {kernel} that its metadata names (another kernel's binary)"
        warps, warp_size = metadata.get("num_warps"), metadata.get("warp_size") or 32
        if "threads" in facts and isinstance(warps, int) and isinstance(warp_size, int) and \
                facts["threads"] != warps * warp_size:
            return (f"its {name} is built for {facts['threads']} threads per block, its metadata for {warps} warps "
                    f"of {warp_size} (another variant's binary)")
        limit = metadata.get("maxnreg")
        if "registers" in facts and isinstance(limit, int) and facts["registers"] > limit:
            return f"its {name} uses {facts['registers']} registers, over the maxnreg {limit} its metadata records"
    return None


__all__ = ["BINARY_SUFFIXES", "binary_facts", "binary_problem"]
