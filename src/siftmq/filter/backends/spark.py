"""Spark backend: a compiled TAG or SQL92 filter as one Spark SQL boolean expression.

:func:`to_spark_column` gives a :class:`pyspark.sql.Column`, :func:`to_spark_sql` the same predicate
as Spark SQL text. Messages are rows; their properties are a ``map<string,string>`` column (the tag
is its ``TAGS`` key), and ``columns`` can name top-level string columns that hold some properties
instead. The predicate is TRUE exactly where :meth:`CompiledFilter.matches` is True and FALSE on
every other row: never NULL, and never an error under Spark's ANSI mode, whatever the values.

**Values.** Every property is a string or missing, so each sub-expression's kind is known before a
row is read: a property is a nullable string column, a sub-tree without properties is a constant
(folded here with RocketMQ's semantics), and everything else is a predicate.

**Errors.** Where RocketMQ throws (``a > 3`` with a="x"), the exception propagates: AND skips its
right side after FALSE, OR after TRUE, ``>`` skips its right side after a NULL left, and nothing
else catches. An error is not NULL — ``NOT (a > 3 AND b = 'y')`` with a="x", b="z" is an error,
though ``NOT (NULL AND FALSE)`` is TRUE — so a predicate has four outcomes, FALSE, NULL, TRUE and
ERROR. Spark has three, so the translation reasons about each predicate's *context*: which of its
outcomes its ancestors can still tell apart on the way to the only question that matters at the
top (TRUE or not). Where ERROR and NULL cannot be told apart (``a > 3`` at the top, or as any
operand of a top-level AND), the predicate is plain three-valued Spark SQL and a parse failure is
NULL. Elsewhere it is an integer code (1 FALSE, 2 NULL, 3 TRUE, 4 ERROR) and its parent looks the
result up in a small table (``element_at(array(...), code)``) computed here by running RocketMQ's
semantics on one representative value per outcome, so every operand is referenced once and the
expression grows linearly with the filter.

**Conversions.** A string meets a number as RocketMQ converts it, never with Spark's casts alone:
``Integer.valueOf``/``Long.valueOf`` is a regex (sign and decimal digits, any Unicode decimal digit
of the BMP, no whitespace) then ``try_cast`` (out of range is NULL, hence an error); ``Double.valueOf``
trims characters up to U+0020, checks Java's grammar (``NaN``, ``Infinity``, ``1.5d``, hex floats;
not ``inf``) and then ``try_cast``. Doubles compare as ``Double.compare``: Spark already orders NaN
above everything and equal to itself; -0.0 < 0.0 is decided from the sign of the text.

**Text.** Identifiers are quoted with backticks (doubled inside); string literals are quoted plainly
only when they hold no quote, backslash or non-printable character, and otherwise written as
``decode(X'<utf-8 hex>', 'UTF-8')`` — whatever a user's literal holds, it cannot change the structure
of the query, and the text does not depend on ``spark.sql.parser.escapedStringLiterals``.

Refused with :class:`~siftmq.errors.UnsupportedFilterError`: a string literal or tag holding a lone
surrogate (no Spark string can hold one), and a filter whose translation nests deeper than Spark's
parser and analyzer go (``MAX_NESTING`` levels, about 60 levels of NOT and AND over comparisons
that can fail; RocketMQ allows 512).
"""

from __future__ import annotations

import itertools
import math
import sys
import unicodedata
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from typing import Final, TypeAlias, TypeVar

from pyspark.sql import Column
from pyspark.sql import functions as F

from siftmq.errors import FilterEvaluationError, UnsupportedFilterError
from siftmq.filter import javalang
from siftmq.filter.ast import (
    And,
    BoolCast,
    CmpOp,
    Compare,
    Equal,
    In,
    IsNull,
    Literal,
    MatchOp,
    Negate,
    Node,
    Not,
    Or,
    Property,
    StringMatch,
)
from siftmq.filter.javalang import JType
from siftmq.filter.spec import TAGS_PROPERTY, FilterSpec
from siftmq.filter.visitor import ExprVisitor, postorder, visit

__all__ = ["MAX_NESTING", "SparkSqlTranslator", "to_spark_column", "to_spark_sql"]

BACKEND: Final = "spark"
R = TypeVar("R")
# Spark overflows its stack on deeply nested expressions: its SQL parser, and its conversion of a
# Column to an expression. The shapes this module writes went through both up to 264-300 levels
# (measured on Spark 4.3, JDK 17, by this module's own nesting count): keep a margin.
MAX_NESTING: Final = 200

# --------------------------------------------------------------------------------- Spark expressions
#
# A small expression tree, written once by the translator and rendered either as Spark SQL text or
# as a pyspark Column, so that both entry points give the same predicate.


@dataclass(frozen=True, slots=True)
class _Lit:
    value: object
    type: str  # BOOLEAN, INT, BIGINT, DOUBLE or STRING


@dataclass(frozen=True, slots=True)
class _Ref:
    """A top-level column: its name, or (Column API only) a Column."""

    source: object


@dataclass(frozen=True, slots=True)
class _Item:
    """``map[key]``: NULL when the key is missing or the map is NULL."""

    base: _Ref
    key: str


@dataclass(frozen=True, slots=True)
class _Call:
    name: str
    args: tuple[_X, ...]


@dataclass(frozen=True, slots=True)
class _Binary:
    op: str  # = < <= > >=
    left: _X
    right: _X


@dataclass(frozen=True, slots=True)
class _Junction:
    op: str  # AND, OR
    items: tuple[_X, ...]


@dataclass(frozen=True, slots=True)
class _Not:
    operand: _X


@dataclass(frozen=True, slots=True)
class _IsNull:
    operand: _X


@dataclass(frozen=True, slots=True)
class _Case:
    branches: tuple[tuple[_X, _X], ...]
    otherwise: _X | None


@dataclass(frozen=True, slots=True)
class _TryCast:
    operand: _X
    type: str


@dataclass(frozen=True, slots=True)
class _In:
    operand: _X
    values: tuple[str, ...]


_X: TypeAlias = _Lit | _Ref | _Item | _Call | _Binary | _Junction | _Not | _IsNull | _Case | _TryCast | _In


def _parts(x: _X) -> tuple[_X, ...]:
    """The sub-expressions of ``x``, in rendering order."""
    if isinstance(x, (_Lit, _Ref)):
        return ()
    if isinstance(x, _Item):
        return (x.base,)
    if isinstance(x, _Call):
        return x.args
    if isinstance(x, _Binary):
        return (x.left, x.right)
    if isinstance(x, _Junction):
        return x.items
    if isinstance(x, (_Not, _IsNull, _TryCast, _In)):
        return (x.operand,)
    parts = [p for branch in x.branches for p in branch]
    if x.otherwise is not None:
        parts.append(x.otherwise)
    return tuple(parts)


def _walk(root: _X, build: Callable[[_X, list[R]], R], direct: Callable[[_X], R | None] | None = None) -> R:
    """:func:`~siftmq.filter.visitor.postorder` over a translation (it shares sub-expressions)."""
    return postorder(root, _parts, build, direct=direct, shared=True)


def _quote_identifier(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def _sql_string(text: str) -> str:
    if all(ch.isprintable() and ch not in "'\\" for ch in text):
        return f"'{text}'"
    # Anything else as its UTF-8 bytes: no quote or escape in the user's text reaches the parser.
    return f"decode(X'{text.encode('utf-8').hex().upper()}', 'UTF-8')"


def _java_double_text(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "Infinity" if value > 0 else "-Infinity"
    return repr(value)


def _sql_literal(lit: _Lit) -> str:
    value = lit.value
    if value is None:
        return f"CAST(NULL AS {lit.type})"
    if lit.type == "BOOLEAN":
        return "true" if value else "false"
    if lit.type == "STRING":
        assert isinstance(value, str)
        return _sql_string(value)
    if lit.type == "DOUBLE":
        assert isinstance(value, float)
        if math.isfinite(value) and value != 0.0:
            return repr(value) + "D"
        return f"CAST('{_java_double_text(value)}' AS DOUBLE)"
    assert isinstance(value, int)
    return f"{value}L" if lit.type == "BIGINT" else str(value)


def _sql_node(x: _X, args: list[str]) -> str:
    if isinstance(x, _Lit):
        return _sql_literal(x)
    if isinstance(x, _Ref):
        if not isinstance(x.source, str):
            raise TypeError(f"to_spark_sql needs column names, got {type(x.source).__name__}")
        return _quote_identifier(x.source)
    if isinstance(x, _Item):
        return f"{args[0]}[{_sql_string(x.key)}]"
    if isinstance(x, _Call):
        return f"{x.name}({', '.join(args)})"
    if isinstance(x, _Binary):
        return f"({args[0]} {x.op} {args[1]})"
    if isinstance(x, _Junction):
        return "(" + f" {x.op} ".join(args) + ")"
    if isinstance(x, _Not):
        return f"(NOT {args[0]})"
    if isinstance(x, _IsNull):
        return f"({args[0]} IS NULL)"
    if isinstance(x, _TryCast):
        return f"try_cast({args[0]} AS {x.type})"
    if isinstance(x, _In):
        return f"({args[0]} IN ({', '.join(_sql_string(v) for v in x.values)}))"
    text = "CASE"
    for i in range(len(x.branches)):
        text += f" WHEN {args[2 * i]} THEN {args[2 * i + 1]}"
    if x.otherwise is not None:
        text += f" ELSE {args[-1]}"
    return text + " END"


def _depth(root: _X) -> int:
    deepest = 0
    stack = [(root, 1)]
    while stack:
        x, depth = stack.pop()
        deepest = max(deepest, depth)
        stack.extend((p, depth + 1) for p in _parts(x))
    return deepest


def _column_tree(root: _X) -> Column:
    """The expression as a Column. Parts that read no Column object are parsed from their SQL text
    in one call (building them node by node costs a py4j round trip per node)."""
    reads_column: dict[int, bool] = {}

    def mark(x: _X, parts: list[bool]) -> bool:
        result = any(parts) or (isinstance(x, _Ref) and not isinstance(x.source, str))
        reads_column[id(x)] = result
        return result

    _walk(root, mark)

    def as_text(x: _X) -> Column | None:
        if reads_column[id(x)]:
            return None
        return F.expr(_walk(x, _sql_node))

    return _walk(root, _column_node, as_text)


_COMPARE: Final[dict[str, Callable[[Column, Column], Column]]] = {
    "=": lambda a, b: a == b,
    "<": lambda a, b: a < b,
    "<=": lambda a, b: a <= b,
    ">": lambda a, b: a > b,
    ">=": lambda a, b: a >= b,
}


def _balanced(items: Sequence[Column], conjunction: bool) -> Column:
    """``a AND b AND ...`` as a balanced tree (three-valued AND and OR are associative): a chain of
    500 would overflow the stack of Spark's analyzer, as Spark's own SQL parser knows."""
    level = list(items)
    while len(level) > 1:
        pairs = [
            (level[i] & level[i + 1]) if conjunction else (level[i] | level[i + 1])
            for i in range(0, len(level) - 1, 2)
        ]
        if len(level) % 2:
            pairs.append(level[-1])
        level = pairs
    return level[0]


def _column_node(x: _X, args: list[Column]) -> Column:
    if isinstance(x, _Lit):
        if x.value is None or x.type == "BIGINT":
            return F.lit(x.value).cast(x.type.lower())
        return F.lit(x.value)
    if isinstance(x, _Ref):
        source = x.source
        if isinstance(source, str):
            return F.col(_quote_identifier(source))
        if isinstance(source, Column):
            return source
        raise TypeError(f"a column must be a name or a pyspark Column, got {type(source).__name__}")
    if isinstance(x, _Item):
        return args[0].getItem(x.key)
    if isinstance(x, _Call):
        return F.call_function(x.name, *args)
    if isinstance(x, _Binary):
        return _COMPARE[x.op](args[0], args[1])
    if isinstance(x, _Junction):
        return _balanced(args, x.op == "AND")
    if isinstance(x, _Not):
        return ~args[0]
    if isinstance(x, _IsNull):
        return args[0].isNull()
    if isinstance(x, _TryCast):
        return args[0].try_cast(x.type.lower())
    if isinstance(x, _In):
        return args[0].isin(list(x.values))
    result = F.when(args[0], args[1])
    for i in range(1, len(x.branches)):
        result = result.when(args[2 * i], args[2 * i + 1])
    if x.otherwise is not None:
        result = result.otherwise(args[-1])
    return result


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
_MIRRORED: Final = {CmpOp.GT: CmpOp.LT, CmpOp.GE: CmpOp.LE, CmpOp.LT: CmpOp.GT, CmpOp.LE: CmpOp.GE}


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


# ---------------------------------------------------------------------------------------- semantics
#
# RocketMQ's evaluation of each node kind over its operands, given as thunks: calling one returns the
# operand's value or raises where RocketMQ throws. Used to fold constants, to compute each
# predicate's context, and to fill lookup tables.

Thunk: TypeAlias = Callable[[], object]
Semantics: TypeAlias = Callable[..., object]

_F, _N, _T, _E = 0, 1, 2, 3  # the outcomes of a predicate; a Spark code is the outcome + 1
Context: TypeAlias = tuple[int, ...]  # outcome -> class; outcomes in one class need not be told apart
_ROOT: Final[Context] = (0, 0, 1, 0)  # at the top only TRUE matters


class _Raises:
    """The representative of an operand whose evaluation throws."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "<raises>"


_RAISES: Final = _Raises()
_PREDICATE_VALUES: Final[tuple[object, ...]] = (False, None, True, _RAISES)  # indexed by outcome
# a string operand of a lookup table: null, Boolean.valueOf true, anything else
_STRING_VALUES: Final[tuple[object, ...]] = (None, "true", "x")


def _thunk(value: object) -> Thunk:
    if value is _RAISES:

        def raises() -> object:
            raise javalang.JavaEvaluationError("an operand threw")

        return raises
    return lambda: value


def _outcome(semantics: Semantics, values: Sequence[object]) -> int:
    try:
        result = semantics(*(_thunk(v) for v in values))
    except FilterEvaluationError:
        return _E
    if result is None:
        return _N
    if result is True:
        return _T
    if result is False:
        return _F
    raise AssertionError(f"a predicate evaluated to {result!r}")


def _sem_not(operand: Thunk) -> object:
    value = operand()
    return None if value is None else not value


def _sem_and(*operands: Thunk) -> object:
    unknown = False
    for operand in operands:
        value = operand()
        if value is False:
            return False
        if value is None:
            unknown = True
    return None if unknown else True


def _sem_or(*operands: Thunk) -> object:
    unknown = False
    for operand in operands:
        value = operand()
        if value is True:
            return True
        if value is None:
            unknown = True
    return None if unknown else False


def _sem_equal(left: Thunk, right: Thunk) -> object:
    return javalang.equal(left(), right())


def _sem_is_null(operand: Thunk) -> object:
    return operand() is None


def _sem_negate(operand: Thunk) -> object:
    return javalang.negate(operand())


@cache
def _sem_compare(op: CmpOp) -> Semantics:
    def compare(left: Thunk, right: Thunk) -> object:
        lv = left()
        if lv is None:
            return None
        rv = right()
        if rv is None:
            return None
        return op.holds(javalang.relational_compare(lv, rv))

    return compare


@cache
def _sem_match(op: MatchOp, pattern: str, negated: bool) -> Semantics:
    def match(operand: Thunk) -> object:
        if not pattern:
            return False
        value = operand()
        if type(value) is not str:
            return False
        return op.holds(value, pattern) is not negated

    return match


_CHILD_CONTEXTS: dict[object, Context] = {}
_MAX_CHILD_CONTEXTS: Final = 4096


def _child_context(
    semantics: Semantics, domains: tuple[tuple[object, ...], ...], index: int, parent: Context
) -> Context:
    """The context of operand ``index``: two of its outcomes share a class when, whatever the other
    operands are (one representative per class of their values), the node's outcomes share a class
    of ``parent``. Memoized with the domains' constants type-tagged: ``TRUE`` and ``1`` are equal
    in Python, not in a filter."""
    key = (semantics, javalang.typed_key(domains), index, parent)
    hit = _CHILD_CONTEXTS.get(key)
    if hit is None:
        if len(_CHILD_CONTEXTS) >= _MAX_CHILD_CONTEXTS:
            _CHILD_CONTEXTS.clear()
        hit = _CHILD_CONTEXTS[key] = _derive_child_context(semantics, domains, index, parent)
    return hit


def _derive_child_context(
    semantics: Semantics, domains: tuple[tuple[object, ...], ...], index: int, parent: Context
) -> Context:
    others = domains[:index] + domains[index + 1 :]
    signatures = []
    for value in _PREDICATE_VALUES:
        signature = tuple(
            parent[_outcome(semantics, (*combo[:index], value, *combo[index:]))]
            for combo in itertools.product(*others)
        )
        signatures.append(signature)
    classes: dict[tuple[int, ...], int] = {}
    return tuple(classes.setdefault(s, len(classes)) for s in signatures)


def _present(context: Context, outcome: int) -> int:
    """The outcome to show for ``outcome`` in ``context``: NULL when it cannot be told from NULL, an
    ERROR as FALSE or TRUE when it cannot be told from that, else itself."""
    if context[outcome] == context[_N]:
        return _N
    if outcome == _E:
        for other in (_F, _T):
            if context[other] == context[_E]:
                return other
    return outcome


# ------------------------------------------------------------------------------- translated values


@dataclass(frozen=True, slots=True)
class _Rendered:
    """A predicate as Spark sees it: a boolean (three-valued, no ERROR) or an outcome code 1-4."""

    expr: _X
    coded: bool
    constant: int | None = None


def _constant(outcome: int) -> _Rendered:
    if outcome == _E:
        return _Rendered(_int(_E + 1), True, outcome)
    return _Rendered((_FALSE, _NULL, _TRUE)[outcome], False, outcome)


def _boolean_of(outcome: int) -> _Lit:
    return (_FALSE, _NULL, _TRUE)[outcome]


def _code_of_boolean(b: _X) -> _X:
    """Outcome code of a three-valued boolean (FALSE 1, NULL 2, TRUE 3), ``b`` referenced once."""
    looked_up = _Call("element_at", (_Call("map", (_FALSE, _int(_F + 1), _TRUE, _int(_T + 1))), b))
    return _Call("coalesce", (looked_up, _int(_N + 1)))


@dataclass(frozen=True, slots=True)
class _Str:
    """A property: a nullable string column."""

    expr: _X


@dataclass(frozen=True, slots=True)
class _Const:
    """A value known before any row is read (Java-typed; None is NULL)."""

    value: object


@dataclass(frozen=True, slots=True)
class _Pred:
    """A predicate (or a NULL that may throw): rendered for the context its parent gives it."""

    render: Callable[[Context], _Rendered]


_Val: TypeAlias = _Str | _Const | _Pred


def _throws() -> _Pred:
    return _Pred(lambda context: _constant(_present(context, _E)))


def _fold(semantics: Semantics, values: Sequence[object]) -> _Val:
    """A node whose operands are all constants."""
    try:
        return _Const(semantics(*(_thunk(v) for v in values)))
    except FilterEvaluationError:
        return _throws()


def _domain(val: _Val) -> tuple[object, ...]:
    if isinstance(val, _Str):
        return _STRING_VALUES
    if isinstance(val, _Const):
        return (val.value,)
    return _PREDICATE_VALUES


@dataclass(frozen=True, slots=True)
class _Operand:
    """An operand of a lookup table: representative values, and a Spark expression giving the
    (1-based) index of the row's value among them; None when there is a single one."""

    values: tuple[object, ...]
    index: _X | None
    string: _X | None = None  # a string operand, whose classes may be merged


def _operand(val: _Str | _Const | _Rendered) -> _Operand:
    if isinstance(val, _Const):
        return _Operand((val.value,), None)
    if isinstance(val, _Str):
        s = val.expr
        index = _Case(((_IsNull(s), _int(1)), (_is_true_text(s), _int(2))), _int(3))
        return _Operand(_STRING_VALUES, index, s)
    if val.constant is not None:
        return _Operand((_PREDICATE_VALUES[val.constant],), None)
    return _Operand(_PREDICATE_VALUES, val.expr if val.coded else _code_of_boolean(val.expr))


def _table(semantics: Semantics, operands: Sequence[_Operand], context: Context) -> _Rendered:
    """The node's outcome, presented for ``context``, looked up from its operands' indices."""
    ops = list(operands)
    grid = {
        combo: _present(
            context, _outcome(semantics, [op.values[i] for op, i in zip(ops, combo, strict=True)])
        )
        for combo in itertools.product(*(range(len(op.values)) for op in ops))
    }
    # a string operand whose "true" and "x" rows agree only needs to be tested for NULL: drop the
    # "true" rows and renumber the "x" ones
    for k, op in enumerate(ops):
        if op.string is None:
            continue
        if all(v == grid[(*c[:k], 2, *c[k + 1 :])] for c, v in grid.items() if c[k] == 1):
            renumbered = {0: 0, 2: 1}
            grid = {(*c[:k], renumbered[c[k]], *c[k + 1 :]): v for c, v in grid.items() if c[k] != 1}
            ops[k] = _Operand((None, "x"), _Case(((_IsNull(op.string), _int(1)),), _int(2)))
    outcomes = set(grid.values())
    if len(outcomes) == 1:
        return _constant(outcomes.pop())
    coded = _E in outcomes

    def cell(outcome: int) -> _Lit:
        return _int(outcome + 1) if coded else _boolean_of(outcome)

    indexed = [k for k, op in enumerate(ops) if op.index is not None]

    def build(level: int, fixed: tuple[int, ...]) -> _X:
        k = indexed[level]
        rows: list[_X] = []
        for i in range(len(ops[k].values)):
            combo = (*fixed[:k], i, *fixed[k + 1 :])
            rows.append(cell(grid[combo]) if level + 1 == len(indexed) else build(level + 1, combo))
        return _Call("array", tuple(rows))

    expr = build(0, (0,) * len(ops))
    for k in indexed:
        index = ops[k].index
        assert index is not None
        expr = _Call("element_at", (expr, index))
    return _Rendered(expr, coded)


def _node(
    semantics: Semantics,
    operands: Sequence[_Val],
    native: Callable[[list[_X]], _X] | None = None,
) -> _Val:
    """A node over arbitrary operands: folded when constant, else a lookup table (or ``native``, a
    plain Spark expression over the operands, when they are all plain booleans)."""
    if all(isinstance(op, _Const) for op in operands):
        return _fold(semantics, [op.value for op in operands if isinstance(op, _Const)])
    domains = tuple(_domain(op) for op in operands)

    def render(context: Context) -> _Rendered:
        parts: list[_Str | _Const | _Rendered] = []
        for i, op in enumerate(operands):
            if isinstance(op, _Pred):
                parts.append(op.render(_child_context(semantics, domains, i, context)))
            else:
                parts.append(op)
        if native is not None and all(
            isinstance(p, _Rendered) and not p.coded and p.constant is None for p in parts
        ):
            return _Rendered(native([p.expr for p in parts if isinstance(p, _Rendered)]), False)
        return _table(semantics, [_operand(p) for p in parts], context)

    return _Pred(render)


def _leaf(branches: Sequence[tuple[_X, int | _X]], otherwise: int | _X, lax: _X | None = None) -> _Pred:
    """A predicate over properties and constants only: the first branch whose condition holds gives
    the outcome, either fixed or a boolean (non-null where it is reached). ``lax`` is an equivalent
    three-valued expression for when every fixed outcome is shown as NULL."""

    def render(context: Context) -> _Rendered:
        def show(outcome: int | _X) -> int | _X:
            return _present(context, outcome) if isinstance(outcome, int) else outcome

        shown = [(cond, show(out)) for cond, out in branches]
        last = show(otherwise)
        fixed = [o for o in [*(out for _, out in shown), last] if isinstance(o, int)]
        if isinstance(last, int) and len(fixed) == len(shown) + 1 and len(set(fixed)) == 1:
            return _constant(last)
        if lax is not None and all(o == _N for o in fixed):
            return _Rendered(lax, False)
        coded = _E in fixed

        def value(outcome: int | _X) -> _X:
            if isinstance(outcome, int):
                return _int(outcome + 1) if coded else _boolean_of(outcome)
            return _Case(((outcome, _int(_T + 1)),), _int(_F + 1)) if coded else outcome

        return _Rendered(_Case(tuple((c, value(o)) for c, o in shown), value(last)), coded)

    return _Pred(render)


def _plain(expr: _X) -> _Pred:
    """A three-valued predicate that never throws."""
    return _Pred(lambda context: _Rendered(expr, False))


# -------------------------------------------------------------------------------------- translator


class SparkSqlTranslator(ExprVisitor[_Val]):
    """Translates a bound SQL92 tree; ``property_column(name)`` is where a property is read."""

    def __init__(self, property_column: Callable[[str], _X]) -> None:
        self.property_column = property_column

    def translate(self, tree: Node) -> _X:
        """The whole filter as a Spark boolean that is never NULL."""
        return self.top(visit(tree, self))

    def top(self, val: _Val) -> _X:
        if isinstance(val, _Const):
            return _TRUE if val.value is True else _FALSE
        if isinstance(val, _Str):  # cannot happen: the parser makes a bare property a BoolCast
            raise UnsupportedFilterError("a filter must be a condition", backend=BACKEND)
        rendered = val.render(_ROOT)
        if rendered.constant is not None:
            return _TRUE if rendered.constant == _T else _FALSE
        if rendered.coded:
            return _Binary("=", rendered.expr, _int(_T + 1))
        expr = rendered.expr
        if isinstance(expr, _Call) and expr.name == "coalesce" and expr.args[-1] == _FALSE:
            return expr  # already never NULL
        return _Call("coalesce", (expr, _FALSE))

    # ------------------------------------------------------------------------------ leaves

    def visit_literal(self, node: Literal) -> _Val:
        if isinstance(node.value, str):
            _user_string(node.value, "string literal")
        return _Const(node.value)

    def visit_property(self, node: Property) -> _Val:
        return _Str(self.property_column(node.name))

    # -------------------------------------------------------------------------- operators

    def visit_negate(self, node: Negate, operand: _Val) -> _Val:
        if isinstance(operand, _Str):
            return _Const(None)  # a String negates to NULL
        return _node(_sem_negate, [operand])

    def visit_not(self, node: Not, operand: _Val) -> _Val:
        return _node(_sem_not, [operand], lambda parts: _Not(parts[0]))

    def visit_bool_cast(self, node: BoolCast, operand: _Val) -> _Val:
        # a String is never a java.lang.Boolean: FALSE when present, NULL when missing
        assert isinstance(operand, _Str)
        return _leaf([(_IsNull(operand.expr), _N)], _F)

    def visit_and(self, node: And, operands: list[_Val]) -> _Val:
        return _junction("AND", _sem_and, operands)

    def visit_or(self, node: Or, operands: list[_Val]) -> _Val:
        return _junction("OR", _sem_or, operands)

    def visit_is_null(self, node: IsNull, operand: _Val) -> _Val:
        if isinstance(operand, _Str):
            return _plain(_IsNull(operand.expr))
        return _node(_sem_is_null, [operand], lambda parts: _IsNull(parts[0]))

    def visit_in(self, node: In, operand: _Val) -> _Val:
        assert isinstance(operand, _Str)
        values = tuple(sorted({_user_string(v, "IN item") for v in node.items}))
        hit: _X = _In(operand.expr, values)
        return _plain(_Not(hit) if node.negated else hit)

    def visit_string_match(self, node: StringMatch, operand: _Val) -> _Val:
        pattern = _user_string(node.pattern, f"{node.op.value} pattern")
        semantics = _sem_match(node.op, pattern, node.negated)
        if not pattern:
            return _Const(False)  # RocketMQ answers FALSE without evaluating the operand
        if isinstance(operand, _Str):
            hit: _X = _Call(node.op.value.lower(), (operand.expr, _string(pattern)))
            # a missing value is FALSE for the NOT forms too
            return _plain(_Call("coalesce", (_Not(hit) if node.negated else hit, _FALSE)))
        return _node(semantics, [operand])

    # ---------------------------------------------------------------------------- comparisons

    def visit_equal(self, node: Equal, left: _Val, right: _Val) -> _Val:
        if isinstance(left, _Str) and isinstance(right, _Str):
            same = isinstance(node.left, Property) and node.left == node.right
            if same:
                return _Const(True)  # both NULL is TRUE, else the same text
            return _equal_strings(left.expr, right.expr)
        if isinstance(left, _Str) and isinstance(right, _Const):
            return _equal_string_constant(left.expr, right.value)
        if isinstance(left, _Const) and isinstance(right, _Str):
            return _equal_constant_string(left.value, right.expr)
        return _node(_sem_equal, [left, right])

    def visit_compare(self, node: Compare, left: _Val, right: _Val) -> _Val:
        op = node.op
        if isinstance(left, _Str) and isinstance(right, _Str):
            return _compare_strings(op, left.expr, right.expr)
        if isinstance(left, _Str) and isinstance(right, _Const):
            return _compare_string_constant(op, left.expr, right.value)
        if isinstance(left, _Const) and isinstance(right, _Str):
            if left.value is None:
                return _Const(None)  # NULL on the left: the right side is not even evaluated
            return _compare_string_constant(_MIRRORED[op], right.expr, left.value)
        return _node(_sem_compare(op), [left, right])


def _junction(op: str, semantics: Semantics, operands: list[_Val]) -> _Val:
    """n-ary AND/OR, as RocketMQ folds it from the left: ``((o1 op o2) op o3) ...``."""
    if all(isinstance(o, _Const) for o in operands):
        return _fold(semantics, [o.value for o in operands if isinstance(o, _Const)])
    preds = [o if isinstance(o, _Pred) else _constant_pred(o) for o in operands]
    pair = (_PREDICATE_VALUES, _PREDICATE_VALUES)

    def render(context: Context) -> _Rendered:
        n = len(preds)
        acc_context: list[Context] = [context] * n  # acc_context[k]: of the fold of operands 0..k
        own_context: list[Context] = [context] * n
        for k in range(n - 1, 0, -1):
            own_context[k] = _child_context(semantics, pair, 1, acc_context[k])
            acc_context[k - 1] = _child_context(semantics, pair, 0, acc_context[k])
        own_context[0] = acc_context[0]
        acc = preds[0].render(own_context[0])
        for k in range(1, n):
            right = preds[k].render(own_context[k])
            if acc.coded or right.coded:
                acc = _table(semantics, [_operand(acc), _operand(right)], acc_context[k])
            elif isinstance(acc.expr, _Junction) and acc.expr.op == op:
                acc = _Rendered(_Junction(op, (*acc.expr.items, right.expr)), False)
            else:
                acc = _Rendered(_Junction(op, (acc.expr, right.expr)), False)
        return acc

    return _Pred(render)


def _constant_pred(val: _Val) -> _Pred:
    assert isinstance(val, _Const)
    if val.value is None:
        return _Pred(lambda context: _constant(_present(context, _N)))
    return _Pred(lambda context: _constant(_present(context, _T if val.value is True else _F)))


def _equal_strings(left: _X, right: _X) -> _Val:
    return _leaf(
        [
            (_Junction("AND", (_IsNull(left), _IsNull(right))), _T),
            (_IsNull(left), _N),
            (_IsNull(right), _F),
        ],
        _Binary("=", left, right),
    )


def _equal_string_constant(s: _X, const: object) -> _Val:
    """``property = constant`` (a NULL property gives NULL)."""
    if const is None:
        return _plain(_IsNull(s))  # both NULL is TRUE; a value against NULL is FALSE
    jtype = javalang.java_type(const)
    if jtype is JType.STRING:
        assert isinstance(const, str)
        return _plain(_Binary("=", s, _string(const)))
    if jtype is JType.BOOLEAN:
        is_true = _is_true_text(s)
        return _plain(is_true if const else _Not(is_true))
    test, failed = _numeric_equal(s, const, jtype)
    return _leaf([(_IsNull(s), _N), (failed, _E)], test, test)


def _equal_constant_string(const: object, s: _X) -> _Val:
    """``constant = property`` (a NULL property gives FALSE)."""
    if const is None:
        return _leaf([(_IsNull(s), _T)], _N)
    jtype = javalang.java_type(const)
    if jtype is JType.STRING:
        assert isinstance(const, str)
        test: _X = _Binary("=", s, _string(const))
        return _leaf([(_IsNull(s), _F)], test, test)
    if jtype is JType.BOOLEAN:
        return _leaf([(_IsNull(s), _F)], _E)  # Boolean against String: ClassCastException
    test, failed = _numeric_equal(s, const, jtype)
    return _leaf([(_IsNull(s), _F), (failed, _E)], test, test)


def _numeric_equal(s: _X, const: object, jtype: JType) -> tuple[_X, _X]:
    """(``s`` converted for ``const`` equals it, the conversion failed) for a non-null ``s``."""
    if jtype is JType.DOUBLE:
        assert isinstance(const, float)
        x, negative = _parse_double(s)
        return _double_against(None, x, negative, const), _IsNull(x)
    v = _parse_integral(s, jtype)
    return _Binary("=", v, _number(const)), _IsNull(v)


def _compare_string_constant(op: CmpOp, s: _X, const: object) -> _Val:
    """``property <op> constant``."""
    if const is None:
        return _Const(None)  # NULL whether or not the property is
    jtype = javalang.java_type(const)
    if jtype is JType.DOUBLE:
        assert isinstance(const, float)
        x, negative = _parse_double(s)
        test = _double_against(op, x, negative, const)
        failed: _X = _IsNull(x)
    elif jtype in (JType.INTEGER, JType.LONG):
        v = _parse_integral(s, jtype)
        test = _Binary(_SQL_OP[op], v, _number(const))
        failed = _IsNull(v)
    else:  # the parser only lets numbers be ordered
        raise UnsupportedFilterError(f"ordering a property against {const!r}", backend=BACKEND)
    return _leaf([(_IsNull(s), _N), (failed, _E)], test, test)


def _compare_strings(op: CmpOp, left: _X, right: _X) -> _Val:
    """``property <op> property``: both parsed as doubles, either failing throws."""
    lx, l_negative = _parse_double(left)
    rx, r_negative = _parse_double(right)
    test = _double_between(op, lx, l_negative, rx, r_negative)
    return _leaf(
        [
            (_Junction("OR", (_IsNull(left), _IsNull(right))), _N),
            (_Junction("OR", (_IsNull(lx), _IsNull(rx))), _E),
        ],
        test,
        test,
    )


# ------------------------------------------------------------------------------------- entry points


def _property_columns(properties: object, columns: Mapping[str, object] | None) -> Callable[[str], _X]:
    base = _Ref(properties)
    overrides = {}
    for name, column in (columns or {}).items():
        if not isinstance(name, str):
            raise TypeError(f"columns keys are property names (str), got {type(name).__name__}")
        overrides[name] = _Ref(column)

    def property_column(name: str) -> _X:
        override = overrides.get(name)
        return override if override is not None else _Item(base, name)

    return property_column


def _translate(compiled: FilterSpec, property_column: Callable[[str], _X]) -> _X:
    if compiled.tree is None:
        tag_filter = compiled.tag_filter
        assert tag_filter is not None
        if tag_filter.sub_all:
            return _TRUE
        tags = tuple(sorted(_user_string(t, "tag") for t in tag_filter.tags))
        if not tags:
            return _FALSE
        return _Call("coalesce", (_In(property_column(TAGS_PROPERTY), tags), _FALSE))
    # the context of every level is worked out recursively
    needed = compiled.tree.depth * 8 + 1000
    if sys.getrecursionlimit() < needed:
        sys.setrecursionlimit(needed)
    expr = SparkSqlTranslator(property_column).translate(compiled.tree)
    depth = _depth(expr)
    if depth > MAX_NESTING:
        raise UnsupportedFilterError(
            f"the Spark expression of this filter nests {depth} levels deep, more than Spark handles "
            f"({MAX_NESTING}; its parser and analyzer overflow their stacks)",
            backend=BACKEND,
        )
    return expr


def to_spark_column(
    compiled: FilterSpec,
    properties: str | Column = "properties",
    *,
    columns: Mapping[str, str | Column] | None = None,
) -> Column:
    """The filter as a boolean Column: TRUE exactly where ``compiled.matches`` is True, else FALSE.

    ``properties`` is the ``map<string,string>`` column of message properties (a name or a Column);
    ``columns`` maps property names to top-level string columns that hold them instead (e.g.
    ``{"TAGS": "tag"}``). Raises :class:`~siftmq.errors.UnsupportedFilterError` for a filter that
    cannot be expressed exactly, or nests deeper than ``MAX_NESTING``.
    """
    return _column_tree(_translate(compiled, _property_columns(properties, columns)))


def to_spark_sql(
    compiled: FilterSpec,
    properties: str = "properties",
    *,
    columns: Mapping[str, str] | None = None,
) -> str:
    """:func:`to_spark_column` as Spark SQL text (for ``DataFrame.filter`` or ``selectExpr``).

    Column names are quoted as single identifiers, string literals so that no text in them can
    change the structure of the query.
    """
    if not isinstance(properties, str):
        raise TypeError(f"properties must be a column name, got {type(properties).__name__}")
    for name, column in (columns or {}).items():
        if not isinstance(column, str):
            raise TypeError(f"columns[{name!r}] must be a column name, got {type(column).__name__}")
    return _walk(_translate(compiled, _property_columns(properties, columns)), _sql_node)
