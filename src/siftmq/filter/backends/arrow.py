"""Vectorized backend: evaluates a compiled filter over a whole batch with pyarrow compute and numpy.

In a batch every property is a string or absent (what a broker sees), so the type of every
sub-expression is known before looking at a row: a property is a String column, a predicate a
boolean column, a literal (or any sub-tree without properties) a constant. The Java coercions of
RocketMQ's evaluator become column kernels:

* ``Integer.valueOf``/``Long.valueOf`` — Arrow's cast when it accepts the whole column (its
  ``0x`` hex, which Java rejects, found by a byte scan and decided exactly), else an ASCII regex
  check plus a cast; rows with non-ASCII text (Unicode digits, which Java accepts) or more than 18
  digits are decided exactly, one by one, by :mod:`siftmq.filter.javalang`;
* ``Double.valueOf`` — Java's trim, its grammar as a regex, a cast (hex floats decided one by one);
  ``Double.compare`` order (NaN above all, -0.0 < 0.0) through total-order integer keys;
* ``Boolean.valueOf`` — ASCII lower-case equals ``true``;
* String equality and ``IN`` with constants — one or two 64-bit word compares per row on Arrow's
  string-view layout (:mod:`._string_views`).

Four-valued logic per row: TRUE, FALSE, NULL, or *error* (RocketMQ threw). Errors propagate exactly
as exceptions do in RocketMQ's evaluator: AND skips its right side after a FALSE, OR after a TRUE,
relational operators skip their right side after a NULL left, IS NULL does not catch. A row matches
only when the result is TRUE with no error.

Work is shared and skipped where the result cannot change:

* each column's parses and string views are computed once per batch, whichever nodes use them;
* sub-trees without properties are evaluated once per filter by the scalar backend;
* a boolean sub-tree that reads a single dictionary-encoded column is evaluated once per distinct
  value and mapped to the rows by the dictionary indices (exact: a row's result depends only on
  its value). A plain column of low cardinality is dictionary-encoded for this when the sub-tree
  is costly or parses the column as numbers (which would encode it anyway).

A filter this backend cannot express exactly (a pattern with a lone surrogate) raises
:class:`~siftmq.errors.UnsupportedFilterError`; ``matches`` then falls back to the scalar evaluator
for that batch.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

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
    children,
    is_boolean,
)
from siftmq.filter.backends._string_views import StringViews
from siftmq.filter.javalang import INT_MAX, INT_MIN, LONG_MAX, LONG_MIN, JType
from siftmq.filter.scalar import ScalarCompiler
from siftmq.filter.spec import FilterSpec
from siftmq.filter.visitor import ExprVisitor, dispatch, visit

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


# ------------------------------------------------------------------------------------------ values


@dataclass(slots=True)
class _Val:
    """A sub-expression's per-row result.

    ``kind`` is ``"str"`` (a property column), ``"bool"`` (a predicate: ``t``/``f`` masks, NULL where
    neither), ``"null"`` (always NULL, e.g. ``-prop``) or ``"const"`` (one Java value for every row).
    ``e`` marks the rows where evaluation threw; the value masks are False there.
    """

    kind: str
    e: Mask
    column: _Column | None = None
    t: Mask | None = None
    f: Mask | None = None
    const: Any = None

    def nonnull(self, n: int) -> Mask:
        if self.kind == "str":
            assert self.column is not None
            return self.column.valid & ~self.e
        if self.kind == "bool":
            assert self.t is not None and self.f is not None
            return self.t | self.f
        if self.kind == "null":
            return np.zeros(n, dtype=np.bool_)
        return ~self.e if self.const is not None else np.zeros(n, dtype=np.bool_)

    def masks(self, n: int) -> tuple[Mask, Mask]:
        """(TRUE, FALSE) masks of a boolean-valued result."""
        if self.kind == "bool":
            assert self.t is not None and self.f is not None
            return self.t, self.f
        if self.kind == "const":
            ok = ~self.e
            if self.const is True:
                return ok, np.zeros(n, dtype=np.bool_)
            if self.const is False:
                return np.zeros(n, dtype=np.bool_), ok
        return np.zeros(n, dtype=np.bool_), np.zeros(n, dtype=np.bool_)


def _bool(t: Mask, f: Mask, e: Mask) -> _Val:
    return _Val("bool", e, t=t & ~e, f=f & ~e)


_THROWS: Final = object()  # a constant sub-tree whose evaluation throws
_HOLDS: Final[dict[CmpOp, Callable[[npt.NDArray[Any], Any], Mask]]] = {
    CmpOp.GT: np.greater,
    CmpOp.GE: np.greater_equal,
    CmpOp.LT: np.less,
    CmpOp.LE: np.less_equal,
}
_MIRRORED: Final = {CmpOp.GT: CmpOp.LT, CmpOp.GE: CmpOp.LE, CmpOp.LT: CmpOp.GT, CmpOp.LE: CmpOp.GE}


class _Plan:
    """What a filter's tree needs for every batch, worked out once.

    ``props``: the properties each sub-tree reads; ``cost``: its predicates' rough cost (see
    ``ENCODE_MIN_COST``); ``constants``: the value (or ``_THROWS``) of every maximal sub-tree that
    reads no property, other than a bare literal, computed by the scalar backend.
    """

    def __init__(self, tree: Node) -> None:
        self.tree = tree
        self.props: dict[int, frozenset[str]] = {}
        self.cost: dict[int, int] = {}
        stack: list[tuple[Node, bool]] = [(tree, False)]
        while stack:
            node, done = stack.pop()
            key = id(node)
            if key in self.props:
                continue
            kids = children(node)
            if not done and kids:
                stack.append((node, True))
                stack.extend((c, False) for c in kids)
                continue
            props = frozenset((node.name,)) if isinstance(node, Property) else frozenset()
            cost = _own_cost(node)
            for c in kids:
                props |= self.props[id(c)]
                cost += self.cost[id(c)]
            self.props[key] = props
            self.cost[key] = cost
        self.constants: dict[int, object] = {}
        todo = [tree]
        while todo:
            node = todo.pop()
            if self.props[id(node)]:
                todo.extend(children(node))
            elif not isinstance(node, Literal):
                self.constants[id(node)] = _scalar_value(node)

    def dictionary_subtrees(self, columns: Mapping[str, _Column]) -> list[tuple[Node, str]]:
        """The maximal boolean sub-trees to evaluate once per distinct value of their one column."""
        picked: list[tuple[Node, str]] = []
        todo = [self.tree]
        while todo:
            node = todo.pop()
            props = self.props[id(node)]
            if not props:
                continue
            if len(props) == 1 and is_boolean(node):
                (name,) = props
                if columns[name].prefers_dictionary(self.cost[id(node)]):
                    picked.append((node, name))
                    continue
            todo.extend(children(node))
        return picked


def _own_cost(node: Node) -> int:
    """A node's evaluation cost, relative to ``=`` with a string constant (1).

    CONTAINS, STARTSWITH and ENDSWITH cost more. Parsing a column as numbers costs
    ``ENCODE_MIN_COST``: a low-cardinality column is dictionary-encoded for it anyway, so the
    sub-tree might as well be evaluated on the dictionary.
    """
    if isinstance(node, StringMatch):
        return _MATCH_COST
    if isinstance(node, Compare):
        return ENCODE_MIN_COST
    if isinstance(node, Equal):
        numeric = any(_is_number(side) for side in (node.left, node.right))
        return ENCODE_MIN_COST if numeric else 1
    return int(isinstance(node, In))


def _is_number(node: Node) -> bool:
    while isinstance(node, Negate):
        node = node.operand
    return isinstance(node, Literal) and node.jtype in (JType.INTEGER, JType.LONG, JType.DOUBLE)


def _scalar_value(node: Node) -> object:
    fn = visit(node, ScalarCompiler())
    try:
        return fn({})
    except FilterEvaluationError:
        return _THROWS


class _Evaluator(ExprVisitor[_Val]):
    def __init__(self, plan: _Plan, columns: Mapping[str, _Column], n: int) -> None:
        self.plan = plan
        self.columns = columns
        self.n = n
        self.none: Mask = np.zeros(n, dtype=np.bool_)

    def evaluate(self, root: Node, done: Mapping[int, _Val] | None = None) -> _Val:
        """Post-order walk of ``root`` (as :func:`siftmq.filter.visitor.visit`) that does not descend
        into constant sub-trees or into the sub-trees already evaluated in ``done``."""
        done = done or {}
        constants = self.plan.constants
        results: list[_Val] = []
        stack: list[tuple[Node, bool]] = [(root, False)]
        while stack:
            node, expanded = stack.pop()
            key = id(node)
            if not expanded:
                hit = done.get(key)
                if hit is None and key in constants:
                    hit = self._constant(constants[key])
                if hit is not None:
                    results.append(hit)
                    continue
                kids = children(node)
                if kids:
                    stack.append((node, True))
                    stack.extend((child, False) for child in reversed(kids))
                    continue
            count = len(children(node))
            args = results[len(results) - count :] if count else []
            if count:
                del results[len(results) - count :]
            results.append(dispatch(node, self, args))
        return results[0]

    def _constant(self, value: object) -> _Val:
        if value is _THROWS:
            return _Val("const", np.ones(self.n, dtype=np.bool_), const=None)
        if value is True or value is False:
            return _Val("bool", self.none, t=np.full(self.n, value), f=np.full(self.n, not value))
        return _Val("const", self.none, const=value)

    def on_dictionary(self, node: Node, name: str) -> _Val:
        """``node``, which reads only ``name``, evaluated once per distinct value (and once for NULL,
        last): a result per dictionary index."""
        dictionary, _ = self.columns[name].encoded()
        size = len(dictionary) + 1
        values = pa.concat_arrays([dictionary, pa.nulls(1, dictionary.type)])
        return _Evaluator(self.plan, {name: _Column(values, size)}, size).evaluate(node)

    def mapped(self, node: Node, name: str) -> _Val:
        """:meth:`on_dictionary` mapped to the rows."""
        result = self.on_dictionary(node, name)
        _, indices = self.columns[name].encoded()
        t, f = result.masks(len(result.e))
        e = result.e[indices] if result.e.any() else self.none
        return _Val("bool", e, t=t[indices], f=f[indices])

    # ---------------------------------------------------------------------------------- visitors

    def visit_literal(self, node: Literal) -> _Val:
        return _Val("const", self.none, const=node.value)

    def visit_property(self, node: Property) -> _Val:
        return _Val("str", self.none, column=self.columns[node.name])

    def visit_negate(self, node: Negate, operand: _Val) -> _Val:
        return _Val("null", operand.e)

    def visit_not(self, node: Not, operand: _Val) -> _Val:
        t, f = operand.masks(self.n)
        return _bool(f, t, operand.e)

    def visit_bool_cast(self, node: BoolCast, operand: _Val) -> _Val:
        # a string is never a java.lang.Boolean: FALSE when present, NULL when absent
        return _bool(self.none, operand.nonnull(self.n), operand.e)

    def visit_and(self, node: And, operands: list[_Val]) -> _Val:
        acc = operands[0]
        t, f = acc.masks(self.n)
        e = acc.e
        for op in operands[1:]:
            rt, rf = op.masks(self.n)
            if op.e is not self.none:
                e = e | (~f & op.e)
            t, f = t & rt, f | rf
        return _bool(t, f, e)

    def visit_or(self, node: Or, operands: list[_Val]) -> _Val:
        acc = operands[0]
        t, f = acc.masks(self.n)
        e = acc.e
        for op in operands[1:]:
            rt, rf = op.masks(self.n)
            if op.e is not self.none:
                e = e | (~t & op.e)
            t, f = t | rt, f & rf
        return _bool(t, f, e)

    def visit_equal(self, node: Equal, left: _Val, right: _Val) -> _Val:
        fast = self._column_constant_equal(left, right)
        if fast is not None:
            return fast
        n = self.n
        ln, rn = left.nonnull(n), right.nonnull(n)
        e = left.e | right.e
        both = ln & rn
        sign, cmp_err = self._compare(left, right, both, equality=True)
        e = e | (both & cmp_err)
        lnull, rnull = ~ln, ~rn
        t = (lnull & rnull) | (both & (sign == 0))
        f = (ln & rnull) | (both & (sign != 0))
        return _bool(t, f, e)

    def visit_compare(self, node: Compare, left: _Val, right: _Val) -> _Val:
        fast = self._column_constant_compare(node.op, left, right)
        if fast is not None:
            return fast
        n = self.n
        ln = left.nonnull(n)
        rn = right.nonnull(n)
        e = left.e | (ln & right.e)
        both = ln & rn
        sign, cmp_err = self._compare(left, right, both, equality=False)
        e = e | (both & cmp_err)
        op = node.op
        if op is CmpOp.GT:
            holds = sign > 0
        elif op is CmpOp.GE:
            holds = sign >= 0
        elif op is CmpOp.LT:
            holds = sign < 0
        else:
            holds = sign <= 0
        return _bool(both & holds, both & ~holds, e)

    def visit_is_null(self, node: IsNull, operand: _Val) -> _Val:
        nn = operand.nonnull(self.n)
        return _bool(~nn, nn, operand.e)

    def visit_in(self, node: In, operand: _Val) -> _Val:
        column = operand.column
        assert column is not None
        hit = column.isin(node.values)
        miss = column.valid & ~hit
        if node.negated:
            hit, miss = miss, hit
        return _Val("bool", self.none, t=hit, f=miss)

    def visit_string_match(self, node: StringMatch, operand: _Val) -> _Val:
        if not node.pattern:
            return _bool(self.none, ~self.none, self.none)
        if operand.kind != "str":
            # a non-string (or NULL) operand gives FALSE, but its errors still propagate
            return _bool(self.none, ~self.none, operand.e)
        column = operand.column
        assert column is not None
        try:
            pattern = node.pattern
            pattern.encode("utf-8")
        except UnicodeEncodeError:
            raise UnsupportedFilterError(
                "a search string with a lone surrogate has no UTF-8 form", backend="arrow"
            ) from None
        values = column.plain()
        if node.op is MatchOp.CONTAINS:
            hit = pc.match_substring(values, pattern)
        elif node.op is MatchOp.STARTSWITH:
            hit = pc.starts_with(values, pattern)
        else:
            hit = pc.ends_with(values, pattern)
        h = _bool_numpy(hit)
        if node.negated:
            h = ~h
        valid = column.valid
        return _bool(valid & h, ~(valid & h), operand.e)

    # ------------------------------------------------------------------------------- comparison

    def _column_constant_equal(self, left: _Val, right: _Val) -> _Val | None:
        """``column = constant`` or ``constant = column`` for a string or number constant."""
        pair = _column_and_constant(left, right)
        if pair is None:
            return None
        column, const, flipped = pair
        jt = javalang.java_type(const)
        if jt is JType.STRING:
            t = column.equals(const)
            # NULL when the column (left) is null; FALSE when it is on the right
            return _Val("bool", self.none, t=t, f=~t if flipped else column.valid & ~t)
        if jt is JType.BOOLEAN:
            return None
        values, err, key = _numeric(column, const)
        ok = column.valid & ~err
        same = values == key
        f = ok & ~same
        return _Val("bool", err, t=ok & same, f=f | ~column.valid if flipped else f)

    def _column_constant_compare(self, op: CmpOp, left: _Val, right: _Val) -> _Val | None:
        """``column <op> number`` or ``number <op> column``: NULL on a null row, else the comparison."""
        pair = _column_and_constant(left, right)
        if pair is None:
            return None
        column, const, flipped = pair
        if javalang.java_type(const) not in (JType.INTEGER, JType.LONG, JType.DOUBLE):
            return None
        values, err, key = _numeric(column, const)
        holds = _HOLDS[_MIRRORED[op] if flipped else op](values, key)
        ok = column.valid & ~err
        return _Val("bool", err, t=ok & holds, f=ok & ~holds)

    def _compare(
        self, left: _Val, right: _Val, rows: Mask, *, equality: bool
    ) -> tuple[npt.NDArray[Any], Mask]:
        """RocketMQ's coercing compare on the rows where both sides are non-null: (sign, error)."""
        n = self.n
        zeros = np.zeros(n, dtype=np.int8)
        no_err = self.none
        if not rows.any():
            return zeros, no_err
        lk, rk = left.kind, right.kind
        if lk == "str" and rk == "str":
            assert left.column is not None and right.column is not None
            if equality:
                same = _bool_numpy(pc.equal(left.column.plain(), right.column.plain()))
                return (~same).astype(np.int8), no_err
            lv, le = left.column.parsed("double")
            rv, re_ = right.column.parsed("double")
            return _sign(lv, rv), le | re_
        if lk == "str":
            assert left.column is not None
            return self._compare_str_other(left.column, right, flip=False)
        if rk == "str":
            assert right.column is not None
            return self._compare_str_other(right.column, left, flip=True)
        # both sides are predicates or constants
        lt, rt = _java_kind(left), _java_kind(right)
        lv, rv = _bool_values(left, n), _bool_values(right, n)
        if lt is JType.BOOLEAN and rt is JType.BOOLEAN:
            return lv.astype(np.int8) - rv.astype(np.int8), no_err
        if (
            lt is JType.BOOLEAN
        ):  # Boolean against a String constant: ClassCastException; against a number: "less"
            if rt is JType.STRING:
                return zeros, ~no_err
            return zeros - 1, no_err
        # a constant on the left against a predicate on the right
        if lt is JType.STRING:
            return np.full(n, javalang.parse_boolean(left.const), dtype=np.int8) - rv.astype(np.int8), no_err
        return zeros - 1, no_err

    def _compare_str_other(
        self, column: _Column, other: _Val, *, flip: bool
    ) -> tuple[npt.NDArray[Any], Mask]:
        """String column against a constant or a predicate; ``flip`` when the column is on the right."""
        n = self.n
        no_err = self.none
        if other.kind == "bool":
            values, _ = column.parsed("boolean")
            assert other.t is not None
            if flip:  # Boolean on the left of a String: ClassCastException
                return np.zeros(n, dtype=np.int8), ~no_err
            return values.astype(np.int8) - other.t.astype(np.int8), no_err
        if other.kind != "const":
            return np.zeros(n, dtype=np.int8), no_err
        const = other.const
        jt = javalang.java_type(const)
        if jt is JType.STRING:
            return (~column.equals(const)).astype(np.int8), no_err
        if jt is JType.BOOLEAN:
            if flip:
                return np.zeros(n, dtype=np.int8), ~no_err
            values, _ = column.parsed("boolean")
            sign = values.astype(np.int8) - np.int8(const)
            return sign, no_err
        values, err, key = _numeric(column, const)
        sign = _sign(values, key)
        return (-sign if flip else sign), err


def _column_and_constant(left: _Val, right: _Val) -> tuple[_Column, Any, bool] | None:
    """(column, constant, constant-is-on-the-left) for a property against a non-null constant."""
    if left.kind == "str" and right.kind == "const" and right.const is not None:
        assert left.column is not None
        return left.column, right.const, False
    if right.kind == "str" and left.kind == "const" and left.const is not None:
        assert right.column is not None
        return right.column, left.const, True
    return None


def _numeric(column: _Column, const: Any) -> tuple[npt.NDArray[Any], Mask, int]:
    """The column parsed as the number constant's Java type (errors where that throws), and the
    constant in the same order: the value, or its ``Double.compare`` key."""
    jt = javalang.java_type(const)
    if jt is JType.DOUBLE:
        values, err = column.parsed("double")
        return values, err, _double_key(const)
    values, err = column.parsed("int" if jt is JType.INTEGER else "long")
    return values, err, int(const)


def _java_kind(val: _Val) -> JType:
    if val.kind == "bool":
        return JType.BOOLEAN
    return javalang.java_type(val.const)


def _bool_values(val: _Val, n: int) -> Mask:
    if val.kind == "bool":
        assert val.t is not None
        return val.t
    return np.full(n, bool(val.const) if isinstance(val.const, bool) else False, dtype=np.bool_)


# ------------------------------------------------------------------------------------ entry point


class ArrowEvaluator:
    """``matches_batch`` of one compiled filter."""

    def __init__(self, compiled: FilterSpec) -> None:
        self.compiled = compiled
        self.tree = compiled.tree
        self.properties = sorted(compiled.properties)
        self._plan = _Plan(self.tree) if self.tree is not None else None

    def matches(self, batch: Any) -> npt.NDArray[np.bool_]:
        n, columns, raw = _normalize(batch, self.properties)
        if n == 0:
            return np.zeros(0, dtype=np.bool_)
        if columns is None:
            return self._scalar(raw, n)
        if self._plan is None:
            return self._match_tags(columns["TAGS"], n)
        try:
            return self._evaluate(self._plan, {name: _Column(col, n) for name, col in columns.items()}, n)
        except UnsupportedFilterError:
            return self._scalar(_rows(columns, n), n)

    def _match_tags(self, array: pa.Array, n: int) -> npt.NDArray[np.bool_]:
        tag_filter = self.compiled.tag_filter
        assert tag_filter is not None
        if tag_filter.sub_all:
            return np.ones(n, dtype=np.bool_)
        return _Column(array, n).isin(frozenset(tag_filter.tags))

    def _evaluate(self, plan: _Plan, columns: dict[str, _Column], n: int) -> npt.NDArray[np.bool_]:
        evaluator = _Evaluator(plan, columns, n)
        picked = plan.dictionary_subtrees(columns)
        if len(picked) == 1 and picked[0][0] is plan.tree:
            # the whole filter reads one column: only its TRUE rows are needed
            name = picked[0][1]
            result = evaluator.on_dictionary(plan.tree, name)
            t, _ = result.masks(len(result.e))
            _, indices = columns[name].encoded()
            return np.asarray((t & ~result.e)[indices], dtype=np.bool_)
        done = {id(node): evaluator.mapped(node, name) for node, name in picked}
        result = evaluator.evaluate(plan.tree, done)
        t, _ = result.masks(n)
        return np.asarray(t & ~result.e, dtype=np.bool_)

    def _scalar(self, rows: Sequence[Mapping[str, Any]], n: int) -> npt.NDArray[np.bool_]:
        match = self.compiled.matches
        return np.fromiter((match(row) for row in rows), dtype=np.bool_, count=n)


def _normalize(
    batch: Any, names: Sequence[str]
) -> tuple[int, dict[str, pa.Array] | None, Sequence[Mapping[str, Any]]]:
    """Row count and the referenced columns as arrays (absent → all null).

    Returns ``columns=None`` with the rows as dicts when a mapping holds text that Arrow cannot
    carry (lone surrogates): those batches are evaluated by the scalar backend.
    """
    if isinstance(batch, (pa.Table, pa.RecordBatch)):
        n = batch.num_rows
        columns: dict[str, pa.Array] = {}
        for name in names:
            if name in batch.column_names:
                col = batch.column(name)
                if isinstance(col, pa.ChunkedArray):
                    col = col.combine_chunks() if col.num_chunks != 1 else col.chunk(0)
                columns[name] = _check_string(name, col)
            else:
                columns[name] = pa.nulls(n, pa.string())
        return n, columns, ()
    if isinstance(batch, Mapping):
        lengths = {len(v) for v in batch.values()}
        if len(lengths) > 1:
            raise ValueError(f"batch columns have different lengths: {sorted(lengths)}")
        n = lengths.pop() if lengths else 0
        columns = {}
        try:
            for name in names:
                if name in batch:
                    col = batch[name]
                    columns[name] = (
                        _check_string(name, col)
                        if isinstance(col, pa.Array)
                        else pa.array(col, type=pa.string())
                    )
                else:
                    columns[name] = pa.nulls(n, pa.string())
        except (UnicodeEncodeError, pa.ArrowInvalid, pa.ArrowTypeError):
            return n, None, _mapping_rows(batch, names, n)
        return n, columns, ()
    raise TypeError(
        f"batch must be a pyarrow Table/RecordBatch or a mapping of columns, got {type(batch).__name__}"
    )


def _check_string(name: str, array: pa.Array) -> pa.Array:
    t = array.type
    if pa.types.is_dictionary(t):
        if not (pa.types.is_string(t.value_type) or pa.types.is_large_string(t.value_type)):
            raise TypeError(f"column {name!r} must hold strings, got {t}")
        return array
    if pa.types.is_string(t):
        return array
    if pa.types.is_large_string(t) or pa.types.is_string_view(t) or pa.types.is_null(t):
        return array.cast(pa.string())
    raise TypeError(f"column {name!r} must hold strings (property values are strings), got {t}")


def _mapping_rows(batch: Mapping[str, Sequence[Any]], names: Sequence[str], n: int) -> list[dict[str, Any]]:
    present = [name for name in names if name in batch]
    return [{name: batch[name][i] for name in present} for i in range(n)]


def _rows(columns: Mapping[str, pa.Array], n: int) -> list[dict[str, Any]]:
    lists = {name: col.cast(pa.string()).to_pylist() for name, col in columns.items()}
    return [{name: values[i] for name, values in lists.items()} for i in range(n)]
