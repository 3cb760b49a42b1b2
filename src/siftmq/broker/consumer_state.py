"""Per-group consume progress: the next offset to read and the messages in flight, per queue.

A queue's progress is ``pop_offset`` (the next queue offset a receive reads) and the in-flight
messages: delivered, not yet acknowledged, each with its delivery attempt, the time it becomes
visible again and the nonce of its current receipt handle. The group's committed offset is the
smallest in-flight offset (or ``pop_offset``): everything before it is done.

The whole table is written to ``config/consumer_state.json`` (atomically) at most every
``flush_ms`` while it changes, and on a clean stop. After a crash the broker restarts from the last
snapshot: acknowledgements of the last interval are forgotten, so those messages are delivered
again — at worst a redelivery, never a loss.
"""

from __future__ import annotations

import heapq
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

from siftmq.store.statefile import read_json, write_json

QueueKey = tuple[str, str, int]  # group, topic, queue id
#: Entries of acknowledged or re-armed messages a queue's due-heap may hold beyond twice its
#: in-flight count before it is rebuilt from the in-flight messages.
DUE_SLACK = 1024


class InFlight(NamedTuple):
    """A delivered, unacknowledged message. A named tuple: one is built per message received (a
    slotted dataclass costs three times as much), and it is the state file's row as it is."""

    queue_offset: int
    commit_log_offset: int
    size: int
    attempt: int
    visible_at_ms: int
    nonce: int


@dataclass(slots=True)
class QueueProgress:
    """The progress of one group on one queue. Callers hold ``lock`` while reading or changing it."""

    pop_offset: int
    inflight: dict[int, InFlight] = field(default_factory=dict)
    _due: list[tuple[int, int, int]] = field(default_factory=list)  # (visible_at_ms, offset, nonce)
    lock: threading.Lock = field(default_factory=threading.Lock)
    #: deliveries made with ``auto_renew``: offset -> (nonce, client id, renewed until ms at most,
    #: invisible ms). In memory only: after a restart they come back once their time is over.
    renew: dict[int, tuple[int, str, int, int]] = field(default_factory=dict)

    @property
    def committed_offset(self) -> int:
        return min(self.inflight) if self.inflight else self.pop_offset

    def put(self, item: InFlight) -> None:
        self.inflight[item.queue_offset] = item
        heapq.heappush(self._due, (item.visible_at_ms, item.queue_offset, item.nonce))

    def pop_due(self, now_ms: int, limit: int) -> Iterator[InFlight]:
        """In-flight messages whose invisible time is over (at most ``limit``), oldest first.

        The caller puts back (or removes) every message taken before it lets go of ``lock``.
        """
        if self._wants_rebuild(self._due):
            # acks leave their entries in the heap until they come due: without this it would hold
            # every ack of the last invisible time (hours of them at the longest). Only here, where
            # nothing taken is outstanding: rebuilt later, it would bring back what a pass took.
            rebuilt = [(i.visible_at_ms, i.queue_offset, i.nonce) for i in self.inflight.values()]
            heapq.heapify(rebuilt)
            self._due = rebuilt  # whole: may_have_due looks without the lock
        taken = 0
        while self._due and taken < limit and self._due[0][0] <= now_ms:
            _, offset, nonce = heapq.heappop(self._due)
            item = self.inflight.get(offset)
            if item is None or item.nonce != nonce:
                continue  # acknowledged or re-armed since
            taken += 1
            yield item

    def due_count(self) -> int:
        """Entries in the due-heap (acknowledged ones included until they come due)."""
        return len(self._due)

    def may_have_due(self, now_ms: int) -> bool:
        """Whether :meth:`pop_due` has work: the due-heap's top entry has come due (maybe one
        acknowledged since, which it passes over), or the heap wants rebuilding. A look without
        ``lock`` (each step atomic under the GIL), so a receive need not take the locks of queues
        with nothing due; a look racing a receive that holds due items it has not put back yet
        may miss them, and they come a receive later."""
        due = self._due
        if self._wants_rebuild(due):
            return True
        try:
            return due[0][0] <= now_ms
        except IndexError:  # empty (or emptied by another thread meanwhile)
            return False

    def _wants_rebuild(self, due: list[tuple[int, int, int]]) -> bool:
        """Whether the due-heap holds so many acknowledged entries that :meth:`pop_due` rebuilds it."""
        return len(due) > 2 * len(self.inflight) + DUE_SLACK

    def next_due_ms(self) -> int | None:
        while self._due:
            _, offset, nonce = self._due[0]
            item = self.inflight.get(offset)
            if item is not None and item.nonce == nonce:
                return self._due[0][0]
            heapq.heappop(self._due)
        return None


class ConsumerStateTable:
    """All groups' :class:`QueueProgress`, persisted as one JSON snapshot."""

    def __init__(self, config_dir: Path) -> None:
        self._path = config_dir / "consumer_state.json"
        self._lock = threading.Lock()
        self._queues: dict[QueueKey, QueueProgress] = {}
        self._dirty = False
        self._urgent = False
        self._saving = threading.Lock()  # one save at a time
        for key, item in read_json(self._path, {}, strict=True).items():
            group, topic, qid = key.split("\t")
            prog = QueueProgress(int(item["pop"]))
            for off, clo, size, attempt, visible, nonce in item.get("inflight", []):
                prog.put(InFlight(off, clo, size, attempt, visible, nonce))
            self._queues[(group, topic, int(qid))] = prog

    def get(self, key: QueueKey) -> QueueProgress | None:
        return self._queues.get(key)

    def get_or_create(self, key: QueueKey, initial_offset: int) -> QueueProgress:
        prog = self._queues.get(key)
        if prog is None:
            with self._lock:
                prog = self._queues.setdefault(key, QueueProgress(initial_offset))
                self._dirty = True
        return prog

    def reset(self, key: QueueKey, pop_offset: int) -> None:
        """Make ``key``'s progress a bare position: ``pop_offset``, nothing in flight."""
        with self._lock:
            self._queues[key] = QueueProgress(pop_offset)
            self._dirty = self._urgent = True

    def clamp(self, key: QueueKey, end: int) -> None:
        """Bring ``key``'s progress back to ``end`` (its queue's end): a position past it goes to it,
        and messages in flight at or past it are forgotten (they are not in the queue); those below
        it stay in flight."""
        prog = self._queues.get(key)
        if prog is None:
            return
        kept = QueueProgress(min(prog.pop_offset, end))
        with prog.lock:  # the queue's lock, then the table's: one after the other, never nested here
            for offset, item in prog.inflight.items():
                if offset < end:
                    kept.put(item)
        with self._lock:
            self._queues[key] = kept
            self._dirty = self._urgent = True

    def items(self) -> list[tuple[QueueKey, QueueProgress]]:
        with self._lock:
            return list(self._queues.items())

    def mark_dirty(self) -> None:
        self._dirty = True

    def remove_where(self, doomed: Callable[[QueueKey], bool]) -> int:
        """Forget the progress (in-flight messages included) of every queue key ``doomed`` accepts."""
        return len(self.take_where(doomed))

    def take_where(self, doomed: Callable[[QueueKey], bool]) -> dict[QueueKey, QueueProgress]:
        """Remove and return the progress of every queue key ``doomed`` accepts."""
        with self._lock:
            taken = {key: prog for key, prog in self._queues.items() if doomed(key)}
            for key in taken:
                del self._queues[key]
            if taken:
                self._dirty = self._urgent = True
        return taken

    def put_back(self, taken: dict[QueueKey, QueueProgress]) -> None:
        """Restore progress :meth:`take_where` took (an operation that failed). It wins over progress
        made meanwhile, which a read without the position made by the rule for a new group."""
        with self._lock:
            self._queues.update(taken)
            if taken:
                self._dirty = self._urgent = True

    @property
    def dirty(self) -> bool:
        return self._dirty

    @property
    def urgent(self) -> bool:
        """Progress was removed (a deleted topic or group, an expired client) since the last save:
        it is written at the next housekeeping pass, however long the last write took."""
        return self._urgent

    @property
    def path(self) -> Path:
        """The file it is kept in."""
        return self._path

    def save(self) -> None:
        """Write the snapshot (each queue copied under its own lock). Saves are made one at a time
        (a receive thread saves a new queue's start; the housekeeping saves the rest): two
        writers of one file would interleave their bytes, or write an older snapshot last."""
        with self._saving:
            urgent = self._urgent
            self._dirty = self._urgent = False  # cleared first: a change during the write sets them again
            snapshot: dict[str, object] = {}
            for (group, topic, qid), prog in self.items():
                with prog.lock:
                    snapshot[f"{group}\t{topic}\t{qid}"] = {
                        "pop": prog.pop_offset,
                        "inflight": list(prog.inflight.values()),  # rows of its fields, in order
                    }
            try:
                write_json(self._path, snapshot)
            except OSError:  # retried by the next housekeeping pass, as urgently as before
                self._dirty = True
                self._urgent = self._urgent or urgent
                raise
