"""The batch extension's column layout: what the broker encodes, the client decodes to the same
messages the standard one-Message-per-frame path gives (hypothesis, differential)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from siftmq.broker.model import Delivery
from siftmq.client import connection
from siftmq.client.model import ReceivedMessage
from siftmq.errors import RemoteError
from siftmq.protocol import rocketmq_v2_pb2 as pb
from siftmq.protocol import siftmq_batch_pb2 as batch_pb
from siftmq.server import convert
from siftmq.store import StoredMessage

_text = st.text(st.characters(blacklist_characters="\x01\x02", blacklist_categories=("Cs",)), max_size=10)
_word = st.text(st.characters(whitelist_categories=("L", "N")), min_size=1, max_size=8)


@st.composite
def stored_messages(draw: Any) -> StoredMessage:
    props: dict[str, str] = draw(st.dictionaries(_word, _text, max_size=4))
    if draw(st.booleans()):
        props["TAGS"] = draw(_word)
    if draw(st.booleans()):
        props["KEYS"] = " ".join(draw(st.lists(_word, min_size=1, max_size=3)))
    if draw(st.booleans()):
        props["UNIQ_KEY"] = draw(_word)
    if draw(st.booleans()):
        props["__BORN_HOST"] = "10.0.0.1"  # system: never a user property
    return StoredMessage(
        topic="T", body=draw(st.binary(max_size=64)), queue_id=draw(st.integers(0, 7)),
        queue_offset=draw(st.integers(0, 2**40)), commit_log_offset=draw(st.integers(0, 2**40)),
        store_size=100, properties=props, flag=0, sys_flag=0,
        born_timestamp=draw(st.integers(0, 2**42)), born_host=bytes(8),
        store_timestamp=draw(st.integers(0, 2**42)), store_host=bytes([127, 0, 0, 1, 0, 0, 0x27, 0x10]),
        reconsume_times=0, prepared_transaction_offset=0, body_crc=0,
    )  # fmt: skip


def _fields(m: ReceivedMessage) -> tuple[Any, ...]:
    return (m.topic, m.body, m.message_id, m.tag, m.keys, dict(m.properties), m.queue_id, m.queue_offset,
            m.delivery_attempt, m.born_timestamp_ms, m.store_timestamp_ms, m.receipt_handle)  # fmt: skip


@settings(max_examples=150, deadline=None)
@given(st.lists(stored_messages(), max_size=12), st.booleans())
def test_columns_decode_to_what_the_frames_give(messages: list[StoredMessage], receive: bool) -> None:
    topic = pb.Resource(name="T")
    deliveries = (
        [Delivery(m, f"handle-{i}", i % 3 + 1, 30_000) for i, m in enumerate(messages)] if receive else []
    )
    if receive:
        framed = [pb.Message(**convert.delivery_fields(d, topic)) for d in deliveries]
        wire = batch_pb.ReceiveBatchResponse(messages=convert.message_columns(messages, deliveries))
        decoded = batch_pb.ReceiveBatchResponse.FromString(wire.SerializeToString())
    else:
        framed = [pb.Message(**convert.message_fields(m, topic)) for m in messages]
        wire_pull = batch_pb.PullBatchResponse(messages=convert.message_columns(messages))
        decoded = batch_pb.PullBatchResponse.FromString(wire_pull.SerializeToString())  # type: ignore[assignment]
    from_frames = [ReceivedMessage.from_proto(pb.Message.FromString(m.SerializeToString())) for m in framed]
    from_columns = ReceivedMessage.from_columns("T", decoded.messages)
    assert list(map(_fields, from_columns)) == list(map(_fields, from_frames))


def test_inconsistent_columns_are_refused() -> None:
    columns = batch_pb.MessageColumns(
        body=[b"a"], message_id=["m"], tag=[""], keys=[""], property_count=[2], property_name=["p"],
        property_value=["v"], queue_id=[0], queue_offset=[0], delivery_attempt=[1],
        born_timestamp_ms=[0], store_timestamp_ms=[0],
    )  # fmt: skip
    with pytest.raises(ValueError, match="do not add up"):
        ReceivedMessage.from_columns("T", columns)
    del columns.queue_offset[:]
    with pytest.raises(ValueError):
        ReceivedMessage.from_columns("T", columns)


def test_a_malformed_answer_is_a_remote_error() -> None:
    columns = batch_pb.MessageColumns(body=[b"a"], message_id=["m"])  # the other columns are missing
    with pytest.raises(RemoteError, match=r"PullMessages: BAD_ANSWER .*malformed answer") as info:
        connection._from_columns("PullMessages", "T", columns)
    assert info.value.status == "BAD_ANSWER" and not info.value.is_retriable
