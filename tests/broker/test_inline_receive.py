"""``Broker.try_receive``: the receive an event loop serves itself (no thread hop) when it is the
steady kind, declining — with nothing delivered and nothing recorded — whatever needs a thread."""

from __future__ import annotations

import sys
import threading
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import loop_receive_helpers
from loop_receive_helpers import make_broker
from siftmq.broker import Broker, ProducedMessage, Subscription
from siftmq.broker import parts as parts_module
from siftmq.broker.consumer_state import DUE_SLACK
from siftmq.broker.receive import INLINE_BYTES, INLINE_SCAN
from siftmq.testing import SteppedClock

TOPIC = "Inline"
GROUP = "g-inline"
_T = TypeVar("_T")


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[Broker]:
    b = make_broker(tmp_path / "data")
    yield b
    b.close()


def tag_sub(expression: str, topic: str = TOPIC) -> Subscription:
    return Subscription(topic, "TAG", expression)


def send(broker: Broker, tags: list[str], *, topic: str = TOPIC, start: int = 0) -> None:
    for at in range(0, len(tags), 256):
        broker.send_many(
            [
                ProducedMessage(topic=topic, body=b"m", message_id=f"01IN{start + at + i:030d}", tag=tag)
                for i, tag in enumerate(tags[at : at + 256])
            ]
        )


def steady(broker: Broker, sub: Subscription | None = None) -> None:
    """The topic, the group's subscription and every queue's progress exist (a first receive, in a
    thread as the broker makes it, on an empty topic visits every queue)."""
    send(broker, ["warm-up"], start=10**9)
    assert broker.receive(GROUP, sub or tag_sub("A"), batch_size=32) == []


def in_flight(broker: Broker, group: str = GROUP, topic: str = TOPIC) -> dict[int, list[int]]:
    return loop_receive_helpers.in_flight(broker, group, topic)


def pop_offsets(broker: Broker, group: str = GROUP, topic: str = TOPIC) -> list[int | None]:
    return [
        None if (prog := broker.consumers.get((group, topic, qid))) is None else prog.pop_offset
        for qid in range(4)
    ]


def promptly(call: Callable[[], _T], seconds: float = 10.0) -> _T:
    """``call()`` made in a thread, which must return within ``seconds``: a receive that waited for a
    lock held here would hang, not fail."""
    out: list[_T] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            out.append(call())
        except BaseException as exc:  # handed to the test's thread
            errors.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        frame = sys._current_frames().get(thread.ident or 0)
        where = "".join(traceback.format_stack(frame)) if frame is not None else "?"
        raise AssertionError(f"still waiting after {seconds} s, at:\n{where}")
    if errors:
        raise errors[0]
    return out[0]


def saved_state_files(broker: Broker) -> dict[str, tuple[int, int]]:
    """:func:`state_files` once the consumer progress pending a save is saved."""
    broker.consumers.save()
    return state_files(broker)


def state_files(broker: Broker) -> dict[str, tuple[int, int]]:
    """Every file of the broker's state (topics, groups, consumer progress, ...): mtime and size."""
    root = broker.config.data_dir / "config"
    return {
        str(f.relative_to(root)): (f.stat().st_mtime_ns, f.stat().st_size)
        for f in root.rglob("*")
        if f.is_file()
    }


# ----------------------------------------------------------------------------------- declining


def test_an_unknown_topic_is_left_to_a_thread_and_not_created(broker: Broker) -> None:
    before = saved_state_files(broker)
    assert broker.try_receive(GROUP, tag_sub("*", topic="NoSuchTopic")) is None
    assert broker.topics.get("NoSuchTopic") is None
    assert state_files(broker) == before


def test_a_group_new_to_the_topic_is_left_to_a_thread_and_not_recorded(broker: Broker) -> None:
    send(broker, ["A", "A"])
    before = saved_state_files(broker)
    assert broker.try_receive("g-new", tag_sub("A")) is None
    assert broker.groups.get("g-new") is None  # its subscription is recorded (and saved) in the thread
    assert pop_offsets(broker, "g-new") == [None] * 4
    assert state_files(broker) == before
    assert len(broker.receive("g-new", tag_sub("A"), batch_size=8)) == 2


def test_a_subscription_other_than_the_one_held_is_left_to_a_thread(broker: Broker) -> None:
    steady(broker, tag_sub("A"))
    send(broker, ["A", "B"])
    held = broker.groups.get(GROUP)
    assert held is not None
    subscriptions = {t: (s.kind, s.expression) for t, s in held.subscriptions.items()}
    before = saved_state_files(broker)
    assert broker.try_receive(GROUP, tag_sub("B")) is None
    assert broker.try_receive(GROUP, Subscription(TOPIC, "SQL92", "a > 1")) is None
    now = broker.groups.get(GROUP)
    assert (
        now is not None and {t: (s.kind, s.expression) for t, s in now.subscriptions.items()} == subscriptions
    )
    assert in_flight(broker) == {0: [], 1: [], 2: [], 3: []}
    assert state_files(broker) == before


def test_busy_queues_are_never_waited_for(broker: Broker) -> None:
    steady(broker)
    send(broker, ["A"] * 8)
    progress = [broker.consumers.get((GROUP, TOPIC, qid)) for qid in range(4)]
    locks = [p.lock for p in progress if p is not None]
    assert len(locks) == 4
    for lock in locks:  # every queue read elsewhere: nothing served, nothing changed
        lock.acquire()
    try:
        before = pop_offsets(broker)
        assert promptly(lambda: broker.try_receive(GROUP, tag_sub("A"), batch_size=8)) is None
        assert pop_offsets(broker) == before
    finally:
        for lock in locks:
            lock.release()
    got = broker.try_receive(GROUP, tag_sub("A"), batch_size=8)
    assert got is not None and len(got) == 8


def test_a_busy_groups_table_is_never_waited_for(broker: Broker) -> None:
    """A change of the groups holds their lock while it saves the file: the loop does not wait."""
    steady(broker)
    send(broker, ["A"] * 3)
    with broker.groups._lock:
        assert promptly(lambda: broker.try_receive(GROUP, tag_sub("A"))) is None
    got = broker.try_receive(GROUP, tag_sub("A"))
    assert got is not None and len(got) == 3


def test_an_index_behind_is_never_waited_for(broker: Broker) -> None:
    """Records appended but not indexed yet, their dispatch held up elsewhere: the loop neither
    waits for it nor reads without them (read-your-writes)."""
    steady(broker)
    dispatch = broker.store.reput_service.lock
    with dispatch:  # the reput thread (or an appender) indexing
        send(broker, ["A"] * 3)
        assert broker.store.reput_service.behind_bytes() > 0
        assert promptly(lambda: broker.try_receive(GROUP, tag_sub("A"))) is None
    assert broker.store.reput_service.catch_up(timeout=10)  # (the reput thread may hold the lock now)
    got = broker.try_receive(GROUP, tag_sub("A"))
    assert got is not None and len(got) == 3


def test_one_busy_queue_ends_the_pass_with_what_it_has(broker: Broker) -> None:
    steady(broker)
    for n in range(4):  # one batch per queue (each batch goes to the next queue)
        send(broker, ["A"] * 10, start=100 * n)
    busy = broker.consumers.get((GROUP, TOPIC, 2))
    assert busy is not None
    before = pop_offsets(broker)
    with busy.lock:  # the pass reads queues 0, 1, 2, 3 in that order (queue_id=0): it stops at 2
        got = promptly(lambda: broker.try_receive(GROUP, tag_sub("A"), queue_id=0, batch_size=40))
    assert got is not None
    assert {d.message.queue_id for d in got} <= {0, 1}
    waiting = [broker.store.get_max_offset_in_queue(TOPIC, qid) - (before[qid] or 0) for qid in range(4)]
    assert len(got) == waiting[0] + waiting[1]  # (before: the warm-up message passed over)
    assert pop_offsets(broker)[2:] == before[2:]
    rest = broker.receive(GROUP, tag_sub("A"), batch_size=40)
    assert len(got) + len(rest) == 40
    assert len({d.message_id for d in got + rest}) == 40


def test_a_redelivery_due_for_the_dead_letter_queue_is_left_to_a_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = SteppedClock()
    monkeypatch.setattr(parts_module, "time", clock)
    broker = make_broker(tmp_path / "d", max_delivery_attempts=1)
    try:
        steady(broker)
        send(broker, ["A"])
        [first] = broker.receive(GROUP, tag_sub("A"), invisible_ms=100)
        clock.advance(0.15)
        assert broker.try_receive(GROUP, tag_sub("A"), invisible_ms=100) is None
        assert in_flight(broker)[first.message.queue_id] == [first.message.queue_offset]  # still due
        assert broker.receive(GROUP, tag_sub("A"), invisible_ms=100) == []  # the thread moves it
        assert in_flight(broker)[first.message.queue_id] == []
        dead = broker.receive("dlq-reader", tag_sub("*", topic=f"%DLQ%{GROUP}"), batch_size=8)
        assert [d.message_id for d in dead] == [first.message_id]
    finally:
        broker.close()


def test_a_long_stretch_of_other_messages_is_scanned_in_part_then_left_to_a_thread(tmp_path: Path) -> None:
    broker = make_broker(tmp_path / "d", default_queue_nums=1)
    try:
        steady(broker)
        start = pop_offsets(broker)[0]
        assert start is not None
        send(broker, ["B"] * (INLINE_SCAN + 2000) + ["A"])
        assert broker.try_receive(GROUP, tag_sub("A")) is None
        passed = pop_offsets(broker)[0]
        assert passed is not None and INLINE_SCAN <= passed - start < INLINE_SCAN + 2001
        [found] = broker.receive(GROUP, tag_sub("A"))
        assert found.message.tags == "A" and found.message.queue_offset == start + INLINE_SCAN + 2000
    finally:
        broker.close()


def test_the_loop_copies_about_a_mebibyte_then_answers_with_what_it_has(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Large messages: the loop's receive stops once ~1 MiB is read (new ones, and redeliveries
    due), answering with those; the batch's rest is the next receive's."""
    clock = SteppedClock()
    monkeypatch.setattr(parts_module, "time", clock)
    broker = make_broker(tmp_path / "d", default_queue_nums=1)
    try:
        steady(broker)
        body = b"x" * (256 * 1024)
        broker.send_many(
            [ProducedMessage(topic=TOPIC, body=body, message_id=f"01BIG{i:029d}", tag="A") for i in range(12)]
        )
        broker.store.reput_service.dispatch_all(None)  # indexed: the loop's receive waits for none
        first = broker.try_receive(GROUP, tag_sub("A"), batch_size=32, invisible_ms=1000)
        assert first is not None and len(first) == INLINE_BYTES // len(body)  # the last read holds one
        rest = broker.receive(GROUP, tag_sub("A"), batch_size=32, invisible_ms=1000)  # a thread: all
        assert len(first) + len(rest) == 12
        clock.advance(1.5)  # every one due again: the loop takes as many, the thread the rest
        again = broker.try_receive(GROUP, tag_sub("A"), batch_size=32, invisible_ms=1000)
        assert again is not None and 1 <= len(again) <= INLINE_BYTES // len(body)
        assert len(again) + len(broker.receive(GROUP, tag_sub("A"), batch_size=32)) == 12
    finally:
        broker.close()


def test_acknowledged_deliveries_do_not_pile_up_in_the_due_heap(tmp_path: Path) -> None:
    """A receive takes no lock of a queue with nothing due, yet still has the due-heap rebuilt
    when acks left it large (their entries stay until they come due: an hour here)."""
    broker = make_broker(tmp_path / "d", default_queue_nums=1)
    try:
        steady(broker)
        send(broker, ["A"] * 3000)
        for n in range(300):
            receive = broker.try_receive if n % 2 else broker.receive
            got = receive(GROUP, tag_sub("A"), batch_size=10, invisible_ms=3_600_000)
            assert got is not None and len(got) == 10
            assert broker.ack_many(GROUP, TOPIC, [d.receipt_handle for d in got]) == [None] * 10
        prog = broker.consumers.get((GROUP, TOPIC, 0))
        assert prog is not None and not prog.inflight
        assert len(prog._due) <= DUE_SLACK + 10
    finally:
        broker.close()


def test_a_large_due_heap_is_rebuilt_in_a_thread(tmp_path: Path) -> None:
    """Acks leave their entries in a queue's due-heap until they come due; rebuilding a large heap
    (work in proportion to it) is left to a thread."""
    broker = make_broker(tmp_path / "d", default_queue_nums=1)
    try:
        steady(broker)
        send(broker, ["A"] * (INLINE_SCAN + 100))
        handles = []  # every message in flight at once (a heap rebuild keeps what is in flight)
        while got := broker.receive(GROUP, tag_sub("A"), batch_size=64, invisible_ms=3_600_000):
            handles += [d.receipt_handle for d in got]
        assert broker.ack_many(GROUP, TOPIC, handles) == [None] * len(handles)
        prog = broker.consumers.get((GROUP, TOPIC, 0))
        assert prog is not None and not prog.inflight
        assert prog.due_count() > INLINE_SCAN
        assert broker.try_receive(GROUP, tag_sub("A")) is None
        assert broker.receive(GROUP, tag_sub("A")) == []  # the thread rebuilds it
        assert prog.due_count() <= DUE_SLACK
        assert broker.try_receive(GROUP, tag_sub("A")) == []
    finally:
        broker.close()


# ------------------------------------------------------------------------------------- serving


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    tags=st.lists(st.sampled_from(["A", "B", "C"]), min_size=1, max_size=120),
    calls=st.lists(
        st.tuples(st.integers(1, 40), st.sampled_from(["ack", "keep", "ack-half", "nack-first"])),
        min_size=1,
        max_size=8,
    ),
)
def test_a_steady_receive_on_the_loop_delivers_what_a_thread_would(
    tmp_path_factory: pytest.TempPathFactory, tags: list[str], calls: list[tuple[int, str]]
) -> None:
    """Two brokers fed alike, one receiving with ``receive``, the other with ``try_receive``:
    call by call the same messages (redeliveries of nacked ones first), in the same order, with
    the same attempts; and the same messages left in flight."""
    brokers = [make_broker(tmp_path_factory.mktemp("b") / "d") for _ in range(2)]
    try:
        sub = tag_sub("A || C")
        for b in brokers:
            steady(b, sub)
            send(b, tags)
            assert b.store.reput_service.catch_up(
                timeout=10
            )  # indexed (an appender may leave it to the thread)
        for batch_size, acking in calls:
            thread = brokers[0].receive(GROUP, sub, batch_size=batch_size, invisible_ms=60_000)
            loop = brokers[1].try_receive(GROUP, sub, batch_size=batch_size, invisible_ms=60_000)
            assert loop is not None
            assert [(d.message_id, d.delivery_attempt) for d in loop] == [
                (d.message_id, d.delivery_attempt) for d in thread
            ]
            for b, got in zip(brokers, (thread, loop), strict=True):
                nacked = got[:1] if acking == "nack-first" else []  # visible again at once: next
                for d in nacked:
                    b.change_invisible_duration(GROUP, TOPIC, d.receipt_handle, 0)
                rest = got[len(nacked) :]
                keep = {"ack": 0, "keep": len(rest), "ack-half": len(rest) // 2, "nack-first": 0}[acking]
                for d in rest[keep:]:
                    b.ack(GROUP, TOPIC, d.receipt_handle)
        assert in_flight(brokers[0]) == in_flight(brokers[1])
        assert pop_offsets(brokers[0]) == pop_offsets(brokers[1])
    finally:
        for b in brokers:
            b.close()
