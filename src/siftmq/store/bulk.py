"""Bulk reading of the CommitLog's segment files: plan byte ranges, decode them into Arrow batches.

The offline jobs (Spark ``scan``, ``stats``, ``reindex``, ``backfill``) read the store's segment
files directly instead of asking a broker. The work is split in two steps:

* :func:`plan_scan` / :func:`plan_ranges` (the driver) walk the record headers of every segment
  (``total_size`` + magic, a jump loop) and cut the log into :class:`ByteRange` pieces of about
  ``target_bytes`` at record boundaries, never across a segment. The walk stops cleanly at a
  segment's end-of-segment blank marker and, for the whole log, at its end: the end of the last
  file, or the first all-zero header (the preallocated tail of the segment a broker is writing,
  see :mod:`siftmq.store.segment`). It stops early, saying why, at the first other header that is
  not a complete record: the torn tail of a log that crashed, or damage.
* :func:`read_range` (a worker) maps one range's segment file read-only and decodes it in chunks
  of ``batch_rows`` records into :class:`pyarrow.RecordBatch` objects of :data:`RECORD_SCHEMA`: a
  numpy gather of the fixed 92-byte headers, zero-copy ``binary_view`` slices of the mapped file
  for topic, body and properties, and the properties split into a ``map<string,string>`` with
  ``pyarrow.compute``. Every record's magic, record CRC, physical offset and field lengths are
  verified; a bad record raises :class:`~siftmq.errors.CorruptRecordError` with its offset.

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

import mmap
import os
import struct
import zlib
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from siftmq.errors import CorruptRecordError, StoreError
from siftmq.store import codec, decoding
from siftmq.store.segment import list_segment_starts, segment_name
from siftmq.store.tombstones import read_tombstones

DEFAULT_TARGET_BYTES: Final = 64 * 1024 * 1024
DEFAULT_BATCH_ROWS: Final = 65536
DEFAULT_BATCH_BYTES: Final = 64 * 1024 * 1024
# most bytes one decoded chunk spans: views address the chunk with int32 offsets
_MAX_CHUNK_BYTES: Final = 1024 * 1024 * 1024

RECORD_SCHEMA: Final = pa.schema(
    [
        pa.field("topic", pa.string(), nullable=False),
        pa.field("queue_id", pa.int32(), nullable=False),
        pa.field("queue_offset", pa.int64(), nullable=False),
        pa.field("physical_offset", pa.int64(), nullable=False),
        pa.field("store_size", pa.int32(), nullable=False),
        pa.field("tags", pa.string()),
        pa.field("keys", pa.string()),
        pa.field("message_id", pa.string()),
        pa.field("properties", pa.map_(pa.string(), pa.string()), nullable=False),
        pa.field("body", pa.binary(), nullable=False),
        pa.field("born_timestamp", pa.int64(), nullable=False),
        pa.field("store_timestamp", pa.int64(), nullable=False),
        pa.field("reconsume_times", pa.int32(), nullable=False),
        pa.field("sys_flag", pa.int32(), nullable=False),
        pa.field("flag", pa.int32(), nullable=False),
    ]
)
"""One row per stored message. ``properties`` holds every stored property, TAGS, KEYS and UNIQ_KEY
included, as filters see them; ``tags``, ``keys`` and ``message_id`` repeat TAGS, KEYS (the raw
space-separated text) and UNIQ_KEY. ``store_size`` is the whole record's size in the CommitLog."""

_HEADER_FIELDS: Final = (  # name, numpy type, position: codec's fixed header, big-endian
    ("total_size", ">i4", 0),
    ("magic", ">i4", 4),
    ("record_crc", ">u4", 8),
    ("body_crc", ">u4", 12),
    ("queue_id", ">i4", 16),
    ("flag", ">i4", 20),
    ("queue_offset", ">i8", 24),
    ("physical_offset", ">i8", 32),
    ("sys_flag", ">i4", 40),
    ("born_timestamp", ">i8", 44),
    ("born_host", "V8", 52),
    ("store_timestamp", ">i8", 60),
    ("store_host", "V8", 68),
    ("reconsume_times", ">i4", 76),
    ("prepared_transaction_offset", ">i8", 80),
    ("body_length", ">i4", 88),
)
_HEADER_DTYPE: Final = np.dtype(
    {
        "names": [name for name, _, _ in _HEADER_FIELDS],
        "formats": [fmt for _, fmt, _ in _HEADER_FIELDS],
        "offsets": [at for _, _, at in _HEADER_FIELDS],
        "itemsize": codec.HEADER_SIZE,
    }
)
_HEADER_BYTES: Final = np.arange(codec.HEADER_SIZE, dtype=np.int64)
_INLINE: Final = np.arange(12, dtype=np.int64)  # a binary_view holds values up to 12 bytes inline
_SIZE_MAGIC = struct.Struct(">ii")
_SIZE_MAGIC_CRC = struct.Struct(">iiI")
_CRC_FROM: Final = 12
_MAGIC: Final = codec.MESSAGE_MAGIC_CODE
_BLANK: Final = codec.BLANK_MAGIC_CODE
_MIN_RECORD: Final = codec.MIN_RECORD_SIZE

_IntArray = npt.NDArray[np.int64]
RowFilter = Callable[[pa.MapArray], Any]
"""A row filter for :func:`read_range`: the properties column in, a boolean mask out."""


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
    """

    ranges: tuple[ByteRange, ...]
    start_offset: int
    end_offset: int
    records: int
    bytes: int
    stop_reason: str | None


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
) -> ScanPlan:
    """Walk the CommitLog of ``store_dir`` (a MessageStore directory) and cut it into byte ranges.

    Ranges start at ``start_offset`` (a record boundary, or below the first stored segment for
    "from the beginning") and hold the records starting before ``end_offset`` (None: to the end).
    A new range starts at the first record boundary at least ``target_bytes`` after the current
    range's start. A ``start_offset`` at or past the end of the log plans nothing; one that is
    not at a complete record ends the plan there (``stop_reason`` says why). Raises
    :class:`StoreError` when there is no CommitLog directory.
    """
    if target_bytes < 1:
        raise ValueError("target_bytes must be positive")
    limit = end_offset if end_offset is not None else 1 << 62
    ranges: list[ByteRange] = []
    records = 0
    total = 0
    stop: str | None = None
    last_end = start_offset
    segments = list(_segments_from(store_dir, start_offset))
    planned_start = max(start_offset, segments[0][0]) if segments else start_offset
    for seg_start, next_start, path, size, first_pos in segments:
        pos = first_pos
        if seg_start >= limit:
            break
        if pos > size:  # in the segment's unused tail (after its blank marker) or past the log's end
            continue
        seg_ranges, pos, n, reason = _walk_segment(
            path, seg_start, size, pos, limit=limit - seg_start, target_bytes=target_bytes
        )
        ranges.extend(seg_ranges)
        records += n
        total += sum(r.size for r in seg_ranges)
        if reason == "blank":
            capacity = pos
            last_end = seg_start + capacity
            if next_start is not None and next_start != seg_start + capacity:
                stop = (
                    f"segment {segment_name(seg_start)} ends at offset {seg_start + capacity} but the "
                    f"next one starts at {next_start}: the log has a gap"
                )
                break
            continue
        last_end = seg_start + pos
        if reason == "limit":
            break
        if reason == "end" and next_start is None:
            break  # the end of the log (the segment being written)
        if reason == "end":
            stop = f"segment {segment_name(seg_start)} ends at {seg_start + pos} without a blank marker"
        else:
            stop = f"{reason} at offset {seg_start + pos}"
        break
    return ScanPlan(tuple(ranges), planned_start, last_end, records, total, stop)


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
    path: Path, seg_start: int, size: int, pos: int, *, limit: int, target_bytes: int
) -> tuple[list[ByteRange], int, int, str]:
    """Walk one segment's records from ``pos``; returns (ranges, stop position, records, why).

    ``why`` is ``"blank"`` (the stop position is then the segment's capacity), ``"end"`` (the file
    ends at a record boundary, or its zero tail starts there), ``"limit"`` (reached ``limit``) or a
    description of a bad header. ``size`` is the file's size when it was listed; a broker may have
    cut its preallocated tail since, so the walk maps what the file holds when it is opened.
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
                if total_size == 0 and magic == 0:
                    break  # "end": the preallocated tail of the segment being written
                if magic == _BLANK and total_size >= codec.BLANK_MARKER_SIZE:
                    why = "blank"
                    break
                why = f"bad magic code {magic & 0xFFFFFFFF:#x}"
                break
            if total_size < _MIN_RECORD or pos + total_size > size:
                why = "torn record" if total_size >= _MIN_RECORD else f"implausible record size {total_size}"
                break
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

    Raises :class:`CorruptRecordError` at the first record that fails its checks, and
    :class:`StoreError` when the segment file is gone or shorter than the range.
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


def _decode_map(
    mm: mmap.mmap,
    seg_start: int,
    lo: int,
    hi: int,
    *,
    wanted: list[bytes] | None,
    batch_rows: int,
    batch_bytes: int,
    with_body: bool,
    where: RowFilter | None,
) -> Iterator[pa.RecordBatch]:
    buf = np.frombuffer(mm, dtype=np.uint8)
    view = memoryview(mm)
    try:
        pos = lo
        while pos < hi:
            positions, pos = _walk_chunk(view, seg_start, pos, hi, max_rows=batch_rows, max_bytes=batch_bytes)
            batch = _decode_chunk(
                view, buf, seg_start, positions, wanted=wanted, with_body=with_body, where=where
            )
            if batch is not None and batch.num_rows:
                yield batch
    finally:
        del buf
        try:
            view.release()
        except BufferError:
            pass


def _walk_chunk(
    view: memoryview, seg_start: int, pos: int, hi: int, *, max_rows: int, max_bytes: int
) -> tuple[_IntArray, int]:
    """Positions of the next records (up to ``max_rows`` in ``max_bytes``), each checked for magic,
    size and CRC."""
    unpack = _SIZE_MAGIC_CRC.unpack_from
    crc32 = zlib.crc32
    positions: list[int] = []
    append = positions.append
    chunk_end = min(hi, pos + max_bytes)
    while pos < hi and len(positions) < max_rows:
        if hi - pos < 12:
            raise CorruptRecordError("truncated record header", offset=seg_start + pos)
        total_size, magic, record_crc = unpack(view, pos)
        if magic != _MAGIC:
            raise CorruptRecordError(f"bad magic code {magic & 0xFFFFFFFF:#x}", offset=seg_start + pos)
        end = pos + total_size
        if total_size < _MIN_RECORD or end > hi:
            raise CorruptRecordError(f"implausible record size {total_size}", offset=seg_start + pos)
        if positions and end > chunk_end:
            break
        if crc32(view[pos + _CRC_FROM : end]) != record_crc:
            raise CorruptRecordError("record CRC mismatch", offset=seg_start + pos)
        append(pos)
        pos = end
    return np.array(positions, dtype=np.int64), pos


def _first_bad(bad: npt.NDArray[np.bool_], positions: _IntArray, seg_start: int, what: str) -> None:
    if bad.any():
        at = int(positions[int(np.argmax(bad))])
        raise CorruptRecordError(f"inconsistent record fields ({what})", offset=seg_start + at)


def _decode_chunk(
    view: memoryview,
    buf: npt.NDArray[np.uint8],
    seg_start: int,
    positions: _IntArray,
    *,
    wanted: list[bytes] | None,
    with_body: bool,
    where: RowFilter | None,
) -> pa.RecordBatch | None:
    n = len(positions)
    if n == 0:
        return None
    last = len(buf) - 1
    headers = buf[positions[:, None] + _HEADER_BYTES].view(_HEADER_DTYPE).reshape(n)
    sizes = headers["total_size"].astype(np.int64)
    _first_bad(headers["physical_offset"] != positions + seg_start, positions, seg_start, "physical offset")
    body_len = headers["body_length"].astype(np.int64)
    body_start = positions + codec.HEADER_SIZE
    topic_len_at = body_start + body_len
    ends = positions + sizes
    _first_bad((body_len < 0) | (topic_len_at + 3 > ends), positions, seg_start, "body length")
    topic_len = buf[topic_len_at].astype(np.int64)
    topic_start = topic_len_at + 1
    props_len_at = topic_start + topic_len
    _first_bad(props_len_at + 2 > ends, positions, seg_start, "topic length")
    props_start = props_len_at + 2
    stored_props_len = buf[np.minimum(props_len_at, last)].astype(np.int64) * 256 + buf[
        np.minimum(props_len_at + 1, last)
    ].astype(np.int64)
    props_len = ends - props_start
    _first_bad(stored_props_len != props_len, positions, seg_start, "properties length")

    if wanted is not None:
        keep = np.zeros(n, dtype=bool)
        for topic in wanted:
            same_len = np.flatnonzero(topic_len == len(topic))
            if len(same_len) == 0:
                continue
            if not topic:
                keep[same_len] = True
                continue
            chars = buf[topic_start[same_len, None] + np.arange(len(topic), dtype=np.int64)]
            hit = (chars == np.frombuffer(topic, dtype=np.uint8)).all(axis=1)
            keep[same_len[hit]] = True
        sel = np.flatnonzero(keep)
        if len(sel) == 0:
            return None
        if len(sel) < n:
            headers = headers[sel]
            positions = positions[sel]
            sizes, body_start, body_len = sizes[sel], body_start[sel], body_len[sel]
            topic_start, topic_len = topic_start[sel], topic_len[sel]
            props_start, props_len = props_start[sel], props_len[sel]
    m = len(positions)
    base = int(positions[0])
    region = pa.py_buffer(view[base : int(positions[-1] + sizes[-1])])

    topic_col = _to_text(_views(buf, topic_start, topic_len, base, region), positions, seg_start, "topic")
    props_text = _to_text(
        _views(buf, props_start, props_len, base, region), positions, seg_start, "properties"
    )
    properties = _split_properties(props_text)
    if where is not None:
        mask = np.asarray(where(properties), dtype=bool)
        if len(mask) != m:
            raise ValueError(f"the where callable returned {len(mask)} values for {m} rows")
        if not mask.all():
            sel = np.flatnonzero(mask)
            if len(sel) == 0:
                return None
            taken = pa.array(sel)
            properties, topic_col = properties.take(taken), topic_col.take(taken)
            headers, positions, sizes = headers[sel], positions[sel], sizes[sel]
            body_start, body_len = body_start[sel], body_len[sel]
            m = len(sel)
    if with_body:
        body = pc.cast(_views(buf, body_start, body_len, base, region), pa.binary())
    else:
        body = pa.Array.from_buffers(
            pa.binary(), m, [None, pa.py_buffer(np.zeros(m + 1, dtype=np.int32)), pa.py_buffer(b"")]
        )
    del region
    columns = [
        topic_col,
        pa.array(headers["queue_id"].astype(np.int32), type=pa.int32()),
        pa.array(headers["queue_offset"].astype(np.int64), type=pa.int64()),
        pa.array(positions + seg_start, type=pa.int64()),
        pa.array(sizes.astype(np.int32), type=pa.int32()),
        pc.map_lookup(properties, codec.PROPERTY_TAGS, "last"),
        pc.map_lookup(properties, codec.PROPERTY_KEYS, "last"),
        pc.map_lookup(properties, codec.PROPERTY_UNIQ_KEY, "last"),
        properties,
        body,
        pa.array(headers["born_timestamp"].astype(np.int64), type=pa.int64()),
        pa.array(headers["store_timestamp"].astype(np.int64), type=pa.int64()),
        pa.array(headers["reconsume_times"].astype(np.int32), type=pa.int32()),
        pa.array(headers["sys_flag"].astype(np.int32), type=pa.int32()),
        pa.array(headers["flag"].astype(np.int32), type=pa.int32()),
    ]
    return pa.RecordBatch.from_arrays(columns, schema=RECORD_SCHEMA)


def _views(
    buf: npt.NDArray[np.uint8], starts: _IntArray, lengths: _IntArray, base: int, region: pa.Buffer
) -> pa.Array:
    """A ``binary_view`` array of ``buf[start:start+length]`` slices pointing into ``region`` at ``base``."""
    n = len(starts)
    views = np.zeros((n, 16), dtype=np.uint8)
    views[:, 0:4] = lengths.astype("<i4").view(np.uint8).reshape(n, 4)
    idx = starts[:, None] + _INLINE
    np.minimum(idx, len(buf) - 1, out=idx)
    inline = buf[idx]
    inline[_INLINE[None, :] >= lengths[:, None]] = 0  # unused inline bytes must be zero
    short = lengths <= 12
    views[short, 4:16] = inline[short]
    long_ = ~short
    if long_.any():
        views[long_, 4:8] = inline[long_, 0:4]  # the prefix; buffer index 0 is already zero
        views[long_, 12:16] = (starts[long_] - base).astype("<i4").view(np.uint8).reshape(-1, 4)
    return pa.Array.from_buffers(pa.binary_view(), n, [None, pa.py_buffer(views), region])


def _to_text(values: pa.Array, positions: _IntArray, seg_start: int, what: str) -> pa.Array:
    """``values`` as UTF-8 strings; an invalid one is a corrupt record (found row by row)."""
    try:
        return pc.cast(values, pa.string())
    except pa.ArrowInvalid:
        for i, value in enumerate(values.to_pylist()):
            try:
                value.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise CorruptRecordError(
                    f"inconsistent record fields ({what} is not UTF-8)", offset=seg_start + int(positions[i])
                ) from exc
        raise


def _split_properties(text: pa.Array) -> pa.MapArray:
    """``name\\x01value\\x02`` strings as a ``map<string,string>`` (codec.decode_properties's rules)."""
    n = len(text)
    pairs = pc.split_pattern(text, codec.PROPERTY_SEPARATOR)
    items = pairs.flatten()
    parents = pc.list_parent_indices(pairs).to_numpy()
    has_sep = pc.match_substring(items, codec.NAME_VALUE_SEPARATOR).to_numpy(zero_copy_only=False)
    if not has_sep.all():
        items = items.filter(pa.array(has_sep))
        parents = parents[has_sep]
    name_value = pc.split_pattern(items, codec.NAME_VALUE_SEPARATOR, max_splits=1)
    names = pc.list_element(name_value, 0)
    values = pc.list_element(name_value, 1)
    counts = np.bincount(parents, minlength=n)
    offsets = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(counts, out=offsets[1:])
    return pa.MapArray.from_arrays(pa.array(offsets, type=pa.int32()), names, values)


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
