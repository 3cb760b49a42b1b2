"""The admin HTTP API, /metrics and ``siftmq admin`` against a real broker process."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

pytest.importorskip("rocketmq")
from rocketmq import ClientConfiguration, Credentials, FilterExpression, Message, Producer, SimpleConsumer

pytestmark = pytest.mark.integration


def _send(endpoint: str, topic: str, n: int) -> list[str]:
    producer = Producer(ClientConfiguration(endpoint, Credentials()), (topic,))
    producer.startup()
    ids = []
    try:
        for i in range(n):
            msg = Message()
            msg.topic = topic
            msg.body = f"m{i}".encode()
            msg.tag = "Pay" if i % 3 == 0 else "Other"
            msg.keys = f"order-{i}"
            ids.append(producer.send(msg).message_id)
    finally:
        producer.shutdown()
    return ids


def admin(*args: str, url: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "siftmq", "admin", *args, "--url", url],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.fixture
def http() -> Iterator[httpx.Client]:
    with httpx.Client(timeout=30) as client:
        yield client


def test_topics_groups_lag_messages_and_metrics(start_broker: Any, http: httpx.Client) -> None:
    broker = start_broker()
    api = http
    api.base_url = httpx.URL(broker.admin_url)
    created = api.post("/topics", json={"name": "AdminTopic", "queue_nums": 4})
    assert created.status_code == 201 and created.json()["queue_nums"] == 4
    assert api.post("/topics", json={"name": "AdminTopic", "queue_nums": 4}).status_code == 400
    assert api.post("/topics", json={"name": "bad name", "queue_nums": 4}).status_code == 400
    assert api.post("/topics", json={"name": "Zero", "queue_nums": 0}).status_code == 422
    ids = _send(broker.endpoint, "AdminTopic", 30)
    topic = api.get("/topics/AdminTopic").json()
    assert topic["messages"] == 30 and sum(q["max_offset"] for q in topic["queues"]) == 30
    assert api.patch("/topics/AdminTopic", json={"queue_nums": 2}).status_code == 400  # never shrink
    assert api.get("/topics/Nope").status_code == 404

    consumer = SimpleConsumer(
        ClientConfiguration(broker.endpoint, Credentials()),
        "admin-g",
        {"AdminTopic": FilterExpression("Pay")},
        1,
    )
    consumer.startup()
    try:
        deadline = time.monotonic() + 15  # the client's settings arrive on its Telemetry stream
        group = api.get("/groups/admin-g").json()
        while not group.get("subscriptions") and time.monotonic() < deadline:
            time.sleep(0.2)
            group = api.get("/groups/admin-g").json()
        [sub] = group["subscriptions"]
        assert (sub["type"], sub["expression"]) == ("TAG", "Pay")
        assert sum(r["lag"] for r in sub["lag"]) == 30
        assert sum(r["matching_lag"] for r in sub["lag"]) == 10  # only the Pay messages count
        assert [c["client_type"] for c in group["clients"]] == ["SIMPLE_CONSUMER"]
        got = 0
        for _ in range(5):
            for m in consumer.receive(16, 10):
                consumer.ack(m)
                got += 1
        assert got == 10
        group = api.get("/groups/admin-g").json()
        [sub] = group["subscriptions"]
        assert sum(r["matching_lag"] for r in sub["lag"]) == 0
        stats = sub["filter_stats"]
        assert stats["matched"] == 10 and stats["skipped_by_tags_code"] == 20
        # a mode switch under live clients is refused; the consistency policy can change
        assert api.patch("/groups/admin-g", json={"mode": "broadcasting"}).status_code == 409
        assert api.patch("/groups/admin-g", json={"consistency": "compat"}).json()["consistency"] == "compat"
        assert api.patch("/groups/admin-g", json={"mode": "sideways"}).status_code == 422
        bad = api.put("/groups/admin-g/subscriptions/AdminTopic", json={"type": "SQL92", "expression": "a >"})
        assert bad.status_code == 400 and "ILLEGAL_FILTER_EXPRESSION" in bad.text
    finally:
        consumer.shutdown()
    assert api.get("/groups/nobody").status_code == 404

    msg = api.get(f"/messages/{ids[3]}").json()
    assert msg["message_id"] == ids[3] and msg["tag"] == "Pay" and msg["keys"] == ["order-3"]
    by_key = api.get("/messages", params={"topic": "AdminTopic", "key": "order-7"}).json()
    assert [m["message_id"] for m in by_key] == [ids[7]]
    at = api.get(f"/topics/AdminTopic/queues/{msg['queue_id']}/messages/{msg['queue_offset']}").json()
    assert at["message_id"] == ids[3]
    assert api.get("/messages/NOPE").status_code == 404

    metrics = api.get("/metrics").text
    assert 'siftmq_messages_sent_total{topic="AdminTopic"} 30.0' in metrics
    assert 'siftmq_filter_work_total{group="admin-g",stage="matched",topic="AdminTopic"} 10.0' in metrics
    assert "siftmq_consumer_lag_matching" in metrics and "siftmq_commit_log_bytes" in metrics

    listed = admin("topics", url=broker.admin_url)
    assert listed.returncode == 0 and "AdminTopic" in listed.stdout
    described = admin("group", "admin-g", url=broker.admin_url)
    assert described.returncode == 0 and "matching_lag" in described.stdout
    missing = admin("topic", "Nope", url=broker.admin_url)
    assert missing.returncode == 1 and "404" in missing.stderr
    unreachable = admin("topics", url="http://127.0.0.1:9")
    assert unreachable.returncode == 1 and "cannot reach" in unreachable.stderr


def test_a_scrape_counts_lags_within_its_budget_the_longest_uncounted_first(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Counting a lag reads up to 200,000 index entries: before, every scrape counted every group's,
    and at 6,300 groups a scrape took 10 s. Now a scrape counts until its budget is spent (at least
    one), the longest-uncounted first, and reports the others as last counted."""
    from siftmq.broker import ProducedMessage
    from siftmq.server import admin_http
    from siftmq.testing import open_broker

    broker = open_broker(tmp_path / "data", default_queue_nums=1)
    try:
        for i in range(5):
            broker.send(ProducedMessage(topic="T", body=b"x", message_id=f"01ID{i:030d}"))
        for group in ("a", "b", "c"):
            broker.groups.set_subscription(group, "T", "TAG", "*")
        monkeypatch.setattr(admin_http, "LAG_BUDGET_S", 0.0)  # one a scrape
        collector = admin_http.BrokerCollector(broker)

        def lags() -> dict[str, float]:
            [family] = [f for f in collector.collect() if f.name == "siftmq_consumer_lag_matching"]
            return {sample.labels["group"]: sample.value for sample in family.samples}

        assert [len(lags()) for _ in range(3)] == [1, 2, 3]
        broker.send(ProducedMessage(topic="T", body=b"x", message_id=f"01ID{9:030d}"))
        assert lags() == {"a": 6, "b": 5, "c": 5}  # "a" was the longest uncounted
        assert lags() == {"a": 6, "b": 6, "c": 5}
    finally:
        broker.close()
