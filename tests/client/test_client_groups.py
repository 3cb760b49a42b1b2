"""Consumer groups through siftmq's client classes, against a real broker process.

Clustering: three push consumers, one joining and one leaving while messages keep arriving; every
matching message is consumed at least once and never by two members at the same time. Broadcasting:
every member of the group gets every matching message (push and pull). The message model is a group
property: a member declaring another model than the live members use is refused.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import grpc
import pytest

from siftmq.client import (
    FilterExpression,
    Producer,
    PullConsumer,
    PushConsumer,
    ReceivedMessage,
    SimpleConsumer,
)
from siftmq.errors import RemoteError

pytestmark = pytest.mark.integration

TOPIC = "GroupTopic"


async def _send(endpoint: str, start: int, n: int) -> set[str]:
    """Send messages start..start+n-1 (every third tagged Pay); return the Pay messages' ``i``."""
    async with Producer(endpoint) as producer:
        await producer.send_many(
            [
                producer.message(
                    TOPIC, b"x" * 64, tag="Pay" if i % 3 == 0 else "Other", properties={"i": str(i)}
                )
                for i in range(start, start + n)
            ]
        )
    return {str(i) for i in range(start, start + n) if i % 3 == 0}


class Recorder:
    """Every delivery a member handled: (message ``i``, member, start, end) on the monotonic clock."""

    def __init__(self) -> None:
        self.deliveries: list[tuple[str, str, float, float]] = []

    def listener(self, member: str) -> Any:
        async def handle(m: ReceivedMessage) -> bool:
            began = time.monotonic()
            await asyncio.sleep(0.005)  # some work, so deliveries have a duration to overlap in
            self.deliveries.append((m.properties["i"], member, began, time.monotonic()))
            return True

        return handle

    def consumed(self) -> set[str]:
        return {i for i, *_ in self.deliveries}

    def overlapping(self) -> list[tuple[str, str, str]]:
        """Messages handled by two different members at overlapping times."""
        found = []
        by_message: dict[str, list[tuple[str, float, float]]] = {}
        for i, member, began, ended in self.deliveries:
            by_message.setdefault(i, []).append((member, began, ended))
        for i, runs in by_message.items():
            for x, (ma, a0, a1) in enumerate(runs):
                for mb, b0, b1 in runs[x + 1 :]:
                    if ma != mb and a0 < b1 and b0 < a1:
                        found.append((i, ma, mb))
        return found


async def _until(predicate: Any, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        await asyncio.sleep(0.1)
    return predicate()


def test_clustering_members_join_and_leave_mid_stream(start_broker: Any) -> None:
    broker = start_broker()

    async def scenario() -> None:
        rec = Recorder()
        pay = FilterExpression.tag("Pay")

        def member(name: str) -> PushConsumer:
            return PushConsumer(
                broker.endpoint,
                "cluster-g",
                {TOPIC: pay},
                rec.listener(name),
                concurrency=2,
                await_duration=1,
                mode="CLUSTERING",
            )

        a, b, c = member("a"), member("b"), member("c")
        expected: set[str] = set()
        await a.start()
        await b.start()
        try:
            expected |= await _send(broker.endpoint, 0, 150)
            await _until(lambda: len(rec.consumed()) >= 20, 30)
            await c.start()  # joins mid-stream
            expected |= await _send(broker.endpoint, 150, 150)
            await _until(lambda: len(rec.consumed()) >= 70, 30)
            await a.stop()  # leaves mid-stream: what it held goes back to the group
            expected |= await _send(broker.endpoint, 300, 150)
            done = await _until(lambda: rec.consumed() >= expected, 60)
            assert done, sorted(expected - rec.consumed())[:10]
        finally:
            await b.stop()
            await c.stop()
            if a._workers and not all(w.done() for w in a._workers):
                await a.stop()
        assert rec.consumed() == expected  # only Pay, and every one of them
        assert rec.overlapping() == []
        members = {m for _, m, _, _ in rec.deliveries}
        assert {"a", "b", "c"} <= members, members  # everyone did part of the work

    asyncio.run(scenario())


def test_broadcasting_members_each_get_every_message(start_broker: Any, tmp_path: Path) -> None:
    broker = start_broker()

    async def scenario() -> None:
        pay = FilterExpression.tag("Pay")
        recs = {name: Recorder() for name in "xyz"}
        pushers = [
            PushConsumer(
                broker.endpoint,
                "bcast-g",
                {TOPIC: pay},
                recs[name].listener(name),
                await_duration=1,
                mode="BROADCASTING",
            )
            for name in "xyz"
        ]
        for p in pushers:
            await p.start()
        try:
            # the group now consumes in broadcasting mode: a clustering member is refused
            intruder = PushConsumer(
                broker.endpoint, "bcast-g", {TOPIC: pay}, lambda m: True, mode="CLUSTERING"
            )
            with pytest.raises(RemoteError) as refused:
                await intruder.start()
            assert refused.value.status == "PRECONDITION_FAILED"
            assert "broadcasting" in str(refused.value) and "bcast-g" in str(refused.value)
            await intruder.stop()
            # refused inside ``async with`` (no __aexit__ then): its channel is closed all the same
            refused_too = SimpleConsumer(broker.endpoint, "bcast-g", {TOPIC: pay}, mode="CLUSTERING")
            with pytest.raises(RemoteError):
                async with refused_too:
                    pass
            assert refused_too.connection._channel.get_state() == grpc.ChannelConnectivity.SHUTDOWN
            expected = await _send(broker.endpoint, 0, 90)
            for name, rec in recs.items():
                assert await _until(lambda rec=rec: rec.consumed() >= expected, 30), name
        finally:
            for p in pushers:
                await p.stop()
        for name, rec in recs.items():
            assert rec.consumed() == expected, name
            assert {m for _, m, _, _ in rec.deliveries} == {name}

        # pull consumers in broadcasting mode: each reads every queue, offsets in its own file
        offsets = tmp_path / "offsets"
        pullers = [
            PullConsumer(
                broker.endpoint, "bcast-pull", TOPIC, pay, mode="BROADCASTING", offset_dir=offsets,
                instance_name=f"p{n}",
            )
            for n in range(3)
        ]  # fmt: skip
        for p in pullers:
            await p.start()
        try:
            for p in pullers:
                assert await p.assignment() == list(range(8))
                got = {m.properties["i"] for _ in range(4) for m in await p.poll(64)}
                assert got == expected
                await p.commit()
            assert len(list(offsets.iterdir())) == 3
        finally:
            for p in pullers:
                await p.stop()

    asyncio.run(scenario())
