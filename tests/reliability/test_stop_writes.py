"""A stop that cannot write one of the broker's state files still writes the others, and says so
in one line: before, the first file that failed (consumer progress) ended the stop with a
traceback, and the pull offsets committed since the last housekeeping pass were never written, so
their messages were pulled again after the restart."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from client_helpers import drain
from siftmq.client import Producer, PullConsumer

pytestmark = pytest.mark.integration

TOPIC = "Stopping"
#: no housekeeping pass while the test runs: only the stop writes the state files
CONFIG = {"default_queue_nums": 1, "consumer_state_flush_ms": 600_000}


async def _send(endpoint: str, n: int) -> list[bytes]:
    bodies = [b"m%02d" % i for i in range(n)]
    async with Producer(endpoint) as producer:
        await producer.send_many([producer.message(TOPIC, b) for b in bodies])
    return bodies


async def _pull(endpoint: str, limit: int) -> list[bytes]:
    got: list[bytes] = []
    async with PullConsumer(endpoint, "puller", TOPIC) as consumer:
        while len(got) < limit and (batch := await consumer.poll(limit - len(got), timeout=1)):
            got += [m.body for m in batch]
        await consumer.commit()
    return got


def test_a_state_file_that_cannot_be_written_at_stop_leaves_the_others_written(start_broker: Any) -> None:
    broker = start_broker("data", config=CONFIG)
    sent = asyncio.run(_send(broker.endpoint, 20))
    assert len(asyncio.run(drain(broker.endpoint, "receiver", TOPIC, limit=5))) == 5
    assert asyncio.run(_pull(broker.endpoint, 10)) == sent[:10]
    config = broker.data_dir / "config"
    # the progress file's temporary file cannot be created: a directory holds its name
    (config / "consumer_state.json.tmp").mkdir()

    assert broker.stop() != 0
    log = broker.log()
    assert "Traceback" not in log
    assert f"ERROR siftmq.broker.broker: stopping: could not write {config / 'consumer_state.json'}: " in log
    assert f"siftmq broker: stopped, but could not write {config / 'consumer_state.json'} (" in log

    (config / "consumer_state.json.tmp").rmdir()
    again = start_broker("data", config=CONFIG)
    assert asyncio.run(_pull(again.endpoint, 20)) == sent[10:]  # the offsets were written: none again
    assert again.stop() == 0
