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
from siftmq.errors import ConfigError, FilterSyntaxError, RemoteError
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
        # broadcasting mode keeps offsets in a local file, found again by a restarted consumer
        # (a new client id), kept apart from another topic's of the same group
        offsets = tmp_path / "offsets"
        d = PullConsumer(broker.endpoint, "solo", "PullTopic", mode="BROADCASTING", offset_dir=offsets)
        await d.start()
        try:
            first = [m for _ in range(4) for m in await d.poll(32)]
            assert len(first) == 64
            await d.commit()
            assert [p.name for p in offsets.iterdir()] == ["solo@PullTopic@DEFAULT.json"]
        finally:
            await d.stop()
        await _produce(broker.endpoint, "OtherTopic", 16)
        for topic, left in (("PullTopic", 0), ("OtherTopic", 16)):
            e = PullConsumer(broker.endpoint, "solo", topic, mode="BROADCASTING", offset_dir=offsets)
            await e.start()
            try:
                assert len([m for _ in range(2) for m in await e.poll(32)]) == left
                await e.commit()
            finally:
                await e.stop()
        (offsets / "solo@PullTopic@DEFAULT.json").write_text("{")  # damaged: refused by name
        with pytest.raises(ConfigError, match=r"solo@PullTopic@DEFAULT\.json is damaged"):
            PullConsumer(broker.endpoint, "solo", "PullTopic", mode="BROADCASTING", offset_dir=offsets)

    run(scenario())


def test_a_member_without_a_queue_waits_out_its_poll_timeout(start_broker: Any) -> None:
    """Nine members, eight queues: the one without a queue waits its poll's timeout (letting other
    tasks run) instead of answering at once, again and again."""
    broker = start_broker()

    async def scenario() -> None:
        await _produce(broker.endpoint, "SpareTopic", 8)
        members = [
            PullConsumer(broker.endpoint, "spare", "SpareTopic", client_id=f"m{i:02d}") for i in range(9)
        ]
        for member in members:
            await member.start()
        try:
            assignments = [await member.assignment() for member in members]
            idle = members[assignments.index([])]
            ticks = [0]

            async def ticker() -> None:
                while True:
                    await asyncio.sleep(0.01)
                    ticks[0] += 1

            ticking = asyncio.create_task(ticker())
            loop = asyncio.get_running_loop()
            started = loop.time()
            assert await idle.poll(32, timeout=1.0) == []
            assert loop.time() - started >= 0.9 and ticks[0] >= 20
            ticking.cancel()
        finally:
            for member in members:
                await member.stop()

    run(scenario())


def test_polls_serve_every_queue_in_turn(start_broker: Any) -> None:
    """Every queue has a backlog buffered: successive polls take from each in turn, so a backlog
    on the first queues (kept full by the prefetch) does not hold back the others."""
    broker = start_broker()

    async def scenario() -> None:
        async with Producer(broker.endpoint) as producer:
            for _ in range(8):  # one request per queue (the broker turns to the next queue per request)
                await producer.send_many([producer.message("TurnTopic", b"x") for _ in range(600)])
        async with PullConsumer(broker.endpoint, "turns", "TurnTopic") as consumer:
            for _ in range(20):  # the prefetch fills every queue's buffer
                await consumer.poll(1, timeout=0.5)
                await asyncio.sleep(0.02)
            served: set[int] = set()
            for _ in range(16):
                served |= {m.queue_id for m in await consumer.poll(32, timeout=0.5)}
            assert served == set(range(8))

    run(scenario())


def test_push_consumer_retries_a_failed_message(start_broker: Any, caplog: pytest.LogCaptureFixture) -> None:
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
        assert not consumer._to_ack  # the acker sent every acknowledgement before stopping
        assert not [r for r in caplog.records if "acknowledging" in r.getMessage()]

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


def test_a_blocking_call_given_up_on_is_cancelled_and_skips_nothing(start_broker: Any) -> None:
    """A poll that outlives the wrapper's timeout raises TimeoutError and is cancelled with it: it
    does not go on taking messages for nobody (which the next commit would skip for good)."""
    import concurrent.futures

    from siftmq.client import blocking

    broker = start_broker()
    with blocking.Producer(broker.endpoint) as producer:
        producer.send("GiveUp", b"first")
    with blocking.PullConsumer(broker.endpoint, "giveup", "GiveUp", timeout=1.0) as consumer:
        assert [m.body for m in consumer.poll(32, timeout=0.2)] == [b"first"]
        with pytest.raises((TimeoutError, concurrent.futures.TimeoutError)):
            consumer.poll(32, timeout=3.0)  # waits past the wrapper's 1 s
        with blocking.Producer(broker.endpoint) as producer:
            producer.send_many([producer.message("GiveUp", b"%d" % i) for i in range(10)])
        got: list[bytes] = []
        for _ in range(20):
            got += [m.body for m in consumer.poll(32, timeout=0.2)]
            if len(got) == 10:
                break
        assert sorted(got, key=int) == [b"%d" % i for i in range(10)]
        consumer.commit()
        consumer.seek(0, 0)  # a plain method, run on the loop's thread like the rest
    with blocking.PullConsumer(broker.endpoint, "giveup", "GiveUp", timeout=5.0) as again:
        assert again.poll(32, timeout=0.5) == []  # all were delivered and committed


def _fields(m: ReceivedMessage) -> tuple[Any, ...]:
    """What a delivery must carry whichever way it travelled (not its per-delivery receipt handle)."""
    return (m.topic, m.body, m.message_id, m.tag, m.keys, dict(m.properties), m.queue_id, m.queue_offset,
            m.delivery_attempt, m.born_timestamp_ms, m.store_timestamp_ms)  # fmt: skip


def test_batch_extension_and_standard_frames_deliver_the_same(start_broker: Any) -> None:
    broker = start_broker()
    expr = FilterExpression.sql92("price >= 200")

    async def pulled(group: str, *, batch: bool) -> list[ReceivedMessage]:
        async with PullConsumer(broker.endpoint, group, "ExtTopic", expr) as c:
            if not batch:
                c.connection.batch_extension = False  # as against a broker without the extension
            got = [m for _ in range(4) for m in await c.poll(64)]
            assert c.connection.batch_extension is batch
            return got

    async def received(group: str, *, batch: bool) -> list[ReceivedMessage]:
        async with SimpleConsumer(broker.endpoint, group, {"ExtTopic": expr}, await_duration=1) as c:
            if not batch:
                c.connection.batch_extension = False
            got: list[ReceivedMessage] = []
            while batch_got := await c.receive(16, 30):
                got += batch_got
                await c.ack_many(batch_got)
            assert c.connection.batch_extension is batch
            return got

    async def scenario() -> None:
        await _produce(broker.endpoint, "ExtTopic", 48)
        one_frame = await pulled("ext-pull-a", batch=True)
        frames = await pulled("ext-pull-b", batch=False)
        assert sorted(int(m.properties["i"]) for m in one_frame) == list(range(20, 48))
        assert sorted(map(_fields, one_frame)) == sorted(map(_fields, frames))
        one_frame = await received("ext-recv-a", batch=True)
        frames = await received("ext-recv-b", batch=False)
        assert sorted(int(m.properties["i"]) for m in one_frame) == list(range(20, 48))
        assert sorted(map(_fields, one_frame)) == sorted(map(_fields, frames))
        assert all(m.receipt_handle for m in one_frame + frames)

    run(scenario())


def test_client_falls_back_when_the_broker_has_no_batch_extension(start_broker: Any) -> None:
    broker = start_broker(config={"batch_extension": False})

    async def scenario() -> None:
        await _produce(broker.endpoint, "NoExtTopic", 16)
        async with PullConsumer(
            broker.endpoint, "noext-pull", "NoExtTopic", FilterExpression.tag("Pay")
        ) as c:
            got = [m for _ in range(3) for m in await c.poll(32)]
            assert c.connection.batch_extension is False
        assert sorted(int(m.properties["i"]) for m in got) == [0, 4, 8, 12]
        subs = {"NoExtTopic": FilterExpression.tag("Pay")}
        async with SimpleConsumer(broker.endpoint, "noext-recv", subs, await_duration=1) as s:
            got = await s.receive(16, 30)
            assert s.connection.batch_extension is False
            await s.ack_many(got[:2])
            with pytest.raises(RemoteError) as twice:  # handles are single-use: 2 of 4 fail, 2 succeed
                await s.ack_many(got)
            assert twice.value.status == "INVALID_RECEIPT_HANDLE" and "2 of 4" in str(twice.value)
            with pytest.raises(RemoteError):  # the other two were acknowledged all the same
                await s.ack_many(got[2:])
        assert sorted(int(m.properties["i"]) for m in got) == [0, 4, 8, 12]

    run(scenario())


async def _spread(endpoint: str, topic: str) -> None:
    """80 messages (property i = 0..79), 10 on each of 8 queues: one queue per request."""
    async with Producer(endpoint) as producer:
        for first in range(0, 80, 10):
            await producer.send_many(
                [producer.message(topic, b"x", properties={"i": str(i)}) for i in range(first, first + 10)]
            )


def test_poll_buffers_and_commit_resumes_at_the_first_unreturned_message(
    start_broker: Any, tmp_path: Path
) -> None:
    broker = start_broker()

    async def drain(c: PullConsumer, want: int, size: int) -> list[int]:
        got: list[int] = []
        for _ in range(50):  # the broker dispatches sends to the queues in the background
            got += [int(m.properties["i"]) for m in await c.poll(min(size, want - len(got)), timeout=0.2)]
            if len(got) >= want:
                break
        return got

    async def scenario() -> None:
        await _spread(broker.endpoint, "BufTopic")
        for mode, group in ((None, "buffered"), ("BROADCASTING", "buffered-bc")):
            first = PullConsumer(broker.endpoint, group, "BufTopic", mode=mode, offset_dir=tmp_path)
            await first.start()
            try:
                head = await drain(first, 15, 5)  # each poll pulls every queue: most stay buffered
                assert len(head) == 15 and len(set(head)) == 15
                await first.commit()
            finally:
                await first.stop()
            again = PullConsumer(
                broker.endpoint, group, "BufTopic", mode=mode, offset_dir=tmp_path,
                client_id=first.connection.client_id,
            )  # fmt: skip
            await again.start()
            try:
                rest = await drain(again, 65, 64)
            finally:
                await again.stop()
            assert sorted(head + rest) == list(range(80)), mode  # nothing skipped, nothing twice

    run(scenario())


def test_prefetch_stays_within_its_bounds_and_delivers_in_order(start_broker: Any) -> None:
    broker = start_broker()

    async def scenario() -> None:
        async with Producer(broker.endpoint) as producer:
            for _ in range(8):  # 50 messages on each queue (one queue per request)
                await producer.send_many(
                    [producer.message("AheadTopic", b"x" * 10, properties={"i": str(i)}) for i in range(50)]
                )
        for group, bound, size, limit in (("by-count", 12, 5, 12 + 5), ("by-bytes", 1000, 5, 5)):
            async with PullConsumer(broker.endpoint, group, "AheadTopic") as c:
                c.prefetch_messages = bound
                c.prefetch_bytes = 1 if group == "by-bytes" else 1 << 20
                c.pull_batch_size = size
                got: dict[int, list[int]] = {}
                for _ in range(400):
                    for m in await c.poll(3, timeout=0.2):
                        got.setdefault(m.queue_id, []).append(m.queue_offset)
                    assert max(map(len, c._buffered.values()), default=0) <= limit
                    if sum(map(len, got.values())) >= 400:
                        break
                    await asyncio.sleep(0.01)  # let the prefetches in flight answer
                assert got == {q: list(range(50)) for q in range(8)}
                assert set(c._buffered_bytes.values()) <= {0}

    run(scenario())


def test_seek_drops_what_was_prefetched(start_broker: Any) -> None:
    broker = start_broker()

    async def scenario() -> None:
        await _spread(broker.endpoint, "SeekTopic")
        async with PullConsumer(broker.endpoint, "seekers", "SeekTopic") as c:
            seen: list[int] = []
            for _ in range(50):
                seen += [int(m.properties["i"]) for m in await c.poll(3, timeout=0.2)]
                if len(seen) >= 12:
                    break
            assert len(seen) >= 12 and len(set(seen)) == len(seen)
            for qid in await c.assignment():  # pulls of every queue are in flight or buffered now
                c.seek(qid, 0)
            again: list[int] = []
            for _ in range(50):
                again += [int(m.properties["i"]) for m in await c.poll(7, timeout=0.2)]
                if len(again) >= 80:
                    break
            assert sorted(again) == list(range(80))  # from the start again, each exactly once

    run(scenario())
