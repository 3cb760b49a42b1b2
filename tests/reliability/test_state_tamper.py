"""Consumer progress edited by hand (still valid JSON) is caught by its checksum: the broker says so
and falls back to the previous generation, so messages may come again but none is skipped."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest

from siftmq.client import FilterExpression, Producer, SimpleConsumer

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
