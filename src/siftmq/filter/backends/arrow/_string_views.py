"""Equality of a string column with constant strings, read from Arrow's string-view layout.

Casting a ``string`` array to ``string_view`` gives one 16-byte view per row: the length (int32),
then the string itself when it has at most 12 bytes, or its first 4 bytes and a reference to the
data when it is longer. Read as two little-endian 64-bit words per row, ``head`` holds the length
and bytes 0..3, ``tail`` bytes 4..11 of an inline string. Comparing one or two words per row with
the words of a constant decides equality for constants of up to 12 bytes (the bytes past a
string's end are masked off, never assumed to be zero) and narrows the candidates for longer
ones. This is several times faster than Arrow's ``equal`` kernel on string columns.

Null rows are not special-cased: callers mask the result with the column's validity.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

Mask = npt.NDArray[np.bool_]

INLINE_BYTES: Final = 12
# beyond this share of candidate rows, a long constant is compared with Arrow's kernel on all rows
_MAX_CANDIDATE_SHARE: Final = 0.125


def _low_bytes(count: int) -> np.uint64:
    return np.uint64((1 << (8 * count)) - 1)


def _word(data: bytes) -> np.uint64:
    return np.uint64(int.from_bytes(data.ljust(8, b"\0"), "little"))


class StringViews:
    """The view words of one plain ``string`` array, for repeated equality tests."""

    __slots__ = ("_array", "_head", "_tail")

    def __init__(self, array: pa.Array) -> None:
        views = array.cast(pa.string_view())
        n = len(views)
        words = np.frombuffer(views.buffers()[1], dtype="<u8", count=2 * n, offset=views.offset * 16)
        self._array = array
        self._head = words[0::2]
        self._tail = words[1::2]

    def equal(self, text: str) -> Mask:
        """Rows whose value is ``text`` (null rows: unspecified)."""
        try:
            value = text.encode("utf-8")
        except UnicodeEncodeError:  # a lone surrogate: no Arrow string can hold it
            return np.zeros(len(self._head), dtype=np.bool_)
        size = len(value)
        head_key = np.uint64(size) | (_word(value[:4]) << np.uint64(32))
        head = self._head & _low_bytes(4 + size) if size < 4 else self._head
        hit: Mask = head == head_key
        if size <= 4:
            return hit
        if size <= INLINE_BYTES:
            tail = self._tail if size == INLINE_BYTES else self._tail & _low_bytes(size - 4)
            hit &= tail == _word(value[4:])
            return hit
        # longer than the inline part: the length and first 4 bytes only select the candidates
        rows = np.flatnonzero(hit)
        if rows.size > _MAX_CANDIDATE_SHARE * len(hit):
            return _bool_numpy(pc.equal(self._array, pa.scalar(text, pa.string())))
        if rows.size:
            candidates = self._array.take(pa.array(rows, type=pa.int64()))
            hit[rows] = _bool_numpy(pc.equal(candidates, pa.scalar(text, pa.string())))
        return hit

    def isin(self, texts: Iterable[str]) -> Mask:
        """Rows whose value is one of ``texts`` (null rows: unspecified)."""
        hit = np.zeros(len(self._head), dtype=np.bool_)
        for text in texts:
            hit |= self.equal(text)
        return hit


def _bool_numpy(array: pa.Array) -> Mask:
    if array.null_count:
        array = pc.fill_null(array, False)
    return np.asarray(array.to_numpy(zero_copy_only=False), dtype=np.bool_)
