"""In-memory lookup of messages by UNIQ_KEY and by KEYS.

This is not RocketMQ's on-disk IndexFile: the maps live in memory and are rebuilt from the
CommitLog by the recovery scan at every open (so opening costs a scan of the whole log while
``build_key_index`` is on). Entries below the CommitLog's first offset are pruned by retention,
and the oldest past ``key_index_max_messages`` ids (:meth:`KeyIndex.trim`): in memory, an id
costs ~150-200 bytes, and a retained log can hold far more messages than memory such entries.
The store indexes a record when its append is acknowledged (not in the background dispatch):
lookups resolve to CommitLog offsets, so they need no ConsumeQueue.
"""

from __future__ import annotations

import bisect
import threading
from collections.abc import Iterable, Mapping, Sequence

import numpy as np

from siftmq.store.codec import KEY_SEPARATOR, PROPERTY_KEYS, PROPERTY_UNIQ_KEY
from siftmq.store.commitlog import AppendedRecord
from siftmq.store.dispatch import DispatchRequest


class KeyIndex:
    """uniq_key -> commit log offset; (topic, key) -> commit log offsets (oldest first)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._prune_lock = threading.Lock()  # one prune at a time
        self._by_uniq_key: dict[str, int] = {}
        self._by_key: dict[tuple[str, str], list[int]] = {}
        # while a prune filters them outside the lock: the maps it filters (written no more) and
        # its bound; lookups read them after the current maps
        self._pruning: tuple[dict[str, int], dict[tuple[str, str], list[int]], int] | None = None
        self._cleared = 0  # clear() calls: a prune that raced one keeps nothing of its own

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
                            _insert(by_key.setdefault((rec.topic, key), []), offset)

    def offset_of_uniq_key(self, uniq_key: str) -> int | None:
        """The newest commit log offset stored with this UNIQ_KEY."""
        with self._lock:
            found = self._by_uniq_key.get(uniq_key)
            if found is None and self._pruning is not None:
                old, _, min_offset = self._pruning
                found = old.get(uniq_key)
                if found is not None and found < min_offset:
                    found = None
            return found

    def offsets_of_key(self, topic: str, key: str) -> list[int]:
        """Commit log offsets of the messages of ``topic`` carrying ``key``, oldest first."""
        with self._lock:
            offsets = list(self._by_key.get((topic, key), ()))
            if self._pruning is not None:
                _, old, min_offset = self._pruning
                before = old.get((topic, key), [])
                kept = before[bisect.bisect_left(before, min_offset) :]
                if kept:
                    for offset in offsets:
                        _insert(kept, offset)
                    offsets = kept
            return offsets

    def prune(self, min_offset: int) -> None:
        """Forget offsets below ``min_offset``.

        The maps are filtered outside the lock — retention may drop millions of entries while
        every send adds its own and looks for its retries (under the lock, ~3 s against ~0.1 s
        for a send then): new entries go to fresh maps meanwhile, and lookups read both.
        """
        with self._prune_lock:
            with self._lock:
                old_uniq, old_keys = self._by_uniq_key, self._by_key
                self._by_uniq_key, self._by_key = {}, {}
                self._pruning = (old_uniq, old_keys, min_offset)
                cleared = self._cleared
            by_uniq_key, by_key = old_uniq, old_keys  # should the filtering fail: nothing pruned
            try:
                by_uniq_key = {k: v for k, v in old_uniq.items() if v >= min_offset}
                by_key = {}
                for k, offsets in old_keys.items():
                    kept = offsets[bisect.bisect_left(offsets, min_offset) :]
                    if kept:
                        by_key[k] = kept
            finally:
                with self._lock:
                    if self._cleared == cleared:  # else clear() dropped what was filtered too
                        self._merge_into(by_uniq_key, by_key)
                    self._pruning = None

    def trim(self, max_messages: int) -> int:
        """Forget the oldest entries when more than ``max_messages`` ids are held, down to nine
        tenths of it (so a trim is not due again at the next message): memory stays bounded at
        about 150-200 bytes per id (a send's retry, which comes within seconds, is still found;
        lookups by id or key of older messages find nothing). Returns the offset cut below (0: none)."""
        with self._lock:
            count = len(self._by_uniq_key)
            if count <= max_messages:
                return 0
            offsets = list(self._by_uniq_key.values())  # a C-level copy; the sort is done outside
        drop = len(offsets) - max(1, max_messages * 9 // 10)
        cut = int(np.partition(np.fromiter(offsets, dtype=np.int64, count=len(offsets)), drop)[drop])
        self.prune(cut)
        return cut

    def _merge_into(self, by_uniq_key: dict[str, int], by_key: dict[tuple[str, str], list[int]]) -> None:
        """The entries added during a prune put into its filtered maps, which become the index
        (under the lock)."""
        for uniq_key, offset in self._by_uniq_key.items():
            if by_uniq_key.get(uniq_key, -1) < offset:
                by_uniq_key[uniq_key] = offset
        for k, offsets in self._by_key.items():
            kept = by_key.get(k)
            if kept is None:
                by_key[k] = offsets
            else:
                for offset in offsets:
                    _insert(kept, offset)
        self._by_uniq_key, self._by_key = by_uniq_key, by_key

    def clear(self) -> None:
        """Forget everything."""
        with self._lock:
            self._by_uniq_key = {}
            self._by_key = {}
            self._cleared += 1
            if self._pruning is not None:
                self._pruning = ({}, {}, self._pruning[2])


def _insert(offsets: list[int], offset: int) -> None:
    """Add ``offset`` to a sorted list (at its end, nearly always)."""
    if offsets and offsets[-1] > offset:
        bisect.insort(offsets, offset)
    else:
        offsets.append(offset)
