"""Building frozen, slotted dataclasses fast (any layer may import this module).

Several of siftmq's value types are built once per message on hot paths (a record read, a
message received). The ``__init__`` a frozen dataclass generates sets each slot through
``object.__setattr__``, which costs more than the work that produced the values.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import fields
from typing import Any, TypeVar

_T = TypeVar("_T")


def frozen_slots_constructor(cls: type[_T]) -> Callable[[tuple[Any, ...]], _T]:
    """A fast constructor of a frozen, slotted dataclass taking every field value in order.

    It sets the slots through their descriptors instead of ``object.__setattr__``. The result is
    the same object as ``cls(*values)`` would build (no ``__post_init__`` runs, no defaults apply).
    """
    setters = tuple(cls.__dict__[f.name].__set__ for f in fields(cls))  # type: ignore[arg-type]
    new = object.__new__

    def construct(values: tuple[Any, ...]) -> _T:
        obj = new(cls)
        for setter, value in zip(setters, values, strict=True):
            setter(obj, value)
        return obj

    return construct
