"""Binding: one pass over a SQL92 tree that answers, once, what every backend asks of its shape.

The scalar, Arrow and Spark backends evaluate the same tree in three media (closures, column masks,
Spark SQL), and each needs the same facts about it to pick its fast paths. They are worked out here:

* **properties**: which properties each sub-tree reads. One that reads none is a constant; one
  that reads exactly one can be evaluated once per distinct value of that column.
* **constants**: the value of every maximal sub-tree that reads no property (other than a bare
  literal), folded with the scalar backend's semantics — or :data:`THROWS` where RocketMQ's
  evaluator throws, so a backend keeps the error where it belongs.
* **comparisons**: the shape of every ``=``/``<>`` and ``<``/``<=``/``>``/``>=``: a property
  against a constant (and on which side: the sides are not symmetric for NULLs), a property
  against itself, two properties, or anything else.

Java's value semantics themselves (coercions, the double grammar, three-valued logic) are not
here but in :mod:`siftmq.filter.javalang`; binding only says which of its cases a node is.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from siftmq.errors import FilterEvaluationError
from siftmq.filter.nodes import Compare, Equal, Literal, Node, Property, children
from siftmq.filter.visitor import postorder


class _Throws:
    __slots__ = ()

    def __repr__(self) -> str:
        return "THROWS"


#: The folded value of a constant sub-tree whose evaluation throws.
THROWS: Final = _Throws()


class Shape(enum.Enum):
    """The operands of a comparison."""

    PROPERTY_CONSTANT = "property, constant"
    CONSTANT_PROPERTY = "constant, property"
    SAME_PROPERTY = "a property with itself"
    PROPERTIES = "two properties"
    OTHER = "other"


@dataclass(frozen=True, slots=True)
class Comparison:
    """A bound ``=``/``<>``/``<``... node: its :class:`Shape`, the property (the left one for
    ``PROPERTIES``) and, for the constant shapes, the constant's value (None: NULL)."""

    shape: Shape
    property: str = ""
    constant: object = None


_OTHER: Final = Comparison(Shape.OTHER)


@dataclass(frozen=True, slots=True)
class BoundTree:
    """A SQL92 tree with its facts (every map is keyed by ``id(node)``; the tree keeps the nodes alive)."""

    tree: Node
    props: dict[int, frozenset[str]]
    constants: dict[int, object]
    comparisons: dict[int, Comparison]

    @property
    def properties(self) -> frozenset[str]:
        """Every property the filter reads."""
        return self.props[id(self.tree)]

    def comparison(self, node: Node) -> Comparison:
        return self.comparisons.get(id(node), _OTHER)


def bind(tree: Node, fold: Callable[[Node], object]) -> BoundTree:
    """Bind ``tree``; ``fold(node)`` evaluates a property-free sub-tree (raising where it throws)."""
    props: dict[int, frozenset[str]] = {}

    def reads(node: Node, parts: list[frozenset[str]]) -> frozenset[str]:
        found = frozenset((node.name,)) if isinstance(node, Property) else frozenset()
        props[id(node)] = found = found.union(*parts)
        return found

    postorder(tree, children, reads, shared=True)
    constants: dict[int, object] = {}
    comparisons: dict[int, Comparison] = {}
    todo = [tree]
    while todo:
        node = todo.pop()
        if not props[id(node)]:
            if not isinstance(node, Literal) and id(node) not in constants:
                constants[id(node)] = _fold(fold, node)
            continue
        if isinstance(node, (Equal, Compare)):
            comparisons[id(node)] = _comparison(node, constants, props, fold)
        todo.extend(children(node))
    return BoundTree(tree, props, constants, comparisons)


def _fold(fold: Callable[[Node], object], node: Node) -> object:
    try:
        return fold(node)
    except FilterEvaluationError:
        return THROWS


def _comparison(
    node: Equal | Compare,
    constants: dict[int, object],
    props: dict[int, frozenset[str]],
    fold: Callable[[Node], object],
) -> Comparison:
    left, right = node.left, node.right
    if isinstance(left, Property) and isinstance(right, Property):
        shape = Shape.SAME_PROPERTY if left.name == right.name else Shape.PROPERTIES
        return Comparison(shape, left.name)
    sides = ((left, right, Shape.PROPERTY_CONSTANT), (right, left, Shape.CONSTANT_PROPERTY))
    for prop, other, shape in sides:
        if isinstance(prop, Property) and not props[id(other)]:
            value = _constant_value(other, constants, fold)
            if value is THROWS:
                return _OTHER
            return Comparison(shape, prop.name, value)
    return _OTHER


def _constant_value(node: Node, constants: dict[int, object], fold: Callable[[Node], object]) -> object:
    if isinstance(node, Literal):
        return node.value
    if id(node) not in constants:
        constants[id(node)] = _fold(fold, node)
    return constants[id(node)]
