"""Sending: validation, one batch per queue, duplicate detection, the append.

RocketMQ's SendMessageProcessor.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Final

from siftmq.broker.model import (
    DEAD_LETTER_RESERVE,
    PROPERTY_BORN_HOST,
    ProducedBatch,
    ProducedMessage,
    SendResult,
)
from siftmq.broker.parts import BrokerParts
from siftmq.broker.validation import (
    check_key_columns,
    check_message_id,
    check_property_columns,
    check_tag,
    check_topic,
)
from siftmq.errors import (
    BadRequestError,
    StatusCode,
    UnsupportedError,
)
from siftmq.store import (
    BatchEntry,
    StoredMessage,
    check_properties,
    encode_host,
)

_log = logging.getLogger(__name__)

#: Messages one SendMessage request may carry (the official client sends one; siftmq's batches).
MAX_BATCH_MESSAGES: Final = 1024
#: Characters of a born host that is not ip:port kept as the message's __BORN_HOST property.
MAX_BORN_HOST_LENGTH: Final = 255


class Sending(BrokerParts):
    """The send requests of :class:`~siftmq.broker.broker.Broker`."""

    def send(self, msg: ProducedMessage) -> SendResult:
        """Validate and store one message; a retry with the same message id is stored once."""
        return self.send_many([msg])[0]

    def sends_inline(self, topic: str) -> bool:
        """Whether a single send to ``topic`` may be made on an event loop (``on_loop``): not when
        it would create the topic, which writes and syncs the topics file."""
        return self.topics.get(topic) is not None

    def send_many(self, msgs: Sequence[ProducedMessage], *, on_loop: bool = False) -> list[SendResult]:
        """Validate and store a batch of one topic in one append (one fsync in sync mode).

        Every message is checked before anything is stored: one bad message refuses the whole batch.
        Messages whose id is already stored (client retries) are not stored again. ``on_loop``: the
        caller is an event loop, which must not wait to help a lagging index (other sends help).
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
        return self.send_batch(ProducedBatch.of(msgs[0].topic, msgs), on_loop=on_loop)

    def send_batch(self, batch: ProducedBatch, *, on_loop: bool = False) -> list[SendResult]:
        """:meth:`send_many` of messages given column by column (see :class:`ProducedBatch`)."""
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
        topic = self.topics.get(batch.topic)
        if topic is None:
            # a send the store would refuse creates no topic (it would count toward max_topics);
            # the properties' encoded size is checked here only then: the store checks it anyway
            for entry in entries:
                check_properties(entry[1], DEAD_LETTER_RESERVE)
            topic = self.topics.get_or_create(batch.topic, for_send=True)
        if not topic.writable:
            raise BadRequestError(f"topic {topic.name!r} is not writable", status=StatusCode.FORBIDDEN)
        message_ids = batch.message_ids
        # Same message id, same stripe: a client's retry waits for the first attempt, then sees it.
        stripes = sorted({hash(m) % len(self._send_locks) for m in message_ids})
        for k in stripes:
            self._send_locks[k].acquire()
        fresh: list[int] = []
        try:
            results: list[SendResult | None] = [None] * count
            for i, message_id in enumerate(message_ids):
                existing = self.store.query_message_by_uniq_key(message_id)
                if existing is not None and _same_message(existing, topic.name, entries[i]):
                    self.stats.count(self.stats.duplicates, topic.name)
                    results[i] = SendResult(
                        message_id, existing.queue_id, existing.queue_offset, duplicate=True
                    )
                else:
                    fresh.append(i)
            if fresh:
                queue_id = next(self._queue_cursor) % topic.queue_nums
                stored = entries if len(fresh) == count else [entries[i] for i in fresh]
                # indexed below, once the send locks are released: a send waiting for a stripe
                # (maybe on the event loop) waits for the append alone
                records = self.store.put_batch(
                    topic.name, queue_id, stored, index=False, properties_reserve=DEAD_LETTER_RESERVE
                )
                for i, record in zip(fresh, records, strict=True):
                    results[i] = SendResult(message_ids[i], record.queue_id, record.queue_offset)
                self.stats.count(self.stats.sends, topic.name, len(fresh))
                self.stats.count(self.stats.send_bytes, topic.name, sum(len(e[0]) for e in stored))
        finally:
            for k in reversed(stripes):
                self._send_locks[k].release()
            if fresh:  # duplicates alone append nothing to index
                self.store.index_appended(may_wait=not on_loop)
        return [r for r in results if r is not None]

    def _prepare(self, batch: ProducedBatch) -> list[BatchEntry]:
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
        kept = host[:MAX_BORN_HOST_LENGTH].replace("\x01", "").replace("\x02", "")
        return encode_host("0.0.0.0", 0), kept or None


def _same_message(existing: StoredMessage, topic: str, entry: BatchEntry) -> bool:
    """Whether a send is a retry of the stored message with its id: the same topic, body and
    properties (the born host aside: a retry may come over another connection). Another message
    that reuses an id is stored, as RocketMQ stores it, not answered with the first one's place."""
    if existing.topic != topic or existing.body != entry[0]:
        return False
    sent = {k: v for k, v in entry[1].items() if k != PROPERTY_BORN_HOST}
    return sent == {k: v for k, v in existing.properties.items() if k != PROPERTY_BORN_HOST}


def _host_bytes(host: str) -> bytes | None:
    if not host:
        return None
    try:
        return encode_host(host, 0)
    except (ValueError, OSError):
        return None
