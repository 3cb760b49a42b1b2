"""Dispatch ("reput"): turning appended CommitLog records into index entries.

After records are appended they are dispatched in batches, in CommitLog order (by the store's
reput thread, see store.py):

1. the :class:`BitmapDispatcher`, if one is set, computes a filter bitmap per request
   (RocketMQ's ``CommitLogDispatcherCalcBitMap``, implemented by the broker);
2. the ConsumeQueue entries and their extension units (store timestamp, tags code, bitmap)
   are written (``CommitLogDispatcherBuildConsumeQueue``), one write per queue and batch;
3. every registered :class:`CommitLogDispatcher` gets the batch.

Dispatchers are derived-state builders: an exception in one is logged and does not fail the
append (the CommitLog is the truth and indexes can be rebuilt from it). :class:`DispatchRequest`
objects are only built when a dispatcher or a bitmap dispatcher needs them.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Final, NamedTuple, Protocol, runtime_checkable

from siftmq.hashing import java_string_hash
from siftmq.store.codec import (
    PROPERTY_KEYS,
    PROPERTY_TAGS,
    PROPERTY_UNIQ_KEY,
    StoredMessage,
    tags_code_of,
)
from siftmq.store.commitlog import AppendedRecord
from siftmq.store.consumequeue import ConsumeQueue, encode_entry_columns
from siftmq.store.tombstones import Tombstones

_log = logging.getLogger(__name__)

QueueArrival = tuple[str, int, int]
"""(topic, queue_id, max_offset) of a queue that received entries in a dispatch batch."""

_tags_codes: dict[str, int] = {}
_MAX_CACHED_TAGS: Final = 65536


def cached_tags_code(tags: str | None) -> int:
    """:func:`~siftmq.store.codec.tags_code_of` with a bounded cache (tags repeat a lot)."""
    if not tags:
        return 0
    code = _tags_codes.get(tags)
    if code is None:
        code = java_string_hash(tags)
        if len(_tags_codes) >= _MAX_CACHED_TAGS:
            _tags_codes.clear()
        _tags_codes[tags] = code
    return code


class DispatchRequest(NamedTuple):
    """What a dispatcher learns about one appended record (RocketMQ's DispatchRequest).

    A named tuple: one is built per record dispatched while dispatchers are registered, and a
    tuple is built several times faster than a frozen dataclass.
    """

    topic: str
    queue_id: int
    commit_log_offset: int
    msg_size: int
    tags_code: int
    store_timestamp: int
    consume_queue_offset: int
    keys: str
    uniq_key: str | None
    properties: Mapping[str, str]

    @classmethod
    def of(cls, msg: StoredMessage) -> DispatchRequest:
        """The request for a decoded record."""
        return cls(
            topic=msg.topic,
            queue_id=msg.queue_id,
            commit_log_offset=msg.commit_log_offset,
            msg_size=msg.store_size,
            tags_code=tags_code_of(msg.tags),
            store_timestamp=msg.store_timestamp,
            consume_queue_offset=msg.queue_offset,
            keys=msg.properties.get(PROPERTY_KEYS, ""),
            uniq_key=msg.properties.get(PROPERTY_UNIQ_KEY),
            properties=msg.properties,
        )


_new_request: Final = DispatchRequest._make


@runtime_checkable
class CommitLogDispatcher(Protocol):
    """Receives every dispatched batch, in CommitLog order."""

    def dispatch(self, requests: Sequence[DispatchRequest]) -> None:
        """Handle a batch of appended records."""
        ...


@runtime_checkable
class BitmapDispatcher(Protocol):
    """Computes the filter bitmap stored in the ConsumeQueueExt unit of each request."""

    def compute_bitmaps(self, requests: Sequence[DispatchRequest]) -> list[bytes | None]:
        """One bitmap (or None) per request, at most the store's bitmap size each."""
        ...


_Row = tuple[str, int, int, int, int, int, int]


def _row(r: DispatchRequest) -> _Row:
    """(topic, queue_id, commit_log_offset, size, tags_code, store_timestamp, queue_offset)."""
    return (
        r.topic,
        r.queue_id,
        r.commit_log_offset,
        r.msg_size,
        r.tags_code,
        r.store_timestamp,
        r.consume_queue_offset,
    )


def _with_fillers(
    rows: Sequence[_Row], bitmaps: Sequence[bytes | None] | None, first: int
) -> tuple[list[_Row], list[bytes | None] | None]:
    """``rows`` with a filler entry for each queue offset from ``first`` on that no row has.

    Only recovery sees such gaps: records of one queue passed over as damaged. A filler keeps the
    queue offsets of the records after it where they were (consumers' progress points at them); it
    has size 0, which reads pass over and count, and the CommitLog offset of the record after it,
    so retention and the offset lookups see the queue's offsets still rising.
    """
    out: list[_Row] = []
    out_bitmaps: list[bytes | None] = []
    expected = first
    for i, row in enumerate(rows):
        topic, queue_id, phy, _size, _tags_code, store_timestamp, queue_offset = row
        while expected < queue_offset:
            out.append((topic, queue_id, phy, 0, 0, store_timestamp, expected))
            out_bitmaps.append(None)
            expected += 1
        out.append(row)
        out_bitmaps.append(bitmaps[i] if bitmaps is not None else None)
        expected = queue_offset + 1
    return out, (out_bitmaps if bitmaps is not None else None)


class Reput:
    """Writes ConsumeQueue/ext entries for batches of records and calls the dispatchers.

    Not thread-safe by itself: the store calls it under its dispatch lock.
    """

    def __init__(self, find_or_create: Callable[[str, int], ConsumeQueue]) -> None:
        self._find_or_create = find_or_create
        self.dispatchers: list[CommitLogDispatcher] = []
        self.bitmap_dispatcher: BitmapDispatcher | None = None
        #: deleted topics: their records below the deletion offset are not indexed (set by the store)
        self.tombstones: Tombstones | None = None

    def dispatch(self, requests: Sequence[DispatchRequest], *, notify: bool = True) -> list[QueueArrival]:
        """Index ``requests`` (consecutive per queue) and, with ``notify``, call the dispatchers.

        Returns the queues written, with their new max offsets.
        """
        tombstones = self.tombstones
        if tombstones:
            requests = [r for r in requests if not tombstones.is_dead(r.topic, r.commit_log_offset)]
        if not requests:
            return []
        rows = [_row(r) for r in requests]
        return self._dispatch_rows(rows, requests, notify=notify)

    def dispatch_appended(
        self, records: Sequence[AppendedRecord], properties: Sequence[Mapping[str, str]]
    ) -> list[QueueArrival]:
        """Index freshly appended records (with their properties) and call the dispatchers."""
        tombstones = self.tombstones
        if tombstones:  # records appended before their topic's deletion, dispatched after it
            live = [i for i, r in enumerate(records) if not tombstones.is_dead(r.topic, r.commit_log_offset)]
            if len(live) < len(records):
                records = [records[i] for i in live]
                properties = [properties[i] for i in live]
        if not records:
            return []
        tags_codes = [cached_tags_code(p.get(PROPERTY_TAGS)) for p in properties]
        rows = [
            (r.topic, r.queue_id, r.commit_log_offset, r.size, tags_code, r.store_timestamp, r.queue_offset)
            for r, tags_code in zip(records, tags_codes, strict=True)
        ]
        requests: list[DispatchRequest] | None = None
        if self.dispatchers or self.bitmap_dispatcher is not None:
            requests = [
                _new_request(
                    (
                        *row,
                        props.get(PROPERTY_KEYS, ""),
                        props.get(PROPERTY_UNIQ_KEY),
                        props,
                    )
                )
                for row, props in zip(rows, properties, strict=True)
            ]
        return self._dispatch_rows(rows, requests, notify=True)

    def _dispatch_rows(
        self,
        rows: list[_Row],
        requests: Sequence[DispatchRequest] | None,
        *,
        notify: bool,
    ) -> list[QueueArrival]:
        bitmaps = self._bitmaps(requests) if requests is not None else None
        by_queue: dict[tuple[str, int], list[int]] = {}
        for i, row in enumerate(rows):
            key = (row[0], row[1])
            indexes = by_queue.get(key)
            if indexes is None:
                by_queue[key] = [i]
            else:
                indexes.append(i)
        arrivals: list[QueueArrival] = []
        for (topic, queue_id), indexes in by_queue.items():
            cq = self._find_or_create(topic, queue_id)
            group = [rows[i] for i in indexes] if len(indexes) < len(rows) else rows
            group_bitmaps = None
            if bitmaps is not None:
                group_bitmaps = [bitmaps[i] for i in indexes] if group is not rows else bitmaps
            self._write_rows(cq, group, group_bitmaps)
            arrivals.append((topic, queue_id, cq.max_offset))
        if notify and requests is not None:
            for dispatcher in list(self.dispatchers):
                try:
                    dispatcher.dispatch(requests)
                except Exception:
                    _log.exception("dispatcher %r failed; indexes it builds may lag", dispatcher)
        return arrivals

    @staticmethod
    def _write_rows(
        cq: ConsumeQueue,
        rows: Sequence[_Row],
        bitmaps: Sequence[bytes | None] | None,
    ) -> None:
        first = rows[0][6]
        if first < cq.max_offset:
            cq.truncate(first)
        elif first > cq.max_offset and cq.log.segment_count():
            first = cq.max_offset  # records lost to damage come before these (recovery only)
            rows, bitmaps = _with_fillers(rows, bitmaps, first)
        if rows[-1][6] - first != len(rows) - 1:
            rows, bitmaps = _with_fillers(rows, bitmaps, first)
        offsets = [r[2] for r in rows]
        sizes = [r[3] for r in rows]
        tags_codes = [r[4] for r in rows]
        ext_units = None
        if cq.ext is not None:
            ext = cq.ext
            timestamps = [r[5] for r in rows]
            if bitmaps is not None:
                bitmaps = list(bitmaps)
                for i, bitmap in enumerate(bitmaps):
                    if bitmap is not None and len(bitmap) > ext.bitmap_size:
                        _log.error(
                            "bitmap for %s:%d@%d is too long; stored without it",
                            cq.topic,
                            cq.queue_id,
                            rows[i][6],
                        )
                        bitmaps[i] = None
            ext_units = ext.encode_columns(timestamps, tags_codes, bitmaps)
        cq.put_encoded(first, encode_entry_columns(offsets, sizes, tags_codes), ext_units)

    def _bitmaps(self, requests: Sequence[DispatchRequest]) -> list[bytes | None] | None:
        if self.bitmap_dispatcher is None:
            return None
        try:
            bitmaps = self.bitmap_dispatcher.compute_bitmaps(requests)
        except Exception:
            _log.exception("bitmap dispatcher failed; entries stored without bitmaps")
            return None
        if len(bitmaps) != len(requests):
            _log.error("bitmap dispatcher returned %d bitmaps for %d requests", len(bitmaps), len(requests))
            return None
        return list(bitmaps)
