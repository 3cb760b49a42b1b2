"""Deleting a topic: its stored records are dead everywhere, also after a restart or a rebuild."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from siftmq.store import GetMessageStatus, MessageStore
from siftmq.store.bulk import plan_scan, read_range
from store_helpers import msg, small_config


def _bodies(store: MessageStore, topic: str) -> list[bytes]:
    out: list[bytes] = []
    for t, q in store.queues():
        if t != topic:
            continue
        offset = store.get_min_offset_in_queue(t, q)
        while True:
            res = store.get_messages("g", t, q, offset, 64)
            out += [m.body for m in res.messages]
            if res.status is not GetMessageStatus.FOUND:
                break
            offset = res.next_begin_offset
    return sorted(out)


def _offline(store_dir: Path) -> list[tuple[str, bytes]]:
    rows: list[tuple[str, bytes]] = []
    for rng in plan_scan(store_dir).ranges:
        for batch in read_range(rng):
            rows += zip(batch.column("topic").to_pylist(), batch.column("body").to_pylist(), strict=True)
    return sorted(rows)


def test_a_deleted_topic_stays_deleted_and_starts_empty_when_created_again(tmp_path: Path) -> None:
    cfg = small_config(tmp_path)
    with MessageStore.open(cfg) as store:
        old = [
            store.put_message(msg("T", f"old{i}".encode(), queue_id=i % 2, UNIQ_KEY=f"u{i}"))
            for i in range(30)
        ]
        store.put_messages([msg("U", f"keep{i}".encode()) for i in range(5)])
        store.wait_dispatched(10)
        assert store.delete_topic("T") == 2
        assert store.find_consume_queue("T", 0) is None and _bodies(store, "T") == []
        assert store.query_message_by_uniq_key("u3") is None
        assert store.look_message_by_offset(old[3].commit_log_offset) is None
        again = store.put_message(msg("T", b"new", queue_id=0))
        assert again.queue_offset == 0  # a new topic under the old name starts at queue offset 0
        store.wait_dispatched(10)
        assert _bodies(store, "T") == [b"new"]
        assert len(_bodies(store, "U")) == 5
    with MessageStore.open(cfg) as store:  # after a clean restart
        assert _bodies(store, "T") == [b"new"]
    shutil.rmtree(tmp_path / "consumequeue")  # a crash that lost the queues: rebuilt from the log
    (tmp_path / "abort").touch()
    with MessageStore.open(cfg) as store:
        assert _bodies(store, "T") == [b"new"]
        assert len(_bodies(store, "U")) == 5
    offline = _offline(tmp_path)  # the offline jobs' reader skips the dead records too
    assert [b for t, b in offline if t == "T"] == [b"new"] and len(offline) == 6


def test_the_tombstone_goes_once_retention_deleted_every_dead_record(tmp_path: Path) -> None:
    cfg = small_config(tmp_path)
    with MessageStore.open(cfg) as store:
        for _ in range(120):  # several 1 MiB segments
            store.put_message(msg("T", bytes(20_000), queue_id=0))
        store.delete_topic("T")
        for _ in range(60):
            store.put_message(msg("U", bytes(20_000), queue_id=0))
        assert store.tombstones.offset("T") is not None
        store.delete_expired_files(now_ms=1 << 62)
        assert store.tombstones.offset("T") is None


def test_a_flush_meeting_a_queue_its_deletion_destroyed_stops_nothing(tmp_path: Path) -> None:
    """The flush takes the list of queues, then syncs them outside the dispatch lock: a topic
    deleted in between leaves a queue whose files are gone. That is no disk failure (which would
    refuse every append until a later flush succeeded)."""
    with MessageStore.open(small_config(tmp_path)) as store:
        store.put_message(msg("T", b"t", queue_id=0))
        store.put_message(msg("U", b"u", queue_id=0))
        doomed = store._queues[("T", 0)]
        segments = list(doomed.log._segments)  # as the flush of the queue's files had them

        def deleted_meanwhile() -> None:
            store.delete_topic("T")
            for segment in segments:
                segment.flush()

        doomed.log.flush = deleted_meanwhile  # type: ignore[method-assign]
        store.flush()
        assert store.put_message(msg("U", b"after", queue_id=0)).queue_offset == 1


def test_a_deletion_whose_tombstone_cannot_be_written_changes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The delete fails (the tombstone file cannot be written): the topic's records are still
    alive, also those still waiting to be indexed, as the error says."""
    from siftmq.store import tombstones

    with MessageStore.open(small_config(tmp_path)) as store:
        store.put_message(msg("T", b"first", queue_id=0))

        def no_room(*args: object) -> None:
            raise OSError(28, "No space left on device")

        monkeypatch.setattr(tombstones, "write_json", no_room)
        with pytest.raises(OSError):
            store.delete_topic("T")
        monkeypatch.undo()
        assert store.tombstones.offset("T") is None
        store.put_message(msg("T", b"second", queue_id=0))
        assert _bodies(store, "T") == [b"first", b"second"]
