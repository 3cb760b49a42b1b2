"""The vectorized decoder of CommitLog chunks behind :func:`siftmq.store.bulk.read_range`.

A chunk of records is walked header by header (size, magic and CRC checked for each), then decoded
at once: a numpy gather of the fixed 92-byte headers, zero-copy ``binary_view`` slices of the mapped
file for topic, body and properties, and the properties split into a ``map<string,string>`` with
``pyarrow.compute``. A record failing its header checks is passed over to the next intact one;
one whose fields contradict each other raises :class:`~siftmq.errors.CorruptRecordError` with its
offset.
"""

from __future__ import annotations

import logging
import mmap
import struct
import zlib
from collections.abc import Callable, Iterator
from typing import Any, Final

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from siftmq.errors import CorruptRecordError
from siftmq.store import codec
from siftmq.store.damage import next_intact

_log = logging.getLogger(__name__)

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
_SIZE_MAGIC_CRC = struct.Struct(">iiI")
_CRC_FROM: Final = 12
_MAGIC: Final = codec.MESSAGE_MAGIC_CODE
_MIN_RECORD: Final = codec.MIN_RECORD_SIZE

_IntArray = npt.NDArray[np.int64]
RowFilter = Callable[[pa.MapArray], Any]
"""A row filter for :func:`read_range`: the properties column in, a boolean mask out."""


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
            try:
                positions, end = _walk_chunk(
                    view, seg_start, pos, hi, max_rows=batch_rows, max_bytes=batch_bytes
                )
            except CorruptRecordError as exc:
                bad = exc.offset - seg_start
                if bad > pos:  # the records before it are intact: take them first
                    positions, end = _walk_chunk(
                        view, seg_start, pos, bad, max_rows=batch_rows, max_bytes=batch_bytes
                    )
                else:  # pass over the damaged bytes, as the broker's reads do
                    end = _past_damage(mm, seg_start, bad, hi, exc)
                    positions = np.zeros(0, dtype=np.int64)
            pos = end
            if not len(positions):
                continue
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


class _MappedRange:
    """A mapped segment file up to ``length`` (a range's end, or the file's), as the damage search
    reads it."""

    def __init__(self, mm: mmap.mmap, start_offset: int, length: int, capacity: int | None = None) -> None:
        self._mm = mm
        self.start_offset = start_offset
        self.length = length
        self.capacity = length if capacity is None else capacity  # a range never holds a blank marker

    def read(self, pos: int, size: int) -> bytes:
        return bytes(self._mm[pos : min(pos + size, self.length)])


def _past_damage(mm: mmap.mmap, seg_start: int, bad: int, hi: int, exc: CorruptRecordError) -> int:
    """Where the next intact record after the damaged one at ``bad`` starts (``hi`` if none does)."""
    resume = next_intact(_MappedRange(mm, seg_start, hi), bad, hi)
    end = hi if resume is None else resume
    _log.warning("passing over %d damaged bytes at commit log offset %d: %s", end - bad, seg_start + bad, exc)
    return end


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
