"""What the filter tests draw from: RocketMQ's reference cases (a copy kept in tests/data) and the
hypothesis strategies for SQL92 expressions and message rows, shared by every backend's tests so
they all meet the same nasty values."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hypothesis import strategies as st

REFERENCE_CASES_FILE = Path(__file__).parent / "data" / "sql92_reference_cases.jsonl"
#: RocketMQ's evaluator on each expression and props: ``expr``, ``props``, ``result``, ...
REFERENCE_CASES: list[dict[str, Any]] = [
    json.loads(line) for line in REFERENCE_CASES_FILE.read_text(encoding="utf-8").splitlines() if line.strip()
]

Row = Mapping[str, str | None]

PROPS = ["a", "b", "c"]
#: property values where Java's parsing, trimming and comparison rules bite
VALUES: list[str | None] = [
    None,
    *["3", "3.0", " 3", "3 ", "+3", "-3", "-0", "-0.0", "0.0", "0", "007", "+", "-", "", " ", "\t"],
    *["NaN", "-NaN", " NaN", "Infinity", "-Infinity", "Infinity\n", "inf", "nan", "INFINITY"],
    *["1e2", "1E+2", ".5", "5.", "1e", "e5", "1e400", "-1e-400", "4.9e-324", "1.7976931348623157e308"],
    *["0x1p3", "0X1.8P1", "-0x0p0", "0x1p3d", "0x10", "3d", "3f", "3D", "1.5F", "1.5DD", "3L"],
    *["true", "TRUE", "tRuE", "true ", "yes", "false", "1"],
    *["x", "abc", "ab", "%", "_", "a%", "x'y", "a\\b", "\\u0041", "it''s", "中文", "😀x", "x😀"],
    *["٣", "-٣", "３", "１２", "𝟙", "٣.٥", "\u00a03", "\x003", "3\x00", "\x0b3", "\u20003", "\u30003"],
    *["2147483647", "2147483648", "-2147483648", "-2147483649", "9223372036854775807"],
    *["9223372036854775808", "-9223372036854775808", "-9223372036854775809", "99999999999999999999"],
    *["000000000000000000000000000012", "9007199254740993", "9007199254740992.0", "1_000"],
]
NUMBERS = [
    *["0", "1", "3", "12", "100", "5L", "2147483647", "2147483648", "9223372036854775807"],
    *["0.0", "0.5", "3.0", "1e2", ".5", "1.7976931348623157e308", "4.9e-324", "9007199254740993.0"],
]
STRINGS = [
    *["'x'", "'3'", "'3.0'", "'true'", "''", "'abc'", "'it''s'", "'٣'", "'😀'", "'%'", "'a\\b'"],
    *["'x''y'", "''' OR TRUE OR '''", "'\\u0041'", "'\\'", "'`'", "')'", "'中文'"],
]
LEAVES = [
    "TRUE",
    "NULL",
    "a",
    "a = 'x'",
    "b > 3",
    "c >= 2.5",
    "a < b",
    "b = 3",
    "-a = b",
    "3 = c",
    "a <> 0.0",
]

atom_value = st.one_of(
    st.sampled_from(PROPS),
    st.sampled_from(PROPS),  # twice as likely: a sub-tree without properties folds to a constant
    st.sampled_from(NUMBERS),
    st.sampled_from(NUMBERS).map(lambda n: "-" + n),
    st.sampled_from(STRINGS),
    st.sampled_from(["TRUE", "FALSE", "NULL"]),
    st.sampled_from(PROPS).map(lambda p: "-" + p),
)


def _predicates(inner: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    value = st.one_of(atom_value, inner.map(lambda s: f"({s})"), inner.map(lambda s: f"-({s})"))
    return st.one_of(
        st.tuples(value, st.sampled_from(["=", "<>", ">", ">=", "<", "<="]), value).map(" ".join),
        st.tuples(value, st.sampled_from(["", "NOT "]), value, value).map(
            lambda t: f"{t[0]} {t[1]}BETWEEN {t[2]} AND {t[3]}"
        ),
        st.tuples(
            st.sampled_from(PROPS),
            st.sampled_from(["IN", "NOT IN"]),
            st.lists(st.sampled_from(STRINGS), min_size=1, max_size=4),
        ).map(lambda t: f"{t[0]} {t[1]} ({', '.join(t[2])})"),
        st.tuples(
            value,
            st.sampled_from(["", "NOT "]),
            st.sampled_from(["CONTAINS", "STARTSWITH", "ENDSWITH"]),
            st.sampled_from(STRINGS),
        ).map(lambda t: f"{t[0]} {t[1]}{t[2]} {t[3]}"),
        st.tuples(value, st.sampled_from(["IS NULL", "IS NOT NULL"])).map(" ".join),
        # a predicate against a constant Python holds equal to another (TRUE == 1 == 1.0, 0.0 == -0.0)
        st.tuples(
            inner,
            st.sampled_from(["=", "<>", ">"]),
            st.sampled_from(["TRUE", "FALSE", "1", "0", "1.0", "0.0", "-0.0"]),
        ).map(lambda t: f"({t[0]}) {t[1]} {t[2]}"),
        inner.map(lambda s: f"NOT ({s})"),
        st.lists(inner, min_size=2, max_size=4).flatmap(
            lambda parts: st.sampled_from([" AND ", " OR "]).map(lambda op: op.join(f"({p})" for p in parts))
        ),
        st.sampled_from(PROPS),
    )


def expressions(max_leaves: int = 10) -> st.SearchStrategy[str]:
    """SQL92 texts, most of them valid, nesting every operator over properties and constants."""
    return st.recursive(st.sampled_from(LEAVES), _predicates, max_leaves=max_leaves)


def rows(min_size: int = 1, max_size: int = 40) -> st.SearchStrategy[list[dict[str, str | None]]]:
    return st.lists(
        st.fixed_dictionaries({p: st.sampled_from(VALUES) for p in PROPS}),
        min_size=min_size,
        max_size=max_size,
    )


#: every value in each property, and pairs of a and b from a sample: beside generated rows
FIXED_ROWS: list[Row] = [
    *({p: v for p in PROPS} for v in VALUES),
    *({"a": v, "b": w, "c": "3"} for v in VALUES[::3] for w in VALUES[1::4]),
]
