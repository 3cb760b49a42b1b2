"""SimpleConsumer.receive(ack=...): the acknowledgements ride along with the next receive, in one
AckAndReceive call through siftmq's extension and as AckMessage + ReceiveMessage without it; the
same messages either way, each acknowledged once; a failed acknowledgement receives nothing."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from siftmq.client import FilterExpression, Producer, ReceivedMessage, SimpleConsumer
from siftmq.errors import RemoteError

pytestmark = pytest.mark.integration

FAST = {"min_invisible_time_s": 0.05}


def _counting(consumer: SimpleConsumer) -> list[str]:
    calls: list[str] = []
    original = consumer.connection._method

    def counting(rpc: Any, request: Any) -> Any:
        calls.append(rpc.name)
        return original(rpc, request)

    consumer.connection._method = counting  # type: ignore[method-assign]
    return calls


@pytest.mark.parametrize("extension", [True, False])
def test_acks_ride_along_with_the_next_receive(start_broker: Any, extension: bool) -> None:
    broker = start_broker(config=FAST)

    async def scenario() -> None:
        async with Producer(broker.endpoint) as producer:
            await producer.send_many([producer.message("AlongTopic", f"{i}".encode()) for i in range(100)])
        async with SimpleConsumer(
            broker.endpoint, "along", {"AlongTopic": FilterExpression.tag()}, await_duration=0.3
        ) as c:
            if not extension:
                c.connection.batch_extension = False
            calls = _counting(c)
            seen: list[str] = []
            batch: list[ReceivedMessage] = []
            rounds = 0
            while True:
                batch = await c.receive(16, 0.5, ack=batch)
                rounds += 1
                if not batch:
                    break
                seen += [m.body.decode() for m in batch]
            assert sorted(seen, key=int) == [str(i) for i in range(100)]  # each once
            if extension:
                assert calls == ["ReceiveMessages"] + ["AckAndReceive"] * (rounds - 1)
            else:
                assert calls.count("AckMessage") == rounds - 1
            await asyncio.sleep(0.7)  # past every invisible time: anything not acknowledged is back
            assert await c.receive(16, 0.5) == []

    asyncio.run(scenario())


def test_a_failed_acknowledgement_receives_nothing(start_broker: Any) -> None:
    broker = start_broker(config=FAST)

    async def scenario() -> None:
        async with Producer(broker.endpoint) as producer:
            await producer.send_many([producer.message("FailTopic", f"{i}".encode()) for i in range(20)])
        async with SimpleConsumer(
            broker.endpoint, "fail", {"FailTopic": FilterExpression.tag()}, await_duration=0.3
        ) as c:
            first = await c.receive(10, 30)
            assert len(first) == 10
            await c.ack_many(first)
            with pytest.raises(RemoteError) as failed:
                await c.receive(10, 30, ack=first)  # already acknowledged
            assert failed.value.status == "INVALID_RECEIPT_HANDLE" and "not in flight" in str(failed.value)
            rest = await c.receive(10, 30)  # the failed call took none of them out of sight
            assert sorted(m.body.decode() for m in first + rest) == sorted(str(i) for i in range(20))

    asyncio.run(scenario())


def test_acks_of_another_topic_are_made_apart(start_broker: Any) -> None:
    broker = start_broker(config=FAST)

    async def scenario() -> None:
        async with Producer(broker.endpoint) as producer:
            for topic in ("TwoA", "TwoB"):
                await producer.send_many([producer.message(topic, topic.encode()) for _ in range(5)])
        subscriptions = {"TwoA": FilterExpression.tag(), "TwoB": FilterExpression.tag()}
        async with SimpleConsumer(broker.endpoint, "two", subscriptions, await_duration=0.3) as c:
            got: list[ReceivedMessage] = []
            batch: list[ReceivedMessage] = []
            for _ in range(4):  # topics in turn: each call acknowledges the other topic's batch
                batch = await c.receive(16, 0.5, ack=batch)
                got += batch
            await c.ack_many(batch)
            assert sorted(m.body for m in got) == [b"TwoA"] * 5 + [b"TwoB"] * 5
            await asyncio.sleep(0.7)
            assert await c.receive(16, 0.5) == [] and await c.receive(16, 0.5) == []

    asyncio.run(scenario())
