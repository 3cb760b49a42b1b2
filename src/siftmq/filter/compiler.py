"""``compile_filter(kind, text)``: the one entry point that turns filter text into a :class:`CompiledFilter`.

Compiled filters are immutable and cached (LRU, keyed by kind and text). A compiled filter
evaluates one message (:meth:`CompiledFilter.evaluate`, :meth:`CompiledFilter.matches`) with
closures built once by the scalar backend, or a whole batch of messages
(:meth:`CompiledFilter.matches_batch`) with the vectorized pyarrow backend, which is imported
only when a batch is first evaluated — ``import siftmq.filter`` stays free of pyarrow.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import lru_cache
from typing import TYPE_CHECKING, Any, Final, Literal

from siftmq.errors import FilterError, FilterEvaluationError
from siftmq.filter import ast
from siftmq.filter.ast import Node
from siftmq.filter.bind import BoundTree, bind
from siftmq.filter.parser import ensure_stack, parse
from siftmq.filter.scalar import Fn, ScalarCompiler, fold
from siftmq.filter.spec import TAGS_PROPERTY
from siftmq.filter.tags import TagFilter
from siftmq.filter.visitor import visit

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

    from siftmq.filter.backends.arrow import ArrowEvaluator

FilterKind = Literal["TAG", "SQL92"]
KINDS: Final = ("TAG", "SQL92")
CACHE_SIZE: Final = 1024


class CompiledFilter:
    """A validated TAG or SQL92 filter, ready to evaluate messages.

    ``evaluate(props)`` returns ``True``, ``False`` or ``None`` (SQL NULL) exactly as RocketMQ's
    evaluator does and raises :class:`FilterEvaluationError` where RocketMQ throws. ``matches``
    is what a broker uses: only ``True`` delivers. For TAG filters the message's tag is the
    ``TAGS`` property.
    """

    __slots__ = ("_arrow", "_fn", "_normalized", "bound", "kind", "properties", "tag_filter", "text", "tree")

    def __init__(self, kind: FilterKind, text: str, tree: Node | None, tag_filter: TagFilter | None) -> None:
        self.kind = kind
        self.text = text
        self.tree = tree
        self.tag_filter = tag_filter
        self._arrow: ArrowEvaluator | None = None
        self._normalized: str | None = None
        self.bound: BoundTree | None = None
        if tree is not None:
            ensure_stack()  # deep trees recurse once per level while evaluating
            self.bound = bind(tree, fold)
            self._fn: Fn = visit(tree, ScalarCompiler(self.bound))
            self.properties: frozenset[str] = self.bound.properties
        else:
            assert tag_filter is not None
            self._fn = _tag_fn(tag_filter)
            self.properties = frozenset({TAGS_PROPERTY})

    def __repr__(self) -> str:
        return f"CompiledFilter({self.kind!r}, {self.text!r})"

    @property
    def normalized(self) -> str:
        """The canonical text: SQL92 re-rendered from the tree (parses back to it), tags sorted."""
        if self._normalized is None:
            if self.tree is not None:
                self._normalized = ast.render(self.tree)
            else:
                assert self.tag_filter is not None
                self._normalized = self.tag_filter.normalized()
        return self._normalized

    def evaluate(self, props: Mapping[str, Any]) -> bool | None:
        """RocketMQ's result for one message: True, False or None; raises ``FilterEvaluationError``."""
        result = self._fn(props)
        return result if result is None else bool(result)

    def matches(self, props: Mapping[str, Any]) -> bool:
        """True only when :meth:`evaluate` returns True (errors and NULL do not match)."""
        try:
            return self._fn(props) is True
        except FilterEvaluationError:
            return False

    def matches_batch(self, batch: Any) -> npt.NDArray[np.bool_]:
        """``matches`` for every row of a batch, vectorized with pyarrow compute.

        ``batch`` is a ``pyarrow.Table``/``RecordBatch`` of string (or dictionary-of-string)
        columns, or a mapping of property name → sequence of ``str | None``. A missing column means
        the property is absent on every row. Returns a ``numpy`` bool array.
        """
        if self._arrow is None:
            from siftmq.filter.backends.arrow import ArrowEvaluator

            self._arrow = ArrowEvaluator(self)
        return self._arrow.matches(batch)


def _tag_fn(tag_filter: TagFilter) -> Fn:
    if tag_filter.sub_all:
        return lambda props: True
    tags = tag_filter.tags

    def tag_match(props: Mapping[str, Any]) -> bool:
        return props.get(TAGS_PROPERTY) in tags

    return tag_match


@lru_cache(maxsize=CACHE_SIZE)
def _compile_cached(kind: str, text: str) -> CompiledFilter:
    if kind == "TAG":
        return CompiledFilter("TAG", text, None, TagFilter.parse(text))
    tree = parse(text)
    return CompiledFilter("SQL92", text, tree, None)


def compile_filter(kind: str, text: str | None) -> CompiledFilter:
    """Compile ``text`` as a ``"TAG"`` or ``"SQL92"`` filter; invalid text raises a ``FilterError``."""
    if not isinstance(kind, str) or kind.upper() not in KINDS:
        raise FilterError(f"unknown filter type {kind!r}: expected 'TAG' or 'SQL92'", expression=text)
    kind = kind.upper()
    if kind == "TAG":
        text = "*" if text is None else text
    elif text is None:
        raise FilterError("an SQL92 filter needs an expression", expression=None)
    if not isinstance(text, str):
        raise FilterError(f"filter expression must be a string, got {type(text).__name__}")
    return _compile_cached(kind, text)
