"""MessageStore: the facade the broker calls (RocketMQ's DefaultMessageStore).

Layout of ``data_dir``::

    lock                  fcntl.flock'ed while a process has the store open
    abort                 present while open; found at open = the previous run crashed
    checkpoint            durable positions (see recovery.py)
    commitlog/            CommitLog segments
    consumequeue/<topic>/<queue_id>/       ConsumeQueue segments
    consumequeue_ext/<topic>/<queue_id>/   ConsumeQueueExt segments

Threads: appends are serialised by one lock (with encoding done before it); dispatch runs
under a second lock, in CommitLog order, right after the appending thread's records are
written (async mode) or durable (sync mode), so when ``put_message`` returns, the message is
indexed. Reads take no lock. The broker may call every method via ``asyncio.to_thread``.
"""

from __future__ import annotations

import collections
import fcntl
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from types import TracebackType

import numpy as np

from siftmq.errors import CorruptRecordError, StoreClosedError, StoreError, StoreLockedError
from siftmq.store import codec, retention
from siftmq.store.codec import Message, StoredMessage
from siftmq.store.commitlog import AppendedRecord, CommitLog
from siftmq.store.config import StoreConfig
from siftmq.store.consumequeue import CQ_STORE_UNIT_SIZE, ConsumeQueue
from siftmq.store.consumequeue_ext import ConsumeQueueExt
from siftmq.store.dispatch import BitmapDispatcher, CommitLogDispatcher, DispatchRequest, Reput
from siftmq.store.filtering import BlockMessageFilter, GetMessageResult, GetMessageStatus, MessageFilter
from siftmq.store.keyindex import KeyIndex
from siftmq.store.recovery import Checkpoint, recover
from siftmq.store.segment import fsync_dir

_log = logging.getLogger(__name__)

_MAX_FILTER_BYTES = 16000  # RocketMQ: index bytes scanned per getMessage at least


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
    ) -> None:
        self.config = config
        self.data_dir = config.data_dir
        self.commit_log = CommitLog(
            self.data_dir / "commitlog", config.commit_log_segment_size, config.max_record_size
        )
        self._queues: dict[tuple[str, int], ConsumeQueue] = {}
        self._queues_lock = threading.Lock()
        self._reput = Reput(self.find_or_create_consume_queue)
        self._reput.dispatchers.extend(dispatchers)
        self._reput.bitmap_dispatcher = bitmap_dispatcher
        self.key_index = KeyIndex() if config.build_key_index else None
        self._append_lock = threading.Lock()
        self._dispatch_lock = threading.Lock()
        self._pending: collections.deque[DispatchRequest] = collections.deque()
        self._dispatched_offset = 0
        self._commit_cond = threading.Condition()
        self._commit_leader = False
        self._lock_fd = -1
        self._running = False
        self._stop = threading.Event()
        self._flusher: threading.Thread | None = None
        self._flush_error: StoreError | None = None
        self._checkpoint_lock = threading.Lock()

    # ---------------------------------------------------------------------------------- lifecycle

    @classmethod
    def open(
        cls,
        config: StoreConfig,
        *,
        dispatchers: Iterable[CommitLogDispatcher] = (),
        bitmap_dispatcher: BitmapDispatcher | None = None,
    ) -> MessageStore:
        """Construct and :meth:`start` a store."""
        store = cls(config, dispatchers=dispatchers, bitmap_dispatcher=bitmap_dispatcher)
        store.start()
        return store

    def start(self) -> None:
        """Lock the data dir, recover, and start the flush thread.

        Raises :class:`StoreLockedError` if another process (or store object) has it open.
        """
        if self._running:
            return
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._lock_data_dir()
        try:
            abort = self.data_dir / "abort"
            abnormal = abort.exists()
            if abnormal:
                _log.warning("%s: the previous run did not close cleanly; recovering", self.data_dir)
            self.commit_log.load()
            self._load_queues()
            recover(
                self.commit_log,
                self._queues,
                self.find_or_create_consume_queue,
                self._reput,
                self.key_index,
                abnormal=abnormal,
                checkpoint=Checkpoint.load(self.data_dir / "checkpoint"),
            )
            self._dispatched_offset = self.commit_log.max_offset
            self._flush_all()
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
        self._flusher = threading.Thread(target=self._flush_loop, name="siftmq-store-flush", daemon=True)
        self._flusher.start()

    def close(self) -> None:
        """Flush everything, write the checkpoint, remove the abort marker, release the lock."""
        if not self._running:
            return
        with self._append_lock:
            self._running = False
        self._stop.set()
        if self._flusher is not None:
            self._flusher.join()
        try:
            self._drain(None)
            self._flush_all()
            (self.data_dir / "abort").unlink(missing_ok=True)
            fsync_dir(self.data_dir)
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
                    self._queues[(cq.topic, cq.queue_id)] = cq

    def _new_queue(self, topic: str, queue_id: int) -> ConsumeQueue:
        cfg = self.config
        ext = None
        if cfg.enable_consume_queue_ext:
            ext = ConsumeQueueExt(
                self.data_dir / "consumequeue_ext" / topic / str(queue_id),
                cfg.consume_queue_entries_per_file,
                cfg.bitmap_size,
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
        """Register a dispatcher for records appended from now on."""
        with self._dispatch_lock:
            self._reput.dispatchers.append(dispatcher)

    def set_bitmap_dispatcher(self, dispatcher: BitmapDispatcher | None) -> None:
        """Set (or clear) the dispatcher computing ConsumeQueueExt bitmaps."""
        with self._dispatch_lock:
            self._reput.bitmap_dispatcher = dispatcher

    # ------------------------------------------------------------------------------------- queues

    def find_consume_queue(self, topic: str, queue_id: int) -> ConsumeQueue | None:
        """The queue's index, or None if the queue was never created or written."""
        return self._queues.get((topic, queue_id))

    def find_or_create_consume_queue(self, topic: str, queue_id: int) -> ConsumeQueue:
        """The queue's index, created empty if needed."""
        key = (topic, queue_id)
        cq = self._queues.get(key)
        if cq is None:
            codec.check_topic(topic)
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
        """The queue offset the next message will get (0 for an unknown queue)."""
        cq = self.find_consume_queue(topic, queue_id)
        return cq.max_offset if cq else 0

    def queues(self) -> list[tuple[str, int]]:
        """Every known (topic, queue_id)."""
        return sorted(self._queues)

    # -------------------------------------------------------------------------------------- append

    def put_message(self, message: Message) -> AppendedRecord:
        """Append one message; see :meth:`put_messages`."""
        return self.put_messages([message])[0]

    def put_messages(self, messages: Sequence[Message]) -> list[AppendedRecord]:
        """Append messages (one write; in sync mode one shared fdatasync) and index them.

        Raises ``ValueError`` for a malformed message, :class:`MessageTooLargeError` over the
        limits (nothing of the batch is stored then), :class:`StoreClosedError` after close.
        """
        prepared = [codec.prepare(m, max_body_size=self.config.max_message_size) for m in messages]
        if not prepared:
            return []
        with self._append_lock:
            self._check_open()
            if self._flush_error is not None:
                raise StoreError(f"the store cannot flush: {self._flush_error}")
            now = time.time_ns() // 1_000_000
            results = self.commit_log.append(prepared, now)
            for parts, rec in zip(prepared, results, strict=True):
                props = dict(parts.message.properties)
                self._pending.append(
                    DispatchRequest(
                        topic=rec.topic,
                        queue_id=rec.queue_id,
                        commit_log_offset=rec.commit_log_offset,
                        msg_size=rec.size,
                        tags_code=codec.tags_code_of(props.get(codec.PROPERTY_TAGS)),
                        store_timestamp=now,
                        consume_queue_offset=rec.queue_offset,
                        keys=props.get(codec.PROPERTY_KEYS, ""),
                        uniq_key=props.get(codec.PROPERTY_UNIQ_KEY),
                        properties=props,
                    )
                )
        end = results[-1].commit_log_offset + results[-1].size
        if self.config.flush_mode == "sync":
            self._group_commit(end)
            self._drain(self.commit_log.flushed_offset)
        else:
            self._drain(None)
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
        finally:
            with self._commit_cond:
                self._commit_leader = False
                self._commit_cond.notify_all()

    def _drain(self, limit: int | None) -> None:
        """Dispatch pending requests below ``limit`` (all with None), in order."""
        with self._dispatch_lock:
            batch: list[DispatchRequest] = []
            pending = self._pending
            while pending and (limit is None or pending[0].commit_log_offset < limit):
                batch.append(pending.popleft())
            if not batch:
                return
            try:
                self._reput.dispatch(batch)
            except OSError as exc:
                raise StoreError(f"writing the consume queue failed: {exc}") from exc
            if self.key_index is not None:
                self.key_index.dispatch(batch)
            self._dispatched_offset = batch[-1].commit_log_offset + batch[-1].msg_size

    # --------------------------------------------------------------------------------------- flush

    def flush(self) -> None:
        """Flush CommitLog and ConsumeQueues now and write the checkpoint."""
        self._check_open()
        self._flush_all()

    def _flush_all(self) -> None:
        with self._checkpoint_lock:
            self.commit_log.flush()
            with self._dispatch_lock:
                dispatched = self._dispatched_offset
                queues = list(self._queues.values())
            for cq in queues:
                cq.flush()
            Checkpoint(self.commit_log.flushed_offset, dispatched).save(self.data_dir / "checkpoint")

    def _flush_loop(self) -> None:
        interval = self.config.flush_interval_ms / 1000.0
        while not self._stop.wait(interval):
            try:
                if self.config.flush_mode == "async":
                    self._drain(None)
                self._flush_all()
                self._flush_error = None
            except (OSError, StoreError) as exc:
                _log.exception("periodic flush failed")
                self._flush_error = exc if isinstance(exc, StoreError) else StoreError(str(exc))

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
    ) -> GetMessageResult:
        """Pull up to ``max_count`` messages from ``offset`` (RocketMQ's getMessage).

        Statuses and ``next_begin_offset`` follow RocketMQ for a master broker. At most
        ``max(16000 bytes, max_count * 20)`` of index (and never past the end of the index segment)
        is scanned per call. A batch is full at ``max_count`` messages or at the configured
        transfer limits (``max_transfer_bytes``/``max_transfer_count``), but always holds one.
        Raises :class:`CorruptRecordError` if an index entry leads to a damaged record.
        """
        del group  # kept for RocketMQ's signature (statistics)
        self._check_open()
        if max_count < 1:
            raise ValueError("max_count must be at least 1")
        cq = self.find_consume_queue(topic, queue_id)
        if cq is None:
            return GetMessageResult(GetMessageStatus.NO_MATCHED_LOGIC_QUEUE, 0, 0, 0)
        min_offset = cq.min_offset
        max_offset = cq.max_offset
        S = GetMessageStatus
        if max_offset == 0:
            return GetMessageResult(S.NO_MESSAGE_IN_QUEUE, 0, min_offset, max_offset)
        if offset < min_offset:
            return GetMessageResult(S.OFFSET_TOO_SMALL, min_offset, min_offset, max_offset)
        if offset == max_offset:
            return GetMessageResult(S.OFFSET_OVERFLOW_ONE, offset, min_offset, max_offset)
        if offset > max_offset:
            nxt = min_offset if min_offset == 0 else max_offset
            return GetMessageResult(S.OFFSET_OVERFLOW_BADLY, nxt, min_offset, max_offset)
        max_entries = max(_MAX_FILTER_BYTES, max_count * CQ_STORE_UNIT_SIZE) // CQ_STORE_UNIT_SIZE
        entries = cq.read_block(offset, min(max_entries, max_offset - offset))
        if entries is None or len(entries) == 0:
            return GetMessageResult(S.OFFSET_FOUND_NULL, cq.roll_next_file(offset), min_offset, max_offset)
        return self._scan(cq, entries, offset, max_count, message_filter, bounds=(min_offset, max_offset))

    def _scan(
        self,
        cq: ConsumeQueue,
        entries: np.ndarray,
        offset: int,
        max_count: int,
        message_filter: MessageFilter | None,
        *,
        bounds: tuple[int, int],
    ) -> GetMessageResult:
        min_offset, max_offset = bounds
        n = len(entries)
        candidates = self._index_candidates(cq, entries, offset, message_filter)
        commit_log_offsets = entries["commit_log_offset"]
        sizes = entries["size"]
        status = GetMessageStatus.NO_MATCHED_MESSAGE
        messages: list[StoredMessage] = []
        total = 0
        next_phy_file_start = -1
        scanned = n
        removing_at = -1
        max_bytes = self.config.max_transfer_bytes
        max_msgs = min(max_count, self.config.max_transfer_count)
        for idx in candidates.tolist():
            offset_py = int(commit_log_offsets[idx])
            size_py = int(sizes[idx])
            if offset_py < next_phy_file_start:
                continue
            if messages and (len(messages) >= max_msgs or total + size_py > max_bytes):
                scanned = idx
                break
            msg = self.commit_log.read_message(offset_py, size_py)
            if msg is None:
                if not messages:
                    status = GetMessageStatus.MESSAGE_WAS_REMOVING
                    removing_at = idx
                next_phy_file_start = self.commit_log.roll_next_file(offset_py)
                continue
            if msg.topic != cq.topic or msg.queue_id != cq.queue_id or msg.queue_offset != offset + idx:
                raise CorruptRecordError(
                    f"consume queue {cq.topic}:{cq.queue_id} entry {offset + idx} points at a record of "
                    f"{msg.topic}:{msg.queue_id}@{msg.queue_offset}",
                    offset=offset_py,
                )
            if message_filter is not None and not message_filter.is_matched_by_commit_log(msg.properties):
                if not messages:
                    status = GetMessageStatus.NO_MATCHED_MESSAGE
                continue
            messages.append(msg)
            total += size_py
            status = GetMessageStatus.FOUND
            next_phy_file_start = -1
        if status is GetMessageStatus.MESSAGE_WAS_REMOVING and len(candidates) < n:
            # RocketMQ flips to NO_MATCHED_MESSAGE when an index-rejected entry follows
            rejected = np.ones(n, dtype=bool)
            rejected[candidates] = False
            if rejected[removing_at + 1 : scanned].any():
                status = GetMessageStatus.NO_MATCHED_MESSAGE
        return GetMessageResult(status, offset + scanned, min_offset, max_offset, messages, scanned)

    def _index_candidates(
        self, cq: ConsumeQueue, entries: np.ndarray, offset: int, message_filter: MessageFilter | None
    ) -> np.ndarray:
        n = len(entries)
        if message_filter is None:
            return np.arange(n)
        tags_codes = entries["tags_code"].astype(np.int64)
        ext_block = cq.ext.read_block(offset, n) if cq.ext is not None else None
        if isinstance(message_filter, BlockMessageFilter):
            mask = np.asarray(message_filter.match_consume_queue_block(tags_codes, ext_block), dtype=bool)
            if mask.shape != (n,):
                raise ValueError(f"match_consume_queue_block returned shape {mask.shape}, expected ({n},)")
            return np.flatnonzero(mask)
        have_ext = 0 if ext_block is None else len(ext_block.present)
        keep = [
            i
            for i in range(n)
            if message_filter.is_matched_by_consume_queue(
                int(tags_codes[i]), ext_block.unit(i) if ext_block is not None and i < have_ext else None
            )
        ]
        return np.asarray(keep, dtype=np.int64)

    # ------------------------------------------------------------------------------------- lookups

    @property
    def min_commit_log_offset(self) -> int:
        """The first CommitLog offset still stored."""
        return self.commit_log.min_offset

    @property
    def max_commit_log_offset(self) -> int:
        """The CommitLog offset the next record is written at."""
        return self.commit_log.max_offset

    def look_message_by_offset(self, commit_log_offset: int, size: int | None = None) -> StoredMessage | None:
        """The message stored at ``commit_log_offset``; None if not stored there (removed or beyond).

        Raises :class:`CorruptRecordError` if the offset is not the start of an intact record.
        """
        self._check_open()
        if commit_log_offset < 0 or commit_log_offset >= self.commit_log.max_offset:
            return None
        return self.commit_log.read_message(commit_log_offset, size)

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
        self, *, now_ms: int | None = None, disk_usage_ratio: Callable[[], float] | None = None
    ) -> retention.RetentionResult:
        """Delete CommitLog segments past their age or while the disk is too full (see retention.py)."""
        self._check_open()
        return retention.delete_expired(self, now_ms=now_ms, disk_usage_ratio=disk_usage_ratio)

    # internal hooks for retention.py
    def _retention_locks(self) -> tuple[threading.Lock, threading.Lock]:
        return self._append_lock, self._dispatch_lock

    def _all_queues(self) -> list[ConsumeQueue]:
        return list(self._queues.values())
