"""The CommitLog: one append-only log of every topic's records, in fixed-size segments.

Records never span segments: when a record does not fit in what is left of the current segment
(keeping room for the 8-byte blank marker), a blank marker is written and the log rolls to the
next segment, whose start offset is the previous start plus the segment size (RocketMQ's rule).

The CommitLog also owns the per-queue next queue offsets (RocketMQ's ``topicQueueTable``), so
queue offsets and commit log offsets are assigned together under the append lock.

Thread safety: :meth:`append` is serialised by the caller's append lock; reads use ``os.pread``
and may run concurrently with appends; :meth:`flush` is serialised by its own lock.
"""

from __future__ import annotations

import bisect
import functools
import logging
import os
import struct
import threading
import zlib
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Final, NamedTuple

from siftmq.durable import fsync_dir
from siftmq.errors import CorruptRecordError, MessageTooLargeError, StoreError
from siftmq.store import codec, decoding
from siftmq.store.codec import EncodedBatch, EncodedParts, StoredMessage
from siftmq.store.damage import (
    QUARANTINE_DIR,
    DamagedRange,
    damaged_range,
    first_nonzero,
    intact_at,
    next_intact,
)
from siftmq.store.segment import Segment, list_segment_starts, missing_starts, segment_name

_log = logging.getLogger(__name__)

_SCAN_CHUNK = 4 * 1024 * 1024
_UNWRITTEN_CHECK = 64 * 1024  # zeros after a zero header that make it look unwritten
#: why the bytes of a missing segment file are passed over (reads, recovery, the check)
MISSING_SEGMENT: Final = "the segment file is missing"
# codec.finish_record, inlined by the one-record append
_pack_positions = struct.Struct(">qq").pack_into  # queue_offset, physical_offset at 24
_pack_timestamp = struct.Struct(">q").pack_into  # store_timestamp at 60
_pack_crc = struct.Struct(">I").pack_into  # record_crc at 8, of bytes [12, total_size)
_STAMP_AT: Final = 60  # store_timestamp
_STAMP_END: Final = _STAMP_AT + 8
_crc32 = zlib.crc32


class AppendedRecord(NamedTuple):
    """Where one appended record landed."""

    topic: str
    queue_id: int
    queue_offset: int
    commit_log_offset: int
    size: int
    store_timestamp: int


# ``AppendedRecord((topic, queue_id, ...))`` minus the generated ``__new__``'s argument handling
_new_appended_record: Final = functools.partial(tuple.__new__, AppendedRecord)


def _start_of(segment: Segment) -> int:
    return segment.start_offset


def open_segments(
    directory: Path, segment_size: int, max_record_size: int, *, writable: bool = True
) -> tuple[list[Segment], list[int]]:
    """The CommitLog's segment files in ``directory``, opened, oldest first, and the starts of the
    files there that are not its segments (misplaced).

    A file is misplaced when its start is not a multiple of ``segment_size`` (no offset of the log
    addresses it), or when it comes after a gap (a missing file) and holds no intact record: a
    record carries its own CommitLog offset, so one that checks out shows the file is where it
    belongs. The segments after a missing one are kept: they hold acknowledged records at their
    own offsets, and taking them out would have new records written at those offsets.
    """
    segments: list[Segment] = []
    misplaced: list[int] = []
    try:
        for start in list_segment_starts(directory):
            if start % segment_size:
                misplaced.append(start)
                continue
            seg = Segment.open(directory, start, segment_size, writable=writable)
            after_gap = bool(segments) and start != segments[-1].start_offset + segment_size
            if after_gap and not _holds_a_record(seg, max_record_size):
                seg.close()
                misplaced.append(start)
                continue
            segments.append(seg)
    except BaseException:
        for seg in segments:
            seg.close()
        raise
    return segments, misplaced


def _holds_a_record(seg: Segment, max_record_size: int) -> bool:
    return intact_at(seg, 0, max_record_size) or next_intact(seg, 0, max_record_size) is not None


class CommitLog:
    """The segment list of ``<data_dir>/commitlog`` with append, read, scan and truncate."""

    def __init__(self, directory: Path, segment_size: int, max_record_size: int) -> None:
        if max_record_size + codec.BLANK_MARKER_SIZE > segment_size:
            raise ValueError("segment size must hold the largest record plus the blank marker")
        self.directory = directory
        self.segment_size = segment_size
        self.max_record_size = max_record_size
        self._segments: list[Segment] = []
        self._graveyard: list[Segment] = []
        self._flush_lock = threading.Lock()
        self.flushed_offset = 0
        self.queue_offsets: dict[tuple[str, int], int] = {}

    # ------------------------------------------------------------------------------------- opening

    def load(self) -> None:
        """Open the existing segment files; misplaced ones (see :func:`open_segments`) are moved
        aside. A file missing in the middle leaves a gap that scans and reads pass over as damage
        (see :meth:`is_missing`); new records go after the last segment, so the missing file can
        still be put back."""
        self.directory.mkdir(parents=True, exist_ok=True)
        segments, misplaced = open_segments(self.directory, self.segment_size, self.max_record_size)
        for start in misplaced:
            self._quarantine_segment(start)
        kept = [seg.start_offset for seg in segments]
        missing = missing_starts(kept, self.segment_size)
        if missing:
            _log.error(
                "commit log segment file(s) %s missing in %s (the segments after them, up to %s, are "
                "kept and served): the records they held are lost, and reads pass over them; to have "
                "them readable again, stop the broker and put the file(s) back",
                ", ".join(segment_name(start) for start in missing),
                self.directory,
                segment_name(kept[-1]),
            )
        for seg in segments:
            if seg.length > self.segment_size:
                seg.truncate(self.segment_size)
            self._segments.append(seg)
        self.flushed_offset = self.max_offset

    def adopt(self, segments: list[Segment]) -> None:
        """Use these already opened segments as they are (a read-only check: :meth:`load` would
        move misplaced files and cut overlong ones)."""
        self._segments = list(segments)
        self.flushed_offset = self.max_offset

    def _quarantine_segment(self, start: int) -> None:
        """Move a segment the log cannot use aside, into ``quarantine/`` (never delete it)."""
        directory = self.directory.parent / QUARANTINE_DIR
        directory.mkdir(parents=True, exist_ok=True)
        target = directory / f"commitlog-segment-{segment_name(start)}"
        os.replace(self.directory / segment_name(start), target)
        fsync_dir(directory)
        fsync_dir(self.directory)
        _log.error(
            "commit log segment file %s is not a segment of the log (its name is not a multiple of the "
            "segment size, or it follows a missing segment file and holds no intact record); moved to %s",
            segment_name(start),
            target,
        )

    def close(self) -> None:
        """Close every segment file (no flush)."""
        for seg in self._segments + self._graveyard:
            seg.close()

    # ------------------------------------------------------------------------------------ offsets

    @property
    def min_offset(self) -> int:
        """The first commit log offset still stored."""
        return self._segments[0].start_offset if self._segments else 0

    @property
    def max_offset(self) -> int:
        """The offset the next record will be written at (end of valid data)."""
        return self._segments[-1].end_offset if self._segments else 0

    def roll_next_file(self, offset: int) -> int:
        """The start offset of the segment after the one holding ``offset``."""
        return offset + self.segment_size - offset % self.segment_size

    def segments(self) -> list[Segment]:
        """A snapshot of the segment list, oldest first."""
        return list(self._segments)

    def is_missing(self, offset: int) -> bool:
        """Whether ``offset`` lies in a segment whose file is missing (between stored ones)."""
        seg = self._segment_for(offset)
        return seg is not None and seg is not self._segments[-1] and offset - seg.start_offset >= seg.capacity

    # ------------------------------------------------------------------------------------- append

    def append(self, batch: Sequence[EncodedParts], store_timestamp: int) -> list[AppendedRecord]:
        """Write ``batch`` (caller holds the append lock), rolling segments as needed.

        The prepared records are completed in place and written with one ``pwrite`` per
        segment touched. Raises :class:`StoreError` if the write fails; then nothing of the batch
        is visible and no queue offset was consumed.
        """
        if len(batch) == 1:
            return [self._append_one(batch[0], store_timestamp)]
        results: list[AppendedRecord] = []
        assigned: dict[tuple[str, int], int] = {}  # queue offsets, published after the write
        queue_offsets = self.queue_offsets
        chunks: list[bytes | bytearray] = []
        seg = self._segments[-1] if self._segments else self._new_segment(0)
        physical = seg.start_offset + seg.length
        limit = seg.start_offset + seg.capacity - codec.BLANK_MARKER_SIZE
        max_record_size = self.max_record_size
        finish = codec.finish_record
        total = 0
        for parts in batch:
            if parts.size > max_record_size:
                raise MessageTooLargeError(
                    f"record of {parts.size} bytes exceeds the limit {max_record_size}"
                )
            total += parts.size
        try:
            if physical + total > limit and total <= limit - seg.start_offset:
                # A batch that does not fit goes whole into the next segment (as RocketMQ's batch
                # append does): records of it written here before a failed write there would stand
                # in the log with queue offsets the next appends reuse, and its retry, deduplicated
                # by the key index rebuilt from the log, would be answered with another message
                seg = self._roll(seg, codec.encode_blank(seg.start_offset + seg.capacity - physical))
                physical = seg.start_offset
                limit = physical + seg.capacity - codec.BLANK_MARKER_SIZE
            for parts in batch:
                size = parts.size
                if physical + size > limit:  # only a batch larger than a segment
                    chunks.append(codec.encode_blank(seg.start_offset + seg.capacity - physical))
                    seg = self._roll(seg, b"".join(chunks))
                    chunks = []
                    physical = seg.start_offset
                    limit = physical + seg.capacity - codec.BLANK_MARKER_SIZE
                key = (parts.topic, parts.queue_id)
                queue_offset = assigned.get(key)
                if queue_offset is None:
                    queue_offset = queue_offsets.get(key, 0)
                assigned[key] = queue_offset + 1
                record = parts.record
                finish(record, queue_offset, physical, store_timestamp)
                chunks.append(record)
                results.append(
                    _new_appended_record((key[0], key[1], queue_offset, physical, size, store_timestamp))
                )
                physical += size
            seg.write(chunks[0] if len(chunks) == 1 else b"".join(chunks))
        except OSError as exc:
            raise StoreError(f"commit log write failed: {exc}") from exc
        queue_offsets.update(assigned)
        return results

    def _append_one(self, parts: EncodedParts, store_timestamp: int) -> AppendedRecord:
        """:meth:`append` of one record."""
        size = parts.size
        if size > self.max_record_size:
            raise MessageTooLargeError(f"record of {size} bytes exceeds the limit {self.max_record_size}")
        segments = self._segments
        seg = segments[-1] if segments else self._new_segment(0)
        physical = seg.start_offset + seg.length
        key = (parts.topic, parts.queue_id)
        queue_offset = self.queue_offsets.get(key, 0)
        record = parts.record
        try:
            if physical + size > seg.start_offset + seg.capacity - codec.BLANK_MARKER_SIZE:
                seg = self._roll(seg, codec.encode_blank(seg.start_offset + seg.capacity - physical))
                physical = seg.start_offset
            _pack_positions(record, 24, queue_offset, physical)
            _pack_timestamp(record, 60, store_timestamp)
            _pack_crc(record, 8, _crc32(memoryview(record)[12:]))
            seg.write(record)
        except OSError as exc:
            raise StoreError(f"commit log write failed: {exc}") from exc
        self.queue_offsets[key] = queue_offset + 1
        return _new_appended_record((key[0], key[1], queue_offset, physical, size, store_timestamp))

    def append_batch(self, batch: EncodedBatch, store_timestamp: int) -> list[AppendedRecord] | None:
        """Write a prepared one-queue batch with one ``pwrite`` (caller holds the append lock).

        Returns None, writing nothing, when the batch does not fit in the current segment: the
        caller appends it record by record then (see :meth:`append`), which rolls segments.
        """
        sizes = batch.sizes
        largest = max(sizes)
        if largest > self.max_record_size:
            raise MessageTooLargeError(f"record of {largest} bytes exceeds the limit {self.max_record_size}")
        segments = self._segments
        seg = segments[-1] if segments else self._new_segment(0)
        physical = seg.start_offset + seg.length
        if physical + len(batch.buffer) > seg.start_offset + seg.capacity - codec.BLANK_MARKER_SIZE:
            return None
        topic, queue_id = key = (batch.topic, batch.queue_id)
        queue_offset = self.queue_offsets.get(key, 0)
        codec.finish_batch(batch, queue_offset, physical, store_timestamp)
        try:
            seg.write(batch.buffer)
        except OSError as exc:
            raise StoreError(f"commit log write failed: {exc}") from exc
        self.queue_offsets[key] = queue_offset + len(sizes)
        results = []
        for size in sizes:
            results.append(
                _new_appended_record((topic, queue_id, queue_offset, physical, size, store_timestamp))
            )
            queue_offset += 1
            physical += size
        return results

    def _roll(self, seg: Segment, tail: bytes | bytearray) -> Segment:
        """End ``seg`` with ``tail`` (the blank marker; before it, for an append larger than a
        segment only, the records of it that fit) and go on in the next segment. When the next
        cannot be made (no file descriptor left, say), the tail is taken back: records left in the
        full segment would be recovered after a restart with queue offsets the next appends reuse,
        and the client's retry would store them again.
        (The tail goes first: a reader of the files that finds the next segment finds this one
        ended. An append larger than a segment, which no request can carry, may keep a first part.)"""
        before = seg.length
        seg.write(tail)
        try:
            return self._new_segment(seg.start_offset + self.segment_size)
        except BaseException:
            seg.unwrite(before)
            raise

    def _new_segment(self, start: int) -> Segment:
        """Create the next segment, preallocated and mapped for writing; the previous one, full
        now, is cut back to its data (see :mod:`siftmq.store.segment`)."""
        if self._segments:
            self._segments[-1].trim()
        seg = self._open_segment(start)
        self._segments.append(seg)
        return seg

    def _open_segment(self, start: int) -> Segment:
        seg = Segment.open(self.directory, start, self.segment_size, create=True)
        try:
            if seg.length:
                seg.truncate(0)
            seg.map_for_writing()
        except BaseException:
            seg.close()
            raise
        return seg

    def map_for_append(self) -> None:
        """Map the last segment for writing (after recovery, before the first append)."""
        if self._segments:
            self._segments[-1].map_for_writing()

    def trim(self) -> None:
        """Cut the preallocated tail of the segment being written (a clean close; flush after)."""
        if self._segments:
            self._segments[-1].trim()

    # -------------------------------------------------------------------------------------- flush

    def flush(self) -> int:
        """fdatasync every segment written since the last flush; returns the durable offset."""
        with self._flush_lock:
            target = self.max_offset
            for seg in list(self._segments):
                if seg.dirty:
                    try:
                        seg.flush()
                    except OSError as exc:
                        raise StoreError(f"commit log flush failed: {exc}") from exc
            self.flushed_offset = max(self.flushed_offset, target)
            return self.flushed_offset

    # --------------------------------------------------------------------------------------- read

    def _segment_for(self, offset: int) -> Segment | None:
        segments = self._segments  # replaced, never mutated in place, except appends at the end
        i = bisect.bisect_right(segments, offset, key=_start_of) - 1
        if i < 0:
            return None
        return segments[i]

    def segment_holding(self, offset: int) -> Segment | None:
        """The segment whose range holds ``offset``; None when that is not stored (removed or beyond)."""
        seg = self._segment_for(offset)
        if seg is None or offset < self.min_offset or offset - seg.start_offset >= seg.capacity:
            return None
        return seg

    def _locate(self, offset: int) -> tuple[Segment, int] | None:
        """The segment holding ``offset`` and the position in it; None when it is not stored."""
        seg = self._segment_for(offset)
        if seg is None or offset < self.min_offset:
            return None
        pos = offset - seg.start_offset
        return None if pos >= seg.length else (seg, pos)

    def read_range(self, offset: int, length: int) -> bytes | None:
        """Up to ``length`` bytes from ``offset``, within the segment holding it (shorter at the
        end of its data); None when the offset is not stored (removed or beyond the end)."""
        found = self._locate(offset)
        if found is None:
            return None
        seg, pos = found
        try:
            return seg.read(pos, length)
        except OSError as exc:
            if seg.fd < 0:  # deleted by retention while we read
                return None
            raise StoreError(f"commit log read failed at {offset}: {exc}") from exc

    def read_message(self, offset: int, size: int | None = None) -> StoredMessage | None:
        """The verified record at ``offset``; None when the offset is not stored (removed or beyond).

        ``size`` (from a ConsumeQueue entry) saves one read; it must equal the record's size.
        Raises :class:`CorruptRecordError` if the bytes there are not an intact record.
        """
        found = self._locate(offset)
        if found is None:
            return None
        seg, pos = found
        try:
            if size is None:
                head = seg.read(pos, 8)
                if len(head) < 8:
                    raise CorruptRecordError("truncated record header", offset=offset)
                size, _magic = decoding.peek_header(head)
            if size <= 0 or size > self.max_record_size:
                raise CorruptRecordError(f"implausible record size {size}", offset=offset)
            data = seg.read(pos, size)
        except OSError as exc:
            if seg.fd < 0:  # deleted by retention while we read
                return None
            raise StoreError(f"commit log read failed at {offset}: {exc}") from exc
        msg = decoding.decode_record(data, 0, offset, max_record_size=self.max_record_size)
        if msg.store_size != size:
            raise CorruptRecordError(
                f"record size {msg.store_size} differs from index size {size}", offset=offset
            )
        return msg

    # --------------------------------------------------------------------------------------- scan

    def scan(self, from_offset: int, *, torn_writes_from: int | None = None) -> Iterator[StoredMessage]:
        """Verified records from ``from_offset`` (a record boundary) to the end.

        Bytes that fail their checks but are followed by an intact record (or blank marker) in
        their segment, or that end a segment before the last, are passed over and listed in
        :attr:`damaged`, and so is the range of a segment file missing between two others. The
        scan stops where nothing intact follows in the last segment (a torn tail): after the
        iteration :attr:`scan_end` is the offset right after the last good record (or blank marker)
        and :attr:`scan_error` says why it stopped (None: at the end of the data).

        ``torn_writes_from`` is given after a crash (None: after a clean stop, or when the log was
        already recovered). It is the CommitLog offset known flushed: bad bytes at or past it in
        the last segment that are followed only by the rest of one write are a torn tail too (see
        :meth:`_cut_short_write`): the write the crash interrupted. Only after a crash can the last
        segment end in zeros that were never written (the rest of the preallocated file), and only
        where nothing but zeros follows: a clean stop cuts the file back to its data, so zeros in it
        there are damage like any other bytes that fail their checks.
        """
        self.scan_end = from_offset
        self.scan_error: CorruptRecordError | None = None
        self.damaged: list[DamagedRange] = []
        segments = list(self._segments)
        for i, seg in enumerate(segments):
            if seg.start_offset + seg.length <= from_offset and seg is not segments[-1]:
                continue
            if i:
                gap = [segments[i - 1].start_offset, seg.start_offset]
                for start in missing_starts(gap, self.segment_size):
                    if start + self.segment_size > from_offset:
                        self.damaged.append(
                            DamagedRange(start, self.segment_size, MISSING_SEGMENT, segment_name(start), 0)
                        )
            last = seg is segments[-1]
            pos = max(0, from_offset - seg.start_offset)
            buf = b""
            buf_start = pos
            while pos < seg.length:
                problem: CorruptRecordError | None = None
                if pos + 8 > buf_start + len(buf):
                    buf = seg.read(pos, _SCAN_CHUNK)
                    buf_start = pos
                rel = pos - buf_start
                offset = seg.start_offset + pos
                if len(buf) - rel < 8:
                    problem = CorruptRecordError("torn record header", offset=offset)
                else:
                    total_size, magic = decoding.peek_header(buf, rel)
                    if magic == codec.BLANK_MAGIC_CODE and total_size == seg.capacity - pos:
                        self.scan_end = seg.start_offset + seg.capacity
                        break
                    if total_size == 0 and magic == 0 and self._unwritten(seg, pos):
                        if last and torn_writes_from is not None and self._zeros_to_end(seg, pos):
                            return  # the preallocated tail of the segment written at the crash
                        if not last:
                            reason = "segment ends without a blank marker"
                        elif torn_writes_from is None:
                            reason = "zeros where a record should start (a cleanly stopped file is all data)"
                        else:
                            reason = "zeros where a record should start, with data after them"
                        problem = CorruptRecordError(reason, offset=offset)
                    else:
                        if 0 < total_size <= self.max_record_size and rel + total_size > len(buf):
                            buf = seg.read(pos, max(_SCAN_CHUNK, total_size))
                            buf_start = pos
                            rel = 0
                        try:
                            msg = decoding.decode_record(
                                buf, rel, offset, max_record_size=self.max_record_size
                            )
                        except CorruptRecordError as exc:
                            problem = exc
                if problem is None:
                    pos += msg.store_size
                    self.scan_end = seg.start_offset + pos
                    yield msg
                    continue
                resume = next_intact(seg, pos, self.max_record_size)
                if resume is None and last:
                    self.scan_error = problem
                    return
                if (
                    last
                    and torn_writes_from is not None
                    and offset >= torn_writes_from
                    and resume is not None
                    and self._cut_short_write(seg, pos, resume)
                ):
                    self.scan_error = CorruptRecordError(
                        "a write cut short: its first record has no magic code, the rest of it follows",
                        offset=offset,
                    )
                    return
                end = seg.length if resume is None else resume
                self.damaged.append(damaged_range(seg, pos, end, str(problem)))
                if resume is None:
                    break
                pos = resume
                buf = b""
            else:
                if not last:  # the file is shorter than its data was: the rest is missing
                    reason = "segment ends without a blank marker (file cut short)"
                    self.damaged.append(damaged_range(seg, pos, seg.capacity, reason))

    def _cut_short_write(self, seg: Segment, pos: int, resume: int) -> bool:
        """Whether the bad record at ``pos`` and everything after it in ``seg`` (intact records from
        ``resume``) can be one write that a crash interrupted.

        A write puts a record's first 8 bytes (size and magic code) last, after every other byte of
        the write (see :meth:`Segment.write`), so when a multi-record write is cut short, the later
        records of it can be complete while the first has no magic code: that looks like damage
        followed by intact records, but those records were never acknowledged, and keeping them
        would leave the queue offset of the first one without a record. Such a tail is: a record
        without its magic code, at most one record long, then intact records that all carry the
        store timestamp of that one write (every record of an append gets the same one, which the
        first record holds too, as far as it was written: a copy the kill interrupted leaves any of
        its bytes unwritten, zero, not only the first 8; seen after a kill -9), then at most a record
        the write did not finish, and nothing after it but the unwritten rest of the segment or its
        blank marker. Damage in the middle of the log is followed by other writes, and is kept.
        """
        head = seg.read(pos, _STAMP_END)
        if (
            len(head) < codec.BLANK_MARKER_SIZE
            or head[4:8] != bytes(4)
            or resume - pos > self.max_record_size
        ):
            return False
        first = head[_STAMP_AT:_STAMP_END]  # the first record's stamp, maybe partly written
        stamps = set()
        at = resume
        while at < seg.length:
            head = seg.read(at, codec.BLANK_MARKER_SIZE)
            if len(head) < codec.BLANK_MARKER_SIZE:
                break  # the file ends inside a header the write did not finish
            total_size, magic = decoding.peek_header(head)
            if magic == codec.BLANK_MAGIC_CODE and total_size == seg.capacity - at:
                break
            if total_size == 0 and magic == 0 and self._zeros_to_end(seg, at):
                break
            data = seg.read(at, total_size) if 0 < total_size <= self.max_record_size else b""
            try:
                decoding.check_record(data, 0, seg.start_offset + at, max_record_size=self.max_record_size)
            except CorruptRecordError:
                # the last record of the write, unfinished: nothing intact may follow it
                if next_intact(seg, at, self.max_record_size) is not None:
                    return False
                break
            stamps.add(data[_STAMP_AT:_STAMP_END])
            if len(stamps) > 1:
                return False
            at += total_size
        if not stamps:  # only a blank marker followed: the first record's own stamp must be there
            return len(first) == _STAMP_END - _STAMP_AT and any(first)
        (stamp,) = stamps
        return all(b in (0, s) for b, s in zip(first, stamp, strict=False))

    @staticmethod
    def _unwritten(seg: Segment, pos: int) -> bool:
        """Whether the bytes from ``pos`` look never written: the next 64 KiB (or the rest of the
        data) are zeros. A zeroed header with data right after it is damage, not the end of the data."""
        return not seg.read(pos, _UNWRITTEN_CHECK).strip(b"\0")

    @staticmethod
    def _zeros_to_end(seg: Segment, pos: int) -> bool:
        """Whether every byte from ``pos`` to the end of ``seg``'s file is zero: only then can they
        be the unwritten rest of a preallocated segment (a record whose body is zeros, after a
        zeroed sector, looks unwritten for as long as its body lasts)."""
        return first_nonzero(seg, pos) is None

    def truncate(self, offset: int) -> None:
        """Drop everything from ``offset`` on (deleting later segments) and make it durable."""
        while self._segments and self._segments[-1].start_offset > offset:
            seg = self._segments[-1]
            self._segments = self._segments[:-1]
            seg.destroy()
        if self._segments:
            seg = self._segments[-1]
            if offset - seg.start_offset < seg.length:
                seg.truncate(offset - seg.start_offset)
            elif offset == seg.start_offset + seg.capacity:
                # the last segment ends with its blank marker: the next record goes to a new one
                self._new_segment(offset)
        self.flushed_offset = min(self.flushed_offset, self.max_offset)

    # ---------------------------------------------------------------------------------- retention

    def delete_first_segment(self) -> Segment | None:
        """Remove the oldest segment unless it is the one being written; return it."""
        if len(self._segments) <= 1:
            return None
        seg = self._segments[0]
        self._segments = self._segments[1:]
        seg.destroy(defer_close=True)
        self._graveyard.append(seg)
        return seg

    def close_deleted(self) -> None:
        """Close the descriptors of segments deleted by an earlier retention pass."""
        graveyard, self._graveyard = self._graveyard, []
        for seg in graveyard:
            seg.close()
