"""The broker: topics, sends, filtered receives with invisible time, acks, redelivery and dead letters.

Synchronous and thread-safe; the gRPC edge calls it from a thread pool (long polling is in
:mod:`siftmq.broker.long_polling`). Layout of the data directory::

    <data_dir>/store/...                the message store (CommitLog, ConsumeQueue, ext, checkpoint)
    <data_dir>/config/topics.json       topics
    <data_dir>/config/filters.json      SQL92 filter registrations (bloom keys group#topic)
    <data_dir>/config/consumer_state.json   per-group progress and in-flight messages
"""

from __future__ import annotations

import itertools
import logging
import secrets
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from siftmq.broker.client_state import ClientStateSweeper, client_progress_group
from siftmq.broker.clients import ClientRegistry
from siftmq.broker.config import BrokerConfig
from siftmq.broker.consumer_state import ConsumerStateTable, InFlight, QueueProgress
from siftmq.broker.filter_registry import FilterRegistry
from siftmq.broker.groups import GroupManager, GroupSubscription, SubscriptionConflictError
from siftmq.broker.message_filters import TagMessageFilter
from siftmq.broker.model import (
    PROPERTY_BORN_HOST,
    PROPERTY_DLQ_ORIGIN_MESSAGE_ID,
    PROPERTY_DLQ_ORIGIN_TOPIC,
    Delivery,
    OutgoingBatch,
    OutgoingMessage,
    PullResult,
    SendResult,
    Subscription,
)
from siftmq.broker.offsets import OffsetTable
from siftmq.broker.receipts import ReceiptHandle
from siftmq.broker.stats import BrokerStats, FilterStats
from siftmq.broker.topics import TopicConfig, TopicManager
from siftmq.broker.validation import (
    check_group,
    check_key_columns,
    check_message_id,
    check_property_columns,
    check_tag,
    check_topic,
)
from siftmq.errors import (
    BadRequestError,
    CorruptRecordError,
    DiskFullError,
    FilterError,
    NotFoundError,
    StatusCode,
    UnsupportedError,
)
from siftmq.filter import BloomFilter, CompiledFilter, compile_filter
from siftmq.store import (
    BatchEntry,
    GetMessageStatus,
    Message,
    MessageFilter,
    MessageStore,
    StoreConfig,
    StoredMessage,
    encode_host,
)

_log = logging.getLogger(__name__)

DLQ_PREFIX = "%DLQ%"
DLQ_RETRY_MS = 1000  # a dead-letter move refused for disk space is tried again this much later
#: Index entries a single receive may scan per queue before it answers (bounds one call's work).
MAX_SCAN_PER_RECEIVE = 64_000
#: Subscriptions one client may declare.
MAX_SUBSCRIPTIONS = 1024
#: Messages one SendMessage request may carry (the official client sends one; siftmq's batches).
MAX_BATCH_MESSAGES = 1024
FILTER_KINDS = {"TAG": "TAG", "SQL": "SQL92", "SQL92": "SQL92"}


def dlq_topic(group: str) -> str:
    return f"{DLQ_PREFIX}{group}"


class Broker:
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
        )
        self.consumers = ConsumerStateTable(config_dir)
        self.offsets = OffsetTable(config_dir)
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
        for topic in self.topics.all():
            for qid in range(topic.queue_nums):
                self.store.create_queue(topic.name, qid)
        self._stop.clear()
        self._housekeeper = threading.Thread(
            target=self._housekeeping, name="siftmq-broker-housekeeping", daemon=True
        )
        self._housekeeper.start()

    def close(self) -> None:
        """Stop background work, write consumer state and registrations, close the store (flushes)."""
        self._stop.set()
        if self._housekeeper is not None:
            self._housekeeper.join()
            self._housekeeper = None
        try:
            self.consumers.save()
            self.offsets.save()
            self.filters.save()
        finally:
            self.store.close()

    def _on_arrival(self, topic: str, queue_id: int, max_offset: int) -> None:
        for listener in list(self._arrival_listeners):
            listener({topic})

    def add_arrival_listener(self, listener: Callable[[set[str]], None]) -> None:
        """``listener(topics)`` is called (from the dispatch thread) when messages become readable."""
        self._arrival_listeners.append(listener)

    def _housekeeping(self) -> None:
        flush_s = self.config.consumer_state_flush_ms / 1000
        last_sweep = 0.0
        last_retention = time.monotonic()
        while not self._stop.wait(flush_s):
            try:
                if self.consumers.dirty:
                    self.consumers.save()
                if self.offsets.dirty:
                    self.offsets.save()
                if time.monotonic() - last_sweep >= 10:
                    last_sweep = time.monotonic()
                    self.clients.expire()
                    for group in self.clients.live_groups():
                        self.filters.touch_group(group)
                    self.filters.expire()
                    self.client_states.sweep()
                if time.monotonic() - last_retention >= self.config.retention_check_interval_s:
                    last_retention = time.monotonic()
                    self.apply_retention()
            except Exception:
                _log.exception("broker housekeeping failed; retrying")

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

    # ------------------------------------------------------------------------------------- topics

    def route(self, topic: str) -> TopicConfig:
        """The topic's config, created with the default queue count when auto-creation is on."""
        return self.topics.get_or_create(topic)

    def _readable_topic(self, topic: str) -> TopicConfig:
        check_topic(topic)
        if topic.startswith(DLQ_PREFIX):
            found = self.topics.get(topic)
            if found is None:
                raise NotFoundError(
                    f"dead-letter topic {topic!r} has no messages yet", status=StatusCode.TOPIC_NOT_FOUND
                )
            return found
        return self.topics.get_or_create(topic)

    # --------------------------------------------------------------------------------------- send

    def send(self, msg: OutgoingMessage) -> SendResult:
        """Validate and store one message; a retry with the same message id is stored once."""
        return self.send_many([msg])[0]

    def send_many(self, msgs: Sequence[OutgoingMessage]) -> list[SendResult]:
        """Validate and store a batch of one topic in one append (one fsync in sync mode).

        Every message is checked before anything is stored: one bad message refuses the whole batch.
        Messages whose id is already stored (client retries) are not stored again.
        """
        if not msgs:
            raise BadRequestError("no message to send")
        if len(msgs) > MAX_BATCH_MESSAGES:
            raise BadRequestError(
                f"{len(msgs)} messages in one request exceed the limit {MAX_BATCH_MESSAGES}"
            )
        if len({m.topic for m in msgs}) != 1:
            raise BadRequestError("a batch must hold messages of one topic")
        for m in msgs:
            if m.message_group is not None:
                raise UnsupportedError(
                    "FIFO messages (message_group) are not supported by this broker yet",
                    status=StatusCode.UNSUPPORTED,
                )
            if m.delivery_timestamp_ms is not None:
                raise UnsupportedError(
                    "delay messages (delivery_timestamp) are not supported by this broker yet",
                    status=StatusCode.UNSUPPORTED,
                )
        return self.send_batch(OutgoingBatch.of(msgs[0].topic, msgs))

    def send_batch(self, batch: OutgoingBatch) -> list[SendResult]:
        """:meth:`send_many` of messages given column by column (see :class:`OutgoingBatch`)."""
        count = len(batch.bodies)
        if not count:
            raise BadRequestError("no message to send")
        if count > MAX_BATCH_MESSAGES:
            raise BadRequestError(f"{count} messages in one request exceed the limit {MAX_BATCH_MESSAGES}")
        for name, column in (
            ("message ids", batch.message_ids),
            ("tags", batch.tags),
            ("key counts", batch.key_counts),
            ("property counts", batch.property_counts),
            ("born timestamps", batch.born_timestamps_ms),
            ("born hosts", batch.born_hosts),
        ):
            if len(column) != count:
                raise BadRequestError(f"{len(column)} {name} for {count} messages")
        check_topic(batch.topic, for_send=True)
        entries = self._prepare(batch)
        topic = self.topics.get_or_create(batch.topic, for_send=True)
        if not topic.writable:
            raise BadRequestError(f"topic {topic.name!r} is not writable", status=StatusCode.FORBIDDEN)
        message_ids = batch.message_ids
        # Same message id, same stripe: a client's retry waits for the first attempt, then sees it.
        stripes = sorted({hash(m) % len(self._send_locks) for m in message_ids})
        for k in stripes:
            self._send_locks[k].acquire()
        try:
            results: list[SendResult | None] = [None] * count
            fresh: list[int] = []
            for i, message_id in enumerate(message_ids):
                existing = self.store.query_message_by_uniq_key(message_id)
                if existing is not None and existing.topic == topic.name:
                    self.stats.count(self.stats.duplicates, topic.name)
                    results[i] = SendResult(
                        message_id, existing.queue_id, existing.queue_offset, duplicate=True
                    )
                else:
                    fresh.append(i)
            if fresh:
                queue_id = next(self._queue_cursor) % topic.queue_nums
                stored = entries if len(fresh) == count else [entries[i] for i in fresh]
                records = self.store.put_batch(topic.name, queue_id, stored)
                for i, record in zip(fresh, records, strict=True):
                    results[i] = SendResult(message_ids[i], record.queue_id, record.queue_offset)
                self.stats.count(self.stats.sends, topic.name, len(fresh))
                self.stats.count(self.stats.send_bytes, topic.name, sum(len(e[0]) for e in stored))
        finally:
            for k in reversed(stripes):
                self._send_locks[k].release()
        return [r for r in results if r is not None]

    def _prepare(self, batch: OutgoingBatch) -> list[BatchEntry]:
        """Check every message of ``batch`` (its topic is checked by the caller); the store's entries."""
        message_ids = batch.message_ids
        if len(set(message_ids)) != len(message_ids):
            raise BadRequestError(
                "a batch holds the same message id twice", status=StatusCode.ILLEGAL_MESSAGE_ID
            )
        for message_id in message_ids:
            check_message_id(message_id)
        bodies = batch.bodies
        if min(map(len, bodies)) == 0:
            raise BadRequestError("message body is empty", status=StatusCode.MESSAGE_BODY_EMPTY)
        largest = max(map(len, bodies))
        if largest > self.config.max_body_size:
            raise BadRequestError(
                f"message body of {largest} bytes exceeds the limit {self.config.max_body_size}",
                status=StatusCode.MESSAGE_BODY_TOO_LARGE,
            )
        for tag in set(batch.tags):
            if tag is not None:
                check_tag(tag)
        check_key_columns(batch.key_counts, batch.keys)
        names, values = batch.property_names, batch.property_values
        check_property_columns(
            batch.property_counts,
            names,
            values,
            max_count=self.config.max_user_properties,
            max_bytes=self.config.max_user_properties_bytes,
        )
        hosts = {host: self._born_host(host) for host in set(batch.born_hosts)}
        keys = batch.keys
        key_pos = prop_pos = 0
        entries: list[BatchEntry] = []
        for i, (tag, key_count, prop_count, born_ms, host) in enumerate(
            zip(
                batch.tags,
                batch.key_counts,
                batch.property_counts,
                batch.born_timestamps_ms,
                batch.born_hosts,
                strict=True,
            )
        ):
            end = prop_pos + prop_count
            properties = dict(zip(names[prop_pos:end], values[prop_pos:end], strict=True))
            if len(properties) != prop_count:
                raise BadRequestError(
                    f"message {message_ids[i]!r} has a user property twice",
                    status=StatusCode.ILLEGAL_MESSAGE_PROPERTY_KEY,
                )
            prop_pos = end
            if tag is not None:
                properties["TAGS"] = tag
            if key_count:
                properties["KEYS"] = " ".join(keys[key_pos : key_pos + key_count])
                key_pos += key_count
            properties["UNIQ_KEY"] = message_ids[i]
            born_host, host_property = hosts[host]
            if host_property is not None:
                properties[PROPERTY_BORN_HOST] = host_property
            entries.append((bodies[i], properties, born_ms, born_host))
        return entries

    @staticmethod
    def _born_host(host: str) -> tuple[bytes, str | None]:
        """A producer's host as the record's born host; one that is no address goes in a property."""
        born_host = _host_bytes(host)
        if born_host is not None:
            return born_host, None
        return encode_host("0.0.0.0", 0), (host[:255].replace("\x01", "").replace("\x02", "") or None)

    # ------------------------------------------------------------------------------------ filters

    def message_filter(self, group: str, subscription: Subscription) -> MessageFilter | None:
        """The store-level filter for ``group``'s subscription (None for TAG ``*``).

        SQL92 subscriptions register the expression with the bitmap dispatcher (bloom key
        ``group#topic``). Raises :class:`FilterError` for an invalid expression and
        :class:`UnsupportedError` for SQL92 when property filtering is turned off.
        """
        compiled = self._compile(subscription)
        kind = compiled.kind
        if kind == "TAG":
            assert compiled.tag_filter is not None
            if compiled.tag_filter.sub_all:
                return None
            return TagMessageFilter(compiled.tag_filter, self.stats.filter(group, subscription.topic))
        registration = self.filters.register(group, subscription.topic, compiled)
        return registration.message_filter(self.stats.filter(group, subscription.topic))

    def _compile(self, subscription: Subscription) -> CompiledFilter:
        kind = FILTER_KINDS.get(subscription.kind.upper())
        if kind is None:
            raise BadRequestError(
                f"unknown filter type {subscription.kind!r}; use TAG or SQL92",
                status=StatusCode.ILLEGAL_FILTER_EXPRESSION,
            )
        if kind == "SQL92" and not self.config.enable_property_filter:
            raise UnsupportedError(
                "SQL92 filtering is turned off on this broker (enable_property_filter = false); "
                "subscribe with a TAG expression or turn it on"
            )
        return compile_filter(kind, subscription.expression)

    def subscribe(
        self,
        client_id: str,
        client_type: str,
        group: str | None,
        subscriptions: Sequence[Subscription],
        *,
        address: str = "",
        message_model: str | None = None,
    ) -> None:
        """Record a client's declared settings (Telemetry).

        Consumers' subscriptions are validated, checked against the group's (consistency policy) and
        recorded; SQL92 ones are registered with the bitmap dispatcher at once. A declared
        ``message_model`` (``clustering``/``broadcasting``) must agree with the group's live members.
        """
        if group is None:
            self.clients.touch(client_id, client_type=client_type, address=address)
            return
        check_group(group)
        compiled: list[tuple[Subscription, CompiledFilter]] = []
        errors: list[tuple[str, Exception]] = []
        if len(subscriptions) > MAX_SUBSCRIPTIONS:
            raise BadRequestError(f"{len(subscriptions)} subscriptions exceed the limit {MAX_SUBSCRIPTIONS}")
        for sub in subscriptions:
            try:
                check_topic(sub.topic)
                compiled.append((sub, self._compile(sub)))
            except (FilterError, BadRequestError, UnsupportedError) as exc:
                errors.append((f"{sub.topic}: {exc}", exc))
        if errors:
            first = errors[0][1]
            text = "; ".join(msg for msg, _ in errors)
            if isinstance(first, UnsupportedError):
                raise UnsupportedError(text)
            raise BadRequestError(
                text,
                status=first.status
                if isinstance(first, BadRequestError)
                else StatusCode.ILLEGAL_FILTER_EXPRESSION,
            )
        # check before recording: a refused client must not become the holder of anything
        self.clients.touch(client_id, client_type=client_type, group=group, address=address)
        members = {m.client_id: set(m.subscriptions) for m in self.clients.members(group)}
        try:
            if message_model is not None:
                self.groups.declare_mode(group, message_model, client_id, live=self.clients.live_ids(group))
            self.groups.check_topics(group, client_id, {sub.topic for sub, _ in compiled}, members)
        except SubscriptionConflictError as exc:
            self._mark_refused(client_id, exc.message)
            raise
        live = self.clients.live_ids(group)
        try:
            for sub, cf in compiled:
                entry = self.groups.claim(
                    group,
                    client_id,
                    sub.topic,
                    kind=cf.kind,
                    expression=cf.normalized,
                    live=live,
                    from_settings=True,
                )
                self._entry_filter(group, entry)
        except SubscriptionConflictError as exc:
            self.groups.release(group, client_id)
            self._mark_refused(client_id, exc.message)
            raise
        self._mark_refused(client_id, None)
        self.clients.touch(client_id, subscriptions=list(subscriptions))

    def _mark_refused(self, client_id: str, why: str | None) -> None:
        session = self.clients.get(client_id)
        if session is not None:
            session.refused = why

    def _entry_filter(self, group: str, entry: GroupSubscription) -> MessageFilter | None:
        return self.message_filter(group, Subscription(entry.topic, entry.kind, entry.expression))

    def _resolve(
        self, group: str, client_id: str, subscription: Subscription
    ) -> tuple[MessageFilter | None, CompiledFilter | None]:
        """The store filter serving ``client_id``'s request, and its own filter when that differs.

        A strict group refuses a request whose filter differs from the group's; a compat group serves
        it with the group's subscription and drops what the client's own filter rejects (RocketMQ's
        client-side tag check), which is how seed 004 loses messages.
        """
        compiled = self._compile(subscription)
        self.clients.touch(client_id, group=group)
        entry = self.groups.claim(
            group,
            client_id,
            subscription.topic,
            kind=compiled.kind,
            expression=compiled.normalized,
            live=self.clients.live_ids(group),
            from_settings=False,
        )
        if (entry.kind, entry.expression) == (compiled.kind, compiled.normalized):
            self._mark_refused(client_id, None)  # the group accepts it now
            return self._entry_filter(group, entry), None
        return self._entry_filter(group, entry), compiled

    def progress_group(self, group: str, client_id: str) -> str:
        """Whose progress a client uses: the group's (clustering) or its own (broadcasting)."""
        return client_progress_group(group, client_id) if self.groups.mode(group) == "broadcasting" else group

    # ------------------------------------------------------------------------------------ receive

    def receive(
        self,
        group: str,
        subscription: Subscription,
        *,
        client_id: str = "",
        queue_id: int = -1,
        batch_size: int = 32,
        invisible_ms: int | None = None,
    ) -> list[Delivery]:
        """Deliver up to ``batch_size`` messages of ``subscription.topic`` that match its filter.

        Reads the requested queue first, then the topic's other queues; redeliveries whose
        invisible time is over come before new messages. Non-matching messages are passed over
        (the group's progress moves past them). Returns [] when nothing is available now.
        """
        check_group(group)
        topic = self._readable_topic(subscription.topic)
        if not topic.readable:
            raise BadRequestError(f"topic {topic.name!r} is not readable", status=StatusCode.FORBIDDEN)
        invisible = self._invisible_ms(invisible_ms)
        batch_size = min(_positive_batch(batch_size), self.config.max_batch_size)
        message_filter, own = self._resolve(group, client_id, subscription)
        pgroup = self.progress_group(group, client_id)
        queues = list(range(topic.queue_nums))
        if 0 <= queue_id < topic.queue_nums:
            queues = queues[queue_id:] + queues[:queue_id]
        else:
            shift = next(self._queue_cursor) % topic.queue_nums
            queues = queues[shift:] + queues[:shift]
        rp = _ReceivePass(group, pgroup, topic.name, _now_ms(), invisible, batch_size, message_filter)
        for qid in queues:  # redeliveries first, across queues
            prog = self._progress(pgroup, topic.name, qid)
            with prog.lock:
                self._take_due(rp, qid, prog)
            if len(rp.out) >= batch_size:
                break
        else:
            for qid in queues:
                prog = self._progress(pgroup, topic.name, qid)
                with prog.lock:
                    self._take_new(rp, qid, prog)
                if len(rp.out) >= batch_size:
                    break
        if rp.out:
            self.stats.delivered(group, topic.name, len(rp.out), sum(len(d.message.body) for d in rp.out))
        if own is None:
            return rp.out
        kept = [d for d in rp.out if own.matches(d.message.properties)]
        for d in rp.out:
            if d not in kept:  # compat group: what the group's filter passed but the client's rejects is lost
                self.ack(group, topic.name, d.receipt_handle, client_id=client_id)
        if len(kept) < len(rp.out):
            self.groups.note_dropped(group, len(rp.out) - len(kept))
        return kept

    def next_redelivery_ms(self, group: str, topic: str, client_id: str = "") -> int | None:
        """When the earliest in-flight message of ``group`` on ``topic`` becomes visible again."""
        cfg = self.topics.get(topic)
        if cfg is None:
            return None
        due = []
        pgroup = self.progress_group(group, client_id)
        for qid in range(cfg.queue_nums):
            prog = self.consumers.get((pgroup, topic, qid))
            if prog is not None:
                with prog.lock:
                    t = prog.next_due_ms()
                if t is not None:
                    due.append(t)
        return min(due, default=None)

    def _invisible_ms(self, invisible_ms: int | None) -> int:
        cfg = self.config
        if invisible_ms is None:
            return int(cfg.default_invisible_time_s * 1000)
        if not cfg.min_invisible_time_s * 1000 <= invisible_ms <= cfg.max_invisible_time_s * 1000:
            raise BadRequestError(
                f"invisible duration {invisible_ms} ms is outside {cfg.min_invisible_time_s:g} s.."
                f"{cfg.max_invisible_time_s:g} s",
                status=StatusCode.ILLEGAL_INVISIBLE_TIME,
            )
        return invisible_ms

    def _progress(self, group: str, topic: str, qid: int) -> QueueProgress:
        prog = self.consumers.get((group, topic, qid))
        if prog is not None:
            return prog
        # RocketMQ's rule for a new group: from the start while the queue still holds its first
        # message, otherwise only what arrives from now on.
        lo = self.store.get_min_offset_in_queue(topic, qid)
        start = 0 if lo == 0 else self.store.get_max_offset_in_queue(topic, qid)
        prog = self.consumers.get_or_create((group, topic, qid), start)
        if start:  # a start that is not 0 must survive a crash, or a restart would skip what came since
            self.consumers.save()
        return prog

    def _take_due(self, rp: _ReceivePass, qid: int, prog: QueueProgress) -> None:
        limit = rp.batch_size - len(rp.out)
        if limit <= 0:
            return
        due = list(prog.pop_due(rp.now, limit))
        for n, item in enumerate(due):
            try:
                msg = self._load(item, rp.topic, qid)
                if msg is None:  # removed by retention: nothing left to deliver
                    del prog.inflight[item.queue_offset]
                    self.consumers.mark_dirty()
                    continue
                if item.attempt >= self.config.max_delivery_attempts:
                    try:
                        self._to_dlq(rp.group, msg, item.attempt)
                    except DiskFullError:
                        # the dead-letter copy waits for room; the message stays in flight and the
                        # group's other messages are served meanwhile
                        item.visible_at_ms = rp.now + DLQ_RETRY_MS
                        prog.put(item)
                        continue
                    del prog.inflight[item.queue_offset]
                    self.consumers.mark_dirty()
                    continue
                rp.out.append(self._deliver(rp, qid, prog, msg, item.attempt + 1))
            except Exception:
                for rest in due[n:]:  # keep them due: nothing may stay in flight unseen
                    if prog.inflight.get(rest.queue_offset) is rest:
                        prog.put(rest)
                raise

    def _take_new(self, rp: _ReceivePass, qid: int, prog: QueueProgress) -> None:
        scanned = 0
        S = GetMessageStatus
        limit = rp.batch_size - len(rp.out)
        while limit > 0 and scanned < MAX_SCAN_PER_RECEIVE:
            result = self.store.get_messages(
                rp.group, rp.topic, qid, prog.pop_offset, limit, rp.message_filter
            )
            moved = result.next_begin_offset != prog.pop_offset
            if result.status in (
                S.FOUND,
                S.NO_MATCHED_MESSAGE,
                S.OFFSET_FOUND_NULL,
                S.MESSAGE_WAS_REMOVING,
                S.OFFSET_TOO_SMALL,
                S.OFFSET_OVERFLOW_BADLY,
            ):
                prog.pop_offset = result.next_begin_offset
            if moved:
                self.consumers.mark_dirty()
            for msg in result.messages:
                rp.out.append(self._deliver(rp, qid, prog, msg, 1))
            limit -= len(result.messages)
            scanned += max(result.scanned, 1)
            if (
                not moved
                or prog.pop_offset >= result.max_offset
                or result.status in (S.OFFSET_OVERFLOW_ONE, S.NO_MESSAGE_IN_QUEUE, S.NO_MATCHED_LOGIC_QUEUE)
            ):
                break

    def _deliver(
        self, rp: _ReceivePass, qid: int, prog: QueueProgress, msg: StoredMessage, attempt: int
    ) -> Delivery:
        nonce = secrets.randbits(48)
        prog.put(
            InFlight(
                msg.queue_offset,
                msg.commit_log_offset,
                msg.store_size,
                attempt,
                rp.now + rp.invisible_ms,
                nonce,
            )
        )
        self.consumers.mark_dirty()
        handle = ReceiptHandle(rp.topic, qid, msg.queue_offset, nonce).encode()
        return Delivery(msg, handle, attempt, rp.invisible_ms)

    def _load(self, item: InFlight, topic: str, queue_id: int) -> StoredMessage | None:
        """The in-flight message, or None when its record is gone (retention) or is not it any more.

        A corrupt record counts as gone; any other read error propagates, so the entry stays in
        flight for later.
        """
        try:
            msg = self.store.look_message_by_offset(item.commit_log_offset, item.size)
        except CorruptRecordError:  # unreadable for good: delivering it again can never succeed
            _log.exception("in-flight %s:%d@%d cannot be read; dropped", topic, queue_id, item.queue_offset)
            return None
        if msg is not None and (msg.topic, msg.queue_id, msg.queue_offset) != (
            topic,
            queue_id,
            item.queue_offset,
        ):
            _log.error(
                "in-flight %s:%d@%d points at another record (commit log offset %d) after a crash; dropped",
                topic,
                queue_id,
                item.queue_offset,
                item.commit_log_offset,
            )
            return None
        return msg

    # --------------------------------------------------------------------------------------- pull

    def _queue(self, topic_name: str, queue_id: int) -> TopicConfig:
        topic = self._readable_topic(topic_name)
        if not 0 <= queue_id < topic.queue_nums:
            raise BadRequestError(
                f"queue {queue_id} does not exist: topic {topic.name!r} has queues 0..{topic.queue_nums - 1}"
            )
        return topic

    def pull(
        self,
        group: str,
        subscription: Subscription,
        queue_id: int,
        offset: int,
        batch_size: int,
        *,
        client_id: str = "",
    ) -> PullResult:
        """Messages of one queue from ``offset`` that match the subscription (no invisible time, no acks).

        Non-matching entries are passed over within the call's scan bound; ``next_offset`` is where
        the next pull starts.
        """
        check_group(group)
        topic = self._queue(subscription.topic, queue_id)
        if not topic.readable:
            raise BadRequestError(f"topic {topic.name!r} is not readable", status=StatusCode.FORBIDDEN)
        if offset < 0:
            raise BadRequestError(
                f"offset must not be negative, got {offset}", status=StatusCode.ILLEGAL_OFFSET
            )
        batch_size = min(_positive_batch(batch_size), self.config.max_pull_batch_size)
        self._check_owner(group, topic, queue_id, client_id)
        message_filter, own = self._resolve(group, client_id, subscription)
        S = GetMessageStatus
        messages: list[StoredMessage] = []
        scanned = size = 0
        next_offset = offset
        while True:
            r = self.store.get_messages(
                group, topic.name, queue_id, next_offset, batch_size - len(messages), message_filter
            )
            lo, hi = r.min_offset, r.max_offset
            if r.status in (S.OFFSET_TOO_SMALL, S.OFFSET_OVERFLOW_BADLY):
                return PullResult("ILLEGAL_OFFSET", messages, r.next_begin_offset, lo, hi)
            if r.status in (S.NO_MATCHED_LOGIC_QUEUE, S.NO_MESSAGE_IN_QUEUE, S.OFFSET_OVERFLOW_ONE):
                break
            messages.extend(r.messages)
            size += sum(m.store_size for m in r.messages)
            scanned += max(r.scanned, 1)
            moved = r.next_begin_offset != next_offset
            next_offset = r.next_begin_offset
            full = (
                len(messages) >= batch_size
                or scanned >= MAX_SCAN_PER_RECEIVE
                or size >= self.config.max_pull_bytes
            )
            if full or not moved or next_offset >= hi:
                break
        hi = self.store.get_max_offset_in_queue(topic.name, queue_id)
        lo = self.store.get_min_offset_in_queue(topic.name, queue_id)
        if own is not None:  # compat group: the client's own filter drops the rest (lost to it)
            kept = [m for m in messages if own.matches(m.properties)]
            if len(kept) < len(messages):
                self.groups.note_dropped(group, len(messages) - len(kept))
            messages = kept
        if messages:
            self.stats.delivered(group, topic.name, len(messages), sum(len(m.body) for m in messages))
            return PullResult("FOUND", messages, next_offset, lo, hi)
        status = "NO_NEW_MESSAGE" if next_offset >= hi else "NO_MATCHED_MESSAGE"
        return PullResult(status, messages, next_offset, lo, hi)

    def update_offset(
        self, group: str, topic_name: str, queue_id: int, offset: int, *, client_id: str = ""
    ) -> None:
        """Commit a pull consumer's offset (the next offset it will read)."""
        check_group(group)
        topic = self._queue(topic_name, queue_id)
        hi = self.store.get_max_offset_in_queue(topic.name, queue_id)
        if not 0 <= offset <= hi:
            raise BadRequestError(
                f"offset {offset} is outside 0..{hi} of {topic.name}:{queue_id}",
                status=StatusCode.ILLEGAL_OFFSET,
            )
        self.offsets.set((self.progress_group(group, client_id), topic.name, queue_id), offset)

    def get_offset(self, group: str, topic_name: str, queue_id: int, *, client_id: str = "") -> int:
        """The group's committed offset on a queue (pull commits, else its receive progress)."""
        check_group(group)
        topic = self._queue(topic_name, queue_id)
        pgroup = self.progress_group(group, client_id)
        found = self.offsets.get((pgroup, topic.name, queue_id))
        if found is not None:
            return found
        prog = self.consumers.get((pgroup, topic.name, queue_id))
        if prog is not None:
            with prog.lock:
                return prog.committed_offset
        raise NotFoundError(
            f"group {group!r} has no offset on {topic.name}:{queue_id}", status=StatusCode.OFFSET_NOT_FOUND
        )

    def query_offset(
        self, topic_name: str, queue_id: int, policy: str, timestamp_ms: int | None = None
    ) -> int:
        """``BEGINNING`` (min), ``END`` (max), or ``TIMESTAMP``: the first offset stored at or after it."""
        topic = self._queue(topic_name, queue_id)
        lo = self.store.get_min_offset_in_queue(topic.name, queue_id)
        hi = self.store.get_max_offset_in_queue(topic.name, queue_id)
        if policy == "BEGINNING":
            return lo
        if policy == "END":
            return hi
        if policy != "TIMESTAMP" or timestamp_ms is None:
            raise BadRequestError(f"unknown offset policy {policy!r} (or TIMESTAMP without a timestamp)")
        while lo < hi:  # first offset whose store time is >= timestamp_ms
            mid = (lo + hi) // 2
            r = self.store.get_messages("", topic.name, queue_id, mid, 1, None)
            if not r.messages:
                lo = max(r.next_begin_offset, mid + 1)
                continue
            if r.messages[0].store_timestamp >= timestamp_ms:
                hi = mid
            else:
                lo = mid + 1
        return lo

    # --------------------------------------------------------------------------------- assignment

    def _pull_members(self, group: str, topic: str) -> list[str]:
        return [
            m.client_id
            for m in self.clients.members(group)
            if m.client_type == "PULL_CONSUMER"
            and not m.refused  # a refused member consumes nothing, so it gets no queues
            and (not m.subscriptions or topic in m.subscriptions)
        ]

    def assignment(self, group: str, topic_name: str, client_id: str) -> list[int] | None:
        """The queues ``client_id`` consumes: None means every queue, shared by receive (pop) calls.

        Pull consumers of a clustering group get disjoint queue sets, averagely allocated over the
        group's live pull members in client-id order (RocketMQ's AllocateMessageQueueAveragely);
        in a broadcasting group each gets every queue.
        """
        check_group(group)
        topic = self.route(topic_name)
        session = self.clients.touch(client_id, group=group)
        if session.client_type != "PULL_CONSUMER":
            return None
        queues = list(range(topic.queue_nums))
        if self.groups.mode(group) == "broadcasting":
            return queues
        members = self._pull_members(group, topic.name)
        if client_id not in members:
            return []
        return allocate_averagely(queues, members, client_id)

    def _check_owner(self, group: str, topic: TopicConfig, queue_id: int, client_id: str) -> None:
        """In a clustering group, a registered pull member may pull only the queues assigned to it."""
        session = self.clients.get(client_id)
        if (
            session is None
            or session.client_type != "PULL_CONSUMER"
            or self.groups.mode(group) != "clustering"
        ):
            return
        members = self._pull_members(group, topic.name)
        if client_id in members and queue_id not in allocate_averagely(
            list(range(topic.queue_nums)), members, client_id
        ):
            raise BadRequestError(
                f"queue {queue_id} of topic {topic.name!r} is assigned to another member of group {group!r}; "
                "query the assignment again",
                status=StatusCode.PRECONDITION_FAILED,
            )

    # -------------------------------------------------------------------------------- ack / nack

    def _in_flight(
        self, group: str, topic: str, handle_text: str, client_id: str
    ) -> tuple[QueueProgress, InFlight]:
        """The in-flight entry a receipt handle names; the caller then holds ``prog.lock``."""
        check_group(group)
        handle = ReceiptHandle.decode(handle_text)
        if handle.topic != topic:
            raise BadRequestError(
                f"receipt handle belongs to topic {handle.topic!r}, not {topic!r}",
                status=StatusCode.INVALID_RECEIPT_HANDLE,
            )
        prog = self.consumers.get((self.progress_group(group, client_id), topic, handle.queue_id))
        if prog is None:
            raise BadRequestError(
                f"receipt handle is unknown to group {group!r}", status=StatusCode.INVALID_RECEIPT_HANDLE
            )
        prog.lock.acquire()
        item = prog.inflight.get(handle.queue_offset)
        problem = None
        if item is None:
            problem = "the message is not in flight (already acknowledged, or moved to the dead-letter queue)"
        elif item.nonce != handle.nonce:
            problem = "the receipt handle is stale: the message was delivered again with a new handle"
        elif item.visible_at_ms <= _now_ms():
            problem = "the receipt handle expired: the message's invisible time is over"
        if problem is not None:
            prog.lock.release()
            raise BadRequestError(problem, status=StatusCode.INVALID_RECEIPT_HANDLE)
        assert item is not None
        return prog, item

    def ack(self, group: str, topic: str, handle_text: str, *, client_id: str = "") -> None:
        """Acknowledge one delivery (the message is done for the group)."""
        prog, item = self._in_flight(group, topic, handle_text, client_id)
        try:
            del prog.inflight[item.queue_offset]
            self.consumers.mark_dirty()
        finally:
            prog.lock.release()
        self.stats.count(self.stats.acks, (group, topic))

    def change_invisible_duration(
        self, group: str, topic: str, handle_text: str, invisible_ms: int, *, client_id: str = ""
    ) -> str:
        """Make the message visible again ``invisible_ms`` from now; returns the new receipt handle.

        A consumer's negative acknowledgement: the message is redelivered then, with
        ``delivery_attempt`` + 1.
        """
        if not 0 <= invisible_ms <= self.config.max_invisible_time_s * 1000:
            raise BadRequestError(
                f"invisible duration {invisible_ms} ms is outside 0..{self.config.max_invisible_time_s:g} s",
                status=StatusCode.ILLEGAL_INVISIBLE_TIME,
            )
        handle = ReceiptHandle.decode(handle_text)
        prog, item = self._in_flight(group, topic, handle_text, client_id)
        try:
            nonce = secrets.randbits(48)
            prog.put(
                InFlight(
                    item.queue_offset,
                    item.commit_log_offset,
                    item.size,
                    item.attempt,
                    _now_ms() + invisible_ms,
                    nonce,
                )
            )
            self.consumers.mark_dirty()
        finally:
            prog.lock.release()
        return ReceiptHandle(topic, handle.queue_id, handle.queue_offset, nonce).encode()

    def forward_to_dlq(self, group: str, topic: str, handle_text: str, *, client_id: str = "") -> None:
        """Move the delivered message to the group's dead-letter topic now."""
        prog, item = self._in_flight(group, topic, handle_text, client_id)
        try:
            msg = self._load(item, topic, ReceiptHandle.decode(handle_text).queue_id)
            if msg is not None:
                self._to_dlq(group, msg, item.attempt)
            del prog.inflight[item.queue_offset]
            self.consumers.mark_dirty()
        finally:
            prog.lock.release()

    def _to_dlq(self, group: str, msg: StoredMessage, attempts: int) -> None:
        topic = dlq_topic(group)
        cfg = self.topics.get_or_create(topic, system=True)
        props = dict(msg.properties)
        props[PROPERTY_DLQ_ORIGIN_TOPIC] = msg.topic
        props[PROPERTY_DLQ_ORIGIN_MESSAGE_ID] = msg.uniq_key or msg.offset_msg_id
        self.store.put_message(
            Message(
                topic=cfg.name,
                body=msg.body,
                queue_id=0,
                properties=props,
                born_timestamp=msg.born_timestamp,
                born_host=msg.born_host,
                reconsume_times=attempts,
            )
        )
        self.stats.count(self.stats.dead_letters, group)
        _log.info("message %s of %s moved to %s after %d attempts", msg.uniq_key, msg.topic, topic, attempts)

    # ------------------------------------------------------------------------------------- report

    def committed_offset(self, group: str, topic: str, queue_id: int) -> int | None:
        """The group's committed offset on a queue: its pull commit, else its receive progress."""
        found = self.offsets.get((group, topic, queue_id))
        if found is not None:
            return found
        prog = self.consumers.get((group, topic, queue_id))
        if prog is None:
            return None
        with prog.lock:
            return prog.committed_offset

    def lag(self, group: str, topic: str, *, max_scan: int = 2_000_000) -> list[dict[str, object]]:
        """Per queue: committed offset, max offset, entries behind, and matching entries behind.

        ``matching`` counts the entries the group's filter may match, from the index alone (tag
        hashes, bloom bitmaps; never the CommitLog): exact for ``*``, an upper bound when hash or
        bloom collisions occur. ``estimated`` is True when more than ``max_scan`` entries were behind.
        """
        cfg = self.topics.get(topic)
        if cfg is None:
            raise NotFoundError(f"topic {topic!r} does not exist", status=StatusCode.TOPIC_NOT_FOUND)
        index_filter = self._index_filter(group, topic)
        rows: list[dict[str, object]] = []
        for qid in range(cfg.queue_nums):
            hi = self.store.get_max_offset_in_queue(topic, qid)
            lo = self.store.get_min_offset_in_queue(topic, qid)
            committed = self.committed_offset(group, topic, qid)
            start = max(lo, committed if committed is not None else lo)
            behind = max(hi - start, 0)
            matching, estimated = self._count_matching(topic, qid, (start, hi), index_filter, max_scan)
            rows.append(
                {
                    "queue_id": qid,
                    "committed_offset": committed,
                    "min_offset": lo,
                    "max_offset": hi,
                    "lag": behind,
                    "matching_lag": matching,
                    "estimated": estimated,
                }
            )
        return rows

    def _index_filter(self, group: str, topic: str) -> MessageFilter | None:
        entry = self.groups.subscription(group, topic)
        if entry is None:
            return None
        if entry.kind == "TAG":
            compiled = compile_filter("TAG", entry.expression)
            tf = compiled.tag_filter
            return None if tf is None or tf.sub_all else TagMessageFilter(tf, FilterStats())
        registration = self.filters.get(group, topic)
        return None if registration is None else registration.message_filter(FilterStats())

    def _count_matching(
        self, topic: str, qid: int, span: tuple[int, int], index_filter: MessageFilter | None, max_scan: int
    ) -> tuple[int, bool]:
        start, end = span
        if index_filter is None or end <= start:
            return max(end - start, 0), False
        cq = self.store.find_consume_queue(topic, qid)
        block_fn = getattr(index_filter, "match_consume_queue_block", None)
        if cq is None or block_fn is None:
            return end - start, True
        count, offset = 0, start
        while offset < end and offset - start < max_scan:
            entries = cq.read_block(offset, min(65_536, end - offset))
            if entries is None or len(entries) == 0:
                break
            ext = cq.ext.read_block(offset, len(entries)) if cq.ext is not None else None
            count += int(np.count_nonzero(block_fn(entries["tags_code"].astype(np.int64), ext)))
            offset += len(entries)
        if offset < end:
            return count + (end - offset), True
        return count, False

    def group_report(self, group: str) -> dict[str, object]:
        """Everything the admin API shows of a group."""
        info = self.groups.get(group)
        members = self.clients.members(group)
        if info is None and not members:
            raise NotFoundError(
                f"consumer group {group!r} is unknown", status=StatusCode.CONSUMER_GROUP_NOT_FOUND
            )
        now = time.monotonic()
        subs = info.subscriptions if info is not None else {}
        return {
            "group": group,
            "mode": info.mode if info is not None else "clustering",
            "consistency": info.consistency if info is not None else "strict",
            "inconsistencies": info.inconsistencies if info is not None else 0,
            "last_inconsistency": info.last_inconsistency if info is not None else None,
            "dropped_by_inconsistency": info.dropped if info is not None else 0,
            "clients": [
                {
                    "client_id": m.client_id,
                    "client_type": m.client_type,
                    "address": m.address,
                    "last_seen_s": round(now - m.last_seen, 3),
                    "subscriptions": {t: f"{s.kind} {s.expression}" for t, s in m.subscriptions.items()},
                }
                for m in members
            ],
            "subscriptions": [
                {
                    "topic": t,
                    "type": s.kind,
                    "expression": s.expression,
                    "version": s.version,
                    "holders": sorted(s.holders),
                    "pinned": s.pinned,
                    "filter_stats": self.stats.filter(group, t).as_dict(),
                    "lag": self.lag(group, t) if self.topics.get(t) is not None else [],
                }
                for t, s in sorted(subs.items())
            ],
        }

    def configure_group(self, group: str, *, mode: str | None = None, consistency: str | None = None) -> None:
        """Set a group's message model or consistency policy (a mode switch needs the group idle)."""
        check_group(group)
        self.groups.configure(group, mode=mode, consistency=consistency,
                              live_clients=len(self.clients.live_ids(group)))  # fmt: skip

    def set_group_subscription(self, group: str, subscription: Subscription) -> GroupSubscription:
        """Set the group's subscription of a topic deliberately: a new version filtering for every member."""
        check_group(group)
        check_topic(subscription.topic)
        compiled = self._compile(subscription)
        entry = self.groups.set_subscription(group, subscription.topic, compiled.kind, compiled.normalized)
        self._entry_filter(group, entry)
        return entry

    # ---------------------------------------------------------------------------------- sessions

    def heartbeat(self, client_id: str, client_type: str, group: str | None, *, address: str = "") -> None:
        """Keep a client's session alive; a client whose subscription was refused hears so again."""
        if group:
            check_group(group)
        session = self.clients.touch(client_id, client_type=client_type, group=group, address=address)
        if session.refused:
            raise SubscriptionConflictError(session.refused)

    def client_terminated(self, client_id: str) -> None:
        self.clients.remove(client_id)


@dataclass(slots=True)
class _ReceivePass:
    """The state of one receive call across the queues it reads."""

    group: str
    pgroup: str  # whose progress: the group, or group@client in broadcasting
    topic: str
    now: int
    invisible_ms: int
    batch_size: int
    message_filter: MessageFilter | None
    out: list[Delivery] = field(default_factory=list)


def allocate_averagely(queues: list[int], members: list[str], member: str) -> list[int]:
    """RocketMQ's AllocateMessageQueueAveragely: contiguous, nearly equal shares in member order."""
    n, m = len(queues), len(members)
    index = members.index(member)
    mod = n % m
    size = 1 if n <= m else (n // m + 1 if mod > 0 and index < mod else n // m)
    start = index * size if mod > 0 and index < mod else index * size + mod
    return queues[start : start + min(size, n - start)] if start < n else []


def _host_bytes(host: str) -> bytes | None:
    if not host:
        return None
    try:
        return encode_host(host, 0)
    except (ValueError, OSError):
        return None


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def _positive_batch(batch_size: int) -> int:
    """A request's batch size: a number below 1 is the client's error, not a request for one."""
    if batch_size < 1:
        raise BadRequestError(f"batch_size must be positive, got {batch_size}")
    return batch_size
