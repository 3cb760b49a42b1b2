"""One property's column in a batch: the per-batch cache of its parses, views and dictionary.

Owns :class:`_Column`, which computes each kernel of :mod:`.kernels` and the string views of
:mod:`._string_views` at most once per batch, whichever nodes ask, and dictionary-encodes a
low-cardinality column on demand.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from siftmq.filter.backends.arrow._string_views import StringViews
from siftmq.filter.backends.arrow.kernels import (
    DICTIONARY_MAX_RATIO,
    DICTIONARY_MIN_ROWS,
    DICTIONARY_SAMPLE,
    ENCODE_MIN_COST,
    Mask,
    _dict_indices,
    _isin,
    _padded,
    _parse,
    _valid_mask,
)

# ----------------------------------------------------------------------------------------- columns


class _Column:
    """One string column of the batch; its parses, string views and dictionary are computed once."""

    def __init__(self, array: pa.Array, n: int) -> None:
        self.n = n
        self._source = array
        self._plain: pa.Array | None = None
        self._dictionary: pa.Array | None = None
        self._indices: npt.NDArray[np.intp] | None = None
        if pa.types.is_dictionary(array.type):
            self._dictionary = array.dictionary.cast(pa.string())
            self._indices = _dict_indices(array, self._dictionary)
            if self._dictionary.null_count:  # a row whose dictionary entry is null is null
                self.valid: Mask = self._indices != len(self._dictionary)
            else:
                self.valid = _valid_mask(array, n)
        else:
            self._plain = array.cast(pa.string()) if array.type != pa.string() else array
            self.valid = _valid_mask(array, n)
        self.has_nulls = not self.valid.all()
        self.all_null = not self.valid.any()
        self._cache: dict[str, tuple[npt.NDArray[Any], Mask]] = {}
        self._row_views: StringViews | None = None
        self._dictionary_views: StringViews | None = None
        self._low: bool | None = None

    def plain(self) -> pa.Array:
        """The column as a plain string array."""
        if self._plain is None:
            self._plain = self._source.cast(pa.string())
        return self._plain

    def encoded(self) -> tuple[pa.Array, npt.NDArray[np.intp]]:
        """Distinct values (a string array) and each row's index into them (null rows: one past the end)."""
        if self._dictionary is None or self._indices is None:
            encoded = pc.dictionary_encode(self.plain())
            self._dictionary = encoded.dictionary
            self._indices = _dict_indices(encoded, encoded.dictionary)
        return self._dictionary, self._indices

    def _to_rows(self, per_value: npt.NDArray[Any]) -> npt.NDArray[Any]:
        """Per-distinct-value results (as from :meth:`encoded`) mapped to the rows (null rows: zero)."""
        _, indices = self.encoded()
        result: npt.NDArray[Any] = _padded(per_value)[indices]
        return result

    def low_cardinality(self) -> bool:
        if self._low is None:
            sample = self.plain().slice(0, DICTIONARY_SAMPLE)
            distinct = pc.count_distinct(sample, mode="all").as_py()
            self._low = bool(distinct <= DICTIONARY_MAX_RATIO * len(sample))
        return self._low

    def prefers_dictionary(self, cost: int) -> bool:
        """Whether a one-column sub-tree of this cost is best evaluated once per distinct value."""
        if self.all_null:
            return False
        if self._dictionary is not None:
            return 2 * (len(self._dictionary) + 1) <= self.n
        return cost >= ENCODE_MIN_COST and self.n >= DICTIONARY_MIN_ROWS and self.low_cardinality()

    def equals(self, text: str) -> Mask:
        """Rows holding exactly ``text`` (never a null row)."""
        if self.all_null:
            return np.zeros(self.n, dtype=np.bool_)
        if self._dictionary is not None:
            return self._to_rows(self._views_of_dictionary().equal(text))
        hit = self._views_of_rows().equal(text)
        return hit & self.valid if self.has_nulls else hit

    def isin(self, texts: frozenset[str]) -> Mask:
        """Rows holding one of ``texts`` (never a null row)."""
        if self.all_null:
            return np.zeros(self.n, dtype=np.bool_)
        if self._dictionary is not None:
            return self._to_rows(_isin(self._views_of_dictionary(), self._dictionary, texts))
        hit = _isin(self._views_of_rows(), self.plain(), texts)
        return hit & self.valid if self.has_nulls else hit

    # a plain column can be dictionary-encoded midway (to parse it): from then on the dictionary's
    # views are used, so the two are cached apart
    def _views_of_rows(self) -> StringViews:
        if self._row_views is None:
            self._row_views = StringViews(self.plain())
        return self._row_views

    def _views_of_dictionary(self) -> StringViews:
        if self._dictionary_views is None:
            dictionary, _ = self.encoded()
            self._dictionary_views = StringViews(dictionary)
        return self._dictionary_views

    def parsed(self, how: str) -> tuple[npt.NDArray[Any], Mask]:
        """``(values, error)`` per row for ``how``: int, long, double or boolean (no error on null rows)."""
        hit = self._cache.get(how)
        if hit is None:
            if self._dictionary is not None or (self.n >= DICTIONARY_MIN_ROWS and self.low_cardinality()):
                dictionary, _ = self.encoded()
                values, errors = _parse(dictionary, how)
                hit = (self._to_rows(values), self._to_rows(errors))
            else:
                hit = _parse(self.plain(), how)
            self._cache[how] = hit
        return hit
