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

from siftmq.filter import FilterError, compile_filter
from siftmq.filter.parser import parse

PROPS = ["a", "b", "c"]
VALUES = [
    None,
    "3",
    "3.0",
    " 3",
    "+3",
    "-3",
    "-0",
    "-0.0",
    "0.0",
    "0",
    "007",
    "NaN",
    "-NaN",
    "Infinity",
    "-Infinity",
    "inf",
    "1e2",
    "1E+2",
    ".5",
    "5.",
    "0x1p3",
    "0X1.8P1",
    "3d",
    "3f",
    "true",
    "TRUE",
    "tRuE",
    "yes",
    "false",
    "",
    "x",
    "abc",
    "ab",
    "%",
    "٣",
    "３",
    "2147483647",
    "2147483648",
    "-2147483649",
    "9223372036854775807",
    "9223372036854775808",
    "99999999999999999999",
    "1_000",
    "\u00a03",
    "\t3\n",
    "中文",
    "😀x",
]
NUMBERS = [
    "0",
    "1",
    "3",
    "100",
    "5L",
    "2147483647",
    "2147483648",
    "9223372036854775807",
    "0.5",
    "3.0",
    "1e2",
    ".5",
    "0.0",
    "1.7976931348623157e308",
    "4.9e-324",
]
STRINGS = ["'x'", "'3'", "'true'", "''", "'abc'", "'it''s'", "'3.0'", "'٣'", "'😀'"]

atom_value = st.one_of(
    st.sampled_from(PROPS),
    st.sampled_from(NUMBERS),
    st.sampled_from(NUMBERS).map(lambda n: "-" + n),
    st.sampled_from(STRINGS),
    st.sampled_from(["TRUE", "FALSE", "NULL"]),
    st.sampled_from(PROPS).map(lambda p: "-" + p),
)


def _predicates(inner: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    value = st.one_of(atom_value, inner.map(lambda s: f"({s})"))
    rel = st.sampled_from(["=", "<>", ">", ">=", "<", "<="])
    return st.one_of(
        st.tuples(value, rel, value).map(lambda t: f"{t[0]} {t[1]} {t[2]}"),
        st.tuples(value, st.sampled_from(["", "NOT "]), value, value).map(
            lambda t: f"{t[0]} {t[1]}BETWEEN {t[2]} AND {t[3]}"
        ),
        st.tuples(
            st.sampled_from(PROPS),
            st.sampled_from(["IN", "NOT IN"]),
            st.lists(st.sampled_from(STRINGS), min_size=1),
        ).map(lambda t: f"{t[0]} {t[1]} ({', '.join(t[2])})"),
        st.tuples(
            value,
            st.sampled_from(["", "NOT "]),
            st.sampled_from(["CONTAINS", "STARTSWITH", "ENDSWITH"]),
            st.sampled_from(STRINGS),
        ).map(lambda t: f"{t[0]} {t[1]}{t[2]} {t[3]}"),
        st.tuples(value, st.sampled_from(["IS NULL", "IS NOT NULL"])).map(lambda t: f"{t[0]} {t[1]}"),
        inner.map(lambda s: f"NOT ({s})"),
        st.tuples(inner, st.sampled_from(["AND", "OR"]), inner).map(lambda t: f"({t[0]}) {t[1]} ({t[2]})"),
        st.sampled_from(PROPS),
    )


expressions = st.recursive(
    st.sampled_from(["TRUE", "FALSE", "NULL", "a", "a = 'x'", "b > 3"]), _predicates, max_leaves=12
)
rows = st.lists(st.fixed_dictionaries({p: st.sampled_from(VALUES) for p in PROPS}), min_size=1, max_size=40)


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
