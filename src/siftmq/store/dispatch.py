"""Dispatch ("reput"): turning appended CommitLog records into index entries.

After records are appended they are dispatched in batches, in CommitLog order:

1. the :class:`BitmapDispatcher`, if one is set, computes a filter bitmap per request
   (RocketMQ's ``CommitLogDispatcherCalcBitMap``, implemented by the broker);
2. the ConsumeQueue entries and their extension units (store timestamp, tags code, bitmap)
   are written (``CommitLogDispatcherBuildConsumeQueue``);
3. every registered :class:`CommitLogDispatcher` gets the batch.

Dispatchers are derived-state builders: an exception in one is logged and does not fail the
append (the CommitLog is the truth and indexes can be rebuilt from it).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from siftmq.store.codec import PROPERTY_KEYS, PROPERTY_UNIQ_KEY, StoredMessage, tags_code_of
from siftmq.store.consumequeue import ConsumeQueue, CqEntry

_log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class DispatchRequest:
    """What a dispatcher learns about one appended record (RocketMQ's DispatchRequest)."""

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


class Reput:
    """Writes ConsumeQueue/ext entries for batches of requests and calls the dispatchers.

    Not thread-safe by itself: the store calls it under its dispatch lock.
    """

    def __init__(self, find_or_create: Callable[[str, int], ConsumeQueue]) -> None:
        self._find_or_create = find_or_create
        self.dispatchers: list[CommitLogDispatcher] = []
        self.bitmap_dispatcher: BitmapDispatcher | None = None

    def dispatch(self, requests: Sequence[DispatchRequest], *, notify: bool = True) -> None:
        """Index ``requests`` (consecutive per queue) and, with ``notify``, call the dispatchers."""
        if not requests:
            return
        bitmaps = self._bitmaps(requests)
        by_queue: dict[tuple[str, int], list[int]] = {}
        for i, req in enumerate(requests):
            by_queue.setdefault((req.topic, req.queue_id), []).append(i)
        for (topic, queue_id), indexes in by_queue.items():
            cq = self._find_or_create(topic, queue_id)
            self.write_entries(cq, [requests[i] for i in indexes], [bitmaps[i] for i in indexes])
        if notify:
            for dispatcher in list(self.dispatchers):
                try:
                    dispatcher.dispatch(requests)
                except Exception:
                    _log.exception("dispatcher %r failed; indexes it builds may lag", dispatcher)

    @staticmethod
    def write_entries(
        cq: ConsumeQueue, reqs: Sequence[DispatchRequest], bitmaps: Sequence[bytes | None]
    ) -> None:
        """Write the entries of consecutive requests of one queue (truncating a stale tail)."""
        first = reqs[0].consume_queue_offset
        if first < cq.max_offset:
            cq.truncate(first)
        entries: list[CqEntry] = [(r.commit_log_offset, r.msg_size, r.tags_code) for r in reqs]
        ext_units = None
        if cq.ext is not None:
            ext = cq.ext
            ext_units = []
            for r, bitmap in zip(reqs, bitmaps, strict=True):
                try:
                    ext_units.append(ext.encode(r.store_timestamp, r.tags_code, bitmap))
                except ValueError:
                    _log.error(
                        "bitmap for %s:%d@%d is too long; stored without it",
                        r.topic,
                        r.queue_id,
                        r.consume_queue_offset,
                    )
                    ext_units.append(ext.encode(r.store_timestamp, r.tags_code, None))
        cq.put_entries(first, entries, ext_units)

    def _bitmaps(self, requests: Sequence[DispatchRequest]) -> list[bytes | None]:
        nothing: list[bytes | None] = [None] * len(requests)
        if self.bitmap_dispatcher is None:
            return nothing
        try:
            bitmaps = self.bitmap_dispatcher.compute_bitmaps(requests)
        except Exception:
            _log.exception("bitmap dispatcher failed; entries stored without bitmaps")
            return nothing
        if len(bitmaps) != len(requests):
            _log.error("bitmap dispatcher returned %d bitmaps for %d requests", len(bitmaps), len(requests))
            return nothing
        return list(bitmaps)
