"""ConsumeQueueExt: per-entry store timestamp, tags code and filter bitmap beside the ConsumeQueue.

Layout: one fixed-size unit per queue offset, in segment files parallel to the ConsumeQueue's
(same units per segment, so segment ``i`` of both covers the same queue offsets) under
``<data_dir>/consumequeue_ext/<topic>/<queue_id>/``::

    store_timestamp  int64   0 marks a unit with no data (reads give None)
    tags_code        int64
    bitmap_length    uint16  0 = no bitmap
    bitmap_check     uint32  (trees with the marker file, below)
    bitmap           bitmap_size bytes (zero padded)

The bitmap check is there because nothing else can tell a damaged bitmap: its bits come from the
filters' bloom positions, which the store does not have, so recovery cannot check them against the
record as it checks the rest of the unit. A cleared bit would make the index stage reject a message
its SQL92 subscription matches, for good; with the check, a unit whose bitmap or length disagrees
with it reads as one without a bitmap (the filter evaluates the message exactly) and recovery
rewrites it so. The check is the length and the bitmap read as one big-endian number, modulo the
largest prime below 2**32 (for a whole block with numpy: a sum of the bytes weighted by powers of
256 modulo the prime). Any one damaged byte always changes it (its change, below 256 in size, times
a power of 256 is never a multiple of the prime); more damage escapes it about once in four billion.
An extension tree made before the check has no marker file (:data:`CHECK_MARKER`) and keeps units
without one, read as before; a tree is given the marker only while it holds no unit file, or built
whole with checked units (``siftmq spark reindex``, which installs it in place of the old one).

An entry's unit is found in O(1) from its queue offset. RocketMQ instead stores a variable-size
unit and keeps its address in the ConsumeQueue's tags code field; a fixed unit costs a few
bytes per entry and keeps the tags code in the ConsumeQueue usable for the vectorized index scan.
The bitmap size is fixed per store (default 14 bytes = 112 bits, RocketMQ's bloom with n=32, f=20%).
"""

from __future__ import annotations

import functools
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import numpy as np
import numpy.typing as npt

from siftmq.durable import write_atomically
from siftmq.store.unitlog import UnitLog

_FIXED = struct.Struct(">qqH")
_FIXED_CHECKED = struct.Struct(">qqHI")
_LENGTH = struct.Struct(">H")
#: The largest bitmap a unit with a check may hold: the float64 sums of :meth:`ConsumeQueueExt._checks`
#: are exact below 2**53, ~7,900 bytes (the store's configuration allows 4,096).
MAX_CHECKED_BITMAP: Final = 4096
#: Units encoded with numpy from this many on (fewer cost less one at a time).
_BLOCK_ENCODE: Final = 32
#: The largest prime below 2**32: the check's modulus (a check fits the unit's uint32).
_CHECK_PRIME: Final = 4_294_967_291


#: A file in the extension tree's root (``consumequeue_ext/``): its units hold a bitmap check.
CHECK_MARKER: Final = "units-checked"


def units_checked(root: Path, *, mark_new: bool) -> bool:
    """Whether the units of the extension tree at ``root`` hold a bitmap check. ``mark_new``: a
    tree that holds no unit file yet is given the marker (durably, before any unit is written)."""
    if (root / CHECK_MARKER).exists():
        return True
    if not mark_new or _holds_units(root):
        return False
    mark_checked(root)
    return True


def mark_checked(root: Path) -> None:
    """Give the extension tree at ``root`` the marker of units with a bitmap check (the caller sees
    that every unit in it has one: a tree without units, or one it wrote whole)."""
    root.mkdir(parents=True, exist_ok=True)
    write_atomically(root / CHECK_MARKER, b"")


def _holds_units(root: Path) -> bool:
    """Any unit file in ``root/<topic>/<queue_id>/``."""
    if not root.is_dir():
        return False
    for topic in root.iterdir():
        if topic.is_dir():
            for queue in topic.iterdir():
                if queue.is_dir() and any(queue.iterdir()):
                    return True
    return False


@functools.cache  # one per bitmap size, not per queue (4,097 modular powers at the largest)
def _check_weights(bitmap_size: int) -> npt.NDArray[np.float64]:
    """The weights that make the check a weighted sum, for numpy: the length's (first), then each
    bitmap byte's: the powers of 256 modulo the prime that reading the bytes as one number gives."""
    powers = [pow(256, bitmap_size - 1 - i, _CHECK_PRIME) for i in range(bitmap_size)]
    weights = np.array([pow(256, bitmap_size, _CHECK_PRIME), *powers], dtype=np.float64)
    weights.flags.writeable = False  # shared by every queue of that size
    return weights


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

    __slots__ = ("_count", "_ext", "_lengths", "_present", "_queue_offset", "_units")
    _ext: ConsumeQueueExt
    _queue_offset: int
    _count: int
    _units: npt.NDArray[np.void] | None
    _present: npt.NDArray[np.bool_] | None
    _lengths: npt.NDArray[np.uint16] | None

    def __init__(self, ext: ConsumeQueueExt, queue_offset: int, count: int) -> None:
        _set_lazy_ext(self, ext)
        _set_lazy_queue_offset(self, queue_offset)
        _set_lazy_count(self, count)
        _set_lazy_units(self, None)
        _set_lazy_present(self, None)
        _set_lazy_lengths(self, None)

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
        lengths = self._lengths
        if lengths is None:  # checked once per block: unit(i) in a loop reads it every time
            lengths = self._ext.bitmap_lengths_of(self._load())
            _set_lazy_lengths(self, lengths)
        return lengths

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


(
    _set_lazy_count,
    _set_lazy_ext,
    _set_lazy_lengths,
    _set_lazy_present,
    _set_lazy_queue_offset,
    _set_lazy_units,
) = (getattr(LazyCqExtBlock, name).__set__ for name in LazyCqExtBlock.__slots__)


class ConsumeQueueExt:
    """The extension file set of one queue."""

    def __init__(self, directory: Path, units_per_segment: int, bitmap_size: int, *, checked: bool) -> None:
        """``checked``: the units hold a bitmap check (as :func:`units_checked` tells of the tree)."""
        if not 0 < bitmap_size <= 0xFFFF:
            raise ValueError("bitmap size must be in 1..65535 bytes")
        if checked and bitmap_size > MAX_CHECKED_BITMAP:
            raise ValueError(
                f"a checked bitmap is at most {MAX_CHECKED_BITMAP} bytes (the check's sums are exact to it)"
            )
        self.bitmap_size = bitmap_size
        self.checked = checked
        self.unit_size = (_FIXED_CHECKED if checked else _FIXED).size + bitmap_size
        self.log = UnitLog(directory, self.unit_size, units_per_segment)
        # a unit without bitmap: length 0 (and check 0, the check of no bitmap)
        self._no_bitmap = struct.Struct(f">qq{self.unit_size - 16}x")
        self._weights = _check_weights(bitmap_size) if checked else None
        fields: list[tuple[str, str] | tuple[str, str, tuple[int]]] = [
            ("store_timestamp", ">i8"),
            ("tags_code", ">i8"),
            ("bitmap_length", ">u2"),
        ]
        if checked:
            fields.append(("bitmap_check", ">u4"))
        fields.append(("bitmap", "u1", (bitmap_size,)))
        self._dtype = np.dtype(fields)

    def encode(self, store_timestamp: int, tags_code: int, bitmap: bytes | None) -> bytes:
        """One unit's bytes; a bitmap longer than the configured size is a ValueError."""
        bitmap = bitmap or b""
        if len(bitmap) > self.bitmap_size:
            raise ValueError(f"bitmap of {len(bitmap)} bytes exceeds the configured {self.bitmap_size}")
        padded = bitmap.ljust(self.bitmap_size, b"\0")
        if not self.checked:
            return _FIXED.pack(store_timestamp, tags_code, len(bitmap)) + padded
        # the length and bitmap as one big-endian number (what _checks computes for a block)
        check = int.from_bytes(_LENGTH.pack(len(bitmap)) + padded, "big") % _CHECK_PRIME
        return _FIXED_CHECKED.pack(store_timestamp, tags_code, len(bitmap), check) + padded

    def encode_columns(
        self,
        store_timestamps: Sequence[int],
        tags_codes: Sequence[int],
        bitmaps: Sequence[bytes | None] | None,
    ) -> bytes:
        """The bytes of consecutive units given as columns (``bitmaps`` None: no bitmaps at all); a
        bitmap longer than the configured size is a ValueError."""
        if bitmaps is None:
            return b"".join(map(self._no_bitmap.pack, store_timestamps, tags_codes))
        if len(bitmaps) < _BLOCK_ENCODE:
            return b"".join(map(self.encode, store_timestamps, tags_codes, bitmaps))
        size = self.bitmap_size
        lengths = [len(bitmap) if bitmap else 0 for bitmap in bitmaps]
        if max(lengths, default=0) > size:
            raise ValueError(f"bitmap of {max(lengths)} bytes exceeds the configured {size}")
        units = np.empty(len(lengths), dtype=self._dtype)
        units["store_timestamp"] = store_timestamps
        units["tags_code"] = tags_codes
        units["bitmap_length"] = lengths
        padded = b"".join([(bitmap or b"").ljust(size, b"\0") for bitmap in bitmaps])
        units["bitmap"] = np.frombuffer(padded, dtype=np.uint8).reshape(len(lengths), size)
        if self.checked:
            units["bitmap_check"] = self._checks(units)
        return units.tobytes()

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
            self.bitmap_lengths_of(arr),
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

    def bitmap_intact(self, units: npt.NDArray[np.void]) -> npt.NDArray[np.bool_]:
        """Which of the structured ``units`` hold a bitmap and length that agree with their check
        (all of them in a store without checks)."""
        if not self.checked:
            return np.ones(len(units), dtype=np.bool_)
        intact: npt.NDArray[np.bool_] = self._checks(units) == units["bitmap_check"]
        return intact

    def _checks(self, units: npt.NDArray[np.void]) -> npt.NDArray[np.int64]:
        """The bitmap check each of the structured ``units`` should hold. Computed in float64 (a
        BLAS product, ~3 times faster than numpy's integer one): every product and sum stays below
        2**53 (2**32 * (255 * 4,096 + 65,535) at most), so it is exact."""
        weights = self._weights
        assert weights is not None  # only units with checks are checked
        sums = units["bitmap"].astype(np.float64) @ weights[1:] + units["bitmap_length"] * weights[0]
        checks: npt.NDArray[np.int64] = sums.astype(np.int64) % _CHECK_PRIME
        return checks

    def bitmap_lengths_of(self, units: npt.NDArray[np.void]) -> npt.NDArray[np.uint16]:
        """The bitmap lengths of the structured ``units``, 0 where the check says the bitmap is
        damaged: the filter then evaluates the message exactly, as for a unit without one."""
        lengths: npt.NDArray[np.uint16] = units["bitmap_length"]
        if not self.checked:
            return lengths
        return np.where(self.bitmap_intact(units), lengths, np.uint16(0))
