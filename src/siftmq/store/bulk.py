"""Bulk reading of the CommitLog's segment files: plan byte ranges, decode them into Arrow batches.

The offline jobs (Spark ``scan``, ``stats``, ``reindex``, ``backfill``) read the store's segment
files directly instead of asking a broker. The work is split in two steps:

* :func:`plan_scan` / :func:`plan_ranges` (the driver) walk the record headers of every segment
  (``total_size`` + magic, a jump loop) and cut the log into :class:`ByteRange` pieces of about
  ``target_bytes`` at record boundaries, never across a segment. The walk stops cleanly at a
  segment's end-of-segment blank marker and, for the whole log, at its end: the end of the last
  file, or the first all-zero header (the preallocated tail of the segment a broker is writing,
  see :mod:`siftmq.store.segment`). It stops early, saying why, at the first other header that is
  not a complete record: the torn tail of a log that crashed, or damage. Planning a cleanly stopped
  store (``stopped_cleanly``, the offline jobs that rewrite its indexes), zeros where a record should
  start and a missing segment file are damage passed over instead, as the broker's recovery does.
* :func:`read_range` (a worker) maps one range's segment file read-only and decodes it in chunks
  of ``batch_rows`` records into :class:`pyarrow.RecordBatch` objects of :data:`RECORD_SCHEMA`
  (the decoder is :mod:`siftmq.store.bulk_decode`): a numpy gather of the fixed 92-byte headers,
  zero-copy ``binary_view`` slices of the mapped file for topic, body and properties, and the
  properties split into a ``map<string,string>`` with ``pyarrow.compute``. Every record's magic,
  record CRC, physical offset and field lengths are verified; a bad record raises
  :class:`~siftmq.errors.CorruptRecordError` with its offset. Records of deleted topics are left
  out (:mod:`siftmq.store.tombstones`).

:func:`iter_records` is the plain single-process reference: the same log, record by record,
through :func:`siftmq.store.decoding.decode_record` (tests and benchmarks compare against it).

Reading a store a broker has open is allowed: everything here only reads, and a planned range
holds complete records only (the broker writes a record's first 8 bytes, its size and magic code,
after the rest of it). Records appended after planning are not seen; a segment deleted by
retention while it is read raises :class:`~siftmq.errors.StoreError`. Segment files are never
written, locked or truncated.

Properties are decoded as :func:`~siftmq.store.codec.decode_properties` does (pairs without a
``\\x01`` are skipped, a missing final ``\\x02`` is tolerated); a record holding the same name twice
(which the codec never writes) keeps both entries in the map column.
"""

from __future__ import annotations

import bisect
import mmap
import os
import struct
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import pyarrow as pa
import pyarrow.compute as pc

from siftmq.errors import StoreError
from siftmq.store import codec, decoding
from siftmq.store.bulk_decode import RECORD_SCHEMA, RowFilter, _decode_map, _MappedRange
from siftmq.store.damage import first_nonzero, intact_at, next_intact
from siftmq.store.segment import list_segment_starts, segment_name
from siftmq.store.tombstones import read_tombstones

__all__ = [
    "DEFAULT_BATCH_BYTES",
    "DEFAULT_BATCH_ROWS",
    "DEFAULT_TARGET_BYTES",
    "LOG_GAP",
    "RECORD_SCHEMA",
    "ByteRange",
    "RowFilter",
    "ScanPlan",
    "commit_log_dir",
    "data_after",
    "intact_at_offsets",
    "iter_records",
    "merge_ranges",
    "plan_ranges",
    "plan_scan",
    "read_range",
]

_SIZE_MAGIC = struct.Struct(">ii")
_MAGIC: Final = codec.MESSAGE_MAGIC_CODE
_BLANK: Final = codec.BLANK_MAGIC_CODE
_MIN_RECORD: Final = codec.MIN_RECORD_SIZE
#: ends the ``stop_reason`` of a plan stopped by a segment file missing between two others
LOG_GAP: Final = "the log has a gap"

DEFAULT_TARGET_BYTES: Final = 64 * 1024 * 1024
DEFAULT_BATCH_ROWS: Final = 65536
DEFAULT_BATCH_BYTES: Final = 64 * 1024 * 1024
# most bytes one decoded chunk spans: views address the chunk with int32 offsets
_MAX_CHUNK_BYTES: Final = 1024 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class ByteRange:
    """CommitLog offsets ``[start, end)`` of one segment file, cut at record boundaries (picklable)."""

    path: str  # the segment file
    segment_start: int  # CommitLog offset of the segment's first byte
    start: int
    end: int

    @property
    def size(self) -> int:
        """Bytes in the range."""
        return self.end - self.start


@dataclass(frozen=True, slots=True)
class ScanPlan:
    """What :func:`plan_scan` found.

    ``end_offset`` is the offset right after the last complete record planned (or a segment's end
    when it ends with its blank marker); ``stop_reason`` is None when the walk reached the end of
    the log (or ``end_offset`` asked for), else why it stopped early, e.g. a torn tail.
    ``damaged`` lists the ``(offset, length)`` of damaged bytes the walk passed over (the ranges
    leave them out, as the broker's recovery does).
    """

    ranges: tuple[ByteRange, ...]
    start_offset: int
    end_offset: int
    records: int
    bytes: int
    stop_reason: str | None
    damaged: tuple[tuple[int, int], ...] = ()
    #: planned as a cleanly stopped log (see :func:`plan_scan`)
    stopped_cleanly: bool = False


def commit_log_dir(store_dir: Path) -> Path:
    """The CommitLog directory of a MessageStore directory."""
    return Path(store_dir) / "commitlog"


def _file_size(path: Path) -> int:
    try:
        return os.stat(path).st_size
    except FileNotFoundError:
        return 0


def _segments_from(store_dir: Path, start_offset: int) -> Iterator[tuple[int, int | None, Path, int, int]]:
    """The CommitLog segments holding ``start_offset`` and after, in order: (start offset, the next
    segment's start or None, path, file size, position of ``start_offset`` in it or 0).

    Raises :class:`StoreError` when ``store_dir`` has no CommitLog directory.
    """
    directory = commit_log_dir(store_dir)
    if not directory.is_dir():
        raise StoreError(f"{store_dir} holds no commit log (no {directory.name}/ directory)")
    starts = list_segment_starts(directory)
    for i, seg_start in enumerate(starts):
        next_start = starts[i + 1] if i + 1 < len(starts) else None
        if next_start is not None and next_start <= start_offset:
            continue
        path = directory / segment_name(seg_start)
        yield seg_start, next_start, path, _file_size(path), max(0, start_offset - seg_start)


def plan_scan(
    store_dir: Path,
    *,
    target_bytes: int = DEFAULT_TARGET_BYTES,
    start_offset: int = 0,
    end_offset: int | None = None,
    stopped_cleanly: bool = False,
) -> ScanPlan:
    """Walk the CommitLog of ``store_dir`` (a MessageStore directory) and cut it into byte ranges.

    Ranges start at ``start_offset`` (a record boundary, or below the first stored segment for
    "from the beginning") and hold the records starting before ``end_offset`` (None: to the end).
    A new range starts at the first record boundary at least ``target_bytes`` after the current
    range's start. A ``start_offset`` at or past the end of the log plans nothing; one that is
    not at a complete record ends the plan there (``stop_reason`` says why). Raises
    :class:`StoreError` when there is no CommitLog directory.

    ``stopped_cleanly`` is for a store no broker has open and that was closed cleanly (the offline
    jobs hold it with :func:`~siftmq.store.offline.open_offline`), planned as the broker's recovery
    scans it: a clean stop cuts every file back to its data, so a zero header there is damage like
    any other bad header (passed over to the next intact record; with none after it in the last
    segment, a torn tail), and a segment file missing between two others is a damaged range, not
    the end of the plan. Without it (a broker may be writing the log), a zero header in the last
    segment is where the data ends: a record being written has its header written last.
    """
    if target_bytes < 1:
        raise ValueError("target_bytes must be positive")
    limit = end_offset if end_offset is not None else 1 << 62
    ranges: list[ByteRange] = []
    records = 0
    total = 0
    stop: str | None = None
    damaged: list[tuple[int, int]] = []
    last_end = start_offset
    segments = list(_segments_from(store_dir, start_offset))
    planned_start = max(start_offset, segments[0][0]) if segments else start_offset
    for seg_start, next_start, path, size, first_pos in segments:
        pos = first_pos
        if seg_start >= limit:
            break
        if pos > size:  # in the segment's unused tail (after its blank marker) or past the log's end
            continue
        capacity = next_start - seg_start if next_start is not None else None
        seg_ranges, pos, n, reason = _walk_segment(
            path,
            seg_start,
            size,
            pos,
            limit=limit - seg_start,
            target_bytes=target_bytes,
            capacity=capacity,
            damaged=damaged,
            zeros_are_damage=stopped_cleanly,
        )
        ranges.extend(seg_ranges)
        records += n
        total += sum(r.size for r in seg_ranges)
        if reason == "blank":
            capacity = pos
            last_end = seg_start + capacity
            if next_start is not None and next_start != seg_start + capacity and stopped_cleanly:
                # the broker serves the segments after a missing file: only its bytes are lost
                damaged.append((seg_start + capacity, next_start - seg_start - capacity))
                last_end = next_start
            elif next_start is not None and next_start != seg_start + capacity:
                missing = ", ".join(
                    segment_name(s) for s in range(seg_start + capacity, next_start, capacity)
                )
                stop = (
                    f"segment {segment_name(seg_start)} ends at offset {seg_start + capacity} but the "
                    f"next one starts at {next_start} (segment file(s) {missing} missing): {LOG_GAP}"
                )
                break
            continue
        last_end = seg_start + pos
        if reason == "damaged" and next_start is not None:
            file_end = seg_start + _file_size(path)
            if stopped_cleanly and file_end < next_start:  # and the files missing after it
                damaged.append((file_end, next_start - file_end))
            last_end = next_start
            continue  # nothing intact after the damage in this segment: the next one goes on
        if reason == "limit":
            break
        if reason == "end" and next_start is None:
            break  # the end of the log (the segment being written)
        if reason == "end":
            stop = f"segment {segment_name(seg_start)} ends at {seg_start + pos} without a blank marker"
        else:
            stop = f"{reason} at offset {seg_start + pos}"
        break
    return ScanPlan(
        tuple(ranges), planned_start, last_end, records, total, stop, tuple(damaged), stopped_cleanly
    )


def data_after(store_dir: Path, offset: int) -> int | None:
    """The CommitLog offset of the first byte that is not zero at or after ``offset``, in the
    segment file holding it or a later one; None when nothing but zeros follows.

    A plan ends at the first zero header of the last segment (see :func:`plan_scan`); a byte that
    is not zero after it means the plan stopped before the data did.
    """
    for seg_start, _next_start, path, size, first_pos in _segments_from(store_dir, offset):
        if first_pos >= size:
            continue  # nothing there (a file gone or empty included: mmap takes no empty file)
        try:
            f = open(path, "rb")  # noqa: SIM115 - closed below
        except FileNotFoundError:
            continue
        with f, _map_file(f.fileno(), path) as mm:
            found = first_nonzero(_MappedRange(mm, seg_start, len(mm)), first_pos)
        if found is not None:
            return seg_start + found
    return None


def plan_ranges(
    store_dir: Path,
    *,
    target_bytes: int = DEFAULT_TARGET_BYTES,
    start_offset: int = 0,
    end_offset: int | None = None,
) -> list[ByteRange]:
    """The ranges of :func:`plan_scan` (see there)."""
    plan = plan_scan(store_dir, target_bytes=target_bytes, start_offset=start_offset, end_offset=end_offset)
    return list(plan.ranges)


def merge_ranges(ranges: Sequence[ByteRange], target_bytes: int) -> tuple[ByteRange, ...]:
    """Join adjacent ranges of one segment file while a joined range stays within ``target_bytes``
    (a range already larger stays as it is). The records covered do not change."""
    merged: list[ByteRange] = []
    for rng in ranges:
        last = merged[-1] if merged else None
        if (
            last is not None
            and last.path == rng.path
            and last.end == rng.start
            and rng.end - last.start <= target_bytes
        ):
            merged[-1] = ByteRange(last.path, last.segment_start, last.start, rng.end)
        else:
            merged.append(rng)
    return tuple(merged)


def _walk_segment(
    path: Path,
    seg_start: int,
    size: int,
    pos: int,
    *,
    limit: int,
    target_bytes: int,
    capacity: int | None,
    damaged: list[tuple[int, int]],
    zeros_are_damage: bool = False,
) -> tuple[list[ByteRange], int, int, str]:
    """Walk one segment's records from ``pos``; returns (ranges, stop position, records, why).

    ``why`` is ``"blank"`` (the stop position is then the segment's capacity), ``"end"`` (the file
    ends at a record boundary, or its zero tail starts there), ``"limit"`` (reached ``limit``) or a
    description of a bad header. ``size`` is the file's size when it was listed; a broker may have
    cut its preallocated tail since, so the walk maps what the file holds when it is opened.

    A bad header followed by an intact record (or the blank marker) in the segment is passed over
    and appended to ``damaged``; with nothing intact after it, a segment before the last
    (``capacity`` known) ends with ``"damaged"``, the last one stops there (a torn tail). With
    ``zeros_are_damage`` (a cleanly stopped log) a zero header is a bad header too.
    """
    ranges: list[ByteRange] = []
    if size - pos < 8:
        if size - pos == 0:
            return ranges, pos, 0, "end"
        return ranges, pos, 0, "torn record header"
    str_path = str(path)
    with open(path, "rb") as f, _map_file(f.fileno(), path) as mm:
        size = len(mm)
        unpack = _SIZE_MAGIC.unpack_from
        range_start = pos
        cut_at = pos + target_bytes
        n = 0
        why = "end"
        stop_at = min(size, limit)
        while pos < stop_at:
            if pos + 8 > size:
                why = "torn record header"
                break
            total_size, magic = unpack(mm, pos)
            if magic != _MAGIC:
                if total_size == 0 and magic == 0 and not zeros_are_damage:
                    break  # "end": the preallocated tail of the segment being written
                if magic == _BLANK and total_size >= codec.BLANK_MARKER_SIZE:
                    why = "blank"
                    break
                if total_size == 0 and magic == 0:
                    problem = "zeros where a record should start (a cleanly stopped file is all data)"
                else:
                    problem = f"bad magic code {magic & 0xFFFFFFFF:#x}"
            elif total_size < _MIN_RECORD or pos + total_size > size:
                problem = (
                    "torn record" if total_size >= _MIN_RECORD else f"implausible record size {total_size}"
                )
            else:
                problem = ""
            if problem:
                resume = next_intact(_MappedRange(mm, seg_start, size, capacity or size), pos, size)
                if resume is None:
                    why = problem
                    if capacity is not None:
                        damaged.append((seg_start + pos, size - pos))
                        why = "damaged"
                    break
                if pos > range_start:
                    ranges.append(ByteRange(str_path, seg_start, seg_start + range_start, seg_start + pos))
                damaged.append((seg_start + pos, resume - pos))
                pos = range_start = resume
                cut_at = pos + target_bytes
                continue
            if pos >= cut_at:
                ranges.append(ByteRange(str_path, seg_start, seg_start + range_start, seg_start + pos))
                range_start = pos
                cut_at = pos + target_bytes
            pos += total_size
            n += 1
        else:
            if pos >= limit:
                why = "limit"
        if pos > range_start:
            ranges.append(ByteRange(str_path, seg_start, seg_start + range_start, seg_start + pos))
        if why == "blank":
            total_size, _magic = unpack(mm, pos)
            pos += total_size
    return ranges, pos, n, why


def intact_at_offsets(store_dir: Path, offsets: Iterable[int]) -> list[bool | None]:
    """Whether an intact record, or a segment's blank marker, starts at each CommitLog offset.

    False where a segment file holds the offset but no intact record starts there (damaged bytes,
    a record failing its checks, the middle of a record); None where no segment file holds it.
    """
    directory = commit_log_dir(store_dir)
    starts = list_segment_starts(directory)
    wanted = list(offsets)
    found: list[bool | None] = [None] * len(wanted)
    by_segment: dict[int, list[int]] = {}
    for i, offset in enumerate(wanted):
        at = bisect.bisect_right(starts, offset) - 1
        if at >= 0:
            by_segment.setdefault(at, []).append(i)
    for at, rows in by_segment.items():
        seg_start = starts[at]
        path = directory / segment_name(seg_start)
        try:
            f = open(path, "rb")  # noqa: SIM115 - closed below, after the map
        except FileNotFoundError:
            continue
        try:
            if os.fstat(f.fileno()).st_size == 0:
                continue
            mm = _map_file(f.fileno(), path)
        finally:
            f.close()
        try:
            size = len(mm)
            capacity = starts[at + 1] - seg_start if at + 1 < len(starts) else size
            seg = _MappedRange(mm, seg_start, size, capacity)
            for i in rows:
                pos = wanted[i] - seg_start
                if pos < size:
                    found[i] = intact_at(seg, pos, size)
        finally:
            _close_map(mm)
    return found


def _map_file(fd: int, path: Path) -> mmap.mmap:
    """A read-only map of the whole file, retried when a broker cuts its tail meanwhile."""
    for _ in range(8):
        try:
            return mmap.mmap(fd, os.fstat(fd).st_size, access=mmap.ACCESS_READ)
        except ValueError:  # the file became shorter between fstat and mmap (or empty)
            continue
    raise StoreError(f"cannot map segment {path}: it is empty or its size keeps changing")


# ------------------------------------------------------------------------------------------ decoding


def read_range(
    rng: ByteRange,
    *,
    topics: Collection[str] | None = None,
    batch_rows: int = DEFAULT_BATCH_ROWS,
    with_body: bool = True,
    batch_bytes: int = DEFAULT_BATCH_BYTES,
    where: RowFilter | None = None,
) -> Iterator[pa.RecordBatch]:
    """Decode the records of ``rng`` into batches of :data:`RECORD_SCHEMA`.

    A batch holds at most ``batch_rows`` rows, decoded from at most ``batch_bytes`` of the log (or
    one record, when a record is larger). With ``topics``, only those topics' records become rows
    (the others are still verified). ``with_body=False`` leaves every ``body`` empty (cheaper, for
    index jobs). ``where`` is a row filter: called with each batch's ``properties`` column, it
    returns a boolean mask, and rows it does not keep are dropped before their bodies are copied
    (e.g. a compiled filter's vectorized ``matches_batch``).

    A record that fails its header checks (size, magic code, CRC) is passed over to the next intact
    record, as the broker's reads do (one log line each); :class:`CorruptRecordError` is raised for
    an intact record whose fields contradict each other, and :class:`StoreError` when the segment
    file is gone or shorter than the range.
    """
    if batch_rows < 1 or batch_bytes < 1:
        raise ValueError("batch_rows and batch_bytes must be positive")
    wanted = None if topics is None else sorted({t.encode("utf-8") for t in topics})
    if wanted is not None and not wanted:
        return
    lo = rng.start - rng.segment_start
    hi = rng.end - rng.segment_start
    if lo < 0 or hi < lo:
        raise ValueError(f"not a range of its segment: {rng}")
    if hi == lo:
        return
    try:
        f = open(rng.path, "rb")  # noqa: SIM115 - closed below, after the map
    except FileNotFoundError as exc:
        raise StoreError(f"segment {rng.path} is gone (removed by retention?)") from exc
    try:
        size = os.fstat(f.fileno()).st_size
        if size < hi:
            raise StoreError(f"segment {rng.path} has {size} bytes, fewer than the planned range {rng}")
        mm = mmap.mmap(f.fileno(), hi, access=mmap.ACCESS_READ)
    finally:
        f.close()
    # the store's deleted topics (a small file next to the CommitLog directory): their records are dead
    dead = read_tombstones(Path(rng.path).parent.parent)
    try:
        for batch in _decode_map(
            mm,
            rng.segment_start,
            lo,
            hi,
            wanted=wanted,
            batch_rows=batch_rows,
            batch_bytes=min(batch_bytes, _MAX_CHUNK_BYTES),
            with_body=with_body,
            where=where,
        ):
            live = _without_dead(batch, dead) if dead else batch
            if live.num_rows:
                yield live
    finally:
        _close_map(mm)


def _without_dead(batch: pa.RecordBatch, dead: Mapping[str, int]) -> pa.RecordBatch:
    """``batch`` without the records of deleted topics stored before their deletion."""
    topics = batch.column("topic")
    offsets = batch.column("physical_offset")
    gone = None
    for topic, below in dead.items():
        hit = pc.and_(pc.equal(topics, topic), pc.less(offsets, below))
        gone = hit if gone is None else pc.or_(gone, hit)
    return batch if gone is None else batch.filter(pc.invert(gone))


def _close_map(mm: mmap.mmap) -> None:
    """Unmap now, or when the last view into the map goes (a traceback may still hold one)."""
    try:
        mm.close()
    except BufferError:
        pass


# ------------------------------------------------------------------------------- reference reader


def iter_records(
    store_dir: Path, *, start_offset: int = 0, topics: Collection[str] | None = None
) -> Iterator[codec.StoredMessage]:
    """Every complete record of the CommitLog, decoded one by one with :func:`decoding.decode_record`.

    The plain, single-process reference for :func:`read_range`: it stops where :func:`plan_scan`
    stops (blank markers end a segment, the first incomplete header ends the log) and raises
    :class:`CorruptRecordError` for a complete record that fails its checks.
    """
    wanted = None if topics is None else set(topics)
    for seg_start, next_start, path, size, first_pos in _segments_from(store_dir, start_offset):
        pos = first_pos
        if size - pos < 8:
            return
        with open(path, "rb") as f:
            data = mmap.mmap(f.fileno(), size, access=mmap.ACCESS_READ)
        try:
            while pos + 8 <= size:
                total_size, magic = decoding.peek_header(data, pos)  # type: ignore[arg-type]
                if magic == _BLANK and total_size >= codec.BLANK_MARKER_SIZE:
                    break
                if magic != _MAGIC or total_size < _MIN_RECORD or pos + total_size > size:
                    return
                msg = decoding.decode_record(data, pos, seg_start + pos, max_record_size=total_size)  # type: ignore[arg-type]
                if wanted is None or msg.topic in wanted:
                    yield msg
                pos += total_size
            else:
                return  # the log ends in this segment
        finally:
            _close_map(data)
        if next_start is not None and next_start != seg_start + pos + total_size:
            return  # a gap in the log
