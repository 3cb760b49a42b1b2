"""Long polling: a receive that finds nothing waits for new messages (or a redelivery) until its deadline.

The store's dispatch thread calls :meth:`ArrivalNotifier.on_arrival` with the topics that got
messages; waiting receives on those topics wake up and read again. A version counter per topic
closes the race between "read found nothing" and "start waiting".
"""

from __future__ import annotations

import asyncio
import functools
import time

from siftmq.broker.broker import Broker
from siftmq.broker.model import Delivery, PullResult, Subscription


class ArrivalNotifier:
    """Wakes asyncio waiters per topic; :meth:`on_arrival` may be called from any thread."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._versions: dict[str, int] = {}
        self._waiters: dict[str, set[asyncio.Future[None]]] = {}

    def on_arrival(self, topics: set[str]) -> None:
        if not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._wake, topics)

    def _wake(self, topics: set[str]) -> None:
        for topic in topics:
            self._versions[topic] = self._versions.get(topic, 0) + 1
            for fut in self._waiters.pop(topic, ()):
                if not fut.done():
                    fut.set_result(None)

    def version(self, topic: str) -> int:
        return self._versions.get(topic, 0)

    async def wait(self, topic: str, seen_version: int, timeout: float) -> None:
        """Return when ``topic`` moves past ``seen_version`` or after ``timeout`` seconds."""
        if self.version(topic) != seen_version:
            return
        fut: asyncio.Future[None] = self._loop.create_future()
        self._waiters.setdefault(topic, set()).add(fut)
        try:
            await asyncio.wait_for(fut, timeout)
        except TimeoutError:
            pass
        finally:
            waiters = self._waiters.get(topic)
            if waiters is not None:
                waiters.discard(fut)


async def receive_long_polling(
    broker: Broker,
    notifier: ArrivalNotifier,
    group: str,
    subscription: Subscription,
    *,
    queue_id: int,
    batch_size: int,
    invisible_ms: int | None,
    hold_s: float,
    client_id: str = "",
) -> list[Delivery]:
    """:meth:`Broker.receive`, waiting up to ``hold_s`` seconds for something to deliver."""
    deadline = time.monotonic() + max(hold_s, 0.0)
    topic = subscription.topic
    while True:
        seen = notifier.version(topic)
        deliveries = await asyncio.to_thread(
            broker.receive,
            group,
            subscription,
            client_id=client_id,
            queue_id=queue_id,
            batch_size=batch_size,
            invisible_ms=invisible_ms,
        )
        remaining = deadline - time.monotonic()
        if deliveries or remaining <= 0:
            return deliveries
        due = await asyncio.to_thread(broker.next_redelivery_ms, group, topic, client_id)
        if due is not None:
            remaining = min(remaining, max(due - time.time() * 1000, 0) / 1000 + 0.005)
        await notifier.wait(topic, seen, max(remaining, 0.001))


async def pull_long_polling(
    broker: Broker,
    notifier: ArrivalNotifier,
    group: str,
    subscription: Subscription,
    *,
    queue_id: int,
    offset: int,
    batch_size: int,
    hold_s: float,
    client_id: str = "",
) -> PullResult:
    """:meth:`Broker.pull`, waiting up to ``hold_s`` seconds while the queue has nothing new."""
    deadline = time.monotonic() + max(hold_s, 0.0)
    topic = subscription.topic
    while True:
        seen = notifier.version(topic)
        result = await asyncio.to_thread(
            functools.partial(broker.pull, client_id=client_id),
            group,
            subscription,
            queue_id,
            offset,
            batch_size,
        )
        remaining = deadline - time.monotonic()
        if result.status != "NO_NEW_MESSAGE" or remaining <= 0:
            return result
        await notifier.wait(topic, seen, remaining)
