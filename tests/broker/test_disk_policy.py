"""Bounds the operator sets. Retention for space is the operator's choice: by default nothing
unexpired is deleted; under ``delete_oldest`` each forced deletion is logged at WARNING with what
each group had not consumed, and counted for ``/metrics``. ``max_topics`` caps the topic table."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from siftmq.broker import ProducedMessage, Subscription
from siftmq.broker import parts as parts_module
from siftmq.broker.receive import DLQ_RETRY_MS
from siftmq.errors import BadRequestError
from siftmq.store.disk import DiskUsage
from siftmq.testing import SteppedClock, open_broker

TOPIC = "Space"
SEGMENT = 1024 * 1024
SMALL = {"commit_log_segment_size": SEGMENT, "max_body_size": 64 * 1024, "disk_max_used_space_ratio": 0.0001}


def _fill(broker: object, n: int) -> None:
    for i in range(n):
        broker.send(  # type: ignore[attr-defined]
            ProducedMessage(topic=TOPIC, body=b"x" * 20_000, message_id=f"01SPACE{i:026d}", tag="t")
        )


def _consume(broker: object, group: str, n: int) -> None:
    sub = Subscription(TOPIC, "TAG", "*")
    done = 0
    while done < n:
        for d in broker.receive(group, sub, batch_size=min(16, n - done), invisible_ms=60_000):  # type: ignore[attr-defined]
            broker.ack(group, TOPIC, d.receipt_handle)  # type: ignore[attr-defined]
            done += 1


def test_the_default_policy_deletes_nothing_unexpired(tmp_path: Path) -> None:
    broker = open_broker(tmp_path / "d", **SMALL)
    try:
        _fill(broker, 200)
        segments = len(broker.store.commit_log.segments())
        assert segments > 2
        broker.apply_retention()  # the disk is "fuller" than 0.01%: the old rule deleted here
        assert len(broker.store.commit_log.segments()) == segments
        assert broker.store.min_commit_log_offset == 0
    finally:
        broker.close()


def test_delete_oldest_reports_what_each_group_loses(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    broker = open_broker(
        tmp_path / "d",
        **SMALL,
        disk_full_policy="delete_oldest",
        default_queue_nums=1,
    )
    try:
        _fill(broker, 200)
        _consume(broker, "early", 150)
        _consume(broker, "late", 10)
        active_start = broker.store.commit_log.segments()[-1].start_offset
        below = broker.store.queue_offset_at(TOPIC, 0, active_start)
        assert 0 < below < 200
        with caplog.at_level(logging.WARNING, logger="siftmq.broker.broker"):
            broker.apply_retention()
        assert broker.store.min_commit_log_offset == active_start
        lost = dict(broker.stats.deleted_unconsumed)
        assert lost.get("late") == below - 10  # counted once, though several segments went
        assert lost.get("early", 0) == max(0, below - 150)
        warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert warnings and all("delete_oldest" in w for w in warnings)
        assert any("late=" in w for w in warnings)
    finally:
        broker.close()


def test_max_topics_refuses_one_more_topic_clearly(tmp_path: Path) -> None:
    broker = open_broker(tmp_path / "d", max_topics=3)
    try:
        for name in ("T1", "T2", "T3"):
            broker.send(ProducedMessage(topic=name, body=b"x", message_id=f"01{name}", tag="t"))
        with pytest.raises(BadRequestError) as refused:
            broker.send(ProducedMessage(topic="T4", body=b"x", message_id="01T4", tag="t"))
        assert refused.value.status == "PRECONDITION_FAILED" and "max_topics" in refused.value.message
        broker.send(
            ProducedMessage(topic="T1", body=b"y", message_id="01T1b", tag="t")
        )  # existing ones go on
    finally:
        broker.close()


def test_a_full_disk_delays_dead_letters_and_keeps_serving_the_rest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = SteppedClock()
    monkeypatch.setattr(parts_module, "time", clock)
    broker = open_broker(tmp_path / "d", max_delivery_attempts=1, default_queue_nums=1)
    try:
        for i in range(3):
            broker.send(ProducedMessage(topic=TOPIC, body=b"%d" % i, message_id=f"01DLQ{i}", tag="t"))
        sub = Subscription(TOPIC, "TAG", "*")
        assert len(broker.receive("g", sub, batch_size=2, invisible_ms=50)) == 2  # never acked
        clock.advance(0.1)
        gib = 1024**3
        full = DiskUsage(100 * gib, 99 * gib, gib)
        broker.store.disk._usage = lambda path: full
        broker.store.disk.state(fresh=True)
        served = broker.receive("g", sub, batch_size=16, invisible_ms=60_000)
        assert [d.message.body for d in served] == [b"2"]  # the two due for the DLQ wait, nothing fails
        broker.store.disk._usage = lambda path: DiskUsage(100 * gib, 10 * gib, 90 * gib)
        broker.store.disk.state(fresh=True)
        clock.advance(DLQ_RETRY_MS / 1000 + 0.1)
        broker.receive("g", sub, batch_size=16, invisible_ms=60_000)
        assert broker.stats.dead_letters["g"] == 2
    finally:
        broker.close()
