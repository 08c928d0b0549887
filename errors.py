"""How an error reads to a user: its own message on one line, never a class name unless the message is empty."""

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
    return " ".join(text.split())
