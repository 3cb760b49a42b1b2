"""The broker's domain types: what a producer sends and what a consumer receives."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final, NamedTuple

from siftmq.broker.validation import MAX_MESSAGE_ID_LENGTH, MAX_TOPIC_LENGTH
from siftmq.store import PROPERTY_KEYS, PROPERTY_TAGS, PROPERTY_UNIQ_KEY, StoredMessage

PROPERTY_BORN_HOST = "__BORN_HOST"
PROPERTY_DLQ_ORIGIN_TOPIC = "DLQ_ORIGIN_TOPIC"
PROPERTY_DLQ_ORIGIN_MESSAGE_ID = "DLQ_ORIGIN_MESSAGE_ID"
#: A resent dead letter's: the message id the first copy had (every subscribed group gets it again).
PROPERTY_RESENT_FROM = "RESENT_FROM_MESSAGE_ID"
#: Why a filter program failed on a message it sent to the dead-letter topic ("Type: message").
PROPERTY_FILTER_ERROR = "FILTER_ERROR"
#: UTF-8 bytes of a dead-letter copy's FILTER_ERROR text, at most (a longer one is cut).
MAX_FILTER_ERROR_BYTES: Final = 700


def filter_error_text(why: str) -> str:
    """``why`` cut to :data:`MAX_FILTER_ERROR_BYTES` of UTF-8, at a character boundary."""
    encoded = why.encode("utf-8", "replace")
    if len(encoded) <= MAX_FILTER_ERROR_BYTES:
        return why
    return encoded[:MAX_FILTER_ERROR_BYTES].decode("utf-8", "ignore")


#: Property bytes every sent message leaves free below the record limit (32,767): what a
#: dead-letter copy adds, each ``name\x01value\x02`` at its largest (the origin topic and
#: message id are ASCII). A message the broker accepted must always fit its dead-letter copy:
#: one that did not could never leave its group, and the move is retried until it fits.
DEAD_LETTER_RESERVE: Final = (
    len(PROPERTY_DLQ_ORIGIN_TOPIC) + 2 + MAX_TOPIC_LENGTH
    + len(PROPERTY_DLQ_ORIGIN_MESSAGE_ID) + 2 + MAX_MESSAGE_ID_LENGTH
    + len(PROPERTY_FILTER_ERROR) + 2 + MAX_FILTER_ERROR_BYTES
)  # fmt: skip
#: Properties the broker keeps in the system part of a delivered message, not the user part.
SYSTEM_PROPERTIES = frozenset({PROPERTY_TAGS, PROPERTY_KEYS, PROPERTY_UNIQ_KEY, PROPERTY_BORN_HOST})


def user_properties(props: Mapping[str, str]) -> dict[str, str]:
    """The properties a delivered message carries as user properties (neither system nor ``__``-prefixed)."""
    if props.keys() <= SYSTEM_PROPERTIES:  # most messages: a set comparison is half the comprehension
        return {}
    return {k: v for k, v in props.items() if k not in SYSTEM_PROPERTIES and k[:2] != "__"}


@dataclass(slots=True)
class ProducedMessage:
    """A message as a producer sends it (before validation).

    Not frozen: one is built per message sent, and a frozen dataclass costs twice as much to build.
    """

    topic: str
    body: bytes
    message_id: str
    tag: str | None = None
    keys: Sequence[str] = ()
    user_properties: Mapping[str, str] = field(default_factory=dict)
    born_timestamp_ms: int = 0
    born_host: str = ""
    message_group: str | None = None
    delivery_timestamp_ms: int | None = None


class ProducedBatch(NamedTuple):
    """Messages of one topic as a producer sends them, column by column (before validation).

    Entry i of every per-message column belongs to message i. Keys and user properties are
    flattened: message i has ``key_counts[i]`` keys and ``property_counts[i]`` properties, taken in
    order from ``keys`` and from ``property_names`` / ``property_values``. Built by
    :meth:`of` from :class:`ProducedMessage` objects, or straight from a columnar request.
    """

    topic: str
    bodies: Sequence[bytes]
    message_ids: Sequence[str]
    tags: Sequence[str | None]
    key_counts: Sequence[int]
    keys: Sequence[str]
    property_counts: Sequence[int]
    property_names: Sequence[str]
    property_values: Sequence[str]
    born_timestamps_ms: Sequence[int]
    born_hosts: Sequence[str]

    @classmethod
    def of(cls, topic: str, msgs: Sequence[ProducedMessage]) -> ProducedBatch:
        """``msgs`` (all of ``topic``; FIFO and delay fields are not carried) as columns."""
        keys: list[str] = []
        names: list[str] = []
        values: list[str] = []
        for m in msgs:
            keys.extend(m.keys)
            names.extend(m.user_properties)
            values.extend(m.user_properties.values())
        return cls(
            topic,
            [m.body for m in msgs],
            [m.message_id for m in msgs],
            [m.tag for m in msgs],
            [len(m.keys) for m in msgs],
            keys,
            [len(m.user_properties) for m in msgs],
            names,
            values,
            [m.born_timestamp_ms for m in msgs],
            [m.born_host for m in msgs],
        )


class SendResult(NamedTuple):
    """Where a sent message was stored (a named tuple: one is built per message sent)."""

    message_id: str
    queue_id: int
    queue_offset: int
    duplicate: bool = False


class Delivery(NamedTuple):
    """One message handed to a consumer: the stored message and this delivery's handle and attempt.

    A named tuple: one is built per message received, and a frozen dataclass costs four times as
    much to build (~0.6 against ~0.15 µs)."""

    message: StoredMessage
    receipt_handle: str
    delivery_attempt: int
    invisible_ms: int

    @property
    def message_id(self) -> str:
        return self.message.uniq_key or self.message.offset_msg_id


@dataclass(frozen=True, slots=True)
class Subscription:
    """What a consumer asked for on one topic: a filter kind (``TAG``/``SQL92``) and its expression."""

    topic: str
    kind: str
    expression: str


@dataclass(frozen=True, slots=True)
class PullResult:
    """The answer to an offset-based pull.

    ``status`` is ``FOUND`` (messages), ``NO_NEW_MESSAGE`` (nothing at or after ``offset`` yet),
    ``NO_MATCHED_MESSAGE`` (entries were passed over; pull again from ``next_offset``) or
    ``ILLEGAL_OFFSET`` (``offset`` is outside the queue; ``next_offset`` is where to resume).
    """

    status: str
    messages: list[StoredMessage]
    next_offset: int
    min_offset: int
    max_offset: int
