"""Our bloom filter against vectors printed by real Java (Guava's murmur3_128, RocketMQ's arithmetic).

``data/bloom_vectors.json`` was produced by a small standalone Java program (not part of this
repository) on OpenJDK 17 with Debian's Guava 31.1; its ``note``, ``guava``, ``java`` and
``generated`` fields say how and when. ``sizing`` rows are ``[f, n, k, m]``, ``hash64`` rows
``[key, asLong()]`` and ``positions`` rows ``[f, n, key, calcBitPositions(key)]``. Keys are
JSON-escaped per UTF-16 unit, so lone surrogates arrive as in Java.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import mmh3
import pytest

from siftmq.filter import BloomFilter

DATA = Path(__file__).parent / "data" / "bloom_vectors.json"
VECTORS: dict[str, Any] = json.loads(DATA.read_text("utf-8"))


def _split_pairs(key: str) -> str:
    """The same UTF-16 code units with every surrogate pair as two separate code points."""
    units = key.encode("utf-16-le", "surrogatepass")
    return "".join(chr(int.from_bytes(units[i : i + 2], "little")) for i in range(0, len(units), 2))


def test_vectors_cover_what_they_claim() -> None:
    assert VECTORS["guava"].startswith("31.")
    assert len(VECTORS["sizing"]) == 99 * 11
    keys = {row[0] for row in VECTORS["hash64"]}
    assert {"", "group#topic", "g\ud800#t", "\ude00\ud83d", "g\U0001f600#t"} <= keys
    assert {(f, n) for f, n, _, _ in VECTORS["positions"]} >= {(20, 32), (20, 64), (10, 32), (5, 128)}


def test_sizing_matches_java() -> None:
    got = [[f, n, BloomFilter(f, n).k, BloomFilter(f, n).m] for f, n, _, _ in VECTORS["sizing"]]
    assert got == VECTORS["sizing"]


def test_first_hash_word_matches_guava() -> None:
    for key, hash64 in VECTORS["hash64"]:
        data = key.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "surrogatepass")
        assert mmh3.hash64(data.encode("utf-8", "replace"), 0, signed=True)[0] == hash64, ascii(key)


PARAMETERS = sorted({(f, n) for f, n, _, _ in VECTORS["positions"]})


@pytest.mark.parametrize(("f", "n"), PARAMETERS)
def test_bit_positions_match_java(f: int, n: int) -> None:
    bloom = BloomFilter(f, n)
    rows = [(key, positions) for f2, n2, key, positions in VECTORS["positions"] if (f2, n2) == (f, n)]
    assert len(rows) == len(VECTORS["hash64"])
    for key, positions in rows:
        assert bloom.bit_positions(key) == positions, ascii(key)
        # Java sees UTF-16 units: a pair spelled as two surrogate code points is the same string
        assert bloom.bit_positions(_split_pairs(key)) == positions, ascii(key)
