"""``Broker.try_receive``: the receive an event loop serves itself (no thread hop) when it is the
steady kind, declining — with nothing delivered and nothing recorded — whatever needs a thread."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from siftmq.broker import Broker, ProducedMessage, Subscription
from siftmq.broker import parts as parts_module
from siftmq.broker.consumer_state import DUE_SLACK
from siftmq.broker.receive import INLINE_SCAN
from siftmq.testing import SteppedClock
from siftmq.testing import open_broker as make_broker

TOPIC = "Inline"
GROUP = "g-inline"


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
    queues = broker.topics.get(topic)
    assert queues is not None
    found = {}
    for qid in range(queues.queue_nums):
        prog = broker.consumers.get((group, topic, qid))
        if prog is not None:
            found[qid] = sorted(prog.inflight)
    return found


def pop_offsets(broker: Broker, group: str = GROUP, topic: str = TOPIC) -> list[int | None]:
    return [
        None if (prog := broker.consumers.get((group, topic, qid))) is None else prog.pop_offset
        for qid in range(4)
    ]


# ----------------------------------------------------------------------------------- declining


def test_an_unknown_topic_is_left_to_a_thread_and_not_created(broker: Broker) -> None:
    assert broker.try_receive(GROUP, tag_sub("*", topic="NoSuchTopic")) is None
    assert broker.topics.get("NoSuchTopic") is None


def test_a_group_new_to_the_topic_is_left_to_a_thread_and_not_recorded(broker: Broker) -> None:
    send(broker, ["A", "A"])
    assert broker.try_receive("g-new", tag_sub("A")) is None
    assert broker.groups.get("g-new") is None  # its subscription is recorded (and saved) in the thread
    assert pop_offsets(broker, "g-new") == [None] * 4
    assert len(broker.receive("g-new", tag_sub("A"), batch_size=8)) == 2


def test_a_subscription_other_than_the_one_held_is_left_to_a_thread(broker: Broker) -> None:
    steady(broker, tag_sub("A"))
    send(broker, ["A", "B"])
    before = broker.groups.get(GROUP)
    assert before is not None
    held = dict(before.subscriptions)
    assert broker.try_receive(GROUP, tag_sub("B")) is None
    assert broker.try_receive(GROUP, Subscription(TOPIC, "SQL92", "a > 1")) is None
    assert {t: (s.kind, s.expression) for t, s in broker.groups.get(GROUP).subscriptions.items()} == {  # type: ignore[union-attr]
        t: (s.kind, s.expression) for t, s in held.items()
    }
    assert in_flight(broker) == {0: [], 1: [], 2: [], 3: []}


def test_a_busy_queue_is_never_waited_for(broker: Broker) -> None:
    steady(broker)
    send(broker, ["A"] * 8)
    locks = [broker.consumers.get((GROUP, TOPIC, qid)).lock for qid in range(4)]  # type: ignore[union-attr]
    for lock in locks:  # every queue read elsewhere: nothing served, nothing changed
        lock.acquire()
    try:
        before = pop_offsets(broker)
        assert broker.try_receive(GROUP, tag_sub("A"), batch_size=8) is None
        assert pop_offsets(broker) == before
    finally:
        for lock in locks:
            lock.release()
    got = broker.try_receive(GROUP, tag_sub("A"), batch_size=8)
    assert got is not None and len(got) == 8


def test_one_busy_queue_ends_the_pass_with_what_it_has(broker: Broker) -> None:
    steady(broker)
    send(broker, ["A"] * 40)
    busy = broker.consumers.get((GROUP, TOPIC, 2))
    assert busy is not None
    with busy.lock:
        got = broker.try_receive(GROUP, tag_sub("A"), batch_size=40)
    # the queues before the busy one in this pass's order were served; none after it
    assert got is None or 0 < len(got) < 40
    taken = [] if got is None else got
    assert 2 not in {d.message.queue_id for d in taken}
    rest = broker.receive(GROUP, tag_sub("A"), batch_size=40)
    assert len(taken) + len(rest) == 40
    assert len({d.message_id for d in taken + rest}) == 40


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


# ------------------------------------------------------------------------------------- serving


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    tags=st.lists(st.sampled_from(["A", "B", "C"]), min_size=1, max_size=120),
    calls=st.lists(
        st.tuples(st.integers(1, 40), st.sampled_from(["ack", "keep", "ack-half"])), min_size=1, max_size=8
    ),
)
def test_a_steady_receive_on_the_loop_delivers_what_a_thread_would(
    tmp_path_factory: pytest.TempPathFactory, tags: list[str], calls: list[tuple[int, str]]
) -> None:
    """Two brokers fed alike, one receiving with ``receive``, the other with ``try_receive``:
    call by call the same messages, in the same order, with the same attempts; and the same
    messages left in flight."""
    brokers = [make_broker(tmp_path_factory.mktemp("b") / "d") for _ in range(2)]
    try:
        sub = tag_sub("A || C")
        for b in brokers:
            steady(b, sub)
            send(b, tags)
        for batch_size, acking in calls:
            thread = brokers[0].receive(GROUP, sub, batch_size=batch_size, invisible_ms=60_000)
            loop = brokers[1].try_receive(GROUP, sub, batch_size=batch_size, invisible_ms=60_000)
            assert loop is not None
            assert [(d.message_id, d.delivery_attempt) for d in loop] == [
                (d.message_id, d.delivery_attempt) for d in thread
            ]
            for b, got in zip(brokers, (thread, loop), strict=True):
                keep = {"ack": 0, "keep": len(got), "ack-half": len(got) // 2}[acking]
                for d in got[keep:]:
                    b.ack(GROUP, TOPIC, d.receipt_handle)
        assert in_flight(brokers[0]) == in_flight(brokers[1])
        assert pop_offsets(brokers[0]) == pop_offsets(brokers[1])
    finally:
        for b in brokers:
            b.close()
