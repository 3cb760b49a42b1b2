"""The broker's implementations of the store's MessageFilter protocol (both stages, both kinds).

* :class:`TagMessageFilter` — index stage: the entry's tags code is in the subscription's hash set
  (vectorized with ``numpy.isin``); CommitLog stage: the exact tag string, so a hash collision never
  reaches a client.
* :class:`SqlMessageFilter` — index stage: when the entry's ext unit has a bitmap the registration
  *covers*, the group's bloom bits must all be set; otherwise (no bitmap, or a message the bitmap says
  nothing about) the entry may match. CommitLog stage: the exact SQL92 evaluation over the message's
  properties (``TAGS`` is the tag).

Which bitmaps a registration covers is :func:`siftmq.filter.registrations.bitmap_trusted`: those of
messages stored more than ``REGISTRATION_MARGIN_MS`` after its born time (live dispatch computed its
bits), and — after the offline ``backfill`` job computed its bits for the stored history — those of
messages stored up to its ``backfilled_until_ms``. The offline ``reindex`` job uses the same rule to
decide whose bits a rebuilt bitmap carries, so the broker and the jobs cannot disagree about it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import numpy.typing as npt

from siftmq.broker.stats import FilterStats
from siftmq.filter import CompiledFilter
from siftmq.filter.registrations import bitmap_covers, bitmap_trusted
from siftmq.filter.tags import TagFilter
from siftmq.store import CqExtBlock, CqExtUnit

#: Up to this many tag codes a block is matched by comparing with each; beyond, with ``np.isin``.
FEW_CODES = 4


class _Tallied:
    """What a filter's exact stage decided, counted once per read (the store calls ``tally_exact``)."""

    __slots__ = ()
    stats: FilterStats

    def tally_exact(self, evaluated: int, matched: int) -> None:
        self.stats.add(evaluated=evaluated, matched=matched)


class TagMessageFilter(_Tallied):
    """TAG subscription ``A||B`` (``*`` is represented by no filter at all)."""

    __slots__ = ("_codes", "stats", "tag_filter")

    def __init__(self, tag_filter: TagFilter, stats: FilterStats | None = None) -> None:
        self.tag_filter = tag_filter
        self.stats = stats or FilterStats()
        self._codes = np.fromiter(sorted(tag_filter.codes), dtype=np.int64, count=len(tag_filter.codes))

    def is_matched_by_consume_queue(self, tags_code: int | None, ext: CqExtUnit | None) -> bool:
        hit = self.tag_filter.matches_code(tags_code)
        if not hit:
            self.stats.add(tags=1)
        return hit

    def match_consume_queue_block(
        self, tags_codes: npt.NDArray[np.int64], ext: CqExtBlock | None
    ) -> npt.NDArray[np.bool_]:
        codes = self._codes
        if not len(codes):
            mask = np.zeros(len(tags_codes), dtype=np.bool_)
        elif len(codes) <= FEW_CODES:  # comparisons: np.isin costs ~10 us a call before any work
            mask = tags_codes == codes[0]
            for code in codes[1:]:
                mask |= tags_codes == code
        else:
            mask = np.isin(tags_codes, codes)
        self.stats.add(tags=int(len(mask) - np.count_nonzero(mask)))
        return mask

    def is_matched_by_commit_log(self, properties: Mapping[str, str]) -> bool:
        return self.tag_filter.matches_tag(properties.get("TAGS"))


class SqlMessageFilter(_Tallied):
    """SQL92 subscription with an optional bloom registration (positions, born time, backfill coverage)."""

    __slots__ = ("_bytes", "_masks", "backfilled_until_ms", "born_time_ms", "compiled", "positions", "stats")

    def __init__(
        self,
        compiled: CompiledFilter,
        positions: Sequence[int] | None,
        born_time_ms: int,
        stats: FilterStats | None = None,
        *,
        backfilled_until_ms: int | None = None,
    ) -> None:
        self.compiled = compiled
        self.stats = stats or FilterStats()
        self.positions = tuple(positions) if positions else ()
        self.born_time_ms = born_time_ms
        self.backfilled_until_ms = backfilled_until_ms
        self._bytes = np.array([p >> 3 for p in self.positions], dtype=np.intp)
        self._masks = np.array([1 << (p & 7) for p in self.positions], dtype=np.uint8)

    def _bitmap_trusted(self, store_timestamp: int) -> bool:
        return bool(self.positions) and bitmap_covers(
            store_timestamp, self.born_time_ms, self.backfilled_until_ms
        )

    def is_matched_by_consume_queue(self, tags_code: int | None, ext: CqExtUnit | None) -> bool:
        if ext is None or ext.filter_bitmap is None or not self._bitmap_trusted(ext.store_timestamp):
            return True
        bitmap = ext.filter_bitmap
        hit = all(p >> 3 < len(bitmap) and bitmap[p >> 3] & (1 << (p & 7)) for p in self.positions)
        if not hit:
            self.stats.add(bitmap=1)
        return hit

    def match_consume_queue_block(
        self, tags_codes: npt.NDArray[np.int64], ext: CqExtBlock | None
    ) -> npt.NDArray[np.bool_]:
        n = len(tags_codes)
        if ext is None or not self.positions:
            return np.ones(n, dtype=np.bool_)
        m = min(n, len(ext.present))
        decided = (
            ext.present[:m]
            & (ext.bitmap_lengths[:m] > 0)
            & bitmap_trusted(ext.store_timestamps[:m], self.born_time_ms, self.backfilled_until_ms)
        )
        if int(self._bytes.max()) >= ext.bitmaps.shape[1]:
            return np.ones(n, dtype=np.bool_)
        hit = np.all((ext.bitmaps[:m, self._bytes] & self._masks) != 0, axis=1)
        out = np.ones(n, dtype=np.bool_)
        out[:m] = ~decided | hit
        self.stats.add(bitmap=int(n - np.count_nonzero(out)))
        return out

    def is_matched_by_commit_log(self, properties: Mapping[str, str]) -> bool:
        return self.compiled.matches(properties)
