"""Consumer progress edited by hand (still valid JSON) is caught by its checksum: the broker says so
and falls back to the previous generation, so messages may come again but none is skipped."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import httpx
import pytest

from client_helpers import drain
from siftmq.client import FilterExpression, Producer, SimpleConsumer
from store_helpers import flip_byte

pytestmark = pytest.mark.integration

TOPIC = "Tamper"


async def _send(endpoint: str, n: int) -> list[str]:
    async with Producer(endpoint) as producer:
        receipts = await producer.send_many([producer.message(TOPIC, b"%d" % i, tag="t") for i in range(n)])
    return [r.message_id for r in receipts]


async def _consume(endpoint: str, limit: int | None) -> list[str]:
    got: list[str] = []
    sub = {TOPIC: FilterExpression.tag("*")}
    async with SimpleConsumer(endpoint, "tampered", sub, await_duration=0.5) as consumer:
        while limit is None or len(got) < limit:
            messages = await consumer.receive(1 if limit is not None else 16, invisible_duration=60)
            if not messages:
                break
            for m in messages:
                got.append(m.message_id)
                await consumer.ack(m)
    return got


def test_edited_progress_delivers_again_and_never_skips(start_broker: Any) -> None:
    broker = start_broker("data", config={"default_queue_nums": 1})
    sent = asyncio.run(_send(broker.endpoint, 20))
    consumed = asyncio.run(_consume(broker.endpoint, 5))
    time.sleep(1.5)  # progress is written every second: the stop below writes a second generation
    consumed += asyncio.run(_consume(broker.endpoint, 5))
    assert consumed == sent[:10]
    assert broker.stop() == 0

    state = broker.data_dir / "config" / "consumer_state.json"
    content = json.loads(state.read_bytes())
    for item in content["data"].values():  # "progress" jumps past messages nobody received
        item["pop"], item["inflight"] = 19, []
    state.write_text(json.dumps(content))

    again = start_broker("data", config={"default_queue_nums": 1})
    delivered = asyncio.run(_consume(again.endpoint, None))
    assert set(sent[10:]) <= set(delivered)  # none skipped; some of the first ten may come again
    assert "consumer_state.json does not match its checksum" in again.log()


def test_edited_progress_without_a_good_generation_stops_the_broker(start_broker: Any) -> None:
    broker = start_broker("data", config={"default_queue_nums": 1})
    asyncio.run(_send(broker.endpoint, 4))
    asyncio.run(_consume(broker.endpoint, 2))
    assert broker.stop() == 0
    config = broker.data_dir / "config"
    for state in (config / "consumer_state.json", config / "consumer_state.json.prev"):
        if state.exists():
            content = json.loads(state.read_bytes())
            for item in content["data"].values():
                item["pop"] = 3
            state.write_text(json.dumps(content))
    with pytest.raises(RuntimeError) as refused:
        start_broker("data", config={"default_queue_nums": 1})
    assert "consumer_state.json" in str(refused.value) and "restore it from a backup" in str(refused.value)


async def _send_batches(endpoint: str, topic: str, batches: int) -> list[str]:
    """``batches`` batches of 5: each batch goes to the next queue, so every queue gets messages."""
    ids: list[str] = []
    async with Producer(endpoint) as producer:
        for b in range(batches):
            messages = [producer.message(topic, b"%d-%d" % (b, i), tag="t") for i in range(5)]
            ids += [r.message_id for r in await producer.send_many(messages)]
    return ids


async def _drain_all(endpoint: str, group: str, topic: str) -> set[str]:
    got: set[str] = set()
    while batch := await drain(endpoint, group, topic):  # until a receive finds nothing twice over
        got |= {m.message_id for m in batch}
    return got


@pytest.mark.parametrize("how", ["grown", "created"])
def test_a_damaged_topic_table_hides_no_queue_of_acknowledged_messages(start_broker: Any, how: str) -> None:
    """Topics.json damaged: the broker reads an older generation (the topic before it grew) or the
    defaults (no topic); the queues the store holds bring the topic's queue count back."""
    config = {"default_queue_nums": 2}
    broker = start_broker("data", config=config)
    admin = broker.admin_url
    if how == "grown":
        sent = asyncio.run(_send_batches(broker.endpoint, "W", 2))  # created with 2 queues
        assert httpx.patch(f"{admin}/topics/W", json={"queue_nums": 4}).status_code == 200
    else:
        assert httpx.post(f"{admin}/topics", json={"name": "W", "queue_nums": 4}).status_code == 201
        sent = []
    sent += asyncio.run(_send_batches(broker.endpoint, "W", 8))
    assert broker.stop() == 0
    topics = broker.data_dir / "config" / "topics.json"
    flip_byte(topics, topics.stat().st_size // 2, 0x01)

    again = start_broker("data", config=config)
    assert asyncio.run(_drain_all(again.endpoint, "G", "W")) == set(sent)
    assert httpx.get(f"{again.admin_url}/topics/W").json()["queue_nums"] == 4
    missing = "gives topic W 2 queue(s)" if how == "grown" else "has no topic W"
    assert f"topics.json {missing}, but the store holds its queues up to queue 3" in again.log()
    assert again.stop() == 0
    # the corrected table was written: the next start reads it as it is
    third = start_broker("data", config=config)
    assert httpx.get(f"{third.admin_url}/topics/W").json()["queue_nums"] == 4
    assert "topics.json" not in third.log()


def test_a_topic_deleted_since_the_older_generation_of_the_table_stays_deleted(start_broker: Any) -> None:
    """The older generation a damaged topics.json falls back to can hold a topic deleted since:
    its tombstone keeps it deleted. A topic deleted and created again keeps its new messages."""
    broker = start_broker("data", config={"default_queue_nums": 2})
    admin = broker.admin_url
    asyncio.run(_send_batches(broker.endpoint, "Again", 2))
    assert httpx.delete(f"{admin}/topics/Again").status_code == 204
    assert httpx.post(f"{admin}/topics", json={"name": "Again", "queue_nums": 3}).status_code == 201
    kept = asyncio.run(_send_batches(broker.endpoint, "Again", 3))
    asyncio.run(_send_batches(broker.endpoint, "Gone", 2))
    assert httpx.delete(f"{admin}/topics/Gone").status_code == 204  # topics.json.prev still has it
    assert broker.stop() == 0
    topics = broker.data_dir / "config" / "topics.json"
    flip_byte(topics, topics.stat().st_size // 2, 0x01)

    again = start_broker("data", config={"default_queue_nums": 2})
    assert httpx.get(f"{again.admin_url}/topics/Gone").status_code == 404
    assert httpx.get(f"{again.admin_url}/topics/Again").json()["queue_nums"] == 3
    assert asyncio.run(_drain_all(again.endpoint, "G", "Again")) == set(kept)
    assert "older generation that has topic Gone, which was deleted since" in again.log()
