"""Parser: positions in errors, precedence, limits, normalized form."""

from __future__ import annotations

import subprocess
import sys

import pytest

from siftmq.filter import (
    FilterError,
    FilterLimitError,
    FilterSyntaxError,
    FilterTypeError,
    compile_filter,
)
from siftmq.filter.parser import MAX_DEPTH, MAX_TEXT_LENGTH, MAX_TREE_DEPTH


@pytest.mark.parametrize(
    ("text", "start", "end"),
    [
        ("a = 'x", 4, 6),  # unterminated string: from the quote
        ('a = "x"', 4, 5),
        ("a != 1", 2, 4),
        ("a == 1", 3, 4),  # the second '=' cannot start an operand
        ("(a = 1", 6, 6),  # end of input where ')' was expected
        ("a = 1 AND", 9, 9),
        ("a = 1 NOT x", 6, 9),
        ("a.b = 1", 1, 2),
        ("a > 5 /* c", 6, 10),
        ("in = 1", 0, 2),
        ("a IN ()", 6, 7),
        ("a IN ('x', 1)", 11, 12),
        ("a CONTAINS b", 11, 12),
        ("a = 9223372036854775808", 4, 23),
        ("a > 1e309", 4, 9),
        ("a > 1e-400", 4, 10),
        ("", 0, 0),
    ],
)
def test_syntax_error_spans(text: str, start: int, end: int) -> None:
    with pytest.raises(FilterSyntaxError) as info:
        compile_filter("SQL92", text)
    err = info.value
    assert (err.start, err.end) == (start, end)
    # the message shows the text and a caret under the span
    lines = str(err).splitlines()
    assert "^" in lines[-1]
    assert lines[-1].index("^") - 2 == start - text.rfind("\n", 0, start) - 1


def test_caret_message_on_second_line() -> None:
    with pytest.raises(FilterSyntaxError) as info:
        compile_filter("SQL92", "a = 1 AND\n  b ! 2")
    err = info.value
    assert (err.line, err.column) == (2, 5)
    assert str(err).splitlines()[-2].strip() == "b ! 2"


@pytest.mark.parametrize(
    "text",
    [
        "TRUE = 1",
        "a = NULL",
        "NULL <> a",
        "a > 'x'",
        "a > TRUE",
        "1 < 2 < 3",
        "NOT a > 1",
        "a BETWEEN 10 AND 1",
        "a BETWEEN NULL AND 1",
        "a BETWEEN 1 AND 'x'",
        "a BETWEEN 'x' AND FALSE",
        "'x' IN ('x')",
        "5 AND TRUE",
        "NOT 5",
        "5",
        "-a",
    ],
)
def test_compile_time_rejections(text: str) -> None:
    with pytest.raises(FilterTypeError) as info:
        compile_filter("SQL92", text)
    assert info.value.start is not None
    assert text in str(info.value)


@pytest.mark.parametrize(
    ("text", "normalized"),
    [
        ("NOT a = 'x'", "NOT a = 'x'"),  # the text stays within its source's nesting
        ("TRUE OR FALSE AND FALSE", "TRUE OR (FALSE AND FALSE)"),
        ("a = b > 1", "a = (b > 1)"),
        ("a BETWEEN 1 AND 3", "(a >= 1) AND (a <= 3)"),
        ("a NOT BETWEEN 1 AND 3", "(a < 1) OR (a > 3)"),
        ("a IS NOT NULL AND a <> 'x'", "(a IS NOT NULL) AND (a <> 'x')"),
        ("a iN ('x','it''s')", "a IN ('x', 'it''s')"),
        ("a > -5 OR a > +5.5e1", "(a > -5) OR (a > 55.0)"),
        ("a > --5\n", None),
        ("a = 5L", "a = 5"),
        ("a = 0.0", "a = 0.0"),
        ("(((a = '1')))", "a = '1'"),
        ("a AND (b OR c) AND d", "a AND (b OR c) AND d"),
    ],
)
def test_normalized_form(text: str, normalized: str | None) -> None:
    if normalized is None:
        with pytest.raises(FilterSyntaxError):
            compile_filter("SQL92", text)
        return
    compiled = compile_filter("SQL92", text)
    assert compiled.normalized == normalized
    assert compile_filter("SQL92", normalized).tree == compiled.tree


def test_length_limit() -> None:
    text = "a = '" + "x" * MAX_TEXT_LENGTH + "'"
    with pytest.raises(FilterLimitError):
        compile_filter("SQL92", text)
    # just under the limit is fine
    ok = "a = '" + "x" * (MAX_TEXT_LENGTH - 6) + "'"
    assert compile_filter("SQL92", ok).matches({"a": "x" * (MAX_TEXT_LENGTH - 6)})


@pytest.mark.parametrize("depth", [256, MAX_DEPTH - 2])
def test_deep_nesting_is_supported(depth: int) -> None:
    parens = "(" * depth + "a = '1'" + ")" * depth
    assert compile_filter("SQL92", parens).matches({"a": "1"})
    nots = "NOT " * depth + "a"
    assert compile_filter("SQL92", nots).evaluate({"a": True}) is (depth % 2 == 0)
    mixed = "".join("(TRUE AND " for _ in range(depth // 2)) + "a = '1'" + ")" * (depth // 2)
    assert compile_filter("SQL92", mixed).matches({"a": "1"})


@pytest.mark.parametrize(
    "text",
    [
        "(" * (MAX_DEPTH + 1) + "a" + ")" * (MAX_DEPTH + 1),
        "NOT " * (MAX_DEPTH + 1) + "a",
        "a = " * (MAX_TREE_DEPTH + 5) + "b",
        "-" * (MAX_DEPTH + 1) + "a > 1",
    ],
)
def test_too_deep_is_a_clear_error(text: str) -> None:
    with pytest.raises(FilterLimitError, match=r"more than \d+ levels deep"):
        compile_filter("SQL92", text)


def test_long_or_chain_is_flat() -> None:
    text = " OR ".join(f"k = 'v{i}'" for i in range(4000))
    compiled = compile_filter("SQL92", text)
    assert compiled.tree is not None and compiled.tree.depth == 3
    assert compiled.matches({"k": "v3999"})
    assert not compiled.matches({"k": "nope"})


def test_cache_returns_the_same_object() -> None:
    assert compile_filter("SQL92", "a = 1") is compile_filter("SQL92", "a = 1")
    assert compile_filter("sql92", "a = 1") is compile_filter("SQL92", "a = 1")


def test_unknown_kind() -> None:
    with pytest.raises(FilterError, match="unknown filter type"):
        compile_filter("CLASS", "x")


def test_properties_are_collected() -> None:
    compiled = compile_filter("SQL92", "region = 'x' AND (price > 3 OR vip IS NULL) AND a IN ('1')")
    assert compiled.properties == {"region", "price", "vip", "a"}


def test_import_is_pure() -> None:
    code = (
        "import sys, siftmq.filter\n"
        "f = siftmq.filter.compile_filter('SQL92', \"a = 'x'\"); f.matches({'a': 'x'})\n"
        "bad = [m for m in ('asyncio', 'grpc', 'pyarrow', 'pyspark', 'numpy') if m in sys.modules]\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""
