"""RocketMQ's Java conversions and comparisons, written as Spark expressions.

Owns the boolean/number/string literal helpers, ``Boolean.valueOf``, ``Integer.valueOf``/
``Long.valueOf`` (any BMP decimal digit, then ``try_cast``), ``Double.valueOf`` (trimmed with
:data:`~siftmq.filter.javalang.JAVA_TRIM`, checked against the grammar built from
:mod:`siftmq.filter.javalang`), and ``Double.compare`` orderings (-0.0 < 0.0 from the text's sign).
"""

from __future__ import annotations

import itertools
import unicodedata
from typing import Final

from siftmq.errors import UnsupportedFilterError
from siftmq.filter import javalang
from siftmq.filter.ast import (
    CmpOp,
)
from siftmq.filter.backends.spark.expressions import (
    _X,
    BACKEND,
    _Binary,
    _Call,
    _Case,
    _In,
    _Junction,
    _Lit,
    _Not,
    _TryCast,
)
from siftmq.filter.javalang import JType

# ------------------------------------------------------------------------------------ constants

_TRUE: Final = _Lit(True, "BOOLEAN")
_FALSE: Final = _Lit(False, "BOOLEAN")
_NULL: Final = _Lit(None, "BOOLEAN")

# Boolean.valueOf(String) is true for "true" in any mix of case and nothing else
_TRUE_SPELLINGS: Final = tuple(
    "".join(letters) for letters in itertools.product(*((c, c.upper()) for c in "true"))
)


def _decimal_digits() -> tuple[str, str, str]:
    """The non-ASCII decimal digits of the BMP (which ``Integer.valueOf`` accepts, as
    :func:`javalang.parse_int` does): as regex class ranges, and as ``translate`` tables."""
    digits = [chr(c) for c in range(0x80, 0x10000) if chr(c).isdecimal()]
    ranges: list[str] = []
    start = prev = digits[0]
    for ch in [*digits[1:], None]:
        if ch is not None and ord(ch) == ord(prev) + 1:
            prev = ch
            continue
        ranges.append(start if start == prev else f"{start}-{prev}")
        if ch is not None:
            start = prev = ch
    return "".join(ranges), "".join(digits), "".join(str(unicodedata.decimal(ch)) for ch in digits)


_UNICODE_DIGIT_RANGES, _UNICODE_DIGITS, _ASCII_OF_UNICODE_DIGITS = _decimal_digits()
# ``$`` would also match before a final line terminator: ``(?s)(?!.)`` is the true end of input.
_INTEGRAL_RE: Final = f"(?s)^[+-]?[0-9{_UNICODE_DIGIT_RANGES}]+(?!.)"
_DOUBLE_RE: Final = (
    f"(?s)^[+-]?(?:{javalang.DOUBLE_SPECIAL}"
    f"|{javalang.DOUBLE_DECIMAL}{javalang.DOUBLE_SUFFIX}?"
    f"|{javalang.DOUBLE_HEX}{javalang.DOUBLE_SUFFIX}?"
    ")(?!.)"
)


def _string(text: str) -> _Lit:
    return _Lit(text, "STRING")


def _int(value: int) -> _Lit:
    return _Lit(value, "INT")


def _number(value: object) -> _Lit:
    jtype = javalang.java_type(value)
    if jtype is JType.DOUBLE:
        return _Lit(value, "DOUBLE")
    assert isinstance(value, int)
    return _Lit(int(value), "INT" if jtype is JType.INTEGER else "BIGINT")  # a JavaLong as a plain int


def _user_string(text: str, what: str) -> str:
    """A string from the filter text, refused when Spark cannot hold it."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise UnsupportedFilterError(
            f"{what} {text!r} holds a lone surrogate, which no Spark string can hold", backend=BACKEND
        ) from None
    return text


def _is_true_text(s: _X) -> _X:
    """``Boolean.valueOf(s)`` of a non-null string."""
    return _In(s, _TRUE_SPELLINGS)


def _parse_integral(s: _X, jtype: JType) -> _X:
    """``Integer.valueOf(s)`` / ``Long.valueOf(s)``; NULL where Java throws (or s is NULL)."""
    digits = _Call("translate", (s, _string(_UNICODE_DIGITS), _string(_ASCII_OF_UNICODE_DIGITS)))
    cast = _TryCast(digits, "INT" if jtype is JType.INTEGER else "BIGINT")
    return _Case(((_Call("rlike", (s, _string(_INTEGRAL_RE))), cast),), None)


def _parse_double(s: _X) -> tuple[_X, _X]:
    """``Double.valueOf(s)`` (NULL where Java throws or s is NULL) and whether its text is negative
    (which tells -0.0 from 0.0: Spark's ``=`` and ``<`` do not)."""
    trimmed = _Call("btrim", (s, _string(javalang.JAVA_TRIM)))
    value = _Case(((_Call("rlike", (trimmed, _string(_DOUBLE_RE))), _TryCast(trimmed, "DOUBLE")),), None)
    return value, _Call("startswith", (trimmed, _string("-")))


_SQL_OP: Final = {CmpOp.GT: ">", CmpOp.GE: ">=", CmpOp.LT: "<", CmpOp.LE: "<="}


def _holds(op: CmpOp | None, sign: int) -> bool:
    """Whether a comparator result satisfies ``op`` (None is equality)."""
    return sign == 0 if op is None else op.holds(sign)


def _double_against(op: CmpOp | None, x: _X, negative: _X, const: float) -> _X:
    """``Double.compare(x, const)`` satisfies ``op`` (None: equality), for a non-null ``x``."""
    sql_op = "=" if op is None else _SQL_OP[op]
    plain = _Binary(sql_op, x, _Lit(const, "DOUBLE"))
    if const != 0.0:
        return plain  # Spark orders NaN as Double.compare does; only the two zeros differ
    when_negative = _holds(op, javalang.double_compare(-0.0, const))
    when_positive = _holds(op, javalang.double_compare(0.0, const))
    if when_negative == when_positive:
        tie: _X = _Lit(when_negative, "BOOLEAN")
    else:
        tie = negative if when_negative else _Not(negative)
    return _Case(((_Binary("=", x, _Lit(0.0, "DOUBLE")), tie),), plain)


def _double_between(op: CmpOp, x: _X, x_negative: _X, y: _X, y_negative: _X) -> _X:
    """``Double.compare(x, y)`` satisfies ``op``, for non-null ``x`` and ``y``."""
    both_zero = _Junction("AND", (_Binary("=", x, _Lit(0.0, "DOUBLE")), _Binary("=", y, _Lit(0.0, "DOUBLE"))))
    # at two zeros, order by sign: -0.0 < 0.0, and false < true
    tie = _Binary(_SQL_OP[op], _Not(x_negative), _Not(y_negative))
    return _Case(((both_zero, tie),), _Binary(_SQL_OP[op], x, y))
