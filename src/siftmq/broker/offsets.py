"""Committed offsets of pull consumers (UpdateOffset / GetOffset), per group, topic and queue.

Kept in ``config/consumer_offsets.json``, written atomically by the broker's housekeeping while it
changes and on a clean stop. After a crash a pull consumer resumes from the last written offset:
at worst it pulls some messages again.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

from siftmq.store.statefile import read_json, write_json

OffsetKey = tuple[str, str, int]  # group, topic, queue id


class OffsetTable:
    """Thread-safe offset table."""

    def __init__(self, config_dir: Path) -> None:
        self._path = config_dir / "consumer_offsets.json"
        self._lock = threading.Lock()
        # one save at a time: two writers of the file share its temporary name (one failed with
        # FileNotFoundError), and the slower could put an older snapshot last
        self._saving = threading.Lock()
        self._offsets: dict[OffsetKey, int] = {}
        self._dirty = False
        for key, offset in read_json(self._path, {}, strict=True).items():
            group, topic, qid = key.split("\t")
            self._offsets[(group, topic, int(qid))] = int(offset)

    def get(self, key: OffsetKey) -> int | None:
        return self._offsets.get(key)

    def items(self) -> list[tuple[OffsetKey, int]]:
        with self._lock:
            return list(self._offsets.items())

    def set(self, key: OffsetKey, offset: int) -> None:
        with self._lock:
            if self._offsets.get(key) != offset:
                self._offsets[key] = offset
                self._dirty = True

    def remove_where(self, doomed: Callable[[OffsetKey], bool]) -> int:
        """Forget the offsets of every key ``doomed`` accepts; how many there were."""
        return len(self.take_where(doomed))

    def take_where(self, doomed: Callable[[OffsetKey], bool]) -> dict[OffsetKey, int]:
        """Remove and return the offsets of every key ``doomed`` accepts."""
        with self._lock:
            taken = {key: offset for key, offset in self._offsets.items() if doomed(key)}
            for key in taken:
                del self._offsets[key]
            if taken:
                self._dirty = True
        return taken

    def put_back(self, taken: dict[OffsetKey, int]) -> None:
        """Restore offsets :meth:`take_where` took (an operation that failed); they win over any
        set meanwhile."""
        with self._lock:
            self._offsets.update(taken)
            if taken:
                self._dirty = True

    @property
    def dirty(self) -> bool:
        return self._dirty

    @property
    def path(self) -> Path:
        """The file it is kept in."""
        return self._path

    def save(self) -> None:
        with self._saving:
            with self._lock:
                snapshot = {f"{g}\t{t}\t{q}": o for (g, t, q), o in self._offsets.items()}
                self._dirty = False
            try:
                write_json(self._path, snapshot)
            except OSError:
                self._dirty = True
                raise
