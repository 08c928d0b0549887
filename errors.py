"""How an error reads to a user: its own message on one line, never a class name unless the message is empty.

Text that came from a cache, a bundle or Redis is made safe to print here too: a kernel name, an
argument class or a fingerprint field is chosen by whoever wrote the cache or the archive, and printed
raw, a carriage return or an escape sequence can clear the screen or forge an "ok" line. Every such
field goes through ``printable`` before it is printed (messages through ``clipped``, which also cuts
them short: an archive chooses how long its names are).
"""

from __future__ import annotations


def describe_error(e: BaseException) -> str:
    """``str(e)`` on one line; ``KeyError``'s quotes dropped; the type's name only when there is no message.

    A ``TypeError`` or ``AttributeError`` from a launcher's code says little without its name, so
    those (programming errors, not bad input) keep it.
    """
    if isinstance(e, KeyError) and e.args:
        text = str(e.args[0])  # str(KeyError) wraps the message in quotes
    else:
        text = str(e)
    if not text:
        text = type(e).__name__
    elif isinstance(e, (TypeError, AssertionError, AttributeError, NameError)):
        text = f"{type(e).__name__}: {text}"
    return clipped(" ".join(text.split()), 2000)  # a message may quote what an archive or a file chose


MESSAGE_CHARS = 300


def _escaped(char: str) -> str:
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def printable(value) -> str:
    """``value`` as text, every control or invisible formatting character written as an escape
    (``\\x1b``, ``\\n``, ``\\u202e``); ordinary text, spaces included, unchanged."""
    text = value if isinstance(value, str) else str(value)
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() or c == " " else _escaped(c) for c in text)


def clipped(value, limit: int = MESSAGE_CHARS) -> str:
    """``printable(value)``, cut to ``limit`` characters (with how much was left out)."""
    text = printable(value)
    if len(text) <= limit:
        return text
    return f"{text[:limit]}… ({len(text) - limit} more characters)"

