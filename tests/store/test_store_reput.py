"""Background dispatch (reput): read-your-writes, arrival listeners, close drains, crash recovery."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from siftmq.errors import StoreError
from siftmq.store import AppendedRecord, DispatchRequest, GetMessageStatus, MessageStore, StoreConfig
from siftmq.store.recovery import Checkpoint
from store_helpers import msg, small_config

S = GetMessageStatus


def _idle_reput_store(cfg: StoreConfig) -> MessageStore:
    """A store whose reput thread never runs and whose appends dispatch nothing themselves: only
    reads, flush and close dispatch."""
    store = MessageStore(cfg)
    store.reput_service._loop = lambda: None  # type: ignore[method-assign]
    store.reput_service.dispatch_or_wake = store.reput_service.wake  # type: ignore[method-assign]
    store.start()
    return store


@pytest.fixture
def idle_store(tmp_path: Path) -> Iterator[MessageStore]:
    store = _idle_reput_store(small_config(tmp_path / "data"))
    yield store
    store.close()


def _fail_dispatch_once(store: MessageStore) -> list[OSError]:
    """Make the store's next dispatch round fail (a full disk); the list empties when it has."""
    real = store._reput.dispatch_appended
    failures = [OSError(28, "No space left on device")]

    def flaky(records: Any, properties: Any) -> Any:
        if failures:
            raise failures.pop()
        return real(records, properties)

    store._reput.dispatch_appended = flaky  # type: ignore[method-assign]
    return failures


def _bodies(store: MessageStore, topic: str, queue_id: int) -> list[bytes]:
    out: list[bytes] = []
    offset = 0
    while True:
        res = store.get_messages("g", topic, queue_id, offset, 32)
        out += [m.body for m in res.messages]
        if res.status is not S.FOUND:
            return out
        offset = res.next_begin_offset


def test_small_puts_dispatch_themselves_and_the_thread_takes_the_rest(tmp_path: Path) -> None:
    """A put leaving a small backlog is indexed by the appending thread before the put returns; a
    larger one, or one made while the dispatch lock is held, by the reput thread in the background."""
    store = MessageStore.open(small_config(tmp_path))
    try:
        arrived = threading.Event()
        calls: list[tuple[str, int, int, str]] = []

        def listener(topic: str, queue_id: int, max_offset: int) -> None:
            calls.append((topic, queue_id, max_offset, threading.current_thread().name))
            if max_offset in (20, 21):
                arrived.set()

        store.add_message_arriving_listener(listener)
        results = store.put_messages([msg(body=str(i).encode()) for i in range(10)])
        assert [r.queue_offset for r in results] == list(range(10))  # assigned at append time
        assert store.dispatch_behind_bytes() == 0  # no read was made: the put indexed itself
        assert calls == [("T", 0, 10, threading.current_thread().name)]

        store.put_messages([msg(body=bytes(8000)) for _ in range(10)])  # more than a small backlog
        assert arrived.wait(10)
        assert calls[-1] == ("T", 0, 20, "siftmq-store-reput")

        arrived.clear()
        with store._dispatch_lock:  # as if a reader were catching up: the put leaves it to the thread
            store.put_message(msg(body=b"late"))
            assert store.dispatch_behind_bytes() > 0
        assert arrived.wait(10)
        assert calls[-1] == ("T", 0, 21, "siftmq-store-reput")
        assert store.dispatch_behind_bytes() == 0
    finally:
        store.close()


def test_a_failed_dispatch_by_the_appender_leaves_the_put_done_and_the_thread_retries(
    tmp_path: Path,
) -> None:
    store = MessageStore.open(small_config(tmp_path))
    try:
        indexed_by: list[str] = []
        arrived = threading.Event()

        def listener(topic: str, queue_id: int, max_offset: int) -> None:
            indexed_by.append(threading.current_thread().name)
            arrived.set()

        store.add_message_arriving_listener(listener)
        failures = _fail_dispatch_once(store)
        [result] = store.put_messages([msg(body=b"1")])  # the append stands; its indexing failed once
        assert result.queue_offset == 0 and not failures
        assert arrived.wait(10)  # no read was made: the reput thread indexed it
        assert indexed_by == ["siftmq-store-reput"]
        assert store.dispatch_behind_bytes() == 0
        assert _bodies(store, "T", 0) == [b"1"]
        assert store.put_message(msg(body=b"2")).queue_offset == 1
        assert _bodies(store, "T", 0) == [b"1", b"2"]
    finally:
        store.close()


def test_a_put_batch_left_unindexed_is_indexed_by_index_appended(tmp_path: Path) -> None:
    """``put_batch(..., index=False)``: the caller indexes after releasing its own locks; reads in
    between still see the records (they catch up)."""
    store = MessageStore(small_config(tmp_path))
    store.reput_service._loop = lambda: None  # type: ignore[method-assign]  # no background indexing
    store.start()
    try:
        host = b"\x7f\x00\x00\x01\x00\x00\x00\x01"
        entries = [(b"a", {"UNIQ_KEY": "a"}, 0, host), (b"b", {"UNIQ_KEY": "b"}, 0, host)]
        store.put_batch("T", 0, entries, index=False)
        assert store.dispatch_behind_bytes() > 0
        store.index_appended()
        assert store.dispatch_behind_bytes() == 0
        store.put_batch("T", 0, [(b"c", {"UNIQ_KEY": "c"}, 0, host)], index=False)
        assert _bodies(store, "T", 0) == [b"a", b"b", b"c"]  # read-your-writes all the same
    finally:
        store.close()


def test_reads_see_every_returned_put_even_when_the_reput_thread_lags(idle_store: MessageStore) -> None:
    store = idle_store
    seen: list[tuple[str, int, int]] = []
    store.add_message_arriving_listener(lambda t, q, m: seen.append((t, q, m)))
    for i in range(5):
        store.put_message(msg(body=f"a{i}".encode(), queue_id=1, UNIQ_KEY=f"u{i}", KEYS=f"k{i % 2}"))
    assert store.dispatch_behind_bytes() > 0  # nothing dispatched yet
    assert store.get_max_offset_in_queue("T", 1) == 5
    assert seen == [("T", 1, 5)]  # the reader dispatched, and notified
    store.put_message(msg(body=b"b", queue_id=2))
    assert store.queues() == [("T", 1), ("T", 2)]
    store.put_message(msg(body=b"a5", queue_id=1, UNIQ_KEY="u5"))
    assert _bodies(store, "T", 1) == [f"a{i}".encode() for i in range(6)]
    store.put_message(msg(body=b"a6", queue_id=1, UNIQ_KEY="u6", KEYS="k0"))
    found = store.query_message_by_uniq_key("u6")
    assert found is not None and found.body == b"a6"
    assert [m.body for m in store.query_messages_by_key("T", "k0")] == [b"a0", b"a2", b"a4", b"a6"]
    store.put_message(msg(body=b"c", queue_id=3))
    cq = store.find_consume_queue("T", 3)
    assert cq is not None and cq.max_offset == 1
    store.put_message(msg(body=b"d", queue_id=3))
    assert store.wait_dispatched(timeout=10)
    assert store.dispatch_behind_bytes() == 0
    assert cq.max_offset == 2


def test_dispatchers_see_records_in_commit_log_order(tmp_path: Path) -> None:
    class Recorder:
        def __init__(self) -> None:
            self.seen: list[DispatchRequest] = []

        def dispatch(self, requests: Sequence[DispatchRequest]) -> None:
            self.seen.extend(requests)

    recorder = Recorder()
    store = MessageStore.open(small_config(tmp_path), dispatchers=[recorder])
    results: list[AppendedRecord] = []
    lock = threading.Lock()

    def writer(n: int) -> None:
        for i in range(50):
            r = store.put_messages(
                [msg(body=f"{n}-{i}-{j}".encode(), queue_id=j, TAGS="A") for j in range(3)]
            )
            with lock:
                results.extend(r)

    try:
        threads = [threading.Thread(target=writer, args=(n,)) for n in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert store.wait_dispatched(timeout=10)
        offsets = [r.commit_log_offset for r in recorder.seen]
        assert offsets == sorted(offsets) == sorted(r.commit_log_offset for r in results)
        for q in range(3):
            assert [r.consume_queue_offset for r in recorder.seen if r.queue_id == q] == list(range(200))
        assert {r.tags_code for r in recorder.seen} == {recorder.seen[0].tags_code} != {0}
    finally:
        store.close()


def test_close_drains_pending_dispatch(tmp_path: Path) -> None:
    cfg = small_config(tmp_path)
    store = _idle_reput_store(cfg)
    for i in range(40):
        store.put_message(msg(body=bytes(3000), queue_id=i % 2, TAGS=f"t{i % 3}"))
    end = store.max_commit_log_offset
    assert store.dispatch_behind_bytes() > 0
    store.close()
    assert not (tmp_path / "abort").exists()
    checkpoint = Checkpoint.load(tmp_path / "checkpoint")
    assert checkpoint is not None and checkpoint.consume_queue_flushed_offset == end
    # the index files were written by close: reopen without any recovery work
    with MessageStore.open(cfg) as again:
        assert [again.get_max_offset_in_queue("T", q) for q in (0, 1)] == [20, 20]
        assert len(_bodies(again, "T", 0)) == 20


def test_failed_dispatch_is_retried_and_reported(idle_store: MessageStore) -> None:
    store = idle_store
    _fail_dispatch_once(store)
    store.put_messages([msg(body=b"1"), msg(body=b"2")])
    # a full disk: the read serves what is indexed (nothing yet) rather than fail
    assert store.get_messages("g", "T", 0, 0, 32).messages == []
    # nothing was lost or indexed twice: the next read dispatches the same records once
    assert _bodies(store, "T", 0) == [b"1", b"2"]
    assert store.get_max_offset_in_queue("T", 0) == 2


def test_listener_errors_do_not_break_dispatch(idle_store: MessageStore) -> None:
    store = idle_store
    calls: list[int] = []

    def broken(topic: str, queue_id: int, max_offset: int) -> None:
        raise RuntimeError("boom")

    def good(topic: str, queue_id: int, max_offset: int) -> None:
        calls.append(max_offset)

    store.add_message_arriving_listener(broken)
    store.add_message_arriving_listener(good)
    store.put_message(msg())
    assert store.get_messages("g", "T", 0, 0, 1).status is S.FOUND
    store.remove_message_arriving_listener(good)
    store.put_message(msg())
    assert store.get_max_offset_in_queue("T", 0) == 2
    assert calls == [1]


_PENDING_WRITER = textwrap.dedent(
    """
    import os, sys
    from pathlib import Path
    from siftmq.store import Message, MessageStore, StoreConfig
    cfg = StoreConfig(Path(sys.argv[1]), commit_log_segment_size=1 << 20, max_message_size=1 << 16,
                      consume_queue_entries_per_file=16, flush_mode=sys.argv[2])
    store = MessageStore(cfg)
    store.reput_service._loop = lambda: None  # type: ignore[method-assign]  # never catches up
    store.reput_service.dispatch_or_wake = store.reput_service.wake  # nor do the appends
    store.start()
    store.put_messages([Message("T", b"early-%d" % i, queue_id=i % 2) for i in range(10)])
    store.flush()  # these are indexed and the checkpoint says so
    for i in range(60):
        store.put_message(Message("T", b"late-%d" % i + bytes(i * 100), queue_id=i % 3,
                                  properties={"TAGS": "L", "UNIQ_KEY": "late%d" % i}))
    store.commit_log.flush()
    print(store.dispatch_behind_bytes(), flush=True)
    os.kill(os.getpid(), 9)
    """
)


@pytest.mark.parametrize("flush_mode", ["async", "sync"])
def test_crash_with_pending_dispatch_recovers_the_indexes(tmp_path: Path, flush_mode: str) -> None:
    data = tmp_path / "data"
    proc = subprocess.run(
        [sys.executable, "-c", _PENDING_WRITER, str(data), flush_mode],
        capture_output=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == -9, proc.stderr.decode()
    behind = int(proc.stdout.split()[0])
    assert behind > 0  # the writer died with records appended but not dispatched
    assert (data / "abort").exists()
    cfg = small_config(data)
    with MessageStore.open(cfg) as store:
        assert [store.get_max_offset_in_queue("T", q) for q in range(3)] == [25, 25, 20]
        bodies = sorted(b for q in range(3) for b in _bodies(store, "T", q))
        expected = [b"early-%d" % i for i in range(10)] + [b"late-%d" % i + bytes(i * 100) for i in range(60)]
        assert bodies == sorted(expected)
        late = store.query_message_by_uniq_key("late59")
        assert late is not None and late.queue_offset == 19 and late.queue_id == 2
        assert store.put_message(msg(queue_id=2)).queue_offset == 20


def test_wait_dispatched_timeout(idle_store: MessageStore) -> None:
    store = idle_store
    store.put_message(msg())
    done: list[bool] = []
    with store._dispatch_lock:  # as if a long dispatch round were running
        t = threading.Thread(target=lambda: done.append(store.wait_dispatched(timeout=0.05)))
        t.start()
        t.join()
    assert done == [False]
    assert store.wait_dispatched(timeout=5)


def test_a_put_that_may_not_wait_leaves_a_lagging_index_to_others(tmp_path: Path) -> None:
    """The reput thread lags far behind (more than 32 MiB) while another thread holds the dispatch
    lock: an event loop's put (``index_appended(may_wait=False)``) returns without waiting for
    the lock; a thread's put waits to help index, and does once the lock is free."""
    store = MessageStore(
        small_config(tmp_path / "data", commit_log_segment_size=64 << 20, max_message_size=2 << 20)
    )
    store.start()
    try:
        held = threading.Event()
        release = threading.Event()

        def hold_dispatch_lock() -> None:
            with store.reput_service.lock:
                held.set()
                release.wait(60)

        holder = threading.Thread(target=hold_dispatch_lock)
        holder.start()
        assert held.wait(10)
        body = b"x" * (1 << 20)
        for _ in range(34):  # 34 MiB appended, nothing indexed meanwhile
            store.put_batch("Lag", 0, [(body, {}, 0, bytes(8))], index=False)
        assert store.reput_service.behind_bytes() > 32 << 20
        loop_put = threading.Thread(target=lambda: store.index_appended(may_wait=False))
        loop_put.start()
        loop_put.join(10)
        assert not loop_put.is_alive()  # it did not wait for the dispatch lock
        thread_put = threading.Thread(target=store.index_appended)
        thread_put.start()
        thread_put.join(0.5)
        assert thread_put.is_alive()  # it helps: waits for the lock
        release.set()
        holder.join(10)
        thread_put.join(30)
        assert not thread_put.is_alive() and store.reput_service.behind_bytes() == 0
        assert len(_bodies(store, "Lag", 0)) == 34
    finally:
        release.set()
        store.close()


def test_records_indexed_before_a_failed_round_are_announced(idle_store: MessageStore) -> None:
    """dispatch_all indexes in rounds of BATCH records; when a later round fails (a full disk) the
    rounds before it stand, readable, so their waiting readers are told of them all the same."""
    from siftmq.store.reput import BATCH

    announced: list[tuple[str, int, int]] = []
    idle_store.add_message_arriving_listener(lambda t, q, o: announced.append((t, q, o)))
    idle_store.put_messages([msg(body=b"x") for _ in range(BATCH)])
    idle_store.put_messages([msg(body=b"y") for _ in range(10)])
    real = idle_store._reput.dispatch_appended
    rounds: list[int] = []

    def second_round_fails(records: Any, properties: Any) -> Any:
        rounds.append(len(records))
        if len(rounds) == 2:
            raise OSError(28, "No space left on device")
        return real(records, properties)

    idle_store._reput.dispatch_appended = second_round_fails  # type: ignore[method-assign]
    with pytest.raises(StoreError, match="No space left"):
        idle_store.reput_service.dispatch_all(None)
    assert rounds == [BATCH, 10]
    assert announced == [("T", 0, BATCH)]
    idle_store.reput_service.dispatch_all(None)  # the disk has room again: the rest follows
    assert announced[-1] == ("T", 0, BATCH + 10)
    assert len(_bodies(idle_store, "T", 0)) == BATCH + 10
