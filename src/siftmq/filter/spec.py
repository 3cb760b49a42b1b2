"""What a backend needs of a compiled filter, without importing the compiler.

:class:`FilterSpec` is the read-only face of :class:`~siftmq.filter.compiler.CompiledFilter` that
the Arrow and Spark backends work from (its tree and binding, the properties it reads, its tag
set, and the scalar ``matches`` to fall back on), and :data:`TAGS_PROPERTY` is the property a
TAG filter reads.
The compiler imports a backend lazily (so ``import siftmq.filter`` loads no pyarrow); the backends
import this module and never the compiler, so that lazy import is the only edge between them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final, Protocol

from siftmq.filter.ast import Node
from siftmq.filter.bind import BoundTree
from siftmq.filter.tags import TagFilter

__all__ = ["TAGS_PROPERTY", "FilterSpec"]

TAGS_PROPERTY: Final = "TAGS"


class FilterSpec(Protocol):
    """A compiled TAG filter (``tree`` is None, ``tag_filter`` set) or SQL92 filter (the reverse)."""

    @property
    def tree(self) -> Node | None: ...

    @property
    def tag_filter(self) -> TagFilter | None: ...

    @property
    def bound(self) -> BoundTree | None: ...

    @property
    def properties(self) -> frozenset[str]: ...

    def matches(self, props: Mapping[str, Any]) -> bool: ...
