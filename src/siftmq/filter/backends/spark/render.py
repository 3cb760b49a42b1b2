"""Rendering the expression tree of :mod:`.expressions`: as Spark SQL text, or as a pyspark ``Column``.

Owns the quoting of identifiers and string literals (plain only when safe, else
``decode(X'…', 'UTF-8')``), Java-exact double literals, the nesting count checked against
``MAX_NESTING``, and the balanced Column tree for long AND/OR chains.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Final

from pyspark.sql import Column
from pyspark.sql import functions as F

from siftmq.filter.backends.spark.expressions import (
    _X,
    _Binary,
    _Call,
    _In,
    _IsNull,
    _Item,
    _Junction,
    _Lit,
    _Not,
    _parts,
    _Ref,
    _TryCast,
    _walk,
)


def _quote_identifier(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def _sql_string(text: str) -> str:
    if all(ch.isprintable() and ch not in "'\\" for ch in text):
        return f"'{text}'"
    # Anything else as its UTF-8 bytes: no quote or escape in the user's text reaches the parser.
    return f"decode(X'{text.encode('utf-8').hex().upper()}', 'UTF-8')"


def _java_double_text(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "Infinity" if value > 0 else "-Infinity"
    return repr(value)


def _sql_literal(lit: _Lit) -> str:
    value = lit.value
    if value is None:
        return f"CAST(NULL AS {lit.type})"
    if lit.type == "BOOLEAN":
        return "true" if value else "false"
    if lit.type == "STRING":
        assert isinstance(value, str)
        return _sql_string(value)
    if lit.type == "DOUBLE":
        assert isinstance(value, float)
        if math.isfinite(value) and value != 0.0:
            return repr(value) + "D"
        return f"CAST('{_java_double_text(value)}' AS DOUBLE)"
    assert isinstance(value, int)
    return f"{value}L" if lit.type == "BIGINT" else str(value)


def _sql_node(x: _X, args: list[str]) -> str:
    if isinstance(x, _Lit):
        return _sql_literal(x)
    if isinstance(x, _Ref):
        if not isinstance(x.source, str):
            raise TypeError(f"to_spark_sql needs column names, got {type(x.source).__name__}")
        return _quote_identifier(x.source)
    if isinstance(x, _Item):
        return f"{args[0]}[{_sql_string(x.key)}]"
    if isinstance(x, _Call):
        return f"{x.name}({', '.join(args)})"
    if isinstance(x, _Binary):
        return f"({args[0]} {x.op} {args[1]})"
    if isinstance(x, _Junction):
        return "(" + f" {x.op} ".join(args) + ")"
    if isinstance(x, _Not):
        return f"(NOT {args[0]})"
    if isinstance(x, _IsNull):
        return f"({args[0]} IS NULL)"
    if isinstance(x, _TryCast):
        return f"try_cast({args[0]} AS {x.type})"
    if isinstance(x, _In):
        return f"({args[0]} IN ({', '.join(_sql_string(v) for v in x.values)}))"
    text = "CASE"
    for i in range(len(x.branches)):
        text += f" WHEN {args[2 * i]} THEN {args[2 * i + 1]}"
    if x.otherwise is not None:
        text += f" ELSE {args[-1]}"
    return text + " END"


def _depth(root: _X) -> int:
    deepest = 0
    stack = [(root, 1)]
    while stack:
        x, depth = stack.pop()
        deepest = max(deepest, depth)
        stack.extend((p, depth + 1) for p in _parts(x))
    return deepest


def _column_tree(root: _X) -> Column:
    """The expression as a Column. Parts that read no Column object are parsed from their SQL text
    in one call (building them node by node costs a py4j round trip per node)."""
    reads_column: dict[int, bool] = {}

    def mark(x: _X, parts: list[bool]) -> bool:
        result = any(parts) or (isinstance(x, _Ref) and not isinstance(x.source, str))
        reads_column[id(x)] = result
        return result

    _walk(root, mark)

    def as_text(x: _X) -> Column | None:
        if reads_column[id(x)]:
            return None
        return F.expr(_walk(x, _sql_node))

    return _walk(root, _column_node, as_text)


_COMPARE: Final[dict[str, Callable[[Column, Column], Column]]] = {
    "=": lambda a, b: a == b,
    "<": lambda a, b: a < b,
    "<=": lambda a, b: a <= b,
    ">": lambda a, b: a > b,
    ">=": lambda a, b: a >= b,
}


def _balanced(items: Sequence[Column], conjunction: bool) -> Column:
    """``a AND b AND ...`` as a balanced tree (three-valued AND and OR are associative): a chain of
    500 would overflow the stack of Spark's analyzer, as Spark's own SQL parser knows."""
    level = list(items)
    while len(level) > 1:
        pairs = [
            (level[i] & level[i + 1]) if conjunction else (level[i] | level[i + 1])
            for i in range(0, len(level) - 1, 2)
        ]
        if len(level) % 2:
            pairs.append(level[-1])
        level = pairs
    return level[0]


def _column_node(x: _X, args: list[Column]) -> Column:
    if isinstance(x, _Lit):
        if x.value is None or x.type == "BIGINT":
            return F.lit(x.value).cast(x.type.lower())
        return F.lit(x.value)
    if isinstance(x, _Ref):
        source = x.source
        if isinstance(source, str):
            return F.col(_quote_identifier(source))
        if isinstance(source, Column):
            return source
        raise TypeError(f"a column must be a name or a pyspark Column, got {type(source).__name__}")
    if isinstance(x, _Item):
        return args[0].getItem(x.key)
    if isinstance(x, _Call):
        return F.call_function(x.name, *args)
    if isinstance(x, _Binary):
        return _COMPARE[x.op](args[0], args[1])
    if isinstance(x, _Junction):
        return _balanced(args, x.op == "AND")
    if isinstance(x, _Not):
        return ~args[0]
    if isinstance(x, _IsNull):
        return args[0].isNull()
    if isinstance(x, _TryCast):
        return args[0].try_cast(x.type.lower())
    if isinstance(x, _In):
        return args[0].isin(list(x.values))
    result = F.when(args[0], args[1])
    for i in range(1, len(x.branches)):
        result = result.when(args[2 * i], args[2 * i + 1])
    if x.otherwise is not None:
        result = result.otherwise(args[-1])
    return result
