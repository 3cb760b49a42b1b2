"""A disk that fills up: the broker refuses sends with a clear status, deletes nothing that was
acknowledged, keeps serving reads and acks, and takes sends again by itself once there is room.

A real 64 MiB tmpfs under a real broker process, with async and with sync flush. Retention runs
every half second all along: before, the disk-usage rule deleted unconsumed segments here.
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import Any

import pytest

from client_helpers import drain
from siftmq.client import Producer
from siftmq.errors import RemoteError

pytestmark = [pytest.mark.integration, pytest.mark.slow]

TOPIC = "Fill"
BODY = 32 * 1024
BALLAST = 6 * 1024 * 1024


async def _fill(endpoint: str) -> tuple[list[str], RemoteError]:
    """Send batches until the broker refuses one; the ids acknowledged, and the refusal."""
    acked: list[str] = []
    async with Producer(endpoint) as producer:
        for round_no in range(10_000):
            batch = [producer.message(TOPIC, os.urandom(BODY), tag=f"r{round_no}") for _ in range(16)]
            try:
                receipts = await producer.send_many(batch)
            except RemoteError as exc:
                return acked, exc
            acked += [r.message_id for r in receipts]
    raise AssertionError("the disk never filled")


async def _send_once_there_is_room(endpoint: str, deadline_s: float) -> str:
    async with Producer(endpoint) as producer:
        end = time.monotonic() + deadline_s
        while True:
            try:
                return (await producer.send(TOPIC, b"after", tag="after")).message_id
            except RemoteError:
                if time.monotonic() > end:
                    raise
                await asyncio.sleep(0.2)


async def _drain(endpoint: str) -> list[str]:
    return [m.message_id for m in await drain(endpoint, "reader", TOPIC)]


@pytest.mark.parametrize("flush", ["async", "sync"])
def test_a_full_disk_refuses_sends_and_loses_nothing(start_broker: Any, small_disk: Path, flush: str) -> None:
    ballast = small_disk / "ballast"
    ballast.write_bytes(b"\0" * BALLAST)
    broker = start_broker(
        "disk/data",  # on the tmpfs (the fixture mounts it at tmp_path / "disk")
        flush=flush,
        config={
            "commit_log_segment_size": 8 * 1024 * 1024,
            "retention_check_interval_s": 0.5,
            "disk_reserve_bytes": 2 * 1024 * 1024,
        },
    )
    assert broker.data_dir.parent == small_disk

    acked, refusal = asyncio.run(_fill(broker.endpoint))
    assert len(acked) > 500
    assert refusal.status == "INTERNAL_SERVER_ERROR" and refusal.is_retriable
    assert "full" in str(refusal) and str(small_disk) in str(refusal) and "Errno" not in str(refusal)
    time.sleep(1.5)  # retention runs (every 0.5 s) while the disk stays full

    ballast.unlink()  # room again: sends are taken without anyone resetting anything
    after = asyncio.run(_send_once_there_is_room(broker.endpoint, 10))
    delivered = asyncio.run(_drain(broker.endpoint))
    assert sorted(delivered) == sorted([*acked, after])  # every acknowledged message, once

    log = broker.log()
    assert "Traceback" not in log and "Errno" not in log
    assert broker.stop() == 0
