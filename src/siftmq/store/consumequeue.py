"""ConsumeQueue: the per topic/queue index of 20-byte entries into the CommitLog.

Files live under ``<data_dir>/consumequeue/<topic>/<queue_id>/``; an entry is::

    commit_log_offset  int64   where the record starts in the CommitLog
    size               int32   the record's size
    tags_code          int64   Java String.hashCode of the tag widened to long; 0 when untagged

The logical (queue) offset of an entry is its index. Entries are viewed as a numpy structured
array with big-endian fields, so filters can scan them at memory speed.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Final

import numpy as np
import numpy.typing as npt

from siftmq.store.consumequeue_ext import ConsumeQueueExt
from siftmq.store.unitlog import UnitLog

CQ_STORE_UNIT_SIZE: Final = 20
CQ_DTYPE: Final = np.dtype([("commit_log_offset", ">i8"), ("size", ">i4"), ("tags_code", ">i8")])
_ENTRY = struct.Struct(">qiq")

CqEntry = tuple[int, int, int]
"""(commit_log_offset, size, tags_code)"""


_NUMPY_FROM: Final = 32  # below this many entries struct packing beats building an array


def encode_entries(entries: Sequence[CqEntry]) -> bytes:
    """The bytes of consecutive entries."""
    return b"".join(_ENTRY.pack(*e) for e in entries)


def encode_entry_columns(offsets: Sequence[int], sizes: Sequence[int], tags_codes: Sequence[int]) -> bytes:
    """The bytes of consecutive entries given as columns."""
    n = len(offsets)
    if n < _NUMPY_FROM:
        return b"".join(map(_ENTRY.pack, offsets, sizes, tags_codes))
    arr = np.empty(n, dtype=CQ_DTYPE)
    arr["commit_log_offset"] = offsets
    arr["size"] = sizes
    arr["tags_code"] = tags_codes
    return arr.tobytes()


def written_slots(entries: npt.NDArray[np.void]) -> npt.NDArray[np.bool_]:
    """Which slots hold an entry: an unwritten one (a file's leading holes, a zero tail) is all zeros."""
    return (entries["commit_log_offset"] != 0) | (entries["size"] != 0)  # type: ignore[no-any-return]


def filler_entries(entries: npt.NDArray[np.void]) -> npt.NDArray[np.bool_]:
    """Which entries are fillers: size 0 at a real position, standing for a record lost before and
    keeping its queue offset taken (an unwritten slot is all zeros)."""
    return (entries["size"] == 0) & (entries["commit_log_offset"] != 0)  # type: ignore[no-any-return]


class ConsumeQueue:
    """The index of one message queue, with its optional extension."""

    def __init__(
        self, topic: str, queue_id: int, directory: Path, entries_per_file: int, ext: ConsumeQueueExt | None
    ) -> None:
        self.topic = topic
        self.queue_id = queue_id
        self.log = UnitLog(directory, CQ_STORE_UNIT_SIZE, entries_per_file)
        self.ext = ext

    def load(self) -> None:
        """Open the files; drop a torn partial entry; trim the extension to the index length."""
        self.log.load()
        if self.log.segment_count():
            self.log.min_index = self._first_used_index(self.log.first_segment_index)
        if self.ext is not None:
            self.ext.log.load()
            if self.ext.log.max_index > self.max_offset:
                self.ext.log.truncate(self.max_offset)

    def close(self) -> None:
        """Close the files."""
        self.log.close()
        if self.ext is not None:
            self.ext.log.close()

    def destroy(self) -> None:
        """Delete the files (used by a full rebuild)."""
        self.log.destroy()
        if self.ext is not None:
            self.ext.log.destroy()

    @property
    def min_offset(self) -> int:
        """The first queue offset still indexed."""
        return self.log.min_index

    @property
    def max_offset(self) -> int:
        """The queue offset the next entry gets (RocketMQ's getMaxOffsetInQueue)."""
        return self.log.max_index

    # --------------------------------------------------------------------------------------- write

    def put_entries(
        self, first_offset: int, entries: Sequence[CqEntry], ext_units: Sequence[bytes] | None
    ) -> None:
        """Append entries (and their extension units, written first) at ``first_offset``."""
        if self.ext is not None and ext_units is not None:
            self.ext.put_units(first_offset, ext_units)
        self.log.append(first_offset, encode_entries(entries))

    def put_encoded(self, first_offset: int, entries: bytes, ext_units: bytes | None) -> None:
        """Append encoded entries (and encoded extension units, written first) at ``first_offset``."""
        if self.ext is not None and ext_units is not None:
            self.ext.put_encoded(first_offset, ext_units)
        self.log.append(first_offset, entries)

    def fill_to(self, queue_offset: int, commit_log_offset: int) -> None:
        """Take the queue offsets up to ``queue_offset`` with filler entries (size 0) pointing at
        ``commit_log_offset``: a queue rebuilt from the CommitLog keeps the offsets its removed or
        lost records held, so no offset a consumer has passed is given to a new message. An empty
        queue gets one filler, just below ``queue_offset`` (the slots before it stay holes)."""
        first = max(self.max_offset, queue_offset - 1) if not self.log.segment_count() else self.max_offset
        if first >= queue_offset:
            return
        count = queue_offset - first
        units = [self.ext.encode(0, 0, None)] * count if self.ext is not None else None
        self.put_entries(first, [(commit_log_offset, 0, 0)] * count, units)

    def truncate(self, queue_offset: int) -> None:
        """Drop the entries from ``queue_offset`` on (and their extension units)."""
        self.log.truncate(queue_offset)
        if self.ext is not None and self.ext.log.max_index > queue_offset:
            self.ext.log.truncate(queue_offset)

    def flush(self) -> None:
        """fdatasync the files."""
        if self.ext is not None:
            self.ext.log.flush()
        self.log.flush()

    # ---------------------------------------------------------------------------------------- read

    def read_block(self, queue_offset: int, max_entries: int) -> npt.NDArray[np.void] | None:
        """Entries from ``queue_offset`` to the end of its segment (at most ``max_entries``).

        A read-only structured array of :data:`CQ_DTYPE`; None if no segment holds the offset.
        """
        data = self.log.read(queue_offset, max_entries)
        if data is None:
            return None
        return np.frombuffer(data, dtype=CQ_DTYPE)

    def get_entry(self, queue_offset: int) -> CqEntry | None:
        """One entry, or None if not stored."""
        if not self.min_offset <= queue_offset < self.max_offset:
            return None
        data = self.log.read(queue_offset, 1)
        if not data:
            return None
        offset, size, tags_code = _ENTRY.unpack(data)
        return int(offset), int(size), int(tags_code)

    def roll_next_file(self, queue_offset: int) -> int:
        """The first queue offset of the segment after the one holding ``queue_offset``."""
        return self.log.next_segment_index(queue_offset)

    # ----------------------------------------------------------------------------------- retention

    def _first_used_index(self, start: int) -> int:
        """First entry at or after ``start`` in the first segment that is not a zero hole."""
        data = self.log.read(start, self.log.units_per_segment)
        if not data:
            return start
        arr = np.frombuffer(data, dtype=CQ_DTYPE)
        used = np.flatnonzero(arr["size"] > 0)
        return start + int(used[0]) if len(used) else start + len(arr)

    def correct_min_offset(self, commit_log_min_offset: int) -> None:
        """Advance :attr:`min_offset` past entries pointing below the CommitLog's first offset."""
        if not self.log.segment_count():
            return
        start = self.min_offset
        data = self.log.read(start, self.log.units_per_segment)
        if not data:
            return
        arr = np.frombuffer(data, dtype=CQ_DTYPE)
        alive = np.flatnonzero((arr["commit_log_offset"] >= commit_log_min_offset) & (arr["size"] > 0))
        self.log.min_index = start + (int(alive[0]) if len(alive) else len(arr))

    def delete_expired(self, commit_log_min_offset: int) -> int:
        """Delete whole segments whose entries all point below ``commit_log_min_offset``.

        Returns how many segments were deleted; :attr:`min_offset` is corrected afterwards.
        """
        deleted = 0
        while True:
            last = self.log.last_unit_of_first_segment()
            if last is None:
                break
            offset, size, _tags = _ENTRY.unpack(last)
            if offset + size > commit_log_min_offset:
                break
            self.log.delete_first_segment()
            ext = self.ext
            # segment i of both covers the same offsets, but the extension's may begin later (its
            # units were lost, or left out by reindex): only those below the queue's first go
            while ext is not None and ext.log.first_segment_index < self.log.first_segment_index:
                if ext.log.segment_count() <= 1:
                    break  # its last segment stays, as the queue's does
                ext.log.delete_first_segment()
            deleted += 1
        self.correct_min_offset(commit_log_min_offset)
        return deleted

    def written_max_offset(self) -> int:
        """:attr:`max_offset` without a tail of unwritten (all-zero) slots."""
        end = self.max_offset
        while end > self.min_offset:
            first = max(self.min_offset, end - 1024)
            data = self.log.read(first, end - first, within_segment=False)
            if not data:
                return end
            arr = np.frombuffer(data, dtype=CQ_DTYPE)
            written = np.flatnonzero(written_slots(arr))
            if len(written):
                return first + int(written[-1]) + 1
            end = first
        return end

    def truncate_dirty(
        self, commit_log_max_offset: int, *, before_cut: Callable[[], None] | None = None
    ) -> None:
        """Drop tail entries that point at or beyond ``commit_log_max_offset`` (not in the log);
        ``before_cut`` runs before any is dropped."""
        while self.max_offset > self.min_offset:
            first = max(self.min_offset, self.max_offset - 1024)
            data = self.log.read(first, self.max_offset - first, within_segment=False)
            if not data:
                break
            arr = np.frombuffer(data, dtype=CQ_DTYPE)
            phy = arr["commit_log_offset"].astype(np.int64)
            sizes = arr["size"].astype(np.int64)
            # a filler (size 0, the next record's position) stands for a record lost to damage and
            # keeps its queue offset taken; only an unwritten slot (all zeros) or a negative size is dirty
            bad = (phy + sizes > commit_log_max_offset) | (sizes < 0) | ~written_slots(arr)
            if not bad.any():
                break
            first_bad = int(np.flatnonzero(bad)[0])
            if before_cut is not None:
                before_cut()
            self.truncate(first + first_bad)
            if first_bad > 0:
                break
