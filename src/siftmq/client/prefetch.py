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
* a ``receive`` cancelled at any point leaves its call for the next one: the call it waited for,
  or the waiting one it made (acknowledgements included, so a message handed to it is returned by
  the next ``receive`` instead of staying invisible). Its acknowledgements may be given again to
  the next ``receive``: those its call carried are not sent twice;
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
#: receipt handles remembered as carried (the oldest forgotten first): bounds what a caller that
#: never gives a cancelled receive's acknowledgements again leaves behind
MAX_CARRIED = 65_536


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
        # receipt handles of acknowledgements a cancelled receive's call carries: given again, they
        # are not sent a second time (which would fail)
        self._carried: dict[str, None] = {}

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
        to an earlier call, if any, and then sends nothing.

        Cancelled, it leaves its call (one it was waiting for, or the waiting one it made) for the
        next receive. ``ack`` may then be given again: what that call carries is not sent twice."""
        async with self._turn:
            again = [m for m in ack if m.receipt_handle in self._carried]
            if again:
                ack = [m for m in ack if m.receipt_handle not in self._carried]
            while self._ahead:
                batch = await self._collect(self._ahead[0])
                if batch:
                    self._send_along(ack)
                    self._forget_carried(again)
                    return batch
            # waiting for messages: made as the calls ahead are, so a cancel leaves it for the next receive
            call = asyncio.create_task(
                self.consumer.receive(self.max_messages, self.invisible_duration, ack=tuple(ack))
            )
            self._ahead.append(call)
            try:
                batch = await self._collect(call)
            except asyncio.CancelledError:
                if not call.cancelled():  # it goes on, and makes these acknowledgements
                    self._carried.update(dict.fromkeys(m.receipt_handle for m in ack))
                    while len(self._carried) > MAX_CARRIED:
                        del self._carried[next(iter(self._carried))]
                raise
            if batch and self.consumer.connection.batch_extension is True:  # a non-waiting receive there
                self._top_up(())
            self._forget_carried(again)
            return batch

    def _send_along(self, ack: Sequence[ReceivedMessage]) -> None:
        """``ack`` with the calls made ahead (siftmq's broker), else in a call of its own: either is
        collected, and a failure raised, by a later receive."""
        if self.consumer.connection.batch_extension is True:
            self._top_up(ack)
        elif ack:  # the batch came from the call a cancelled receive left: no calls ahead here
            self._ahead.append(asyncio.create_task(self._acknowledge(tuple(ack))))

    async def _acknowledge(self, ack: Sequence[ReceivedMessage]) -> list[ReceivedMessage]:
        await self.consumer.ack_many(ack)
        return []

    def _forget_carried(self, given_again: Sequence[ReceivedMessage]) -> None:
        """A receive given them again returned: the caller is done with them."""
        for m in given_again:
            self._carried.pop(m.receipt_handle, None)

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
            # its acknowledgements were not made (the failure says so): given again, they are sent
            self._carried.clear()
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
        """Wait for the calls in flight (those made ahead do not wait for messages; one a cancelled
        receive left waits up to the consumer's ``await_duration``) and release what they received;
        then raises an acknowledgement's failure, if any. Cancelling it leaves the calls to finish
        and their messages to be released."""
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
