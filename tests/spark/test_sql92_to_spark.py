"""The Spark backend gives the scalar evaluator's decision on every row, under Spark's ANSI mode.

One JVM for the module: each test builds one DataFrame and evaluates many predicates in one select,
each as ``F.expr(to_spark_sql(...))``, as ``to_spark_column`` by column name and (for many) as
``to_spark_column`` of a Column object; a job that raised (an ANSI error on some value) fails the
test.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyspark.sql import functions as F

import filter_corpus
from filter_corpus import FIXED_ROWS, NUMBERS, PROPS, REFERENCE_CASES, STRINGS, VALUES, Row
from siftmq.filter import FilterError, UnsupportedFilterError, compile_filter
from siftmq.filter.backends.spark import MAX_NESTING, to_spark_column, to_spark_sql
from siftmq.filter.compiler import CompiledFilter

CASES = REFERENCE_CASES
SCHEMA = "id int, properties map<string,string>"


def _compiled_or_none(kind: str, text: str) -> CompiledFilter | None:
    try:
        return compile_filter(kind, text)
    except FilterError:
        return None


def _frame(spark: Any, rows: Sequence[Row]) -> Any:
    data = [(i, {k: v for k, v in row.items() if v is not None}) for i, row in enumerate(rows)]
    return spark.createDataFrame(data, SCHEMA)


def _paths(compiled: CompiledFilter, with_objects: bool) -> list[Any]:
    """The filter as Columns: SQL text, ``to_spark_column`` by column names (the same text, parsed
    once), and (``with_objects``) by Column objects, built node by node through the Column API."""
    paths = [F.expr(to_spark_sql(compiled)), to_spark_column(compiled)]
    if with_objects:
        paths.append(to_spark_column(compiled, F.col("properties")))
    return paths


def _assert_agree(
    spark: Any, filters: Sequence[CompiledFilter], rows: Sequence[Row], *, objects: int | None = None
) -> int:
    """Every filter on every row, by every path, equals ``matches``; one job per 80 filters. Only
    the first ``objects`` filters (default: all) are also built from Column objects (the slow path)."""
    df = _frame(spark, rows)
    mismatches = []
    count = 0
    chunk = 80
    for start in range(0, len(filters), chunk):
        part = filters[start : start + chunk]
        columns = [F.col("id")]
        names: list[tuple[int, str]] = []
        for i, compiled in enumerate(part):
            with_objects = objects is None or start + i < objects
            for j, column in enumerate(_paths(compiled, with_objects)):
                names.append((i, f"p{i}_{j}"))
                columns.append(column.alias(f"p{i}_{j}"))
        for row in df.select(*columns).collect():
            props = rows[row["id"]]
            for i, name in names:
                want = part[i].matches(props)
                count += 1
                if row[name] is not want:
                    mismatches.append((part[i].text, dict(props), name, want, row[name]))
    assert not mismatches, f"{len(mismatches)} disagreements, first: {mismatches[:5]}"
    return count


# ----------------------------------------------------------------------------------- reference cases


def _is_string_props(case: dict[str, Any]) -> bool:
    return all(v is None or isinstance(v, str) for v in case["props"].values())


def test_reference_cases(spark: Any) -> None:
    """Every compiling reference expression on the props of every string-valued case (a message's
    properties are strings: cases with typed props give their expression but not their row)."""
    compiled = [c for c in (_compiled_or_none("SQL92", case["expr"]) for case in CASES) if c is not None]
    rows: list[Row] = [case["props"] for case in CASES if _is_string_props(case)]
    rows += [{}, {"a": "-0", "b": "0.0"}, {"a": "NaN", "b": "NaN"}, {"a": " 3", "b": "3 "}, {"k": "v499"}]
    assert len(compiled) > 190 and len(rows) > 230
    assert _assert_agree(spark, compiled, rows) == 3 * len(compiled) * len(rows)


# ----------------------------------------------------------------------------------------- hypothesis

expressions = filter_corpus.expressions()
rows_strategy = filter_corpus.rows(min_size=10, max_size=30)


def _compiled_batch(texts: Sequence[str]) -> list[CompiledFilter]:
    seen: dict[str, CompiledFilter] = {}
    for text in texts:
        compiled = _compiled_or_none("SQL92", text)
        if compiled is not None:
            seen.setdefault(text, compiled)
    return list(seen.values())


@settings(
    max_examples=4,
    deadline=None,
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.function_scoped_fixture,
        HealthCheck.data_too_large,
    ],
)
@given(st.lists(expressions, min_size=50, max_size=80), rows_strategy)
def test_generated_expressions_agree(spark: Any, texts: list[str], rows: list[Row]) -> None:
    filters = _compiled_batch(texts)
    _assert_agree(spark, filters, [*rows, *FIXED_ROWS], objects=8)


comparison = st.tuples(
    st.sampled_from(PROPS),
    st.sampled_from(["=", "<>", ">", ">=", "<", "<=", "IN", "STARTSWITH"]),
    st.one_of(st.sampled_from(NUMBERS), st.sampled_from(STRINGS), st.sampled_from(PROPS)),
).map(lambda t: f"{t[0]} {t[1]} ({t[2]})" if t[1] == "IN" else " ".join(t))


@settings(
    max_examples=3,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(
    st.lists(
        st.tuples(comparison, st.sampled_from(["", "AND", "OR", "=", "<>"]), comparison, st.booleans()),
        min_size=60,
        max_size=80,
    ),
    st.lists(st.sampled_from(VALUES), min_size=10, max_size=20),
)
def test_comparisons_on_nasty_values_agree(
    spark: Any, parts: list[tuple[str, str, str, bool]], extra: list[str | None]
) -> None:
    """Comparisons alone or in pairs, plain and negated — where a parse error (RocketMQ throws) and
    a NULL give different decisions — on every value."""
    texts = []
    for first, joiner, second, negated in parts:
        text = f"({first}) {joiner} ({second})" if joiner else first
        texts.append(f"NOT ({text})" if negated else text)
    rows: list[Row] = [{"a": v, "b": w, "c": v} for v in VALUES for w in ("3", None)]
    rows += [{"a": v, "b": w, "c": "0.0"} for v in extra for w in VALUES[::7]]
    _assert_agree(spark, _compiled_batch(texts), rows, objects=8)


# ------------------------------------------------------------------------------- TAG, columns, quoting


def test_tag_filters(spark: Any) -> None:
    texts = [
        "*",
        "",
        "TagA",
        "TagA||TagB",
        "Aa",
        "BB",
        "Aa||BB",
        " TagA || TagC ",
        "||TagA",
        "  *  ",
        " ",
        "x'y||a\\b",
    ]
    filters = [compile_filter("TAG", t) for t in texts]
    tags = [None, "TagA", "TagB", "TagC", "Aa", "BB", "*", "tagA", "TagA ", "", "x'y", "a\\b", "C#"]
    rows: list[Row] = [{"TAGS": t} for t in tags]
    assert _assert_agree(spark, filters, rows) == 3 * len(filters) * len(rows)
    # "Aa" and "BB" share a hash code, never a match
    aa = compile_filter("TAG", "Aa")
    assert aa.tag_filter is not None and len(compile_filter("TAG", "Aa||BB").tag_filter.codes) == 1  # type: ignore[union-attr]
    df = _frame(spark, rows)
    assert [r.id for r in df.filter(to_spark_column(aa)).collect()] == [tags.index("Aa")]


def test_columns_override_the_map(spark: Any) -> None:
    rows = [
        ("TagA", "eu", {"price": "35", "region": "us", "TAGS": "TagB"}),
        ("TagB", "eu", {"price": "35"}),
        ("TagA", "us", {"price": "3x"}),
        (None, None, {"price": "40", "TAGS": "TagA", "region": "eu"}),
        ("TagA", "eu", {"price": "40"}),
    ]
    df = spark.createDataFrame(
        [(i, *r) for i, r in enumerate(rows)], "id int, tag string, region string, props map<string,string>"
    )
    text = "TAGS = 'TagA' AND region = 'eu' AND price > 30"
    sql = compile_filter("SQL92", text)
    tag = compile_filter("TAG", "TagA")
    cols = {"TAGS": "tag", "region": "region"}

    def want(f: CompiledFilter) -> list[int]:
        return [i for i, (t, g, p) in enumerate(rows) if f.matches({**p, "TAGS": t, "region": g})]

    for f in (sql, tag):
        expected = want(f)
        got_sql = [r.id for r in df.filter(to_spark_sql(f, "props", columns=cols)).collect()]
        got_col = [r.id for r in df.filter(to_spark_column(f, "props", columns=cols)).collect()]
        as_columns = {"TAGS": F.col("tag"), "region": F.col("region")}
        got_objects = [
            r.id for r in df.filter(to_spark_column(f, F.col("props"), columns=as_columns)).collect()
        ]
        assert got_sql == got_col == got_objects == expected
    assert want(sql) == [0, 4]
    with pytest.raises(TypeError):
        to_spark_sql(sql, F.col("props"))  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        to_spark_sql(sql, "props", columns={"region": F.col("region")})  # type: ignore[dict-item]


def test_hostile_names_and_literals_keep_the_query_structure(spark: Any) -> None:
    hostile = ["x') OR TRUE OR ('", "' OR 1=1 --", "a\\", "\\'", "\\u0041", "`", "x\ny", "\x00", "😀"]
    props_col, weird_col = "my `props` (1)", "region`; DROP TABLE t; --"
    values: list[str | None] = [*hostile, "A", "x", "TRUE", None]
    schema = f"id int, {_ident(weird_col)} string, {_ident(props_col)} map<string,string>"
    df = spark.createDataFrame(
        [(i, v, {"a": v} if v is not None else {}) for i, v in enumerate(values)], schema
    )
    checks = []  # (filter, SQL text, the only row it must keep)
    for literal in hostile:
        quoted = literal.replace("'", "''")
        for text in (f"a = '{quoted}'", f"a IN ('{quoted}', 'zz')", f"a STARTSWITH '{quoted}'"):
            checks.append((compile_filter("SQL92", text), {"a": literal}))
        checks.append((compile_filter("SQL92", f"region = '{quoted}'"), {"region": literal}))
    columns = [F.col("id")]
    for i, (compiled, _) in enumerate(checks):
        sql = to_spark_sql(compiled, props_col, columns={"region": weird_col})
        outside_identifiers = re.sub(r"`(?:[^`]|``)*`", "``", sql)
        assert re.search(r"OR TRUE|DROP|--", outside_identifiers) is None, sql
        (value,) = checks[i][1].values()
        if "'" in value or "\\" in value:  # quotes and backslashes never reach the text
            assert value not in sql, sql
        columns.append(F.expr(sql).alias(f"f{i}"))
    result = df.select(*columns).collect()
    for i, (compiled, props) in enumerate(checks):
        kept = [r.id for r in result if r[f"f{i}"]]
        (value,) = props.values()
        assert kept == [values.index(value)], compiled.text
        assert compiled.matches(props)


def _ident(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def test_text_does_not_depend_on_escaped_string_literals(spark: Any) -> None:
    compiled = compile_filter("SQL92", "a = 'x''y\\z' OR b > 1.5 OR c = 0.0")
    rows: list[Row] = [{"a": "x'y\\z"}, {"b": " 2 "}, {"c": "-0"}, {"c": "0"}, {"a": "x'y\\\\z"}]
    df = _frame(spark, rows)
    expected = [i for i, row in enumerate(rows) if compiled.matches(row)]
    assert expected == [0, 1, 3]
    key = "spark.sql.parser.escapedStringLiterals"
    for setting in ("true", "false"):
        spark.conf.set(key, setting)
        try:
            assert [r.id for r in df.filter(to_spark_sql(compiled)).collect()] == expected
        finally:
            spark.conf.unset(key)


# -------------------------------------------------------------------------------------- refusals


def test_lone_surrogates_are_refused() -> None:
    for kind, text in [
        ("SQL92", "a = '\ud800'"),
        ("SQL92", "a IN ('x', '\udc00')"),
        ("SQL92", "a CONTAINS '\ud800x'"),
        ("TAG", "TagA||\ud800"),
    ]:
        compiled = compile_filter(kind, text)
        with pytest.raises(UnsupportedFilterError) as info:
            to_spark_sql(compiled)
        assert info.value.backend == "spark"
        with pytest.raises(UnsupportedFilterError):
            to_spark_column(compiled)


def test_filters_too_deep_for_spark_are_refused(spark: Any) -> None:
    too_deep = _not_and_chain(150)
    with pytest.raises(UnsupportedFilterError, match=rf"more than Spark handles \({MAX_NESTING};"):
        to_spark_sql(too_deep)
    with pytest.raises(UnsupportedFilterError, match="nests"):
        to_spark_column(too_deep)
    # the deepest chain let through works every way
    low, high = 1, 150  # accepted, refused
    while high - low > 1:
        middle = (low + high) // 2
        try:
            to_spark_sql(_not_and_chain(middle))
        except UnsupportedFilterError:
            high = middle
        else:
            low = middle
    depth = low
    assert depth > 50
    rows: list[Row] = [
        {"a": "2", "b0": "x"},
        {"a": "x"},
        {"a": "0"},
        {},
        {"a": "3", **{f"b{i}": "x" for i in range(depth)}},
    ]
    _assert_agree(spark, [_not_and_chain(depth)], rows)


def _not_and_chain(depth: int) -> CompiledFilter:
    """``NOT (NOT (... (a > 1 AND b0 = 'x') ...) AND b<depth-1> = 'x')``: a parse error under NOT
    inside AND, so every level is a lookup table."""
    text = "NOT (" * depth + "a > 1" + "".join(f" AND b{i} = 'x')" for i in range(depth))
    return compile_filter("SQL92", text)
