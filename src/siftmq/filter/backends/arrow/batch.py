"""The Arrow backend's entry point: :class:`ArrowEvaluator` and what it accepts as a batch.

Owns normalizing a batch (a ``pyarrow`` table or record batch of string or dictionary columns,
or a mapping of name → values) into columns, TAG filters, and the fallback to the scalar
evaluator where this backend cannot be exact.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from siftmq.errors import UnsupportedFilterError
from siftmq.filter.backends.arrow.columns import _Column
from siftmq.filter.backends.arrow.evaluator import _Evaluator
from siftmq.filter.backends.arrow.plan import _Plan
from siftmq.filter.spec import FilterSpec

# ------------------------------------------------------------------------------------ entry point


class ArrowEvaluator:
    """``matches_batch`` of one compiled filter."""

    def __init__(self, compiled: FilterSpec) -> None:
        self.compiled = compiled
        self.tree = compiled.tree
        self.properties = sorted(compiled.properties)
        self._plan = _Plan(compiled.bound) if compiled.bound is not None else None

    def matches(self, batch: Any) -> npt.NDArray[np.bool_]:
        n, columns, raw = _normalize(batch, self.properties)
        if n == 0:
            return np.zeros(0, dtype=np.bool_)
        if columns is None:
            return self._scalar(raw, n)
        if self._plan is None:
            return self._match_tags(columns["TAGS"], n)
        try:
            return self._evaluate(self._plan, {name: _Column(col, n) for name, col in columns.items()}, n)
        except UnsupportedFilterError:
            return self._scalar(_rows(columns, n), n)

    def _match_tags(self, array: pa.Array, n: int) -> npt.NDArray[np.bool_]:
        tag_filter = self.compiled.tag_filter
        assert tag_filter is not None
        if tag_filter.sub_all:
            return np.ones(n, dtype=np.bool_)
        return _Column(array, n).isin(frozenset(tag_filter.tags))

    def _evaluate(self, plan: _Plan, columns: dict[str, _Column], n: int) -> npt.NDArray[np.bool_]:
        evaluator = _Evaluator(plan, columns, n)
        picked = plan.dictionary_subtrees(columns)
        if len(picked) == 1 and picked[0][0] is plan.tree:
            # the whole filter reads one column: only its TRUE rows are needed
            name = picked[0][1]
            result = evaluator.on_dictionary(plan.tree, name)
            t, _ = result.masks(len(result.e))
            _, indices = columns[name].encoded()
            return np.asarray((t & ~result.e)[indices], dtype=np.bool_)
        done = {id(node): evaluator.mapped(node, name) for node, name in picked}
        result = evaluator.evaluate(plan.tree, done)
        t, _ = result.masks(n)
        return np.asarray(t & ~result.e, dtype=np.bool_)

    def _scalar(self, rows: Sequence[Mapping[str, Any]], n: int) -> npt.NDArray[np.bool_]:
        match = self.compiled.matches
        return np.fromiter((match(row) for row in rows), dtype=np.bool_, count=n)


def _normalize(
    batch: Any, names: Sequence[str]
) -> tuple[int, dict[str, pa.Array] | None, Sequence[Mapping[str, Any]]]:
    """Row count and the referenced columns as arrays (absent → all null).

    Returns ``columns=None`` with the rows as dicts when a mapping holds text that Arrow cannot
    carry (lone surrogates): those batches are evaluated by the scalar backend.
    """
    if isinstance(batch, (pa.Table, pa.RecordBatch)):
        n = batch.num_rows
        columns: dict[str, pa.Array] = {}
        for name in names:
            if name in batch.column_names:
                col = batch.column(name)
                if isinstance(col, pa.ChunkedArray):
                    col = col.combine_chunks() if col.num_chunks != 1 else col.chunk(0)
                columns[name] = _check_string(name, col)
            else:
                columns[name] = pa.nulls(n, pa.string())
        return n, columns, ()
    if isinstance(batch, Mapping):
        lengths = {len(v) for v in batch.values()}
        if len(lengths) > 1:
            raise ValueError(f"batch columns have different lengths: {sorted(lengths)}")
        n = lengths.pop() if lengths else 0
        columns = {}
        try:
            for name in names:
                if name in batch:
                    col = batch[name]
                    columns[name] = (
                        _check_string(name, col)
                        if isinstance(col, pa.Array)
                        else pa.array(col, type=pa.string())
                    )
                else:
                    columns[name] = pa.nulls(n, pa.string())
        except (UnicodeEncodeError, pa.ArrowInvalid, pa.ArrowTypeError):
            return n, None, _mapping_rows(batch, names, n)
        return n, columns, ()
    raise TypeError(
        f"batch must be a pyarrow Table/RecordBatch or a mapping of columns, got {type(batch).__name__}"
    )


def _check_string(name: str, array: pa.Array) -> pa.Array:
    t = array.type
    if pa.types.is_dictionary(t):
        if not (pa.types.is_string(t.value_type) or pa.types.is_large_string(t.value_type)):
            raise TypeError(f"column {name!r} must hold strings, got {t}")
        return array
    if pa.types.is_string(t):
        return array
    if pa.types.is_large_string(t) or pa.types.is_string_view(t) or pa.types.is_null(t):
        return array.cast(pa.string())
    raise TypeError(f"column {name!r} must hold strings (property values are strings), got {t}")


def _mapping_rows(batch: Mapping[str, Sequence[Any]], names: Sequence[str], n: int) -> list[dict[str, Any]]:
    present = [name for name in names if name in batch]
    return [{name: batch[name][i] for name in present} for i in range(n)]


def _rows(columns: Mapping[str, pa.Array], n: int) -> list[dict[str, Any]]:
    lists = {name: col.cast(pa.string()).to_pylist() for name, col in columns.items()}
    return [{name: values[i] for name, values in lists.items()} for i in range(n)]
