"""A SimpleConsumer's receive with the next batch asked for while the application handles this one.

A plain ``receive(ack=batch)`` is a round trip the application waits out: the broker reads and
answers while the client is idle, then the client decodes and handles the batch while the broker
is idle. :class:`Prefetching` overlaps the two. Each ``receive`` returns the batch its previous
call asked for, and before returning sends the next call (this call's acknowledgements riding
along), so the broker serves it while the application handles the batch. NATS's pull consumers get
the same overlap from acknowledgements they never wait for; here every acknowledgement is still
confirmed, one call later.

What changes for the application, against a plain ``receive``:

* an acknowledgement's failure is raised by the *next* ``receive`` (or by :meth:`Prefetching.close`);
  that call raises and sends nothing, so the messages given to it are still the caller's to
  acknowledge;
* a batch asked for ahead is invisible to the rest of the group from the moment it is received: its
  invisible duration runs while the application still handles the batch before it;
* the call asked ahead does not wait for messages: when it finds none, the next ``receive`` waits
  for some as a plain one does (the consumer's ``await_duration``), so a drained topic costs one
  extra call per wait, not a prefetch held open;
* :meth:`Prefetching.close` makes a batch received ahead, and never returned, visible to the group
  again at once (in the broker's shortest invisible time) — it is not left invisible.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Sequence
from typing import TYPE_CHECKING

from siftmq.client.model import ReceivedMessage

if TYPE_CHECKING:
    from siftmq.client.consumers import SimpleConsumer


class Prefetching:
    """``receive(ack=...)`` with ``depth`` calls asked ahead; use as
    ``async with consumer.prefetching(64, 60) as receiver``."""

    def __init__(
        self, consumer: SimpleConsumer, max_messages: int, invisible_duration: float, depth: int = 2
    ) -> None:
        if depth < 1:
            raise ValueError(f"depth must be at least 1, not {depth}")
        self.consumer = consumer
        self.max_messages = max_messages
        self.invisible_duration = invisible_duration
        self.depth = depth
        self._ahead: collections.deque[asyncio.Task[list[ReceivedMessage]]] = collections.deque()

    @property
    def in_flight(self) -> int:
        """Calls asked ahead and not yet collected."""
        return len(self._ahead)

    async def __aenter__(self) -> Prefetching:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def receive(self, *, ack: Sequence[ReceivedMessage] = ()) -> list[ReceivedMessage]:
        """The next batch (waiting up to the consumer's ``await_duration`` when none is ready);
        ``ack`` rides along with the next call made. Raises the failure of acknowledgements given
        to an earlier call, if any, and then sends nothing."""
        while self._ahead:
            ahead = self._ahead[0]
            try:  # a cancelled caller leaves the call in flight for the next receive or close()
                batch = await asyncio.shield(ahead)
            finally:
                if ahead.done():
                    self._ahead.popleft()
            if batch:
                self._ask_ahead(ack)
                return batch
        batch = await self.consumer.receive(self.max_messages, self.invisible_duration, ack=ack)
        if batch:
            for _ in range(self.depth):
                self._ask_ahead(())
        return batch

    def _ask_ahead(self, ack: Sequence[ReceivedMessage]) -> None:
        ack = tuple(ack)  # the call starts later, and the caller may change its list meanwhile
        call = self.consumer.receive(self.max_messages, self.invisible_duration, ack=ack, await_duration=0)
        self._ahead.append(asyncio.create_task(call))

    async def close(self) -> None:
        """Wait for the calls in flight (they do not wait for messages) and release what they
        received; raises an acknowledgement's failure, if any, once every call was collected."""
        ahead, self._ahead = list(self._ahead), collections.deque()
        results = await asyncio.gather(*ahead, return_exceptions=True)
        await self.consumer.release([m for r in results if isinstance(r, list) for m in r])
        for r in results:
            if isinstance(r, BaseException):
                raise r
