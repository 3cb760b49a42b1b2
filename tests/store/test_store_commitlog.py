"""CommitLog through the store: append, segment roll-over, lookups, flush modes, locking."""

from __future__ import annotations

import errno
import itertools
import os
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from siftmq.errors import (
    ConfigError,
    MessageTooLargeError,
    SiftError,
    StoreClosedError,
    StoreError,
    StoreLockedError,
)
from siftmq.store import MessageStore, bulk, codec, decoding
from siftmq.store.segment import Segment
from store_helpers import msg, small_config

Opener = Callable[..., MessageStore]


def test_append_assigns_offsets_and_reads_back(open_store: Opener) -> None:
    store = open_store()
    r0 = store.put_message(msg(body=b"a", TAGS="A"))
    r1 = store.put_message(msg(body=b"bb", queue_id=1))
    r2 = store.put_message(msg(body=b"ccc", TAGS="A"))
    assert (r0.queue_offset, r1.queue_offset, r2.queue_offset) == (0, 0, 1)
    assert r0.commit_log_offset == 0
    assert r1.commit_log_offset == r0.size
    m = store.look_message_by_offset(r2.commit_log_offset)
    assert m is not None
    assert (m.body, m.queue_offset, m.tags, m.topic) == (b"ccc", 1, "A", "T")
    assert m.offset_msg_id.endswith(f"{r2.commit_log_offset:016X}")
    assert store.get_max_offset_in_queue("T", 0) == 2
    assert store.get_max_offset_in_queue("T", 1) == 1
    assert store.get_max_offset_in_queue("nope", 0) == 0
    assert store.look_message_by_offset(store.max_commit_log_offset) is None


def test_segments_roll_over_with_blank_marker(open_store: Opener, tmp_path: Path) -> None:
    store = open_store()
    body = b"x" * 50_000
    results = [store.put_message(msg(body=body, queue_id=i % 3)) for i in range(60)]
    segments = store.commit_log.segments()
    assert len(segments) >= 3
    names = sorted(p.name for p in (tmp_path / "data" / "commitlog").iterdir())
    assert names[:2] == [f"{0:020d}", f"{1 << 20:020d}"]
    for r in results:  # no record spans two segments
        assert r.commit_log_offset // (1 << 20) == (r.commit_log_offset + r.size - 1) // (1 << 20)
    first = segments[0]
    tail = os.pread(first.fd, 8, first.length - 8)
    total, magic = decoding.peek_header(tail)
    assert magic == codec.BLANK_MAGIC_CODE
    assert first.length - 8 + total == 1 << 20
    for r in results:
        m = store.look_message_by_offset(r.commit_log_offset)
        assert m is not None and m.body == body and m.queue_offset == r.queue_offset
    store.close()
    store = open_store()
    assert store.max_commit_log_offset == results[-1].commit_log_offset + results[-1].size
    assert [store.get_max_offset_in_queue("T", q) for q in range(3)] == [20, 20, 20]


@pytest.mark.parametrize(("stored", "batch"), [(20, 1), (19, 3)])
def test_a_roll_that_cannot_open_the_next_segment_writes_nothing(
    open_store: Opener, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, stored: int, batch: int
) -> None:
    """The segment is nearly full and the next cannot be created (no room for its preallocation):
    the append fails having written nothing, so the same messages sent again are stored once,
    with consecutive queue offsets, also after a restart."""
    store = open_store()
    body = b"x" * 50_000
    for i in range(stored):  # 20 fill the first 1 MiB segment (19: one more fits)
        store.put_message(msg(body=body, UNIQ_KEY=f"m{i}"))
    again = [msg(body=body, UNIQ_KEY=f"m{stored + i}") for i in range(batch)]
    opened = Segment.open

    def no_room(cls: Any, *args: Any, create: bool = False, **kwargs: Any) -> Segment:
        if create:
            raise OSError(errno.ENOSPC, "No space left on device")
        return opened(*args, create=create, **kwargs)

    monkeypatch.setattr(Segment, "open", classmethod(no_room))
    with pytest.raises(SiftError):
        store.put_messages([msg(body=body, UNIQ_KEY=f"m{stored + i}") for i in range(batch)])
    monkeypatch.undo()
    store.put_messages(again)
    store.close()
    logged = [m.properties["UNIQ_KEY"] for m in bulk.iter_records(tmp_path / "data")]
    assert logged == [f"m{i}" for i in range(stored + batch)]  # nothing of the failed append
    store = open_store()
    got: list[Any] = []
    while found := store.get_messages("g", "T", 0, len(got), 64).messages:
        got += found
    assert [m.properties["UNIQ_KEY"] for m in got] == [f"m{i}" for i in range(stored + batch)]
    assert [m.queue_offset for m in got] == list(range(stored + batch))


def test_a_batch_whose_write_fails_after_the_roll_leaves_nothing_in_the_log(
    open_store: Opener, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A batch that does not fit the segment goes whole into the next one: when the write there
    fails (the next segment could not be preallocated and its pwrite meets a full disk), none of
    its records stand in the old segment, where a restart would find them with queue offsets the
    next appends reuse (and the key index would answer the retry as a duplicate of them)."""
    store = open_store()
    body = b"x" * 50_000
    for i in range(17):  # three more fit in the first 1 MiB segment, not five
        store.put_message(msg(body=body, UNIQ_KEY=f"m{i}"))
    written = Segment.write

    def full_disk_past_the_first(self: Segment, data: Any) -> None:
        if self.start_offset > 0 and len(data) > codec.BLANK_MARKER_SIZE:
            raise OSError(errno.ENOSPC, "No space left on device")
        written(self, data)

    monkeypatch.setattr(Segment, "write", full_disk_past_the_first)
    batch = [msg(body=body, UNIQ_KEY=f"b{i}") for i in range(5)]
    with pytest.raises(SiftError):
        store.put_messages(batch)
    monkeypatch.undo()
    store.close()
    logged = [m.properties["UNIQ_KEY"] for m in bulk.iter_records(tmp_path / "data")]
    assert logged == [f"m{i}" for i in range(17)]
    store = open_store()
    assert store.query_message_by_uniq_key("b0") is None  # the retry is not a "duplicate"
    assert [r.queue_offset for r in store.put_messages(batch)] == list(range(17, 22))


def test_lookups_by_uniq_key_and_keys(open_store: Opener) -> None:
    store = open_store()
    for i in range(10):
        store.put_message(msg(body=str(i).encode(), UNIQ_KEY=f"U{i}", KEYS=f"order{i % 3} all"))
    found = store.query_message_by_uniq_key("U7")
    assert found is not None and found.body == b"7"
    assert store.query_message_by_uniq_key("missing") is None
    assert [m.body for m in store.query_messages_by_key("T", "order1")] == [b"1", b"4", b"7"]
    assert len(store.query_messages_by_key("T", "all", max_count=4)) == 4
    assert store.query_messages_by_key("other", "all") == []
    store.close()
    store = open_store()  # the key index is rebuilt at open
    found = store.query_message_by_uniq_key("U3")
    assert found is not None and found.body == b"3"


def test_oversized_and_malformed_messages_change_nothing(open_store: Opener) -> None:
    store = open_store()
    store.put_message(msg(body=b"ok"))
    before = store.max_commit_log_offset
    with pytest.raises(MessageTooLargeError):
        store.put_messages([msg(body=b"ok"), msg(body=b"x" * (64 * 1024 + 1))])
    with pytest.raises(ValueError, match="separator"):
        store.put_message(msg(bad="a\x02b"))
    assert store.max_commit_log_offset == before
    assert store.get_max_offset_in_queue("T", 0) == 1


def test_batch_append_is_contiguous(open_store: Opener) -> None:
    store = open_store()
    results = store.put_messages([msg(body=bytes([i]) * 100, queue_id=i % 2) for i in range(50)])
    assert [r.queue_offset for r in results if r.queue_id == 0] == list(range(25))
    for a, b in itertools.pairwise(results):
        assert b.commit_log_offset in (
            a.commit_log_offset + a.size,
            (a.commit_log_offset // (1 << 20) + 1) << 20,
        )


@pytest.mark.parametrize("flush_mode", ["sync", "async"])
def test_concurrent_appends(open_store: Opener, flush_mode: str) -> None:
    store = open_store(flush_mode=flush_mode)
    errors: list[BaseException] = []

    def writer(n: int) -> None:
        try:
            for i in range(100):
                store.put_message(msg(body=f"{n}-{i}".encode(), queue_id=n % 2, TAGS=f"w{n}"))
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    seen: dict[int, list[int]] = {}
    for q in (0, 1):
        assert store.get_max_offset_in_queue("T", q) == 300
        offset = 0
        while offset < 300:
            res = store.get_messages("g", "T", q, offset, 32)
            for m in res.messages:
                n, i = map(int, m.body.split(b"-"))
                seen.setdefault(n, []).append(i)
                assert m.queue_offset == offset + res.messages.index(m)
            offset = res.next_begin_offset
    assert {n: sorted(v) for n, v in seen.items()} == {n: list(range(100)) for n in range(6)}
    for v in seen.values():  # per-writer order is kept
        assert v == sorted(v)
    if flush_mode == "sync":
        assert store.commit_log.flushed_offset == store.max_commit_log_offset


def test_a_sync_put_is_synced_whenever_another_flush_runs_during_its_write(
    open_store: Opener, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A flush in another thread (the flush loop, another send's group commit) run between any two
    lines of the segment's write: the put is answered only once its record is synced. With the
    length grown before the segment was marked dirty, a flush between the two synced nothing yet
    counted the record durable, and the put was answered with nothing synced."""
    store = open_store(flush_mode="sync", flush_interval_ms=60_000)
    store.put_message(msg(body=b"first"))
    code = Segment.write.__code__
    lines = sorted({n for _, _, n in code.co_lines() if n is not None and n > code.co_firstlineno})
    synced: list[int] = []
    real_sync = os.fdatasync
    monkeypatch.setattr(os, "fdatasync", lambda fd: (synced.append(fd), real_sync(fd))[1])
    for at in lines:
        fired: list[int] = []

        def trace_write(frame: Any, event: str, arg: Any, at: int = at, fired: list[int] = fired) -> Any:
            if event == "line" and frame.f_lineno == at and not fired:
                fired.append(at)
                other = threading.Thread(target=store.commit_log.flush)
                other.start()
                other.join()
            return trace_write

        def trace(frame: Any, event: str, arg: Any) -> Any:
            return trace_write if frame.f_code is code else None

        before = len(synced)
        sys.settrace(trace)
        try:
            put = store.put_message(msg(body=b"x" * 100))
        finally:
            sys.settrace(None)
        segment = store.commit_log.segments()[-1]
        assert store.commit_log.flushed_offset >= put.commit_log_offset + put.size
        assert len(synced) > before and not segment.dirty, f"a flush at line {at} of Segment.write"


def test_a_failed_sync_refuses_appends_and_indexes_nothing_past_it_until_a_restart(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A failed fsync may drop the pages it could not write, and the next one then succeeds: the
    records past the last good sync are not known to be on disk. Before, the next sync (the flush
    loop's) made them readable, and the sender's retry, its failed copy not in the key index,
    was stored a second time beside it."""
    store = MessageStore.open(small_config(tmp_path / "data", flush_mode="sync", flush_interval_ms=20))
    real_sync = os.fdatasync
    failures = [OSError(errno.EIO, "Input/output error")]

    def sync(fd: int) -> None:
        if failures:
            raise failures.pop()
        real_sync(fd)

    try:
        store.put_message(msg(body=b"kept", UNIQ_KEY="K1"))
        monkeypatch.setattr(os, "fdatasync", sync)
        with pytest.raises(StoreError, match="Input/output error"):
            store.put_message(msg(body=b"unsure", UNIQ_KEY="K2"))
        store.flush()  # syncs again, and succeeds
        with pytest.raises(StoreError, match="restart the broker"):
            store.put_message(msg(body=b"unsure", UNIQ_KEY="K2"))  # the sender's retry
        assert [m.body for m in store.get_messages("g", "T", 0, 0, 32).messages] == [b"kept"]
    finally:
        store.close()
    monkeypatch.undo()
    store = MessageStore.open(small_config(tmp_path / "data", flush_mode="sync"))
    try:  # recovery keeps what the disk holds (here the record made it): once, its id known
        assert [m.body for m in store.get_messages("g", "T", 0, 0, 32).messages] == [b"kept", b"unsure"]
        assert store.query_message_by_uniq_key("K2") is not None
    finally:
        store.close()


def test_data_dir_lock(tmp_path: Path) -> None:
    store = MessageStore.open(small_config(tmp_path))
    try:
        with pytest.raises(StoreLockedError):
            MessageStore.open(small_config(tmp_path))
    finally:
        store.close()
    MessageStore.open(small_config(tmp_path)).close()


def test_closed_store_rejects_calls(tmp_path: Path) -> None:
    store = MessageStore.open(small_config(tmp_path))
    store.close()
    with pytest.raises(StoreClosedError):
        store.put_message(msg())
    with pytest.raises(StoreClosedError):
        store.get_messages("g", "T", 0, 0, 1)
    store.close()  # idempotent


def test_clean_close_removes_abort_marker(tmp_path: Path) -> None:
    with MessageStore(small_config(tmp_path)) as store:
        assert (tmp_path / "abort").exists()
        store.put_message(msg())
    assert not (tmp_path / "abort").exists()
    assert (tmp_path / "checkpoint").exists()


def test_config_validation(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="segment"):
        small_config(tmp_path, max_message_size=4 * 1024 * 1024)
    with pytest.raises(ConfigError, match="flush_mode"):
        small_config(tmp_path, flush_mode="never")
