"""The binding: shapes, properties and folded constants, worked out once for every backend.

The differential test is the point: the scalar closures built with the binding (its fast paths for
a property against any folded constant) must give exactly what the generic closures give, value or
error, on every generated expression and the nastiest property values.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from filter_corpus import FIXED_ROWS, REFERENCE_CASES, expressions, rows
from siftmq.errors import FilterError, FilterEvaluationError
from siftmq.filter import compile_filter
from siftmq.filter.bind import THROWS, Shape
from siftmq.filter.nodes import Compare, Equal, children
from siftmq.filter.scalar import ScalarCompiler, fold
from siftmq.filter.visitor import visit


def _comparisons(text: str) -> list[tuple[Shape, str, object]]:
    """The binding of every comparison, outermost first."""
    compiled = compile_filter("SQL92", text)
    assert compiled.bound is not None and compiled.tree is not None
    found = []
    todo = [compiled.tree]
    while todo:
        node = todo.pop()
        if isinstance(node, (Equal, Compare)):
            c = compiled.bound.comparison(node)
            found.append((c.shape, c.property, c.constant))
        todo.extend(children(node))
    return found


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("a = 'x'", (Shape.PROPERTY_CONSTANT, "a", "x")),
        ("3 < a", (Shape.CONSTANT_PROPERTY, "a", 3)),
        ("a > -5", (Shape.PROPERTY_CONSTANT, "a", -5)),  # a folded constant, not only a literal
        ("a = (1 = 1)", (Shape.PROPERTY_CONSTANT, "a", True)),
        ("a = (-'x' = 1)", (Shape.PROPERTY_CONSTANT, "a", None)),  # folds to NULL
        ("a < a", (Shape.SAME_PROPERTY, "a", None)),
        ("a = b", (Shape.PROPERTIES, "a", None)),
        ("-a = b", (Shape.OTHER, "", None)),
        ("a = ('x' = 1)", (Shape.OTHER, "", None)),  # the constant throws: no fast path takes it
    ],
)
def test_shapes(text: str, expected: tuple[Shape, str, object]) -> None:
    assert _comparisons(text)[0] == expected


def test_constants_are_folded_once_with_throws_kept() -> None:
    compiled = compile_filter("SQL92", "a = 'x' OR ('x' = 1) OR (2 > 1)")
    assert compiled.bound is not None
    assert sorted(map(repr, compiled.bound.constants.values())) == sorted([repr(THROWS), "True"])
    assert compiled.bound.properties == frozenset({"a"}) == compiled.properties


def _outcome(fn: Any, row: dict[str, str | None]) -> object:
    try:
        return fn(row)
    except FilterEvaluationError:
        return "throws"


def _same_as_generic(text: str, sample: list[dict[str, str | None]]) -> None:
    try:
        compiled = compile_filter("SQL92", text)
    except FilterError:
        return
    assert compiled.tree is not None and compiled.bound is not None
    generic = visit(compiled.tree, ScalarCompiler())
    bound = visit(compiled.tree, ScalarCompiler(compiled.bound))
    for row in sample:
        assert _outcome(bound, row) == _outcome(generic, row), (text, row)


def test_reference_expressions_bound_and_generic_agree() -> None:
    for text in sorted({c["expr"] for c in REFERENCE_CASES}):
        _same_as_generic(text, list(FIXED_ROWS))


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(expressions(), rows(max_size=10))
def test_generated_expressions_bound_and_generic_agree(
    text: str, sample: list[dict[str, str | None]]
) -> None:
    _same_as_generic(text, sample + FIXED_ROWS[::7])


@given(st.sampled_from(["-5", "(1 = 1)", "(-'x' = 1)", "'x'", "2147483648", "-0.0"]))
def test_fold_is_the_scalar_value(text: str) -> None:
    compiled = compile_filter("SQL92", f"a = {text}")
    assert compiled.tree is not None and isinstance(compiled.tree, Equal)
    _shape, _prop, constant = _comparisons(f"a = {text}")[0]
    assert repr(constant) == repr(fold(compiled.tree.right))
