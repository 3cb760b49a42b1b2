"""siftmq.client against a real broker process: each client type, TAG and SQL92, batching, groups."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from siftmq.client import (
    FilterExpression,
    Producer,
    PullConsumer,
    PushConsumer,
    ReceivedMessage,
    SimpleConsumer,
)
from siftmq.errors import FilterSyntaxError, RemoteError
from siftmq.hashing import java_string_hash

pytestmark = pytest.mark.integration


def run(coro: Any) -> Any:
    return asyncio.run(coro)


async def _produce(endpoint: str, topic: str, n: int) -> list[str]:
    async with Producer(endpoint) as producer:
        batch = [
            producer.message(
                topic,
                f"m{i}".encode(),
                tag="Pay" if i % 4 == 0 else "Other",
                keys=[f"k{i}"],
                properties={"i": str(i), "price": str(i * 10)},
            )
            for i in range(n)
        ]
        receipts = await producer.send_many(batch)
        again = await producer.send_many(batch)  # a retried batch is stored once
        assert [r.queue_offset for r in again] == [r.queue_offset for r in receipts]
        return [r.message_id for r in receipts]


def test_producer_batches_and_simple_consumers_filter(start_broker: Any) -> None:
    broker = start_broker()

    async def scenario() -> None:
        ids = await _produce(broker.endpoint, "ClientTopic", 40)
        assert len(set(ids)) == 40
        async with Producer(broker.endpoint) as producer:
            single = await producer.send(
                "ClientTopic", b"one more", tag="Pay", properties={"i": "40", "price": "400"}
            )
            assert single.message_id
            with pytest.raises(RemoteError) as bad:
                await producer.send("ClientTopic", b"x", tag="A|B")
            assert bad.value.status == "ILLEGAL_MESSAGE_TAG" and not bad.value.is_retriable
        for group, expr, expected in [
            ("c-pay", FilterExpression.tag("Pay"), {i for i in range(41) if i % 4 == 0}),
            (
                "c-sql",
                FilterExpression.sql92("price > 300 AND TAGS = 'Other'"),
                {i for i in range(41) if i * 10 > 300 and i % 4 != 0},
            ),
        ]:
            async with SimpleConsumer(broker.endpoint, group, {"ClientTopic": expr}, await_duration=1) as c:
                got: set[int] = set()
                for _ in range(10):
                    batch = await c.receive(16, 30)
                    for m in batch:
                        got.add(int(m.properties["i"]))
                        await c.ack(m)
                    if not batch and got:
                        break
                assert got == expected, group

    run(scenario())


def test_filters_are_validated_locally_and_rechecked() -> None:
    with pytest.raises(FilterSyntaxError) as exc:
        FilterExpression.sql92("price > AND x")
    assert "^" in str(exc.value)
    assert java_string_hash("Aa") == java_string_hash("BB")  # a forced tag-hash collision
    collided = ReceivedMessage("T", b"", "id", "BB", (), {}, 0, 0, 1, 0, 0)
    assert not FilterExpression.tag("Aa").matches(collided)
    assert FilterExpression.tag("Aa||BB").matches(collided)


def test_pull_consumers_share_queues_and_commit(start_broker: Any, tmp_path: Path) -> None:
    broker = start_broker()

    async def scenario() -> None:
        await _produce(broker.endpoint, "PullTopic", 64)
        a = PullConsumer(broker.endpoint, "pullers", "PullTopic", FilterExpression.tag("Pay"))
        b = PullConsumer(broker.endpoint, "pullers", "PullTopic", FilterExpression.tag("Pay"))
        await a.start()
        await b.start()
        try:
            qa, qb = await a.assignment(), await b.assignment()
            assert sorted(qa + qb) == list(range(8)) and not set(qa) & set(qb)
            got = [m for c in (a, b) for _ in range(3) for m in await c.poll(32)]
            assert sorted(int(m.properties["i"]) for m in got) == list(range(0, 64, 4))
            await a.commit()
            await b.commit()
        finally:
            await a.stop()
            await b.stop()
        # a new member of the group continues from the committed offsets: nothing left
        c = PullConsumer(broker.endpoint, "pullers", "PullTopic", FilterExpression.tag("Pay"))
        await c.start()
        try:
            assert await c.assignment() == list(range(8))
            assert await c.poll(32) == []
        finally:
            await c.stop()
        # broadcasting mode keeps offsets in a local file
        d = PullConsumer(broker.endpoint, "solo", "PullTopic", mode="BROADCASTING", offset_dir=tmp_path)
        await d.start()
        try:
            first = [m for _ in range(4) for m in await d.poll(32)]
            assert len(first) == 64
            await d.commit()
            assert list(tmp_path.iterdir())
        finally:
            await d.stop()

    run(scenario())


def test_push_consumer_retries_a_failed_message(start_broker: Any) -> None:
    broker = start_broker()

    async def scenario() -> None:
        await _produce(broker.endpoint, "PushTopic", 12)
        seen: dict[str, list[int]] = {}
        done = asyncio.Event()

        def listener(m: ReceivedMessage) -> bool:
            seen.setdefault(m.properties["i"], []).append(m.delivery_attempt)
            if sum(1 for k in seen if int(k) % 4 == 0) == 3 and len(seen["4"]) >= 2:
                done.set()
            return not (m.properties["i"] == "4" and m.delivery_attempt == 1)

        consumer = PushConsumer(
            broker.endpoint,
            "pushers",
            {"PushTopic": FilterExpression.tag("Pay")},
            listener,
            concurrency=2,
            await_duration=1,
        )
        await consumer.start()
        try:
            await asyncio.wait_for(done.wait(), 30)
        finally:
            await consumer.stop()
        assert sorted(seen, key=int) == ["0", "4", "8"]
        assert seen["4"][:2] == [1, 2]

    run(scenario())


def test_produce_and_consume_commands(start_broker: Any) -> None:
    import json
    import subprocess
    import sys

    broker = start_broker()
    base = [sys.executable, "-m", "siftmq"]
    sent = subprocess.run(
        [
            *base,
            "produce",
            "CliTopic",
            "--count",
            "5",
            "--tag",
            "Pay",
            "--prop",
            "price=42",
            "--body",
            "hello {i}",
            "--endpoint",
            broker.endpoint,
        ],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert sent.returncode == 0, sent.stderr
    assert len(sent.stdout.split()) == 5
    got = subprocess.run(
        [
            *base,
            "consume",
            "CliTopic",
            "--sql",
            "price = 42",
            "--count",
            "5",
            "--json",
            "--wait",
            "1",
            "--endpoint",
            broker.endpoint,
        ],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert got.returncode == 0, got.stderr
    records = [json.loads(line) for line in got.stdout.splitlines()]
    assert sorted(r["body"] for r in records) == [f"hello {i}" for i in range(5)]
    bad = subprocess.run(
        [*base, "consume", "CliTopic", "--sql", "price >", "--endpoint", broker.endpoint],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert bad.returncode == 1 and "^" in bad.stderr


def test_blocking_wrapper(start_broker: Any) -> None:
    from siftmq.client import blocking

    broker = start_broker()
    with blocking.Producer(broker.endpoint) as producer:
        receipt = producer.send("BlockTopic", b"hi", tag="Pay")
        assert receipt.message_id
        with pytest.raises(RemoteError):
            producer.send("BlockTopic", b"x", tag="A|B")
    subs = {"BlockTopic": FilterExpression.tag("Pay")}
    with blocking.SimpleConsumer(broker.endpoint, "blocking-g", subs, await_duration=1) as consumer:
        [m] = consumer.receive(16, 30)
        assert m.body == b"hi" and m.message_id == receipt.message_id
        consumer.ack(m)
        assert consumer.receive(16, 30) == []
