"""One visitor interface for every backend, and a post-order walk that needs no recursion.

Each backend (scalar compiler, Arrow evaluator, Spark SQL translator, renderer) subclasses
:class:`ExprVisitor`; a new node kind means a new abstract method, so every backend must handle it.
:func:`visit` walks the tree with an explicit stack and hands each method its children's results,
so deep trees never hit Python's recursion limit here.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import Any, Generic, TypeVar

from siftmq.filter.nodes import (
    And,
    BoolCast,
    Compare,
    Equal,
    In,
    IsNull,
    Literal,
    Negate,
    Node,
    Not,
    Or,
    Property,
    StringMatch,
    children,
)

T = TypeVar("T")


class ExprVisitor(ABC, Generic[T]):
    @abstractmethod
    def visit_literal(self, node: Literal) -> T: ...

    @abstractmethod
    def visit_property(self, node: Property) -> T: ...

    @abstractmethod
    def visit_negate(self, node: Negate, operand: T) -> T: ...

    @abstractmethod
    def visit_not(self, node: Not, operand: T) -> T: ...

    @abstractmethod
    def visit_bool_cast(self, node: BoolCast, operand: T) -> T: ...

    @abstractmethod
    def visit_and(self, node: And, operands: list[T]) -> T: ...

    @abstractmethod
    def visit_or(self, node: Or, operands: list[T]) -> T: ...

    @abstractmethod
    def visit_equal(self, node: Equal, left: T, right: T) -> T: ...

    @abstractmethod
    def visit_compare(self, node: Compare, left: T, right: T) -> T: ...

    @abstractmethod
    def visit_is_null(self, node: IsNull, operand: T) -> T: ...

    @abstractmethod
    def visit_in(self, node: In, operand: T) -> T: ...

    @abstractmethod
    def visit_string_match(self, node: StringMatch, operand: T) -> T: ...


def visit(root: Node, visitor: ExprVisitor[T]) -> T:
    """Post-order walk of ``root``; each node's method receives its children's results."""

    def build(node: Node, args: list[T]) -> T:
        result: T = dispatch(node, visitor, args)
        return result

    return postorder(root, children, build)


N = TypeVar("N")
R = TypeVar("R")


def postorder(
    root: N,
    parts: Callable[[N], Sequence[N]],
    build: Callable[[N, list[R]], R],
    *,
    direct: Callable[[N], R | None] | None = None,
    shared: bool = False,
) -> R:
    """Post-order walk with an explicit stack (trees nest hundreds of levels): ``build`` gets each
    node and its parts' results. ``direct`` may give a node's result without walking its parts;
    with ``shared`` a node met again (a tree sharing sub-expressions) reuses its result."""
    done: dict[int, R] = {}
    results: list[R] = []
    stack: list[tuple[N, bool]] = [(root, False)]
    while stack:
        node, expanded = stack.pop()
        if not expanded and (shared or direct is not None):
            hit = done.get(id(node)) if shared else None
            if hit is None and direct is not None:
                hit = direct(node)
            if hit is not None:
                if shared:
                    done[id(node)] = hit
                results.append(hit)
                continue
        kids = parts(node)
        if not expanded and kids:
            stack.append((node, True))
            stack.extend((child, False) for child in reversed(kids))
            continue
        n = len(kids)
        args = results[len(results) - n :] if n else []
        if n:
            del results[len(results) - n :]
        result = build(node, args)
        if shared:
            done[id(node)] = result
        results.append(result)
    return results[0]


_DISPATCH: dict[type, Callable[[Any, Any, list[Any]], Any]] = {
    Literal: lambda v, n, a: v.visit_literal(n),
    Property: lambda v, n, a: v.visit_property(n),
    Negate: lambda v, n, a: v.visit_negate(n, a[0]),
    Not: lambda v, n, a: v.visit_not(n, a[0]),
    BoolCast: lambda v, n, a: v.visit_bool_cast(n, a[0]),
    And: lambda v, n, a: v.visit_and(n, a),
    Or: lambda v, n, a: v.visit_or(n, a),
    Equal: lambda v, n, a: v.visit_equal(n, a[0], a[1]),
    Compare: lambda v, n, a: v.visit_compare(n, a[0], a[1]),
    IsNull: lambda v, n, a: v.visit_is_null(n, a[0]),
    In: lambda v, n, a: v.visit_in(n, a[0]),
    StringMatch: lambda v, n, a: v.visit_string_match(n, a[0]),
}


def dispatch(node: Node, v: ExprVisitor[T], args: list[T]) -> T:
    """Call ``v``'s method for ``node`` with its children's results ``args`` (one step of a visit)."""
    result: T = _DISPATCH[type(node)](v, node, args)
    return result
