"""Helpers of the tests that consume through siftmq's own client against a real broker."""

from __future__ import annotations

from siftmq.client import FilterExpression, ReceivedMessage, SimpleConsumer


async def drain(
    endpoint: str, group: str, topic: str, *, limit: int | None = None, batch: int = 32
) -> list[ReceivedMessage]:
    """Receive and acknowledge ``topic``'s messages as ``group`` until a receive comes back empty
    (or ``limit`` were received)."""
    got: list[ReceivedMessage] = []
    async with SimpleConsumer(endpoint, group, {topic: FilterExpression.tag("*")}) as consumer:
        while limit is None or len(got) < limit:
            size = batch if limit is None else min(batch, limit - len(got))
            messages = await consumer.receive(size, invisible_duration=60)
            if not messages:
                break
            for m in messages:
                got.append(m)
                await consumer.ack(m)
    return got
