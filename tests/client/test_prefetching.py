"""SimpleConsumer.prefetching: receive with calls asked ahead. Every message delivered once and every
acknowledgement made (as a plain receive does, in any depth, with and without siftmq's extension);
an acknowledgement's failure raised by a later receive, which then sends nothing; close() releases
what was received ahead; a drained topic waits as a plain receive does; a cancelled receive loses
nothing."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from client_helpers import assert_all_acknowledged
from siftmq.client import FilterExpression, Producer, ReceivedMessage, SimpleConsumer, blocking
from siftmq.errors import RemoteError
from siftmq.testing import running_broker

pytestmark = pytest.mark.integration

FAST = {"min_invisible_time_s": 0.05}
INVISIBLE_S = 30.0  # no message comes back in a test: a slow host's stall is no duplicate


async def _send(endpoint: str, topic: str, count: int) -> None:
    """``count`` messages to ``topic``, bodies "0", "1", ... (every third tagged ``Odd``, others ``Even``)."""
    async with Producer(endpoint) as producer:
        for first in range(0, count, 256):
            await producer.send_many([
                producer.message(topic, f"{i}".encode(), tag="Odd" if i % 3 == 0 else "Even")
                for i in range(first, min(first + 256, count))
            ])  # fmt: skip


def _consumer(
    endpoint: str, topic: str, group: str, tag: str = "*", *, await_duration: float = 0.3, **kwargs: Any
) -> SimpleConsumer:
    return SimpleConsumer(
        endpoint, group, {topic: FilterExpression.tag(tag)}, await_duration=await_duration, **kwargs
    )


def _bodies(messages: list[ReceivedMessage]) -> list[int]:
    return sorted(int(m.body) for m in messages)


async def _drain_ahead(c: SimpleConsumer, max_messages: int, depth: int) -> tuple[list[ReceivedMessage], int]:
    """Everything ``c`` receives through prefetching until a receive comes back empty (each batch
    acknowledged by the next receive, the last by ack_many); and the most calls seen in flight."""
    got: list[ReceivedMessage] = []
    most = 0
    batch: list[ReceivedMessage] = []
    async with c.prefetching(max_messages, INVISIBLE_S, depth=depth) as receiver:
        while batch := await receiver.receive(ack=batch):
            got += batch
            most = max(most, receiver.in_flight)
    assert receiver.in_flight == 0
    return got, most


@pytest.mark.parametrize(("depth", "extension"), [(1, True), (2, True), (3, True), (2, False)])
def test_every_message_once_and_every_acknowledgement_made(
    start_broker: Any, depth: int, extension: bool
) -> None:
    """Without siftmq's extension (as against Apache RocketMQ's proxy, which has no non-waiting
    receive) no call is made ahead: each receive is a plain one."""
    broker = start_broker(config=FAST)

    async def scenario() -> None:
        await _send(broker.endpoint, "AheadTopic", 300)
        async with _consumer(broker.endpoint, "AheadTopic", "ahead") as c:
            if not extension:
                c.connection.batch_extension = False
            got, most = await _drain_ahead(c, 16, depth)
            assert _bodies(got) == list(range(300))  # each once
            assert most == (depth if extension else 0)
            await assert_all_acknowledged(c, got)

    asyncio.run(scenario())


def test_a_failed_acknowledgement_is_raised_by_a_later_receive_which_sends_nothing(start_broker: Any) -> None:
    broker = start_broker(config=FAST)

    async def scenario() -> None:
        await _send(broker.endpoint, "AheadFail", 40)
        async with _consumer(broker.endpoint, "AheadFail", "aheadfail") as c:
            async with c.prefetching(10, INVISIBLE_S, depth=1) as receiver:
                first = await receiver.receive()
                await c.ack_many(first)
                second = await receiver.receive(ack=first)  # already acknowledged: fails in the call made now
                assert len(second) == 10
                with pytest.raises(RemoteError) as failed:
                    await receiver.receive(ack=second)
                assert failed.value.status == "INVALID_RECEIPT_HANDLE"
                assert receiver.in_flight == 0  # nothing was sent: ``second`` is still to acknowledge
                await c.ack_many(second)
                rest: list[ReceivedMessage] = []  # the failed call received nothing: the others wait
                batch: list[ReceivedMessage] = []
                while batch := await receiver.receive(ack=batch):
                    rest += batch
            assert _bodies(first + second + rest) == list(range(40))
            await assert_all_acknowledged(c, first + second + rest)

    asyncio.run(scenario())


def test_close_releases_what_was_received_ahead(start_broker: Any) -> None:
    broker = start_broker(config=FAST)

    async def scenario() -> None:
        await _send(broker.endpoint, "AheadClose", 100)
        async with _consumer(broker.endpoint, "AheadClose", "aheadclose") as c:
            async with c.prefetching(10, 60, depth=2) as receiver:
                kept = await receiver.receive()  # 20 more received ahead, invisible for 60 s ...
                assert receiver.in_flight == 2
            await asyncio.sleep(1.5)  # ... until close() released them
            others: list[ReceivedMessage] = []
            while batch := await c.receive(32, 60):
                others += batch
            assert _bodies(others) == sorted(set(range(100)) - set(_bodies(kept)))

    asyncio.run(scenario())


def test_a_drained_topic_waits_for_messages_as_a_plain_receive_does(start_broker: Any) -> None:
    broker = start_broker(config=FAST)

    async def scenario() -> None:
        await _send(broker.endpoint, "AheadWait", 5)
        async with (
            _consumer(broker.endpoint, "AheadWait", "aheadwait", await_duration=10) as c,
            c.prefetching(16, INVISIBLE_S) as receiver,
        ):
            first = await receiver.receive()
            assert len(first) == 5

            async def later() -> None:
                await asyncio.sleep(0.5)
                async with Producer(broker.endpoint) as producer:
                    await producer.send("AheadWait", b"5")

            sender = asyncio.create_task(later())
            second = await receiver.receive(ack=first)  # the tries ahead find nothing: it waits
            await sender
            assert _bodies(second) == [5]
            await c.ack_many(second)

    asyncio.run(scenario())


def test_a_cancelled_receive_loses_nothing(start_broker: Any) -> None:
    broker = start_broker(config=FAST)

    async def scenario() -> None:
        await _send(broker.endpoint, "AheadCancel", 30)
        async with _consumer(broker.endpoint, "AheadCancel", "aheadcancel") as c:
            async with c.prefetching(10, INVISIBLE_S, depth=1) as receiver:
                got = await receiver.receive()
                waiting = asyncio.create_task(receiver.receive(ack=got))
                await asyncio.sleep(0)  # it waits for the call in flight now
                waiting.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await waiting
                assert receiver.in_flight == 1  # the call goes on; the next receive collects it
                # the list given as ``ack`` grows after the call: the call acknowledges it as it was given
                batch = got
                while batch := await receiver.receive(ack=batch):
                    got += batch
            assert _bodies(got) == list(range(30))
            await assert_all_acknowledged(c, got)  # the last batch by the receive that came back empty

    asyncio.run(scenario())


def test_a_receive_cancelled_as_its_call_finishes_loses_nothing(start_broker: Any) -> None:
    """The cancel lands in the very turn the call in flight finished (a timeout firing, a task
    group's sibling failing): the caller never sees the batch, so the next receive returns it."""
    broker = start_broker(config=FAST)

    async def scenario() -> None:
        await _send(broker.endpoint, "AheadRace", 30)
        async with _consumer(broker.endpoint, "AheadRace", "aheadrace") as c:
            async with c.prefetching(10, INVISIBLE_S, depth=1) as receiver:
                got = await receiver.receive()
                waiting = asyncio.create_task(receiver.receive(ack=got))
                await asyncio.sleep(0)
                call = receiver._ahead[0]  # the call the waiting receive waits for
                # runs after the receive was told the call is done, before the receive resumes
                call.add_done_callback(lambda _: waiting.cancel())
                with pytest.raises(asyncio.CancelledError):
                    await waiting
                assert call.done() and not call.cancelled() and receiver.in_flight == 1
                batch = list(got)  # not acknowledged: the cancelled receive sent nothing
                while batch := await receiver.receive(ack=batch):
                    got += batch
            assert _bodies(got) == list(range(30))
            await assert_all_acknowledged(c, got)

    asyncio.run(scenario())


@pytest.mark.parametrize("extension", [True, False])
def test_a_receive_cancelled_in_its_waiting_call_leaves_the_call_and_its_acks(
    start_broker: Any, extension: bool
) -> None:
    """The topic is drained, so the receive makes a waiting call (carrying its acknowledgements) and
    is cancelled there: the call goes on for the next receive, and acknowledgements given again
    are not sent a second time (which the broker refuses)."""
    broker = start_broker(config=FAST)

    async def scenario() -> None:
        await _send(broker.endpoint, "AheadCancelWait", 5)
        async with (
            _consumer(broker.endpoint, "AheadCancelWait", "aheadcancelwait", await_duration=2) as c,
            c.prefetching(16, INVISIBLE_S, depth=2) as receiver,
        ):
            if not extension:
                c.connection.batch_extension = False
            first = await receiver.receive()
            assert _bodies(first) == list(range(5))
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(receiver.receive(ack=first), 0.5)
            assert receiver.in_flight == 1  # the waiting call goes on
            async with Producer(broker.endpoint) as producer:
                await producer.send("AheadCancelWait", b"5")
            second = await receiver.receive(ack=first)  # given again, as after any cancelled receive
            assert _bodies(second) == [5]
            third = await receiver.receive(ack=second)  # the topic is drained: waits 2 s, finds nothing
            assert third == [] and receiver.in_flight == 0
            await assert_all_acknowledged(c, first)
            await assert_all_acknowledged(c, second)

    asyncio.run(scenario())


def test_a_message_handed_to_a_cancelled_waiting_receive_comes_with_the_next(start_broker: Any) -> None:
    """The broker hands a message to the waiting call of a receive cancelled before it resumes: the
    next receive returns it (the call was not abandoned, leaving it invisible for its 30 s)."""
    broker = start_broker(config=FAST)

    async def scenario() -> None:
        async with (
            _consumer(broker.endpoint, "AheadCancelHanded", "aheadcancelhanded", await_duration=5) as c,
            c.prefetching(16, INVISIBLE_S, depth=2) as receiver,
        ):
            waiting = asyncio.create_task(receiver.receive())
            await asyncio.sleep(0.5)  # its call waits at the broker
            # sent from the blocking client's own loop while this one is held: the answer reaches
            # this process and the receive is cancelled before it could resume
            with blocking.Producer(broker.endpoint) as producer:
                producer.send("AheadCancelHanded", b"0")
            time.sleep(0.5)
            waiting.cancel()
            with pytest.raises(asyncio.CancelledError):
                await waiting
            got = await asyncio.wait_for(receiver.receive(), 3)
            assert _bodies(got) == [0]
            await c.ack_many(got)

    asyncio.run(scenario())


def test_receives_on_one_receiver_at_once_take_turns(start_broker: Any) -> None:
    broker = start_broker(config=FAST)

    async def scenario() -> None:
        await _send(broker.endpoint, "AheadTurns", 200)
        async with _consumer(broker.endpoint, "AheadTurns", "aheadturns") as c:
            got: list[ReceivedMessage] = []
            async with c.prefetching(8, INVISIBLE_S, depth=2) as receiver:

                async def worker() -> None:
                    batch: list[ReceivedMessage] = []
                    while batch := await receiver.receive(ack=batch):
                        got.extend(batch)

                await asyncio.gather(worker(), worker(), worker())
            assert _bodies(got) == list(range(200))  # each once
            await assert_all_acknowledged(c, got)

    asyncio.run(scenario())


def test_a_cancelled_close_still_releases(start_broker: Any) -> None:
    broker = start_broker(config=FAST)

    async def scenario() -> None:
        await _send(broker.endpoint, "AheadCloseCancel", 60)
        async with _consumer(broker.endpoint, "AheadCloseCancel", "aheadclosecancel") as c:
            receiver = c.prefetching(10, 60, depth=2)
            kept = await receiver.receive()  # 20 more received ahead, invisible for 60 s
            closing = asyncio.create_task(receiver.close())
            await asyncio.sleep(0)
            closing.cancel()
            with pytest.raises(asyncio.CancelledError):
                await closing
            assert receiver.in_flight == 0
            await asyncio.sleep(1.5)  # the release went on all the same
            others: list[ReceivedMessage] = []
            while batch := await c.receive(32, 60):
                others += batch
            assert _bodies(others) == sorted(set(range(60)) - set(_bodies(kept)))

    asyncio.run(scenario())


def test_depth_must_be_positive() -> None:
    async def scenario() -> None:
        consumer = SimpleConsumer("127.0.0.1:1", "g", {"T": FilterExpression.tag()})
        with pytest.raises(ValueError, match="depth must be at least 1, not 0"):
            consumer.prefetching(16, 30, depth=0)
        await consumer.connection.close()

    asyncio.run(scenario())


def test_the_blocking_wrapper_says_prefetching_is_asyncio_only(start_broker: Any) -> None:
    broker = start_broker(config=FAST)
    subscriptions = {"AheadBlocking": FilterExpression.tag()}
    with blocking.SimpleConsumer(broker.endpoint, "aheadblocking", subscriptions, await_duration=0.3) as c:
        with pytest.raises(AttributeError, match="prefetching is asyncio only"):
            c.prefetching(16, 30)
        assert c.receive(16, 30) == []  # the rest of the wrapper serves on


_SHARED: dict[str, Any] = {}


@pytest.fixture(scope="module")
def shared_broker() -> Any:
    """One broker for every example (caches and in-flight tables live across them)."""
    with running_broker(config=FAST) as broker:
        yield broker


@settings(max_examples=12, deadline=None)
@given(
    count=st.integers(0, 120),
    max_messages=st.integers(1, 24),
    depth=st.integers(1, 3),
    tag=st.sampled_from(["*", "Odd", "Even||Odd", "None"]),
)
def test_prefetching_and_plain_receive_deliver_the_same_messages(
    shared_broker: Any, count: int, max_messages: int, depth: int, tag: str
) -> None:
    """Differential: a prefetching consumer and a plain one, each its own group on one topic, get
    the same messages (those the filter selects), each once."""
    n = _SHARED["n"] = _SHARED.get("n", 0) + 1
    topic = f"AheadSame{n}"

    async def scenario() -> None:
        await _send(shared_broker.endpoint, topic, count)
        async with _consumer(shared_broker.endpoint, topic, f"plain{n}", tag) as plain:
            seen: list[ReceivedMessage] = []
            batch: list[ReceivedMessage] = []
            while batch := await plain.receive(max_messages, INVISIBLE_S, ack=batch):
                seen += batch
        async with _consumer(shared_broker.endpoint, topic, f"ahead{n}", tag) as c:
            got, _ = await _drain_ahead(c, max_messages, depth)
        wanted = {"*": range(count), "Odd": range(0, count, 3), "None": range(0)}.get(tag, range(count))
        assert _bodies(got) == _bodies(seen) == list(wanted)
        if got:
            async with _consumer(shared_broker.endpoint, topic, f"ahead{n}", tag) as c:
                await assert_all_acknowledged(c, got)

    asyncio.run(scenario())


def test_acks_a_cancelled_receives_failed_call_carried_are_sent_when_given_again(start_broker: Any) -> None:
    """The cancelled receive's waiting call failed (the broker was gone): its acknowledgements were
    never made, the next receive said so, and given again they were held back as carried by it
    (the message came back after its invisible time)."""
    broker = start_broker(config=FAST)

    async def scenario() -> None:
        await _send(broker.endpoint, "CarriedFailed", 1)
        async with (
            _consumer(broker.endpoint, "CarriedFailed", "carriedfailed", await_duration=1) as c,
            c.prefetching(16, INVISIBLE_S, depth=2) as receiver,
        ):
            first = await receiver.receive()
            assert _bodies(first) == [0]
            await asyncio.sleep(0.5)  # the calls made ahead come back empty
            broker.stop()
            cancelled = asyncio.create_task(receiver.receive(ack=first))
            await asyncio.sleep(0)  # its waiting call is made, carrying the acknowledgement
            cancelled.cancel()
            with pytest.raises(asyncio.CancelledError):
                await cancelled
            broker.listen = broker.endpoint
            broker.start()
            with pytest.raises(RemoteError):
                await receiver.receive(ack=first)  # the kept call's failure: nothing acknowledged
            for _ in range(20):  # given again until the channel is back
                try:
                    await receiver.receive(ack=first)
                    break
                except RemoteError:
                    await asyncio.sleep(0.5)
            await assert_all_acknowledged(c, first)

    asyncio.run(scenario())
