"""End to end with the official ``rocketmq-python-client==5.1.2`` against a ``siftmq broker`` subprocess."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

rocketmq = pytest.importorskip("rocketmq")
from rocketmq import (  # noqa: E402
    ClientConfiguration,
    ConsumeResult,
    Credentials,
    FilterExpression,
    Message,
    Producer,
    PushConsumer,
    SimpleConsumer,
)
from rocketmq.grpc_protocol import FilterType  # noqa: E402
from rocketmq.v5.consumer.push import MessageListener  # noqa: E402

pytestmark = pytest.mark.integration

TAGS = ["Pay", "Order", "Refund", "Pay", "Ship"]
REGIONS = ["Hangzhou", "Beijing", "Hangzhou", "Shanghai"]
PRICES = ["7", "100", "30", "31", "250", "9", "1000", "45", "300", "3"]


def config(endpoint: str) -> ClientConfiguration:
    # 10 s: a route query timed out once at 5 s on a loaded 2-core machine (no test waits for a timeout)
    return ClientConfiguration(endpoint, Credentials(), request_timeout=10)


def fixture_messages(n: int) -> list[dict[str, str]]:
    return [
        {
            "i": str(i),
            "tag": TAGS[i % len(TAGS)],
            "Region": REGIONS[i % len(REGIONS)],
            "price": PRICES[i % len(PRICES)],
        }
        for i in range(n)
    ]


def send_all(endpoint: str, topic: str, rows: list[dict[str, str]]) -> list[str]:
    producer = Producer(config(endpoint), (topic,))
    producer.startup()
    ids = []
    try:
        for row in rows:
            msg = Message()
            msg.topic = topic
            msg.body = f"body-{row['i']}".encode()
            msg.tag = row["tag"]
            msg.keys = f"key-{row['i']}"
            for k in ("i", "Region", "price"):
                msg.add_property(k, row[k])
            ids.append(producer.send(msg).message_id)
    finally:
        producer.shutdown()
    return ids


def drain(
    consumer: SimpleConsumer, expected: int, *, invisible: int = 5, timeout: float = 30, ack: bool = True
) -> list[Any]:
    got: list[Any] = []
    deadline = time.monotonic() + timeout
    while len(got) < expected and time.monotonic() < deadline:
        for m in consumer.receive(16, invisible):
            got.append(m)
            if ack:
                consumer.ack(m)
    return got


@pytest.fixture
def simple_consumers() -> Iterator[Callable[..., SimpleConsumer]]:
    made: list[SimpleConsumer] = []

    def make(endpoint: str, group: str, topic: str, expression: FilterExpression) -> SimpleConsumer:
        consumer = SimpleConsumer(config(endpoint), group, {topic: expression}, 1)
        consumer.startup()
        made.append(consumer)
        return consumer

    yield make
    for c in made:
        c.shutdown()


SUBSCRIPTIONS: list[tuple[str, FilterExpression, Callable[[dict[str, str]], bool]]] = [
    ("tag-pay", FilterExpression("Pay"), lambda r: r["tag"] == "Pay"),
    ("tag-order-pay", FilterExpression("Order||Pay"), lambda r: r["tag"] in ("Order", "Pay")),
    ("tag-all", FilterExpression("*"), lambda r: True),
    (
        "sql-region-price",
        FilterExpression("Region = 'Hangzhou' AND price > 30", FilterType.SQL),
        lambda r: r["Region"] == "Hangzhou" and int(r["price"]) > 30,
    ),
    # numeric strings: a string comparison would put '7' above '30' and '1000' below '250'
    (
        "sql-between",
        FilterExpression("price BETWEEN 30 AND 250 AND TAGS <> 'Ship'", FilterType.SQL),
        lambda r: 30 <= int(r["price"]) <= 250 and r["tag"] != "Ship",
    ),
    (
        "sql-in",
        FilterExpression("Region IN ('Beijing', 'Shanghai') OR price < 10", FilterType.SQL),
        lambda r: r["Region"] in ("Beijing", "Shanghai") or int(r["price"]) < 10,
    ),
]


def test_each_group_receives_exactly_its_filtered_set(start_broker: Any, simple_consumers: Any) -> None:
    broker = start_broker()
    topic = "FilterTopic"
    rows = fixture_messages(60)
    # one SQL group subscribes before the sends (bitmaps at dispatch), the others after
    early = simple_consumers(
        broker.endpoint, "sql-early", topic, FilterExpression("price > 100", FilterType.SQL)
    )
    assert early.receive(16, 5) == []
    time.sleep(1.2)  # past the registration margin, so the bitmaps of the sends below are used
    ids = send_all(broker.endpoint, topic, rows)
    assert len(set(ids)) == 60
    cases = [*SUBSCRIPTIONS, ("sql-early", None, lambda r: int(r["price"]) > 100)]
    for group, expr, predicate in cases:
        consumer = early if expr is None else simple_consumers(broker.endpoint, group, topic, expr)
        expected = {r["i"] for r in rows if predicate(r)}
        got = drain(consumer, len(expected), invisible=2)
        received = [m.properties["i"] for m in got]
        assert sorted(received, key=int) == sorted(expected, key=int), group
        by_i = {r["i"]: r for r in rows}
        for m in got:
            row = by_i[m.properties["i"]]
            assert m.tag == row["tag"] and m.body == f"body-{row['i']}".encode()
            assert set(m.keys) == {f"key-{row['i']}"} and m.delivery_attempt == 1
        time.sleep(2.2)  # past the invisible time: nothing acknowledged comes back
        assert consumer.receive(16, 2) == [], group


def test_push_consumer_with_tag_filter_and_nack_redelivery(start_broker: Any) -> None:
    broker = start_broker()
    topic = "PushTopic"
    rows = fixture_messages(25)
    expected = {r["i"] for r in rows if r["tag"] == "Pay"}
    seen: dict[str, list[int]] = {}
    lock = threading.Lock()
    done = threading.Event()

    class Listener(MessageListener):
        def consume(self, message: Any) -> ConsumeResult:
            with lock:
                attempts = seen.setdefault(message.properties["i"], [])
                attempts.append(message.delivery_attempt)
                if set(seen) == expected and all(len(a) >= 2 for k, a in seen.items() if k == "3"):
                    done.set()
            if message.properties["i"] == "3" and message.delivery_attempt == 1:
                return ConsumeResult.FAILURE  # nack once: redelivered with attempt 2
            return ConsumeResult.SUCCESS

    consumer = PushConsumer(config(broker.endpoint), "push-pay", Listener(), {topic: FilterExpression("Pay")})
    consumer.startup()
    try:
        send_all(broker.endpoint, topic, rows)
        assert done.wait(60), f"push consumer saw {sorted(seen)}; expected {sorted(expected)}"
        time.sleep(1.5)
    finally:
        consumer.shutdown()
    assert set(seen) == expected
    assert seen["3"] == [1, 2]
    assert all(a == [1] for k, a in seen.items() if k != "3")


def test_a_push_consumer_holding_messages_past_the_invisible_time_consumes_each_once(
    start_broker: Any,
) -> None:
    """The PushConsumer receives with auto_renew and holds messages in its cache and its listener:
    the broker keeps them invisible until the ack (they came back after the invisible time, and
    the first copy's ack was refused: 22 of 60 consumed twice in the reviewer's run)."""
    broker = start_broker(config={"default_invisible_time_s": 1.0})
    topic = "SlowPush"
    counts: dict[str, int] = {}
    lock = threading.Lock()

    class Slow(MessageListener):
        def consume(self, message: Any) -> ConsumeResult:
            time.sleep(0.3)  # 12 messages on few threads: the last wait well past 1 s
            with lock:
                counts[message.properties["i"]] = counts.get(message.properties["i"], 0) + 1
            return ConsumeResult.SUCCESS

    consumer = PushConsumer(
        config(broker.endpoint),
        "push-slow",
        Slow(),
        {topic: FilterExpression("*")},
        consumption_thread_count=2,
    )
    consumer.startup()
    try:
        send_all(broker.endpoint, topic, fixture_messages(12))
        deadline = time.monotonic() + 60
        while len(counts) < 12 and time.monotonic() < deadline:
            time.sleep(0.2)
        time.sleep(3)  # long enough for a copy to come back, were it to
    finally:
        consumer.shutdown()
    assert counts == {str(i): 1 for i in range(12)}


def test_redelivery_then_dead_letter_queue(start_broker: Any, simple_consumers: Any) -> None:
    broker = start_broker(config={"max_delivery_attempts": 2})
    topic = "RetryTopic"
    [mid] = send_all(broker.endpoint, topic, fixture_messages(1))
    consumer = simple_consumers(broker.endpoint, "retry-g", topic, FilterExpression("*"))
    attempts = []
    for _ in range(2):
        [m] = drain(consumer, 1, invisible=1, ack=False)
        assert m.message_id == mid
        attempts.append(m.delivery_attempt)
    assert attempts == [1, 2]
    time.sleep(1.2)
    assert consumer.receive(16, 1) == []  # two attempts used up: moved to %DLQ%retry-g
    dlq = simple_consumers(broker.endpoint, "dlq-reader", "%DLQ%retry-g", FilterExpression("*"))
    [dead] = drain(dlq, 1)
    assert dead.properties["DLQ_ORIGIN_TOPIC"] == topic
    assert dead.properties["DLQ_ORIGIN_MESSAGE_ID"] == mid


def test_invalid_filter_is_rejected_with_its_position(start_broker: Any, simple_consumers: Any) -> None:
    broker = start_broker()
    consumer = simple_consumers(
        broker.endpoint, "bad-filter", "T1", FilterExpression("price > AND x", FilterType.SQL)
    )
    with pytest.raises(Exception) as exc:
        consumer.receive(1, 5)
    assert type(exc.value).__name__ == "BadRequestException"
    assert "40010" in str(exc.value) or "ILLEGAL_FILTER_EXPRESSION" in str(exc.value)
    assert "8" in str(exc.value)  # the offset of the unexpected AND


def test_sql92_turned_off_gives_a_clear_status(start_broker: Any, simple_consumers: Any) -> None:
    broker = start_broker(config={"enable_property_filter": False})
    consumer = simple_consumers(broker.endpoint, "no-sql", "T2", FilterExpression("a = 1", FilterType.SQL))
    with pytest.raises(Exception) as exc:
        consumer.receive(1, 5)
    assert "enable_property_filter" in str(exc.value)


def _seed_004_send(endpoint: str) -> None:
    producer = Producer(config(endpoint), ("SUBSCRIBE_TEST",))
    producer.startup()
    try:
        for i in range(8):
            msg = Message()
            msg.topic = "SUBSCRIBE_TEST"
            msg.body = f"MsgStr{i}".encode()
            msg.tag = "tagA" if i < 4 else "tagB"
            producer.send(msg)
    finally:
        producer.shutdown()


def _bodies(consumer: SimpleConsumer, rounds: int = 4) -> list[str]:
    got = []
    for _ in range(rounds):
        for m in consumer.receive(16, 5):
            got.append(m.body.decode())
            consumer.ack(m)
    return got


def test_seed_004_strict_refuses_the_second_subscription(start_broker: Any, simple_consumers: Any) -> None:
    broker = start_broker()
    group, topic = "SUBSCRIBE_TEST_CONSUMER_GROUP", "SUBSCRIBE_TEST"
    a = simple_consumers(broker.endpoint, group, topic, FilterExpression("tagA"))
    b = simple_consumers(broker.endpoint, group, topic, FilterExpression("tagB"))
    _seed_004_send(broker.endpoint)
    with pytest.raises(Exception) as exc:
        b.receive(16, 5)
    for part in ("inconsistent subscription", group, topic, "tagA", "tagB"):
        assert part in str(exc.value)
    assert sorted(_bodies(a)) == [f"MsgStr{i}" for i in range(4)]  # nothing lost for the holder


def test_seed_004_compat_reproduces_rocketmq(start_broker: Any, simple_consumers: Any) -> None:
    group, topic = "SUBSCRIBE_TEST_CONSUMER_GROUP", "SUBSCRIBE_TEST"
    broker = start_broker(config={"compat_groups": [group]})
    a = simple_consumers(broker.endpoint, group, topic, FilterExpression("tagA"))
    time.sleep(2.5)  # ConsumerForTagA starts first (and re-sends its settings after about 1 s) ...
    b = simple_consumers(broker.endpoint, group, topic, FilterExpression("tagB"))
    time.sleep(2.5)  # ... then ConsumerForTagB, whose subscription overrides the group's
    _seed_004_send(broker.endpoint)
    got_b = _bodies(b)
    got_a = _bodies(a)
    assert got_a == []  # as in the seed: ConsumerForTagA consumes nothing
    assert set(got_b) == {f"MsgStr{i}" for i in range(4, 8)}  # ConsumerForTagB gets the tagB messages
    assert not any(m.startswith("MsgStr") and int(m[6:]) < 4 for m in got_a + got_b)  # tagA is lost
    assert any(
        "newest subscription wins" in line or "one subscription per group" in line for line in broker.output
    )
