"""The message a program's ``match`` sees: read-only, built fast (a tuple with named fields).

On the wire (see :mod:`~siftmq.filterserver.wire`) a message is a :data:`Row`: the parts of the
stored record, its properties as the CommitLog holds them (name, byte 1, value; the pairs joined
by byte 2; the tag, keys and message id among them). The broker sends them undecoded, so it
spends almost nothing on the messages a program passes over; the worker builds each
:class:`Message` (:func:`message_of`).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from operator import itemgetter
from typing import Any, Final

# topic, queue id, queue offset, properties (stored form), body, the id to use when the properties
# have no UNIQ_KEY (RocketMQ's offset message id), born and store timestamps (ms)
Row = tuple[str, int, int, bytes, bytes, str, int, int]

# RocketMQ's property encoding, and the properties that are fields of Message (not user properties)
NAME_VALUE: Final = "\x01"
SEPARATOR: Final = "\x02"
TAGS, KEYS, UNIQ_KEY = "TAGS", "KEYS", "UNIQ_KEY"


def _value(text: str, name: str) -> str | None:
    """Property ``name``'s value in ``text``, the stored form with a separator in front (the last
    one, as a decoder keeps)."""
    probe = f"{SEPARATOR}{name}{NAME_VALUE}"
    at = text.rfind(probe)
    if at < 0:
        return None
    start = at + len(probe)
    end = text.find(SEPARATOR, start)
    return text[start:] if end < 0 else text[start:end]


_FIELDS: Final = frozenset({TAGS, KEYS, UNIQ_KEY})
_MISSING: Final[Any] = object()


class Properties(Mapping[str, str]):
    """A message's user properties, read-only. A lookup by name searches the stored form (most
    programs ask for a property or two, and a whole decode costs more than the program); listing
    them decodes them all, once. The tag, keys and id are fields of the message, not properties,
    and broker-internal (``__``) properties are not shown."""

    __slots__ = ("_all", "_text")

    def __init__(self, stored: str) -> None:
        self._text = SEPARATOR + stored  # so that every pair follows a separator
        self._all: dict[str, str] | None = None

    def _decoded(self) -> dict[str, str]:
        if self._all is None:
            pairs = (item.split(NAME_VALUE, 1) for item in self._text.split(SEPARATOR) if NAME_VALUE in item)
            self._all = {k: v for k, v in pairs if k not in _FIELDS and k[:2] != "__"}
        return self._all

    def get(self, name: object, default: Any = None) -> Any:
        if self._all is not None or type(name) is not str:
            return self._decoded().get(name, default)  # type: ignore[call-overload]
        if name in _FIELDS or name.startswith("__") or NAME_VALUE in name or SEPARATOR in name:
            return default
        value = _value(self._text, name)
        return default if value is None else value

    def __getitem__(self, name: str) -> str:
        value = self.get(name, _MISSING)
        if value is _MISSING:
            raise KeyError(name)
        return value  # type: ignore[no-any-return]

    def __contains__(self, name: object) -> bool:
        return self.get(name, _MISSING) is not _MISSING

    def __iter__(self) -> Iterator[str]:
        return iter(self._decoded())

    def __len__(self) -> int:
        return len(self._decoded())

    def __repr__(self) -> str:
        return f"Properties({self._decoded()!r})"


class Message(tuple[Any, ...]):
    """``topic``, ``tag`` (str or None), ``keys`` (tuple of str), ``properties`` (a read-only mapping),
    ``body`` (bytes), ``message_id``, ``born_timestamp`` and ``store_timestamp`` (ms), ``queue_id``,
    ``queue_offset``. Immutable: a program cannot change what another program, or the broker, sees.
    The tag, keys and id are read from the properties' stored form when asked for."""

    __slots__ = ()

    topic: str = property(itemgetter(0))  # type: ignore[assignment]
    properties: Mapping[str, str] = property(itemgetter(1))  # type: ignore[assignment]
    body: bytes = property(itemgetter(2))  # type: ignore[assignment]
    born_timestamp: int = property(itemgetter(4))  # type: ignore[assignment]
    store_timestamp: int = property(itemgetter(5))  # type: ignore[assignment]
    queue_id: int = property(itemgetter(6))  # type: ignore[assignment]
    queue_offset: int = property(itemgetter(7))  # type: ignore[assignment]

    @property
    def tag(self) -> str | None:
        return _value(self[1]._text, TAGS)

    @property
    def keys(self) -> tuple[str, ...]:
        keys = _value(self[1]._text, KEYS)
        return tuple(k for k in keys.split(" ") if k) if keys else ()

    @property
    def message_id(self) -> str:
        return _value(self[1]._text, UNIQ_KEY) or self[3]

    def __repr__(self) -> str:
        return f"Message(topic={self[0]!r}, tag={self.tag!r}, message_id={self.message_id!r})"


def message_of(r: Row) -> Message:
    """The message a row stands for."""
    topic, queue_id, queue_offset, stored, body, offset_id, born, store = r
    properties = Properties(stored.decode("utf-8", "replace"))
    return Message((topic, properties, body, offset_id, born, store, queue_id, queue_offset))


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
