"""A message that used its delivery attempts always leaves its group for the dead-letter topic, on a
real broker over gRPC: its copy fits whatever properties the send accepted, and the group's
dead-letter topic is created though clients' topics reached ``max_topics``. Until then the rest of
the group is served (in-process failures of the move: ``test_broker_core.py``)."""

from __future__ import annotations

import asyncio
import re
from typing import Any

import pytest

from siftmq.client import FilterExpression, Producer, SimpleConsumer
from siftmq.errors import RemoteError

pytestmark = pytest.mark.integration

FAST = {"min_invisible_time_s": 0.2, "default_queue_nums": 1}


async def _receive(consumer: SimpleConsumer, wait: float = 2.0) -> list[Any]:
    return list(await consumer.receive(16, 0.3, await_duration=wait))


async def _exhaust(consumer: SimpleConsumer, attempts: int) -> None:
    """Receive the one message sent ``attempts`` times without acking it."""
    for attempt in range(1, attempts + 1):
        got = await _receive(consumer)
        assert [m.delivery_attempt for m in got] == [attempt]
        await asyncio.sleep(0.4)  # its invisible time (0.3 s) runs out: due again


async def _dead_letters(endpoint: str, group: str) -> list[Any]:
    dlq = FilterExpression.tag("*")
    async with SimpleConsumer(
        endpoint, f"{group}-dlq-reader", {f"%DLQ%{group}": dlq}, await_duration=0
    ) as reader:
        return await _receive(reader)


def test_a_message_at_the_send_limit_of_properties_fits_its_dead_letter_copy(start_broker: Any) -> None:
    broker = start_broker(config={**FAST, "max_delivery_attempts": 2})
    topic = "T" * 127  # the longest origin topic the copy names
    keys = ["\u4e00" * 250 + f"{i:02d}" for i in range(32)]  # ~24 KiB of KEYS, 3 bytes a character

    async def scenario() -> None:
        async with Producer(broker.endpoint) as producer:
            # the send's limit leaves room for what the dead-letter copy adds: a message that
            # would fill the record's properties whole is refused, naming the size and the limit
            with pytest.raises(RemoteError) as refused:
                await producer.send(topic, b"poison", tag="a", keys=keys, properties={"p": "x" * 8_000})
            assert refused.value.status == "MESSAGE_BODY_TOO_LARGE"
            text = str(refused.value)
            found = re.search(
                r"properties of (\d+) bytes exceed the limit (\d+) \(the record limit 32767", text
            )
            assert found is not None, text
            size, limit = int(found[1]), int(found[2])
            assert limit < size <= 32_767  # a record could hold it: refused for the copy's room only
            # one byte less than refused: exactly at the limit, accepted
            at_limit = {"p": "x" * (8_000 - (size - limit))}
            sent = await producer.send(topic, b"poison", tag="a", keys=keys, properties=at_limit)
            async with SimpleConsumer(
                broker.endpoint, "G", {topic: FilterExpression.tag("*")}, await_duration=0
            ) as c:
                await _exhaust(c, 2)
                later = await producer.send(topic, b"good", tag="a")
                got = await _receive(c)
                assert [m.message_id for m in got] == [later.message_id]  # the poison went, the group goes on
            [dead] = await _dead_letters(broker.endpoint, "G")
            assert dead.message_id == sent.message_id and dead.body == b"poison"
            assert dead.properties["DLQ_ORIGIN_TOPIC"] == topic
            assert dead.properties["DLQ_ORIGIN_MESSAGE_ID"] == sent.message_id
            assert dead.properties["p"] == at_limit["p"] and list(dead.keys) == keys

    asyncio.run(scenario())


def test_max_topics_does_not_stop_a_group_from_dead_lettering(start_broker: Any) -> None:
    broker = start_broker(config={**FAST, "max_delivery_attempts": 1, "max_topics": 1})

    async def scenario() -> None:
        async with (
            Producer(broker.endpoint) as producer,
            SimpleConsumer(broker.endpoint, "G", {"T": FilterExpression.tag("*")}, await_duration=0) as c,
        ):
            poison = await producer.send("T", b"m1", tag="a")
            await _exhaust(c, 1)
            fresh = await producer.send("T", b"m2", tag="a")
            for _ in range(2):  # before: every receive failed PRECONDITION_FAILED (max_topics)
                got = await _receive(c, wait=1.0)
                if got:
                    break
            assert [m.message_id for m in got] == [fresh.message_id]
            [dead] = await _dead_letters(broker.endpoint, "G")
            assert dead.message_id == poison.message_id
            # the limit still holds for the topics clients create
            with pytest.raises(RemoteError) as refused:
                await producer.send("T2", b"x", tag="a")
            assert refused.value.status == "PRECONDITION_FAILED" and "max_topics" in str(refused.value)

    asyncio.run(scenario())
