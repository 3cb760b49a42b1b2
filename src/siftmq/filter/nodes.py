"""The node types of the SQL92 expression tree, and what every walker needs to know of them.

This module owns the node classes (frozen, slotted dataclasses), the :data:`Node` union, the
operator enums, :func:`is_boolean` and :func:`children`. It imports nothing else of the filter
package but :mod:`siftmq.filter.javalang`, so :mod:`siftmq.filter.visitor` and
:mod:`siftmq.filter.ast` (the factories with RocketMQ's compile-time checks, and rendering) can both
build on it without importing each other in a cycle. Everyone else imports these names through
:mod:`siftmq.filter.ast`.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeAlias

from siftmq.filter.javalang import JType


class CmpOp(enum.Enum):
    GT = ">"
    GE = ">="
    LT = "<"
    LE = "<="

    @property
    def mirrored(self) -> CmpOp:
        """The operator with its operands swapped: ``a < b`` is ``b > a``."""
        return _MIRRORED[self]

    def holds(self, cmp: int) -> bool:
        """Whether a comparator result (<0, 0, >0) satisfies the operator."""
        if self is CmpOp.GT:
            return cmp > 0
        if self is CmpOp.GE:
            return cmp >= 0
        if self is CmpOp.LT:
            return cmp < 0
        return cmp <= 0


_MIRRORED: dict[CmpOp, CmpOp] = {
    CmpOp.GT: CmpOp.LT,
    CmpOp.GE: CmpOp.LE,
    CmpOp.LT: CmpOp.GT,
    CmpOp.LE: CmpOp.GE,
}


class MatchOp(enum.Enum):
    CONTAINS = "CONTAINS"
    STARTSWITH = "STARTSWITH"
    ENDSWITH = "ENDSWITH"

    def holds(self, value: str, pattern: str) -> bool:
        """Whether ``value`` contains, starts with or ends with ``pattern`` (Java's String methods)."""
        if self is MatchOp.CONTAINS:
            return pattern in value
        if self is MatchOp.STARTSWITH:
            return value.startswith(pattern)
        return value.endswith(pattern)


@dataclass(frozen=True, slots=True)
class Literal:
    value: object  # int | float | str | bool | None, typed by ``jtype``
    jtype: JType | None  # None is the NULL literal
    start: int = field(default=0, compare=False)
    end: int = field(default=0, compare=False)
    depth: int = field(default=1, compare=False)


@dataclass(frozen=True, slots=True)
class Property:
    name: str
    start: int = field(default=0, compare=False)
    end: int = field(default=0, compare=False)
    depth: int = field(default=1, compare=False)


@dataclass(frozen=True, slots=True)
class Negate:
    operand: Node
    start: int = field(default=0, compare=False)
    end: int = field(default=0, compare=False)
    depth: int = field(default=1, compare=False)


@dataclass(frozen=True, slots=True)
class Not:
    operand: Node
    start: int = field(default=0, compare=False)
    end: int = field(default=0, compare=False)
    depth: int = field(default=1, compare=False)


@dataclass(frozen=True, slots=True)
class BoolCast:
    """A bare property used as a boolean: TRUE only for a real Boolean true, NULL when missing."""

    operand: Property
    start: int = field(default=0, compare=False)
    end: int = field(default=0, compare=False)
    depth: int = field(default=2, compare=False)


@dataclass(frozen=True, slots=True)
class And:
    operands: tuple[Node, ...]
    start: int = field(default=0, compare=False)
    end: int = field(default=0, compare=False)
    depth: int = field(default=1, compare=False)


@dataclass(frozen=True, slots=True)
class Or:
    operands: tuple[Node, ...]
    start: int = field(default=0, compare=False)
    end: int = field(default=0, compare=False)
    depth: int = field(default=1, compare=False)


@dataclass(frozen=True, slots=True)
class Equal:
    left: Node
    right: Node
    start: int = field(default=0, compare=False)
    end: int = field(default=0, compare=False)
    depth: int = field(default=1, compare=False)


@dataclass(frozen=True, slots=True)
class Compare:
    op: CmpOp
    left: Node
    right: Node
    start: int = field(default=0, compare=False)
    end: int = field(default=0, compare=False)
    depth: int = field(default=1, compare=False)


@dataclass(frozen=True, slots=True)
class IsNull:
    operand: Node
    start: int = field(default=0, compare=False)
    end: int = field(default=0, compare=False)
    depth: int = field(default=1, compare=False)


@dataclass(frozen=True, slots=True)
class In:
    operand: Property
    items: tuple[str, ...]  # in source order, duplicates kept (for rendering)
    negated: bool
    start: int = field(default=0, compare=False)
    end: int = field(default=0, compare=False)
    depth: int = field(default=2, compare=False)

    @property
    def values(self) -> frozenset[str]:
        return frozenset(self.items)


@dataclass(frozen=True, slots=True)
class StringMatch:
    op: MatchOp
    operand: Node
    pattern: str
    negated: bool
    start: int = field(default=0, compare=False)
    end: int = field(default=0, compare=False)
    depth: int = field(default=1, compare=False)


Node: TypeAlias = (
    Literal | Property | Negate | Not | BoolCast | And | Or | Equal | Compare | IsNull | In | StringMatch
)
BOOLEAN_NODES = (Not, BoolCast, And, Or, Equal, Compare, IsNull, In, StringMatch)


def is_boolean(node: Node) -> bool:
    """RocketMQ's ``instanceof BooleanExpression``: predicates and the TRUE/FALSE/NULL literals."""
    if isinstance(node, Literal):
        return node.jtype is None or node.jtype is JType.BOOLEAN
    return isinstance(node, BOOLEAN_NODES)


def children(node: Node) -> tuple[Node, ...]:
    return _CHILDREN[type(node)](node)


_CHILDREN: dict[type, Callable[[Any], tuple[Node, ...]]] = {
    Literal: lambda n: (),
    Property: lambda n: (),
    And: lambda n: n.operands,
    Or: lambda n: n.operands,
    Equal: lambda n: (n.left, n.right),
    Compare: lambda n: (n.left, n.right),
    Negate: lambda n: (n.operand,),
    Not: lambda n: (n.operand,),
    BoolCast: lambda n: (n.operand,),
    IsNull: lambda n: (n.operand,),
    In: lambda n: (n.operand,),
    StringMatch: lambda n: (n.operand,),
}
