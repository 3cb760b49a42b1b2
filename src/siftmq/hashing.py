"""Java hashing helpers shared by the filter engine and the store (both may import this module).

``java_string_hash`` is what RocketMQ keeps as a message's tags code in the ConsumeQueue; the
filter's TAG subscriptions and the store's index must compute it identically, so there is one copy.
"""

from __future__ import annotations


def to_int32(value: int) -> int:
    """Java ``(int)`` of a long: keep the low 32 bits, signed."""
    value &= 0xFFFFFFFF
    return value - 0x100000000 if value & 0x80000000 else value


def java_string_hash(s: str) -> int:
    """Java ``String.hashCode``: over UTF-16 code units (lone surrogates too), int32 wrap-around, signed."""
    h = 0
    if s.isascii() or all(ord(c) < 0x10000 for c in s):
        for c in s:
            h = (31 * h + ord(c)) & 0xFFFFFFFF
    else:
        data = s.encode("utf-16-le", "surrogatepass")
        for unit in memoryview(data).cast("H"):
            h = (31 * h + unit) & 0xFFFFFFFF
    return to_int32(h)
