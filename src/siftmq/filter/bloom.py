"""RocketMQ's bloom filter: same k, m, bit positions and bit layout as ``BloomFilter``/``BitsArray``.

* ``k = ceil(ln(f/100) / ln(0.5))``; ``m = ceil(n · log2(100/f) · log2(e))`` rounded up to a
  multiple of 8 — computed with the same floating-point steps as RocketMQ;
* a key's positions come from murmur3_x64_128 (seed 0) over its UTF-8 bytes as Java's
  ``String.getBytes(UTF_8)`` makes them: the key is read as UTF-16 code units, so a surrogate pair
  held as two code points is one character, and a lone surrogate becomes ``?``. ``hash1``/``hash2``
  are the low/high 32 bits of the first 64-bit word, and position i is ``c mod m`` with
  ``c = hash1 + i·hash2`` (int32 wrap-around, ``~c`` when negative);
* a bitmap is ``m/8`` bytes, bit p in byte p // 8 under mask ``1 << (p % 8)``.

The broker's default is ``f=20, n=32`` and keys ``consumerGroup#topic``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import mmh3

from siftmq.hashing import to_int32

DEFAULT_F = 20
DEFAULT_N = 32


class BloomFilter:
    """Bit positions and bitmaps for keys, parameterised by error rate ``f`` (percent) and size ``n``."""

    __slots__ = ("f", "k", "m", "n")

    def __init__(self, f: int = DEFAULT_F, n: int = DEFAULT_N) -> None:
        if isinstance(f, bool) or not isinstance(f, int) or f < 1 or f >= 100:
            raise ValueError(f"bloom filter error rate f must be an integer in 1..99, got {f!r}")
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"bloom filter size n must be an integer >= 1, got {n!r}")
        self.f = f
        self.n = n
        error_rate = f / 100.0
        self.k = math.ceil(math.log(error_rate) / math.log(0.5))
        m = math.ceil(n * (math.log(1 / error_rate) / math.log(2)) * (math.log(math.e) / math.log(2)))
        self.m = int(8 * math.ceil(m / 8.0))

    def __repr__(self) -> str:
        return f"BloomFilter(f={self.f}, n={self.n}, k={self.k}, m={self.m})"

    @property
    def bitmap_size(self) -> int:
        """Bytes in one bitmap."""
        return self.m // 8

    def bit_positions(self, key: str) -> list[int]:
        data = _java_utf8(key)
        h64 = mmh3.hash64(data, 0, signed=False)[0]
        hash1 = to_int32(h64)
        hash2 = to_int32(h64 >> 32)
        positions = []
        for i in range(1, self.k + 1):
            c = to_int32(hash1 + i * hash2)
            if c < 0:
                c = ~c
            positions.append(c % self.m)
        return positions

    def bitmap(self, keys: Iterable[str]) -> bytes:
        """The bitmap with every key's bits set (RocketMQ's ``BitsArray`` bytes)."""
        bits = bytearray(self.bitmap_size)
        for key in keys:
            for p in self.bit_positions(key):
                bits[p >> 3] |= 1 << (p & 7)
        return bytes(bits)

    def is_hit(self, key: str, bitmap: bytes) -> bool:
        """Whether every bit of ``key`` is set in ``bitmap`` (false positives are possible)."""
        return self.is_hit_positions(self.bit_positions(key), bitmap)

    def is_hit_positions(self, positions: Iterable[int], bitmap: bytes) -> bool:
        if len(bitmap) != self.bitmap_size:
            raise ValueError(f"bitmap has {len(bitmap)} bytes; this filter's bitmaps have {self.bitmap_size}")
        return all(bitmap[p >> 3] & (1 << (p & 7)) for p in positions)


def _java_utf8(key: str) -> bytes:
    """``key.getBytes(UTF_8)`` of the Java string with the same UTF-16 code units."""
    try:
        return key.encode("utf-8")
    except UnicodeEncodeError:
        # surrogate code points: pair them up as UTF-16 does, then each lone one becomes "?"
        units = key.encode("utf-16-le", "surrogatepass")
        return units.decode("utf-16-le", "surrogatepass").encode("utf-8", "replace")
