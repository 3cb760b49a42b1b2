"""Thousands of topics under a 1,024 open-file limit.

Before, every ConsumeQueue and ConsumeQueueExt file held a descriptor: after about 500 topics every
send failed (``Too many open files``), existing topics included. Index files now share a bounded
pool (see :mod:`siftmq.store.filepool`).
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from siftmq.client import FilterExpression, Producer, SimpleConsumer

pytestmark = [pytest.mark.integration, pytest.mark.slow]

TOPICS = 2000


async def _one_each(endpoint: str) -> dict[str, str]:
    acked: dict[str, str] = {}
    async with Producer(endpoint) as producer:
        for i in range(TOPICS):
            topic = f"fd{i}"
            acked[topic] = (await producer.send(topic, f"body {i}".encode(), tag="t")).message_id
    return acked


async def _read(endpoint: str, topic: str) -> list[str]:
    async with SimpleConsumer(endpoint, f"g-{topic}", {topic: FilterExpression.tag("*")}) as consumer:
        messages = await consumer.receive(16, invisible_duration=30)
        for m in messages:
            await consumer.ack(m)
        return [m.message_id for m in messages]


def test_two_thousand_topics_under_a_1024_file_limit(start_broker: Any) -> None:
    broker = start_broker("data", open_files=1024, config={"default_queue_nums": 1})
    acked = asyncio.run(_one_each(broker.endpoint))
    assert len(acked) == TOPICS
    sample = [f"fd{i}" for i in (*range(0, TOPICS, 97), TOPICS - 1)]
    for topic in sample:  # early topics (their files long closed) and late ones read back
        assert asyncio.run(_read(broker.endpoint, topic)) == [acked[topic]]
    again = asyncio.run(_one_each(broker.endpoint))  # and every topic still takes sends
    assert len(again) == TOPICS
    log = broker.log()
    assert "Too many open files" not in log and "Traceback" not in log
    assert "open-file limit: soft 1024, hard 1024" in log
    assert broker.stop() == 0
