"""Host-side integer helpers for launch specs. ``triton.next_power_of_2`` and ``triton.cdiv`` are
``ConstexprFunction`` objects (callable from device code too), and a host call to one costs a few
microseconds; a launch spec runs on every launch, so it uses these plain equivalents."""


def next_power_of_2(n: int) -> int:
    """The smallest power of two >= ``n`` (0 for 0), as ``triton.next_power_of_2``."""
    return 1 << (n - 1).bit_length() if n > 0 else 0


def cdiv(a: int, b: int) -> int:
    return -(-a // b)
