"""Hypothesis: random expressions and messages; every backend gives the same decision.

The scalar evaluator is checked against RocketMQ's reference cases; here the vectorized backend
must agree with it row for row, whatever the expression and the property values, and rendering a
tree must parse back to the same tree.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import filter_corpus
from filter_corpus import PROPS
from siftmq.filter import FilterError, compile_filter
from siftmq.filter.parser import parse

expressions = filter_corpus.expressions(max_leaves=12)
rows = filter_corpus.rows()


def _compiled(text: str) -> Any:
    try:
        return compile_filter("SQL92", text)
    except FilterError:
        assume(False)
        raise


@settings(
    max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much]
)
@given(expressions, rows, st.booleans())
def test_batch_equals_scalar(text: str, batch_rows: list[dict[str, str | None]], dictionary: bool) -> None:
    compiled = _compiled(text)
    want = [compiled.matches(row) for row in batch_rows]
    columns = {p: pa.array([row[p] for row in batch_rows], type=pa.string()) for p in PROPS}
    if dictionary:
        columns = {p: col.dictionary_encode() for p, col in columns.items()}
    assert list(compiled.matches_batch(pa.table(columns))) == want


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])
@given(expressions)
def test_render_round_trips(text: str) -> None:
    compiled = _compiled(text)
    tree = compiled.tree
    assert parse(compiled.normalized) == tree


@settings(max_examples=1500, deadline=None)
@given(
    st.lists(
        st.sampled_from(
            [*"ab ()'=<>!-+.,*/\n", "AND", "OR", "NOT", "IN", "1", "0.5", "IS", "NULL", "BETWEEN", "--", "/*"]
        ),
        max_size=30,
    ).map(" ".join)
)
def test_random_text_only_raises_filter_errors(text: str) -> None:
    try:
        compiled = compile_filter("SQL92", text)
    except FilterError:
        return
    compiled.matches({"a": "1", "b": "x"})


@settings(max_examples=500, deadline=None)
@given(st.text(max_size=80))
def test_arbitrary_unicode_only_raises_filter_errors(text: str) -> None:
    for kind in ("SQL92", "TAG"):
        try:
            compile_filter(kind, text)
        except FilterError:
            pass
