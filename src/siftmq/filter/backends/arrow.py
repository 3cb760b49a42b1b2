"""Vectorized backend: evaluates a compiled filter over a whole batch with pyarrow compute and numpy.

In a batch every property is a string or absent (what a broker sees), so the type of every
sub-expression is known before looking at a row: a property is a String column, a predicate a
boolean column, a literal (or any sub-tree without properties) a constant. The Java coercions of
RocketMQ's evaluator become column kernels:

* ``Integer.valueOf``/``Long.valueOf`` — an ASCII regex check plus a cast; rows with non-ASCII text
  (Unicode digits, which Java accepts) or more than 18 digits are decided exactly, one by one, by
  :mod:`siftmq.filter.javalang`;
* ``Double.valueOf`` — Java's trim, its grammar as a regex, a cast (hex floats decided one by one);
  ``Double.compare`` order (NaN above all, -0.0 < 0.0) through total-order integer keys;
* ``Boolean.valueOf`` — ASCII lower-case equals ``true``.

Four-valued logic per row: TRUE, FALSE, NULL, or *error* (RocketMQ threw). Errors propagate exactly
as exceptions do in RocketMQ's evaluator: AND skips its right side after a FALSE, OR after a TRUE,
relational operators skip their right side after a NULL left, IS NULL does not catch. A row matches
only when the result is TRUE with no error.

Columns that need numeric parsing are dictionary-encoded when their cardinality is low, and parsed
once per distinct value. A filter this backend cannot express exactly (a pattern with a lone
surrogate) raises :class:`~siftmq.errors.UnsupportedFilterError`; ``matches`` then falls back to
the scalar evaluator for that batch.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

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
)
from siftmq.filter.javalang import INT_MAX, INT_MIN, LONG_MAX, LONG_MIN, JType
from siftmq.filter.visitor import ExprVisitor, visit

if TYPE_CHECKING:
    from siftmq.filter.compiler import CompiledFilter

Mask = npt.NDArray[np.bool_]

DICTIONARY_MIN_ROWS: Final = 2048
DICTIONARY_SAMPLE: Final = 1024
DICTIONARY_MAX_RATIO: Final = 0.3

_INTEGRAL_RE: Final = r"^[+-]?[0-9]{1,18}$"
_JAVA_TRIM: Final = "".join(chr(c) for c in range(0x21))
_DECIMAL_RE: Final = r"^[+-]?(?:NaN|Infinity|(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?[fFdD]?)$"
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
    """One string column of the batch, with its Java parses computed once and cached."""

    def __init__(self, array: pa.Array, n: int) -> None:
        self.n = n
        if pa.types.is_dictionary(array.type):
            self.dictionary: pa.Array | None = array.dictionary.cast(pa.string())
            self.indices: npt.NDArray[np.int64] | None = _dict_indices(array)
            self.array: pa.Array = array
        else:
            self.array = array.cast(pa.string()) if array.type != pa.string() else array
            self.dictionary = None
            self.indices = None
        self.valid: Mask = _valid_mask(self.array, n)
        self._cache: dict[str, Any] = {}

    def _values(self) -> tuple[pa.Array, Callable[[npt.NDArray[Any]], npt.NDArray[Any]]]:
        """The array to parse (the dictionary when there is one) and how to map results to rows."""
        if self.dictionary is None and self.n >= DICTIONARY_MIN_ROWS and self._low_cardinality():
            encoded = pc.dictionary_encode(self.array)
            self.dictionary = encoded.dictionary
            self.indices = _dict_indices(encoded)
        if self.dictionary is not None:
            indices = self.indices
            assert indices is not None
            return self.dictionary, lambda values: values[indices]
        n = self.n
        return self.array, lambda values: values[:n]

    def _low_cardinality(self) -> bool:
        sample = self.array.slice(0, DICTIONARY_SAMPLE)
        distinct = pc.count_distinct(sample, mode="all").as_py()
        return bool(distinct <= DICTIONARY_MAX_RATIO * len(sample))

    def plain(self) -> pa.Array:
        """The column as a plain string array."""
        if pa.types.is_dictionary(self.array.type):
            if "plain" not in self._cache:
                self._cache["plain"] = self.array.cast(pa.string())
            return self._cache["plain"]
        return self.array

    def parsed(self, how: str) -> tuple[npt.NDArray[Any], Mask]:
        """``(values, error)`` per row for ``how`` in int / long / double-keys / boolean."""
        hit = self._cache.get(how)
        if hit is None:
            array, to_rows = self._values()
            values: npt.NDArray[Any]
            errors: Mask
            if how == "boolean":
                values, errors = _parse_boolean(array), np.zeros(len(array) + 1, dtype=np.bool_)
            elif how == "double":
                values, errors = _parse_double_keys(array)
            else:
                lo, hi = (INT_MIN, INT_MAX) if how == "int" else (LONG_MIN, LONG_MAX)
                values, errors = _parse_integral(array, lo, hi)
            hit = (to_rows(values), to_rows(errors) & self.valid)
            self._cache[how] = hit
        return hit


def _dict_indices(array: pa.Array) -> npt.NDArray[np.int64]:
    # null rows point one past the dictionary, where every parse result array has a padding slot
    indices = pc.fill_null(array.indices, len(array.dictionary))
    return np.asarray(indices.to_numpy(zero_copy_only=False), dtype=np.int64)


def _valid_mask(array: pa.Array, n: int) -> Mask:
    if array.null_count == 0:
        return np.ones(n, dtype=np.bool_)
    return np.asarray(array.is_valid().to_numpy(zero_copy_only=False), dtype=np.bool_)


def _bool_numpy(array: pa.Array) -> Mask:
    return np.asarray(pc.fill_null(array, False).to_numpy(zero_copy_only=False), dtype=np.bool_)


def _padded(values: npt.NDArray[Any]) -> npt.NDArray[Any]:
    """Append one slot (for null rows of a dictionary column)."""
    return np.concatenate([values, np.zeros(1, dtype=values.dtype)])


def _parse_boolean(array: pa.Array) -> Mask:
    lowered = pc.ascii_lower(array)
    return _padded(_bool_numpy(pc.equal(lowered, "true")))


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
        values = np.array(pc.fill_null(cast, 0).to_numpy(zero_copy_only=False), dtype=np.int64)
        errors = valid & ((values < lo) | (values > hi))
        hex_rows = np.flatnonzero(valid & _bool_numpy(pc.match_substring(array, "x", ignore_case=True)))
        if hex_rows.size:
            _exact_rows(array, hex_rows, parse, values, errors)
        return _padded(values), _padded(errors)
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
    return _padded(values), _padded(errors)


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
        doubles = np.array(pc.fill_null(cast, 0.0).to_numpy(zero_copy_only=False), dtype=np.float64)
        keys = _double_keys(doubles)
        errors = np.zeros(n, dtype=np.bool_)
        special = np.flatnonzero(valid & ~np.isfinite(doubles))
        if special.size:
            _exact_rows(array, special, exact, keys, errors)
        return _padded(keys), _padded(errors)
    trimmed = pc.utf8_trim(array, characters=_JAVA_TRIM)
    decimal = _bool_numpy(pc.match_substring_regex(trimmed, _DECIMAL_RE))
    cleaned = pc.if_else(pa.array(decimal), pc.replace_substring_regex(trimmed, "[fFdD]$", ""), "0")
    doubles = np.array(pc.cast(cleaned, pa.float64()).to_numpy(zero_copy_only=False), dtype=np.float64)
    keys = _double_keys(doubles)
    errors = valid & ~decimal
    hex_rows = np.flatnonzero(valid & _bool_numpy(pc.match_substring_regex(trimmed, _HEX_RE)))
    if hex_rows.size:
        _exact_rows(array, hex_rows, exact, keys, errors)
    return _padded(keys), _padded(errors)


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


class _Evaluator(ExprVisitor[_Val]):
    def __init__(self, columns: Mapping[str, _Column], n: int, constants: Mapping[int, _Val]) -> None:
        self.columns = columns
        self.n = n
        self.constants = constants
        self.none: Mask = np.zeros(n, dtype=np.bool_)

    def _const(self, node: Node) -> _Val | None:
        return self.constants.get(id(node))

    def visit_literal(self, node: Literal) -> _Val:
        return _Val("const", self.none, const=node.value)

    def visit_property(self, node: Property) -> _Val:
        return _Val("str", self.none, column=self.columns[node.name])

    def visit_negate(self, node: Negate, operand: _Val) -> _Val:
        return self._const(node) or _Val("null", operand.e)

    def visit_not(self, node: Not, operand: _Val) -> _Val:
        const = self._const(node)
        if const is not None:
            return const
        t, f = operand.masks(self.n)
        return _bool(f, t, operand.e)

    def visit_bool_cast(self, node: BoolCast, operand: _Val) -> _Val:
        # a string is never a java.lang.Boolean: FALSE when present, NULL when absent
        return _bool(self.none, operand.nonnull(self.n), operand.e)

    def visit_and(self, node: And, operands: list[_Val]) -> _Val:
        const = self._const(node)
        if const is not None:
            return const
        acc = operands[0]
        t, f = acc.masks(self.n)
        e = acc.e
        for op in operands[1:]:
            rt, rf = op.masks(self.n)
            e = e | (~f & op.e)
            t, f = t & rt, f | rf
        return _bool(t, f, e)

    def visit_or(self, node: Or, operands: list[_Val]) -> _Val:
        const = self._const(node)
        if const is not None:
            return const
        acc = operands[0]
        t, f = acc.masks(self.n)
        e = acc.e
        for op in operands[1:]:
            rt, rf = op.masks(self.n)
            e = e | (~t & op.e)
            t, f = t | rt, f & rf
        return _bool(t, f, e)

    def visit_equal(self, node: Equal, left: _Val, right: _Val) -> _Val:
        const = self._const(node)
        if const is not None:
            return const
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
        const = self._const(node)
        if const is not None:
            return const
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
        const = self._const(node)
        if const is not None:
            return const
        nn = operand.nonnull(self.n)
        return _bool(~nn, nn, operand.e)

    def visit_in(self, node: In, operand: _Val) -> _Val:
        column = operand.column
        assert column is not None
        hit = _bool_numpy(pc.is_in(column.plain(), value_set=pa.array(list(node.values), type=pa.string())))
        valid = column.valid
        if node.negated:
            hit = ~hit
        return _bool(valid & hit, valid & ~hit, self.none)

    def visit_string_match(self, node: StringMatch, operand: _Val) -> _Val:
        const = self._const(node)
        if const is not None:
            return const
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
            same = _bool_numpy(pc.equal(column.plain(), const))
            return (~same).astype(np.int8), no_err
        if jt is JType.BOOLEAN:
            if flip:
                return np.zeros(n, dtype=np.int8), ~no_err
            values, _ = column.parsed("boolean")
            sign = values.astype(np.int8) - np.int8(const)
            return sign, no_err
        if jt is JType.DOUBLE:
            values, err = column.parsed("double")
            key = _double_key(const)
            sign = _sign(values, key)
        else:
            values, err = column.parsed("int" if jt is JType.INTEGER else "long")
            sign = _sign(values, const)
        return (-sign if flip else sign), err


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

    def __init__(self, compiled: CompiledFilter) -> None:
        self.compiled = compiled
        self.tree = compiled.tree
        self.properties = sorted(compiled.properties)
        self._constant_nodes: list[Node] = _constant_subtrees(self.tree) if self.tree is not None else []

    def matches(self, batch: Any) -> npt.NDArray[np.bool_]:
        n, columns, raw = _normalize(batch, self.properties)
        if n == 0:
            return np.zeros(0, dtype=np.bool_)
        if columns is None:
            return self._scalar(raw, n)
        if self.tree is None:
            return self._match_tags(columns["TAGS"], n)
        try:
            return self._evaluate({name: _Column(col, n) for name, col in columns.items()}, n)
        except UnsupportedFilterError:
            return self._scalar(_rows(columns, n), n)

    def _match_tags(self, array: pa.Array, n: int) -> npt.NDArray[np.bool_]:
        tag_filter = self.compiled.tag_filter
        assert tag_filter is not None
        if tag_filter.sub_all:
            return np.ones(n, dtype=np.bool_)
        plain = array.cast(pa.string())
        return _bool_numpy(pc.is_in(plain, value_set=pa.array(sorted(tag_filter.tags), type=pa.string())))

    def _evaluate(self, columns: dict[str, _Column], n: int) -> npt.NDArray[np.bool_]:
        assert self.tree is not None
        constants: dict[int, _Val] = {}
        for node in self._constant_nodes:
            constants[id(node)] = _constant(node, n)
        result = visit(self.tree, _Evaluator(columns, n, constants))
        t, _ = result.masks(n)
        return np.asarray(t & ~result.e, dtype=np.bool_)

    def _scalar(self, rows: Sequence[Mapping[str, Any]], n: int) -> npt.NDArray[np.bool_]:
        match = self.compiled.matches
        return np.fromiter((match(row) for row in rows), dtype=np.bool_, count=n)


def _constant_subtrees(tree: Node) -> list[Node]:
    """The maximal sub-trees that reference no property (evaluated once per batch)."""
    has_prop: dict[int, bool] = {}
    order: list[Node] = []
    stack: list[tuple[Node, bool]] = [(tree, False)]
    while stack:
        node, done = stack.pop()
        if done:
            has_prop[id(node)] = isinstance(node, Property) or any(has_prop[id(c)] for c in children(node))
            order.append(node)
            continue
        stack.append((node, True))
        stack.extend((c, False) for c in children(node))
    constant: list[Node] = []
    stack2 = [tree]
    while stack2:
        node = stack2.pop()
        if not has_prop[id(node)] and not isinstance(node, Literal):
            constant.append(node)
            continue
        stack2.extend(children(node))
    return constant


def _constant(node: Node, n: int) -> _Val:
    from siftmq.filter.scalar import ScalarCompiler

    fn = visit(node, ScalarCompiler())
    try:
        value = fn({})
    except FilterEvaluationError:
        return _Val("const", np.ones(n, dtype=np.bool_), const=None)
    none = np.zeros(n, dtype=np.bool_)
    if value is True or value is False:
        return _bool(np.full(n, value), np.full(n, not value), none)
    return _Val("const", none, const=value)


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
