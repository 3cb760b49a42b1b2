"""A bounded pool of open index files: thousands of topics under a 1,024 open-file limit.

Every ConsumeQueue and ConsumeQueueExt segment is a file; a broker with thousands of topics would
hold thousands of descriptors and, at the common limit of 1,024, every send (existing topics
included) would fail with ``Too many open files``. Their segments (:class:`PooledSegment`) share
one process-wide :class:`FilePool` instead: a descriptor is opened when the segment is used and the
least recently used ones are closed beyond the pool's budget, half of ``RLIMIT_NOFILE`` (the other
half is for sockets, CommitLog segments and everything else). A descriptor in use is never closed;
a written one is synced before it is.

The first pooled open raises the soft ``RLIMIT_NOFILE`` to the hard limit (logging both), as the
operating system lets a process do, so the budget is as large as this host allows.
"""

from __future__ import annotations

import logging
import os
import resource
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from siftmq.store.segment import Segment

_log = logging.getLogger(__name__)

#: The pool never goes below this many descriptors, whatever the limit says.
MIN_BUDGET: Final = 32


def raise_open_file_limit() -> tuple[int, int]:
    """Raise the soft ``RLIMIT_NOFILE`` to the hard one (where allowed); return (soft, hard)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError) as exc:
            _log.warning("could not raise the open-file limit from %d to %d: %s", soft, target, exc)
    return soft, hard


class FilePool:
    """Open descriptors of :class:`PooledSegment` files, the least recently used closed beyond a budget."""

    def __init__(self, budget: int | None = None) -> None:
        self._budget = budget
        self._open: OrderedDict[int, PooledSegment] = OrderedDict()
        self._lock = threading.Lock()

    @property
    def budget(self) -> int:
        if self._budget is None:
            soft, hard = raise_open_file_limit()
            self._budget = max(MIN_BUDGET, soft // 2)
            _log.info(
                "open-file limit: soft %d, hard %d; up to %d index files are kept open",
                soft,
                hard,
                self._budget,
            )
        return self._budget

    @property
    def open_count(self) -> int:
        """Descriptors open now, read under the lock: an open and the evictions it makes are one
        step, and a look between them would count one over the budget."""
        with self._lock:
            return len(self._open)

    def acquire(self, seg: PooledSegment) -> None:
        """Make sure ``seg`` has an open descriptor and keep it open until :meth:`release`."""
        with self._lock:
            if seg.fd < 0:
                self._reopen_locked(seg)
            seg.users.append(None)
            seg.used = True

    @staticmethod
    def release(seg: PooledSegment) -> None:
        # list.pop is atomic: no lock needed, and an eviction only ever sees a use that began
        # under the lock
        seg.users.pop()

    def _reopen_locked(self, seg: PooledSegment) -> None:
        if seg.gone:
            raise FileNotFoundError(f"{seg.path} was deleted")
        seg.fd = os.open(seg.path, os.O_RDWR)
        self._count_locked(seg)

    def adopt(self, seg: PooledSegment) -> None:
        """Count a descriptor just opened for ``seg`` (closing others if over budget)."""
        with self._lock:
            self._count_locked(seg)

    def _count_locked(self, seg: PooledSegment) -> None:
        self._open[id(seg)] = seg
        seg.users.append(None)  # not evicted by its own arrival
        try:
            self._evict_locked()
        finally:
            seg.users.pop()

    def forget(self, seg: PooledSegment) -> None:
        with self._lock:
            self._open.pop(id(seg), None)

    def _evict_locked(self) -> None:
        """Close the least recently used descriptors beyond the budget (a second chance for the
        ones used since the last look, as the CLOCK algorithm does: cheaper per use than keeping
        an exact order)."""
        budget = self.budget
        looked = 0
        while len(self._open) > budget and looked < 2 * len(self._open):
            looked += 1
            key, victim = next(iter(self._open.items()))
            self._open.move_to_end(key)
            if victim.users:
                continue
            if victim.used:
                victim.used = False
                continue
            del self._open[key]
            if victim.dirty:  # what was written stays durable: the flusher cannot sync it any more
                os.fdatasync(victim.fd)
                victim.dirty = False
            os.close(victim.fd)
            victim.fd = -1


#: The pool of the process (the open-file limit is per process).
POOL: Final = FilePool()


@dataclass(slots=True, eq=False)
class PooledSegment(Segment):
    """A segment whose descriptor comes from :data:`POOL` while it is used (index files)."""

    #: one item per use in progress (appended under the pool's lock, popped without it)
    users: list[None] = field(default_factory=list)
    #: used since the pool last looked at it for eviction
    used: bool = True
    #: deleted (by retention or a truncation): it cannot be opened again
    gone: bool = False

    @classmethod
    def open(
        cls, directory: Path, start_offset: int, capacity: int, *, create: bool = False, writable: bool = True
    ) -> PooledSegment:
        # (an explicit super: a slotted dataclass is a new class, which the implicit form misses)
        seg = super(PooledSegment, cls).open(
            directory, start_offset, capacity, create=create, writable=writable
        )
        assert isinstance(seg, PooledSegment)
        POOL.adopt(seg)
        return seg

    def read(self, pos: int, size: int) -> bytes:
        # the hot path (every index read): POOL.acquire and release, inlined
        with POOL._lock:
            if self.fd < 0:
                POOL._reopen_locked(self)
            self.users.append(None)
            self.used = True
        try:
            return Segment.read(self, pos, size)
        finally:
            self.users.pop()

    def write(self, data: bytes | bytearray) -> None:
        POOL.acquire(self)
        try:
            Segment.write(self, data)
        finally:
            POOL.release(self)

    def overwrite(self, pos: int, data: bytes) -> None:
        POOL.acquire(self)
        try:
            Segment.overwrite(self, pos, data)
        finally:
            POOL.release(self)

    def flush(self) -> None:
        if not self.dirty:
            return
        POOL.acquire(self)
        try:
            Segment.flush(self)
        finally:
            POOL.release(self)

    def truncate(self, length: int) -> None:
        POOL.acquire(self)
        try:
            Segment.truncate(self, length)
        finally:
            POOL.release(self)

    def close(self) -> None:
        POOL.forget(self)
        Segment.close(self)

    def destroy(self, *, defer_close: bool = False) -> None:
        self.gone = True
        Segment.destroy(self, defer_close=defer_close)
