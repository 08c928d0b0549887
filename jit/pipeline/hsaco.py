"""The kernel descriptor of an AMD code object (hsaco), read without ROCm: the registers, LDS and
scratch a kernel needs, as the GPU's loader reads them.

An hsaco is an ELF; its note ``AMDGPU`` (type 32, ``NT_AMDGPU_METADATA``) holds the code object's
metadata as MessagePack (LLVM AMDGPUUsage, "Code Object V3 and later Metadata"), one map per kernel in
``amdhsa.kernels``: ``.vgpr_count``, ``.agpr_count``, ``.sgpr_count``, ``.group_segment_fixed_size``
(static LDS), ``.private_segment_fixed_size`` (scratch: spills), ``.max_flat_workgroup_size``, ...
"""

from __future__ import annotations

import struct
from pathlib import Path

_NT_AMDGPU_METADATA = 32


def amd_kernel_descriptor(path) -> dict | None:
    """The first kernel's entry of ``amdhsa.kernels`` in an hsaco (an ELF whose note ``AMDGPU``, type 32,
    holds the code object's metadata as MessagePack: ``.vgpr_count``, ``.sgpr_count``, ``.agpr_count``,
    ``.group_segment_fixed_size``, ``.private_segment_fixed_size``, ...); None if it cannot be read."""
    try:
        data = Path(path).read_bytes()
        for name, kind, desc in _elf_notes(data):
            if name == b"AMDGPU" and kind == _NT_AMDGPU_METADATA:
                kernels = _MsgPack(desc).read().get("amdhsa.kernels")
                return kernels[0] if kernels and isinstance(kernels[0], dict) else None
    except (OSError, ValueError, KeyError, IndexError, TypeError, AttributeError, struct.error, RecursionError):
        return None
    return None


def _elf_notes(data: bytes):
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:  # 64-bit little-endian only (every hsaco)
        raise ValueError("not a 64-bit little-endian ELF")
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", data, 0x3A)
    for i in range(shnum):
        kind, = struct.unpack_from("<I", data, shoff + i * shentsize + 4)
        if kind != 7:  # SHT_NOTE
            continue
        offset, size = struct.unpack_from("<QQ", data, shoff + i * shentsize + 0x18)
        at, end = offset, offset + size
        while at + 12 <= end:
            namesz, descsz, note = struct.unpack_from("<III", data, at)
            name_at, desc_at = at + 12, at + 12 + (-(-namesz // 4) * 4)
            yield data[name_at:name_at + namesz].rstrip(b"\0"), note, data[desc_at:desc_at + descsz]
            at = desc_at + (-(-descsz // 4) * 4)


class _MsgPack:
    """The MessagePack subset AMD code object metadata uses: maps, arrays, strings, integers, booleans,
    floats, nil."""

    def __init__(self, data: bytes):
        self.data, self.at = data, 0

    def take(self, n: int) -> bytes:
        chunk = self.data[self.at:self.at + n]
        if len(chunk) != n:
            raise ValueError("truncated MessagePack")
        self.at += n
        return chunk

    def unpack(self, fmt: str):
        return struct.unpack(">" + fmt, self.take(struct.calcsize(">" + fmt)))[0]

    def read(self, depth: int = 0):
        if depth > 32:
            raise ValueError("MessagePack nested too deep")
        b = self.take(1)[0]
        if b <= 0x7F:
            return b
        if b >= 0xE0:
            return b - 0x100
        if 0x80 <= b <= 0x8F:
            return self.map(b & 0x0F, depth)
        if 0x90 <= b <= 0x9F:
            return [self.read(depth + 1) for _ in range(b & 0x0F)]
        if 0xA0 <= b <= 0xBF:
            return self.take(b & 0x1F).decode("utf-8", "replace")
        simple = {0xC0: None, 0xC2: False, 0xC3: True}
        if b in simple:
            return simple[b]
        sized = {0xCC: "B", 0xCD: "H", 0xCE: "I", 0xCF: "Q", 0xD0: "b", 0xD1: "h", 0xD2: "i", 0xD3: "q",
                 0xCA: "f", 0xCB: "d"}
        if b in sized:
            return self.unpack(sized[b])
        if b in (0xD9, 0xDA, 0xDB):
            return self.take(self.unpack("BHI"[b - 0xD9])).decode("utf-8", "replace")
        if b in (0xC4, 0xC5, 0xC6):
            return self.take(self.unpack("BHI"[b - 0xC4]))
        if b in (0xDC, 0xDD):
            return [self.read(depth + 1) for _ in range(self.unpack("HI"[b - 0xDC]))]
        if b in (0xDE, 0xDF):
            return self.map(self.unpack("HI"[b - 0xDE]), depth)
        raise ValueError(f"MessagePack type 0x{b:02x} not expected in code object metadata")

    def map(self, n: int, depth: int) -> dict:
        out = {}
        for _ in range(n):
            key = self.read(depth + 1)
            out[key] = self.read(depth + 1)
        return out
