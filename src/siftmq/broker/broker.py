"""The broker: topics, sends, filtered receives with invisible time, acks, redelivery and dead letters.

Synchronous and thread-safe; the gRPC edge calls it from a thread pool (long polling is in
:mod:`siftmq.broker.long_polling`). Layout of the data directory::

    <data_dir>/store/...                the message store (CommitLog, ConsumeQueue, ext, checkpoint)
    <data_dir>/config/topics.json       topics
    <data_dir>/config/filters.json      SQL92 filter registrations (bloom keys group#topic)
    <data_dir>/config/programs.json     filter programs (per group and topic, versioned)
    <data_dir>/config/consumer_state.json   per-group progress and in-flight messages
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Callable
from typing import Final

from siftmq.broker.client_state import ClientStateSweeper
from siftmq.broker.clients import ClientRegistry
from siftmq.broker.config import BrokerConfig
from siftmq.broker.consumer_state import ConsumerStateTable
from siftmq.broker.filter_registry import FilterRegistry
from siftmq.broker.groups import GroupManager
from siftmq.broker.inspect import Inspecting
from siftmq.broker.mode_switch import group_of
from siftmq.broker.offsets import OffsetTable
from siftmq.broker.programs import ProgramRegistry
from siftmq.broker.pull import Pulling
from siftmq.broker.receive import Receiving
from siftmq.broker.reports import Reporting
from siftmq.broker.stats import BrokerStats
from siftmq.broker.topics import TopicManager
from siftmq.errors import RepeatingFailure, StateWriteError, StoreError
from siftmq.filter import BloomFilter
from siftmq.filterserver.pool import Limits
from siftmq.store import (
    MessageStore,
    StoreConfig,
)

_log = logging.getLogger(__name__)
#: The consumer-progress file is written at most once per this many times the last write took (and
#: at most once per ``consumer_state_flush_ms``): a write lists every message in flight under the
#: GIL (~130 ms for 100,000), and this keeps such writes to a twentieth of the time.
SAVE_SPACING: Final = 20
#: ... and at least this often while progress changes (a write slowed by a stall, or waiting for
#: queue locks, must not put the next one off for minutes: older progress after a crash means
#: more deliveries again). Removed progress is written at the next pass whatever the spacing.
MAX_SAVE_GAP_S: Final = 5.0


def _attempt(what: str, step: Callable[[], None], failed: list[str]) -> None:
    """Run one step of a stop; a failure is logged (one line for the expected ones: the disk, the
    file system) and added to ``failed`` instead of ending the stop."""
    try:
        step()
    except (OSError, StoreError) as exc:
        # an OS error's reason alone: its file name is the temporary file's
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        _log.error("stopping: could not %s: %s", what, reason)
        failed.append(what)
    except Exception:
        _log.exception("stopping: could not %s", what)
        failed.append(what)


class Broker(Inspecting, Receiving, Pulling, Reporting):
    """One broker over one data directory. Call :meth:`start`, then :meth:`close`."""

    def __init__(self, config: BrokerConfig) -> None:
        self.config = config
        config_dir = config.data_dir / "config"
        config_dir.mkdir(parents=True, exist_ok=True)
        self.bloom = BloomFilter()
        self.topics = TopicManager(
            config_dir,
            auto_create=config.auto_create_topics,
            default_queue_nums=config.default_queue_nums,
            max_queue_nums=config.max_queue_nums,
            max_topics=config.max_topics,
        )
        self.filters = FilterRegistry(
            config_dir,
            self.bloom,
            expire_s=config.filter_registration_expire_s,
            latest_store_time=lambda: self.store.max_store_timestamp,
        )
        self.groups = GroupManager(
            config_dir,
            compat_groups=config.compat_groups,
            broadcasting_groups=config.broadcasting_groups,
            restore_grace_s=config.client_session_expire_s,
            max_groups=config.max_groups,
        )
        self.programs = ProgramRegistry(
            config_dir,
            Limits(
                memory_mb=config.filter_program_memory_mb,
                timeout_ms=config.filter_program_timeout_ms,
                batch_timeout_ms=config.filter_program_batch_timeout_ms,
                max_failures=config.filter_program_max_failures,
            ),
            config.filter_server_nums,
        )
        self.consumers = ConsumerStateTable(config_dir)
        self.offsets = OffsetTable(config_dir)
        self.groups.adopt(
            group_of(name) or name
            for name in {key[0] for key, _ in [*self.consumers.items(), *self.offsets.items()]}
        )
        self.clients = ClientRegistry(config.client_session_expire_s)
        self.client_states = ClientStateSweeper(
            self.consumers, self.offsets, self.clients, config.broadcast_client_expire_s
        )
        self.stats = BrokerStats()
        self.store = MessageStore(
            StoreConfig(
                data_dir=config.data_dir / "store",
                commit_log_segment_size=config.commit_log_segment_size,
                max_message_size=config.max_body_size,
                flush_mode=config.flush,
                flush_interval_ms=config.flush_interval_ms,
                bitmap_size=self.bloom.bitmap_size,
                file_reserved_time_ms=int(config.retention_hours * 3600 * 1000),
                disk_max_used_space_ratio=config.disk_max_used_space_ratio,
                disk_full_policy=config.disk_full_policy,
                disk_high_water_ratio=config.disk_high_water_ratio,
                disk_reserve_bytes=config.disk_reserve_bytes,
                key_index_max_messages=config.key_index_max_messages,
                # one store read per pull: the pull's own bounds apply (each read costs ~30 us
                # however few it returns; at the store's 32 messages that was ~1 us a message)
                max_transfer_count=config.max_pull_batch_size,
                max_transfer_bytes=config.max_pull_bytes,
            ),
            bitmap_dispatcher=self.filters,
        )
        self._arrival_listeners: list[Callable[[set[str]], None]] = []
        self._queue_cursor = itertools.count()
        self._send_locks = [threading.Lock() for _ in range(64)]
        self._stop = threading.Event()
        self._housekeeper: threading.Thread | None = None

    # ---------------------------------------------------------------------------------- lifecycle

    def start(self) -> None:
        self.store.add_message_arriving_listener(self._on_arrival)
        self.store.start()
        self._cover_stored_queues()
        for topic in self.topics.all():
            for qid in range(topic.queue_nums):
                self.store.create_queue(topic.name, qid)
        self._clamp_progress_past_queue_ends()
        self._stop.clear()
        self._housekeeper = threading.Thread(
            target=self._housekeeping, name="siftmq-broker-housekeeping", daemon=True
        )
        self._housekeeper.start()

    def _cover_stored_queues(self) -> None:
        """Bring the topic table up to the queues the store holds (see :meth:`TopicManager.cover`).
        A topic deleted (it has a tombstone) whose queues hold no entry counts as deleted: a
        deletion a crash cut short between the store and the topic table leaves such empty queues,
        and the topic must not come back. Queues holding entries after a deletion are a topic
        created again: their messages count."""
        counts: dict[str, int] = {}
        for topic, queue_id in self.store.queues():
            counts[topic] = max(counts.get(topic, 0), queue_id + 1)
        tombstones = self.store.tombstones
        deleted = {t.name for t in self.topics.all() if tombstones.offset(t.name) is not None}
        for topic in [t for t in counts if tombstones.offset(t) is not None]:
            if all(self.store.get_max_offset_in_queue(topic, q) == 0 for q in range(counts[topic])):
                del counts[topic]
        self.topics.cover(counts, deleted - counts.keys())

    def _clamp_progress_past_queue_ends(self) -> None:
        """Progress past its queue's end is brought back to the end, its messages in flight there
        forgotten, as a read past the end would reset it, but at start. A topic deleted (its queues
        too) without the removal of its groups' progress reaching the disk (a crash in between)
        leaves such progress: kept, a topic created again would be read from the old positions,
        skipping its first messages. A power loss can leave it too (a queue's unflushed tail lost):
        its messages still in flight below the end stay in flight. Nothing else can be past an end
        (recovery keeps every queue offset handed out; commits are checked against the end)."""
        ends: dict[tuple[str, int], int] = {}

        def end_of(key: tuple[str, str, int]) -> int:
            queue = (key[1], key[2])
            if queue not in ends:
                ends[queue] = self.store.get_max_offset_in_queue(*queue)
            return ends[queue]

        past = [key for key, prog in self.consumers.items() if prog.pop_offset > end_of(key)]
        past_offsets = [key for key, offset in self.offsets.items() if offset > end_of(key)]
        for key in past:
            self.consumers.clamp(key, end_of(key))
        for key in past_offsets:
            self.offsets.set(key, end_of(key))
        if past or past_offsets:
            _log.warning(
                "brought the progress of %d and the pull offsets of %d queue(s) back to their queue's "
                "end (left by a topic deletion cut short, or a power loss)",
                len(past),
                len(past_offsets),
            )

    def close(self) -> None:
        """Stop background work, write consumer state and registrations, close the store (flushes)."""
        self._stop.set()
        if self._housekeeper is not None:
            self._housekeeper.join()
            self._housekeeper = None
        # each on its own: a file that cannot be written (a full disk, a read-only directory)
        # must not keep the others from being written, nor the store from being closed
        failed: list[str] = []
        try:
            for what, step in (
                ("stop the filter program servers", self.programs.close),
                (f"write {self.consumers.path}", self.consumers.save),
                (f"write {self.offsets.path}", self.offsets.save),
                (f"write {self.filters.path}", self.filters.save),
            ):
                _attempt(what, step, failed)
        finally:
            _attempt(f"close the store in {self.store.data_dir}", self.store.close, failed)
        if failed:
            raise StateWriteError(
                f"stopped, but could not {'; could not '.join(failed)} (see the errors above): the "
                "next start reads the state written before (consumer progress from it delivers some "
                "messages again); make room or make the directory writable"
            )

    def _on_arrival(self, topic: str, queue_id: int, max_offset: int) -> None:
        for listener in list(self._arrival_listeners):
            listener({topic})

    def add_arrival_listener(self, listener: Callable[[set[str]], None]) -> None:
        """``listener(topics)`` is called when messages become readable, from the thread that indexed
        them (the store's reput thread, a reader, or the appending thread: often the event loop)."""
        self._arrival_listeners.append(listener)

    def _housekeeping(self) -> None:
        flush_s = self.config.consumer_state_flush_ms / 1000
        last_sweep = 0.0
        last_retention = time.monotonic()
        next_save = 0.0
        retention = RepeatingFailure(_log, "broker housekeeping: retention")
        progress = RepeatingFailure(_log, "broker housekeeping: saving consumer progress")
        offsets = RepeatingFailure(_log, "broker housekeeping: saving pull offsets")
        clients = RepeatingFailure(_log, "broker housekeeping: expiring clients")

        def save_consumers() -> None:
            nonlocal next_save
            consumers = self.consumers
            if consumers.dirty and (time.monotonic() >= next_save or consumers.urgent):
                started = time.monotonic()
                consumers.save()
                next_save = started + min(SAVE_SPACING * (time.monotonic() - started), MAX_SAVE_GAP_S)

        def sweep() -> None:
            self.clients.expire()
            self.filters.touch_groups(set(self.clients.live_groups()))
            self.filters.expire()
            self.client_states.sweep()

        while not self._stop.wait(flush_s):
            # each step on its own, retention first: a state file that cannot be written (a full
            # disk) must not stop the retention that would make room
            if time.monotonic() - last_retention >= self.config.retention_check_interval_s:
                last_retention = time.monotonic()
                retention.run(self.apply_retention)
            progress.run(save_consumers)
            if self.offsets.dirty:
                offsets.run(self.offsets.save)
            if time.monotonic() - last_sweep >= 10:
                last_sweep = time.monotonic()
                clients.run(sweep)

    def apply_retention(self) -> None:
        """Delete CommitLog segments past ``retention_hours`` (and, under ``disk_full_policy =
        "delete_oldest"``, younger ones while the disk is too full, saying what that cost)."""
        result = self.store.delete_expired_files(before_forced_delete=self._report_forced_delete)
        if result.commit_log_segments:
            _log.info(
                "retention: deleted %d CommitLog and %d ConsumeQueue segments; the log now starts at %d",
                result.commit_log_segments,
                result.consume_queue_segments,
                result.commit_log_min_offset,
            )

    def _report_forced_delete(self, start: int, end: int) -> None:
        """Before an unexpired segment is deleted for space: what each group had not consumed of it."""
        lost = self.unconsumed_between(start, end)
        for group, n in lost.items():
            self.stats.count(self.stats.deleted_unconsumed, group, n)
        _log.warning(
            "disk_full_policy delete_oldest: deleting CommitLog [%d, %d) before it expired; messages not "
            "consumed yet, per group: %s",
            start,
            end,
            ", ".join(f"{g}={n}" for g, n in sorted(lost.items())) or "none",
        )

    def unconsumed_between(self, start: int, end: int) -> dict[str, int]:
        """Per group with progress on a queue, the messages stored in CommitLog ``[start, end)`` it
        has not consumed (received and acked, or pulled and committed)."""
        progress: list[tuple[tuple[str, str, int], int]] = list(self.offsets.items())
        for key, prog in self.consumers.items():
            with prog.lock:
                progress.append((key, prog.committed_offset))
        lost: dict[str, int] = {}
        for (group, topic, queue_id), offset in progress:
            first = max(offset, self.store.queue_offset_at(topic, queue_id, start))
            past = self.store.queue_offset_at(topic, queue_id, end)
            if past > first:
                lost[group] = lost.get(group, 0) + past - first
        return lost
