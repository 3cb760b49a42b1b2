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

import httpx
import pytest

from client_helpers import drain
from siftmq.client import Producer
from siftmq.errors import RemoteError

pytestmark = [pytest.mark.integration, pytest.mark.slow]

TOPIC = "Fill"
BODY = 32 * 1024
BALLAST = 6 * 1024 * 1024
#: the broker's own disk guard off: the OS's ENOSPC is what refuses
GUARD_OFF = {
    "commit_log_segment_size": 8 * 1024 * 1024,
    "disk_high_water_ratio": 1.0,
    "disk_reserve_bytes": 0,
}


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


def _fill_but(directory: Path, left: int) -> Path:
    """A file that takes all but ``left`` bytes of what the file system has free."""
    ballast = directory / "everything"
    stat = os.statvfs(directory)
    fd = os.open(ballast, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        os.posix_fallocate(fd, 0, stat.f_bavail * stat.f_frsize - left)
    finally:
        os.close(fd)
    return ballast


def _patch(url: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    answer = httpx.patch(url, json=body, timeout=10)
    return answer.status_code, answer.json()


def test_when_the_os_itself_says_the_disk_is_full(start_broker: Any, small_disk: Path) -> None:
    """With the broker's own guard off (high water 100 %, no reserve), the OS's ENOSPC reaches the
    index, the state files and a topic change. Before: every receive failed INTERNAL_ERROR with
    OS text while the index could not be written; sends got a non-retriable error; a topic grown
    while full was in force though its answer was an error, and its new queues' acknowledged
    messages were not served after a restart."""
    broker = start_broker(
        "disk/data",
        config=GUARD_OFF,
    )
    asyncio.run(_send_n(broker.endpoint, 8))
    assert len(asyncio.run(drain(broker.endpoint, "g", TOPIC))) == 8
    time.sleep(1.2)  # the group's progress is on disk
    ballast = _fill_but(small_disk, 8192)  # below the guard's 100 %: the OS refuses first

    # the commit log's segment is allocated ahead; the queues' index files and the state files
    # need pages the disk no longer has
    acked, refusals = asyncio.run(_send_batches(broker.endpoint, 400))
    assert acked and refusals
    assert all(r.is_retriable and "Errno" not in str(r) for r in refusals), refusals[-1]
    reading = asyncio.run(drain(broker.endpoint, "g", TOPIC))  # reads go on
    assert len(reading) > 0

    topic_url = f"{broker.admin_url}/topics/{TOPIC}"
    code, answer = _patch(topic_url, {"queue_nums": 16})
    assert code == 507 and answer["error"] == "DISK_FULL", answer
    assert len(httpx.get(topic_url, timeout=10).json()["queues"]) == 8  # not in force

    ballast.unlink()
    after = asyncio.run(_send_once_there_is_room(broker.endpoint, 10))
    fresh = [m.message_id for m in asyncio.run(drain(broker.endpoint, "fresh", TOPIC))]
    assert set(acked) | {after} <= set(fresh) and len(fresh) == 8 + len(acked) + 1
    assert {m.message_id for m in reading} <= set(acked)
    log = broker.log()
    assert "Traceback" not in log.split("ready on", 1)[1], log[-3000:]
    assert broker.stop() == 0


async def _send_n(endpoint: str, count: int) -> None:
    async with Producer(endpoint) as producer:
        await producer.send_many([producer.message(TOPIC, b"x" * 1024) for _ in range(count)])


async def _send_batches(endpoint: str, count: int) -> tuple[list[str], list[RemoteError]]:
    """``count`` batches of 16, each on its own: the ids acknowledged and the refusals."""
    acked: list[str] = []
    refusals: list[RemoteError] = []
    async with Producer(endpoint, max_attempts=1) as producer:
        for _ in range(count):
            try:
                receipts = await producer.send_many([producer.message(TOPIC, b"y" * 100) for _ in range(16)])
                acked += [r.message_id for r in receipts]
            except RemoteError as exc:
                refusals.append(exc)
    return acked, refusals


def test_a_store_stopped_cleanly_opens_on_a_full_disk(small_disk: Path) -> None:
    """Before, every open wrote its note of handed-out queue offsets, so a broker could not start
    on a full disk to serve what it holds; now the note is written only when recovery changes a
    queue."""
    from siftmq.errors import DiskFullError
    from siftmq.store import MessageStore
    from store_helpers import msg, small_config

    cfg = small_config(small_disk / "store", disk_reserve_bytes=0, disk_high_water_ratio=1.0)
    with MessageStore.open(cfg) as store:
        for i in range(20):
            store.put_message(msg(body=b"m%d" % i))
    ballast = _fill_but(small_disk, 0)
    try:
        with MessageStore.open(cfg) as store:
            first = store.get_messages("g", "T", 0, 0, 32)
            rest = store.get_messages("g", "T", 0, first.next_begin_offset, 32)
            assert [m.body for m in [*first.messages, *rest.messages]] == [b"m%d" % i for i in range(20)]
            with pytest.raises(DiskFullError):
                store.put_message(msg(body=b"no room"))
    finally:
        ballast.unlink()


def test_retention_makes_room_while_the_progress_file_cannot_be_written(
    start_broker: Any, small_disk: Path
) -> None:
    """Before, the housekeeping saved consumer progress first in one step with retention: on a
    full disk the save failed every pass and retention, which would have made room, never ran."""
    broker = start_broker(
        "disk/data",
        config={
            "commit_log_segment_size": 1024 * 1024,
            "max_body_size": 64 * 1024,
            "retention_hours": 0.0005,  # 1.8 s
            "retention_check_interval_s": 0.5,
            "disk_high_water_ratio": 1.0,
            "disk_reserve_bytes": 0,
        },
    )
    for _ in range(3):  # ~3 segments of 1 KiB messages
        asyncio.run(_send_n(broker.endpoint, 1000))
    segments = broker.data_dir / "store" / "commitlog"
    assert len(list(segments.iterdir())) >= 3
    assert len(asyncio.run(drain(broker.endpoint, "g", TOPIC, limit=8))) == 8  # the group exists
    time.sleep(1.2)
    ballast = _fill_but(small_disk, 0)
    try:
        # acknowledged while full: the group's progress is dirty and cannot be written
        assert len(asyncio.run(drain(broker.endpoint, "g", TOPIC, limit=64))) == 64
        deadline = time.monotonic() + 30
        while len(list(segments.iterdir())) > 1 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert len(list(segments.iterdir())) == 1, "retention did not run"
        assert "retention: deleted" in broker.log()
    finally:
        ballast.unlink()
    assert broker.stop() == 0


def test_a_group_deletion_the_disk_refuses_keeps_the_groups_position(
    start_broker: Any, small_disk: Path
) -> None:
    """Before, the deletion took the group's progress from memory, failed to write it, answered an
    error and left the group in place without a position: its next read started as a new group's
    (from the first message here; from the queue's end once retention has taken that one)."""
    broker = start_broker(
        "disk/data",
        config=GUARD_OFF,
    )
    asyncio.run(_send_n(broker.endpoint, 20))
    first = {m.message_id for m in asyncio.run(drain(broker.endpoint, "g", TOPIC, limit=10))}
    time.sleep(1.2)  # the group's progress is on disk
    ballast = _fill_but(small_disk, 0)
    try:
        answer = httpx.delete(f"{broker.admin_url}/groups/g", timeout=10)
        assert answer.status_code == 507 and answer.json()["error"] == "DISK_FULL", answer.text
    finally:
        ballast.unlink()
    rest = {m.message_id for m in asyncio.run(drain(broker.endpoint, "g", TOPIC))}
    assert len(rest) == 10 and not rest & first  # where it was: none again, none skipped
    assert broker.stop() == 0


def test_a_store_killed_mid_write_opens_on_a_full_disk(
    small_disk: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A kill -9 leaves the unwritten zeros of a segment allocated ahead; recovery drops them, which
    cuts no record. Before, that counted as a cut: recovery wrote its note of handed-out queue
    offsets first, and on a full disk the store could not open. The disk keeps room for the index
    entries the kill left unwritten (how many depends on where it lands: recovery must write them,
    full disk or not), and the note must not be written."""
    import signal
    import subprocess
    import sys

    from siftmq.store import MessageStore, StoreConfig

    data = small_disk / "store"
    writer = Path(__file__).parents[1] / "crash_writer.py"
    proc = subprocess.Popen([sys.executable, str(writer), str(data), "0", "sync"], stdout=subprocess.PIPE)
    assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"
    time.sleep(0.3)
    proc.send_signal(signal.SIGKILL)
    out, _ = proc.communicate()
    acked = [
        line.split()
        for line in out.decode().splitlines()
        if line.startswith("ack ") and len(line.split()) == 7
    ]
    assert acked
    from siftmq.store import recovery

    noted: list[bool] = []
    ensure = recovery._TakenNote.ensure

    def noting(note: recovery._TakenNote) -> None:
        noted.append(True)
        ensure(note)

    monkeypatch.setattr(recovery._TakenNote, "ensure", noting)
    ballast = _fill_but(small_disk, 256 * 1024)
    try:
        cfg = StoreConfig(
            data,
            commit_log_segment_size=256 * 1024,
            max_message_size=16 * 1024,
            consume_queue_entries_per_file=32,
        )
        with MessageStore.open(cfg) as store:
            for fields in acked:
                assert store.look_message_by_offset(int(fields[4])) is not None
        assert not noted  # nothing was cut: no note of handed-out offsets
    finally:
        ballast.unlink()
