"""A log of fixed-size units in segment files: the storage under ConsumeQueue and its extension.

Unit ``i`` (a logical queue offset) lives at byte ``i * unit_size`` of the log; a segment holds
``units_per_segment`` units and is named by its start byte offset (as RocketMQ names
ConsumeQueue files). The log may start past 0 after retention or a rebuild: units before
``min_index`` in the first segment are zero "holes".
"""

from __future__ import annotations

import bisect
import logging
import os
import shutil
from pathlib import Path

from siftmq.store.filepool import PooledSegment
from siftmq.store.segment import Segment, list_segment_starts, sequential_starts

_log = logging.getLogger(__name__)


def _start_of(segment: Segment) -> int:
    return segment.start_offset


class UnitLog:
    """Fixed-size units addressed by index, in segments of ``units_per_segment`` units."""

    def __init__(self, directory: Path, unit_size: int, units_per_segment: int) -> None:
        self.directory = directory
        self.unit_size = unit_size
        self.units_per_segment = units_per_segment
        self.segment_bytes = unit_size * units_per_segment
        self._segments: list[PooledSegment] = []
        self._graveyard: list[PooledSegment] = []
        self.min_index = 0

    # ------------------------------------------------------------------------------------ lifecycle

    def load(self) -> None:
        """Open existing segments; drop a torn partial unit at the end and anything after a gap."""
        starts = list_segment_starts(self.directory)
        kept = sequential_starts(starts, self.segment_bytes)
        for start in starts[len(kept) :]:
            _log.error("%s: segment %d breaks the sequence; removed", self.directory, start)
            Segment(self.directory, start, self.segment_bytes).destroy()
        for i, start in enumerate(kept):
            seg = PooledSegment.open(self.directory, start, self.segment_bytes)
            full = i < len(kept) - 1
            good = seg.length - seg.length % self.unit_size
            if full and good != self.segment_bytes:
                # a non-last segment must be full: everything from here on is unusable
                for later in kept[i + 1 :]:
                    Segment(self.directory, later, self.segment_bytes).destroy()
                good = min(good, self.segment_bytes)
                if good != seg.length:
                    seg.truncate(good)
                self._segments.append(seg)
                break
            if good != seg.length:
                seg.truncate(min(good, self.segment_bytes))
            self._segments.append(seg)
        self.min_index = self._segments[0].start_offset // self.unit_size if self._segments else 0

    def close(self) -> None:
        """Close every segment file."""
        for seg in self._segments + self._graveyard:
            seg.close()
        self._graveyard = []

    def close_deleted(self) -> None:
        """Close the descriptors of segments deleted by an earlier retention pass."""
        graveyard, self._graveyard = self._graveyard, []
        for seg in graveyard:
            seg.close()

    def destroy(self) -> None:
        """Delete all files of this log."""
        self.close()
        self._segments = []
        self.min_index = 0
        shutil.rmtree(self.directory, ignore_errors=True)

    # --------------------------------------------------------------------------------------- state

    @property
    def max_index(self) -> int:
        """The index the next unit is written at."""
        if not self._segments:
            return self.min_index
        return self._segments[-1].end_offset // self.unit_size

    @property
    def first_segment_index(self) -> int:
        """Index of the first unit slot of the first segment."""
        return self._segments[0].start_offset // self.unit_size if self._segments else self.min_index

    def segment_count(self) -> int:
        """How many segment files the log has."""
        return len(self._segments)

    def next_segment_index(self, index: int) -> int:
        """RocketMQ's ``rollNextFile`` for a logical index: the first index of the next segment."""
        return index + self.units_per_segment - index % self.units_per_segment

    # --------------------------------------------------------------------------------------- write

    def append(self, first_index: int, data: bytes) -> None:
        """Write whole units starting at ``first_index``, which must be :attr:`max_index`.

        An empty log may start at any index (the leading slots of its first segment are zeros).
        """
        if len(data) % self.unit_size:
            raise ValueError("data is not a whole number of units")
        if not self._segments:
            start = first_index * self.unit_size
            seg_start = start - start % self.segment_bytes
            self.directory.mkdir(parents=True, exist_ok=True)
            seg = self._open_new(seg_start)
            if start > seg_start:
                seg.write(bytes(start - seg_start))
            self.min_index = first_index
        elif first_index != self.max_index:
            raise ValueError(f"{self.directory}: append at {first_index}, expected {self.max_index}")
        pos = 0
        while pos < len(data):
            seg = self._segments[-1]
            room = seg.capacity - seg.length
            if room == 0:
                seg = self._open_new(seg.start_offset + self.segment_bytes)
                room = seg.capacity
            chunk = data[pos : pos + room]
            seg.write(chunk)
            pos += len(chunk)

    def overwrite(self, index: int, data: bytes) -> None:
        """Write whole units over stored ones from ``index`` (all below :attr:`max_index`)."""
        if len(data) % self.unit_size or index < 0 or index + len(data) // self.unit_size > self.max_index:
            raise ValueError(f"{self.directory}: overwrite of {len(data)} bytes at unit {index}")
        byte = index * self.unit_size
        pos = 0
        while pos < len(data):
            i = bisect.bisect_right(self._segments, byte + pos, key=_start_of) - 1
            seg = self._segments[i] if i >= 0 else None
            rel = byte + pos - seg.start_offset if seg is not None else 0
            if seg is None or rel >= seg.length:
                raise ValueError(f"{self.directory}: no segment holds unit {(byte + pos) // self.unit_size}")
            chunk = data[pos : pos + seg.length - rel]
            seg.overwrite(rel, chunk)
            pos += len(chunk)

    def _open_new(self, start: int) -> PooledSegment:
        seg = PooledSegment.open(self.directory, start, self.segment_bytes, create=True)
        if seg.length:
            seg.truncate(0)
        self._segments.append(seg)
        return seg

    def flush(self) -> None:
        """fdatasync every written segment."""
        for seg in list(self._segments):
            seg.flush()

    def truncate(self, index: int) -> None:
        """Drop the units from ``index`` on (an index at or below :attr:`min_index` empties the log)."""
        if index <= self.min_index:
            self.destroy()
            self.min_index = max(index, 0)
            return
        byte = index * self.unit_size
        while self._segments and self._segments[-1].start_offset >= byte:
            seg = self._segments[-1]
            self._segments = self._segments[:-1]
            seg.destroy()
        if self._segments:
            seg = self._segments[-1]
            rel = byte - seg.start_offset
            if rel < seg.length:
                seg.truncate(rel)

    # ---------------------------------------------------------------------------------------- read

    def read(self, index: int, max_units: int, *, within_segment: bool = True) -> bytes | None:
        """Bytes of up to ``max_units`` units from ``index``.

        With ``within_segment`` the read stops at the end of the segment holding ``index``
        (RocketMQ's ``getIndexBuffer``). Returns None if no segment holds ``index``.
        """
        byte = index * self.unit_size
        segments = self._segments
        i = bisect.bisect_right(segments, byte, key=_start_of) - 1
        if i < 0:
            return None
        seg = segments[i]
        rel = byte - seg.start_offset
        if rel >= seg.capacity or rel >= seg.length:
            return None
        want = max_units * self.unit_size
        try:
            data = seg.read(rel, want)
            while not within_segment and len(data) < want and i + 1 < len(segments):
                i += 1
                seg = segments[i]
                data += seg.read(0, want - len(data))
        except OSError:
            if seg.gone:  # deleted by retention meanwhile
                return None
            raise
        return data[: len(data) - len(data) % self.unit_size]

    # ----------------------------------------------------------------------------------- retention

    def delete_first_segment(self) -> None:
        """Delete the oldest segment (never the last one)."""
        if len(self._segments) <= 1:
            return
        seg = self._segments[0]
        self._segments = self._segments[1:]
        seg.destroy(defer_close=True)
        self._graveyard.append(seg)
        self.min_index = max(self.min_index, self.first_segment_index)

    def last_unit_of_first_segment(self) -> bytes | None:
        """The last unit of the oldest segment, if the oldest segment is full."""
        if len(self._segments) <= 1:
            return None
        seg = self._segments[0]
        return seg.read(seg.capacity - self.unit_size, self.unit_size)


def remove_empty_dirs(root: Path) -> None:
    """Remove empty topic/queue directories under ``root`` (best effort)."""
    if not root.is_dir():
        return
    for dirpath, _dirs, _files in os.walk(root, topdown=False):
        if Path(dirpath) != root:
            try:
                os.rmdir(dirpath)
            except OSError:
                pass
