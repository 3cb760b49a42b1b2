"""Per-row values and the per-filter plan.

Owns :class:`_Val` (a sub-expression's four-valued result: TRUE/FALSE masks, errors, or a
constant), :class:`_Plan` (built once per filter from its binding: costs, and which sub-trees
read one column and are worth evaluating on its dictionary).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from siftmq.filter.ast import (
    CmpOp,
    Compare,
    Equal,
    In,
    Literal,
    Negate,
    Node,
    StringMatch,
    children,
    is_boolean,
)
from siftmq.filter.backends.arrow.columns import _Column
from siftmq.filter.backends.arrow.kernels import _MATCH_COST, ENCODE_MIN_COST, Mask
from siftmq.filter.bind import BoundTree
from siftmq.filter.javalang import JType
from siftmq.filter.visitor import postorder

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


_HOLDS: Final[dict[CmpOp, Callable[[npt.NDArray[Any], Any], Mask]]] = {
    CmpOp.GT: np.greater,
    CmpOp.GE: np.greater_equal,
    CmpOp.LT: np.less,
    CmpOp.LE: np.less_equal,
}


class _Plan:
    """What a filter's tree needs for every batch, worked out once.

    ``props`` and ``constants`` are the binding's (:mod:`siftmq.filter.bind`: the properties each
    sub-tree reads; the folded value, or ``THROWS``, of every maximal property-free sub-tree);
    ``cost`` is each sub-tree's predicates' rough cost (see ``ENCODE_MIN_COST``).
    """

    def __init__(self, bound: BoundTree) -> None:
        self.bound = bound
        self.tree = bound.tree
        self.props = bound.props
        self.constants = bound.constants
        self.cost: dict[int, int] = {}

        def cost(node: Node, parts: list[int]) -> int:
            self.cost[id(node)] = total = _own_cost(node) + sum(parts)
            return total

        postorder(self.tree, children, cost, shared=True)

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
