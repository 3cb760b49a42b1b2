"""The visitor that evaluates a SQL92 tree over the columns of one batch.

Owns :class:`_Evaluator`: one method per node kind, with RocketMQ's error propagation (AND/OR
short-circuit, relational operators skipping their right side after a NULL left), the string
fast paths and evaluation on a column's dictionary.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from siftmq.errors import UnsupportedFilterError
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
from siftmq.filter.backends.arrow.columns import _Column
from siftmq.filter.backends.arrow.kernels import Mask, _bool_numpy, _double_key, _sign
from siftmq.filter.backends.arrow.plan import _HOLDS, _bool, _Plan, _Val
from siftmq.filter.bind import THROWS, Shape
from siftmq.filter.javalang import JType
from siftmq.filter.visitor import ExprVisitor, dispatch


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
        if value is THROWS:
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
        fast = self._column_constant_equal(node, left, right)
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
        fast = self._column_constant_compare(node, left, right)
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

    def _column_and_constant(
        self, node: Equal | Compare, left: _Val, right: _Val
    ) -> tuple[_Column, Any, bool] | None:
        """(column, constant, constant-is-on-the-left) for a property against a non-null constant."""
        c = self.plan.bound.comparison(node)
        if c.constant is None:
            return None
        if c.shape is Shape.PROPERTY_CONSTANT:
            assert left.column is not None
            return left.column, c.constant, False
        if c.shape is Shape.CONSTANT_PROPERTY:
            assert right.column is not None
            return right.column, c.constant, True
        return None

    def _column_constant_equal(self, node: Equal, left: _Val, right: _Val) -> _Val | None:
        """``column = constant`` or ``constant = column`` for a string or number constant."""
        pair = self._column_and_constant(node, left, right)
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

    def _column_constant_compare(self, node: Compare, left: _Val, right: _Val) -> _Val | None:
        """``column <op> number`` or ``number <op> column``: NULL on a null row, else the comparison."""
        op = node.op
        pair = self._column_and_constant(node, left, right)
        if pair is None:
            return None
        column, const, flipped = pair
        if javalang.java_type(const) not in (JType.INTEGER, JType.LONG, JType.DOUBLE):
            return None
        values, err, key = _numeric(column, const)
        holds = _HOLDS[op.mirrored if flipped else op](values, key)
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
