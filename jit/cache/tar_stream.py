"""A tar reader that bounds every header before reading it.

Python's ``tarfile`` reads a pax extended header or a GNU long name whole into memory inside
``next()``, whatever size the archive announces, before a caller can check anything: a 1 MB bundle
announcing a 1 GB long name cost 5 GiB of memory. A bundle needs little of tar: regular files, names
either in the ustar fields or in one pax ``path`` record. This reader parses the 512-byte headers
itself and checks each announced size against its cap before reading a byte of what follows.
"""

from __future__ import annotations

from dataclasses import dataclass

BLOCK = 512
_KINDS = {b"1": "a hard link", b"2": "a symbolic link", b"3": "a device file", b"4": "a device file",
          b"5": "a directory", b"6": "a fifo", b"7": "a contiguous file", b"S": "a sparse file",
          b"g": "a global pax header", b"K": "a GNU long link name", b"V": "a volume label",
          b"M": "a multi-volume continuation", b"D": "a GNU directory dump"}


class TarFormatError(ValueError):
    """The stream is not a tar archive this reader accepts; the message is one bounded line."""


@dataclass
class Member:
    name: str
    size: int
    kind: str  # "a regular file", "a symbolic link", ...: what the member is, for messages

    def isreg(self) -> bool:
        return self.kind == "a regular file"


def _octal(field: bytes, what: str) -> int:
    if field[:1] and field[0] & 0x80:  # GNU base-256 (sizes over 8 GiB): still a number, capped by the caller
        value = int.from_bytes(field[1:], "big")
        return -value if field[0] & 0x40 else value
    text = field.rstrip(b"\0 ").lstrip(b" ")
    try:
        return int(text, 8) if text else 0
    except ValueError:
        raise TarFormatError(f"a tar header's {what} is not a number") from None


def _text(field: bytes) -> str:
    return field.split(b"\0", 1)[0].decode("utf-8", "surrogateescape")


def _pax_path(data: bytes) -> tuple[str | None, int | None]:
    """The ``path`` and ``size`` records of one pax extended header (other records are ignored, a
    sparse one refused); each record is ``<length> <key>=<value>\\n``."""
    path = size = None
    pos = 0
    while pos < len(data):
        space = data.find(b" ", pos, pos + 20)
        try:
            length = int(data[pos:space]) if space > pos else 0
        except ValueError:
            length = 0
        record = data[pos:pos + length]
        if length <= space - pos + 1 or len(record) != length or not record.endswith(b"\n") or b"=" not in record:
            raise TarFormatError("a pax extended header is malformed")
        key, _, value = record[space - pos + 1:-1].partition(b"=")
        if key.startswith(b"GNU.sparse"):
            raise TarFormatError("a pax header describes a sparse file; a bundle holds plain files only")
        if key == b"path":
            path = value.decode("utf-8", "surrogateescape")
        elif key == b"size":
            try:
                size = int(value)
            except ValueError:
                raise TarFormatError("a pax size record is not a number") from None
        pos += length
    return path, size


class TarStream:
    """Members of a tar stream in order, read once; ``extended_bytes`` caps a pax header or GNU long
    name (checked against the size it announces, before it is read)."""

    def __init__(self, raw, extended_bytes: int):
        self.raw, self.extended_bytes = raw, extended_bytes
        self._left = 0  # unread bytes of the current member's data, then its padding
        self._pad = 0

    def _read_exact(self, n: int) -> bytes:
        chunks, want = [], n
        while want:
            data = self.raw.read(want)
            if not data:
                raise TarFormatError("the archive ends inside a member (truncated)")
            chunks.append(data)
            want -= len(data)
        return b"".join(chunks)

    def _skip(self, n: int) -> None:
        while n:
            n -= len(self._read_exact(min(n, 1 << 20)))

    def read(self, n: int = -1) -> bytes:
        """Up to ``n`` bytes of the current member's data (all that is left when ``n`` < 0)."""
        n = self._left if n is None or n < 0 else min(n, self._left)
        data = self._read_exact(n) if n else b""
        self._left -= len(data)
        return data

    def _extended(self, size: int, what: str) -> bytes:
        if size > self.extended_bytes:
            raise TarFormatError(f"{what} of {size} bytes is over the limit of {self.extended_bytes} bytes")
        data = self._read_exact(size)
        self._skip(-size % BLOCK)
        return data

    def next(self) -> Member | None:
        """The next member's header (its data is read with ``read``), or None at the end."""
        self._skip(self._left + self._pad)
        self._left = self._pad = 0
        long_name = pax_path = pax_size = None
        while True:
            header = self.raw.read(BLOCK)
            if len(header) < BLOCK:
                if not header and long_name is None and pax_path is None:
                    return None  # an archive without the end-of-archive blocks
                header += self._read_exact(BLOCK - len(header)) if header else b""
                if len(header) < BLOCK:
                    raise TarFormatError("the archive ends inside a member (truncated)")
            if header == b"\0" * BLOCK:
                if long_name is not None or pax_path is not None:
                    raise TarFormatError("an extended header is followed by no member")
                return None
            stored = _octal(header[148:156], "checksum")
            if stored not in (sum(header[:148]) + 256 + sum(header[156:]),
                              sum(b - 256 if b > 127 else b for b in header[:148] + header[156:]) + 256):
                raise TarFormatError("a tar header's checksum is wrong: not a tar archive, or a damaged one")
            size = _octal(header[124:136], "size")
            kind = header[156:157]
            if kind == b"x":
                pax_path, pax_size = _pax_path(self._extended(size, "a pax extended header"))
                continue
            if kind == b"L":
                long_name = _text(self._extended(size, "a GNU long name"))
                continue
            name = _text(header[:100])
            if header[257:262] == b"ustar" and header[345:500].strip(b"\0"):
                name = _text(header[345:500]) + "/" + name
            name = pax_path if pax_path is not None else long_name if long_name is not None else name
            if pax_size is not None:
                size = pax_size
            if size < 0:
                raise TarFormatError("a tar header announces a negative size")
            member = Member(name, size, "a regular file" if kind in (b"0", b"\0") else
                            _KINDS.get(kind, f"of tar type {kind!r}"))
            self._left = size if member.isreg() else 0
            self._pad = -self._left % BLOCK
            return member
