"""In-memory lookup of messages by UNIQ_KEY and by KEYS.

This is not RocketMQ's on-disk IndexFile: the maps live in memory and are rebuilt from the
CommitLog by the recovery scan at every open (so opening costs a scan of the whole log while
``build_key_index`` is on). Entries below the CommitLog's first offset are pruned by retention.
The store indexes a record when its append is acknowledged (not in the background dispatch):
lookups resolve to CommitLog offsets, so they need no ConsumeQueue.
"""

from __future__ import annotations

import bisect
import threading
from collections.abc import Iterable, Mapping, Sequence

from siftmq.store.codec import KEY_SEPARATOR, PROPERTY_KEYS, PROPERTY_UNIQ_KEY
from siftmq.store.commitlog import AppendedRecord
from siftmq.store.dispatch import DispatchRequest


class KeyIndex:
    """uniq_key -> commit log offset; (topic, key) -> commit log offsets (oldest first)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_uniq_key: dict[str, int] = {}
        self._by_key: dict[tuple[str, str], list[int]] = {}

    def dispatch(self, requests: Iterable[DispatchRequest]) -> None:
        """Index a batch of requests."""
        with self._lock:
            for req in requests:
                if req.uniq_key:
                    self._by_uniq_key[req.uniq_key] = req.commit_log_offset
                for key in req.keys.split(" "):
                    if key:
                        self._by_key.setdefault((req.topic, key), []).append(req.commit_log_offset)

    def add_appended(
        self, records: Sequence[AppendedRecord], properties: Sequence[Mapping[str, str]]
    ) -> None:
        """Index freshly appended records, given with their properties.

        Batches may arrive slightly out of CommitLog order (sync mode indexes after the group
        commit); the maps stay ordered: the newest offset wins, key lists stay sorted.
        """
        keyed = [
            (rec, props)
            for rec, props in zip(records, properties, strict=True)
            if PROPERTY_UNIQ_KEY in props or PROPERTY_KEYS in props
        ]
        if not keyed:
            return
        with self._lock:
            by_uniq_key = self._by_uniq_key
            by_key = self._by_key
            for rec, props in keyed:
                offset = rec.commit_log_offset
                uniq_key = props.get(PROPERTY_UNIQ_KEY)
                if uniq_key and by_uniq_key.get(uniq_key, -1) < offset:
                    by_uniq_key[uniq_key] = offset
                keys = props.get(PROPERTY_KEYS)
                if keys:
                    for key in keys.split(KEY_SEPARATOR):
                        if key:
                            offsets = by_key.setdefault((rec.topic, key), [])
                            if offsets and offsets[-1] > offset:
                                bisect.insort(offsets, offset)
                            else:
                                offsets.append(offset)

    def offset_of_uniq_key(self, uniq_key: str) -> int | None:
        """The newest commit log offset stored with this UNIQ_KEY."""
        return self._by_uniq_key.get(uniq_key)

    def offsets_of_key(self, topic: str, key: str) -> list[int]:
        """Commit log offsets of the messages of ``topic`` carrying ``key``, oldest first."""
        with self._lock:
            return list(self._by_key.get((topic, key), ()))

    def prune(self, min_offset: int) -> None:
        """Forget offsets below ``min_offset``."""
        with self._lock:
            self._by_uniq_key = {k: v for k, v in self._by_uniq_key.items() if v >= min_offset}
            pruned: dict[tuple[str, str], list[int]] = {}
            for k, offsets in self._by_key.items():
                kept = [o for o in offsets if o >= min_offset]
                if kept:
                    pruned[k] = kept
            self._by_key = pruned

    def clear(self) -> None:
        """Forget everything."""
        with self._lock:
            self._by_uniq_key.clear()
            self._by_key.clear()
