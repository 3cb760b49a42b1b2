"""The SQL92 expression tree.

Nodes are frozen, slotted dataclasses. The parser builds them through the ``make_*`` functions
below, which apply RocketMQ's compile-time checks exactly where RocketMQ's factory methods do
(``ComparisonExpression.createEqual``, ``checkLessThanOperand``, ``createBetween`` …), so a tree
that exists is a tree RocketMQ would have compiled.

Desugaring happens here, once: ``<>`` is ``NOT (=)``, ``IS NOT NULL`` is ``NOT (IS NULL)``,
``BETWEEN`` is ``(x >= lo) AND (x <= hi)``, ``NOT BETWEEN`` is ``(x < lo) OR (x > hi)``, a bare
property used as a boolean is a :class:`BoolCast`, and chains of AND/OR become one n-ary node
(exact: Kleene AND/OR with left-to-right short-circuit are associative, errors included).
Backends never re-implement any of this.

The node classes themselves live in :mod:`siftmq.filter.nodes` (which the visitor builds on too)
and are re-exported here: callers import every tree name from this module.
"""

from __future__ import annotations

import math

from siftmq.errors import FilterTypeError
from siftmq.filter import javalang
from siftmq.filter.javalang import JType
from siftmq.filter.nodes import (
    BOOLEAN_NODES,
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
from siftmq.filter.visitor import ExprVisitor, visit

__all__ = [
    "BOOLEAN_NODES",
    "And",
    "BoolCast",
    "CmpOp",
    "Compare",
    "Equal",
    "In",
    "IsNull",
    "Literal",
    "MatchOp",
    "Negate",
    "Node",
    "Not",
    "Or",
    "Property",
    "StringMatch",
    "as_boolean",
    "children",
    "is_boolean",
    "make_and_n",
    "make_between",
    "make_compare",
    "make_equal",
    "make_in",
    "make_is_null",
    "make_match",
    "make_negate",
    "make_not",
    "make_not_equal",
    "make_or_n",
    "render",
    "render_literal",
]

# ------------------------------------------------------------------------------------------- factories


def _depth(*nodes: Node) -> int:
    return 1 + max(n.depth for n in nodes)


def _type_error(message: str, node: Node) -> FilterTypeError:
    return FilterTypeError(message, start=node.start, end=node.end)


def as_boolean(node: Node) -> Node:
    """RocketMQ's ``asBooleanExpression``: a property becomes a boolean cast; a non-boolean is rejected."""
    if isinstance(node, Property):
        return BoolCast(node, start=node.start, end=node.end, depth=node.depth + 1)
    if is_boolean(node):
        return node
    raise _type_error(f"expression will not result in a boolean value: {render(node)}", node)


def make_not(operand: Node, start: int) -> Not:
    operand = as_boolean(operand)
    return Not(operand, start=start, end=operand.end, depth=operand.depth + 1)


def make_negate(operand: Node, start: int) -> Negate:
    return Negate(operand, start=start, end=operand.end, depth=operand.depth + 1)


def make_and_n(operands: list[Node]) -> And:
    """``a AND b AND …``; nested ANDs are flattened into one node."""
    ops = tuple(op for node in operands for op in _flatten(as_boolean(node), And))
    return And(ops, start=ops[0].start, end=ops[-1].end, depth=_depth(*ops))


def make_or_n(operands: list[Node]) -> Or:
    """``a OR b OR …``; nested ORs are flattened into one node."""
    ops = tuple(op for node in operands for op in _flatten(as_boolean(node), Or))
    return Or(ops, start=ops[0].start, end=ops[-1].end, depth=_depth(*ops))


def _flatten(node: Node, kind: type[And] | type[Or]) -> tuple[Node, ...]:
    if isinstance(node, kind):
        return node.operands
    return (node,)


def _check_equal_operand(node: Node) -> None:
    if isinstance(node, Literal) and node.jtype is None:
        raise _type_error("NULL cannot be compared with '=' or '<>': use IS NULL or IS NOT NULL", node)


def make_equal(left: Node, right: Node) -> Equal:
    _check_equal_operand(left)
    _check_equal_operand(right)
    if (
        isinstance(left, Literal)
        and isinstance(right, Literal)
        and left.jtype is JType.BOOLEAN
        and right.jtype is not JType.BOOLEAN
    ):
        raise _type_error(f"'{render(left)}' cannot be compared with '{render(right)}'", left)
    return Equal(left, right, start=left.start, end=right.end, depth=_depth(left, right))


def make_not_equal(left: Node, right: Node) -> Not:
    eq = make_equal(left, right)
    return Not(eq, start=eq.start, end=eq.end, depth=eq.depth + 1)


def make_is_null(operand: Node, end: int, negated: bool) -> Node:
    node = IsNull(operand, start=operand.start, end=end, depth=operand.depth + 1)
    if negated:
        return Not(node, start=node.start, end=end, depth=node.depth + 1)
    return node


def _check_compare_operand(node: Node) -> None:
    if isinstance(node, Literal):
        if node.jtype in (JType.INTEGER, JType.LONG, JType.DOUBLE):
            return
        raise _type_error(
            f"value {render(node)} cannot be compared with '>', '>=', '<', '<=' or BETWEEN "
            "(only numbers can be ordered)",
            node,
        )
    if is_boolean(node):
        raise _type_error(
            f"value '{render(node)}' cannot be compared with '>', '>=', '<', '<=' or BETWEEN "
            "(it is a condition, not a value)",
            node,
        )


def make_compare(op: CmpOp, left: Node, right: Node) -> Compare:
    _check_compare_operand(left)
    _check_compare_operand(right)
    return Compare(op, left, right, start=left.start, end=right.end, depth=_depth(left, right))


def make_between(value: Node, low: Node, high: Node, negated: bool) -> Node:
    if negated:
        lt = make_compare(CmpOp.LT, value, low)
        gt = make_compare(CmpOp.GT, value, high)
        return Or((lt, gt), start=value.start, end=high.end, depth=_depth(lt, gt))
    if isinstance(low, Literal) and isinstance(high, Literal):
        if low.jtype is None or high.jtype is None:
            raise _type_error(
                "illegal BETWEEN bounds: a bound cannot be NULL", low if low.jtype is None else high
            )
        try:
            order = javalang.compare(high.value, low.value)
        except javalang.JavaEvaluationError as exc:
            raise _type_error(f"illegal BETWEEN bounds: {exc}", low) from None
        if order < 0:
            raise _type_error(
                f"illegal BETWEEN bounds: the lower bound ({render(low)}) must be less than or equal to "
                f"the upper bound ({render(high)})",
                low,
            )
    ge = make_compare(CmpOp.GE, value, low)
    le = make_compare(CmpOp.LE, value, high)
    return And((ge, le), start=value.start, end=high.end, depth=_depth(ge, le))


def make_in(operand: Node, items: tuple[str, ...], negated: bool, end: int) -> In:
    if not isinstance(operand, Property):
        raise _type_error(f"IN needs a property on its left, got: {render(operand)}", operand)
    return In(operand, items, negated, start=operand.start, end=end, depth=operand.depth + 1)


def make_match(op: MatchOp, operand: Node, pattern: str, negated: bool, end: int) -> StringMatch:
    return StringMatch(op, operand, pattern, negated, start=operand.start, end=end, depth=operand.depth + 1)


# ------------------------------------------------------------------------------------------ rendering


def render(node: Node) -> str:
    """The normalized SQL92 text of a tree; parsing it gives back an equal tree."""

    class _Render(ExprVisitor[str]):
        def visit_literal(self, node: Literal) -> str:
            return render_literal(node.value, node.jtype)

        def visit_property(self, node: Property) -> str:
            return node.name

        def visit_negate(self, node: Negate, operand: str) -> str:
            text = _wrap(node.operand, operand)
            return "- " + text if text.startswith("-") else "-" + text  # "--" would start a comment

        def visit_not(self, node: Not, operand: str) -> str:
            inner = node.operand
            if isinstance(inner, Equal):
                return f"{_wrap(inner.left, _sub(inner.left))} <> {_wrap(inner.right, _sub(inner.right))}"
            if isinstance(inner, IsNull):
                return f"{_wrap(inner.operand, _sub(inner.operand))} IS NOT NULL"
            return "NOT " + _wrap(inner, operand)

        def visit_bool_cast(self, node: BoolCast, operand: str) -> str:
            return operand

        def visit_and(self, node: And, operands: list[str]) -> str:
            return " AND ".join(_wrap(n, s) for n, s in zip(node.operands, operands, strict=True))

        def visit_or(self, node: Or, operands: list[str]) -> str:
            return " OR ".join(_wrap(n, s) for n, s in zip(node.operands, operands, strict=True))

        def visit_equal(self, node: Equal, left: str, right: str) -> str:
            return f"{_wrap(node.left, left)} = {_wrap(node.right, right)}"

        def visit_compare(self, node: Compare, left: str, right: str) -> str:
            return f"{_wrap(node.left, left)} {node.op.value} {_wrap(node.right, right)}"

        def visit_is_null(self, node: IsNull, operand: str) -> str:
            return f"{_wrap(node.operand, operand)} IS NULL"

        def visit_in(self, node: In, operand: str) -> str:
            items = ", ".join(render_literal(v, JType.STRING) for v in node.items)
            return f"{operand} {'NOT IN' if node.negated else 'IN'} ({items})"

        def visit_string_match(self, node: StringMatch, operand: str) -> str:
            op = ("NOT " if node.negated else "") + node.op.value
            return f"{_wrap(node.operand, operand)} {op} {render_literal(node.pattern, JType.STRING)}"

    renderer = _Render()
    cache: dict[int, str] = {}

    def _sub(n: Node) -> str:
        key = id(n)
        if key not in cache:
            cache[key] = visit(n, renderer)
        return cache[key]

    return visit(node, renderer)


def _wrap(node: Node, text: str) -> str:
    return text if _renders_unary(node) else f"({text})"


def _renders_unary(node: Node) -> bool:
    """Whether ``node`` renders as a unary expression, which needs no parentheses as an operand.
    Prefix chains stay unparenthesized (``NOT NOT a``, ``- -a``, ``NOT a = 'x'``): wrapping them
    would add nesting the source did not have, and a filter at the nesting bound would render as
    text the parser refuses (512 prefix operators as 1,024 levels)."""
    while isinstance(node, BoolCast):
        node = node.operand
    if isinstance(node, (Literal, Property, Negate)):
        return True
    return isinstance(node, Not) and not isinstance(node.operand, (Equal, IsNull))


def render_literal(value: object, jtype: JType | None) -> str:
    if jtype is None:
        return "NULL"
    if jtype is JType.BOOLEAN:
        return "TRUE" if value else "FALSE"
    if jtype is JType.STRING:
        assert isinstance(value, str)
        return "'" + value.replace("'", "''") + "'"
    if jtype is JType.DOUBLE:
        assert isinstance(value, float)
        text = repr(value)
        if math.isfinite(value) and ("." not in text and "e" not in text):
            text += ".0"
        return text
    return str(int(value))  # type: ignore[call-overload]
