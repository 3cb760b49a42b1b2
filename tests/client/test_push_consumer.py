"""PushConsumer: one receiving loop holds at most ``capacity`` messages ahead of its listeners, the
acknowledgements ride along with its receives (through siftmq's extension; otherwise a separate
task sends them), and stopping gives back what was received and not consumed."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from siftmq.client import FilterExpression, Producer, PushConsumer, ReceivedMessage, SimpleConsumer
from siftmq.errors import RemoteError

pytestmark = pytest.mark.integration

FAST = {"min_invisible_time_s": 0.05}


async def _send(endpoint: str, topic: str, count: int) -> None:
    async with Producer(endpoint) as producer:
        await producer.send_many([producer.message(topic, f"{i}".encode()) for i in range(count)])


def _calls(consumer: SimpleConsumer) -> list[str]:
    calls: list[str] = []
    original = consumer.connection._method

    def counting(rpc: Any, request: Any) -> Any:
        calls.append(rpc.name)
        return original(rpc, request)

    consumer.connection._method = counting  # type: ignore[method-assign]
    return calls


async def _until(predicate: Any, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.05)


@pytest.mark.parametrize("extension", [True, False])
def test_every_message_consumed_once_and_acknowledged(start_broker: Any, extension: bool) -> None:
    broker = start_broker(config=FAST)

    async def scenario() -> None:
        await _send(broker.endpoint, "PushOnce", 300)
        seen: list[ReceivedMessage] = []

        def consumed(m: ReceivedMessage) -> bool:
            seen.append(m)
            return True

        consumer = PushConsumer(
            broker.endpoint, "pushonce", {"PushOnce": FilterExpression.tag()}, consumed, concurrency=3,
            await_duration=0.5,
        )  # fmt: skip
        if not extension:
            consumer.connection.batch_extension = False
        calls = _calls(consumer)
        await consumer.start()
        try:
            await _until(lambda: len(seen) >= 300)
            await asyncio.sleep(0.3)  # nothing more comes
        finally:
            await consumer.stop()
        assert sorted(int(m.body) for m in seen) == list(range(300))  # each once
        assert consumer.held == 0 and not consumer._to_ack
        if extension:  # most acknowledgements rode along with a receive
            assert calls.count("AckAndReceive") > calls.count("AckMessage")
        else:
            assert "AckAndReceive" not in calls and "AckMessage" in calls
        async with SimpleConsumer(broker.endpoint, "pushonce", {"PushOnce": FilterExpression.tag()}) as c:
            with pytest.raises(RemoteError) as again:  # every one acknowledged already
                await c.ack_many(seen)
            assert again.value.status == "INVALID_RECEIPT_HANDLE" and "acknowledgements failed" not in str(
                again.value
            )

    asyncio.run(scenario())


def test_at_most_capacity_held_and_given_back_on_stop(start_broker: Any) -> None:
    broker = start_broker(config=FAST)

    async def scenario() -> None:
        await _send(broker.endpoint, "PushHeld", 100)
        started: list[ReceivedMessage] = []
        never = asyncio.Event()

        async def stuck(m: ReceivedMessage) -> bool:
            started.append(m)
            await never.wait()  # a listener that does not finish
            return True

        consumer = PushConsumer(
            broker.endpoint, "pushheld", {"PushHeld": FilterExpression.tag()}, stuck, concurrency=2,
            await_duration=0.5,
        )  # fmt: skip
        assert consumer.capacity == 16
        await consumer.start()
        try:
            await _until(lambda: consumer.held == consumer.capacity and len(started) == 2)
            await asyncio.sleep(0.5)  # and no more is received
            assert consumer.held == consumer.capacity and len(started) == 2
        finally:
            await consumer.stop()
        assert consumer.held == 0
        # the 16 held come back in a second (not after 60 s); the other 84 were never taken
        async with SimpleConsumer(
            broker.endpoint, "pushheld", {"PushHeld": FilterExpression.tag()}, await_duration=2
        ) as c:
            got: list[ReceivedMessage] = []
            deadline = time.monotonic() + 10
            while len(got) < 100 and time.monotonic() < deadline:
                got += await c.receive(32, 30, ack=[])
            assert sorted(int(m.body) for m in got) == list(range(100))
            await c.ack_many(got)

    asyncio.run(scenario())


def test_concurrency_must_be_positive() -> None:
    async def scenario() -> None:
        with pytest.raises(ValueError, match="concurrency must be at least 1, not 0"):
            PushConsumer("127.0.0.1:1", "g", {"T": FilterExpression.tag()}, bool, concurrency=0)

    asyncio.run(scenario())


def test_a_failed_acknowledgement_does_not_hold_up_receiving(start_broker: Any, caplog: Any) -> None:
    """An acknowledgement that fails in a receive (a handle gone stale) is logged as such, and the
    receiving goes on at once: the other acknowledgements were made."""
    broker = start_broker(config=FAST)

    async def scenario() -> None:
        await _send(broker.endpoint, "PushStale", 200)
        seen: list[ReceivedMessage] = []
        stale: list[ReceivedMessage] = []

        def consumed(m: ReceivedMessage) -> bool:
            seen.append(m)
            if len(seen) == 20:  # one already acknowledged goes along with the next acknowledgements
                stale.append(seen[0])
                consumer._to_ack.append(seen[0])
            return True

        consumer = PushConsumer(
            broker.endpoint, "pushstale", {"PushStale": FilterExpression.tag()}, consumed, concurrency=2,
            await_duration=0.5,
        )  # fmt: skip
        await consumer.start()
        try:
            await _until(lambda: len(seen) >= 200)
        finally:
            await consumer.stop()
        assert sorted(int(m.body) for m in seen) == list(range(200))
        messages = [r.getMessage() for r in caplog.records]
        assert any("acknowledging messages of pushstale failed" in m for m in messages), messages
        assert not any("receive for pushstale failed" in m for m in messages), messages

    asyncio.run(scenario())


def test_a_message_on_any_topic_ends_the_wait(start_broker: Any) -> None:
    """Idle on two topics, the consumer waits on both at once: a message on either is consumed at
    once, not after the wait on the other topic ran out (20 s here)."""
    broker = start_broker(config=FAST)

    async def scenario() -> None:
        seen: list[tuple[str, float]] = []

        def consumed(m: ReceivedMessage) -> bool:
            seen.append((m.topic, time.monotonic()))
            return True

        subscriptions = {"PushWaitA": FilterExpression.tag(), "PushWaitB": FilterExpression.tag()}
        async with Producer(broker.endpoint) as producer:  # both topics exist
            await producer.send("PushWaitA", b"a0")
            await producer.send("PushWaitB", b"b0")
        consumer = PushConsumer(broker.endpoint, "pushwait", subscriptions, consumed, await_duration=20)
        await consumer.start()
        try:
            await _until(lambda: len(seen) == 2)
            await asyncio.sleep(1.0)  # idle now: waiting on both topics
            for n, topic in enumerate(("PushWaitB", "PushWaitA", "PushWaitB")):
                async with Producer(broker.endpoint) as producer:
                    await producer.send(topic, b"x")
                await _until(lambda n=n: len(seen) == 3 + n, timeout=10)
                assert seen[-1][0] == topic
        finally:
            await consumer.stop()

    asyncio.run(scenario())
