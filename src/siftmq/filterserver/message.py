"""The message a program's ``match`` sees: read-only, built fast (a tuple with named fields).

On the wire (see :mod:`~siftmq.filterserver.wire`) a message is a :data:`Row`: the parts of the
stored record, its properties as the CommitLog holds them (name, byte 1, value; the pairs joined
by byte 2; the tag, keys and message id among them). The broker sends them undecoded, so it
spends almost nothing on the messages a program passes over; the worker builds each
:class:`Message` (:func:`message_of`).
"""

from __future__ import annotations

from collections.abc import Mapping
from operator import itemgetter
from types import MappingProxyType
from typing import Any, Final

# topic, queue id, queue offset, properties (stored form), body, the id to use when the properties
# have no UNIQ_KEY (RocketMQ's offset message id), born and store timestamps (ms)
Row = tuple[str, int, int, bytes, bytes, str, int, int]

# RocketMQ's property encoding, and the properties that are fields of Message (not user properties)
NAME_VALUE: Final = "\x01"
SEPARATOR: Final = "\x02"
TAGS, KEYS, UNIQ_KEY = "TAGS", "KEYS", "UNIQ_KEY"


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


def message_of(r: Row) -> Message:
    """The message a row stands for: its tag, keys and id taken out of the properties, which keep
    the user's (broker-internal ``__`` ones dropped)."""
    topic, queue_id, queue_offset, stored, body, offset_id, born, store = r
    if not stored:
        return Message((topic, None, (), {}, body, offset_id, born, store, queue_id, queue_offset))
    text = stored.decode("utf-8", "replace")
    properties = dict(item.split(NAME_VALUE, 1) for item in text.split(SEPARATOR) if NAME_VALUE in item)
    tag = properties.pop(TAGS, None)
    keys = properties.pop(KEYS, None)
    message_id = properties.pop(UNIQ_KEY, None) or offset_id
    if "__" in text:
        properties = {k: v for k, v in properties.items() if k[:2] != "__"}
    return Message((topic, tag, tuple(k for k in keys.split(" ") if k) if keys else (), properties, body,
                    message_id, born, store, queue_id, queue_offset))  # fmt: skip


def row(
    *,
    topic: str,
    body: bytes = b"",
    tag: str | None = None,
    keys: tuple[str, ...] = (),
    properties: Mapping[str, str] | None = None,
    message_id: str = "",
    born_timestamp: int = 0,
    store_timestamp: int = 0,
    queue_id: int = 0,
    queue_offset: int = 0,
) -> Row:
    """A message on the wire, by field name (a sample message, a test's). Raises ValueError for a
    name or value holding the encoding's separators."""
    pairs = dict(properties or {})
    if tag is not None:
        pairs[TAGS] = tag
    if keys:
        pairs[KEYS] = " ".join(keys)
    if message_id:
        pairs[UNIQ_KEY] = message_id
    for text in (*pairs, *pairs.values()):
        if NAME_VALUE in text or SEPARATOR in text:
            raise ValueError(f"a property name or value holds a control character \\x01 or \\x02: {text!r}")
    stored = SEPARATOR.join(f"{k}{NAME_VALUE}{v}" for k, v in pairs.items()).encode()
    return (topic, queue_id, queue_offset, stored, bytes(body), message_id, born_timestamp, store_timestamp)
