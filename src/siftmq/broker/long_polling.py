"""Long polling: a receive that finds nothing waits for new messages (or a redelivery) until its deadline.

The store's dispatch thread calls :meth:`ArrivalNotifier.on_arrival` with the topics that got
messages; waiting receives on those topics wake up and read again. A version counter per topic
closes the race between "read found nothing" and "start waiting".
"""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from typing import Any, TypeVar

from siftmq.broker.broker import Broker
from siftmq.broker.coalescing import ReceiveCoalescer
from siftmq.broker.model import Delivery, PullResult, Subscription
from siftmq.broker.receive import GIVE_BACK_MS

T = TypeVar("T")
_log = logging.getLogger(__name__)


class ArrivalNotifier:
    """Wakes asyncio waiters per topic; :meth:`on_arrival` may be called from any thread.

    The event loop is woken only when a receive or pull actually waits on a topic that got
    messages: the dispatch thread reports every queue of every dispatched batch, and a cross-thread
    wake-up per report cost the loop tens of microseconds each under a steady send load. A lock
    makes "check the version, then register as a waiter" and "bump the version, then take the
    waiters" atomic, so an arrival between a read and the wait is never missed.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._lock = threading.Lock()
        self._versions: dict[str, int] = {}
        self._waiters: dict[str, set[asyncio.Future[None]]] = {}
        self._timers: dict[str, asyncio.TimerHandle] = {}  # see wake_at

    def on_arrival(self, topics: set[str]) -> None:
        woken: list[asyncio.Future[None]] = []
        with self._lock:
            for topic in topics:
                self._versions[topic] = self._versions.get(topic, 0) + 1
                waiters = self._waiters.pop(topic, None)
                if waiters:
                    woken.extend(waiters)
        if woken and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(_resolve, woken)

    def wake_at(self, topic: str, delay_s: float) -> None:
        """Wake the calls waiting on ``topic`` in ``delay_s`` seconds (call it on the loop's thread).

        A message received or given back now becomes visible again then; the receives waiting on
        its topic computed when to look again before it was in flight (or due that soon), and
        would otherwise wait out their whole hold. One timer per topic, at the earliest such time:
        once woken they compute the next one themselves.
        """
        if not self._waiters.get(topic):
            return  # a receive that starts waiting later counts this message in itself
        when = self._loop.time() + max(delay_s, 0.0) + 0.005
        timer = self._timers.get(topic)
        if timer is not None:
            if timer.when() <= when:
                return
            timer.cancel()
        self._timers[topic] = self._loop.call_at(when, self._due, topic)

    def _due(self, topic: str) -> None:
        del self._timers[topic]
        self.on_arrival({topic})

    def version(self, topic: str) -> int:
        return self._versions.get(topic, 0)

    def waiting(self, topic: str) -> int:
        """How many calls wait on ``topic`` now."""
        return len(self._waiters.get(topic, ()))

    async def wait(self, topic: str, seen_version: int, timeout: float) -> None:
        """Return when ``topic`` moves past ``seen_version`` or after ``timeout`` seconds."""
        fut: asyncio.Future[None] = self._loop.create_future()
        with self._lock:
            if self._versions.get(topic, 0) != seen_version:
                return
            self._waiters.setdefault(topic, set()).add(fut)
        try:
            # not asyncio.wait_for: on Python 3.11 it returns instead of raising when the call is
            # cancelled just after an arrival resolved ``fut``, and the receive would go on to take
            # messages for a caller that is gone
            async with asyncio.timeout(timeout):
                await fut
        except TimeoutError:
            pass
        finally:
            with self._lock:
                waiters = self._waiters.get(topic)
                if waiters is not None:
                    waiters.discard(fut)
                    if not waiters:
                        del self._waiters[topic]


def _resolve(futures: list[asyncio.Future[None]]) -> None:
    for fut in futures:
        if not fut.done():
            fut.set_result(None)


async def _long_poll(
    notifier: ArrivalNotifier,
    topic: str,
    hold_s: float,
    attempt: Callable[[], T],
    *,
    done: Callable[[T], bool],
    next_due_ms: Callable[[], int | None] | None = None,
    executor: Executor | None = None,
    try_inline: Callable[[], T | None] | None = None,
    first: asyncio.Future[T | None] | None = None,
    orphaned: Callable[[T], None] | None = None,
) -> T:
    """Run ``attempt`` (in ``executor``, else the loop's default) until ``done`` or ``hold_s`` has passed.

    With ``try_inline``, each attempt is first tried on the loop, and made in ``executor`` only
    when that answers None; ``first`` stands for the first such try (made with others). Between
    attempts it sleeps until a message arrives on ``topic`` or, with ``next_due_ms``, until the
    earliest redelivery falls due. ``orphaned`` is given what an attempt got for a caller that was
    cancelled meanwhile (on the loop): a receive's deliveries, which nobody would acknowledge.
    """
    deadline = time.monotonic() + max(hold_s, 0.0)
    loop = asyncio.get_running_loop()
    while True:
        seen = notifier.version(topic)
        if first is not None:
            shared, first = first, None
            try:
                result = await shared
            except asyncio.CancelledError:
                # cancelled after its share was taken (in the same turn): the share is nobody's
                if orphaned is not None and shared.done():
                    _hand_on(orphaned, shared)
                raise
        else:
            result = try_inline() if try_inline is not None else None
        if result is None:
            result = await _in_thread(loop, executor, attempt, orphaned)
        remaining = deadline - time.monotonic()
        if done(result) or remaining <= 0:
            return result
        if next_due_ms is not None:
            due = await loop.run_in_executor(executor, next_due_ms)
            if due is not None:
                remaining = min(remaining, max(due - time.time() * 1000, 0) / 1000 + 0.005)
        await notifier.wait(topic, seen, max(remaining, 0.001))


async def _in_thread(
    loop: asyncio.AbstractEventLoop,
    executor: Executor | None,
    attempt: Callable[[], T],
    orphaned: Callable[[T], None] | None,
) -> T:
    """``attempt`` in ``executor``; cancelled while it runs, what it gets goes to ``orphaned`` (a
    thread cannot be stopped); cancelled before it starts, it takes nothing."""
    if orphaned is None:
        return await loop.run_in_executor(executor, attempt)
    gone = threading.Event()
    work = loop.run_in_executor(executor, functools.partial(_unless, gone, attempt))
    try:
        found = await asyncio.shield(work)
    except asyncio.CancelledError:
        gone.set()
        work.add_done_callback(functools.partial(_hand_on, orphaned))
        raise
    assert found is not None  # None only once ``gone`` is set
    return found


def _unless(gone: threading.Event, attempt: Callable[[], T]) -> T | None:
    return None if gone.is_set() else attempt()


def _hand_on(orphaned: Callable[[T], None], work: asyncio.Future[T | None]) -> None:
    if not work.cancelled() and work.exception() is None and (got := work.result()) is not None:
        orphaned(got)


def give_back_later(
    broker: Broker,
    notifier: ArrivalNotifier,
    group: str,
    topic: str,
    deliveries: Sequence[Delivery],
    *,
    client_id: str,
    executor: Executor | None,
) -> None:
    """:meth:`Broker.give_back` in ``executor`` (it takes the queues' locks), not awaited: its
    caller is being cancelled. Call on the loop."""
    if not deliveries:
        return
    give = functools.partial(broker.give_back, group, topic, list(deliveries), client_id=client_id)
    try:
        given = asyncio.get_running_loop().run_in_executor(executor, give)
    except RuntimeError:  # no loop, or its executor shut down (the broker stopping): back in their time
        return
    given.add_done_callback(functools.partial(_given_back, notifier, topic))


def _given_back(notifier: ArrivalNotifier, topic: str, given: asyncio.Future[int]) -> None:
    if given.cancelled():
        return
    if given.exception() is not None:
        _log.error("giving back deliveries whose receiver was gone failed", exc_info=given.exception())
    elif given.result():  # receives waiting on the topic look again when they are visible
        notifier.wake_at(topic, GIVE_BACK_MS / 1000)


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
    executor: Executor | None = None,
    auto_renew: bool = False,
    coalescer: ReceiveCoalescer | None = None,
) -> list[Delivery]:
    """:meth:`Broker.receive`, waiting up to ``hold_s`` seconds for something to deliver; on the
    loop when :meth:`Broker.try_receive` can serve it (first tried with the other receives of
    this turn of the loop, through ``coalescer``), else in ``executor``."""
    asked: dict[str, Any] = {
        "client_id": client_id,
        "queue_id": queue_id,
        "batch_size": batch_size,
        "invisible_ms": invisible_ms,
        "auto_renew": auto_renew,
    }
    receive = functools.partial(broker.receive, group, subscription, **asked)
    try_receive = functools.partial(broker.try_receive, group, subscription, **asked)
    next_due = functools.partial(broker.next_redelivery_ms, group, subscription.topic, client_id)
    first = None if coalescer is None else coalescer.try_receive(group, subscription, **asked)
    orphaned = functools.partial(
        give_back_later,
        broker,
        notifier,
        group,
        subscription.topic,
        client_id=client_id,
        executor=executor,
    )
    deliveries = await _long_poll(
        notifier,
        subscription.topic,
        hold_s,
        receive,
        done=bool,
        next_due_ms=next_due,
        executor=executor,
        try_inline=try_receive,
        first=first,
        orphaned=orphaned,
    )
    if deliveries:  # other receives waiting on the topic look again when these come due
        notifier.wake_at(subscription.topic, min(d.invisible_ms for d in deliveries) / 1000)
    return deliveries


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
    executor: Executor | None = None,
) -> PullResult:
    """:meth:`Broker.pull`, waiting up to ``hold_s`` seconds while the queue has nothing new."""
    pull = functools.partial(
        broker.pull, group, subscription, queue_id, offset, batch_size, client_id=client_id
    )
    return await _long_poll(
        notifier,
        subscription.topic,
        hold_s,
        pull,
        done=lambda r: r.status != "NO_NEW_MESSAGE",
        executor=executor,
    )
