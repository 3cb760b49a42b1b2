"""PushConsumer: one receiving loop holds at most ``capacity`` messages ahead of its listeners, the
acknowledgements ride along with its receives (through siftmq's extension; otherwise a separate
task sends them), and stopping gives back what was received and not consumed."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from client_helpers import assert_all_acknowledged, drain
from siftmq.client import FilterExpression, Producer, PushConsumer, ReceivedMessage, SimpleConsumer
from siftmq.errors import RemoteUnavailable
from siftmq.testing import record_calls

pytestmark = pytest.mark.integration

FAST = {"min_invisible_time_s": 0.05}


async def _send(endpoint: str, topic: str, count: int) -> None:
    async with Producer(endpoint) as producer:
        await producer.send_many([producer.message(topic, f"{i}".encode()) for i in range(count)])


def _recording() -> tuple[list[ReceivedMessage], Callable[[ReceivedMessage], bool]]:
    """A listener that consumes every message, and the messages it was given."""
    seen: list[ReceivedMessage] = []

    def consumed(m: ReceivedMessage) -> bool:
        seen.append(m)
        return True

    return seen, consumed


def _stuck() -> tuple[list[ReceivedMessage], Callable[[ReceivedMessage], Awaitable[bool]]]:
    """A listener that never finishes, and the messages it was given."""
    started: list[ReceivedMessage] = []
    never = asyncio.Event()

    async def stuck(m: ReceivedMessage) -> bool:
        started.append(m)
        await never.wait()
        return True

    return started, stuck


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
        seen, consumed = _recording()

        consumer = PushConsumer(
            broker.endpoint, "pushonce", {"PushOnce": FilterExpression.tag()}, consumed, concurrency=3,
            await_duration=0.5,
        )  # fmt: skip
        if not extension:
            consumer.connection.batch_extension = False
        calls = record_calls(consumer)
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
            await assert_all_acknowledged(c, seen)

    asyncio.run(scenario())


def test_at_most_capacity_held_and_given_back_on_stop(start_broker: Any) -> None:
    broker = start_broker(config=FAST)

    async def scenario() -> None:
        await _send(broker.endpoint, "PushHeld", 100)
        started, stuck = _stuck()

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
        got = await drain(broker.endpoint, "pushheld", "PushHeld", limit=100)
        assert sorted(int(m.body) for m in got) == list(range(100))

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
        seen, consumed = _recording()
        stale: list[ReceivedMessage] = []

        consumer = PushConsumer(
            broker.endpoint, "pushstale", {"PushStale": FilterExpression.tag()}, consumed, concurrency=2,
            await_duration=0.5,
        )  # fmt: skip
        take = consumer._take_acks

        def with_a_stale_one(topic: str | None = None, limit: int = 1024) -> list[ReceivedMessage]:
            taken = take(topic, limit)
            if topic is not None and len(seen) >= 20 and not stale:  # a receive's, not the acker's
                stale.append(seen[0])  # acknowledged already
                taken.append(seen[0])
            return taken

        consumer._take_acks = with_a_stale_one  # type: ignore[method-assign]
        await consumer.start()
        try:
            await _until(lambda: len(seen) >= 200)
        finally:
            await consumer.stop()
        assert sorted(int(m.body) for m in seen) == list(range(200)) and stale
        messages = [r.getMessage() for r in caplog.records]
        assert any("acknowledging messages of pushstale failed" in m for m in messages), messages
        assert not any("failed" in m and "receive of" in m for m in messages), messages

    asyncio.run(scenario())


def test_a_message_on_any_topic_ends_the_wait(start_broker: Any) -> None:
    """Idle on three topics, the consumer waits on each at once: a message on any is consumed at
    once, not after the wait on another topic ran out (20 s here); and a backlog on one is consumed
    while the others stay idle."""
    broker = start_broker(config=FAST)

    async def scenario() -> None:
        seen: list[tuple[str, float]] = []

        def consumed(m: ReceivedMessage) -> bool:
            seen.append((m.topic, time.monotonic()))
            return True

        topics = ("PushWaitA", "PushWaitB", "PushWaitC")
        async with Producer(broker.endpoint) as producer:  # the topics exist
            for topic in topics:
                await producer.send(topic, b"first")
        subscriptions = {topic: FilterExpression.tag() for topic in topics}
        consumer = PushConsumer(broker.endpoint, "pushwait", subscriptions, consumed, await_duration=20)
        await consumer.start()
        try:
            await _until(lambda: len(seen) == 3)
            await asyncio.sleep(1.0)  # idle now: waiting on every topic
            for n, topic in enumerate(("PushWaitB", "PushWaitA", "PushWaitC", "PushWaitB")):
                async with Producer(broker.endpoint) as producer:
                    await producer.send(topic, b"x")
                await _until(lambda n=n: len(seen) == 4 + n, timeout=10)
                assert seen[-1][0] == topic
            await _send(broker.endpoint, "PushWaitA", 300)
            await _until(lambda: len(seen) == 307, timeout=15)  # B and C idle meanwhile, each a 20 s wait
        finally:
            await consumer.stop()

    asyncio.run(scenario())


def test_acknowledgements_of_a_receive_that_failed_are_made_all_the_same(start_broker: Any) -> None:
    """A receive carrying acknowledgements fails in transport (injected: the call raises as an
    unreachable broker makes it): those acknowledgements are sent again, not dropped."""
    broker = start_broker(config=FAST)

    async def scenario() -> None:
        await _send(broker.endpoint, "PushLost", 120)
        seen, consumed = _recording()

        consumer = PushConsumer(
            broker.endpoint, "pushlost", {"PushLost": FilterExpression.tag()}, consumed, concurrency=2,
            await_duration=0.5,
        )  # fmt: skip
        original = consumer.connection.ack_and_receive
        failed: list[int] = []

        async def unreachable_once(ack: Any, receive: Any, *, timeout: float) -> Any:
            if not failed and len(ack.entries) > 0:
                failed.append(len(ack.entries))
                raise RemoteUnavailable("injected", status="UNAVAILABLE", call="AckAndReceive")
            return await original(ack, receive, timeout=timeout)

        consumer.connection.ack_and_receive = unreachable_once  # type: ignore[method-assign]
        await consumer.start()
        try:
            await _until(lambda: len(seen) >= 120 and failed)
            await asyncio.sleep(0.3)
        finally:
            await consumer.stop()
        assert failed and sorted(int(m.body) for m in seen) == list(range(120))
        async with SimpleConsumer(broker.endpoint, "pushlost", {"PushLost": FilterExpression.tag()}) as c:
            await assert_all_acknowledged(c, seen)

    asyncio.run(scenario())


def test_acknowledgements_the_broker_could_not_be_reached_for_are_made_once_it_is_back(
    start_broker: Any,
) -> None:
    """The broker goes away just after the last message was consumed, before its acknowledgement
    was sent, and comes back a second later: the acknowledgements are retried and made, so no
    message comes back to the listener after its invisible time (10 s here)."""
    broker = start_broker(config=FAST)

    async def scenario() -> None:
        await _send(broker.endpoint, "PushOutage", 10)
        seen: list[ReceivedMessage] = []

        def consumed(m: ReceivedMessage) -> bool:
            seen.append(m)
            if len(seen) == 10:  # on the event loop: nothing is acknowledged before the broker is gone
                broker.stop()
            return True

        consumer = PushConsumer(
            broker.endpoint, "pushoutage", {"PushOutage": FilterExpression.tag()}, consumed, concurrency=2
        )
        consumer.INVISIBLE_S = 10.0
        async with consumer:
            await _until(lambda: len(seen) >= 10)
            gone = time.monotonic()
            await asyncio.sleep(1)
            broker.listen = broker.endpoint
            broker.start()
            await asyncio.sleep(consumer.INVISIBLE_S + 2 - (time.monotonic() - gone))
            assert sorted(int(m.body) for m in seen) == list(range(10))  # none came back
        async with SimpleConsumer(broker.endpoint, "pushoutage", {"PushOutage": FilterExpression.tag()}) as c:
            await assert_all_acknowledged(c, seen)

    asyncio.run(scenario())


def test_a_cancelled_stop_still_gives_back_and_closes(start_broker: Any) -> None:
    broker = start_broker(config=FAST)

    async def scenario() -> None:
        await _send(broker.endpoint, "PushStopCancel", 60)
        started, stuck = _stuck()

        consumer = PushConsumer(
            broker.endpoint, "pushstopcancel", {"PushStopCancel": FilterExpression.tag()}, stuck,
            concurrency=2, await_duration=0.5,
        )  # fmt: skip
        await consumer.start()
        await _until(lambda: consumer.held == consumer.capacity and len(started) == 2)
        stopping = asyncio.create_task(consumer.stop())
        await asyncio.sleep(0)
        stopping.cancel()
        with pytest.raises(asyncio.CancelledError):
            await stopping
        await consumer.stop()  # the same stop, run to its end
        assert consumer.held == 0 and all(w.done() for w in consumer._workers)
        got = await drain(broker.endpoint, "pushstopcancel", "PushStopCancel", limit=60)
        assert sorted(int(m.body) for m in got) == list(range(60))  # the 16 held came back

    asyncio.run(scenario())


def test_a_backlog_on_one_of_many_topics_keeps_every_listener_busy(start_broker: Any) -> None:
    """Twelve topics share the hold; the one with a backlog still feeds all four listeners."""
    broker = start_broker(config=FAST)

    async def scenario() -> None:
        topics = [f"PushMany{i}" for i in range(12)]
        async with Producer(broker.endpoint) as producer:  # the topics exist
            for topic in topics:
                await producer.send(topic, b"-1")
        running = [0]
        most = [0]
        done: list[ReceivedMessage] = []

        async def listener(m: ReceivedMessage) -> bool:
            running[0] += 1
            most[0] = max(most[0], running[0])
            await asyncio.sleep(0.01)
            running[0] -= 1
            done.append(m)
            return True

        subscriptions = {topic: FilterExpression.tag() for topic in topics}
        consumer = PushConsumer(broker.endpoint, "pushmany", subscriptions, listener, concurrency=4)
        await consumer.start()
        try:
            await _until(lambda: len(done) == 12)  # one each; idle now
            most[0] = 0
            await _send(broker.endpoint, topics[0], 120)
            await _until(lambda: len(done) == 132)
        finally:
            await consumer.stop()
        assert most[0] == 4

    asyncio.run(scenario())


def test_a_listener_cancelled_from_within_fails_its_message_and_the_worker_goes_on(
    start_broker: Any, caplog: Any
) -> None:
    """A listener that awaited a future cancelled under it raises CancelledError without stop()
    asking: that message failed (it comes back), and its worker — here the only one — goes on."""
    broker = start_broker(config=FAST)

    async def scenario() -> None:
        await _send(broker.endpoint, "PushSelfCancel", 10)
        seen: list[ReceivedMessage] = []

        async def cancelled_the_first_time(m: ReceivedMessage) -> bool:
            if m.delivery_attempt == 1:
                gone = asyncio.get_running_loop().create_future()
                gone.cancel()
                await gone
            seen.append(m)
            return True

        consumer = PushConsumer(
            broker.endpoint, "pushselfcancel", {"PushSelfCancel": FilterExpression.tag()},
            cancelled_the_first_time, concurrency=1, await_duration=0.5,
        )  # fmt: skip
        await consumer.start()
        try:
            await _until(lambda: len(seen) >= 10)
        finally:
            await consumer.stop()
        assert sorted(int(m.body) for m in seen) == list(range(10))
        assert {m.delivery_attempt for m in seen} == {2}  # each failed once, came back after 1 s
        messages = [r.getMessage() for r in caplog.records]
        assert sum("listener was cancelled" in m for m in messages) == 10, messages
        async with SimpleConsumer(
            broker.endpoint, "pushselfcancel", {"PushSelfCancel": FilterExpression.tag()}
        ) as c:
            await assert_all_acknowledged(c, seen)

    asyncio.run(scenario())


def test_the_acker_outlives_an_unexpected_failure(start_broker: Any, caplog: Any) -> None:
    """Acknowledging one batch raises something no broker answer raises (injected): that batch
    comes back after its invisible time, and every later acknowledgement is still made."""
    broker = start_broker(config=FAST)

    async def scenario() -> None:
        await _send(broker.endpoint, "PushAckerFails", 1)
        seen, consumed = _recording()
        consumer = PushConsumer(
            broker.endpoint, "pushackerfails", {"PushAckerFails": FilterExpression.tag()}, consumed,
            concurrency=2, await_duration=0.5,
        )  # fmt: skip
        consumer.connection.batch_extension = False  # every acknowledgement is the acker's
        original = consumer.ack_many
        broken: list[int] = []

        async def fails_once(messages: Any) -> None:
            if not broken:
                broken.append(len(messages))
                raise RuntimeError("injected")
            await original(messages)

        consumer.ack_many = fails_once  # type: ignore[method-assign]
        await consumer.start()
        try:
            await _until(lambda: len(seen) == 1 and broken)
            await _send(broker.endpoint, "PushAckerFails", 50)
            await _until(lambda: len(seen) == 51)
        finally:
            await consumer.stop()
        assert broken == [1]
        messages = [r.getMessage() for r in caplog.records]
        assert any("acknowledging 1 messages of pushackerfails failed" in m for m in messages), messages
        async with SimpleConsumer(
            broker.endpoint, "pushackerfails", {"PushAckerFails": FilterExpression.tag()}
        ) as c:
            await assert_all_acknowledged(c, seen[1:])

    asyncio.run(scenario())
