"""A disk past its high-water mark or reserve refuses appends, loses nothing, and recovers by itself."""

from __future__ import annotations

from pathlib import Path

import pytest

from siftmq.errors import DiskFullError
from siftmq.store import GetMessageStatus, MessageStore
from siftmq.store.disk import DiskUsage
from store_helpers import msg, small_config

GIB = 1024**3
MIB = 1024**2


class FakeDisk:
    """A file system whose usage the test sets (the store re-reads it at most every 50 ms); free
    space may be less than total minus used, as on a file system keeping blocks for root."""

    def __init__(self) -> None:
        self.used = 0.5
        self.free_bytes: int | None = None
        self.asked: list[str] = []

    def __call__(self, path: str) -> DiskUsage:
        self.asked.append(path)
        used = int(GIB * self.used)
        return DiskUsage(GIB, used, GIB - used if self.free_bytes is None else self.free_bytes)


@pytest.fixture
def disk_store(tmp_path: Path) -> tuple[MessageStore, FakeDisk]:
    disk = FakeDisk()
    store = MessageStore.open(small_config(tmp_path / "data"), disk_usage=disk)
    yield store, disk
    store.close()


def test_appends_are_refused_past_the_high_water_mark(disk_store: tuple[MessageStore, FakeDisk]) -> None:
    store, disk = disk_store
    kept = store.put_message(msg(body=b"before"))
    disk.used = 0.93
    store.disk.state(fresh=True)
    for put in (
        lambda: store.put_message(msg(body=b"refused")),
        lambda: store.put_messages([msg(body=b"a"), msg(body=b"b")]),
    ):
        with pytest.raises(DiskFullError) as exc:
            put()
        assert "93.0% full" in exc.value.message and "90%" in exc.value.message
        assert str(store.data_dir) in exc.value.message
        assert "Errno" not in exc.value.message
        assert exc.value.retriable
    assert store.max_commit_log_offset == kept.commit_log_offset + kept.size  # nothing half-written
    got = store.get_messages("g", "T", 0, 0, 10)  # reads go on
    assert got.status is GetMessageStatus.FOUND and [m.body for m in got.messages] == [b"before"]
    disk.used = 0.5
    store.disk.state(fresh=True)
    assert store.put_message(msg(body=b"after")).queue_offset == 1  # accepted again by itself


def test_appends_are_refused_below_the_reserve(tmp_path: Path) -> None:
    disk = FakeDisk()
    store = MessageStore.open(small_config(tmp_path / "data", disk_reserve_bytes=64 * MIB), disk_usage=disk)
    try:
        disk.free_bytes = 10 * MIB
        store.disk.state(fresh=True)
        with pytest.raises(DiskFullError, match=r"10\.0 MiB free, less than the reserve of 64 MiB"):
            store.put_message(msg(body=b"x"))
    finally:
        store.close()


def test_the_os_refusing_a_write_is_a_disk_full_error(
    disk_store: tuple[MessageStore, FakeDisk], monkeypatch: pytest.MonkeyPatch
) -> None:
    store, _ = disk_store

    def no_space(*args: object, **kwargs: object) -> object:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(store.commit_log, "append", no_space)
    with pytest.raises(DiskFullError) as exc:
        store.put_message(msg(body=b"x"))
    assert "no room for the message" in exc.value.message and "Errno" not in exc.value.message
    assert isinstance(exc.value.__cause__, OSError)


def test_a_full_disk_met_by_the_commit_logs_own_write_is_a_disk_full_error(
    disk_store: tuple[MessageStore, FakeDisk], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The commit log wraps the OS's error in a StoreError; the store still answers DiskFullError
    (retriable, no OS text), not an internal error."""
    from siftmq.store.segment import Segment

    store, _ = disk_store

    def no_space(*args: object, **kwargs: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(Segment, "write", no_space)
    for batch in ([msg(body=b"x")], [msg(body=b"x"), msg(body=b"y")]):
        with pytest.raises(DiskFullError) as exc:
            store.put_messages(batch)
        assert "no room for the message" in exc.value.message and "Errno" not in exc.value.message


@pytest.mark.parametrize(
    ("policy", "says"),
    [("refuse", "nothing stored is deleted"), ("delete_oldest", "the oldest segments are deleted")],
)
def test_a_refusal_says_what_the_disk_policy_does_meanwhile(tmp_path: Path, policy: str, says: str) -> None:
    """Before, a broker deleting its oldest segments to make room said that nothing was deleted."""
    disk = FakeDisk()
    store = MessageStore.open(small_config(tmp_path / "data", disk_full_policy=policy), disk_usage=disk)
    try:
        disk.used = 0.95
        store.disk.state(fresh=True)
        with pytest.raises(DiskFullError, match=says):
            store.put_message(msg(body=b"x"))
    finally:
        store.close()
