"""A receive whose caller is gone gives back what it took: visible again in a second (as RocketMQ's
proxy gives back a message it could not write to its client), not in flight for nobody until its
invisible time — renewed for as long as the client lives, for an auto-renewing receive.

Three ways a caller goes while its receive holds messages: cancelled in the turn its share of a
shared pass was taken, cancelled while the receive runs in a read thread, and the stream of its
answer broken after the status. On an in-process broker and service, driven as the event loop
drives them."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from loop_receive_helpers import make_broker
from siftmq.broker import Broker, ProducedMessage, Subscription
from siftmq.broker.coalescing import ReceiveCoalescer
from siftmq.broker.long_polling import ArrivalNotifier, receive_long_polling
from siftmq.broker.receive import GIVE_BACK_MS
from siftmq.protocol import rocketmq_v2_pb2 as pb
from siftmq.server.service import MessagingService

TOPIC = "Back"
GROUP = "g-back"
SUB = Subscription(TOPIC, "TAG", "*")
HELD_MS = 60_000  # the receives' invisible time


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[Broker]:
    b = make_broker(tmp_path / "data", default_queue_nums=1)
    b.send_many([ProducedMessage(topic=TOPIC, body=b"warm-up", message_id="01BK" + "0" * 30)])
    assert b.store.reput_service.catch_up(timeout=10)
    got = b.receive(GROUP, SUB, batch_size=1, invisible_ms=HELD_MS)  # the group and its progress exist
    b.ack(GROUP, TOPIC, got[0].receipt_handle)
    yield b
    b.close()


def send(broker: Broker, count: int) -> None:
    broker.send_many(
        [ProducedMessage(topic=TOPIC, body=b"m", message_id=f"01BK{i + 1:030d}") for i in range(count)]
    )
    assert broker.store.reput_service.catch_up(timeout=10)


def visible_in_s(broker: Broker) -> list[float]:
    """Seconds until each message the group has in flight is visible again, soonest first."""
    prog = broker.consumers.get((GROUP, TOPIC, 0))
    assert prog is not None
    now = time.time() * 1000
    return sorted((item.visible_at_ms - now) / 1000 for item in prog.inflight.values())


async def given_back(broker: Broker, held: int, back: int) -> bool:
    """``back`` of the group's in-flight messages come back within a second, ``held`` at their time
    (waiting on the loop, up to 10 s, for the give-back, which runs in a thread)."""
    deadline = time.monotonic() + 10
    while True:
        times = visible_in_s(broker)
        soon = [t for t in times if t <= GIVE_BACK_MS / 1000]
        if len(soon) == back and len(times) - back == held:
            return True
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.02)


async def long_poll(broker: Broker, notifier: ArrivalNotifier, client: str, **how: Any) -> Any:
    """A receive of the group that waits for nothing (its messages held for a minute)."""
    return await receive_long_polling(
        broker, notifier, GROUP, SUB, queue_id=0, invisible_ms=HELD_MS, hold_s=0, client_id=client, **how
    )


def test_a_receive_cancelled_after_its_share_of_a_pass_gives_it_back(broker: Broker) -> None:
    send(broker, 2)

    async def run() -> None:
        loop = asyncio.get_running_loop()
        notifier = ArrivalNotifier(loop)
        tasks: dict[str, asyncio.Task[Any]] = {}

        def shared(group: str, subscription: Subscription, asks: list[Any], **kw: Any) -> Any:
            shares = broker.try_receive_shared(group, subscription, asks, **kw)
            if asks[0][0] == "c2":  # its client's cancel, read in the turn its share was taken
                loop.call_soon(tasks["c2"].cancel)
            return shares

        coalescer = ReceiveCoalescer(shared)
        for client in ("c1", "c2"):
            tasks[client] = asyncio.create_task(
                long_poll(broker, notifier, client, batch_size=1, coalescer=coalescer)
            )
        first, second = await asyncio.gather(*tasks.values(), return_exceptions=True)
        assert len(first) == 1 and isinstance(second, asyncio.CancelledError)
        assert await given_back(broker, held=1, back=1)

    asyncio.run(run())


@pytest.mark.parametrize("started", [True, False])
def test_a_receive_cancelled_while_it_reads_in_a_thread_gives_back_what_the_thread_took(
    broker: Broker, monkeypatch: pytest.MonkeyPatch, started: bool
) -> None:
    """Cancelled while the read thread runs, what the thread then takes is given back; cancelled
    before the thread started it, it takes nothing."""
    send(broker, 3)
    monkeypatch.setattr(broker, "try_receive", lambda *a, **k: None)  # to a read thread
    reading, go_on = threading.Event(), threading.Event()
    receive = broker.receive

    def slow_receive(*args: Any, **kwargs: Any) -> Any:
        reading.set()
        go_on.wait(10)
        return receive(*args, **kwargs)

    monkeypatch.setattr(broker, "receive", slow_receive)
    reads = ThreadPoolExecutor(1)
    busy = threading.Event()
    if not started:  # the one read thread is busy: the receive waits its turn
        reads.submit(busy.wait, 10)

    async def run() -> None:
        notifier = ArrivalNotifier(asyncio.get_running_loop())
        task = asyncio.create_task(long_poll(broker, notifier, "c1", batch_size=3, executor=reads))
        if started:
            await asyncio.get_running_loop().run_in_executor(None, reading.wait, 10)
        else:
            await asyncio.sleep(0.05)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        assert task.cancelled()
        busy.set()
        go_on.set()
        if started:  # the thread's read ends, and what it took is given back
            assert await given_back(broker, held=0, back=3)
        else:
            await asyncio.sleep(0.2)

    try:
        asyncio.run(run())
    finally:
        busy.set()
        go_on.set()
        reads.shutdown(wait=True)
    if not started:
        assert not reading.is_set() and visible_in_s(broker) == []


def _receive_request() -> pb.ReceiveMessageRequest:
    request = pb.ReceiveMessageRequest(
        group=pb.Resource(name=GROUP),
        message_queue=pb.MessageQueue(topic=pb.Resource(name=TOPIC), id=0),
        filter_expression=pb.FilterExpression(type=pb.FilterType.TAG, expression="*"),
        batch_size=4,
    )
    request.invisible_duration.FromMilliseconds(HELD_MS)
    return request


class _Context:
    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return (("x-mq-client-id", "c1"),)

    def peer(self) -> str:
        return "ipv4:127.0.0.1:5555"

    def time_remaining(self) -> float:
        return 30.0


@pytest.mark.parametrize("read", [1, 3])
def test_a_receive_whose_stream_breaks_gives_back_what_it_did_not_write(broker: Broker, read: int) -> None:
    """The client gone after the status (``read`` = 1) or after two of four messages: the messages
    not written, and the one being written, come back in a second."""
    send(broker, 4)

    async def run() -> None:
        service = MessagingService(broker, ArrivalNotifier(asyncio.get_running_loop()))
        request = _receive_request()
        answers = service.ReceiveMessage(request, _Context())
        for _ in range(read):
            await answers.__anext__()
        await answers.aclose()  # as gRPC closes a handler's stream when its client goes
        written = read - 1  # the status first
        assert await given_back(broker, held=max(written - 1, 0), back=4 - max(written - 1, 0))

    asyncio.run(run())


class _FrontEndContext(_Context):
    """A call through a front-end, which still holds the last ``held`` answers the core sent."""

    def __init__(self, held: int) -> None:
        self.held = held

    def answers_not_taken(self) -> int:
        return self.held


@pytest.mark.parametrize(("not_taken", "delivered"), [(0, 2), (1, 1), (3, 0)])
def test_a_receive_cut_short_behind_a_front_end_gives_back_what_the_front_end_held_too(
    broker: Broker, not_taken: int, delivered: int
) -> None:
    """Status and three messages made, the third not yet sent: the messages of the answers the
    front-end never let go (here the last ``not_taken``, the status among them at 3) come back too."""
    send(broker, 4)

    async def run() -> None:
        service = MessagingService(broker, ArrivalNotifier(asyncio.get_running_loop()))
        request = _receive_request()
        answers = service.ReceiveMessage(request, _FrontEndContext(not_taken))
        for _ in range(4):
            await answers.__anext__()
        await answers.aclose()
        assert await given_back(broker, held=delivered, back=4 - delivered)

    asyncio.run(run())
