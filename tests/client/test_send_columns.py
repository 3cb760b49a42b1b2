"""SendMessages, siftmq's columnar send: the broker reads from the columns exactly the messages the
standard SendMessage request gives (hypothesis, differential), and against a real broker both paths
store the same messages; malformed column requests are refused and store nothing."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from siftmq.broker.model import ProducedBatch
from siftmq.client import FilterExpression, OutgoingMessage, Producer, PullConsumer, ReceivedMessage
from siftmq.client.connection import message_frame, send_columns
from siftmq.errors import RemoteError
from siftmq.protocol import rocketmq_v2_pb2 as pb
from siftmq.protocol import siftmq_batch_pb2 as batch_pb
from siftmq.server import convert

_text = st.text(st.characters(blacklist_characters="\x01\x02", blacklist_categories=("Cs",)), max_size=12)
_word = st.text(st.characters(whitelist_categories=("L", "N")), min_size=1, max_size=8)


@st.composite
def outgoing(draw: Any, topic: str = "T") -> OutgoingMessage:
    return OutgoingMessage(
        topic,
        draw(st.binary(min_size=1, max_size=64)),
        "01" + draw(st.text("0123456789ABCDEF", min_size=8, max_size=16)),
        draw(st.none() | _word),
        tuple(draw(st.lists(_word, max_size=3))),
        draw(st.dictionaries(_word, _text, max_size=4)),
        draw(st.integers(0, 2**42)),
    )


def _messages(batch: ProducedBatch) -> list[tuple[Any, ...]]:
    """Each message of a batch: body, id, tag, keys, properties, born time and host."""
    out = []
    keys_at = props_at = 0
    for i, body in enumerate(batch.bodies):
        key_count, prop_count = batch.key_counts[i], batch.property_counts[i]
        names = batch.property_names[props_at : props_at + prop_count]
        values = batch.property_values[props_at : props_at + prop_count]
        keys = tuple(batch.keys[keys_at : keys_at + key_count])
        properties = dict(zip(names, values, strict=True))
        born = (batch.born_timestamps_ms[i], batch.born_hosts[i])
        out.append((body, batch.message_ids[i], batch.tags[i], keys, properties, *born))
        keys_at += key_count
        props_at += prop_count
    return out


@settings(max_examples=200, deadline=None)
@given(st.lists(outgoing(), min_size=1, max_size=10, unique_by=lambda m: m.message_id), _word | st.just(""))
def test_columns_carry_what_the_standard_request_carries(
    messages: list[OutgoingMessage], namespace: str
) -> None:
    wire = send_columns(namespace, messages).SerializeToString()
    columns = convert.outgoing_batch(batch_pb.SendBatchRequest.FromString(wire))
    frames = [
        pb.Message.FromString(pb.Message(**message_frame(namespace, m)).SerializeToString()) for m in messages
    ]
    standard = [convert.outgoing_message(f, 1 << 20) for f in frames]
    assert {m.topic for m in standard} == {columns.topic}
    assert _messages(columns) == _messages(ProducedBatch.of(columns.topic, standard))
    assert [(m.body, m.message_id, m.tag, m.keys, dict(m.properties), m.born_timestamp_ms, "")
            for m in messages] == _messages(columns)  # fmt: skip


def test_columns_need_messages_of_one_topic() -> None:
    with pytest.raises(ValueError, match="no message"):
        send_columns("", [])
    mixed = [OutgoingMessage("A", b"x", "01A"), OutgoingMessage("B", b"x", "01B")]
    with pytest.raises(ValueError, match=r"one topic, not of \['A', 'B'\]"):
        send_columns("", mixed)


def _stored(m: ReceivedMessage) -> tuple[Any, ...]:
    return (m.body, m.message_id[3:], m.tag, m.keys, dict(m.properties), m.born_timestamp_ms)


@pytest.mark.integration
def test_both_send_paths_store_the_same_messages(start_broker: Any) -> None:
    broker = start_broker()
    rows = [
        (b"plain", None, (), {}),
        (b"tagged", "Pay", ("k1", "k2"), {"price": "12", "region": "Hangzhou"}),
        (
            "unicode \u00e9\u4e2d".encode(),
            "\u6807\u7b7e",
            ("\u952e",),
            {"\u540d": "\u503c \u00e9", "empty": ""},
        ),
        (bytes(range(256)), "Other", (), {"n": "1"}),
    ]

    async def send(topic: str, prefix: str, *, batch: bool) -> list[Any]:
        async with Producer(broker.endpoint) as producer:
            if not batch:
                producer.connection.batch_extension = False
            msgs = [
                OutgoingMessage(topic, body, f"{prefix}{i:04d}", tag, keys, props, 1_700_000_000_000 + i)
                for i, (body, tag, keys, props) in enumerate(rows)
            ]
            receipts = await producer.send_many(msgs)
            assert producer.connection.batch_extension is batch
            return receipts

    async def pull(topic: str) -> list[ReceivedMessage]:
        async with PullConsumer(broker.endpoint, f"g-{topic}", topic, FilterExpression.tag()) as consumer:
            got: list[ReceivedMessage] = []
            for _ in range(20):
                got += await consumer.poll(32, timeout=0.2)
                if len(got) >= len(rows):
                    break
            return got

    async def scenario() -> None:
        by_columns = await send("ColsTopic", "01C", batch=True)
        by_frames = await send("FramesTopic", "01F", batch=False)
        assert all(r.queue_id >= 0 for r in by_columns)
        assert all(r.queue_id == -1 for r in by_frames)  # the standard answer names no queue
        cols, frames = await pull("ColsTopic"), await pull("FramesTopic")
        assert sorted(map(_stored, cols)) == sorted(map(_stored, frames))
        assert len(cols) == len(rows)
        where = {m.message_id: (m.queue_id, m.queue_offset) for m in cols}
        assert {r.message_id: (r.queue_id, r.queue_offset) for r in by_columns} == where

    asyncio.run(scenario())


@pytest.mark.integration
def test_malformed_column_requests_are_refused_and_store_nothing(start_broker: Any) -> None:
    broker = start_broker()
    good = send_columns("", [OutgoingMessage("BadCols", b"x", "01GOOD", "T", ("k",), {"a": "1"}, 1)])

    def broken(**change: Any) -> batch_pb.SendBatchRequest:
        request = batch_pb.SendBatchRequest()
        request.CopyFrom(good)
        for name, value in change.items():
            request.ClearField(name)
            if isinstance(value, list):
                getattr(request, name).extend(value)
            else:
                getattr(request, name).CopyFrom(value)
        return request

    async def scenario() -> None:
        async with Producer(broker.endpoint) as producer:
            conn = producer.connection
            for request, status in (
                (broken(tag=["T", "U"]), "BAD_REQUEST"),
                (broken(key_count=[2]), "ILLEGAL_MESSAGE_KEY"),
                (broken(property_name=["a", "b"]), "BAD_REQUEST"),
                (broken(property_name=["TAGS"]), "ILLEGAL_MESSAGE_PROPERTY_KEY"),
                (broken(message_id=[""]), "ILLEGAL_MESSAGE_ID"),
                (broken(body=[b""]), "MESSAGE_BODY_EMPTY"),
                (broken(topic=pb.Resource(name="bad topic")), "ILLEGAL_TOPIC"),
            ):
                answer = await conn._batch("SendMessages", request, 5.0)
                assert pb.Code.Name(answer.status.code) == status, answer.status
                assert not answer.queue_offset
            async with PullConsumer(broker.endpoint, "g-bad", "BadCols", FilterExpression.tag()) as consumer:
                assert await consumer.poll(8, timeout=0.2) == []
                [receipt] = await producer.send_many(
                    [OutgoingMessage("BadCols", b"x", "01GOOD", "T", ("k",), {"a": "1"}, 1)]
                )  # and the broker keeps serving
                got = await consumer.poll(8, timeout=1.0)
                assert [(m.message_id, m.queue_offset) for m in got] == [("01GOOD", receipt.queue_offset)]
            with pytest.raises(RemoteError) as refused:
                await producer.send_many([OutgoingMessage("BadCols", b"x", "01X", "A|B")])
            assert refused.value.status == "ILLEGAL_MESSAGE_TAG" and refused.value.call == "SendMessages"

    asyncio.run(scenario())
