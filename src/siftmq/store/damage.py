"""Damaged CommitLog bytes: finding the next intact record after them, and keeping a copy aside.

A record that fails its checks (magic, size, CRC, physical offset) in the middle of the log costs
that record, not the log after it: the scan looks for the next intact record in the same segment
(its magic code, at the position its own physical offset field names, with a matching CRC), or
the segment's blank marker, and carries on from there. Only when nothing intact follows in the last
segment are the bad bytes a torn tail, cut at recovery. Either way the bytes are copied to
``<store>/quarantine/`` first, so an operator can still look at them.

A false resynchronisation would need a body to contain the magic code, the exact physical offset
of its own position and a CRC-32 over the following bytes that matches: not a practical risk.
"""

from __future__ import annotations

import logging
import os
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Protocol

import numpy as np
import numpy.typing as npt

from siftmq.durable import fsync_dir
from siftmq.errors import CorruptRecordError
from siftmq.store import codec, decoding
from siftmq.store.segment import Segment, segment_name

_log = logging.getLogger(__name__)

QUARANTINE_DIR: Final = "quarantine"
_CHUNK: Final = 4 * 1024 * 1024
_MESSAGE_MAGIC: Final = struct.pack(">i", codec.MESSAGE_MAGIC_CODE)
_BLANK_MAGIC: Final = struct.pack(">i", codec.BLANK_MAGIC_CODE)
_MAGIC_AT: Final = 4  # the magic code follows the 4-byte total size


@dataclass(frozen=True, slots=True)
class DamagedRange:
    """Bytes of the CommitLog that hold no intact record: ``[offset, offset + length)``."""

    offset: int
    length: int
    reason: str
    #: the file holding them, and where in it
    segment: str
    position: int

    def describe(self) -> str:
        return (
            f"{self.length} damaged bytes at commit log offset {self.offset} "
            f"(segment {self.segment}, position {self.position}): {self.reason}"
        )


class SegmentBytes(Protocol):
    """What the search needs of a segment: an open :class:`Segment`, or a mapped file."""

    start_offset: int
    capacity: int
    length: int

    def read(self, pos: int, size: int) -> bytes: ...


def first_nonzero(seg: SegmentBytes, pos: int) -> int | None:
    """Where the first byte that is not zero lies at or after ``pos`` in ``seg``'s data; None when
    only zeros follow (the unwritten rest of a segment preallocated before a crash looks so)."""
    at = pos
    while at < seg.length:
        chunk = seg.read(at, _CHUNK)
        if not chunk:
            break
        rest = chunk.lstrip(b"\0")
        if rest:
            return at + len(chunk) - len(rest)
        at += len(chunk)
    return None


def intact_at(seg: SegmentBytes, pos: int, max_record_size: int) -> bool:
    """Whether an intact record, or the segment's blank marker, starts at ``pos`` of ``seg``."""
    head = seg.read(pos, codec.BLANK_MARKER_SIZE)
    if len(head) < codec.BLANK_MARKER_SIZE:
        return False
    total_size, magic = decoding.peek_header(head)
    if magic == codec.BLANK_MAGIC_CODE:
        return total_size == seg.capacity - pos
    if magic != codec.MESSAGE_MAGIC_CODE or not 0 < total_size <= max_record_size:
        return False
    try:
        decoding.check_record(
            seg.read(pos, total_size), 0, seg.start_offset + pos, max_record_size=max_record_size
        )
    except CorruptRecordError:
        return False
    return True


def next_intact(seg: SegmentBytes, pos: int, max_record_size: int) -> int | None:
    """The position of the first intact record or blank marker after ``pos`` in ``seg``; None if
    none follows in its data."""
    start = pos + 1
    while start < seg.length:
        # a chunk reaches a header past its end, so a magic code across the boundary is seen
        chunk = seg.read(start, _CHUNK + codec.BLANK_MARKER_SIZE)
        hits = sorted(at for magic in (_MESSAGE_MAGIC, _BLANK_MAGIC) for at in _find_all(chunk, magic))
        for at in hits:
            candidate = start + at - _MAGIC_AT
            if candidate > pos and intact_at(seg, candidate, max_record_size):
                return candidate
        start += _CHUNK
    return None


def _find_all(data: bytes, pattern: bytes) -> list[int]:
    found = []
    at = data.find(pattern)
    while at >= 0:
        found.append(at)
        at = data.find(pattern, at + 1)
    return found


def in_damaged(positions: npt.NDArray[np.int64], damaged: list[DamagedRange]) -> npt.NDArray[np.bool_]:
    """Which commit log ``positions`` fall inside one of the ``damaged`` ranges (in log order)."""
    return in_spans(positions, [(d.offset, d.length) for d in damaged])


def in_spans(positions: npt.NDArray[np.int64], spans: Sequence[tuple[int, int]]) -> npt.NDArray[np.bool_]:
    """Which commit log ``positions`` fall inside one of the ``(offset, length)`` ``spans`` (in log
    order, not overlapping)."""
    if not spans:
        return np.zeros(len(positions), dtype=np.bool_)
    starts = np.array([offset for offset, _ in spans], dtype=np.int64)
    ends = starts + np.array([length for _, length in spans], dtype=np.int64)
    at = np.searchsorted(starts, positions, side="right") - 1
    return (at >= 0) & (positions < ends[np.maximum(at, 0)])


def damaged_range(seg: Segment, pos: int, end: int, reason: str) -> DamagedRange:
    return DamagedRange(seg.start_offset + pos, end - pos, reason, segment_name(seg.start_offset), pos)


def quarantine(store_dir: Path, seg: Segment, damage: DamagedRange) -> Path | None:
    """Copy the damaged bytes to ``<store>/quarantine/`` (durably, a chunk at a time); the copy's path.

    Nothing is copied (None) when the bytes are all zeros. Runs of zeros are holes in the copy, and
    zeros at the end are not copied (the preallocated rest of a segment that a crash left past a
    torn tail), but every byte that is not zero is, however many zeros come before it: a cut
    takes nothing out of the log that is not kept here.
    """
    directory = store_dir / QUARANTINE_DIR
    path = directory / f"commitlog-{damage.offset:020d}-{damage.length}.bin"
    fd = -1
    pending = 0  # zero bytes not yet written: only written when more data follows them
    try:
        end = damage.position + min(damage.length, max(0, seg.length - damage.position))
        for at in range(damage.position, end, _CHUNK):
            data = seg.read(at, min(_CHUNK, end - at))
            if data.strip(b"\0"):
                if fd < 0:
                    directory.mkdir(parents=True, exist_ok=True)
                    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
                    pending = at - damage.position
                if pending:
                    os.lseek(fd, pending, os.SEEK_CUR)  # a hole reads back as the zeros it stands for
                    pending = 0
                _write_all(fd, data)
            else:
                pending += len(data)
        if fd < 0:
            return None
        # every skipped hole was followed by a write, so the copy already has its full length
        os.fsync(fd)
    finally:
        if fd >= 0:
            os.close(fd)
    fsync_dir(directory)
    return path


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
