"""Counters the broker keeps for the admin API and the metrics endpoint (plain numbers, no exporter here)."""

from __future__ import annotations

import threading
from collections import Counter
from dataclasses import dataclass, field
from typing import Any


@dataclass(slots=True)
class FilterStats:
    """Filter work for one ``group#topic``: entries skipped at the index stage, messages evaluated exactly."""

    evaluated: int = 0
    matched: int = 0
    skipped_by_tags_code: int = 0
    skipped_by_bitmap: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, *, evaluated: int = 0, matched: int = 0, tags: int = 0, bitmap: int = 0) -> None:
        with self._lock:
            self.evaluated += evaluated
            self.matched += matched
            self.skipped_by_tags_code += tags
            self.skipped_by_bitmap += bitmap

    def as_dict(self) -> dict[str, int]:
        return {
            "evaluated": self.evaluated,
            "matched": self.matched,
            "skipped_by_tags_code": self.skipped_by_tags_code,
            "skipped_by_bitmap": self.skipped_by_bitmap,
        }


class BrokerStats:
    """Sends, deliveries, dead letters and filter work, by topic and group. Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.sends: Counter[str] = Counter()
        self.send_bytes: Counter[str] = Counter()
        self.duplicates: Counter[str] = Counter()
        self.deliveries: Counter[tuple[str, str]] = Counter()  # receive and pull
        self.delivered_bytes: Counter[tuple[str, str]] = Counter()  # their body bytes
        self.acks: Counter[tuple[str, str]] = Counter()
        self.dead_letters: Counter[str] = Counter()
        # messages a group had not consumed when retention deleted them for space (delete_oldest)
        self.deleted_unconsumed: Counter[str] = Counter()
        self._filters: dict[tuple[str, str], FilterStats] = {}

    def filter(self, group: str, topic: str) -> FilterStats:
        key = (group, topic)
        found = self._filters.get(key)
        if found is None:
            with self._lock:
                found = self._filters.setdefault(key, FilterStats())
        return found

    def filters(self) -> dict[tuple[str, str], FilterStats]:
        with self._lock:
            return dict(self._filters)

    def snapshot(self, counter: Counter[Any]) -> dict[Any, int]:
        """A copy of one counter, taken under the lock (safe to iterate while sends go on)."""
        with self._lock:
            return dict(counter)

    def count(self, counter: Counter[str] | Counter[tuple[str, str]], key: object, n: int = 1) -> None:
        with self._lock:
            counter[key] += n  # type: ignore[index]

    def delivered(self, group: str, topic: str, messages: int, body_bytes: int) -> None:
        """Messages a receive or a pull handed out, and their body bytes."""
        with self._lock:
            self.deliveries[(group, topic)] += messages
            self.delivered_bytes[(group, topic)] += body_bytes
