"""The Spark backend's own expression tree: the nodes the translator writes, and walking them.

Owns the node classes (``_Lit``, ``_Ref``, ``_Item``, ``_Call``, ``_Binary``, ``_Junction``, ``_Not``,
``_IsNull``, ``_Case``, ``_TryCast``, ``_In``; their union ``_X``), ``_parts``/``_walk`` (a post-order
walk without recursion), and the backend's limits (``BACKEND``, ``MAX_NESTING``). Rendering the
tree is :mod:`.render`; this module imports no pyspark.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Final, TypeAlias, TypeVar

from siftmq.filter.visitor import postorder

BACKEND: Final = "spark"
R = TypeVar("R")
# Spark overflows its stack on deeply nested expressions: its SQL parser, and its conversion of a
# Column to an expression. The shapes this backend writes went through both up to 264-300 levels
# (measured on Spark 4.3, JDK 17, by the backend's own nesting count, render._depth): keep a margin.
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
