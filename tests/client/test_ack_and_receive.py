"""SimpleConsumer.receive(ack=...): the acknowledgements ride along with the next receive, in one
AckAndReceive call through siftmq's extension and as AckMessage + ReceiveMessage without it; the
same messages either way, each acknowledged once; a failed acknowledgement receives nothing."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from typing import Any

import pytest

from client_helpers import assert_all_acknowledged
from siftmq.client import FilterExpression, Producer, ReceivedMessage, SimpleConsumer
from siftmq.errors import RemoteError
from siftmq.protocol import rocketmq_v2_pb2 as pb
from siftmq.protocol.service import MAX_ACK_ENTRIES
from siftmq.testing import record_calls

pytestmark = pytest.mark.integration

FAST = {"min_invisible_time_s": 0.05}
INVISIBLE_S = 2.0


async def _consumer(endpoint: str, topic: str, count: int, *, extension: bool) -> SimpleConsumer:
    """A consumer (to enter) of ``topic`` (group: the topic's name), after ``count`` messages were sent
    to it (bodies "0", "1", ...); ``extension=False`` as against a broker without siftmq's extension."""
    async with Producer(endpoint) as producer:
        for first in range(0, count, 256):
            last = min(first + 256, count)
            await producer.send_many([producer.message(topic, f"{i}".encode()) for i in range(first, last)])
    consumer = SimpleConsumer(endpoint, topic.lower(), {topic: FilterExpression.tag()}, await_duration=0.3)
    if not extension:
        consumer.connection.batch_extension = False
    return consumer


@pytest.mark.parametrize("extension", [True, False])
def test_acks_ride_along_with_the_next_receive(start_broker: Any, extension: bool) -> None:
    broker = start_broker(config=FAST)

    async def scenario() -> None:
        async with await _consumer(broker.endpoint, "AlongTopic", 100, extension=extension) as c:
            calls = record_calls(c)
            seen: list[str] = []
            batch: list[ReceivedMessage] = []
            rounds = 0
            while True:
                batch = await c.receive(16, INVISIBLE_S, ack=batch)
                rounds += 1
                if not batch:
                    break
                seen += [m.body.decode() for m in batch]
            assert sorted(seen, key=int) == [str(i) for i in range(100)]  # each once
            if extension:
                assert calls == ["ReceiveMessages"] + ["AckAndReceive"] * (rounds - 1)
            else:
                assert calls.count("AckMessage") == rounds - 1
            await asyncio.sleep(INVISIBLE_S + 0.3)  # anything not acknowledged is visible again
            assert await c.receive(16, INVISIBLE_S) == []

    asyncio.run(scenario())


@pytest.mark.parametrize("extension", [True, False])
def test_a_failed_acknowledgement_receives_nothing(start_broker: Any, extension: bool) -> None:
    broker = start_broker(config=FAST)

    async def scenario() -> None:
        async with await _consumer(broker.endpoint, "FailTopic", 20, extension=extension) as c:
            first = await c.receive(10, 30)
            assert len(first) == 10
            await c.ack_many(first)
            with pytest.raises(RemoteError) as failed:
                await c.receive(10, 30, ack=first)  # already acknowledged
            assert failed.value.status == "INVALID_RECEIPT_HANDLE" and "not in flight" in str(failed.value)
            rest = await c.receive(10, 30)  # the failed call took none of them out of sight
            assert sorted(m.body.decode() for m in first + rest) == sorted(str(i) for i in range(20))

    asyncio.run(scenario())


def test_acks_of_this_and_another_topic_in_one_receive(start_broker: Any) -> None:
    broker = start_broker(config=FAST)

    async def scenario() -> None:
        async with Producer(broker.endpoint) as producer:
            for topic in ("TwoA", "TwoB"):
                await producer.send_many([producer.message(topic, topic.encode()) for _ in range(6)])
        subscriptions = {"TwoA": FilterExpression.tag(), "TwoB": FilterExpression.tag()}
        async with SimpleConsumer(broker.endpoint, "two", subscriptions, await_duration=0.3) as c:
            calls = record_calls(c)
            got: list[ReceivedMessage] = []
            pending: list[ReceivedMessage] = []
            for n in range(8):  # topics in turn, 2 at a time; every other call acknowledges both topics
                ack = pending if n % 2 == 0 else []
                batch = await c.receive(2, INVISIBLE_S, ack=ack)
                pending = batch if ack else pending + batch
                got += batch
            await c.ack_many(pending)
            assert sorted(m.body for m in got) == [b"TwoA"] * 6 + [b"TwoB"] * 6
            assert "AckAndReceive" in calls and "AckMessage" in calls
            await asyncio.sleep(INVISIBLE_S + 0.3)
            assert await c.receive(16, INVISIBLE_S) == [] and await c.receive(16, INVISIBLE_S) == []

    asyncio.run(scenario())


def test_a_broker_without_the_call_keeps_the_rest_of_the_extension(start_broker: Any) -> None:
    """An older siftmq serves the extension without AckAndReceive: its UNIMPLEMENTED (here: the
    call asked for under a name the broker does not serve) leaves the other batch calls in use,
    even as a consumer's first call."""
    broker = start_broker(config=FAST)

    async def scenario() -> None:
        async with Producer(broker.endpoint) as producer:
            await producer.send_many([producer.message("OldTopic", b"x") for _ in range(8)])
        subscriptions = {"OldTopic": FilterExpression.tag()}
        async with SimpleConsumer(broker.endpoint, "old", subscriptions, await_duration=0.3) as first:
            taken = await first.receive(4, 30)
        async with SimpleConsumer(broker.endpoint, "old", subscriptions, await_duration=0.3) as c:
            original = c.connection._method

            def older_broker(rpc: Any, request: Any) -> Any:
                if rpc.name == "AckAndReceive":
                    rpc = dataclasses.replace(rpc, name="AckAndReceiveNotServed")
                return original(rpc, request)

            c.connection._method = older_broker  # type: ignore[method-assign]
            calls = record_calls(c)
            rest = await c.receive(16, 30, ack=taken)  # the consumer's first call
            assert len(rest) == 4 and c.connection.batch_extension is not False
            assert calls == ["AckAndReceive", "AckMessage", "ReceiveMessages"]
            await c.receive(16, 30, ack=rest)
            assert calls[3:] == ["AckMessage", "ReceiveMessages"]  # remembered: not asked again

    asyncio.run(scenario())


def test_acks_are_bounded_per_request_and_the_client_splits_them(start_broker: Any) -> None:
    """A broker takes at most MAX_ACK_ENTRIES acks in one request (more: BAD_REQUEST, none made);
    ack_many and receive(ack=...) split a larger set into requests it takes, and an entry that
    fails in one request keeps none of the others from being made."""
    broker = start_broker(config=FAST)
    total = 2 * MAX_ACK_ENTRIES + 100

    async def scenario() -> None:
        async with await _consumer(broker.endpoint, "ManyTopic", total, extension=True) as c:
            got: list[ReceivedMessage] = []
            while batch := await c.receive(64, INVISIBLE_S * 3):
                got += batch
            assert len(got) == total
            with pytest.raises(RemoteError) as refused:
                await c.connection.unary("AckMessage", c._ack_request("ManyTopic", got))
            assert refused.value.status == "BAD_REQUEST"
            assert f"at most {MAX_ACK_ENTRIES}" in str(refused.value)
            await c.ack(got[0])
            with pytest.raises(RemoteError) as one_failed:  # got[0] again, in the first of two requests
                await c.ack_many(got[:1100])
            assert "1 of 1100 acknowledgements failed" in str(one_failed.value)
            rest = got[1100:]
            assert len(rest) > MAX_ACK_ENTRIES
            assert await c.receive(64, INVISIBLE_S, ack=rest) == []  # too many to ride along at once
            await asyncio.sleep(INVISIBLE_S * 3 + 0.3)  # what was not acknowledged is visible again
            assert await c.receive(64, INVISIBLE_S) == []

    asyncio.run(scenario())


def test_the_answers_entries_only_when_an_acknowledgement_failed(start_broker: Any) -> None:
    """AckAndReceive answers a wholly successful ack part with an OK status and no entries (the
    receive follows); a part with a failure, an entry per acknowledgement and nothing received.
    AckMessage, the standard call, answers every entry either way."""
    broker = start_broker(config=FAST)

    async def scenario() -> None:
        async with await _consumer(broker.endpoint, "AnswerTopic", 12, extension=True) as c:
            first = await c.receive(4, 30)
            assert len(first) == 4

            def receive_request() -> Any:
                return pb.ReceiveMessageRequest(
                    group=c.connection.resource(c.group),
                    message_queue=pb.MessageQueue(topic=c.connection.resource("AnswerTopic"), id=-1),
                    filter_expression=FilterExpression.tag().to_proto(),
                    batch_size=4,
                )

            both = await c.connection.ack_and_receive(
                c._ack_request("AnswerTopic", first[:2]), receive_request(), timeout=10
            )
            assert both is not None
            ack, received = both
            assert ack.status.code == pb.Code.OK and len(ack.entries) == 0
            assert received.status.code == pb.Code.OK and len(received.messages) == 4

            # first[1] was acknowledged just now, first[2] was not
            both = await c.connection.ack_and_receive(
                c._ack_request("AnswerTopic", first[1:3]), receive_request(), timeout=10
            )
            assert both is not None
            ack, received = both
            assert ack.status.code == pb.Code.MULTIPLE_RESULTS
            codes = [e.status.code for e in ack.entries]
            assert codes == [pb.Code.INVALID_RECEIPT_HANDLE, pb.Code.OK]
            assert [e.receipt_handle for e in ack.entries] == [m.receipt_handle for m in first[1:3]]
            assert received.status.code == pb.Code.BAD_REQUEST and not received.messages

            answer = await c.connection.unary("AckMessage", c._ack_request("AnswerTopic", first[3:]))
            assert answer.status.code == pb.Code.OK
            assert [(e.message_id, e.receipt_handle, e.status.code) for e in answer.entries] == [
                (first[3].message_id, first[3].receipt_handle, pb.Code.OK)
            ]

    asyncio.run(scenario())


def test_a_failed_acknowledgement_of_another_topic_still_lets_the_others_be_made(start_broker: Any) -> None:
    """receive(ack=...) acknowledges another topic's messages first; one failing there still has
    the rest acknowledged (as ack_many does) before the receive raises and receives nothing."""
    broker = start_broker(config=FAST)

    async def scenario() -> None:
        async with Producer(broker.endpoint) as producer:
            for topic in ("MixA", "MixB"):
                await producer.send_many([producer.message(topic, topic.encode()) for _ in range(4)])
        subscriptions = {"MixA": FilterExpression.tag(), "MixB": FilterExpression.tag()}
        async with SimpleConsumer(broker.endpoint, "mix", subscriptions, await_duration=0.3) as c:
            a = await c.receive(4, 30)  # the topics in turn: MixA, then MixB
            b = await c.receive(4, 30)
            assert {m.topic for m in a} == {"MixA"} and {m.topic for m in b} == {"MixB"}
            await c.ack(b[0])
            with pytest.raises(RemoteError) as failed:
                await c.receive(4, 30, ack=[*a, b[0]])  # receives from MixA: b[0] is acknowledged first
            assert failed.value.status == "INVALID_RECEIPT_HANDLE"
            await assert_all_acknowledged(c, a)  # every one of ``a`` all the same
            await c.ack_many(b[1:])

    asyncio.run(scenario())


def test_a_request_refused_as_a_whole_does_not_keep_the_others_from_being_made(start_broker: Any) -> None:
    """Every acknowledgement of one topic fails, so the broker refuses that request as a whole: the
    requests of the other topics are made all the same, by ack_many and by receive(ack=...), which
    then raise naming how many failed."""
    broker = start_broker(config=FAST)

    async def scenario() -> None:
        topics = ("WholeA", "WholeB", "WholeC", "WholeD")
        async with Producer(broker.endpoint) as producer:
            for topic in topics:
                await producer.send_many([producer.message(topic, topic.encode()) for _ in range(3)])
        subscriptions = {t: FilterExpression.tag() for t in topics}
        async with SimpleConsumer(broker.endpoint, "whole", subscriptions, await_duration=0.3) as c:
            a, b, cc, d = [await c.receive(3, 30, topic=t) for t in topics]
            await c.ack(a[0])
            with pytest.raises(RemoteError) as failed:
                await c.ack_many([a[0], *b])  # a[0]'s request (its only entry failed) comes first
            assert failed.value.status == "INVALID_RECEIPT_HANDLE"
            assert "1 of 4 acknowledgements failed" in str(failed.value)
            await assert_all_acknowledged(c, b)
            with pytest.raises(RemoteError) as failed:
                await c.receive(3, 30, topic="WholeD", ack=[b[0], *cc])  # other topics': acknowledged first
            assert failed.value.status == "INVALID_RECEIPT_HANDLE"
            await assert_all_acknowledged(c, cc)
            await c.ack_many([*a[1:], *d])

    asyncio.run(scenario())


def test_receive_from_a_named_topic(start_broker: Any) -> None:
    broker = start_broker(config=FAST)

    async def scenario() -> None:
        async with Producer(broker.endpoint) as producer:
            for topic in ("NamedA", "NamedB"):
                await producer.send_many([producer.message(topic, topic.encode()) for _ in range(3)])
        subscriptions = {"NamedA": FilterExpression.tag(), "NamedB": FilterExpression.tag()}
        async with SimpleConsumer(broker.endpoint, "named", subscriptions, await_duration=0.3) as c:
            got = await c.receive(2, 30, topic="NamedB")
            got += await c.receive(2, 30, topic="NamedB", ack=got)  # not in turn: the same topic twice
            assert [m.topic for m in got] == ["NamedB"] * 3
            await c.ack_many(got[2:])
            with pytest.raises(ValueError, match="'Other' is not a topic this consumer subscribes to"):
                await c.receive(2, 30, topic="Other")

    asyncio.run(scenario())


@pytest.mark.parametrize("back_in_s", [0, 1])
def test_a_receive_already_waiting_gets_a_message_given_back(start_broker: Any, back_in_s: int) -> None:
    """A receive waits (10 s) on a topic whose one message another consumer of the group holds
    for 30 s; that one gives it back (visible at once, or in 1 s): the waiting receive gets it
    then, not when its wait runs out."""
    broker = start_broker(config={"min_invisible_time_s": 0.05})

    async def scenario() -> None:
        async with Producer(broker.endpoint) as producer:
            await producer.send("ComeBack", b"once")
        subscriptions = {"ComeBack": FilterExpression.tag()}
        async with (
            SimpleConsumer(broker.endpoint, "comeback", subscriptions, await_duration=10) as holder,
            SimpleConsumer(broker.endpoint, "comeback", subscriptions, await_duration=10) as waiter,
        ):
            [held] = await holder.receive(1, invisible_duration=30)
            waiting = asyncio.create_task(waiter.receive(1, invisible_duration=30))
            await asyncio.sleep(0.5)  # it found nothing and waits
            started = time.monotonic()
            await holder.change_invisible_duration(held, back_in_s)
            [got] = await asyncio.wait_for(waiting, 15)
            assert got.message_id == held.message_id and got.delivery_attempt == 2
            assert time.monotonic() - started < back_in_s + 4  # not the rest of a 10 s wait

    asyncio.run(scenario())
