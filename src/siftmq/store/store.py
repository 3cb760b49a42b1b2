"""MessageStore: the facade the broker calls (RocketMQ's DefaultMessageStore).

Layout of ``data_dir``::

    lock                  fcntl.flock'ed while a process has the store open
    abort                 present while open; found at open = the previous run crashed
    checkpoint            durable positions (see recovery.py)
    commitlog/            CommitLog segments
    consumequeue/<topic>/<queue_id>/       ConsumeQueue segments
    consumequeue_ext/<topic>/<queue_id>/   ConsumeQueueExt segments
    index-staging/        index files an offline job (reindex, backfill) builds; see offline.py
    index-install.json    an offline job's install in progress; finished by the next open

Threads and guarantees:

* Appends are serialised by one lock (validation and encoding happen before it). Under it the
  record gets its CommitLog offset, its queue offset and its store timestamp, and is written.
  ``put_message`` returns that queue offset; in ``"sync"`` flush mode only once the record is
  fdatasync'ed (group commit), in ``"async"`` mode right after the write.
* Indexing (ConsumeQueue, ConsumeQueueExt, bitmaps, registered dispatchers) is done by the
  reput thread (:mod:`siftmq.store.reput`, RocketMQ's ReputMessageService), in CommitLog order
  and in batches, under a second lock; a put leaving only a small backlog is dispatched by the
  appending thread itself when that lock is free. Other appends wake the thread; it lets a small
  backlog grow for up to 1 ms into a batch, so the indexes trail the appends by about a
  millisecond. In ``"sync"`` mode only durable records are dispatched, by the thread.
* Read-your-writes: every read of the ConsumeQueues (:meth:`MessageStore.get_messages`, the
  queue offset getters, :meth:`MessageStore.find_consume_queue`, :meth:`MessageStore.queues`)
  first makes sure that every record whose ``put_message`` returned before the read began is
  dispatched, dispatching the rest itself if the reput thread lags. So a message is visible to
  any read that starts after its ``put_message`` returned, as when dispatch was synchronous.
  :meth:`MessageStore.wait_dispatched` does the same on demand. The key index (UNIQ_KEY, KEYS)
  is updated by ``put_message`` itself before it returns (after the fsync in sync mode).
* Arrival listeners (:meth:`MessageStore.add_message_arriving_listener`) are called with
  ``(topic, queue_id, max_offset)`` after each dispatch batch that wrote entries to that queue,
  outside the locks, from the thread that dispatched (for long polling).
* Reads (:mod:`siftmq.store.reader`) take no lock. The broker may call every method via ``asyncio.to_thread``.
* After a crash, records appended but not yet dispatched are re-dispatched from the CommitLog
  by recovery (the checkpoint records how far the indexes are durable).
"""

from __future__ import annotations

import fcntl
import logging
import os
import shutil
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from types import TracebackType
from typing import Final, cast

from siftmq.durable import fsync_dir
from siftmq.errors import (
    RepeatingFailure,
    StoreClosedError,
    StoreError,
    StoreLockedError,
    as_store_error,
    caused_by_full_disk,
)
from siftmq.store import codec, retention
from siftmq.store.codec import Message, StoredMessage
from siftmq.store.commitlog import AppendedRecord, CommitLog
from siftmq.store.config import StoreConfig
from siftmq.store.consumequeue import ConsumeQueue
from siftmq.store.consumequeue_ext import ConsumeQueueExt, units_checked
from siftmq.store.decoding import RawRecord
from siftmq.store.disk import DiskGuard, DiskUsage
from siftmq.store.dispatch import BitmapDispatcher, CommitLogDispatcher, Reput
from siftmq.store.filtering import GetMessageResult, MessageFilter
from siftmq.store.indexcheck import IndexRepairs
from siftmq.store.keyindex import KeyIndex
from siftmq.store.layout import settle
from siftmq.store.offline import finish_pending_install
from siftmq.store.reader import MessageReader
from siftmq.store.recovery import Checkpoint, recover
from siftmq.store.reput import INLINE_BACKLOG_BYTES, MessageArrivingListener, ReputService
from siftmq.store.tombstones import Tombstones

_log = logging.getLogger(__name__)

#: CommitLog bytes appended but not yet dispatched beyond which appenders dispatch themselves
_MAX_DISPATCH_LAG: Final = 32 * 1024 * 1024


class MessageStore:
    """CommitLog + ConsumeQueues + dispatch + recovery + retention behind one object.

    Use :meth:`open` (or the constructor then :meth:`start`), and :meth:`close` (or ``with``).
    """

    def __init__(
        self,
        config: StoreConfig,
        *,
        dispatchers: Iterable[CommitLogDispatcher] = (),
        bitmap_dispatcher: BitmapDispatcher | None = None,
        disk_usage: Callable[[str], DiskUsage] | None = None,
    ) -> None:
        self.config = config
        self.data_dir = config.data_dir
        #: refuses appends before the disk fills (``disk_usage`` stands in for the OS in tests)
        self.disk = DiskGuard(
            self.data_dir,
            high_water_ratio=config.disk_high_water_ratio,
            reserve_bytes=config.disk_reserve_bytes,
            deletes_oldest=config.disk_full_policy == "delete_oldest",
            usage=disk_usage,
        )
        self.commit_log = CommitLog(
            self.data_dir / "commitlog", config.commit_log_segment_size, config.max_record_size
        )
        self.reader = MessageReader(self.commit_log, config)
        self._sync = config.flush_mode == "sync"
        self._max_body_size = config.max_message_size
        self._queues: dict[tuple[str, int], ConsumeQueue] = {}
        self._queues_lock = threading.Lock()
        self._ext_checked = False  # the extension units hold bitmap checks (known at start)
        self._reput = Reput(self.find_or_create_consume_queue)
        self._reput.dispatchers.extend(dispatchers)
        self._reput.bitmap_dispatcher = bitmap_dispatcher
        self.reput_service = ReputService(
            self._reput, self._dispatch_limit, config.flush_interval_ms / 1000.0
        )
        self.key_index = KeyIndex() if config.build_key_index else None
        #: index entries recovery found disagreeing with their records and rewrote
        self.index_repairs = IndexRepairs()
        self._append_lock = threading.Lock()
        self._dispatch_lock = self.reput_service.lock
        self._max_store_timestamp = 0  # the largest store timestamp any record has had
        self._commit_cond = threading.Condition()
        self._commit_leader = False
        self._lock_fd = -1
        self._running = False
        self._stop = threading.Event()
        self._flusher: threading.Thread | None = None
        self._flush_error: StoreError | None = None
        #: (sync flush) a group commit's sync failed: the commit log's durable end then, and why.
        #: What was written past it is not known to be on disk (a failed fsync may drop the pages
        #: it could not write, and the next one then succeeds): nothing past it is indexed, and
        #: appends are refused, until a restart's recovery finds what the disk holds.
        self._sync_lost: tuple[int, StoreError] | None = None
        self._checkpoint_lock = threading.Lock()

    # ---------------------------------------------------------------------------------- lifecycle

    @classmethod
    def open(
        cls,
        config: StoreConfig,
        *,
        dispatchers: Iterable[CommitLogDispatcher] = (),
        bitmap_dispatcher: BitmapDispatcher | None = None,
        disk_usage: Callable[[str], DiskUsage] | None = None,
    ) -> MessageStore:
        """Construct and :meth:`start` a store."""
        store = cls(
            config, dispatchers=dispatchers, bitmap_dispatcher=bitmap_dispatcher, disk_usage=disk_usage
        )
        store.start()
        return store

    def start(self) -> None:
        """Lock the data dir, recover, and start the flush and reput threads.

        Raises :class:`StoreLockedError` if another process (or store object) has it open.
        """
        if self._running:
            return
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._lock_data_dir()
        try:
            finish_pending_install(self.data_dir)  # an offline job's index install a crash interrupted
            abort = self.data_dir / "abort"
            abnormal = abort.exists()
            if abnormal:
                _log.warning("%s: the previous run did not close cleanly; recovering", self.data_dir)
            self.tombstones = self._reput.tombstones = Tombstones(self.data_dir)
            layout = settle(self.data_dir, self.config.commit_log_segment_size, self.config.max_record_size)
            if self.config.enable_consume_queue_ext:  # before any unit is written
                self._ext_checked = units_checked(self.data_dir / "consumequeue_ext", mark_new=True)
            self.commit_log.max_record_size = layout.max_record_size  # new messages: max_message_size
            self.commit_log.load()
            self._load_queues()
            self._max_store_timestamp = recover(
                self.commit_log,
                self._queues,
                self.find_or_create_consume_queue,
                self._reput,
                self.key_index,
                abnormal=abnormal,
                checkpoint=Checkpoint.load(self.data_dir / "checkpoint"),
                key_index_max_messages=self.config.key_index_max_messages,
                repairs=self.index_repairs,
            )
            self.commit_log.map_for_append()
            try:
                self._flush_all()
            except (OSError, StoreError) as exc:
                if not caused_by_full_disk(exc):
                    raise
                # the last checkpoint still holds (nothing was appended since): the store opens to
                # serve what it has; appends are refused as on any full disk (the guard, or the
                # OS's ENOSPC as DiskFullError), and the flush thread writes the checkpoint later
                _log.error(
                    "%s: the disk is full; serving reads, refusing messages until there is room",
                    self.data_dir,
                )
            abort.touch()
            fsync_dir(self.data_dir)
        except OSError as exc:
            self._release()
            raise StoreError(f"cannot open the store in {self.data_dir}: {exc}") from exc
        except BaseException:
            self._release()
            raise
        self._running = True
        self._stop.clear()
        self._flush_error = None
        self._sync_lost = None
        self.reput_service.start(self.commit_log.max_offset)
        self._flusher = threading.Thread(target=self._flush_loop, name="siftmq-store-flush", daemon=True)
        self._flusher.start()

    def close(self) -> None:
        """Stop the threads, dispatch what is pending, flush everything, write the checkpoint,
        remove the abort marker and release the lock."""
        if not self._running:
            return
        with self._append_lock:
            self._running = False
        self._stop.set()
        self.reput_service.stop()
        if self._flusher is not None:
            self._flusher.join()
        try:
            self.commit_log.flush()
            self.reput_service.dispatch_all(None)
            self.commit_log.trim()  # at rest, a segment file holds its data only
            self._flush_all()
            (self.data_dir / "abort").unlink(missing_ok=True)
            fsync_dir(self.data_dir)
        except (OSError, StoreError) as exc:
            if not caused_by_full_disk(exc):
                raise
            # the abort marker stays: the next start recovers what this stop could not write
            _log.error("%s: the disk is full; stopped without a final checkpoint (%s)", self.data_dir, exc)
        finally:
            self._release()

    def __enter__(self) -> MessageStore:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def _lock_data_dir(self) -> None:
        fd = os.open(self.data_dir / "lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as exc:
            os.close(fd)
            raise StoreLockedError(f"{self.data_dir} is in use by another store") from exc
        self._lock_fd = fd

    def _release(self) -> None:
        self.commit_log.close()
        for cq in self._queues.values():
            cq.close()
        if self._lock_fd >= 0:
            os.close(self._lock_fd)  # closing the descriptor drops the flock
            self._lock_fd = -1

    def _load_queues(self) -> None:
        root = self.data_dir / "consumequeue"
        if not root.is_dir():
            return
        for topic_dir in sorted(root.iterdir()):
            if not topic_dir.is_dir():
                continue
            for queue_dir in sorted(topic_dir.iterdir()):
                if queue_dir.is_dir() and queue_dir.name.isdigit():
                    cq = self._new_queue(topic_dir.name, int(queue_dir.name))
                    cq.load()
                    if self.tombstones and self._deleted(cq):
                        cq.destroy()  # a deletion that a crash interrupted: finish it
                        continue
                    self._queues[(cq.topic, cq.queue_id)] = cq

    def _deleted(self, cq: ConsumeQueue) -> bool:
        """Whether ``cq`` indexes records of a deleted topic: its first entry, or its last written
        one (a queue of fillers only, which keep offsets taken, has no first entry to look at)."""
        first = cq.get_entry(cq.min_offset)
        if first is None:
            written = cq.written_max_offset()
            last = cq.read_block(written - 1, 1) if written else None
            first = tuple(last[0]) if last is not None and len(last) else None
        if first is None:
            return False
        # a filler points at the place after the record it stands for (the log's end, for one
        # written at a queue's end): that record was below it
        position = int(first[0]) - (1 if int(first[1]) == 0 else 0)
        return self.tombstones.is_dead(cq.topic, position)

    def _new_queue(self, topic: str, queue_id: int) -> ConsumeQueue:
        cfg = self.config
        ext = None
        if cfg.enable_consume_queue_ext:
            ext = ConsumeQueueExt(
                self.data_dir / "consumequeue_ext" / topic / str(queue_id),
                cfg.consume_queue_entries_per_file,
                cfg.bitmap_size,
                checked=self._ext_checked,
            )
        return ConsumeQueue(
            topic,
            queue_id,
            self.data_dir / "consumequeue" / topic / str(queue_id),
            cfg.consume_queue_entries_per_file,
            ext,
        )

    # --------------------------------------------------------------------------------- dispatchers

    def add_dispatcher(self, dispatcher: CommitLogDispatcher) -> None:
        """Register a dispatcher for records appended from now on.

        It is called under the dispatch lock from whichever thread dispatches (the reput thread,
        a reader catching up, or in async mode the appending thread after a small put, which in
        the broker is often its event loop), after the batch's ConsumeQueue entries are written.
        """
        self.reput_service.dispatch_all(
            self._dispatch_limit(), then=lambda: self._reput.dispatchers.append(dispatcher)
        )

    def set_bitmap_dispatcher(self, dispatcher: BitmapDispatcher | None) -> None:
        """Set (or clear) the dispatcher computing ConsumeQueueExt bitmaps of records appended from now on."""

        def install() -> None:
            self._reput.bitmap_dispatcher = dispatcher

        self.reput_service.dispatch_all(self._dispatch_limit(), then=install)

    def add_message_arriving_listener(self, listener: MessageArrivingListener) -> None:
        """Call ``listener(topic, queue_id, max_offset)`` whenever entries were dispatched to a queue.

        It is called once per queue and dispatch batch, after the entries are readable, outside
        the store's locks, from whichever thread dispatched (the reput thread, a reader catching
        up, or in async mode the appending thread after a small put): it must be quick and must
        not block (hand over to an event loop with ``call_soon_threadsafe``). Calls for one queue
        from two threads may arrive out of order, so treat ``max_offset`` as "at least this much
        is readable". Exceptions are logged and ignored.
        """
        self.reput_service.add_listener(listener)

    def remove_message_arriving_listener(self, listener: MessageArrivingListener) -> None:
        """Unregister a listener added by :meth:`add_message_arriving_listener` (no-op if absent)."""
        self.reput_service.remove_listener(listener)

    # ------------------------------------------------------------------------------------- queues

    def find_consume_queue(self, topic: str, queue_id: int, *, catch_up: bool = True) -> ConsumeQueue | None:
        """The queue's index, or None if the queue was never created or written. Without
        ``catch_up``, as indexed so far (see :meth:`catch_up_now`)."""
        if catch_up:
            try:
                self.reput_service.catch_up()
            except (OSError, StoreError) as exc:
                if not caused_by_full_disk(exc):
                    raise
                # what is indexed is served (reads go on while the disk is full); the rest is
                # indexed by the reput thread once there is room
        return self._queues.get((topic, queue_id))

    def catch_up_now(self) -> bool:
        """Whether every record appended before the call is readable now, without waiting: it is
        when all are indexed, or (async flush) when the little left, at most
        ``INLINE_BACKLOG_BYTES`` of CommitLog, has been indexed here because nobody held the
        dispatch lock, as an appender indexes a small put of its own. An event loop calls this
        before reading with ``catch_up=False``: it never waits and never indexes much (a read with
        ``catch_up`` may wait for the reput thread, then index all it has left). With sync flush it
        indexes nothing: records are indexed once durable, by the reput thread."""
        return self.reput_service.catch_up(0, most_bytes=0 if self._sync else INLINE_BACKLOG_BYTES)

    def find_or_create_consume_queue(self, topic: str, queue_id: int) -> ConsumeQueue:
        """The queue's index, created empty if needed."""
        key = (topic, queue_id)
        cq = self._queues.get(key)
        if cq is None:
            codec.check_topic_name(topic)
            with self._queues_lock:
                cq = self._queues.get(key)
                if cq is None:
                    cq = self._new_queue(topic, queue_id)
                    cq.log.directory.mkdir(parents=True, exist_ok=True)
                    self._queues[key] = cq
        return cq

    def create_queue(self, topic: str, queue_id: int) -> None:
        """Declare an (empty) queue, so pulls get NO_MESSAGE_IN_QUEUE instead of NO_MATCHED_LOGIC_QUEUE."""
        self._check_open()
        self.find_or_create_consume_queue(topic, queue_id)

    def get_min_offset_in_queue(self, topic: str, queue_id: int) -> int:
        """The first queue offset still stored (0 for an unknown queue)."""
        cq = self.find_consume_queue(topic, queue_id)
        return cq.min_offset if cq else 0

    def get_max_offset_in_queue(self, topic: str, queue_id: int) -> int:
        """The queue offset the next message will get (0 for an unknown queue).

        Counts every message whose ``put_message`` returned before the call (see the module doc).
        """
        cq = self.find_consume_queue(topic, queue_id)
        return cq.max_offset if cq else 0

    def queues(self) -> list[tuple[str, int]]:
        """Every known (topic, queue_id)."""
        self.reput_service.catch_up()
        return sorted(self._queues)

    # -------------------------------------------------------------------------------------- append

    def put_message(self, message: Message) -> AppendedRecord:
        """Append one message; see :meth:`put_messages`."""
        return self._append((codec.prepare(message, max_body_size=self._max_body_size),))[0]

    def put_messages(self, messages: Sequence[Message]) -> list[AppendedRecord]:
        """Append messages (one write; in sync mode one shared fdatasync) and queue them for dispatch.

        Each result carries the record's queue offset and CommitLog offset. On return the
        messages are durable (sync mode) or written to the page cache (async mode), and visible
        to every index read that starts afterwards (see the module doc); a small put in async mode
        is indexed before it returns when the dispatch lock is free, anything else by the reput
        thread in the background.

        Raises ``ValueError`` for a malformed message, :class:`MessageTooLargeError` over the
        limits (nothing of the batch is stored then), :class:`StoreClosedError` after close, and
        :class:`StoreError` while the store cannot flush or index.
        """
        max_body_size = self._max_body_size
        prepared = [codec.prepare(m, max_body_size=max_body_size) for m in messages]
        if not prepared:
            return []
        return self._append(prepared)

    def put_batch(
        self,
        topic: str,
        queue_id: int,
        entries: Sequence[codec.BatchEntry],
        *,
        index: bool = True,
        properties_reserve: int = 0,
    ) -> list[AppendedRecord]:
        """:meth:`put_messages` for messages of one topic and queue, given as plain tuples.

        Each entry is ``(body, properties, born_timestamp, born_host)``; flag, sys flag and
        reconsume times are 0 and the store host is the default, as for a :class:`Message` that
        does not set them. The batch is encoded into one buffer
        without a :class:`Message` per entry, which is what a broker's send path wants. The
        properties dicts become the store's: the caller must not change them afterwards.

        ``index=False``: the caller calls :meth:`index_appended` itself once it has released its
        own locks (a small put is indexed on the appending thread, which need not hold them then).
        ``properties_reserve``: bytes each message's properties must leave free below the record
        limit (``codec.MAX_PROPERTIES_LENGTH``), for a copy with properties added (a dead letter).
        """
        if not entries:
            return []
        prepared = codec.prepare_batch(
            topic, queue_id, entries, max_body_size=self._max_body_size, properties_reserve=properties_reserve
        )
        return self._append(prepared, index=index)

    def index_appended(self, *, may_wait: bool = True) -> None:
        """After ``put_batch(..., index=False)``: index what is pending on this thread when it is
        little and the dispatch lock is free, else leave it to the reput thread (async mode; in
        sync mode the reput thread indexes what is durable). When the reput thread lags far
        behind, help it — unless not ``may_wait`` (an event loop: the other puts help)."""
        if not self._sync:
            self._index_after_append(may_wait)

    def _index_after_append(self, may_wait: bool) -> None:
        if may_wait and self.reput_service.behind_bytes() > _MAX_DISPATCH_LAG:
            self.reput_service.dispatch_all(None)  # waits for the dispatch lock
        else:
            self.reput_service.dispatch_or_wake()

    def _append(
        self, prepared: Sequence[codec.EncodedParts] | codec.EncodedBatch, *, index: bool = True
    ) -> list[AppendedRecord]:
        self.disk.check()
        try:
            return self._append_checked(prepared, index)
        except (OSError, StoreError) as exc:
            # the commit log, the flush and the index wrap the OS's error in a StoreError; a full
            # disk (or quota) is the documented DiskFullError, which clients retry, not an internal
            # error with OS text
            if caused_by_full_disk(exc):
                raise self.disk.refused_by_os() from exc
            raise

    def _append_checked(
        self, prepared: Sequence[codec.EncodedParts] | codec.EncodedBatch, index: bool
    ) -> list[AppendedRecord]:
        with self._append_lock:
            if not self._running:
                raise StoreClosedError("the message store is closed")
            if self._sync_lost is not None:
                durable, why = self._sync_lost
                raise StoreError(
                    f"the store could not sync its commit log ({why}); what was written past offset "
                    f"{durable} is not known to be on disk: restart the broker (recovery keeps what the "
                    "disk holds)"
                ) from why
            if self._flush_error is not None:
                raise StoreError(f"the store cannot flush: {self._flush_error}") from self._flush_error
            if self.reput_service.error is not None:
                raise StoreError(
                    f"the store cannot index: {self.reput_service.error}"
                ) from self.reput_service.error
            now = time.time_ns() // 1_000_000
            self._max_store_timestamp = max(self._max_store_timestamp, now)
            if isinstance(prepared, codec.EncodedBatch):
                properties = prepared.properties
                written = self.commit_log.append_batch(prepared, now)
                # None: the batch must roll to a new segment part-way, record by record
                results = (
                    written
                    if written is not None
                    else self.commit_log.append(codec.split_batch(prepared), now)
                )
            else:
                results = self.commit_log.append(prepared, now)
                properties = [p.properties for p in prepared]
            self.reput_service.add(results, properties)
            end = self.reput_service.appended_offset
            if not self._sync and self.key_index is not None:
                try:
                    self.key_index.add_appended(results, properties)
                except BaseException:
                    self.reput_service.wake()  # the records are pending all the same
                    raise
        if self._sync:
            self._group_commit(end)
            if self.key_index is not None:  # durable now
                self.key_index.add_appended(results, properties)
        elif index:  # (else the caller's index_appended, once it released its own locks)
            self._index_after_append(may_wait=True)
        return results

    def _group_commit(self, end: int) -> None:
        """Return once ``end`` is durable; one thread fsyncs for all waiting ones."""
        with self._commit_cond:
            while self.commit_log.flushed_offset < end:
                if not self._commit_leader:
                    self._commit_leader = True
                    break
                self._commit_cond.wait()
            else:
                return
        try:
            self.commit_log.flush()
        except (OSError, StoreError) as exc:
            if self._sync_lost is None:
                self._sync_lost = (self.commit_log.flushed_offset, as_store_error(exc))
                _log.error(
                    "the commit log could not be synced: %s; appends are refused until the broker is "
                    "restarted (what was written past offset %d may not be on disk)",
                    exc,
                    self.commit_log.flushed_offset,
                )
            raise
        finally:
            with self._commit_cond:
                self._commit_leader = False
                self._commit_cond.notify_all()
            self.reput_service.wake()

    # -------------------------------------------------------------------------------------- reput

    def _dispatch_limit(self) -> int | None:
        """Records ending at or before this offset may be dispatched (None: all)."""
        return self._durable_end() if self._sync else None

    def _durable_end(self) -> int:
        """The commit log's end known to be on disk: what was flushed, but not past a failed sync
        (a later sync that succeeds does not prove those pages written: see ``_sync_lost``)."""
        flushed = self.commit_log.flushed_offset
        return flushed if self._sync_lost is None else min(flushed, self._sync_lost[0])

    def wait_dispatched(self, timeout: float | None = None) -> bool:
        """Make everything appended before the call readable now; False if ``timeout`` ran out.

        Reads do this by themselves (see the module doc); this is for callers that look at the
        index files directly, and for tests. In sync mode only durable records are dispatched.
        """
        return self.reput_service.catch_up(timeout)

    def dispatch_behind_bytes(self) -> int:
        """CommitLog bytes appended but not yet dispatched by the reput thread."""
        return self.reput_service.behind_bytes()

    # --------------------------------------------------------------------------------------- flush

    def flush(self) -> None:
        """Flush the CommitLog, dispatch what is pending, flush the ConsumeQueues, write the checkpoint."""
        self._check_open()
        self.commit_log.flush()
        self.reput_service.dispatch_all(self._dispatch_limit())
        self._flush_all()

    def _flush_all(self) -> None:
        with self._checkpoint_lock:
            self.commit_log.flush()
            if self._sync:
                self.reput_service.wake()
            with self._dispatch_lock:
                dispatched = self.reput_service.dispatched_offset
                queues = list(self._queues.values())
            for cq in queues:
                try:
                    cq.flush()
                except OSError:
                    # a queue its topic's deletion destroyed after the list was taken has nothing
                    # to flush; anything else is the disk's failure and stops appends
                    with self._queues_lock:
                        if self._queues.get((cq.topic, cq.queue_id)) is cq:
                            raise
            flushed = self._durable_end()
            # read after the offsets: covers every record below them (recovery scans the rest)
            latest = self._max_store_timestamp
            Checkpoint(flushed, dispatched, latest).save(self.data_dir / "checkpoint")

    def _flush_loop(self) -> None:
        interval = self.config.flush_interval_ms / 1000.0
        failures = RepeatingFailure(_log, "periodic flush")
        while not self._stop.wait(interval):
            try:
                self._flush_all()
                failures.worked()
                self._flush_error = None
            except (OSError, StoreError) as exc:
                failures.failed(exc)
                self._flush_error = as_store_error(exc)

    def _check_open(self) -> None:
        if not self._running:
            raise StoreClosedError("the message store is closed")

    # ---------------------------------------------------------------------------------------- read

    def get_messages(  # noqa: PLR0917 - RocketMQ's getMessage signature
        self,
        group: str,
        topic: str,
        queue_id: int,
        offset: int,
        max_count: int,
        message_filter: MessageFilter | None = None,
        *,
        catch_up: bool = True,
        max_bytes: int | None = None,
        hold_one: bool = True,
    ) -> GetMessageResult:
        """Pull up to ``max_count`` messages from ``offset`` (RocketMQ's getMessage).

        Statuses and ``next_begin_offset`` follow RocketMQ for a master broker. At most
        ``max(16000 bytes, max_count * 20)`` of index (and never past the end of the index segment)
        is scanned per call. A batch is full at ``max_count`` messages or at the configured
        transfer limits (``max_transfer_bytes``, or ``max_bytes`` when given; ``max_transfer_count``),
        but holds one at least, unless ``hold_one`` is False: then a first message past ``max_bytes``
        ends the read before it (status ``NO_MATCHED_MESSAGE``, ``next_begin_offset`` at it, nothing
        scanned), for a caller whose answer already holds messages.
        Every message whose ``put_message`` returned before the call is visible.
        A damaged record (or the filler entry of one lost to damage) is passed over and counted
        in :attr:`damaged_reads`. Without ``catch_up``, only what is indexed so far is seen
        (:meth:`catch_up_now` tells whether that is everything).
        """
        del group  # kept for RocketMQ's signature (statistics)
        self._check_open()
        if max_count < 1:
            raise ValueError("max_count must be at least 1")
        cq = self.find_consume_queue(topic, queue_id, catch_up=catch_up)
        return self.reader.get_messages(
            cq, offset, max_count, message_filter, max_bytes=max_bytes, hold_one=hold_one
        )

    def get_records(
        self,
        topic: str,
        queue_id: int,
        offset: int,
        max_count: int,
        message_filter: MessageFilter | None = None,
    ) -> tuple[GetMessageResult, list[RawRecord]]:
        """:meth:`get_messages` for a consumer's filter program: the messages the filter accepts (both
        stages), checked but for their CRC, and not decoded (without a filter, not even their
        properties). :meth:`decode_raw` checks the CRC of the few the program keeps and decodes
        them. The result's ``messages`` is empty."""
        self._check_open()
        if max_count < 1:
            raise ValueError("max_count must be at least 1")
        cq = self.find_consume_queue(topic, queue_id)
        result = self.reader.get_messages(cq, offset, max_count, message_filter, raw=True)
        records = cast(list[RawRecord], result.messages)  # raw=True: records in place of messages
        return replace(result, messages=[]), records

    def decode_raw(self, topic: str, queue_id: int, record: RawRecord) -> StoredMessage | None:
        """The message of a record :meth:`get_records` gave; None when it is damaged (passed over
        and counted in :attr:`damaged_reads`) or its topic was deleted meanwhile."""
        cq = self.find_consume_queue(topic, queue_id)
        if cq is None:
            return None
        return self.reader.decode_raw(cq, record)

    @property
    def damaged_reads(self) -> int:
        """Records reads passed over because they are damaged (see ``siftmq store check``)."""
        return self.reader.damaged_reads

    # ------------------------------------------------------------------------------------ deletion

    def delete_topic(self, topic: str) -> int:
        """Delete ``topic``'s messages: its queues go at once, and every record of it stored so far
        is dead to dispatch, recovery, lookups and the offline jobs (see :mod:`siftmq.store.tombstones`).

        A topic created again under the name starts empty. Returns how many queues were deleted.
        """
        self._check_open()
        with self._append_lock, self._dispatch_lock:
            self.tombstones.add(topic, self.commit_log.max_offset)  # first: a crash after it finishes it
            with self._queues_lock:
                doomed = [key for key in self._queues if key[0] == topic]
                queues = [self._queues.pop(key) for key in doomed]
            for cq in queues:
                cq.destroy()
            for key in [k for k in self.commit_log.queue_offsets if k[0] == topic]:
                del self.commit_log.queue_offsets[key]
        for kind in ("consumequeue", "consumequeue_ext"):
            shutil.rmtree(self.data_dir / kind / topic, ignore_errors=True)
        _log.info("deleted topic %s: %d queue(s); its stored records are dead", topic, len(queues))
        return len(queues)

    # ------------------------------------------------------------------------------------- lookups

    @property
    def min_commit_log_offset(self) -> int:
        """The first CommitLog offset still stored."""
        return self.commit_log.min_offset

    @property
    def max_store_timestamp(self) -> int:
        """The largest store timestamp (ms) any record of this store has had, across restarts; 0
        for an empty store. At least every record's own, even after the wall clock stepped back."""
        return self._max_store_timestamp

    @property
    def max_commit_log_offset(self) -> int:
        """The CommitLog offset the next record is written at."""
        return self.commit_log.max_offset

    @property
    def commit_log_bytes(self) -> int:
        """Bytes the CommitLog holds (from its first stored offset to its end)."""
        return self.commit_log.max_offset - self.commit_log.min_offset

    def look_message_by_offset(self, commit_log_offset: int, size: int | None = None) -> StoredMessage | None:
        """The message stored at ``commit_log_offset``; None if not stored there (removed, beyond,
        or of a deleted topic).

        Raises :class:`CorruptRecordError` if the offset is not the start of an intact record.
        """
        self._check_open()
        if commit_log_offset < 0 or commit_log_offset >= self.commit_log.max_offset:
            return None
        msg = self.commit_log.read_message(commit_log_offset, size)
        if msg is not None and self.tombstones and self.tombstones.is_dead(msg.topic, commit_log_offset):
            return None
        return msg

    def query_message_by_uniq_key(self, uniq_key: str) -> StoredMessage | None:
        """The newest message with this UNIQ_KEY (client message id), from the in-memory key index."""
        self._check_open()
        if self.key_index is None:
            raise StoreError("the key index is disabled (build_key_index=False)")
        off = self.key_index.offset_of_uniq_key(uniq_key)
        return None if off is None else self.look_message_by_offset(off)

    def query_messages_by_key(self, topic: str, key: str, max_count: int = 32) -> list[StoredMessage]:
        """Up to ``max_count`` newest messages of ``topic`` whose KEYS include ``key``, oldest first."""
        self._check_open()
        if self.key_index is None:
            raise StoreError("the key index is disabled (build_key_index=False)")
        found: list[StoredMessage] = []
        for off in self.key_index.offsets_of_key(topic, key)[-max_count:]:
            msg = self.look_message_by_offset(off)
            if msg is not None:
                found.append(msg)
        return found

    # ----------------------------------------------------------------------------------- retention

    def delete_expired_files(
        self,
        *,
        now_ms: int | None = None,
        disk_usage_ratio: Callable[[], float] | None = None,
        before_forced_delete: Callable[[int, int], None] | None = None,
    ) -> retention.RetentionResult:
        """Delete CommitLog segments past their age, and younger ones for space only under the
        ``delete_oldest`` policy (see retention.py)."""
        self._check_open()
        self.reput_service.catch_up()
        result = retention.delete_expired(
            self, now_ms=now_ms, disk_usage_ratio=disk_usage_ratio, before_forced_delete=before_forced_delete
        )
        for topic in self.tombstones.prune(self.commit_log.min_offset):
            _log.info("the last stored record of deleted topic %s is gone; its tombstone is dropped", topic)
        return result

    def queue_offset_at(self, topic: str, queue_id: int, commit_log_offset: int) -> int:
        """The first offset of a queue whose message starts at or past ``commit_log_offset`` (the
        queue's max offset when none does): the messages of the queue below an offset of the log."""
        cq = self.find_consume_queue(topic, queue_id)
        if cq is None:
            return 0
        lo, hi = cq.min_offset, cq.max_offset
        while lo < hi:  # entries are in CommitLog order
            mid = (lo + hi) // 2
            entry = cq.get_entry(mid)
            if entry is not None and entry[0] < commit_log_offset:
                lo = mid + 1
            else:
                hi = mid
        return lo

    # internal hooks for retention.py
    def _retention_locks(self) -> tuple[threading.Lock, threading.Lock]:
        return self._append_lock, self._dispatch_lock

    def _all_queues(self) -> list[ConsumeQueue]:
        return list(self._queues.values())
