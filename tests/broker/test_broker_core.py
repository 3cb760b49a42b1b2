"""The broker's domain services in-process (no gRPC): sends, filtered receives, acks, redelivery, DLQ."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from siftmq.broker import Broker, ProducedMessage, Subscription
from siftmq.broker import filter_registry as filter_registry_module
from siftmq.broker import parts as parts_module
from siftmq.broker.model import ProducedBatch
from siftmq.broker.receipts import ReceiptHandle
from siftmq.broker.receive import DLQ_RETRY_MS
from siftmq.broker.topics import PERM_WRITE
from siftmq.errors import BadRequestError, FilterError, StatusCode, UnsupportedError
from siftmq.hashing import java_string_hash
from siftmq.store import store as store_module
from siftmq.testing import SteppedClock
from siftmq.testing import open_broker as make_broker
from store_helpers import flip_byte

TOPIC = "Orders"


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[Broker]:
    b = make_broker(tmp_path / "data")
    yield b
    b.close()


_ids = iter(range(10**9))


def send(
    broker: Broker, tag: str | None = None, topic: str = TOPIC, message_id: str | None = None, **props: str
) -> str:
    mid = message_id or f"01ID{next(_ids):030d}"
    broker.send(ProducedMessage(topic=topic, body=b"x" * 10, message_id=mid, tag=tag, user_properties=props))
    return mid


def drain(
    broker: Broker, group: str, sub: Subscription, *, ack: bool = True, invisible_ms: int | None = 60_000
) -> list[tuple[str | None, dict[str, str], int]]:
    got = []
    while True:
        batch = broker.receive(group, sub, batch_size=16, invisible_ms=invisible_ms)
        if not batch:
            return got
        for d in batch:
            got.append((d.message.tags, d.message.properties, d.delivery_attempt))
            if ack:
                broker.ack(group, sub.topic, d.receipt_handle)


def tag_sub(expr: str, topic: str = TOPIC) -> Subscription:
    return Subscription(topic, "TAG", expr)


def sql_sub(expr: str, topic: str = TOPIC) -> Subscription:
    return Subscription(topic, "SQL92", expr)


def test_tag_filters_deliver_exactly_their_tags(broker: Broker) -> None:
    for i in range(30):
        send(broker, ["Pay", "Order", "Refund"][i % 3], n=str(i))
    send(broker, None, n="untagged")
    assert sorted(int(p["n"]) for _, p, _ in drain(broker, "g-pay", tag_sub("Pay"))) == list(range(0, 30, 3))
    both = drain(broker, "g-both", tag_sub("Order || Pay"))
    assert {t for t, _, _ in both} == {"Pay", "Order"} and len(both) == 20
    assert len(drain(broker, "g-all", tag_sub("*"))) == 31
    # nothing is delivered again once acknowledged
    assert drain(broker, "g-pay", tag_sub("Pay")) == []


def test_tag_hash_collision_never_reaches_the_consumer(broker: Broker) -> None:
    assert java_string_hash("Aa") == java_string_hash("BB")
    send(broker, "BB")
    send(broker, "Aa")
    got = drain(broker, "g", tag_sub("Aa"))
    assert [t for t, _, _ in got] == ["Aa"]
    # both passed the index stage; the exact stage evaluated both and let one through
    stats = broker.stats.filter("g", TOPIC).as_dict()
    assert (stats["evaluated"], stats["matched"], stats["skipped_by_tags_code"]) == (2, 1, 0)


def test_sql92_numeric_strings_and_conversion_errors(broker: Broker) -> None:
    prices = ["7", "100", "30", "31", "12.5", "abc", "1e3", "0x20"]
    for p in prices:
        send(broker, "T", price=p, Region="Hangzhou")
    send(broker, "T", Region="Hangzhou")  # no price: NULL, never delivered
    got = drain(broker, "g", sql_sub("Region = 'Hangzhou' AND price > 30"))
    # RocketMQ: '7' > 30 is false (numeric, not string order), '12.5' vs an integer literal is an
    # error, 'abc' is an error, '0x20' (32) converts as Java's Integer.decode would not -> see spec
    from siftmq.filter import compile_filter

    expected = sorted(p for p in prices if compile_filter("SQL92", "price > 30").matches({"price": p}))
    assert sorted(p["price"] for _, p, _ in got) == expected
    assert "100" in expected and "7" not in expected and "31" in expected


def test_sql92_bitmaps_are_computed_at_dispatch_and_used(
    broker: Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    sub = sql_sub("a = 'yes'")
    # registered as if two seconds ago: messages sent now are past the registration margin, so
    # their bitmaps are trusted
    with monkeypatch.context() as patched:
        patched.setattr(filter_registry_module, "time", SteppedClock(-2 * 10**9))
        assert broker.receive("g", sub) == []  # registers group#topic with the bitmap dispatcher
    reg = broker.filters.get("g", TOPIC)
    assert reg is not None and reg.version == 1
    for i in range(40):
        send(broker, "T", a="yes" if i % 10 == 0 else "no")
    # the ext units hold bitmaps with the group's bits exactly on the matching messages
    hits = []
    for qid in range(4):
        cq = broker.store.find_consume_queue(TOPIC, qid)
        assert cq is not None and cq.ext is not None
        block = cq.ext.read_block(0, cq.max_offset)
        assert block is not None
        for i in range(len(block.present)):
            unit = block.unit(i)
            assert unit is not None and unit.filter_bitmap is not None
            hits.append(broker.bloom.is_hit_positions(reg.positions, unit.filter_bitmap))
    assert sum(hits) == 4
    got = drain(broker, "g", sub)
    assert len(got) == 4 and all(p["a"] == "yes" for _, p, _ in got)


def test_a_cleared_bit_in_a_stored_bitmap_never_hides_a_matching_message(
    broker: Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One damaged byte of an extension file, while the broker runs: the group's bits cleared in a
    matching message's bitmap. The bitmap's check tells; the message is evaluated exactly and
    delivered (without the check the bloom stage rejected it, for good)."""
    sub = sql_sub("a = 'yes'")
    with monkeypatch.context() as patched:
        patched.setattr(filter_registry_module, "time", SteppedClock(-2 * 10**9))
        assert broker.receive("g", sub) == []
    reg = broker.filters.get("g", TOPIC)
    assert reg is not None
    for i in range(40):
        send(broker, "T", a="yes" if i % 10 == 0 else "no")
    broker.store.wait_dispatched(40)
    cleared = 0
    for qid in range(4):
        cq = broker.store.find_consume_queue(TOPIC, qid)
        assert cq is not None and cq.ext is not None
        ext = cq.ext
        block = ext.read_block(0, cq.max_offset)
        assert block is not None
        for i in range(len(block.present)):
            unit = block.unit(i)
            assert unit is not None and unit.filter_bitmap is not None
            if broker.bloom.is_hit_positions(reg.positions, unit.filter_bitmap):
                p = reg.positions[0]  # one of the group's bits, cleared on disk
                at = i * ext.unit_size + ext.unit_size - ext.bitmap_size + (p >> 3)
                flip_byte(ext.log.directory / f"{0:020d}", at, 1 << (p & 7))  # a set bit: cleared
                cleared += 1
    assert cleared == 4
    got = drain(broker, "g", sub)
    assert len(got) == 4 and all(p["a"] == "yes" for _, p, _ in got)


def test_messages_stored_before_registration_are_evaluated_exactly(broker: Broker) -> None:
    for i in range(10):
        send(broker, "T", a=str(i))
    got = drain(broker, "late", sql_sub("a >= 5"))
    assert sorted(p["a"] for _, p, _ in got) == ["5", "6", "7", "8", "9"]


def test_a_wall_clock_stepping_back_never_hides_older_messages_from_a_new_sql92_group(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = SteppedClock(3600 * 10**9)  # the store's clock runs an hour ahead, then steps back
    monkeypatch.setattr(store_module, "time", clock)
    broker = make_broker(tmp_path / "data")
    try:
        assert drain(broker, "other", sql_sub("b = 2")) == []  # so records get bitmaps at dispatch
        send(broker, "T", a="1", message_id="01BEFORE")  # stored "an hour from now"
        broker.store.wait_dispatched(10)
        clock.offset_ns = 0  # the wall clock steps back by an hour
        # its bitmap lacks the new group's bits; were it trusted, the message would be skipped
        assert [p["UNIQ_KEY"] for _, p, _ in drain(broker, "late", sql_sub("a = 1"))] == ["01BEFORE"]
        send(broker, "T", a="1", message_id="01AFTER")
        assert [p["UNIQ_KEY"] for _, p, _ in drain(broker, "late", sql_sub("a = 1"))] == ["01AFTER"]
    finally:
        broker.close()
    broker = make_broker(tmp_path / "data")  # after a restart too
    try:
        got = drain(broker, "later", sql_sub("a = 1"))
        assert sorted(p["UNIQ_KEY"] for _, p, _ in got) == ["01AFTER", "01BEFORE"]
    finally:
        broker.close()


def test_non_matching_messages_are_passed_over(broker: Broker) -> None:
    for _ in range(20):
        send(broker, "Other")
    assert drain(broker, "g", tag_sub("Pay")) == []
    for qid in range(4):
        prog = broker.consumers.get(("g", TOPIC, qid))
        assert prog is not None
        assert prog.committed_offset == broker.store.get_max_offset_in_queue(TOPIC, qid)


def test_redelivery_with_attempts_then_dead_letter_queue(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = SteppedClock()
    monkeypatch.setattr(parts_module, "time", clock)
    broker = make_broker(tmp_path / "d", max_delivery_attempts=3)
    try:
        mid = send(broker, "T", k="v")
        sub = tag_sub("T")
        attempts = []
        for _ in range(3):
            batch = broker.receive("g", sub, invisible_ms=100)
            assert len(batch) == 1 and batch[0].message_id == mid
            attempts.append(batch[0].delivery_attempt)
            assert broker.receive("g", sub, invisible_ms=100) == []  # invisible for 100 ms
            clock.advance(0.15)
        assert attempts == [1, 2, 3]
        assert broker.receive("g", sub, invisible_ms=100) == []  # 3 attempts used: moved to the DLQ
        dlq = drain(broker, "dlq-reader", tag_sub("*", topic="%DLQ%g"))
        assert len(dlq) == 1
        _, props, _ = dlq[0]
        assert props["DLQ_ORIGIN_TOPIC"] == TOPIC and props["DLQ_ORIGIN_MESSAGE_ID"] == mid
        assert props["k"] == "v"
    finally:
        broker.close()


def test_receipt_handles_ack_nack_and_stale(broker: Broker) -> None:
    send(broker, "T")
    sub = tag_sub("T")
    [d] = broker.receive("g", sub, invisible_ms=60_000)
    new_handle = broker.change_invisible_duration("g", TOPIC, d.receipt_handle, 0)
    with pytest.raises(BadRequestError) as stale:
        broker.ack("g", TOPIC, d.receipt_handle)
    assert stale.value.status == "INVALID_RECEIPT_HANDLE" and "stale" in stale.value.message
    [again] = broker.receive("g", sub, invisible_ms=60_000)
    assert again.delivery_attempt == 2 and again.message_id == d.message_id
    with pytest.raises(BadRequestError):  # the nack's handle was replaced by the redelivery
        broker.ack("g", TOPIC, new_handle)
    broker.ack("g", TOPIC, again.receipt_handle)
    with pytest.raises(BadRequestError) as twice:
        broker.ack("g", TOPIC, again.receipt_handle)
    assert "not in flight" in twice.value.message
    for bad in ["", "garbage", "v1:0:0:zz:Orders", "v1:0:0:1:Other", "v1:-1:0:1:Orders", "x" * 1000]:
        with pytest.raises(BadRequestError) as exc:
            broker.ack("g", TOPIC, bad)
        assert exc.value.status == "INVALID_RECEIPT_HANDLE"


def test_duplicate_message_id_is_stored_once(broker: Broker) -> None:
    send(broker, "T", message_id="01DUPLICATE")
    send(broker, "T", message_id="01DUPLICATE")
    total = sum(broker.store.get_max_offset_in_queue(TOPIC, q) for q in range(4))
    assert total == 1
    assert len(drain(broker, "g", tag_sub("*"))) == 1


def test_another_message_reusing_an_id_is_stored_not_answered_with_the_first(broker: Broker) -> None:
    """Only a retry (same topic, body and properties) is answered with the stored message: another
    message with a used id (another producer's, a reused business id) was acknowledged and dropped.
    RocketMQ stores it; so does siftmq."""
    send(broker, "A", message_id="01REUSED", order="1")
    send(broker, "A", message_id="01REUSED", order="2")  # other properties
    send(broker, "B", message_id="01REUSED", order="2")  # another tag
    broker.send(ProducedMessage(topic=TOPIC, body=b"other body", message_id="01REUSED", tag="B"))
    send(broker, "A", message_id="01REUSED", order="1")  # a late retry of the first: not the newest, stored
    got = drain(broker, "g", tag_sub("*"))
    assert sorted((tag, props["order"]) for tag, props, _ in got if "order" in props) == [
        ("A", "1"), ("A", "1"), ("A", "2"), ("B", "2")
    ]  # fmt: skip
    assert len(got) == 5


@pytest.mark.parametrize(
    ("change", "status"),
    [
        ({"tag": "A|B"}, "ILLEGAL_MESSAGE_TAG"),
        ({"tag": "  "}, "ILLEGAL_MESSAGE_TAG"),
        ({"topic": "bad topic"}, "ILLEGAL_TOPIC"),
        ({"topic": "x" * 200}, "ILLEGAL_TOPIC"),
        ({"topic": "%DLQ%g"}, "ILLEGAL_TOPIC"),
        ({"user_properties": {"TAGS": "x"}}, "ILLEGAL_MESSAGE_PROPERTY_KEY"),
        ({"user_properties": {"a\x01b": "x"}}, "ILLEGAL_MESSAGE_PROPERTY_KEY"),
        ({"user_properties": {"a\tb": "x"}}, "ILLEGAL_MESSAGE_PROPERTY_KEY"),  # Java's ISO control set
        ({"user_properties": {"a\x85": "x"}}, "ILLEGAL_MESSAGE_PROPERTY_KEY"),
        ({"tag": "Pay\n"}, "ILLEGAL_MESSAGE_TAG"),
        ({"tag": "Pay\x7f"}, "ILLEGAL_MESSAGE_TAG"),
        ({"keys": ["k\x1b"]}, "ILLEGAL_MESSAGE_KEY"),
        ({"user_properties": {"a": "x\x02"}}, "BAD_REQUEST"),
        ({"user_properties": {f"p{i}": "v" for i in range(200)}}, "MESSAGE_PROPERTIES_TOO_LARGE"),
        ({"keys": ["has space"]}, "ILLEGAL_MESSAGE_KEY"),
        ({"body": b""}, "MESSAGE_BODY_EMPTY"),
        ({"body": b"x" * (4 * 1024 * 1024 + 1)}, "MESSAGE_BODY_TOO_LARGE"),
        ({"message_id": ""}, "ILLEGAL_MESSAGE_ID"),
    ],
)
def test_bad_sends_are_refused_and_store_nothing(
    broker: Broker, change: dict[str, object], status: str
) -> None:
    fields: dict[str, object] = {"topic": TOPIC, "body": b"ok", "message_id": "01BAD", "tag": "T"}
    fields.update(change)
    before = broker.store.max_commit_log_offset
    with pytest.raises(BadRequestError) as exc:
        broker.send(ProducedMessage(**fields))  # type: ignore[arg-type]
    assert exc.value.status == status
    assert broker.store.max_commit_log_offset == before
    send(broker, "T")  # and the broker keeps serving
    assert broker.store.max_commit_log_offset > before


def _batch(**change: object) -> ProducedBatch:
    """Two valid messages, column by column, with ``change`` applied."""
    fields: dict[str, object] = {
        "topic": TOPIC,
        "bodies": [b"one", b"two"],
        "message_ids": ["01COLS1", "01COLS2"],
        "tags": ["T", None],
        "key_counts": [1, 0],
        "keys": ["k1"],
        "property_counts": [2, 1],
        "property_names": ["a", "b", "a"],
        "property_values": ["1", "2", "3"],
        "born_timestamps_ms": [1, 2],
        "born_hosts": ["", ""],
    }
    fields.update(change)
    return ProducedBatch(**fields)  # type: ignore[arg-type]


def test_a_batch_sent_column_by_column_keeps_each_message_its_own_fields(broker: Broker) -> None:
    results = broker.send_batch(_batch(born_hosts=["10.0.0.7", "client-7"]))
    assert [r.message_id for r in results] == ["01COLS1", "01COLS2"]
    stored = [broker.store.query_message_by_uniq_key(m) for m in ("01COLS1", "01COLS2")]
    assert stored[0] is not None and stored[1] is not None
    assert stored[0].properties == {"a": "1", "b": "2", "TAGS": "T", "KEYS": "k1", "UNIQ_KEY": "01COLS1"}
    assert stored[1].properties == {"a": "3", "UNIQ_KEY": "01COLS2", "__BORN_HOST": "client-7"}
    assert (stored[0].body, stored[1].body) == (b"one", b"two")
    assert (stored[0].born_timestamp, stored[1].born_timestamp) == (1, 2)
    # together over one message's property limit, each within it: accepted
    big = "v" * 9000
    fine = _batch(message_ids=["01COLS3", "01COLS4"], property_values=[big, "2", big])
    assert len(broker.send_batch(fine)) == 2


@pytest.mark.parametrize(
    ("change", "status", "words"),
    [
        ({"tags": ["T"]}, "BAD_REQUEST", "1 tags for 2 messages"),
        ({"born_hosts": [""]}, "BAD_REQUEST", "1 born hosts for 2 messages"),
        ({"key_counts": [2, 0]}, "ILLEGAL_MESSAGE_KEY", "counts of message keys (2 in all)"),
        ({"key_counts": [33, 0], "keys": ["k"] * 33}, "ILLEGAL_MESSAGE_KEY", "33 message keys"),
        ({"key_counts": [1, 0], "keys": ["a b"]}, "ILLEGAL_MESSAGE_KEY", "no whitespace"),
        ({"property_counts": [1, 1]}, "BAD_REQUEST", "counts of user properties (2 in all)"),
        ({"property_counts": [4, -1]}, "BAD_REQUEST", "counts of user properties (3 in all)"),
        ({"property_values": ["1", "2"]}, "BAD_REQUEST", "2 property values for 3 property names"),
        ({"property_names": ["a", "a", "a"]}, "ILLEGAL_MESSAGE_PROPERTY_KEY", "property twice"),
        ({"property_names": ["a", "UNIQ_KEY", "a"]}, "ILLEGAL_MESSAGE_PROPERTY_KEY", "reserved"),
        ({"property_values": ["1", "2\x01", "3"]}, "BAD_REQUEST", "'b' contains a control separator"),
        ({"property_values": ["v" * 20000, "2", "3"]}, "MESSAGE_PROPERTIES_TOO_LARGE", "20003 bytes"),
        ({"bodies": [b"one", b""]}, "MESSAGE_BODY_EMPTY", "empty"),
        ({"message_ids": ["01COLS1", "01COLS1"]}, "ILLEGAL_MESSAGE_ID", "twice"),
        ({"message_ids": ["01COLS1", "has space"]}, "ILLEGAL_MESSAGE_ID", "has space"),
        ({"topic": "%SYS%x"}, "ILLEGAL_TOPIC", "system topic"),
    ],
)
def test_malformed_column_batches_are_refused_and_store_nothing(
    broker: Broker, change: dict[str, object], status: str, words: str
) -> None:
    before = broker.store.max_commit_log_offset
    with pytest.raises(BadRequestError) as exc:
        broker.send_batch(_batch(**change))
    assert exc.value.status == status
    assert words in exc.value.message
    assert broker.store.max_commit_log_offset == before
    assert len(broker.send_batch(_batch())) == 2  # and the broker keeps serving


def test_invalid_filters_and_disabled_sql(tmp_path: Path, broker: Broker) -> None:
    with pytest.raises(FilterError):
        broker.receive("g", sql_sub("a = "))
    with pytest.raises(FilterError):
        broker.receive("g", sql_sub("a + 1"))
    off = make_broker(tmp_path / "nosql", enable_property_filter=False)
    try:
        with pytest.raises(UnsupportedError) as exc:
            off.receive("g", sql_sub("a = 1"))
        assert "enable_property_filter" in exc.value.message
        send(off, "T")
        assert len(drain(off, "g", tag_sub("T"))) == 1
    finally:
        off.close()


def test_progress_in_flight_and_registrations_survive_a_restart(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = SteppedClock()
    monkeypatch.setattr(parts_module, "time", clock)
    data = tmp_path / "data"
    broker = make_broker(data)
    for i in range(6):
        send(broker, "T", n=str(i))
    sub = sql_sub("n >= 0")
    first = broker.receive("g", sub, batch_size=4, invisible_ms=200)
    assert len(first) == 4
    for d in first[:2]:
        broker.ack("g", TOPIC, d.receipt_handle)
    unacked = {d.message_id for d in first[2:]}
    broker.close()

    broker = make_broker(data)
    try:
        reg = broker.filters.get("g", TOPIC)
        assert reg is not None and reg.expression == "n >= 0" and reg.version == 1
        clock.advance(0.25)  # the unacknowledged two are visible again
        seen: dict[str, int] = {}
        for _ in range(10):
            for d in broker.receive("g", sub, batch_size=16, invisible_ms=60_000):
                seen[d.message_id] = d.delivery_attempt
                broker.ack("g", TOPIC, d.receipt_handle)
        assert len(seen) == 4  # 2 redelivered + 2 never delivered; the acked two are not back
        assert {m for m, a in seen.items() if a == 2} == unacked
        broker.filters.register(
            "g", TOPIC, __import__("siftmq.filter", fromlist=["x"]).compile_filter("SQL92", "n >= 1")
        )
        reg2 = broker.filters.get("g", TOPIC)
        assert reg2 is not None and reg2.version == 2
    finally:
        broker.close()


def test_settings_register_sql_subscriptions_and_reject_invalid_ones(broker: Broker) -> None:
    broker.subscribe("client-1", "PUSH_CONSUMER", "g-settings", [sql_sub("price > 10"), tag_sub("Pay")])
    reg = broker.filters.get("g-settings", TOPIC)
    assert reg is not None and reg.expression == "price > 10"
    with pytest.raises(BadRequestError) as exc:
        broker.subscribe("client-2", "PUSH_CONSUMER", "g-bad", [sql_sub("price >")])
    assert exc.value.status == "ILLEGAL_FILTER_EXPRESSION" and TOPIC in exc.value.message
    assert broker.filters.get("g-bad", TOPIC) is None


def test_registrations_expire_after_the_group_is_gone(tmp_path: Path) -> None:
    broker = make_broker(tmp_path / "d", filter_registration_expire_s=60)
    try:
        broker.receive("g", sql_sub("a = 'x'"))
        reg = broker.filters.get("g", TOPIC)
        assert reg is not None
        assert broker.filters.expire(reg.last_seen_ms + 30_000) == []
        broker.filters.touch_group("g", reg.last_seen_ms + 50_000)  # a live consumer keeps it
        assert broker.filters.expire(reg.last_seen_ms + 90_000) == []
        gone = broker.filters.expire(reg.last_seen_ms + 200_000)
        assert [r.bloom_key for r in gone] == [f"g#{TOPIC}"] and broker.filters.get("g", TOPIC) is None
        send(broker, "T", a="x")
        send(broker, "T", a="y")
        got = drain(broker, "g", sql_sub("a = 'x'"))  # re-registered; stored messages evaluated exactly
        assert [p["a"] for _, p, _ in got] == ["x"]
    finally:
        broker.close()


def test_auto_create_off_refuses_unknown_topics(tmp_path: Path) -> None:
    from siftmq.errors import NotFoundError

    broker = make_broker(tmp_path / "d", auto_create_topics=False)
    try:
        with pytest.raises(NotFoundError) as exc:
            broker.route("Unknown")
        assert exc.value.status == "TOPIC_NOT_FOUND"
        broker.topics.create("Known", 2)
        assert broker.route("Known").queue_nums == 2
    finally:
        broker.close()


def test_offset_pull_filters_and_reports_where_to_resume(tmp_path: Path) -> None:
    broker = make_broker(tmp_path / "d", default_queue_nums=1)
    try:
        for i in range(50):
            send(broker, "Pay" if i % 10 == 0 else "Other", n=str(i))
        sub = tag_sub("Pay")
        result = broker.pull("puller", sub, 0, 0, 32)
        assert result.status == "FOUND" and [m.properties["n"] for m in result.messages] == [
            "0", "10", "20", "30", "40"]  # fmt: skip
        assert result.next_offset == 50 and result.max_offset == 50
        assert broker.pull("puller", sub, 0, 50, 32).status == "NO_NEW_MESSAGE"
        assert broker.pull("puller", sub, 0, 41, 32).status == "NO_NEW_MESSAGE"  # passed over to the end
        bad = broker.pull("puller", sub, 0, 70, 32)
        assert bad.status == "ILLEGAL_OFFSET" and bad.next_offset in (0, 50)
        sql = broker.pull("puller", sql_sub("n > 44"), 0, 0, 2)
        assert [m.properties["n"] for m in sql.messages] == ["45", "46"] and sql.next_offset == 47
        with pytest.raises(BadRequestError):
            broker.pull("puller", sub, 1, 0, 32)  # no such queue
        # committed offsets
        from siftmq.errors import NotFoundError

        with pytest.raises(NotFoundError):
            broker.get_offset("puller", TOPIC, 0)
        broker.update_offset("puller", TOPIC, 0, 47)
        assert broker.get_offset("puller", TOPIC, 0) == 47
        with pytest.raises(BadRequestError) as exc:
            broker.update_offset("puller", TOPIC, 0, 51)
        assert exc.value.status == "ILLEGAL_OFFSET"
        assert broker.query_offset(TOPIC, 0, "BEGINNING") == 0
        assert broker.query_offset(TOPIC, 0, "END") == 50
        stamps = [m.store_timestamp for m in broker.pull("t", tag_sub("*"), 0, 0, 64).messages]
        assert broker.query_offset(TOPIC, 0, "TIMESTAMP", stamps[20]) == stamps.index(stamps[20])
        assert broker.query_offset(TOPIC, 0, "TIMESTAMP", stamps[-1] + 1) == 50
    finally:
        broker.close()
    broker = make_broker(tmp_path / "d", default_queue_nums=1)
    try:
        assert broker.get_offset("puller", TOPIC, 0) == 47  # survives a restart
    finally:
        broker.close()


def test_retention_deletes_old_segments_and_consumers_move_on(tmp_path: Path) -> None:
    broker = make_broker(
        tmp_path / "d", default_queue_nums=1, max_body_size=16 * 1024, commit_log_segment_size=128 * 1024,
        retention_hours=1e-7, disk_max_used_space_ratio=1.0,
    )  # fmt: skip
    try:
        for i in range(400):
            broker.send(ProducedMessage(topic=TOPIC, body=b"x" * 1000, message_id=f"01RET{i}", tag="T"))
        old = broker.receive("early", tag_sub("T"), batch_size=1)  # a group that read one message
        broker.ack("early", TOPIC, old[0].receipt_handle)
        time.sleep(0.05)
        broker.apply_retention()
        lo = broker.store.get_min_offset_in_queue(TOPIC, 0)
        assert 0 < lo < 400  # whole old segments are gone; the active one stays
        got = drain(broker, "early", tag_sub("T"))
        assert len(got) == 400 - lo  # resumes at the queue's new minimum, nothing else skipped
    finally:
        broker.close()


def test_a_receive_fills_its_answer_from_every_queue_when_a_message_may_be_as_large_as_an_answer(
    tmp_path: Path,
) -> None:
    """With ``max_body_size`` at ``max_pull_bytes``, a receive stopped after its first queue's read
    (the next message might not have fit): an answer of 16 small messages came from one queue."""
    broker = make_broker(
        tmp_path / "d", max_body_size=64 * 1024, max_pull_bytes=64 * 1024, commit_log_segment_size=256 * 1024
    )
    try:
        small = [send(broker, "T") for _ in range(16)]  # 4 on each of the 4 queues
        first = broker.receive("g", tag_sub("T"), batch_size=16, invisible_ms=60_000)
        assert sorted(d.message_id for d in first) == sorted(small)
        assert len({d.message.queue_id for d in first}) == 4
        for d in first:
            broker.ack("g", TOPIC, d.receipt_handle)
        # large ones: each answer within the bound, one at least, every message once
        for i in range(12):
            body = b"L" * (40_000 if i % 3 == 0 else 9_000)
            broker.send(ProducedMessage(topic=TOPIC, body=body, message_id=f"01BIG{i:04d}", tag="T"))
        seen: list[str] = []
        while batch := broker.receive("g", tag_sub("T"), batch_size=16, invisible_ms=60_000):
            assert len(batch) == 1 or sum(len(d.message.body) for d in batch) <= 64 * 1024
            seen += [d.message_id for d in batch]
            for d in batch:
                broker.ack("g", TOPIC, d.receipt_handle)
        assert sorted(seen) == [f"01BIG{i:04d}" for i in range(12)]
        # a queue whose next message does not fit what is left is passed, not the end of the read
        sizes = [40_000, 40_000, 10, 10]
        sent = [
            broker.send(ProducedMessage(topic=TOPIC, body=b"s" * n, message_id=f"01FIT{i:04d}", tag="T"))
            for i, n in enumerate(sizes)
        ]
        queues = [r.queue_id for r in sent]
        assert queues == [(queues[0] + i) % 4 for i in range(4)]  # one after the other
        first = broker.receive("g", tag_sub("T"), batch_size=16, invisible_ms=60_000, queue_id=queues[0])
        assert sorted(d.message.queue_id for d in first) == sorted([queues[0], queues[2], queues[3]])
        second = broker.receive("g", tag_sub("T"), batch_size=16, invisible_ms=60_000)
        assert [d.message.queue_id for d in second] == [queues[1]]
    finally:
        broker.close()


def test_a_failing_dlq_move_keeps_the_message_in_flight_and_serves_the_group(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    clock = SteppedClock()
    monkeypatch.setattr(parts_module, "time", clock)
    broker = make_broker(tmp_path / "d", max_delivery_attempts=2, default_queue_nums=1)
    group, sub = "g-move-fails", tag_sub("T")
    try:
        poison = send(broker, "T", n="poison")
        assert [d.message_id for d in broker.receive(group, sub, invisible_ms=60)] == [poison]
        clock.advance(0.1)
        assert [d.delivery_attempt for d in broker.receive(group, sub, invisible_ms=60)] == [2]  # its last
        other = send(broker, "T", n="other")
        assert [d.message_id for d in broker.receive(group, sub, invisible_ms=60)] == [other]
        clock.advance(0.1)  # both due: the poison for the dead-letter topic, first in line
        fresh = send(broker, "T", n="fresh")
        real = broker._to_dlq

        def broken(*args: object, **kwargs: object) -> None:
            raise RuntimeError("the dead-letter topic cannot take it")

        broker._to_dlq = broken  # type: ignore[method-assign]
        with caplog.at_level(logging.WARNING, logger="siftmq.broker.receive"):
            got = broker.receive(group, sub, batch_size=16, invisible_ms=60_000)
            # the redelivery taken in the same pass and the new message are answered, not thrown away
            assert [(d.message_id, d.delivery_attempt) for d in got] == [(other, 2), (fresh, 1)]
            prog = broker.consumers.get((group, TOPIC, 0))
            assert prog is not None
            item = prog.inflight[0]  # the poison: in flight, tried again later
            assert item.attempt == 2 and 0 < item.visible_at_ms - parts_module._now_ms() <= DLQ_RETRY_MS
            clock.advance(DLQ_RETRY_MS / 1000 + 0.01)
            assert (
                broker.receive(group, sub, batch_size=16, invisible_ms=60_000) == []
            )  # failed again, quietly
        warned = [r.getMessage() for r in caplog.records if "could not be moved" in r.getMessage()]
        assert len(warned) == 1 and "RuntimeError: the dead-letter topic cannot take it" in warned[0]
        assert group in warned[0]
        broker._to_dlq = real  # type: ignore[method-assign]
        clock.advance(DLQ_RETRY_MS / 1000 + 0.01)
        assert broker.receive(group, sub, batch_size=16, invisible_ms=60_000) == []  # moved now
        dead = drain(broker, "dlq", tag_sub("*", topic=f"%DLQ%{group}"))
        assert [p["DLQ_ORIGIN_MESSAGE_ID"] for _, p, _ in dead] == [poison]
        assert 0 not in prog.inflight and len(prog.inflight) == 2  # the other two, still unacked
    finally:
        broker.close()


def test_a_pass_cut_short_by_an_error_answers_what_it_took(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = SteppedClock()
    monkeypatch.setattr(parts_module, "time", clock)
    broker = make_broker(tmp_path / "d", default_queue_nums=1)
    group, sub = "g-cut-short", tag_sub("T")
    try:
        first, second = send(broker, "T"), send(broker, "T")
        [a] = broker.receive(group, sub, batch_size=1, invisible_ms=60)
        clock.advance(0.01)
        [b] = broker.receive(group, sub, batch_size=1, invisible_ms=60)
        assert (a.message_id, b.message_id) == (first, second)
        clock.advance(0.1)  # both due, the first one first
        real = broker.store.look_message_by_offset

        def failing(offset: int, size: int) -> object:
            if offset == b.message.commit_log_offset:
                raise OSError(5, "Input/output error")
            return real(offset, size)

        monkeypatch.setattr(broker.store, "look_message_by_offset", failing)
        got = broker.receive(group, sub, batch_size=16, invisible_ms=60_000)
        assert [(d.message_id, d.delivery_attempt) for d in got] == [(first, 2)]  # before: the error, and
        prog = broker.consumers.get((group, TOPIC, 0))  # the first lost in flight under a handle never sent
        assert prog is not None
        item = prog.inflight[b.message.queue_offset]
        assert item.attempt == 1 and item.visible_at_ms <= parts_module._now_ms()  # untouched: still due
        with pytest.raises(OSError):  # nothing taken before it: the read error is the answer
            broker.receive(group, sub, batch_size=16, invisible_ms=60_000)
        monkeypatch.setattr(broker.store, "look_message_by_offset", real)
        got = broker.receive(group, sub, batch_size=16, invisible_ms=60_000)
        assert [(d.message_id, d.delivery_attempt) for d in got] == [(second, 2)]
    finally:
        broker.close()


def test_a_dead_letter_copy_cuts_a_long_filter_error_to_fit(broker: Broker) -> None:
    send(broker, "T")
    [d] = broker.receive("g", tag_sub("T"))
    why = "TypeError: " + "\u00e9" * 1000  # 2 bytes a character: far over the copy's room
    broker._to_dlq("g", d.message, 0, {"FILTER_ERROR": why})
    [(_, props, _)] = drain(broker, "dlq", tag_sub("*", topic="%DLQ%g"))
    kept = props["FILTER_ERROR"]
    assert why.startswith(kept) and 698 < len(kept.encode()) <= 700  # MAX_FILTER_ERROR_BYTES


def test_group_names_leave_room_for_the_dlq_topic(broker: Broker) -> None:
    with pytest.raises(BadRequestError):
        broker.receive("g" * 123, tag_sub("*"))
    broker.receive("g" * 122, tag_sub("*"))


def test_corrupt_consumer_state_stops_the_start(tmp_path: Path) -> None:
    from siftmq.errors import ConfigError

    make_broker(tmp_path / "d").close()
    (tmp_path / "d" / "config" / "consumer_state.json").write_text("{not json")
    with pytest.raises(ConfigError) as exc:
        make_broker(tmp_path / "d")
    assert "consumer_state.json" in exc.value.message


def test_a_failing_filter_at_dispatch_falls_back_to_exact_evaluation(
    broker: Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dataclasses import replace

    sub = sql_sub("a = 'yes'")
    broker.receive("g", sub)
    reg = broker.filters.get("g", TOPIC)
    assert reg is not None

    class Broken:
        properties = reg.compiled.properties

        def matches_batch(self, batch: object) -> object:
            raise RuntimeError("boom")

    broker.filters._by_topic = {TOPIC: (replace(reg, compiled=Broken(), born_time_ms=0),)}  # type: ignore[arg-type]
    # stored past the registration margin (its bitmap is trusted), without waiting for it
    monkeypatch.setattr(store_module, "time", SteppedClock(2 * 10**9))
    send(broker, "T", a="yes")
    broker.filters._reindex_locked()
    got = drain(broker, "g", sub)
    assert [p["a"] for _, p, _ in got] == ["yes"]


_ack_examples = iter(range(10**9))
_ACK_ITEM = st.one_of(
    st.tuples(st.just("msg"), st.integers(0, 5)),
    st.tuples(
        st.just("text"),
        st.sampled_from(
            ["", "garbage", "v1:0:0:zz:Orders", "v1:0:0:1:Other", "v1:3:0:1:Orders", "v1:9:0:1:Orders"]
        ),
    ),
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    roles=st.lists(st.sampled_from(["valid", "stale", "expired"]), min_size=1, max_size=6),
    items=st.lists(_ACK_ITEM, max_size=12),
)
def test_ack_many_answers_as_acks_one_by_one(
    broker: Broker, roles: list[str], items: list[tuple[str, object]]
) -> None:
    """Differential, in one long-lived broker: the same handles (valid, stale, expired, repeated,
    malformed, of another topic or queue) acknowledged one by one in one group and in one
    ack_many call in a twin group give the same outcome for each, and leave the same in flight."""
    n = next(_ack_examples)
    tag = f"E{n}"
    for i in range(len(roles)):
        send(broker, tag, i=str(i))
    outcomes = {}
    for side in ("one", "many", "try"):
        group = f"g{side}{n}"
        handles: dict[int, str] = {}
        for d in broker.receive(group, tag_sub(tag), batch_size=32, invisible_ms=600_000):
            i = int(d.message.properties["i"])
            handles[i] = d.receipt_handle
            if roles[i] == "stale":
                broker.change_invisible_duration(group, TOPIC, d.receipt_handle, 600_000)
            elif roles[i] == "expired":
                handles[i] = broker.change_invisible_duration(group, TOPIC, d.receipt_handle, 1)
        assert sorted(handles) == list(range(len(roles)))
        time.sleep(0.005)
        texts = [handles[v % len(roles)] if kind == "msg" else str(v) for kind, v in items]  # type: ignore[operator]
        if side == "one":
            got: list[str | None] = []
            for text in texts:
                try:
                    broker.ack(group, TOPIC, text)
                    got.append(None)
                except BadRequestError as exc:
                    got.append(exc.status + ": " + exc.message)
        else:
            ack = broker.ack_many if side == "many" else broker.try_ack_many
            errors = ack(group, TOPIC, texts)
            assert errors is not None  # no lock is held elsewhere
            got = [None if e is None else e.status + ": " + e.message for e in errors]
        in_flight = {
            (qid, offset)
            for qid in range(4)
            if (prog := broker.consumers.get((group, TOPIC, qid))) is not None
            for offset in prog.inflight
        }
        outcomes[side] = ([g and g.replace(group, "G") for g in got], in_flight)
    assert outcomes["one"] == outcomes["many"] == outcomes["try"]


def test_try_ack_many_does_nothing_while_a_queue_is_read(broker: Broker) -> None:
    """try_ack_many (the event loop's) never waits: with one of the queues' locks held elsewhere it
    acknowledges nothing, not even on the other queues, and answers None."""
    for i in range(8):
        send(broker, "L", i=str(i))
    handles = [
        d.receipt_handle for d in broker.receive("g-lock", tag_sub("L"), batch_size=8, invisible_ms=60_000)
    ]
    queues = sorted({ReceiptHandle.decode(h).queue_id for h in handles})
    assert len(queues) > 1
    busy = broker.consumers.get(("g-lock", TOPIC, queues[-1]))
    assert busy is not None
    with busy.lock:  # a receive reading that queue
        assert broker.try_ack_many("g-lock", TOPIC, handles) is None
    assert broker.try_ack_many("g-lock", TOPIC, handles) == [None] * 8  # all were still in flight
    assert broker.receive("g-lock", tag_sub("L"), batch_size=8, invisible_ms=60_000) == []


def test_ack_many_with_an_illegal_group_fails_every_entry(broker: Broker) -> None:
    errors = broker.ack_many("bad group!", TOPIC, ["v1:0:0:1:Orders", "garbage"])
    assert [e and e.status for e in errors] == ["ILLEGAL_CONSUMER_GROUP"] * 2


def test_every_delivery_of_a_receive_gets_its_own_nonce(broker: Broker) -> None:
    for i in range(40):
        send(broker, "N", i=str(i))
    handles = [
        d.receipt_handle
        for batch_size in (1, 7, 32)
        for d in broker.receive("g-nonce", tag_sub("N"), batch_size=batch_size, invisible_ms=60_000)
    ]
    nonces = [ReceiptHandle.decode(h).nonce for h in handles]
    assert len(handles) == 40 and len(set(nonces)) == 40 and all(0 <= n < 2**48 for n in nonces)


def test_progress_left_past_a_queues_end_by_a_cut_short_deletion_goes_at_start(tmp_path: Path) -> None:
    """A topic deletion killed after its tombstone but before the removal of its groups' progress
    reached the disk: at the next start that progress is past its (now empty) queue's end. Before,
    it stayed, and once the topic was created again and grew past it the group read from the old
    position: 30 of 80 new messages."""
    sub = Subscription(TOPIC, "TAG", "*")
    broker = make_broker(tmp_path / "data", default_queue_nums=1)
    for _ in range(50):
        send(broker)
    assert len(drain(broker, "g", sub)) == 50
    broker.consumers.save()
    broker.store.delete_topic(TOPIC)  # the tombstone, and the crash before anything else
    broker.close()  # (writes the progress as it was: as the crash would have left it)

    broker = make_broker(tmp_path / "data", default_queue_nums=1)
    try:
        for _ in range(80):
            send(broker)
        assert len(drain(broker, "g", sub)) == 80
    finally:
        broker.close()


@given(
    st.text(min_size=1, max_size=20),
    st.integers(0, 1 << 20),
    st.integers(0, 1 << 40),
    st.integers(0, (1 << 48) - 1),
)
def test_a_receipt_handle_is_read_only_as_it_is_written(
    topic: str, qid: int, offset: int, nonce: int
) -> None:
    """Before, int() read other spellings of one handle too (a sign, spaces, "_", "0x", leading
    zeros, upper-case hex): one delivery had many handles, and a forged spelling acked it."""
    from siftmq.broker.receipts import encode_handle

    handle = encode_handle(topic, qid, offset, nonce)
    assert ReceiptHandle.decode(handle) == ReceiptHandle(topic, qid, offset, nonce)
    v, q, o, n, t = handle.split(":", 4)
    for other in (f"+{q}", f" {q}", f"0{q}", f"{q}_0" if len(q) > 1 else f"0x{q}"):
        with pytest.raises(BadRequestError, match="malformed receipt handle"):
            ReceiptHandle.decode(":".join((v, other, o, n, t)))
    for other in (f"0x{n}", n.upper() if n.upper() != n else f"0{n}", f"0{n}"):
        with pytest.raises(BadRequestError, match="malformed receipt handle"):
            ReceiptHandle.decode(":".join((v, q, o, other, t)))


def test_a_property_of_thousands_of_digits_does_not_stop_a_sql92_group(broker: Broker) -> None:
    """Python's int() refuses 4,300 digits and more: the ValueError failed every receive of the
    queue, the messages before and after the poison one included, for good."""
    sub = Subscription(TOPIC, "SQL92", "a > 1")
    broker.receive("g", sub, batch_size=1, invisible_ms=60_000)  # registered before the sends
    send(broker, a="5", n="before")
    send(broker, a="9" * 5_000, n="poison")
    send(broker, a="0" * 5_000 + "7", n="leading zeros")
    send(broker, a="6", n="after")
    assert [props["n"] for _, props, _ in drain(broker, "g", sub)] == ["before", "leading zeros", "after"]


def test_a_topic_without_read_permission_refuses_receives_and_pulls(broker: Broker) -> None:
    broker.send_many([ProducedMessage(topic=TOPIC, body=b"x", message_id="01PERM")])
    broker.topics.update(TOPIC, perm=PERM_WRITE)
    sub = Subscription(TOPIC, "TAG", "*")
    calls = [
        lambda: broker.receive("g-perm", sub),
        lambda: broker.try_receive("g-perm", sub),
        lambda: broker.pull("g-perm", sub, 0, 0, 8),
    ]
    for call in calls:
        with pytest.raises(BadRequestError) as refused:
            call()
        assert refused.value.status == StatusCode.FORBIDDEN and "not readable" in str(refused.value)
