"""Single sends of one event-loop turn appended together (``SendCoalescer``), on a real broker:
one append per topic, each caller its own result, and a refused batch answered message by message
exactly as if each had been sent alone."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from siftmq.broker.coalescing import MAX_COALESCED, OneHop, SendCoalescer
from siftmq.broker.model import ProducedMessage
from siftmq.errors import BadRequestError, UnsupportedError
from siftmq.testing import open_broker


@pytest.fixture
def broker(tmp_path: Path) -> Any:
    b = open_broker(tmp_path / "data")
    yield b
    b.close()


def _msg(i: int, topic: str = "Co", **kw: Any) -> ProducedMessage:
    return ProducedMessage(topic=topic, body=f"body-{i}".encode(), message_id=f"01CO{i:030d}", tag="t", **kw)


def _stored(broker: Any, topic: str) -> dict[str, tuple[int, int]]:
    """message id -> (queue, offset) of every message of ``topic``."""
    found = {}
    for q in range(broker.topics.get(topic).queue_nums):
        for m in broker.store.get_messages("g", topic, q, 0, 1000).messages:
            found[m.uniq_key] = (q, m.queue_offset)
    return found


def test_the_sends_of_one_turn_are_one_append_and_each_caller_gets_its_own(broker: Any) -> None:
    async def run() -> list[Any]:
        coalescer = SendCoalescer(broker.send_many)
        return await asyncio.gather(*(coalescer.send(_msg(i)) for i in range(40)))

    results = asyncio.run(run())
    assert [r.message_id for r in results] == [_msg(i).message_id for i in range(40)]
    stored = _stored(broker, "Co")
    for r in results:
        assert stored[r.message_id] == (r.queue_id, r.queue_offset)
    # one append: a batch goes to one queue, in the callers' order (alone they would spread over 4)
    assert len({r.queue_id for r in results}) == 1
    assert [r.queue_offset for r in results] == list(range(40))


def test_more_than_a_batch_and_several_topics_in_one_turn(broker: Any) -> None:
    count = MAX_COALESCED + 10

    async def run() -> list[Any]:
        coalescer = SendCoalescer(broker.send_many)
        sends = [coalescer.send(_msg(i, "CoA" if i % 2 else "CoB")) for i in range(2 * count)]
        return await asyncio.gather(*sends)

    results = asyncio.run(run())
    a, b = _stored(broker, "CoA"), _stored(broker, "CoB")
    assert len(a) == len(b) == count
    for i, r in enumerate(results):
        assert (a if i % 2 else b)[r.message_id] == (r.queue_id, r.queue_offset)


def test_a_refused_message_costs_only_its_own_caller(broker: Any) -> None:
    async def run() -> list[Any]:
        coalescer = SendCoalescer(broker.send_many)
        sends = [
            coalescer.send(_msg(0)),
            coalescer.send(_msg(1, message_group="fifo")),  # FIFO: unsupported
            coalescer.send(_msg(2)),
            coalescer.send(ProducedMessage(topic="Co", body=b"", message_id="01COEMPTY", tag="t")),
            coalescer.send(_msg(4)),
        ]
        return await asyncio.gather(*sends, return_exceptions=True)

    results = asyncio.run(run())
    assert isinstance(results[1], UnsupportedError)
    assert isinstance(results[3], BadRequestError) and "body" in str(results[3])
    stored = _stored(broker, "Co")
    assert set(stored) == {_msg(i).message_id for i in (0, 2, 4)}
    for i in (0, 2, 4):
        assert stored[results[i].message_id] == (results[i].queue_id, results[i].queue_offset)


def test_the_same_message_id_twice_in_one_turn_is_stored_once(broker: Any) -> None:
    async def run() -> list[Any]:
        coalescer = SendCoalescer(broker.send_many)
        return await asyncio.gather(coalescer.send(_msg(7)), coalescer.send(_msg(7)), coalescer.send(_msg(8)))

    first, again, other = asyncio.run(run())
    assert (first.queue_id, first.queue_offset) == (again.queue_id, again.queue_offset)
    assert again.duplicate and not first.duplicate
    assert set(_stored(broker, "Co")) == {_msg(7).message_id, _msg(8).message_id}
    assert other.message_id == _msg(8).message_id


def test_a_caller_gone_does_not_stop_the_others(broker: Any) -> None:
    async def run() -> list[Any]:
        coalescer = SendCoalescer(broker.send_many)
        gone = coalescer.send(_msg(0))
        gone.cancel()  # its call was cancelled before the turn ended: the message is still stored
        return await asyncio.gather(coalescer.send(_msg(1)), coalescer.send(_msg(2)))

    results = asyncio.run(run())
    assert len(results) == 2
    assert set(_stored(broker, "Co")) == {_msg(i).message_id for i in range(3)}


def test_the_acks_of_one_turn_take_one_thread_hop_and_each_gets_its_own_answer() -> None:
    import threading
    from concurrent.futures import ThreadPoolExecutor

    ran: list[tuple[int, int]] = []

    def call(i: int) -> Any:
        def fn() -> int:
            ran.append((i, threading.get_ident()))
            if i == 3:
                raise BadRequestError("entry 3 is bad")
            return i * 10

        return fn

    class Counting(ThreadPoolExecutor):
        hops = 0

        def submit(self, *args: Any, **kwargs: Any) -> Any:
            Counting.hops += 1
            return super().submit(*args, **kwargs)

    async def run() -> list[Any]:
        hop = OneHop(Counting(2))
        first = await asyncio.gather(*(hop.run(call(i)) for i in range(6)), return_exceptions=True)
        later = await hop.run(call(6))
        return [*first, later]

    results = asyncio.run(run())
    assert results[:3] == [0, 10, 20] and results[4:] == [40, 50, 60]
    assert isinstance(results[3], BadRequestError)
    assert [i for i, _ in ran] == list(range(7))  # in the callers' order
    assert Counting.hops == 2  # one hop for the six calls of the first turn, one for the last
    assert len({t for i, t in ran if i < 6}) == 1
    assert threading.get_ident() not in {t for _, t in ran}  # never on the event loop's thread


def test_a_send_that_would_create_its_topic_is_left_to_a_thread(broker: Any) -> None:
    """Creating a topic writes and syncs the topics file: not an event loop's work."""
    assert broker.config.auto_create_topics
    assert not broker.sends_inline("CoNew")
    broker.send_many([_msg(0, topic="CoNew")])  # a thread's send creates it
    assert broker.sends_inline("CoNew")


def test_acks_made_after_the_executor_is_shut_down_fail_instead_of_hanging() -> None:
    from concurrent.futures import ThreadPoolExecutor

    async def run() -> list[Any]:
        executor = ThreadPoolExecutor(1)
        executor.shutdown()
        hop = OneHop(executor)
        return await asyncio.wait_for(
            asyncio.gather(*(hop.run(lambda: 1) for _ in range(3)), return_exceptions=True), 5
        )

    results = asyncio.run(run())
    assert all(isinstance(r, RuntimeError) for r in results), results
