"""PullConsumer.commit: one UpdateOffsets call through siftmq's extension, the same offsets as the
standard calls (UpdateOffset per queue after QueryAssignment), and only the client's own queues."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from siftmq.client import FilterExpression, Producer, PullConsumer
from siftmq.errors import RemoteError
from siftmq.protocol import rocketmq_v2_pb2 as pb

pytestmark = pytest.mark.integration


async def _committed(consumer: PullConsumer, queues: int) -> dict[int, int | None]:
    found: dict[int, int | None] = {}
    for qid in range(queues):
        try:
            got = await consumer.connection.unary(
                "GetOffset",
                pb.GetOffsetRequest(
                    group=consumer.connection.resource(consumer.group), message_queue=consumer._queue(qid)
                ),
            )
            found[qid] = int(got.offset)
        except RemoteError:
            found[qid] = None
    return found


async def _spread(endpoint: str, topic: str, count: int) -> None:
    """``count`` messages sent one at a time, so they spread over the topic's queues."""
    async with Producer(endpoint) as producer:
        for _ in range(count):
            await producer.send(topic, b"x", tag="t")


async def _polled(consumer: PullConsumer) -> int:
    """How many messages ten polls return (the topic's, once its sends are done)."""
    return sum([len(await consumer.poll(64, timeout=0.2)) for _ in range(10)])


async def _standard_path_consumer(endpoint: str, group: str, topic: str) -> PullConsumer:
    """A started PullConsumer that uses the standard calls only, as against Apache RocketMQ."""
    consumer = PullConsumer(endpoint, group, topic, FilterExpression.tag())
    consumer.connection.batch_extension = False
    await consumer.start()
    return consumer


@pytest.mark.parametrize("extension", [True, False])
def test_commit_stores_the_positions_of_the_clients_queues(start_broker: Any, extension: bool) -> None:
    broker = start_broker()
    group = f"commit-{extension}"

    async def scenario() -> None:
        async with Producer(broker.endpoint) as producer:
            await producer.send_many([producer.message("CommitTopic", b"x", tag="t") for _ in range(80)])
        consumer = PullConsumer(broker.endpoint, group, "CommitTopic", FilterExpression.tag())
        if not extension:
            consumer.connection.batch_extension = False
        await consumer.start()
        try:
            assert await _polled(consumer) == 80
            calls: list[str] = []
            original = consumer.connection._method

            def counting(rpc: Any, request: Any) -> Any:
                if rpc.name in ("UpdateOffsets", "UpdateOffset", "QueryAssignment"):  # not the prefetch
                    calls.append(rpc.name)
                return original(rpc, request)

            consumer.connection._method = counting  # type: ignore[method-assign]
            await consumer.commit()
            consumer.connection._method = original  # type: ignore[method-assign]
            queues = await consumer.assignment()
            if extension:
                assert calls == ["UpdateOffsets"]
            else:
                assert calls.count("UpdateOffset") == len(queues) and "QueryAssignment" in calls
            committed = await _committed(consumer, 8)
            assert sum(o or 0 for o in committed.values()) == 80  # every message's position
        finally:
            await consumer.stop()

    asyncio.run(scenario())


def test_a_bad_offset_stores_nothing(start_broker: Any) -> None:
    broker = start_broker()

    async def scenario() -> None:
        async with Producer(broker.endpoint) as producer:
            await producer.send_many([producer.message("BadCommit", b"x", tag="t") for _ in range(16)])
        consumer = PullConsumer(broker.endpoint, "bad-commit", "BadCommit", FilterExpression.tag())
        await consumer.start()
        try:
            for _ in range(4):
                await consumer.poll(64, timeout=0.2)
            qids = await consumer.assignment()
            with pytest.raises(RemoteError, match="outside"):
                await consumer.connection.update_offsets(
                    "bad-commit", "BadCommit", {qids[0]: 1, qids[1]: 10_000}
                )
            assert set((await _committed(consumer, 8)).values()) == {None}  # the good one was not stored
        finally:
            await consumer.stop()

    asyncio.run(scenario())


def test_a_refused_queue_does_not_keep_the_others_unstored_on_the_standard_path(start_broker: Any) -> None:
    """Against a broker without the batch extension each queue is one UpdateOffset: one refused
    (an offset past the queue's end) is reported after the others are stored."""
    broker = start_broker()

    async def scenario() -> None:
        await _spread(broker.endpoint, "PartCommit", 80)
        consumer = await _standard_path_consumer(broker.endpoint, "part-commit", "PartCommit")
        try:
            assert await _polled(consumer) == 80
            queues = list(consumer._offsets)  # the order commit goes through them
            consumer.seek(queues[0], 10_000)  # past the end: the broker refuses this one
            with pytest.raises(RemoteError, match=f"1 of {len(queues)} queue offsets were not stored"):
                await consumer.commit()
            expected = {q: consumer._resume_offset(q) for q in queues[1:]}
            committed = await _committed(consumer, 8)
            assert committed[queues[0]] is None
            assert {q: committed[q] for q in queues[1:]} == expected  # every other queue's was stored
            assert sum(expected.values()) > 0 and len(queues) > 1
        finally:
            await consumer.stop()

    asyncio.run(scenario())


def test_a_queue_rebalanced_away_before_its_update_offset_is_forgotten(start_broker: Any) -> None:
    """The standard path asks QueryAssignment, then UpdateOffset per queue: a member joining in
    between takes some of them, whose commits the broker refuses (PRECONDITION_FAILED). Those are
    rebalanced away, not an error, and the new owner's offsets stay as they were."""
    broker = start_broker()

    async def scenario() -> None:
        await _spread(broker.endpoint, "Rebalanced", 40)
        first = await _standard_path_consumer(broker.endpoint, "rebalanced", "Rebalanced")
        second = PullConsumer(broker.endpoint, "rebalanced", "Rebalanced", FilterExpression.tag())
        try:
            assert await _polled(first) == 40
            stale = await first.assignment()  # every queue, while it is alone
            assert stale == list(range(8))

            async def answered_before_the_join() -> list[int]:
                return stale

            first.assignment = answered_before_the_join  # type: ignore[method-assign]
            await second.start()
            taken = await second.assignment()
            assert taken and len(taken) < 8
            await first.commit()  # before: the broker took all 8, moving the second one's queues
            committed = await _committed(first, 8)
            assert all(committed[q] is None for q in taken)  # untouched: the second one's to commit
            assert all(committed[q] is not None and committed[q] > 0 for q in range(8) if q not in taken)
            assert not set(first._offsets) & set(taken)  # forgotten by the first one
        finally:
            await second.stop()
            await first.stop()

    asyncio.run(scenario())


@pytest.mark.parametrize("extension", [True, False])
def test_after_a_broker_restart_the_consumer_registers_again(start_broker: Any, extension: bool) -> None:
    """A restarted broker has forgotten the consumer's settings: the assignment it answered was
    empty until the next heartbeat (10 s), so polls found nothing, and a commit through the
    standard calls took every queue for rebalanced away and stored nothing. The consumer sends its
    settings again when the broker answers as to a client it does not know."""
    broker = start_broker()

    async def scenario() -> None:
        async with Producer(broker.endpoint) as producer:
            await producer.send_many([producer.message("Restarted", b"%d" % i) for i in range(20)])
        consumer = PullConsumer(broker.endpoint, "restarted", "Restarted", FilterExpression.tag())
        async with consumer:
            if not extension:
                consumer.connection.batch_extension = False
            assert len(await consumer.poll(20, timeout=1)) == 20
            broker.stop()
            broker.listen = broker.endpoint
            broker.start()
            await consumer.commit()
            async with Producer(broker.endpoint) as producer:
                await producer.send("Restarted", b"20")
            assert [m.body for m in await consumer.poll(20, timeout=3)] == [b"20"]
            await consumer.commit()
        async with PullConsumer(broker.endpoint, "restarted", "Restarted", FilterExpression.tag()) as again:
            assert await again.poll(50, timeout=1) == []  # every position was stored

    asyncio.run(scenario())


def test_a_queue_that_comes_back_goes_on_from_the_groups_offset(start_broker: Any) -> None:
    """A's own position on the queues B took was kept and, once they came back, preferred to the
    group's: what B had consumed and committed meanwhile, A read again."""
    broker = start_broker()

    async def scenario() -> None:
        await _spread(broker.endpoint, "Back", 16)
        a = PullConsumer(broker.endpoint, "back-g", "Back", FilterExpression.tag())
        b = PullConsumer(broker.endpoint, "back-g", "Back", FilterExpression.tag())
        for consumer in (a, b):
            consumer.assignment_ttl_s = 0.0
        async with a:
            assert await _polled(a) == 16
            await a.commit()
            async with b:
                await a.poll(64)  # A learns it has half of the queues now
                await _spread(broker.endpoint, "Back", 16)
                got_b = await _polled(b)
                await b.commit()
            got_a = await _polled(a)  # every queue is A's again
            assert got_a + got_b == 16, (got_a, got_b)

    asyncio.run(scenario())


def test_seek_refuses_what_is_no_queue_position() -> None:
    """A negative offset was taken: every poll of the queue was empty and every commit failed."""

    async def scenario() -> None:  # (a client is made on an event loop)
        consumer = PullConsumer("127.0.0.1:9", "g", "T", FilterExpression.tag())
        for queue_id, offset in ((0, -5), (-1, 0), (True, 0), (0, 1.5)):
            with pytest.raises(ValueError, match=r"queue_id|offset"):
                consumer.seek(queue_id, offset)  # type: ignore[arg-type]
        await consumer.connection.close()

    asyncio.run(scenario())
