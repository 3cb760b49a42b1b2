"""The message a program's ``match`` sees: read-only, built fast (a tuple with named fields).

On the wire (see :mod:`~siftmq.filterserver.wire`) a message is the plain tuple :data:`Row`
describes (the fields of :class:`Message`, in its order); the worker wraps each in
:class:`Message` without copying.
"""

from __future__ import annotations

from collections.abc import Mapping
from operator import itemgetter
from types import MappingProxyType
from typing import Any

Row = tuple[str, str | None, tuple[str, ...], dict[str, str], bytes, str, int, int, int, int]


class Message(tuple[Any, ...]):
    """``topic``, ``tag`` (str or None), ``keys`` (tuple of str), ``properties`` (a read-only mapping),
    ``body`` (bytes), ``message_id``, ``born_timestamp`` and ``store_timestamp`` (ms), ``queue_id``,
    ``queue_offset``. Immutable: a program cannot change what another program, or the broker, sees."""

    __slots__ = ()

    topic: str = property(itemgetter(0))  # type: ignore[assignment]
    tag: str | None = property(itemgetter(1))  # type: ignore[assignment]
    keys: tuple[str, ...] = property(itemgetter(2))  # type: ignore[assignment]
    body: bytes = property(itemgetter(4))  # type: ignore[assignment]
    message_id: str = property(itemgetter(5))  # type: ignore[assignment]
    born_timestamp: int = property(itemgetter(6))  # type: ignore[assignment]
    store_timestamp: int = property(itemgetter(7))  # type: ignore[assignment]
    queue_id: int = property(itemgetter(8))  # type: ignore[assignment]
    queue_offset: int = property(itemgetter(9))  # type: ignore[assignment]

    @property
    def properties(self) -> Mapping[str, str]:
        return MappingProxyType(self[3])

    def __repr__(self) -> str:
        return f"Message(topic={self[0]!r}, tag={self[1]!r}, message_id={self[5]!r})"


def row(
    *,
    topic: str,
    body: bytes = b"",
    tag: str | None = None,
    keys: tuple[str, ...] = (),
    properties: dict[str, str] | None = None,
    message_id: str = "",
    born_timestamp: int = 0,
    store_timestamp: int = 0,
    queue_id: int = 0,
    queue_offset: int = 0,
) -> Row:
    """A message on the wire, by field name."""
    return (topic, tag, tuple(keys), dict(properties or {}), bytes(body), message_id,
            born_timestamp, store_timestamp, queue_id, queue_offset)  # fmt: skip
