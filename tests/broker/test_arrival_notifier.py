"""ArrivalNotifier: long-polling waiters wake on arrivals from other threads, and nothing is missed."""

from __future__ import annotations

import asyncio
import threading
import time

from siftmq.broker.long_polling import ArrivalNotifier


def test_a_waiter_wakes_when_its_topic_gets_messages_from_another_thread() -> None:
    async def scenario() -> None:
        notifier = ArrivalNotifier(asyncio.get_running_loop())
        seen = notifier.version("T")
        timer = threading.Timer(0.05, notifier.on_arrival, args=({"Other", "T"},))
        start = time.monotonic()
        timer.start()
        await notifier.wait("T", seen, timeout=10)
        assert time.monotonic() - start < 5
        assert notifier.version("T") == seen + 1
        assert notifier.waiting("T") == 0

    asyncio.run(scenario())


def test_an_arrival_between_the_read_and_the_wait_is_not_missed() -> None:
    async def scenario() -> None:
        notifier = ArrivalNotifier(asyncio.get_running_loop())
        seen = notifier.version("T")  # a read found nothing ...
        thread = threading.Thread(target=notifier.on_arrival, args=({"T"},))
        thread.start()  # ... a message arrives before the wait starts
        thread.join()
        start = time.monotonic()
        await notifier.wait("T", seen, timeout=10)
        assert time.monotonic() - start < 1

    asyncio.run(scenario())


def test_waits_time_out_and_leave_no_waiter_behind() -> None:
    async def scenario() -> None:
        notifier = ArrivalNotifier(asyncio.get_running_loop())
        notifier.on_arrival({"Other"})  # no waiter: nothing to wake
        seen = notifier.version("T")
        waits = [asyncio.create_task(notifier.wait("T", seen, timeout=0.05)) for _ in range(3)]
        await asyncio.sleep(0.01)
        assert notifier.waiting("T") == 3
        await asyncio.gather(*waits)
        assert notifier.waiting("T") == 0
        seen = notifier.version("T")
        many = [asyncio.create_task(notifier.wait("T", seen, timeout=10)) for _ in range(5)]
        await asyncio.sleep(0.01)
        await asyncio.to_thread(notifier.on_arrival, {"T"})
        await asyncio.wait_for(asyncio.gather(*many), timeout=5)
        assert notifier.waiting("T") == 0

    asyncio.run(scenario())


def test_wake_at_wakes_the_waiters_of_a_topic_then_and_keeps_the_earliest_time() -> None:
    async def scenario() -> None:
        notifier = ArrivalNotifier(asyncio.get_running_loop())
        notifier.wake_at("T", 0.05)  # nobody waits: nothing scheduled
        seen = notifier.version("T")
        start = time.monotonic()
        waiting = asyncio.create_task(notifier.wait("T", seen, timeout=10))
        await asyncio.sleep(0.01)
        notifier.wake_at("T", 5.0)
        notifier.wake_at("T", 0.2)  # earlier: replaces the 5 s one
        notifier.wake_at("T", 3.0)  # later: the 0.2 s one stands
        await waiting
        assert 0.15 < time.monotonic() - start < 2
        assert notifier.version("T") == seen + 1 and notifier.waiting("T") == 0

    asyncio.run(scenario())


def test_a_wait_cancelled_in_the_turn_its_arrival_came_is_cancelled() -> None:
    """Python 3.11's asyncio.wait_for returned instead of raising when the waiting call was
    cancelled (its client gone) just after an arrival resolved the wait: the long poll went on to
    receive messages for nobody."""

    async def scenario() -> None:
        notifier = ArrivalNotifier(asyncio.get_running_loop())
        went_on = []

        async def long_poll() -> None:
            await notifier.wait("T", notifier.version("T"), timeout=30)
            went_on.append(True)

        task = asyncio.create_task(long_poll())
        await asyncio.sleep(0.01)
        notifier.on_arrival({"T"})  # as the dispatch thread reports (call_soon_threadsafe)
        await asyncio.sleep(0)  # the arrival has resolved the wait; the task has not run yet
        task.cancel()  # the client's cancel, read in the same turn
        await asyncio.gather(task, return_exceptions=True)
        assert task.cancelled() and not went_on
        assert notifier.waiting("T") == 0

    asyncio.run(scenario())
