"""Switching a group's message model carries its position, on a real broker.

Before, a switch left the new mode's progress to the rule for a new group: clustering ->
broadcasting replayed every acknowledged message (5 of 5 in the reviewer's run) or, after retention,
skipped the unconsumed ones (10 of 10); broadcasting -> clustering started the group from offset 0.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx
import pytest

from siftmq.client import FilterExpression, Producer, SimpleConsumer

pytestmark = pytest.mark.integration

TOPIC = "Switched"
QUICK = {"client_session_expire_s": 2.0}


def _setup(broker: Any) -> None:
    answer = httpx.post(f"{broker.admin_url}/topics", json={"name": TOPIC, "queue_nums": 1}, timeout=10)
    assert answer.status_code == 201, answer.text


def _send(endpoint: str, bodies: list[bytes]) -> None:
    async def go() -> None:
        async with Producer(endpoint) as producer:
            await producer.send_many([producer.message(TOPIC, b) for b in bodies])

    asyncio.run(go())


def _drain(endpoint: str, group: str, *, mode: str | None = None, limit: int = 1000) -> list[bytes]:
    """Receive and acknowledge as one member of ``group`` until a receive comes back empty."""

    async def go() -> list[bytes]:
        got: list[bytes] = []
        async with SimpleConsumer(
            endpoint, group, {TOPIC: FilterExpression.tag()}, mode=mode, await_duration=1
        ) as consumer:
            while len(got) < limit:
                batch = await consumer.receive(min(16, limit - len(got)), 30)
                if not batch:
                    break
                for m in batch:
                    await consumer.ack(m)
                got += [m.body for m in batch]
        return got

    return asyncio.run(go())


def _switch(broker: Any, group: str, mode: str) -> None:
    """PATCH the group's mode once its members are gone (a switch is refused while one is live)."""
    deadline = time.monotonic() + 15
    while True:
        answer = httpx.patch(f"{broker.admin_url}/groups/{group}", json={"mode": mode}, timeout=10)
        if answer.status_code != 409 or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert answer.status_code == 200, answer.text


def _mode(broker: Any, group: str) -> str:
    return str(httpx.get(f"{broker.admin_url}/groups/{group}", timeout=10).json()["mode"])


def _bodies(prefix: str, n: int, first: int = 0) -> list[bytes]:
    return [f"{prefix}{i}".encode() for i in range(first, first + n)]


@pytest.mark.parametrize("how", ["admin", "declared"])
def test_clustering_to_broadcasting_neither_replays_nor_skips(start_broker: Any, how: str) -> None:
    broker = start_broker(config=QUICK)
    _setup(broker)
    _send(broker.endpoint, _bodies("old", 5))
    assert len(_drain(broker.endpoint, "g")) == 5  # clustering, acknowledged
    _send(broker.endpoint, _bodies("new", 3))
    if how == "admin":
        _switch(broker, "g", "broadcasting")
        mode = None
    else:  # the first broadcasting member declares the model itself
        time.sleep(2.5)  # the clustering member's session is over
        mode = "BROADCASTING"
    for _member in range(2):  # each member: the unconsumed messages, none acknowledged before
        assert _drain(broker.endpoint, "g", mode=mode) == _bodies("new", 3)
    assert _mode(broker, "g") == "broadcasting"
    assert "Traceback" not in broker.log()


def test_clustering_to_broadcasting_after_retention_skips_nothing(start_broker: Any) -> None:
    config = {**QUICK, "commit_log_segment_size": 131072, "max_body_size": 4096,
              "retention_hours": 0.0005, "retention_check_interval_s": 0.5}  # fmt: skip
    broker = start_broker(config=config)
    _setup(broker)
    _send(broker.endpoint, [b"o%03d" % i + b"x" * 2000 for i in range(100)])  # two segments and more
    assert len(_drain(broker.endpoint, "g")) == 100
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:  # retention removes the consumed segments
        queue = httpx.get(f"{broker.admin_url}/topics/{TOPIC}", timeout=10).json()["queues"][0]
        if queue["min_offset"] > 0:
            break
        time.sleep(0.5)
    assert queue["min_offset"] > 0, queue
    _send(broker.endpoint, _bodies("new", 10))
    _switch(broker, "g", "broadcasting")
    assert _drain(broker.endpoint, "g") == _bodies("new", 10)


def test_broadcasting_to_clustering_starts_at_the_slowest_member(start_broker: Any) -> None:
    broker = start_broker(config=QUICK)
    _setup(broker)
    _switch(broker, "b", "broadcasting")
    _send(broker.endpoint, _bodies("m", 10))
    assert len(_drain(broker.endpoint, "b")) == 10  # one member read everything
    assert len(_drain(broker.endpoint, "b", limit=4)) == 4  # another only the first 4
    _send(broker.endpoint, _bodies("m", 2, first=10))
    _switch(broker, "b", "clustering")
    # the slow member's 6 unread and the 2 new ones; nothing before (both members had those)
    assert _drain(broker.endpoint, "b") == _bodies("m", 8, first=4)
    # and back: every new member starts where the group is
    _send(broker.endpoint, _bodies("z", 1))
    _switch(broker, "b", "broadcasting")
    assert _drain(broker.endpoint, "b") == [b"z0"]
    assert "Traceback" not in broker.log()
