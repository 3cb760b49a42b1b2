"""Java value semantics that RocketMQ's evaluator relies on, reproduced exactly.

Values are plain Python objects typed as Java would type them:

* ``bool`` → Boolean; ``float`` → Double; ``str`` → String;
* ``int`` → Integer when it fits in 32 bits, else Long; :class:`JavaLong` marks a Long whose value
  happens to fit 32 bits (it only arises by negating the literal ``2147483648``).

``compare`` is RocketMQ's ``ComparisonExpression.__compare`` with string conversion on; the parse
functions are ``Integer.valueOf``, ``Long.valueOf``, ``Double.valueOf`` and ``Boolean.valueOf``.
Failures raise :class:`JavaEvaluationError`, which the evaluators surface as
:class:`~siftmq.errors.FilterEvaluationError`.
"""

from __future__ import annotations

import enum
import math
import re
import unicodedata
from collections.abc import Callable, Iterable
from typing import Any, Final, cast

from siftmq.errors import FilterEvaluationError

INT_MIN: Final = -(2**31)
INT_MAX: Final = 2**31 - 1
LONG_MIN: Final = -(2**63)
LONG_MAX: Final = 2**63 - 1
DOUBLE_MAX_VALUE: Final = 1.7976931348623157e308


class JType(enum.Enum):
    INTEGER = "Integer"
    LONG = "Long"
    DOUBLE = "Double"
    STRING = "String"
    BOOLEAN = "Boolean"


class JavaLong(int):
    """An int that Java types as Long although its value fits 32 bits."""

    __slots__ = ()


class JavaEvaluationError(FilterEvaluationError):
    """Evaluation threw where Java throws (NumberFormatException, ClassCastException)."""


def java_type(value: object) -> JType:
    """The Java class RocketMQ would see for a Python value (``None`` is not accepted)."""
    t = type(value)
    if t is str:
        return JType.STRING
    if t is bool:
        return JType.BOOLEAN
    if t is float:
        return JType.DOUBLE
    if t is int:
        v: int = value  # type: ignore[assignment]
        if INT_MIN <= v <= INT_MAX:
            return JType.INTEGER
        if LONG_MIN <= v <= LONG_MAX:
            return JType.LONG
        raise JavaEvaluationError(f"integer {v} is outside Java's Long range")
    if t is JavaLong:
        return JType.LONG
    raise JavaEvaluationError(f"unsupported property value type {t.__name__}: use str, int, float or bool")


# ------------------------------------------------------------------------------------------- parsing


def typed_key(value: object) -> object:
    """A hashable key equal only for values Java tells apart. Python's ``==`` (and so a dict or an
    ``lru_cache``) merges ``True``, ``1`` and ``1.0``, an Integer and a :class:`JavaLong`, ``0.0``
    and ``-0.0``, and never finds NaN: a cache keyed by such values would hand one constant
    another's result. Tuples are keyed element by element."""
    kind = type(value)
    if kind is float:
        return (float, cast(float, value).hex())  # "-0x0.0p+0" differs from "0x0.0p+0"; NaN is "nan"
    if kind is tuple:
        return (tuple, tuple(typed_key(v) for v in cast(tuple[object, ...], value)))
    return (kind, value)


def _nfe(text: str) -> JavaEvaluationError:
    return JavaEvaluationError(f'NumberFormatException: For input string: "{text}"')


def _parse_integral(text: str, lo: int, hi: int) -> int:
    # Integer.parseInt/Long.parseLong: optional sign, then one or more decimal digits (any Unicode
    # Nd digit in the BMP, as Character.digit accepts), no whitespace, no underscores.
    n = len(text)
    if n == 0:
        raise _nfe(text)
    i = 1 if text[0] in "+-" else 0
    if i == n:
        raise _nfe(text)
    if text.isascii():
        if not text[i:].isdigit():
            raise _nfe(text)
    else:
        for ch in text[i:]:
            if not ch.isdecimal() or ord(ch) > 0xFFFF:
                raise _nfe(text)
    digits = text[i:]
    if len(digits) > _LONG_DIGITS:  # int() refuses 4,300 digits and more: what is past a long goes first
        digits = _significant(digits)
        if len(digits) > _LONG_DIGITS:
            raise _nfe(text)
    value = int(digits or "0")
    if text[0] == "-":
        value = -value
    if value < lo or value > hi:
        raise _nfe(text)
    return value


#: Digits of the largest long (9,223,372,036,854,775,807).
_LONG_DIGITS: Final = 19


def _significant(digits: str) -> str:
    """Decimal digits (any script's) without their leading zeros."""
    k = 0
    while k < len(digits) and unicodedata.decimal(digits[k]) == 0:
        k += 1
    return digits[k:]


class _Failed:
    """A cached parse failure (a fresh exception is raised each time: tracebacks must not pile up)."""

    __slots__ = ("message",)

    def __init__(self, message: str) -> None:
        self.message = message


_INT_CACHE: dict[str, int | _Failed] = {}
_LONG_CACHE: dict[str, int | _Failed] = {}
_DOUBLE_CACHE: dict[str, float | _Failed] = {}
_CACHE_LIMIT: Final = 8192


def _cached(cache: dict[str, Any], text: str, parse: Callable[[str], Any]) -> Any:
    """``parse(text)`` through a bounded cache that remembers failures as well as values."""
    hit = cache.get(text)
    if hit is None:
        try:
            hit = parse(text)
        except JavaEvaluationError as exc:
            hit = _Failed(exc.message)
        if len(cache) >= _CACHE_LIMIT:
            cache.clear()
        cache[text] = hit
    if type(hit) is _Failed:
        raise JavaEvaluationError(hit.message)
    return hit


def parse_int(text: str) -> int:
    """``Integer.valueOf(String)``."""
    hit = _INT_CACHE.get(text)
    if type(hit) is int:  # the hot path: one dict lookup
        return hit
    value: int = _cached(_INT_CACHE, text, lambda t: _parse_integral(t, INT_MIN, INT_MAX))
    return value


def parse_long(text: str) -> int:
    """``Long.valueOf(String)``; the result is typed Long."""
    hit = _LONG_CACHE.get(text)
    if type(hit) is JavaLong:
        return hit
    value: int = _cached(_LONG_CACHE, text, lambda t: JavaLong(_parse_integral(t, LONG_MIN, LONG_MAX)))
    return value


# Java's String.trim: it strips every char <= U+0020 (not Unicode whitespace) from both ends.
JAVA_TRIM: Final = "".join(chr(c) for c in range(0x21))

# Java's FloatingDecimal.readJavaFormatString, after trimming JAVA_TRIM. ASCII digits only. The
# pieces are written so that Python's re, RE2 (Arrow) and java.util.regex (Spark) read them alike
# (``[.]`` for a dot, no backslashes): the backends build their own anchored patterns from them.
DOUBLE_SPECIAL: Final = "NaN|Infinity"
"""The named values (after an optional sign)."""
DOUBLE_DECIMAL: Final = "(?:[0-9]+(?:[.][0-9]*)?|[.][0-9]+)(?:[eE][+-]?[0-9]+)?"
"""A decimal number without sign or ``[fFdD]`` suffix. One way to match each text: with two
(``[0-9]+[.]?[0-9]*``) a backtracking engine tried every split of a long run of digits that then
failed to match, seconds for a 12,000-digit property holding the GIL."""
DOUBLE_HEX: Final = "0[xX](?:[0-9a-fA-F]+[.]?|[0-9a-fA-F]*[.][0-9a-fA-F]+)[pP][+-]?[0-9]+"
"""A hexadecimal float without sign or ``[fFdD]`` suffix."""
DOUBLE_SUFFIX: Final = "[fFdD]"

_JAVA_DECIMAL: Final = re.compile(
    rf"[+-]?(?:(?P<special>{DOUBLE_SPECIAL})|(?P<num>{DOUBLE_DECIMAL}){DOUBLE_SUFFIX}?)"
)
_JAVA_HEX: Final = re.compile(rf"(?P<num>[+-]?{DOUBLE_HEX}){DOUBLE_SUFFIX}?")


def _parse_double(text: str) -> float:
    s = text.strip(JAVA_TRIM)
    m = _JAVA_DECIMAL.fullmatch(s)
    if m is not None:
        negative = s[0] == "-"
        special = m.group("special")
        if special == "NaN":
            return math.nan
        if special == "Infinity":
            return -math.inf if negative else math.inf
        value = float(m.group("num"))
        return -value if negative else value
    m = _JAVA_HEX.fullmatch(s)
    if m is not None:
        try:
            return float.fromhex(m.group("num"))
        except OverflowError:
            return -math.inf if s[0] == "-" else math.inf
    raise _nfe(text)


def parse_double(text: str) -> float:
    """``Double.valueOf(String)``."""
    hit = _DOUBLE_CACHE.get(text)
    if type(hit) is float:
        return hit
    value: float = _cached(_DOUBLE_CACHE, text, _parse_double)
    return value


def parse_boolean(text: str) -> bool:
    """``Boolean.valueOf(String)``: true only for "true" in any case (no other Unicode case folds to it)."""
    return len(text) == 4 and text.isascii() and text.lower() == "true"


# ----------------------------------------------------------------------------------------- comparing


def double_compare(a: float, b: float) -> int:
    """``Double.compare``: a total order where -0.0 < 0.0 and NaN is above everything, equal to itself."""
    if a < b:
        return -1
    if a > b:
        return 1
    a_nan = math.isnan(a)
    b_nan = math.isnan(b)
    if a_nan or b_nan:
        return int(a_nan) - int(b_nan)
    if a == 0.0:
        sa = math.copysign(1.0, a)
        sb = math.copysign(1.0, b)
        return (sa > sb) - (sa < sb)
    return 0


def _cmp(a: int | str | bool, b: int | str | bool) -> int:
    return (a > b) - (a < b)  # type: ignore[operator]


def _class_cast(left: object, right: object) -> JavaEvaluationError:
    return JavaEvaluationError(
        f"ClassCastException: {java_type(left).value} cannot be compared with {java_type(right).value}"
    )


def compare(lv: object, rv: object) -> int:
    """RocketMQ's ``__compare(lv, rv, true)``: the coercing comparison of two non-null values."""
    lt = java_type(lv)
    rt = java_type(rv)
    if lt is rt:
        if lt is JType.DOUBLE:
            return double_compare(lv, rv)  # type: ignore[arg-type]
        return _cmp(lv, rv)  # type: ignore[arg-type]
    if lt is JType.BOOLEAN:
        if rt is JType.STRING:
            # lv = Boolean.valueOf((String) lv) casts a Boolean to String: ClassCastException
            raise _class_cast(lv, rv)
        return -1
    if lt is JType.INTEGER:
        if rt is JType.LONG:
            return _cmp(lv, rv)  # type: ignore[arg-type]
        if rt is JType.DOUBLE:
            return double_compare(float(lv), rv)  # type: ignore[arg-type]
        if rt is JType.STRING:
            return _cmp(lv, parse_int(rv))  # type: ignore[arg-type]
        return -1
    if lt is JType.LONG:
        if rt is JType.INTEGER:
            return _cmp(lv, rv)  # type: ignore[arg-type]
        if rt is JType.DOUBLE:
            return double_compare(float(lv), rv)  # type: ignore[arg-type]
        if rt is JType.STRING:
            return _cmp(lv, parse_long(rv))  # type: ignore[arg-type]
        return -1
    if lt is JType.DOUBLE:
        if rt is JType.INTEGER or rt is JType.LONG:
            return double_compare(lv, float(rv))  # type: ignore[arg-type]
        if rt is JType.STRING:
            return double_compare(lv, parse_double(rv))  # type: ignore[arg-type]
        return -1
    # lt is STRING
    if rt is JType.BOOLEAN:
        return _cmp(parse_boolean(lv), rv)  # type: ignore[arg-type]
    if rt is JType.INTEGER:
        return _cmp(parse_int(lv), rv)  # type: ignore[arg-type]
    if rt is JType.LONG:
        return _cmp(parse_long(lv), rv)  # type: ignore[arg-type]
    return double_compare(parse_double(lv), rv)  # type: ignore[arg-type]


def relational_compare(lv: object, rv: object) -> int:
    """The comparator behind ``> >= < <=`` for two non-null values: two Strings compare as Doubles."""
    if type(lv) is str and type(rv) is str:
        try:
            return double_compare(parse_double(lv), parse_double(rv))
        except JavaEvaluationError:
            raise JavaEvaluationError(
                f"NumberFormatException: it is illegal to compare strings with '>', '>=', '<' or '<=' "
                f"unless both are numbers (lv={lv!r}, rv={rv!r})"
            ) from None
    return compare(lv, rv)


def equal(lv: object, rv: object) -> bool | None:
    """``=``: left null gives NULL, right null FALSE, both null TRUE, else the coercing compare."""
    if lv is None:
        return True if rv is None else None
    if rv is None:
        return False
    return compare(lv, rv) == 0


def negate(value: object) -> object:
    """Unary minus: numbers keep their Java type (32/64-bit wrap-around), anything else is NULL."""
    t = type(value)
    if t is int:
        v: int = value  # type: ignore[assignment]
        if INT_MIN <= v <= INT_MAX:
            r = -v
            return INT_MIN if r > INT_MAX else r
        r = -v
        return JavaLong(LONG_MIN) if r > LONG_MAX else (JavaLong(r) if INT_MIN <= r <= INT_MAX else r)
    if t is JavaLong:
        r = -int(value)  # type: ignore[call-overload]
        if r > LONG_MAX:
            r = LONG_MIN
        return JavaLong(r) if INT_MIN <= r <= INT_MAX else r
    if t is float:
        return -value  # type: ignore[operator]
    return None


# ------------------------------------------------------------------------------------------- logic


def and_all(values: Iterable[object]) -> bool | None:
    """RocketMQ's AND over operands evaluated left to right (``values`` is lazy: evaluation stops
    at the first FALSE, so a later operand that would throw is never evaluated); NULL is unknown."""
    unknown = False
    for value in values:
        if value is False:
            return False
        if value is None:
            unknown = True
    return None if unknown else True


def or_any(values: Iterable[object]) -> bool | None:
    """RocketMQ's OR, as :func:`and_all`: stops at the first TRUE; NULL is unknown."""
    unknown = False
    for value in values:
        if value is True:
            return True
        if value is None:
            unknown = True
    return None if unknown else False
