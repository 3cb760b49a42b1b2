"""One visitor interface for every backend, and a post-order walk that needs no recursion.

Each backend (scalar compiler, Arrow evaluator, Spark SQL translator, renderer) subclasses
:class:`ExprVisitor`; a new node kind means a new abstract method, so every backend must handle it.
:func:`visit` walks the tree with an explicit stack and hands each method its children's results,
so deep trees never hit Python's recursion limit here.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Generic, TypeVar

from siftmq.filter.ast import (
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
    results: list[T] = []
    stack: list[tuple[Node, bool]] = [(root, False)]
    while stack:
        node, expanded = stack.pop()
        kids = children(node)
        if not expanded and kids:
            stack.append((node, True))
            stack.extend((child, False) for child in reversed(kids))
            continue
        n = len(kids)
        args = results[len(results) - n :] if n else []
        if n:
            del results[len(results) - n :]
        results.append(_dispatch(node, visitor, args))
    return results[0]


def _dispatch(node: Node, v: ExprVisitor[T], args: list[T]) -> T:
    if isinstance(node, Literal):
        return v.visit_literal(node)
    if isinstance(node, Property):
        return v.visit_property(node)
    if isinstance(node, Negate):
        return v.visit_negate(node, args[0])
    if isinstance(node, Not):
        return v.visit_not(node, args[0])
    if isinstance(node, BoolCast):
        return v.visit_bool_cast(node, args[0])
    if isinstance(node, And):
        return v.visit_and(node, args)
    if isinstance(node, Or):
        return v.visit_or(node, args)
    if isinstance(node, Equal):
        return v.visit_equal(node, args[0], args[1])
    if isinstance(node, Compare):
        return v.visit_compare(node, args[0], args[1])
    if isinstance(node, IsNull):
        return v.visit_is_null(node, args[0])
    if isinstance(node, In):
        return v.visit_in(node, args[0])
    return v.visit_string_match(node, args[0])
