"""Retention: whole CommitLog segments by age (and for space only when the operator chose
``delete_oldest``); queue minimum offsets follow. A full disk refuses appends instead."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

from siftmq.store import GetMessageStatus, MessageStore
from siftmq.store.consumequeue import ConsumeQueue
from siftmq.store.consumequeue_ext import ConsumeQueueExt
from store_helpers import msg

Opener = Callable[..., MessageStore]
HOUR_MS = 3600 * 1000


def _fill(store: MessageStore) -> None:
    store.put_messages([msg(body=b"x" * 40_000, queue_id=i % 2, KEYS=f"k{i}") for i in range(100)])


def test_age_based_deletion(open_store: Opener) -> None:
    store = open_store(file_reserved_time_ms=HOUR_MS, consume_queue_entries_per_file=4)
    _fill(store)
    segments = store.commit_log.segments()
    assert len(segments) >= 4
    now = time.time_ns() // 1_000_000
    assert store.delete_expired_files(now_ms=now).commit_log_segments == 0  # all fresh
    old = (now - 2 * HOUR_MS) / 1000
    for seg in segments[:2]:
        os.utime(seg.path, (old, old))
    result = store.delete_expired_files(now_ms=now)
    assert result.commit_log_segments == 2
    assert result.commit_log_min_offset == segments[2].start_offset
    assert result.consume_queue_segments > 0
    for q in (0, 1):
        low = store.get_min_offset_in_queue("T", q)
        res = store.get_messages("g", "T", q, low, 1)
        assert res.status is GetMessageStatus.FOUND
        assert res.messages[0].commit_log_offset >= store.min_commit_log_offset
        assert store.get_messages("g", "T", q, low - 1, 1).status is GetMessageStatus.OFFSET_TOO_SMALL
    assert store.query_messages_by_key("T", "k0") == []
    assert len(store.query_messages_by_key("T", "k99")) == 1


def test_a_full_disk_deletes_nothing_unexpired_by_default(open_store: Opener) -> None:
    store = open_store()
    _fill(store)
    segments = len(store.commit_log.segments())
    result = store.delete_expired_files(disk_usage_ratio=lambda: 0.99)
    assert (result.commit_log_segments, result.forced_segments) == (0, 0)
    assert len(store.commit_log.segments()) == segments
    assert store.get_messages("g", "T", 0, 0, 1).status is GetMessageStatus.FOUND


def test_delete_oldest_policy_keeps_the_active_segment_and_says_what_it_deletes(open_store: Opener) -> None:
    store = open_store(disk_full_policy="delete_oldest")
    _fill(store)
    segments = store.commit_log.segments()
    n = len(segments)
    told: list[tuple[int, int]] = []
    result = store.delete_expired_files(
        disk_usage_ratio=lambda: 0.99, before_forced_delete=lambda start, end: told.append((start, end))
    )
    assert result.commit_log_segments == result.forced_segments == n - 1
    assert told == [(seg.start_offset, seg.start_offset + seg.length) for seg in segments[:-1]]
    assert len(store.commit_log.segments()) == 1
    store.put_message(msg(body=b"after"))
    assert store.delete_expired_files(disk_usage_ratio=lambda: 0.1).commit_log_segments == 0


def test_retention_survives_reopen(open_store: Opener) -> None:
    store = open_store(consume_queue_entries_per_file=4, disk_full_policy="delete_oldest")
    _fill(store)
    store.delete_expired_files(disk_usage_ratio=lambda: 0.99)
    mins = [store.get_min_offset_in_queue("T", q) for q in (0, 1)]
    maxs = [store.get_max_offset_in_queue("T", q) for q in (0, 1)]
    store.close()
    store = open_store(consume_queue_entries_per_file=4, disk_full_policy="delete_oldest")
    assert [store.get_min_offset_in_queue("T", q) for q in (0, 1)] == mins
    assert [store.get_max_offset_in_queue("T", q) for q in (0, 1)] == maxs
    assert store.put_message(msg(body=b"next")).queue_offset == 50


def test_queue_offset_at_counts_a_queue_below_a_log_offset(open_store: Opener) -> None:
    store = open_store()
    _fill(store)
    second = store.commit_log.segments()[1].start_offset
    below = store.queue_offset_at("T", 0, second)
    first_after = store.get_messages("g", "T", 0, below, 1).messages[0]
    assert first_after.commit_log_offset >= second
    assert below == 0 or store.get_messages("g", "T", 0, below - 1, 1).messages[0].commit_log_offset < second
    assert store.queue_offset_at("T", 0, 0) == 0
    assert store.queue_offset_at("T", 0, store.max_commit_log_offset) == store.get_max_offset_in_queue("T", 0)
    assert store.queue_offset_at("nope", 0, second) == 0


def test_retention_keeps_an_extension_that_begins_after_its_queue_aligned(tmp_path: Path) -> None:
    """A queue whose extension units begin later than its entries (they were lost, or left out by
    reindex) deleted the extension's first segment with each of the queue's: the units of messages
    still kept went too, and their filters lost the bitmaps. Only segments below the queue's go."""
    ext = ConsumeQueueExt(tmp_path / "ext", 4, 14, checked=True)
    cq = ConsumeQueue("U", 0, tmp_path / "cq", 4, ext)
    cq.load()
    cq.put_entries(0, [(100 + 10 * i, 10, 0) for i in range(6)], None)  # units left out
    kept = range(6, 14)
    units = [ext.encode(1000 + i, 0, b"\x01") for i in kept]
    cq.put_entries(6, [(1000 + 10 * i, 10, 0) for i in kept], units)
    assert cq.delete_expired(500) == 1  # the records of offsets 0..3 are gone
    assert cq.min_offset == 6
    for i in kept:
        unit = ext.get(i)
        assert unit is not None and unit.store_timestamp == 1000 + i and unit.filter_bitmap == b"\x01"
    assert cq.delete_expired(1080) == 1  # 4..7 gone: the extension's first segment (4..7) with them
    assert ext.log.first_segment_index == 8 and ext.get(8) is not None
