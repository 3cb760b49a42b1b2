"""Protobuf <-> broker domain types."""

from __future__ import annotations

import functools
import zlib

from google.protobuf.duration_pb2 import Duration
from google.protobuf.timestamp_pb2 import Timestamp

from siftmq.broker.model import PROPERTY_BORN_HOST, Delivery, OutgoingMessage, Subscription
from siftmq.broker.validation import qualified_name
from siftmq.errors import BadRequestError
from siftmq.protocol import rocketmq_v2_pb2 as pb
from siftmq.store import StoredMessage

#: Properties the broker keeps in the system part of a delivered message, not the user part.
SYSTEM_PROPERTIES = frozenset({"TAGS", "KEYS", "UNIQ_KEY", PROPERTY_BORN_HOST})
FILTER_TYPES = {pb.FilterType.TAG: "TAG", pb.FilterType.SQL: "SQL92"}
# enum attribute lookups go through a slow Python wrapper: resolve the per-message ones once
_GZIP = pb.Encoding.GZIP
_IDENTITY = pb.Encoding.IDENTITY
_PLAIN = (_IDENTITY, pb.Encoding.ENCODING_UNSPECIFIED)
_CRC32 = pb.DigestType.CRC32
_NORMAL = pb.MessageType.NORMAL


def topic_name(resource: pb.Resource) -> str:
    return qualified_name(resource.resource_namespace, resource.name)


def duration_ms(d: Duration) -> int:
    return d.seconds * 1000 + d.nanos // 1_000_000


def timestamp_ms(t: Timestamp) -> int:
    return t.seconds * 1000 + t.nanos // 1_000_000


def ms_timestamp(ms: int) -> Timestamp:
    return Timestamp(seconds=ms // 1000, nanos=(ms % 1000) * 1_000_000)


def subscription_of(topic: str, expression: pb.FilterExpression) -> Subscription:
    """A TAG/SQL filter expression (unspecified type means TAG, empty expression means ``*``)."""
    kind = FILTER_TYPES.get(expression.type, "TAG") if expression.type else "TAG"
    if expression.type and expression.type not in FILTER_TYPES:
        raise BadRequestError(f"unknown filter type {expression.type}", status="ILLEGAL_FILTER_EXPRESSION")
    return Subscription(topic, kind, expression.expression or ("*" if kind == "TAG" else ""))


def outgoing_message(msg: pb.Message, max_body_size: int) -> OutgoingMessage:
    sp = msg.system_properties
    body = msg.body
    if sp.body_encoding == _GZIP:
        body = _gunzip(body, max_body_size)
    elif sp.body_encoding not in _PLAIN:
        raise BadRequestError(f"unknown body encoding {sp.body_encoding}")
    return OutgoingMessage(
        topic=topic_name(msg.topic),
        body=body,
        message_id=sp.message_id,
        tag=sp.tag if sp.HasField("tag") else None,
        keys=list(sp.keys),
        user_properties=dict(msg.user_properties),
        born_timestamp_ms=timestamp_ms(sp.born_timestamp),
        born_host=sp.born_host,
        message_group=sp.message_group if sp.HasField("message_group") else None,
        delivery_timestamp_ms=(
            timestamp_ms(sp.delivery_timestamp) if sp.HasField("delivery_timestamp") else None
        ),
    )


def _gunzip(data: bytes, limit: int) -> bytes:
    inflater = zlib.decompressobj(wbits=47)  # gzip or zlib header
    try:
        out = inflater.decompress(data, limit + 1)
    except zlib.error as exc:
        raise BadRequestError(f"GZIP body cannot be decompressed: {exc}") from exc
    if len(out) > limit or inflater.unconsumed_tail:
        raise BadRequestError(f"decompressed body exceeds the limit {limit}", status="MESSAGE_BODY_TOO_LARGE")
    return out


def delivered_message(delivery: Delivery, topic: pb.Resource) -> pb.Message:
    m: StoredMessage = delivery.message
    props = m.properties
    sp = pb.SystemProperties(
        message_id=delivery.message_id,
        body_digest=pb.Digest(type=_CRC32, checksum=f"{m.body_crc & 0xFFFFFFFF:08X}"),
        body_encoding=_IDENTITY,
        message_type=_NORMAL,
        born_timestamp=ms_timestamp(m.born_timestamp),
        born_host=props.get(PROPERTY_BORN_HOST) or _host(m.born_host),
        store_timestamp=ms_timestamp(m.store_timestamp),
        store_host=_host(m.store_host),
        queue_id=m.queue_id,
        queue_offset=m.queue_offset,
        invisible_duration=Duration(
            seconds=delivery.invisible_ms // 1000, nanos=(delivery.invisible_ms % 1000) * 1_000_000
        ),
        delivery_attempt=delivery.delivery_attempt,
    )
    if delivery.receipt_handle:
        sp.receipt_handle = delivery.receipt_handle
    if m.tags is not None:
        sp.tag = m.tags
    sp.keys.extend(m.keys)
    user = {k: v for k, v in props.items() if k not in SYSTEM_PROPERTIES and not k.startswith("__")}
    return pb.Message(
        topic=pb.Resource(resource_namespace=topic.resource_namespace, name=topic.name),
        user_properties=user,
        system_properties=sp,
        body=m.body,
    )


def pulled_message(m: StoredMessage, topic: pb.Resource) -> pb.Message:
    """A message of an offset pull: no receipt handle, delivery attempt 1."""
    return delivered_message(Delivery(m, "", 1, 0), topic)


@functools.lru_cache(maxsize=4096)
def _host(raw: bytes) -> str:
    """The IPv4 part of a stored 8-byte host (cached: hosts repeat, and this runs per delivered message)."""
    return ".".join(str(b) for b in raw[:4]) if len(raw) >= 4 else ""
