"""Protobuf <-> broker domain types."""

from __future__ import annotations

import functools
import zlib
from collections.abc import Sequence
from typing import Any

from google.protobuf.duration_pb2 import Duration
from google.protobuf.timestamp_pb2 import Timestamp

from siftmq.broker.model import (
    PROPERTY_BORN_HOST,
    Delivery,
    ProducedBatch,
    ProducedMessage,
    Subscription,
    user_properties,
)
from siftmq.broker.validation import qualified_name
from siftmq.errors import BadRequestError, StatusCode, UnsupportedError
from siftmq.protocol import rocketmq_v2_pb2 as pb
from siftmq.protocol import siftmq_batch_pb2 as batch_pb
from siftmq.protocol.fields import map_to_dict
from siftmq.store import PROPERTY_KEYS, PROPERTY_TAGS, PROPERTY_UNIQ_KEY, StoredMessage

FILTER_TYPES = {pb.FilterType.TAG: "TAG", pb.FilterType.SQL: "SQL92"}
# enum attribute lookups go through a slow Python wrapper: resolve the per-message ones once
_GZIP = pb.Encoding.GZIP
_IDENTITY = pb.Encoding.IDENTITY
_PLAIN = (_IDENTITY, pb.Encoding.ENCODING_UNSPECIFIED)
_NORMAL_TYPES = (pb.MessageType.MESSAGE_TYPE_UNSPECIFIED, pb.MessageType.NORMAL)
# protobuf's Timestamp range (years 1 to 9999): a born time outside it is no time at all
_MIN_SECONDS, _MAX_SECONDS = -62_135_596_800, 253_402_300_799
_CRC32 = pb.DigestType.CRC32
_NORMAL = pb.MessageType.NORMAL


#: Characters of a client id the broker keeps (its sessions, and who owns them): a longer one is
#: cut, so one header cannot grow the session table.
MAX_CLIENT_ID_LENGTH = 256


def topic_name(resource: pb.Resource) -> str:
    return _qualified(resource.resource_namespace, resource.name)


def call_header(context: Any, name: str, limit: int) -> str | None:
    """A request metadata value (at most ``limit`` characters), or None when absent."""
    for key, value in context.invocation_metadata() or ():
        if key == name:
            return str(value)[:limit]
    return None


def client_id_of(context: Any) -> str:
    """The client id a call names, as the broker keys the client's session by it ("" for none)."""
    return call_header(context, "x-mq-client-id", MAX_CLIENT_ID_LENGTH) or ""


#: Distinct names (topics, groups, hosts) remembered by the per-message conversions: names repeat.
NAME_CACHE_SIZE = 4096
_qualified = functools.lru_cache(maxsize=NAME_CACHE_SIZE)(qualified_name)


def enum_name(enum: Any, value: int, field: str) -> str:
    """The name of an enum value a request carries; a number the protocol does not define is the
    client's error (protobuf keeps unknown enum numbers as they are)."""
    try:
        return str(enum.Name(value))
    except ValueError:
        raise BadRequestError(f"{field} {value} is not a {enum.DESCRIPTOR.name} value") from None


def duration_ms(d: Duration) -> int:
    return d.seconds * 1000 + d.nanos // 1_000_000


def timestamp_ms(t: Timestamp) -> int:
    return t.seconds * 1000 + t.nanos // 1_000_000


def subscription_of(topic: str, expression: pb.FilterExpression) -> Subscription:
    """A TAG/SQL filter expression (unspecified type means TAG, empty expression means ``*``)."""
    kind = FILTER_TYPES.get(expression.type, "TAG") if expression.type else "TAG"
    if expression.type and expression.type not in FILTER_TYPES:
        raise BadRequestError(
            f"unknown filter type {expression.type}", status=StatusCode.ILLEGAL_FILTER_EXPRESSION
        )
    return Subscription(topic, kind, expression.expression or ("*" if kind == "TAG" else ""))


def outgoing_message(msg: pb.Message, max_body_size: int) -> ProducedMessage:
    sp = msg.system_properties
    body = msg.body
    encoding = sp.body_encoding
    if encoding == _GZIP:
        body = _gunzip(body, max_body_size)
    elif encoding not in _PLAIN:
        raise BadRequestError(f"unknown body encoding {encoding}")
    kind = sp.message_type
    if kind not in _NORMAL_TYPES:
        # delivered as a normal message at once, a transaction's half message could never be rolled
        # back (this broker has no EndTransaction): refused, as a delay or FIFO message is
        name = pb.MessageType.Name(kind) if kind in pb.MessageType.values() else f"type {kind}"
        raise UnsupportedError(
            f"{name} messages are not supported by this broker (NORMAL ones are)",
            status=StatusCode.UNSUPPORTED,
        )
    if sp.HasField("lite_topic") or sp.HasField("priority"):
        raise UnsupportedError(
            "lite topics and message priorities are not supported by this broker",
            status=StatusCode.UNSUPPORTED,
        )
    keys = sp.keys
    born = sp.born_timestamp
    if not _MIN_SECONDS <= born.seconds <= _MAX_SECONDS:
        raise BadRequestError(f"born_timestamp {born.seconds} s is outside the timestamps a message may have")
    return ProducedMessage(  # positional, in field order: this runs once per message sent
        topic_name(msg.topic),
        body,
        sp.message_id,
        sp.tag if sp.HasField("tag") else None,
        list(keys) if len(keys) else [],
        map_to_dict(msg.user_properties),
        born.seconds * 1000 + born.nanos // 1_000_000,
        sp.born_host,
        sp.message_group if sp.HasField("message_group") else None,
        timestamp_ms(sp.delivery_timestamp) if sp.HasField("delivery_timestamp") else None,
    )


def outgoing_batch(request: batch_pb.SendBatchRequest) -> ProducedBatch:
    """A SendMessages request's columns (the broker checks that they agree)."""
    count = len(request.body)
    return ProducedBatch(
        topic_name(request.topic),
        list(request.body),
        list(request.message_id),
        [tag or None for tag in request.tag],
        list(request.key_count),
        list(request.key),
        list(request.property_count),
        list(request.property_name),
        list(request.property_value),
        list(request.born_timestamp_ms),
        [request.born_host] * count,
    )


def _gunzip(data: bytes, limit: int) -> bytes:
    inflater = zlib.decompressobj(wbits=47)  # gzip or zlib header
    try:
        out = inflater.decompress(data, limit + 1)
    except zlib.error as exc:
        raise BadRequestError(f"GZIP body cannot be decompressed: {exc}") from exc
    if len(out) > limit or inflater.unconsumed_tail:
        raise BadRequestError(
            f"decompressed body exceeds the limit {limit}", status=StatusCode.MESSAGE_BODY_TOO_LARGE
        )
    return out


def message_fields(
    m: StoredMessage,
    topic: pb.Resource,
    *,
    message_id: str | None = None,
    receipt_handle: str = "",
    delivery_attempt: int = 1,
    invisible_ms: int = 0,
) -> dict[str, Any]:
    """A delivered message as ``pb.Message`` constructor arguments.

    Plain dicts, not message objects, and no empty parts: protobuf builds nested messages from dicts
    in C, several times faster than building each part as an object. This runs once per delivered
    message. The invisible duration travels with a receipt handle only (pulled messages have none).
    """
    props = m.properties
    born, stored = m.born_timestamp, m.store_timestamp
    sp: dict[str, Any] = {
        "message_id": message_id or props.get(PROPERTY_UNIQ_KEY) or m.offset_msg_id,
        "body_digest": {"type": _CRC32, "checksum": f"{m.body_crc & 0xFFFFFFFF:08X}"},
        "body_encoding": _IDENTITY,
        "message_type": _NORMAL,
        "born_timestamp": {"seconds": born // 1000, "nanos": born % 1000 * 1_000_000},
        "born_host": props.get(PROPERTY_BORN_HOST) or _host(m.born_host),
        "store_timestamp": {"seconds": stored // 1000, "nanos": stored % 1000 * 1_000_000},
        "store_host": _host(m.store_host),
        "queue_id": m.queue_id,
        "queue_offset": m.queue_offset,
        "delivery_attempt": delivery_attempt,
        "tag": props.get(PROPERTY_TAGS),  # None leaves the optional field unset
    }
    if receipt_handle:
        sp["receipt_handle"] = receipt_handle
        sp["invisible_duration"] = {"seconds": invisible_ms // 1000, "nanos": invisible_ms % 1000 * 1_000_000}
    keys = props.get(PROPERTY_KEYS)
    if keys:
        sp["keys"] = keys.split()  # stored space-separated; keys never hold whitespace
    fields = {
        "topic": {"resource_namespace": topic.resource_namespace, "name": topic.name},
        "system_properties": sp,
        "body": m.body,
    }
    user = user_properties(props)
    if user:
        fields["user_properties"] = user
    return fields


def delivery_fields(delivery: Delivery, topic: pb.Resource) -> dict[str, Any]:
    """A receive's delivery (with its receipt handle and attempt) as ``pb.Message`` arguments."""
    return message_fields(
        delivery.message,
        topic,
        message_id=delivery.message_id,
        receipt_handle=delivery.receipt_handle,
        delivery_attempt=delivery.delivery_attempt,
        invisible_ms=delivery.invisible_ms,
    )


def message_columns(messages: Sequence[StoredMessage], deliveries: Sequence[Delivery] = ()) -> dict[str, Any]:
    """Messages as ``MessageColumns`` constructor arguments (the batch extension's answer).

    Pass the stored messages of a pull, or the messages of a receive's ``deliveries`` together
    with the deliveries (their handles and attempts). One list per column, filled in one pass:
    protobuf builds repeated fields from lists in C, which is several times cheaper than one
    nested ``Message`` (with a properties map) per message.
    """
    body: list[bytes] = []
    message_id: list[str] = []
    tag: list[str] = []
    keys: list[str] = []
    property_count: list[int] = []
    property_name: list[str] = []
    property_value: list[str] = []
    queue_id: list[int] = []
    queue_offset: list[int] = []
    born: list[int] = []
    stored: list[int] = []
    for m in messages:
        props = m.properties
        body.append(m.body)
        message_id.append(props.get(PROPERTY_UNIQ_KEY) or m.offset_msg_id)
        tag.append(props.get(PROPERTY_TAGS) or "")
        keys.append(props.get(PROPERTY_KEYS) or "")  # stored space-separated
        user = user_properties(props)
        if user:
            property_name += user
            property_value += user.values()
        property_count.append(len(user))
        queue_id.append(m.queue_id)
        queue_offset.append(m.queue_offset)
        born.append(m.born_timestamp)
        stored.append(m.store_timestamp)
    columns: dict[str, Any] = {
        "body": body,
        "message_id": message_id,  # a delivery's id is its message's (Delivery.message_id)
        "tag": tag,
        "keys": keys,
        "property_count": property_count,
        "property_name": property_name,
        "property_value": property_value,
        "queue_id": queue_id,
        "queue_offset": queue_offset,
        "delivery_attempt": [d.delivery_attempt for d in deliveries] if deliveries else [1] * len(body),
        "born_timestamp_ms": born,
        "store_timestamp_ms": stored,
    }
    if deliveries:
        columns["receipt_handle"] = [d.receipt_handle for d in deliveries]
    return columns


@functools.lru_cache(maxsize=NAME_CACHE_SIZE)
def _host(raw: bytes) -> str:
    """The IPv4 part of a stored 8-byte host (cached: hosts repeat, and this runs per delivered message)."""
    return ".".join(str(b) for b in raw[:4]) if len(raw) >= 4 else ""
