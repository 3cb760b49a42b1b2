"""Recovery's check of the ConsumeQueues against the records its scan reads.

A CommitLog record carries a CRC; the index built from it does not. One damaged byte of a
ConsumeQueue entry would otherwise cost an intact message for good: a wrong tags code hides it
from tag subscriptions, a wrong size or CommitLog offset makes reads pass over it as damaged, and a
wrong size in a queue's first entry (which then reads as a hole) or a deleted first file moves the
queue's min offset past it. With the key index (the broker's default) recovery reads every record
of the log at every start anyway, so :class:`IndexCheck` compares each record with its queue's
entry (CommitLog offset, size, tags code) and extension unit (store timestamp, tags code, a
bitmap length that covers every nonzero bitmap byte, and the bitmap's check where units keep one),
a batch at a time with numpy:

* an entry that disagrees is rewritten from the record;
* an extension unit that disagrees is rewritten from the record without its bitmap: the bitmap was
  computed from properties this check does not evaluate, and without one the broker evaluates the
  message's filter exactly (a unit never written, all zeros, is absent already and left so);
* a queue whose first record lies below its min offset is rebuilt from the records the scan reads
  (when the scan starts at the log's first record; otherwise every queue is rebuilt).

What is found is logged (ERROR, one line per queue) and counted in :class:`IndexRepairs`. Damage
that happens while the store runs is found at its next start (a damaged bitmap is also passed over
by every read meanwhile: see :mod:`siftmq.store.consumequeue_ext`). In a store made before the
bitmap check, a flipped bit inside a bitmap whose unit is otherwise right cannot be told from a
true one.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from operator import itemgetter
from typing import Final

import numpy as np
import numpy.typing as npt

from siftmq.store.consumequeue import CQ_DTYPE, ConsumeQueue, encode_entries
from siftmq.store.dispatch import DispatchRequest, Reput

_log = logging.getLogger(__name__)

_TOPIC: Final = itemgetter(0)
_QUEUE_ID: Final = itemgetter(1)
# DispatchRequest fields, in the order of the columns :meth:`IndexCheck.check` builds
_PHY, _SIZE, _TAGS, _STAMP, _QUEUE_OFFSET = 2, 3, 4, 5, 6
_COLUMNS: Final = (_PHY, _SIZE, _TAGS, _STAMP, _QUEUE_OFFSET)
_GETTERS: Final = tuple(itemgetter(i) for i in _COLUMNS)

QueueKey = tuple[str, int]


@dataclass(slots=True)
class IndexRepairs:
    """What recovery's check of the ConsumeQueues repaired."""

    #: ConsumeQueue entries rewritten from the records they disagreed with
    entries: int = 0
    #: extension units rewritten from their records, without their filter bitmaps
    ext_units: int = 0
    #: queues rebuilt because entries below their first one were missing
    queues_rebuilt: int = 0


@dataclass(slots=True)
class _QueueTally:
    checked: int = 0
    entries: int = 0
    ext_units: int = 0


class IndexCheck:
    """Checks the ConsumeQueue entries of the records recovery scans (see the module's doc).

    ``whole_log``: the scan starts at the log's first record, so the first record of a queue it
    reads is the queue's first. ``before_rebuild`` runs before a queue's files are deleted.
    """

    def __init__(
        self,
        queues: dict[QueueKey, ConsumeQueue],
        reput: Reput,
        repairs: IndexRepairs,
        *,
        whole_log: bool,
        before_rebuild: Callable[[], None],
    ) -> None:
        self._queues = queues
        self._reput = reput
        self.repairs = repairs
        self._whole_log = whole_log
        self._before_rebuild = before_rebuild
        self._seen: set[QueueKey] = set()
        self._rebuilding: set[QueueKey] = set()
        self._tallies: dict[QueueKey, _QueueTally] = {}

    def check(self, batch: Sequence[DispatchRequest]) -> Sequence[DispatchRequest] | None:
        """Check and repair the entries of ``batch`` (records in CommitLog order); the records of
        queues being rebuilt are indexed here. Returns the other records, or None when a queue
        misses entries that the scanned records cannot give back (every queue must be rebuilt)."""
        n = len(batch)
        if not n:
            return batch
        topics = list(map(_TOPIC, batch))
        first_of: dict[str, int] = {}
        # a topic's id is the row of its first record in the batch (a str's hash is cached: a
        # dict of topics is cheaper per record than one of (topic, queue id) tuples)
        topic_ids = np.fromiter(map(first_of.setdefault, topics, range(n)), dtype=np.int64, count=n)
        queue_ids = np.fromiter(map(_QUEUE_ID, batch), dtype=np.int64, count=n)
        cols = np.empty((len(_COLUMNS), n), dtype=np.int64)
        for i, get in enumerate(_GETTERS):
            cols[i] = np.fromiter(map(get, batch), dtype=np.int64, count=n)
        ids = (topic_ids << 32) | (queue_ids & 0xFFFFFFFF)
        if len(first_of) == 1 and (queue_ids == queue_ids[0]).all():
            groups: list[npt.NDArray[np.intp]] = [np.arange(n)]
        else:
            order = np.argsort(ids, kind="stable")
            groups = np.split(order, np.flatnonzero(np.diff(ids[order])) + 1)
        taken: list[npt.NDArray[np.intp]] = []
        for rows in groups:
            row = int(rows[0])
            key = (topics[row], int(queue_ids[row]))
            if key in self._rebuilding:
                taken.append(rows)
                continue
            cq = self._queues.get(key)
            if cq is None:
                continue  # recovery rebuilds every queue when one it needs has no files at all
            group = cols[:, rows]
            first = int(group[4, 0])
            if first < cq.min_offset:
                if not self._whole_log or key in self._seen:
                    return None
                self._rebuild(key, cq, first)
                taken.append(rows)
                continue
            self._seen.add(key)
            self._verify(key, cq, group)
        if not taken:
            return batch
        rows = np.sort(np.concatenate(taken))
        self._reput.dispatch([batch[i] for i in rows.tolist()], notify=False)
        rest = np.ones(n, dtype=np.bool_)
        rest[rows] = False
        return [batch[i] for i in np.flatnonzero(rest).tolist()]

    def report(self) -> None:
        """Log what was repaired, one line per queue."""
        for (topic, queue_id), tally in sorted(self._tallies.items()):
            if tally.entries or tally.ext_units:
                _log.error(
                    "%s:%d: %d of %d index entries and %d extension units disagreed with their "
                    "records and were rewritten from them (the units without their filter bitmaps: "
                    "filters evaluate those messages exactly)",
                    topic, queue_id, tally.entries, tally.checked, tally.ext_units,
                )  # fmt: skip

    def _rebuild(self, key: QueueKey, cq: ConsumeQueue, first: int) -> None:
        _log.error(
            "%s:%d: the index starts at queue offset %d but the commit log holds the queue's "
            "records from %d (an index file deleted or damaged); rebuilding the queue from the "
            "commit log",
            key[0], key[1], cq.min_offset, first,
        )  # fmt: skip
        self._before_rebuild()
        cq.destroy()
        self._rebuilding.add(key)
        self.repairs.queues_rebuilt += 1

    def _verify(self, key: QueueKey, cq: ConsumeQueue, group: npt.NDArray[np.int64]) -> None:
        """Compare the entries (and extension units) of one queue's records ``group`` (columns as
        :data:`_COLUMNS`, queue offsets rising) with the records; rewrite the ones that differ."""
        offsets = group[4]
        lo = int(offsets[0])
        hi = min(int(offsets[-1]) + 1, cq.max_offset)
        if hi <= lo:
            return  # entries not written yet: recovery re-dispatches or rebuilds them
        tally = self._tallies.get(key)
        if tally is None:
            tally = self._tallies[key] = _QueueTally()
        data = cq.log.read(lo, hi - lo, within_segment=False)
        entries = np.frombuffer(data or b"", dtype=CQ_DTYPE)
        rec, ent = _pair(group, lo, entries)
        tally.checked += len(ent)
        bad = (ent["commit_log_offset"] != rec[0]) | (ent["size"] != rec[1]) | (ent["tags_code"] != rec[2])
        if bad.any():
            for phy, size, tags_code, _stamp, queue_offset in rec[:, bad].T.tolist():
                cq.log.overwrite(queue_offset, encode_entries([(phy, size, tags_code)]))
                tally.entries += 1
                self.repairs.entries += 1
        ext = cq.ext
        if ext is None:
            return
        rec, unit = _pair(group, lo, ext.read_units(lo, hi - lo))
        stamps = unit["store_timestamp"]
        tags_codes = unit["tags_code"]
        lengths = unit["bitmap_length"]
        written = (stamps != 0) | (tags_codes != 0) | (lengths != 0)
        bad = written & (
            (stamps != rec[3])
            | (tags_codes != rec[2])
            | (lengths > ext.bitmap_size)
            | ~ext.bitmap_intact(unit)
        )
        # the bytes past a bitmap's length are zeros: a length damaged to a shorter one (which
        # would make a filter miss bits that are set) leaves nonzero bytes past it
        short = np.flatnonzero((lengths > 0) & (lengths < ext.bitmap_size))
        if len(short):
            past = np.arange(ext.bitmap_size) >= lengths[short].astype(np.intp)[:, None]
            bad[short] |= ((unit["bitmap"][short] != 0) & past).any(axis=1)
        if bad.any():
            for _phy, _size, tags_code, stamp, queue_offset in rec[:, bad].T.tolist():
                ext.log.overwrite(queue_offset, ext.encode(stamp, tags_code, None))
                tally.ext_units += 1
                self.repairs.ext_units += 1


def _pair(
    group: npt.NDArray[np.int64], lo: int, units: npt.NDArray[np.void]
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.void]]:
    """The records of ``group`` whose units are among ``units`` (those of queue offsets from
    ``lo``), and those units, row for row."""
    at = group[4] - lo
    if len(at) and at[-1] == len(at) - 1 and len(at) <= len(units):
        return group, units[: len(at)]  # the usual case, consecutive offsets: no copy
    have = at < len(units)
    return group[:, have], units[at[have]]
