"""A SimpleConsumer's receive with the next batches asked for while the application handles this one.

A plain ``receive(ack=batch)`` is a round trip the application waits out: the broker reads and
answers while the client is idle, then the client decodes and handles the batch while the broker
is idle. :class:`Prefetching` overlaps the two. Each ``receive`` returns a batch an earlier call
received, and before returning makes the next call (this call's acknowledgements riding along), so
``depth`` calls (2 by default) are in flight while the application works. NATS's pull consumers get
the same overlap from acknowledgements they never wait for; here every acknowledgement is still
confirmed, ``depth`` calls later.

What changes for the application, against a plain ``receive``:

* an acknowledgement's failure is raised by a later ``receive`` (the ``depth``-th after it), or by
  :meth:`Prefetching.close`; a ``receive`` that raises sends nothing, so the messages given to it
  are still the caller's to acknowledge;
* a batch asked for ahead is invisible to the rest of the group from the moment it is received: its
  invisible duration runs while the application still handles the batches before it;
* the calls made ahead do not wait for messages: when they find none, the next ``receive`` waits
  for some as a plain one does (the consumer's ``await_duration``), so a drained topic costs a few
  extra calls per wait, not calls held open;
* :meth:`Prefetching.close` makes what was received ahead, and never returned, visible to the group
  again in ``RELEASE_S`` (1 s) instead of after its invisible duration. A message released counts a
  delivery attempt, as any redelivery does (a receiver opened and closed very often can move a
  message towards the dead-letter queue unseen).

Calls made ahead need siftmq's broker (a non-waiting receive; Apache RocketMQ's proxy raises a long
poll to its own minimum): against a broker without siftmq's extension, ``receive`` is a plain one.
Concurrent ``receive`` calls on one receiver take turns.
"""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from siftmq.client.model import ReceivedMessage
from siftmq.errors import RemoteError

if TYPE_CHECKING:
    from siftmq.client.consumers import SimpleConsumer

_log = logging.getLogger(__name__)


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
        self._turn = asyncio.Lock()

    @property
    def in_flight(self) -> int:
        """Calls asked ahead and not yet collected."""
        return len(self._ahead)

    async def __aenter__(self) -> Prefetching:
        return self

    async def __aexit__(self, *exc: object) -> None:
        if exc[0] is None:
            await self.close()
            return
        try:  # the body's own error goes on; an acknowledgement's failure is only logged then
            await self.close()
        except RemoteError as failed:
            _log.warning("closing a prefetching receiver of %s: %s", self.consumer.group, failed)

    async def receive(self, *, ack: Sequence[ReceivedMessage] = ()) -> list[ReceivedMessage]:
        """The next batch (waiting up to the consumer's ``await_duration`` when none is ready);
        ``ack`` rides along with the next call made. Raises the failure of acknowledgements given
        to an earlier call, if any, and then sends nothing."""
        async with self._turn:
            while self._ahead:
                batch = await self._collect(self._ahead[0])
                if batch:
                    self._top_up(ack)
                    return batch
            batch = await self.consumer.receive(self.max_messages, self.invisible_duration, ack=ack)
            if batch and self.consumer.connection.batch_extension is True:  # a non-waiting receive there
                self._top_up(())
            return batch

    async def _collect(self, ahead: asyncio.Task[list[ReceivedMessage]]) -> list[ReceivedMessage]:
        """The outcome of the call at the head, which leaves the queue only once the outcome is
        handed over: a caller cancelled while waiting (even in the turn the call finished) leaves
        it for the next receive or close()."""
        try:
            batch = await asyncio.shield(ahead)
        except asyncio.CancelledError:
            if ahead.cancelled():
                self._ahead.popleft()
            raise
        except BaseException:
            self._ahead.popleft()
            raise
        self._ahead.popleft()
        return batch

    def _top_up(self, ack: Sequence[ReceivedMessage]) -> None:
        """Calls ahead up to ``depth`` (one at least, to carry ``ack``; one that failed is replaced)."""
        self._ask_ahead(ack)
        while len(self._ahead) < self.depth:
            self._ask_ahead(())

    def _ask_ahead(self, ack: Sequence[ReceivedMessage]) -> None:
        ack = tuple(ack)  # the call starts later, and the caller may change its list meanwhile
        call = self.consumer.receive(self.max_messages, self.invisible_duration, ack=ack, await_duration=0)
        self._ahead.append(asyncio.create_task(call))

    async def close(self) -> None:
        """Wait for the calls in flight (they do not wait for messages) and release what they
        received; then raises an acknowledgement's failure, if any. Cancelling it leaves the calls
        to finish and their messages to be released."""
        async with self._turn:
            ahead = list(self._ahead)
            if not ahead:
                return
            collected = asyncio.gather(*ahead, return_exceptions=True)
            self._ahead.clear()
            done = asyncio.ensure_future(self._release_when(collected))
            failures = await asyncio.shield(done)
        if failures:
            raise failures[0]

    async def _release_when(self, collected: asyncio.Future[list[Any]]) -> list[Exception]:
        """Release what the collected calls received; their failures (a call cancelled under it,
        as by a closed channel, is not one to raise)."""
        results = await collected
        await self.consumer.release([m for r in results if isinstance(r, list) for m in r])
        return [r for r in results if isinstance(r, Exception)]
