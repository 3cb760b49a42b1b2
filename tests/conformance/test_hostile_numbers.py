"""Property values and literals of thousands of digits: what anyone allowed to publish (or to type an
expression) can send. Each backend must answer as Java would, in time linear in the text.

A property of 12,000 digits and an ``x`` held the GIL for 3.5 s in a backtracking regex (the whole
broker stalled), and one of 5,000 digits raised Python's ``ValueError`` (int() refuses 4,300 digits),
which failed every receive of the group's queue for good.
"""

from __future__ import annotations

import threading
from typing import Any

import pyarrow as pa
import pytest

from siftmq.filter import FilterSyntaxError, compile_filter

LONG_RUN = 32_000  # the longest value a record's properties can hold is about this

#: (expression, property value, the decision of every backend)
CASES = [
    ("p > 1.5", "1" * LONG_RUN + "x", False),  # not a number: NumberFormatException, so not TRUE
    ("p > 1.5", "1" * LONG_RUN + ".5" + "1" * LONG_RUN + "e", False),
    ("p > 1.5", "0x" + "f" * LONG_RUN + "x", False),
    ("p > 1.5", "1" * LONG_RUN, True),  # a double of 32,000 digits is Infinity, as Java reads it
    ("p > 1", "1" * 5_000, False),  # past the long range
    ("p > 1", "0" * 5_000 + "7", True),  # leading zeros: Integer.valueOf reads 7
    ("p = -7", "-" + "0" * 5_000 + "7", True),
    ("p > 1", "\u0660" * 5_000 + "\u0663", True),  # Arabic-Indic digits: 3
    ("p IS NOT NULL AND p < 10", "9" * 20, False),
]


def _decisions(expression: str, value: str) -> list[Any]:
    compiled = compile_filter("SQL92", expression)
    table = pa.table({"p": pa.array([value, "5"], type=pa.string())})
    return [compiled.matches({"p": value}), compiled.matches_batch(table)[0]]


@pytest.mark.parametrize(("expression", "value", "want"), CASES, ids=range(len(CASES)))
def test_long_numeric_texts_are_decided_as_java_decides_them(expression: str, value: str, want: bool) -> None:
    found: list[Any] = []
    worker = threading.Thread(target=lambda: found.extend(_decisions(expression, value)), daemon=True)
    worker.start()
    # a hang guard, hundreds of times the ~10 ms this takes (the backtracking regex took ~20 s)
    worker.join(5)
    assert not worker.is_alive(), "evaluation did not end"
    assert found == [want, want]


@pytest.mark.parametrize("digits", ["1" * 5_000, "9" * 20, "9223372036854775808"])
def test_an_integer_literal_past_the_long_range_is_a_syntax_error_at_any_length(digits: str) -> None:
    with pytest.raises(FilterSyntaxError, match="out of the Long range"):
        compile_filter("SQL92", f"a = {digits}")


def test_the_largest_long_literal_is_in_range() -> None:
    assert compile_filter("SQL92", "a = 9223372036854775807").matches({"a": "9223372036854775807"})
