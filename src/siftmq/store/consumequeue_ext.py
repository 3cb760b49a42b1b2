"""ConsumeQueueExt: per-entry store timestamp, tags code and filter bitmap beside the ConsumeQueue.

Layout: one fixed-size unit per queue offset, in segment files parallel to the ConsumeQueue's
(same units per segment, so segment ``i`` of both covers the same queue offsets) under
``<data_dir>/consumequeue_ext/<topic>/<queue_id>/``::

    store_timestamp  int64   0 marks a unit with no data (reads give None)
    tags_code        int64
    bitmap_length    uint16  0 = no bitmap
    bitmap           bitmap_size bytes (zero padded)

An entry's unit is found in O(1) from its queue offset. RocketMQ instead stores a variable-size
unit and keeps its address in the ConsumeQueue's tags code field; a fixed unit costs a few
bytes per entry and keeps the tags code in the ConsumeQueue usable for the vectorized index scan.
The bitmap size is fixed per store (default 14 bytes = 112 bits, RocketMQ's bloom with n=32, f=20%).
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

from siftmq.store.unitlog import UnitLog

_FIXED = struct.Struct(">qqH")


@dataclass(frozen=True, slots=True)
class CqExtUnit:
    """The extension of one ConsumeQueue entry."""

    store_timestamp: int
    tags_code: int
    filter_bitmap: bytes | None


@dataclass(frozen=True, slots=True)
class CqExtBlock:
    """Extension units of consecutive queue offsets as arrays (for vectorized filters).

    ``present[i]`` is False where the unit is missing; ``bitmaps`` is ``(n, bitmap_size)`` uint8
    with ``bitmap_lengths[i] == 0`` where an entry has no bitmap. The arrays may be read-only,
    non-contiguous, big-endian views of the file data (numpy computes with them as usual).
    """

    store_timestamps: npt.NDArray[np.int64]
    tags_codes: npt.NDArray[np.int64]
    bitmap_lengths: npt.NDArray[np.uint16]
    bitmaps: npt.NDArray[np.uint8]
    present: npt.NDArray[np.bool_]

    def unit(self, i: int) -> CqExtUnit | None:
        """The unit at row ``i`` as a :class:`CqExtUnit` (None if missing)."""
        if not self.present[i]:
            return None
        n = int(self.bitmap_lengths[i])
        return CqExtUnit(
            int(self.store_timestamps[i]),
            int(self.tags_codes[i]),
            self.bitmaps[i, :n].tobytes() if n else None,
        )


class LazyCqExtBlock(CqExtBlock):
    """A :class:`CqExtBlock` whose units are read from the file on first use of a field.

    get_messages hands one to ``match_consume_queue_block``, so filters that look only at the
    tags codes (tag subscriptions) do not pay for reading and checking the extension units, and
    each field is computed only when used. Reading it when the units are gone meanwhile
    (retention) gives an empty block.
    """

    __slots__ = ("_count", "_ext", "_present", "_queue_offset", "_units")
    _ext: ConsumeQueueExt
    _queue_offset: int
    _count: int
    _units: npt.NDArray[np.void] | None
    _present: npt.NDArray[np.bool_] | None

    def __init__(self, ext: ConsumeQueueExt, queue_offset: int, count: int) -> None:
        _set_lazy_ext(self, ext)
        _set_lazy_queue_offset(self, queue_offset)
        _set_lazy_count(self, count)
        _set_lazy_units(self, None)
        _set_lazy_present(self, None)

    def _load(self) -> npt.NDArray[np.void]:
        units = self._units
        if units is None:
            units = self._ext.read_units(self._queue_offset, self._count)
            _set_lazy_units(self, units)
        return units

    @property
    def store_timestamps(self) -> npt.NDArray[np.int64]:
        return self._load()["store_timestamp"]

    @property
    def tags_codes(self) -> npt.NDArray[np.int64]:
        return self._load()["tags_code"]

    @property
    def bitmap_lengths(self) -> npt.NDArray[np.uint16]:
        return self._load()["bitmap_length"]

    @property
    def bitmaps(self) -> npt.NDArray[np.uint8]:
        return self._load()["bitmap"]

    @property
    def present(self) -> npt.NDArray[np.bool_]:
        present = self._present
        if present is None:
            present = self._ext.present_of(self._load())
            _set_lazy_present(self, present)
        return present


_set_lazy_count, _set_lazy_ext, _set_lazy_present, _set_lazy_queue_offset, _set_lazy_units = (
    getattr(LazyCqExtBlock, name).__set__ for name in LazyCqExtBlock.__slots__
)


class ConsumeQueueExt:
    """The extension file set of one queue."""

    def __init__(self, directory: Path, units_per_segment: int, bitmap_size: int) -> None:
        if not 0 < bitmap_size <= 0xFFFF:
            raise ValueError("bitmap size must be in 1..65535 bytes")
        self.bitmap_size = bitmap_size
        self.unit_size = _FIXED.size + bitmap_size
        self.log = UnitLog(directory, self.unit_size, units_per_segment)
        self._no_bitmap = struct.Struct(f">qq{2 + bitmap_size}x")  # a unit without bitmap (length 0)
        self._dtype = np.dtype(
            [
                ("store_timestamp", ">i8"),
                ("tags_code", ">i8"),
                ("bitmap_length", ">u2"),
                ("bitmap", "u1", (bitmap_size,)),
            ]
        )

    def encode(self, store_timestamp: int, tags_code: int, bitmap: bytes | None) -> bytes:
        """One unit's bytes; a bitmap longer than the configured size is a ValueError."""
        bitmap = bitmap or b""
        if len(bitmap) > self.bitmap_size:
            raise ValueError(f"bitmap of {len(bitmap)} bytes exceeds the configured {self.bitmap_size}")
        return _FIXED.pack(store_timestamp, tags_code, len(bitmap)) + bitmap.ljust(self.bitmap_size, b"\0")

    def encode_columns(
        self,
        store_timestamps: Sequence[int],
        tags_codes: Sequence[int],
        bitmaps: Sequence[bytes | None] | None,
    ) -> bytes:
        """The bytes of consecutive units given as columns (``bitmaps`` None: no bitmaps at all)."""
        if bitmaps is None:
            return b"".join(map(self._no_bitmap.pack, store_timestamps, tags_codes))
        return b"".join(map(self.encode, store_timestamps, tags_codes, bitmaps))

    def put_units(self, first_offset: int, units: Sequence[bytes]) -> None:
        """Write encoded units at ``first_offset`` (padding missing units before it if needed)."""
        self.put_encoded(first_offset, b"".join(units))

    def put_encoded(self, first_offset: int, data: bytes) -> None:
        """Write the bytes of whole units at ``first_offset`` (padding missing units before it)."""
        gap = first_offset - self.log.max_index
        if self.log.segment_count() and gap > 0:
            self.log.append(self.log.max_index, bytes(self.unit_size * gap))
        elif self.log.segment_count() and gap < 0:
            self.log.truncate(first_offset)
        self.log.append(first_offset, data)

    def get(self, queue_offset: int) -> CqExtUnit | None:
        """The unit of ``queue_offset``, or None when absent."""
        block = self.read_block(queue_offset, 1)
        return None if block is None or len(block.present) == 0 else block.unit(0)

    def lazy_block(self, queue_offset: int, count: int) -> CqExtBlock | None:
        """What :meth:`read_block` returns, read only when a field is first used."""
        if not self.log.min_index <= queue_offset < self.log.max_index:
            return None
        return LazyCqExtBlock(self, queue_offset, count)

    def read_block(self, queue_offset: int, count: int) -> CqExtBlock | None:
        """Units of ``count`` consecutive offsets (fewer at the end); None if none is stored."""
        if queue_offset < self.log.min_index:
            return None
        data = self.log.read(queue_offset, count, within_segment=False)
        if not data:
            return None
        arr = np.frombuffer(data, dtype=self._dtype)
        # read-only views of the file data (big-endian): no copy unless a filter computes with them
        return CqExtBlock(
            arr["store_timestamp"],
            arr["tags_code"],
            arr["bitmap_length"],
            arr["bitmap"],
            self.present_of(arr),
        )

    def read_units(self, queue_offset: int, count: int) -> npt.NDArray[np.void]:
        """The units of ``count`` consecutive offsets as a structured array (empty if none is stored)."""
        data = None
        if queue_offset >= self.log.min_index:
            data = self.log.read(queue_offset, count, within_segment=False)
        return np.frombuffer(data or b"", dtype=self._dtype)

    def present_of(self, units: npt.NDArray[np.void]) -> npt.NDArray[np.bool_]:
        """Which of the structured ``units`` hold data."""
        present: npt.NDArray[np.bool_] = (units["store_timestamp"] != 0) & (
            units["bitmap_length"] <= self.bitmap_size
        )
        return present
