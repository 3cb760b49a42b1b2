"""A receive answers at most what one gRPC message carries: siftmq's batch calls (ReceiveMessages,
AckAndReceive) answer in one message, and a receive of many large messages took more than the
server's frame limit holds. Its answer failed (RESOURCE_EXHAUSTED) and everything it took stayed in
flight for nobody; asked again each time, those messages could reach the dead-letter queue without
ever being delivered. A real broker, in one process and behind front-ends, and siftmq's client."""

from __future__ import annotations

import asyncio
import os
from typing import Any

import httpx
import pytest

from siftmq.client import FilterExpression, Producer, SimpleConsumer

pytestmark = pytest.mark.integration

MESSAGES = 12


@pytest.mark.parametrize(("workers", "program"), [(1, False), (2, False), (1, True)])
def test_a_receive_of_large_messages_answers_what_fits_and_leaves_the_rest_for_the_next(
    start_broker: Any, workers: int, program: bool
) -> None:
    """Read as the store gives them, and through a filter program that keeps them all."""
    broker = start_broker("data", workers=workers)
    if program:
        made = httpx.post(f"{broker.admin_url}/topics", json={"name": "Large", "queue_nums": 8}, timeout=30)
        assert made.status_code == 201, made.text
        keep_all = {"source": "def match(message):\n    return True\n"}
        put = httpx.put(f"{broker.admin_url}/groups/g-large/programs/Large", json=keep_all, timeout=60)
        assert put.status_code in (200, 201), put.text
    bodies = [os.urandom(1 << 20) for _ in range(MESSAGES)]  # 12 MiB: more than the 12 MiB frame holds

    async def scenario() -> list[int]:
        async with Producer(broker.endpoint) as producer:
            for body in bodies:
                await producer.send("Large", body, tag="t")
        sizes: list[int] = []
        got: list[bytes] = []
        async with SimpleConsumer(broker.endpoint, "g-large", {"Large": FilterExpression.tag()}) as consumer:
            batch = await consumer.receive(MESSAGES, 60)
            while batch or len(got) < MESSAGES:
                sizes.append(len(batch))
                got += [m.body for m in batch]
                if len(sizes) > 2 * MESSAGES:
                    break
                batch = await consumer.receive(MESSAGES, 60, ack=batch, await_duration=1)
        assert sorted(got) == sorted(bodies)  # each once, none lost in flight
        return sizes

    sizes = asyncio.run(scenario())
    assert 1 <= sizes[0] < MESSAGES and sum(sizes) == MESSAGES, sizes
