"""Receives of one event-loop turn that ask alike, served by one pass (``ReceiveCoalescer``,
``Broker.try_receive_shared``), on a real broker: each caller gets what it would have got alone,
in the callers' order; receives that do not ask alike get passes of their own; one caller's bad
request or a pass cut short costs the others nothing but a receive made alone."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import loop_receive_helpers
from loop_receive_helpers import make_broker
from siftmq.broker import Broker, ProducedMessage, Subscription
from siftmq.broker.coalescing import MAX_COALESCED_RECEIVES, ReceiveCoalescer
from siftmq.broker.long_polling import ArrivalNotifier, receive_long_polling
from siftmq.broker.receive import INLINE_BYTES
from siftmq.errors import BadRequestError

TOPIC = "Shared"
GROUP = "g-shared"
SUB = Subscription(TOPIC, "TAG", "A || C")


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[Broker]:
    b = make_broker(tmp_path / "data")
    yield b
    b.close()


def send(broker: Broker, tags: list[str], *, body: bytes = b"m", start: int = 0) -> None:
    for at in range(0, len(tags), 256):
        broker.send_many(
            [
                ProducedMessage(topic=TOPIC, body=body, message_id=f"01SH{start + at + i:030d}", tag=tag)
                for i, tag in enumerate(tags[at : at + 256])
            ]
        )
    assert broker.store.reput_service.catch_up(timeout=10)


def steady(broker: Broker, sub: Subscription = SUB, group: str = GROUP) -> None:
    """The topic, the group's subscription and every queue's progress exist."""
    send(broker, ["warm-up"], start=10**9)
    assert broker.receive(group, sub, batch_size=32) == []


def turn(broker: Broker, asks: list[dict[str, Any]]) -> list[Any]:
    """The coalescer's answers to ``asks`` made in one turn of a loop (exceptions as values): the
    first alone, at once, the others in passes at the turn's end."""

    async def run() -> list[Any]:
        coalescer = ReceiveCoalescer(broker.try_receive_shared)
        futures = [coalescer.try_receive(**ask) for ask in asks]
        return await asyncio.gather(*futures, return_exceptions=True)

    return asyncio.run(run())


def ask(batch_size: int, **overrides: Any) -> dict[str, Any]:
    found = {
        "group": GROUP,
        "subscription": SUB,
        "client_id": "c1",
        "queue_id": 0,
        "batch_size": batch_size,
        "invisible_ms": 60_000,
        "auto_renew": False,
    }
    return found | overrides


def ids(deliveries: list[Any]) -> list[tuple[str, int]]:
    return [(d.message_id, d.delivery_attempt) for d in deliveries]


def in_flight(broker: Broker, group: str = GROUP, topic: str = TOPIC) -> dict[int, list[int]]:
    return loop_receive_helpers.in_flight(broker, group, topic)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    tags=st.lists(st.sampled_from(["A", "B", "C"]), min_size=1, max_size=150),
    turns=st.lists(
        st.tuples(
            st.lists(
                st.tuples(st.integers(1, 24), st.sampled_from(["c1", "c2", "c3"])), min_size=1, max_size=8
            ),
            st.sampled_from(["ack", "keep", "nack-first"]),
        ),
        min_size=1,
        max_size=6,
    ),
)
def test_a_turn_of_receives_delivers_what_the_same_receives_one_by_one_would(
    tmp_path_factory: pytest.TempPathFactory, tags: list[str], turns: list[tuple[list[tuple[int, str]], str]]
) -> None:
    """Two brokers fed alike: one answers each turn's receives (of the group's members c1-c3)
    one after the other (``try_receive``), the other in one turn through the coalescer. Receive
    by receive the same messages (redeliveries of nacked ones first), with the same attempts;
    and the same left in flight."""
    brokers = [make_broker(tmp_path_factory.mktemp("b") / "d") for _ in range(2)]
    try:
        for b in brokers:
            steady(b)
            send(b, tags)
        for asks, acking in turns:
            sizes = [size for size, _ in asks]
            alone = [brokers[0].try_receive(**ask(size, client_id=c)) for size, c in asks]
            together = turn(brokers[1], [ask(size, client_id=c) for size, c in asks])
            assert [ids(got) for got in together] == [ids(got) for got in alone]
            for size, got in zip(sizes, together, strict=True):
                assert len(got) <= size
            for b, answers in zip(brokers, (alone, together), strict=True):
                for got in answers:
                    nacked = got[:1] if acking == "nack-first" else []
                    for d in nacked:
                        b.change_invisible_duration(GROUP, TOPIC, d.receipt_handle, 0)
                    if acking != "keep":
                        for d in got[len(nacked) :]:
                            b.ack(GROUP, TOPIC, d.receipt_handle)
        assert in_flight(brokers[0]) == in_flight(brokers[1])
    finally:
        for b in brokers:
            b.close()


def test_receives_left_without_a_share_of_a_pass_that_read_everything_get_nothing(broker: Broker) -> None:
    steady(broker)
    send(broker, ["A"] * 3)
    answers = turn(broker, [ask(1) for _ in range(5)])
    assert [len(a) for a in answers] == [1, 1, 1, 0, 0]  # [] (nothing now), not None (try alone)
    assert len({d.message_id for a in answers for d in a}) == 3


def test_receives_that_do_not_ask_alike_get_passes_of_their_own(broker: Broker) -> None:
    only_c = Subscription(TOPIC, "TAG", "C")
    steady(broker)
    steady(broker, group="g-other")
    steady(broker, only_c, group="g-c")
    send(broker, ["A", "C", "A", "C", "A", "C"])
    answers = turn(
        broker,
        [
            ask(10),
            ask(10, group="g-other"),
            ask(10, group="g-c", subscription=only_c),
            ask(10, client_id="c2"),  # a member of c1's group, in c1's pass: nothing left after c1's share
        ],
    )
    assert len(answers[0]) == 6 and len(answers[1]) == 6
    assert [d.message.tags for d in answers[2]] == ["C"] * 3
    assert answers[3] == []


def test_a_bad_request_leaves_the_others_to_receive_alone_and_earns_its_own_error(broker: Broker) -> None:
    steady(broker)
    send(broker, ["A"] * 4)

    async def run() -> list[Any]:
        coalescer = ReceiveCoalescer(broker.try_receive_shared)
        notifier = ArrivalNotifier(asyncio.get_running_loop())

        async def receive(batch_size: int) -> Any:
            return await receive_long_polling(
                broker,
                notifier,
                GROUP,
                SUB,
                queue_id=0,
                batch_size=batch_size,
                invisible_ms=60_000,
                hold_s=0,
                client_id="c1",
                coalescer=coalescer,
            )

        return await asyncio.gather(receive(2), receive(0), receive(2), return_exceptions=True)

    first, bad, last = asyncio.run(run())
    assert isinstance(bad, BadRequestError) and "batch_size must be positive" in str(bad)
    assert len(first) == 2 and len(last) == 2
    assert {d.message_id for d in first} | {d.message_id for d in last} == {f"01SH{i:030d}" for i in range(4)}


def test_a_pass_cut_short_by_its_bytes_leaves_the_rest_to_receive_alone(tmp_path: Path) -> None:
    broker = make_broker(tmp_path / "d", default_queue_nums=1)
    try:
        steady(broker)
        body = b"x" * (256 * 1024)
        send(broker, ["A"] * 8, body=body)
        callers = 8
        answers = turn(broker, [ask(1) for _ in range(callers)])
        copied = 1 + INLINE_BYTES // len(body)  # the first alone; the pass stops at its bytes
        assert [len(a) if a is not None else None for a in answers] == [1] * copied + [None] * (
            callers - copied
        )
        rest = [broker.receive(GROUP, SUB, batch_size=1) for _ in range(callers - copied)]
        assert all(len(r) == 1 for r in rest)
        got = [d.message_id for a in answers if a for d in a] + [r[0].message_id for r in rest]
        assert sorted(got) == [f"01SH{i:030d}" for i in range(8)]
    finally:
        broker.close()


def test_more_callers_than_a_pass_serves_are_served_by_several(broker: Broker) -> None:
    steady(broker)
    count = MAX_COALESCED_RECEIVES + 7
    send(broker, ["A"] * count)
    answers = turn(broker, [ask(1) for _ in range(count)])
    assert all(a is not None and len(a) == 1 for a in answers)
    assert len({a[0].message_id for a in answers}) == count


def test_a_caller_gone_does_not_stop_the_others(broker: Broker) -> None:
    steady(broker)
    send(broker, ["A"] * 3)

    async def run() -> list[Any]:
        coalescer = ReceiveCoalescer(broker.try_receive_shared)
        futures = [coalescer.try_receive(**ask(1)) for _ in range(3)]
        futures[1].cancel()
        return await asyncio.gather(futures[0], futures[2])

    first, last = asyncio.run(run())
    assert len(first) == 1 and len(last) == 1


def test_the_members_of_a_broadcasting_group_each_get_every_message(tmp_path: Path) -> None:
    broker = make_broker(tmp_path / "d", broadcasting_groups=(GROUP,))
    try:
        for client in ("c1", "c2"):
            assert broker.receive(GROUP, SUB, client_id=client, batch_size=32) == []
        send(broker, ["A"] * 3)
        answers = turn(broker, [ask(5, client_id="c1"), ask(5, client_id="c2"), ask(5, client_id="c1")])
        assert [len(a) for a in answers] == [3, 3, 0]
        assert {d.message_id for d in answers[0]} == {d.message_id for d in answers[1]}
    finally:
        broker.close()


def test_renewed_deliveries_are_kept_for_the_client_that_received_them(broker: Broker) -> None:
    steady(broker)
    for client in ("c1", "c2"):
        broker.clients.touch(client, group=GROUP)  # live: renewals are for live clients
    send(broker, ["A"] * 4)
    answers = turn(broker, [ask(2, client_id=c, auto_renew=True) for c in ("c1", "c2")])
    assert [len(a) for a in answers] == [2, 2]
    renewed_for = {}
    for qid in range(4):
        prog = broker.consumers.get((GROUP, TOPIC, qid))
        if prog is not None:
            renewed_for |= {offset: entry[1] for offset, entry in prog.renew.items()}
    for client, got in zip(("c1", "c2"), answers, strict=True):
        for d in got:
            assert renewed_for[d.message.queue_offset] == client


# ------------------------------------------------------ what a pass checks before it records anything


def test_sql92_receives_of_several_members_never_wait_on_the_loop_for_the_filters_lock(
    tmp_path: Path,
) -> None:
    """Left to threads at once, as each alone is: registering the group's SQL92 filter takes the
    filters' lock, which their sweeper holds while it saves their file."""
    broker = make_broker(tmp_path / "d")
    sql = Subscription(TOPIC, "SQL92", "a > 1")
    try:
        broker.send_many(
            [ProducedMessage(topic=TOPIC, body=b"x", message_id="01SQL1", user_properties={"a": "5"})]
        )
        for client in ("c1", "c2"):
            broker.receive(GROUP, sql, client_id=client, batch_size=1)
        taken, release = threading.Event(), threading.Event()

        def hold() -> None:
            with broker.filters._lock:
                taken.set()
                release.wait(5)

        holder = threading.Thread(target=hold)
        holder.start()
        try:
            assert taken.wait(5)
            started = time.monotonic()
            answers = turn(broker, [ask(1, client_id=c, subscription=sql) for c in ("c1", "c2")])
            waited = time.monotonic() - started
        finally:
            release.set()
            holder.join()
        assert answers == [None, None] and waited < 2
    finally:
        broker.close()


def test_receives_naming_a_bad_group_record_nothing_of_their_clients(broker: Broker) -> None:
    steady(broker)
    for client in ("c1", "c2"):
        broker.receive(GROUP, SUB, client_id=client, batch_size=1)
    answers = turn(broker, [ask(1, client_id=c, group="bad group!") for c in ("c1", "c2", "c3")])
    assert isinstance(answers[0], BadRequestError)  # the first alone, at once
    assert answers[1:] == [None, None]  # the pass of two: made alone, each is refused
    assert {"c1", "c2"} <= broker.clients.live_ids(GROUP)  # still members of their group


def test_a_receive_cancelled_before_its_pass_takes_no_share(broker: Broker) -> None:
    steady(broker)
    steady(broker, group="g-other")
    send(broker, ["A"])

    async def run() -> list[Any]:
        coalescer = ReceiveCoalescer(broker.try_receive_shared)
        opens = coalescer.try_receive(**ask(1, group="g-other"))  # the turn's first: made at once
        futures = [coalescer.try_receive(**ask(1, client_id=c)) for c in ("c1", "c2")]
        futures[0].cancel()  # its call's deadline passed, say
        return [await opens, await futures[1]]

    [_, second] = asyncio.run(run())
    assert [d.message_id for d in second] == [f"01SH{0:030d}"]
    assert sum(len(q) for q in in_flight(broker).values()) == 1  # the one answered, and no other


def test_receives_asking_an_illegal_invisible_time_record_nothing_of_their_clients(broker: Broker) -> None:
    steady(broker)
    for client in ("c1", "c2"):
        broker.receive(GROUP, SUB, client_id=client, batch_size=1)
    answers = turn(broker, [ask(1, client_id=c, group="g2", invisible_ms=10) for c in ("c1", "c2", "c3")])
    assert isinstance(answers[0], BadRequestError) and answers[1:] == [None, None]
    assert {"c1", "c2"} <= broker.clients.live_ids(GROUP)  # still members of their group


def test_a_request_with_two_faults_is_refused_for_the_first_a_receive_checks(broker: Broker) -> None:
    """The group before the batch size, on the loop and in a thread, as before passes were shared."""
    steady(broker)
    for receive in (broker.try_receive, broker.receive):
        with pytest.raises(BadRequestError) as refused:
            receive("bad group!", SUB, batch_size=0)
        assert "batch_size" not in str(refused.value) and "bad group!" in str(refused.value)
