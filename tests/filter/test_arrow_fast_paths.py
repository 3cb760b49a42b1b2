"""Hypothesis: the Arrow backend's fast paths give the scalar evaluator's answer, row for row.

Each test aims at one shortcut of :mod:`siftmq.filter.backends.arrow`: string equality and ``IN``
on the string-view words (constants of every length around the 4- and 12-byte boundaries, long
constants with many candidates, lone surrogates), numeric comparisons of a column with a constant
on either side, and sub-trees evaluated once per distinct value of a dictionary-encoded column
(input dictionaries, dictionaries with null entries, plain columns encoded because the sub-tree
is costly). Batches come in several layouts: plain, sliced (non-zero offsets), chunked and
dictionary-encoded.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from siftmq.filter import compile_filter
from siftmq.filter.backends.arrow import DICTIONARY_MIN_ROWS

# lengths 0..14 bytes with shared prefixes, multi-byte UTF-8, and long values sharing length and
# first 4 bytes (many candidates for a long constant)
EDGE_TEXTS = [
    "",
    "a",
    "ab",
    "abc",
    "abcd",
    "abce",
    "abcde",
    "abcdefgh",
    "abcdefghijk",
    "abcdefghijkl",
    "abcdefghijkm",
    "abcdefghijklm",
    "abcdefghijkln",
    "abcdefghijklmn",
    "Hangzhou",
    "TagA",
    "true",
    "é",
    "中文",
    "😀",
    "a\x00",
    "\x00",
    "order-00000001",
    "order-00000002",
    "order-00000003",
    "order-1",
]
texts = st.one_of(st.sampled_from(EDGE_TEXTS), st.text(max_size=16))
# a constant may also hold a lone surrogate, which no Arrow string can hold
constants = st.one_of(texts, st.sampled_from(["\ud800", "ab\udfff", "abcdefghijklm\ud800"]))
NUMBER_TEXTS = [
    "0",
    "3",
    "-3",
    "+3",
    "007",
    "3.0",
    "3.5",
    "-0.0",
    "1e2",
    "NaN",
    "Infinity",
    "-Infinity",
    "inf",
    "0x10",
    "0X1p3",
    "٣",
    " 3",
    "2147483647",
    "2147483648",
    "-2147483649",
    "9223372036854775807",
    "9223372036854775808",
    "99999999999999999999",
    "abc",
    "",
]
NUMBER_LITERALS = ["0", "3", "-3", "100", "2147483647", "2147483648", "-9223372036854775807", "3.0", "-0.5"]
OPS = ["=", "<>", ">", ">=", "<", "<="]
MATCHES = ["CONTAINS 'b'", "STARTSWITH 'ab'", "NOT ENDSWITH 'c'", "IS NULL", "IS NOT NULL"]
LAYOUTS = ["plain", "sliced", "chunked", "dictionary", "dictionary-null-entry"]
SETTINGS = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _lit(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _column(values: list[str | None], layout: str) -> pa.Array | pa.ChunkedArray:
    if layout == "sliced":
        return pa.array(["pad", None, "x", *values], type=pa.string()).slice(3)
    if layout == "chunked":
        half = len(values) // 2
        return pa.chunked_array([values[:half], values[half:]], type=pa.string())
    if layout == "dictionary":
        return pa.array(values, type=pa.string()).dictionary_encode()
    if layout == "dictionary-null-entry":
        # the dictionary itself holds a null, and some rows point at it
        distinct = sorted({v for v in values if v is not None})
        dictionary = pa.array([*distinct, None], type=pa.string())
        null_entry = len(distinct)
        indices = [
            (None if i % 3 == 0 else null_entry) if v is None else distinct.index(v)
            for i, v in enumerate(values)
        ]
        return pa.DictionaryArray.from_arrays(pa.array(indices, type=pa.int32()), dictionary)
    return pa.array(values, type=pa.string())


def _check(text: str, rows: list[dict[str, str | None]], layout: str, repeat: int = 1) -> None:
    compiled = compile_filter("SQL92", text)
    want = [compiled.matches(row) for row in rows] * repeat
    names = sorted({name for row in rows for name in row})
    table = pa.table({name: _column([row.get(name) for row in rows] * repeat, layout) for name in names})
    assert list(compiled.matches_batch(table)) == want, text


@SETTINGS
@given(
    st.lists(st.one_of(st.none(), texts), min_size=1, max_size=60),
    st.lists(constants, min_size=1, max_size=20),
    st.sampled_from(LAYOUTS),
)
def test_string_equality_and_in(values: list[str | None], consts: list[str], layout: str) -> None:
    rows = [{"a": v} for v in values]
    first = _lit(consts[0])
    items = ", ".join(_lit(c) for c in consts)
    for text in (
        f"a = {first}",
        f"{first} = a",
        f"a <> {first}",
        f"{first} <> a",
        f"a IN ({items})",
        f"a NOT IN ({items})",
    ):
        _check(text, rows, layout)


@SETTINGS
@given(
    st.lists(st.sampled_from([*EDGE_TEXTS[-4:], "order-00000009", None]), min_size=8, max_size=40),
    st.sampled_from([*EDGE_TEXTS[-4:], "order-00000009"]),
)
def test_long_constant_with_many_candidates(values: list[str | None], const: str) -> None:
    rows = [{"a": v} for v in values]
    for layout in ("plain", "sliced"):
        _check(f"a = {_lit(const)}", rows, layout)


@SETTINGS
@given(
    st.lists(st.one_of(st.none(), st.sampled_from(NUMBER_TEXTS)), min_size=1, max_size=40),
    st.sampled_from(OPS),
    st.sampled_from(NUMBER_LITERALS),
    st.sampled_from(LAYOUTS),
    st.booleans(),
)
def test_column_against_number(
    values: list[str | None], op: str, number: str, layout: str, large: bool
) -> None:
    rows = [{"a": v} for v in values]
    # large batches of few distinct values take the parse-once-per-distinct-value route
    repeat = DICTIONARY_MIN_ROWS // len(rows) + 1 if large else 1
    for text in (f"a {op} {number}", f"{number} {op} a", f"a BETWEEN -{number} AND {number}"):
        if "BETWEEN" in text and number.startswith("-"):
            continue
        _check(text, rows, layout, repeat)


def _one_column(name: str) -> st.SearchStrategy[str]:
    """Boolean expressions that read only ``name``, some with many predicates."""
    leaf = st.one_of(
        st.tuples(st.sampled_from(OPS), st.sampled_from(NUMBER_LITERALS)).map(
            lambda t: f"{name} {t[0]} {t[1]}"
        ),
        st.sampled_from(EDGE_TEXTS + NUMBER_TEXTS).map(lambda v: f"{name} = {_lit(v)}"),
        st.lists(st.sampled_from(EDGE_TEXTS), min_size=1, max_size=4).map(
            lambda vs: f"{name} IN ({', '.join(_lit(v) for v in vs)})"
        ),
        st.sampled_from(MATCHES).map(lambda s: f"{name} {s}"),
        st.just(name),
    )
    return st.recursive(
        leaf,
        lambda inner: st.one_of(
            inner.map(lambda s: f"NOT ({s})"),
            st.lists(inner, min_size=2, max_size=6).map(lambda xs: " AND ".join(f"({x})" for x in xs)),
            st.lists(inner, min_size=2, max_size=6).map(lambda xs: " OR ".join(f"({x})" for x in xs)),
            inner.map(lambda s: f"({s}) IS NULL"),
            inner.map(lambda s: f"({s}) = TRUE"),
        ),
        max_leaves=10,
    )


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    _one_column("a"),
    _one_column("b"),
    st.sampled_from(["AND", "OR", "= (", "<> ("]),
    st.lists(
        st.fixed_dictionaries(
            {
                "a": st.one_of(st.none(), st.sampled_from(EDGE_TEXTS + NUMBER_TEXTS)),
                "b": st.one_of(st.none(), st.sampled_from(EDGE_TEXTS + NUMBER_TEXTS)),
            }
        ),
        min_size=1,
        max_size=12,
    ),
    st.tuples(st.sampled_from(["plain", "dictionary", "dictionary-null-entry"]), st.booleans()),
)
def test_sub_trees_on_the_dictionary(
    left: str, right: str, join: str, rows: list[dict[str, Any]], layout_large: tuple[str, bool]
) -> None:
    layout, large = layout_large
    # large: past DICTIONARY_MIN_ROWS with few distinct values, so plain columns get encoded
    repeat = DICTIONARY_MIN_ROWS // len(rows) + 1 if large else 4
    text = f"({left}) {join} ({right})" if join in ("AND", "OR") else f"({left}) {join}{right})"
    _check(left, rows, layout, repeat)
    _check(text, rows, layout, repeat)
    # a two-column comparison between one-column sub-trees (it may encode `a` midway)
    _check(f"({left}) OR a >= b OR ({left}) AND ({right})", rows, layout, repeat)


def test_long_in_lists_use_arrow_is_in() -> None:
    items = [f"v{i}" for i in range(20)]
    values: list[str | None] = [*items, "v20", "", None, "v1 ", "\u00e9"]
    rows = [{"a": v} for v in values]
    for extra in ([], ["\ud800"], ["é", "x\udfff"]):
        listed = ", ".join(_lit(v) for v in [*items, *extra])
        for layout in LAYOUTS:
            _check(f"a IN ({listed})", rows, layout, repeat=3)
            _check(f"a NOT IN ({listed})", rows, layout, repeat=3)
    only_surrogates = ", ".join(_lit(f"\ud800{i}") for i in range(20))
    _check(f"a IN ({only_surrogates})", rows, "plain")


def test_column_encoded_midway_keeps_equality_exact() -> None:
    # `a = ...` runs on the rows, then `a >= b` dictionary-encodes the low-cardinality column `a`
    # to parse it, then `a = ...` runs again: its views must be of the dictionary, not the rows.
    rows = [{"a": a, "b": b} for a in ("1", "2", "abc", None) for b in ("1", "2", None)]
    repeat = DICTIONARY_MIN_ROWS // len(rows) + 1
    for layout in ("plain", "sliced"):
        _check("a = 'abc' OR a >= b OR a = '2' OR a IN ('1', 'x')", rows, layout, repeat)
