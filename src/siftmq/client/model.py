"""What the client hands to applications: filter expressions, received messages, send receipts."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from types import MappingProxyType
from typing import Any, Final, NamedTuple

from siftmq.filter import CompiledFilter, compile_filter
from siftmq.protocol import rocketmq_v2_pb2 as pb
from siftmq.protocol.fields import map_to_dict


@dataclass(frozen=True, slots=True)
class FilterExpression:
    """A subscription filter, validated locally with the filter engine before anything is sent.

    ``FilterExpression.tag("Pay||Order")``, ``FilterExpression.sql92("price > 30")``; an invalid
    expression raises :class:`~siftmq.errors.FilterSyntaxError` (its message shows a caret).
    """

    kind: str
    expression: str
    compiled: CompiledFilter = field(compare=False, repr=False)

    @classmethod
    def tag(cls, expression: str = "*") -> FilterExpression:
        return cls("TAG", expression, compile_filter("TAG", expression))

    @classmethod
    def sql92(cls, expression: str) -> FilterExpression:
        return cls("SQL92", expression, compile_filter("SQL92", expression))

    def to_proto(self) -> pb.FilterExpression:
        kind = pb.FilterType.TAG if self.kind == "TAG" else pb.FilterType.SQL
        return pb.FilterExpression(type=kind, expression=self.expression)

    def matches(self, message: ReceivedMessage) -> bool:
        """The client's second check: the exact tag, or the SQL92 expression over the properties."""
        tag_filter = self.compiled.tag_filter
        if tag_filter is not None:
            return tag_filter.matches_tag(message.tag)
        props: dict[str, str] = dict(message.properties)
        if message.tag is not None:
            props["TAGS"] = message.tag
        return self.compiled.matches(props)


class OutgoingMessage(NamedTuple):
    """A message to send, as :meth:`Producer.message <siftmq.client.Producer.message>` makes it.

    ``message_id`` is the client's id (the same on every retry, so the broker stores it once);
    ``born_timestamp_ms`` is when the message was made.
    """

    topic: str
    body: bytes
    message_id: str
    tag: str | None = None
    keys: tuple[str, ...] = ()
    properties: Mapping[str, str] = MappingProxyType({})
    born_timestamp_ms: int = 0


@dataclass(frozen=True, slots=True)
class SendReceipt:
    """Where a sent message was stored; ``queue_id`` is -1 when the broker did not say (the
    standard SendMessage answer carries no queue, siftmq's batch extension does)."""

    message_id: str
    queue_offset: int
    queue_id: int = -1


@dataclass(frozen=True, slots=True)
class ReceivedMessage:
    topic: str
    body: bytes
    message_id: str
    tag: str | None
    keys: tuple[str, ...]
    properties: Mapping[str, str]
    queue_id: int
    queue_offset: int
    delivery_attempt: int
    born_timestamp_ms: int
    store_timestamp_ms: int
    receipt_handle: str = ""

    @classmethod
    def from_proto(cls, m: pb.Message) -> ReceivedMessage:
        sp = m.system_properties
        born, stored = sp.born_timestamp, sp.store_timestamp
        return cls(  # positional and plain arithmetic: this runs once per received message
            m.topic.name,
            m.body,
            sp.message_id,
            sp.tag if sp.HasField("tag") else None,
            tuple(sp.keys),
            map_to_dict(m.user_properties),
            sp.queue_id,
            sp.queue_offset,
            sp.delivery_attempt or 1,
            born.seconds * 1000 + born.nanos // 1_000_000,
            stored.seconds * 1000 + stored.nanos // 1_000_000,
            sp.receipt_handle,
        )

    @classmethod
    def from_columns(cls, topic: str, columns: Any) -> list[ReceivedMessage]:
        """The messages of a batch answer's ``MessageColumns`` (all of ``topic``)."""
        n = len(columns.body)
        names, values = list(columns.property_name), list(columns.property_value)
        handles = list(columns.receipt_handle) or [""] * n
        out: list[ReceivedMessage] = []
        at = 0
        for body, message_id, tag, keys, count, queue_id, offset, attempt, born, stored, handle in zip(
            columns.body, columns.message_id, columns.tag, columns.keys, columns.property_count,
            columns.queue_id, columns.queue_offset, columns.delivery_attempt, columns.born_timestamp_ms,
            columns.store_timestamp_ms, handles, strict=True,
        ):  # fmt: skip
            if count:
                properties = dict(zip(names[at : at + count], values[at : at + count], strict=True))
                at += count
            else:
                properties = {}
            out.append(
                _new_received((topic, body, message_id, tag or None, tuple(keys.split()) if keys else (),
                               properties, queue_id, offset, attempt or 1, born, stored, handle))
            )  # fmt: skip
        if at != len(names) or len(names) != len(values):
            raise ValueError(
                f"the answer's property columns do not add up ({at}, {len(names)}, {len(values)})"
            )
        return out


def _received_constructor() -> Any:
    """``ReceivedMessage(*values)``, each slot set by its own call: half the cost of a loop over
    the slots (``siftmq.slots.frozen_slots_constructor``), ~0.7 against ~1.2 us, once per message."""
    setters = tuple(ReceivedMessage.__dict__[f.name].__set__ for f in fields(ReceivedMessage))
    if len(setters) != 12:  # a field added or removed: the calls below must follow
        raise TypeError(f"ReceivedMessage has {len(setters)} fields; its constructor sets 12")
    s0, s1, s2, s3, s4, s5, s6, s7, s8, s9, s10, s11 = setters
    new = object.__new__

    def construct(v: tuple[Any, ...]) -> ReceivedMessage:
        m = new(ReceivedMessage)
        s0(m, v[0])
        s1(m, v[1])
        s2(m, v[2])
        s3(m, v[3])
        s4(m, v[4])
        s5(m, v[5])
        s6(m, v[6])
        s7(m, v[7])
        s8(m, v[8])
        s9(m, v[9])
        s10(m, v[10])
        s11(m, v[11])
        return m

    return construct


_new_received: Final = _received_constructor()


def check_count(name: str, value: int, least: int = 1) -> None:
    """``ValueError`` naming ``name`` unless ``value`` is an int (not a bool) of ``least`` or more."""
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise ValueError(f"{name} must be {least} or more, not {value!r}")
