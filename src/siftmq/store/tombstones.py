"""Deleted topics: a deleted topic's stored records are dead everywhere, also after a restart.

Records of every topic share the CommitLog, so deleting a topic cannot remove its records there;
they go when retention deletes their segments. What makes them dead at once is a tombstone: the
topic and the CommitLog offset at its deletion. Every record of the topic below that offset is
skipped by dispatch, by recovery and a rebuild of the ConsumeQueues, by lookups by id or key, and by
the offline jobs reading the CommitLog (:func:`siftmq.store.bulk.plan_scan` hands the tombstones
to every range). The topic's queues are deleted at once, so a topic created again under the name
starts empty at queue offset 0. A tombstone is dropped once retention has deleted every segment
below its offset.

Kept in ``<store>/tombstones.json``, a state file (:mod:`siftmq.store.statefile`): written before
anything is deleted, and read strictly — losing it would bring the deleted messages back.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

from siftmq.store.statefile import peek_json, read_json, write_json

TOMBSTONES_FILE: Final = "tombstones.json"


class Tombstones:
    """The deleted topics of one store and their deletion offsets. Thread-safe."""

    def __init__(self, store_dir: Path) -> None:
        self._path = store_dir / TOMBSTONES_FILE
        self._lock = threading.Lock()
        self._by_topic = _parse(read_json(self._path, {}, strict=True))

    def __bool__(self) -> bool:
        return bool(self._by_topic)

    def offset(self, topic: str) -> int | None:
        """The CommitLog offset below which ``topic``'s records are dead; None if never deleted."""
        return self._by_topic.get(topic)

    def is_dead(self, topic: str, commit_log_offset: int) -> bool:
        below = self._by_topic.get(topic)
        return below is not None and commit_log_offset < below

    def add(self, topic: str, offset: int) -> None:
        """Record (durably) that ``topic``'s records below ``offset`` are dead."""
        with self._lock:
            # on disk first: a failed write leaves the topic alive everywhere, as the error says
            changed = {**self._by_topic, topic: max(offset, self._by_topic.get(topic, 0))}
            write_json(self._path, changed)
            self._by_topic = changed

    def prune(self, min_offset: int) -> list[str]:
        """Drop the tombstones whose records retention has all deleted (the log starts at
        ``min_offset``); returns their topics."""
        with self._lock:
            done = [topic for topic, offset in self._by_topic.items() if offset <= min_offset]
            if done:
                kept = {t: o for t, o in self._by_topic.items() if t not in done}
                write_json(self._path, kept)
                self._by_topic = kept
        return done


def read_tombstones(store_dir: Path) -> Mapping[str, int]:
    """The tombstones of a store, for a reader that does not own it (nothing is moved or logged)."""
    return _parse(peek_json(store_dir / TOMBSTONES_FILE, {}))


def _parse(found: Mapping[str, Any]) -> dict[str, int]:
    return {str(topic): int(offset) for topic, offset in found.items()}
