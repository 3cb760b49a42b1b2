"""Column kernels: RocketMQ's Java conversions over a whole Arrow string column.

Owns the thresholds that pick a strategy (``DICTIONARY_*``, ``ENCODE_MIN_COST``, ``VIEW_IN_MAX``)
and the kernels: ``Boolean.valueOf``; ``Integer.valueOf``/``Long.valueOf`` (Arrow's cast where it
agrees with Java, regex checks, and exact row-by-row decisions by :mod:`siftmq.filter.javalang`
for the rest); ``Double.valueOf`` (its grammar built from :mod:`siftmq.filter.javalang`) as
total-order ``Double.compare`` keys; and the small array helpers they share (validity masks,
dictionary indices, ``IN`` on string views).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from siftmq.filter import javalang
from siftmq.filter.backends.arrow._string_views import StringViews
from siftmq.filter.javalang import INT_MAX, INT_MIN, LONG_MAX, LONG_MIN

Mask = npt.NDArray[np.bool_]

DICTIONARY_MIN_ROWS: Final = 2048
DICTIONARY_SAMPLE: Final = 1024
DICTIONARY_MAX_RATIO: Final = 0.3
# A one-column sub-tree whose predicates cost at least this much is evaluated on the dictionary of
# a plain low-cardinality column, encoding it first (see _own_cost).
ENCODE_MIN_COST: Final = 6
_MATCH_COST: Final = 4
# constants up to this many are tested with word compares; longer IN lists use Arrow's is_in
VIEW_IN_MAX: Final = 16

_INTEGRAL_RE: Final = r"^[+-]?[0-9]{1,18}$"
_DECIMAL_RE: Final = (
    f"^[+-]?(?:{javalang.DOUBLE_SPECIAL}|{javalang.DOUBLE_DECIMAL}{javalang.DOUBLE_SUFFIX}?)$"
)
_HEX_RE: Final = r"^[+-]?0[xX]"
_CANONICAL_NAN_KEY: Final = 0x7FF8000000000000


def _double_keys(values: npt.NDArray[np.float64]) -> npt.NDArray[np.int64]:
    """Integers ordered exactly as ``Double.compare`` orders the doubles."""
    bits = values.view(np.int64)
    keys = np.where(bits < 0, bits ^ np.int64(0x7FFFFFFFFFFFFFFF), bits)
    keys[np.isnan(values)] = _CANONICAL_NAN_KEY
    return keys


def _double_key(value: float) -> int:
    return int(_double_keys(np.array([value], dtype=np.float64))[0])


def _sign(a: npt.NDArray[Any], b: Any) -> npt.NDArray[np.int8]:
    sign: npt.NDArray[np.int8] = (a > b).astype(np.int8) - (a < b).astype(np.int8)
    return sign


def _isin(views: StringViews, array: pa.Array, texts: frozenset[str]) -> Mask:
    if len(texts) <= VIEW_IN_MAX:
        return views.isin(sorted(texts))
    encodable = []
    for text in texts:
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:  # a lone surrogate: no Arrow string can hold it
            continue
        encodable.append(text)
    return _bool_numpy(pc.is_in(array, value_set=pa.array(sorted(encodable), type=pa.string())))


def _dict_indices(array: pa.Array, dictionary: pa.Array) -> npt.NDArray[np.intp]:
    """Row indices into ``dictionary``; null rows and rows on a null entry point one past its end."""
    size = len(dictionary)
    indices = array.indices
    if indices.null_count:
        indices = pc.fill_null(indices.cast(pa.int64()), size)
    result = np.asarray(indices.to_numpy(zero_copy_only=False), dtype=np.intp)
    if dictionary.null_count:
        entry_valid = _padded(_bool_numpy(dictionary.is_valid()))
        result = np.where(entry_valid[result], result, size)
    return result


def _valid_mask(array: pa.Array, n: int) -> Mask:
    if array.null_count == 0:
        return np.ones(n, dtype=np.bool_)
    return np.asarray(array.is_valid().to_numpy(zero_copy_only=False), dtype=np.bool_)


def _bool_numpy(array: pa.Array) -> Mask:
    if array.null_count:
        array = pc.fill_null(array, False)
    return np.asarray(array.to_numpy(zero_copy_only=False), dtype=np.bool_)


def _padded(values: npt.NDArray[Any]) -> npt.NDArray[Any]:
    """Append one zero slot (for null rows of a dictionary column)."""
    return np.concatenate([values, np.zeros(1, dtype=values.dtype)])


def _has_letter_x(array: pa.Array) -> bool:
    """Whether any byte of the array's string data (null slots included) is ``x`` or ``X``."""
    if array.type != pa.string():
        return True
    buffers = array.buffers()
    if len(buffers) < 3 or buffers[2] is None or len(array) == 0:
        return False
    offsets = np.frombuffer(buffers[1], dtype=np.int32, count=len(array) + 1, offset=array.offset * 4)
    data = np.frombuffer(buffers[2], dtype=np.uint8)[offsets[0] : offsets[-1]]
    return bool(np.any((data | np.uint8(0x20)) == np.uint8(ord("x"))))


def _parse(array: pa.Array, how: str) -> tuple[npt.NDArray[Any], Mask]:
    if how == "boolean":
        return _parse_boolean(array), np.zeros(len(array), dtype=np.bool_)
    if how == "double":
        return _parse_double_keys(array)
    lo, hi = (INT_MIN, INT_MAX) if how == "int" else (LONG_MIN, LONG_MAX)
    return _parse_integral(array, lo, hi)


def _parse_boolean(array: pa.Array) -> Mask:
    return _bool_numpy(pc.equal(pc.ascii_lower(array), "true"))


def _exact_rows(
    array: pa.Array,
    rows: npt.NDArray[np.intp],
    parse: Callable[[str], Any],
    values: npt.NDArray[Any],
    errors: Mask,
) -> None:
    """Decide ``rows`` one by one with the scalar (exact) parser."""
    texts = array.take(pa.array(rows, type=pa.int64())).to_pylist()
    for row, text in zip(rows.tolist(), texts, strict=True):
        try:
            values[row] = parse(text)
            errors[row] = False
        except javalang.JavaEvaluationError:
            errors[row] = True


def _numpy_filled(array: pa.Array, fill: Any, dtype: type[np.generic]) -> npt.NDArray[Any]:
    """The array as numpy, nulls replaced by ``fill`` (read-only when Arrow's buffer is shared)."""
    if array.null_count:
        array = pc.fill_null(array, fill)
    return np.asarray(array.to_numpy(zero_copy_only=False), dtype=dtype)


def _out_of_range(values: npt.NDArray[np.int64], valid: Mask, lo: int, hi: int) -> Mask:
    if lo <= LONG_MIN and hi >= LONG_MAX:
        return np.zeros(len(values), dtype=np.bool_)
    if len(values) == 0 or (lo <= int(values.min()) and int(values.max()) <= hi):
        return np.zeros(len(values), dtype=np.bool_)
    result: Mask = valid & ((values < lo) | (values > hi))
    return result


def _parse_integral(array: pa.Array, lo: int, hi: int) -> tuple[npt.NDArray[np.int64], Mask]:
    n = len(array)
    valid = _valid_mask(array, n)
    parse = javalang.parse_int if hi == INT_MAX else javalang.parse_long
    try:
        # Fast path: Arrow accepts "-?[0-9]+" in int64 range — a subset of what Java accepts, with the
        # same values — and also "0x…" hex, which Java rejects: those rows are decided exactly.
        cast = pc.cast(array, pa.int64())
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        cast = None
    if cast is not None:
        values = _numpy_filled(cast, 0, np.int64)
        errors = _out_of_range(values, valid, lo, hi)
        if _has_letter_x(array):
            hex_rows = np.flatnonzero(valid & _bool_numpy(pc.match_substring(array, "x", ignore_case=True)))
            if hex_rows.size:
                values = values.copy()
                _exact_rows(array, hex_rows, parse, values, errors)
        return values, errors
    simple = _bool_numpy(pc.match_substring_regex(array, _INTEGRAL_RE))
    cleaned = pc.if_else(pa.array(simple), pc.replace_substring_regex(array, r"^\+", ""), "0")
    values = np.array(pc.cast(cleaned, pa.int64()).to_numpy(zero_copy_only=False), dtype=np.int64)
    errors = valid & ~simple
    errors |= simple & ((values < lo) | (values > hi))
    # rows the regex cannot decide: non-ASCII text (Java accepts any Unicode digit), 19+ digits
    ascii_ok = _bool_numpy(pc.string_is_ascii(array))
    long_digits = _bool_numpy(pc.match_substring_regex(array, r"^[+-]?[0-9]{19,}$"))
    undecided = np.flatnonzero(valid & (~ascii_ok | long_digits))
    if undecided.size:
        _exact_rows(array, undecided, parse, values, errors)
    return values, errors


def _parse_double_keys(array: pa.Array) -> tuple[npt.NDArray[np.int64], Mask]:
    n = len(array)
    valid = _valid_mask(array, n)
    exact = lambda s: _double_key(javalang.parse_double(s))  # noqa: E731
    try:
        # Fast path: every string Arrow parses to a finite double, Java parses to the same double;
        # Arrow also accepts "inf", "nan" and friends, which Java may reject: decided exactly.
        cast = pc.cast(array, pa.float64())
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        cast = None
    if cast is not None:
        doubles = _numpy_filled(cast, 0.0, np.float64)
        keys = _double_keys(doubles)
        errors = np.zeros(n, dtype=np.bool_)
        special = np.flatnonzero(valid & ~np.isfinite(doubles))
        if special.size:
            _exact_rows(array, special, exact, keys, errors)
        return keys, errors
    trimmed = pc.utf8_trim(array, characters=javalang.JAVA_TRIM)
    decimal = _bool_numpy(pc.match_substring_regex(trimmed, _DECIMAL_RE))
    cleaned = pc.if_else(pa.array(decimal), pc.replace_substring_regex(trimmed, "[fFdD]$", ""), "0")
    doubles = np.array(pc.cast(cleaned, pa.float64()).to_numpy(zero_copy_only=False), dtype=np.float64)
    keys = _double_keys(doubles)
    errors = valid & ~decimal
    hex_rows = np.flatnonzero(valid & _bool_numpy(pc.match_substring_regex(trimmed, _HEX_RE)))
    if hex_rows.size:
        _exact_rows(array, hex_rows, exact, keys, errors)
    return keys, errors
