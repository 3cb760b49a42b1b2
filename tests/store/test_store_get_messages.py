"""get_messages: every RocketMQ status, next-offset rules, both filter stages, bitmaps."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence

import numpy as np
import numpy.typing as npt
import pytest

from siftmq.store import (
    CqExtBlock,
    CqExtUnit,
    DispatchRequest,
    GetMessageStatus,
    MessageStore,
    tags_code_of,
)
from store_helpers import msg

S = GetMessageStatus
Opener = Callable[..., MessageStore]


class TagFilter:
    """A minimal tag filter: index stage on tags code, exact stage on the TAGS property."""

    def __init__(self, *tags: str) -> None:
        self.tags = set(tags)
        self.codes = {tags_code_of(t) for t in tags}
        self.index_calls = 0

    def is_matched_by_consume_queue(self, tags_code: int | None, ext: CqExtUnit | None) -> bool:
        self.index_calls += 1
        return tags_code is None or tags_code in self.codes

    def is_matched_by_commit_log(self, properties: Mapping[str, str]) -> bool:
        return properties.get("TAGS") in self.tags


class VectorTagFilter(TagFilter):
    """The same filter with the vectorized index check."""

    def match_consume_queue_block(
        self, tags_codes: npt.NDArray[np.int64], ext: CqExtBlock | None
    ) -> npt.NDArray[np.bool_]:
        return np.isin(tags_codes, np.fromiter(self.codes, dtype=np.int64))


class CollidingFilter(TagFilter):
    """Index stage says yes to everything: only the exact stage filters."""

    def is_matched_by_consume_queue(self, tags_code: int | None, ext: CqExtUnit | None) -> bool:
        return True


def _fill(store: MessageStore, n: int, queue_id: int = 0, tag: Callable[[int], str] = lambda i: "A") -> None:
    store.put_messages([msg(body=str(i).encode(), queue_id=queue_id, TAGS=tag(i)) for i in range(n)])


def test_no_matched_logic_queue(open_store: Opener) -> None:
    res = open_store().get_messages("g", "T", 0, 5, 10)
    assert (res.status, res.next_begin_offset, res.min_offset, res.max_offset) == (
        S.NO_MATCHED_LOGIC_QUEUE,
        0,
        0,
        0,
    )


def test_no_message_in_queue(open_store: Opener) -> None:
    store = open_store()
    store.create_queue("T", 3)
    res = store.get_messages("g", "T", 3, 7, 10)
    assert (res.status, res.next_begin_offset) == (S.NO_MESSAGE_IN_QUEUE, 0)


def test_found_and_next_offset(open_store: Opener) -> None:
    store = open_store()
    _fill(store, 10)
    res = store.get_messages("g", "T", 0, 2, 3)
    assert res.status is S.FOUND
    assert [m.body for m in res.messages] == [b"2", b"3", b"4"]
    assert (res.next_begin_offset, res.min_offset, res.max_offset) == (5, 0, 10)


def test_overflow_one_and_badly(open_store: Opener) -> None:
    store = open_store()
    _fill(store, 5)
    one = store.get_messages("g", "T", 0, 5, 10)
    assert (one.status, one.next_begin_offset) == (S.OFFSET_OVERFLOW_ONE, 5)
    badly = store.get_messages("g", "T", 0, 9, 10)
    # min offset 0: RocketMQ sends the consumer back to the start
    assert (badly.status, badly.next_begin_offset) == (S.OFFSET_OVERFLOW_BADLY, 0)


def test_too_small_and_badly_after_retention(open_store: Opener) -> None:
    store = open_store()
    store.put_messages([msg(body=b"x" * 40_000, TAGS="A") for _ in range(60)])
    result = store.delete_expired_files(now_ms=2**62)
    assert result.commit_log_segments >= 1
    cq_min = store.get_min_offset_in_queue("T", 0)
    assert cq_min > 0
    small = store.get_messages("g", "T", 0, 0, 10)
    assert (small.status, small.next_begin_offset, small.min_offset) == (S.OFFSET_TOO_SMALL, cq_min, cq_min)
    badly = store.get_messages("g", "T", 0, 1000, 10)
    assert (badly.status, badly.next_begin_offset) == (S.OFFSET_OVERFLOW_BADLY, 60)


def test_message_was_removing(open_store: Opener) -> None:
    store = open_store(consume_queue_entries_per_file=4)
    store.put_messages([msg(body=b"x" * 40_000) for _ in range(30)])
    # the CommitLog segment is gone but the ConsumeQueue was not trimmed yet
    store.commit_log.delete_first_segment()
    res = store.get_messages("g", "T", 0, 0, 10)
    assert res.status is S.MESSAGE_WAS_REMOVING
    assert res.next_begin_offset == 4  # the scanned index segment
    assert res.messages == []


def test_removed_entries_are_skipped_up_to_next_file(open_store: Opener) -> None:
    store = open_store(consume_queue_entries_per_file=64)
    store.put_messages([msg(body=b"x" * 40_000) for _ in range(30)])
    store.commit_log.delete_first_segment()
    res = store.get_messages("g", "T", 0, 0, 5)
    assert res.status is S.FOUND
    assert res.messages[0].commit_log_offset == 1 << 20


def test_offset_found_null(open_store: Opener) -> None:
    store = open_store(consume_queue_entries_per_file=4)
    _fill(store, 10)
    cq = store.find_consume_queue("T", 0)
    assert cq is not None
    cq.log.delete_first_segment()
    cq.log.min_index = 0  # as if the min offset had not been corrected yet
    res = store.get_messages("g", "T", 0, 1, 10)
    assert (res.status, res.next_begin_offset) == (S.OFFSET_FOUND_NULL, 4)


@pytest.mark.parametrize("filter_cls", [TagFilter, VectorTagFilter])
def test_tag_filter_on_index(open_store: Opener, filter_cls: type[TagFilter]) -> None:
    store = open_store(consume_queue_entries_per_file=1000)
    _fill(store, 300, tag=lambda i: "B" if i % 50 == 7 else "A")
    flt = filter_cls("B")
    res = store.get_messages("g", "T", 0, 0, 32, flt)
    assert res.status is S.FOUND
    assert [m.body for m in res.messages] == [str(i).encode() for i in range(7, 300, 50)]
    assert res.next_begin_offset == 300
    none = store.get_messages("g", "T", 0, 0, 32, filter_cls("C"))
    assert (none.status, none.next_begin_offset, none.messages) == (S.NO_MATCHED_MESSAGE, 300, [])


def test_exact_stage_removes_hash_collisions(open_store: Opener) -> None:
    store = open_store()
    # "Aa" and "BB" have the same Java hash code
    assert tags_code_of("Aa") == tags_code_of("BB")
    store.put_messages([msg(body=b"1", TAGS="Aa"), msg(body=b"2", TAGS="BB"), msg(body=b"3", TAGS="Aa")])
    flt = TagFilter("BB")
    res = store.get_messages("g", "T", 0, 0, 10, flt)
    assert [m.body for m in res.messages] == [b"2"]
    only_exact = store.get_messages("g", "T", 0, 0, 10, CollidingFilter("Aa"))
    assert [m.body for m in only_exact.messages] == [b"1", b"3"]
    nothing = store.get_messages("g", "T", 0, 2, 10, CollidingFilter("BB"))
    assert (nothing.status, nothing.next_begin_offset) == (S.NO_MATCHED_MESSAGE, 3)


def test_scan_bound_is_16000_bytes_of_index(open_store: Opener) -> None:
    store = open_store(consume_queue_entries_per_file=5000)
    _fill(store, 2000)
    res = store.get_messages("g", "T", 0, 0, 32, VectorTagFilter("Z"))
    assert (res.status, res.next_begin_offset, res.scanned) == (S.NO_MATCHED_MESSAGE, 800, 800)
    big = store.get_messages("g", "T", 0, 0, 1000, VectorTagFilter("Z"))
    assert big.next_begin_offset == 1000


def test_batch_limits(open_store: Opener) -> None:
    store = open_store(consume_queue_entries_per_file=1000, max_transfer_count=8, max_transfer_bytes=10_000)
    store.put_messages([msg(body=b"x" * 100) for _ in range(50)])
    res = store.get_messages("g", "T", 0, 0, 32)
    assert (len(res.messages), res.next_begin_offset) == (8, 8)
    store.put_messages([msg(body=b"y" * 6000, queue_id=1) for _ in range(5)])
    res = store.get_messages("g", "T", 1, 0, 32)
    assert len(res.messages) == 1  # a second one would pass max_transfer_bytes
    store.put_messages([msg(body=b"z" * 20_000, queue_id=2)])
    res = store.get_messages("g", "T", 2, 0, 32)
    assert len(res.messages) == 1  # one message is always returned


def test_a_read_not_holding_one_stops_before_a_first_message_past_its_bytes(open_store: Opener) -> None:
    """For a receive whose answer already holds messages: the next must fit what is left of it."""
    store = open_store(consume_queue_entries_per_file=1000)
    store.put_messages([msg(body=b"x" * 3000, TAGS="A") for _ in range(3)] + [msg(body=b"y" * 10, TAGS="B")])
    size = store.get_messages("g", "T", 0, 0, 1).messages[0].store_size
    none = store.get_messages("g", "T", 0, 0, 32, max_bytes=size - 1, hold_one=False)
    assert (none.status, none.messages, none.next_begin_offset) == (S.NO_MATCHED_MESSAGE, [], 0)
    assert none.scanned == 0
    assert len(store.get_messages("g", "T", 0, 0, 32, max_bytes=size - 1).messages) == 1  # held
    two = store.get_messages("g", "T", 0, 0, 32, max_bytes=2 * size + 1, hold_one=False)
    assert (two.status, len(two.messages), two.next_begin_offset) == (S.FOUND, 2, 2)
    # entries the filter passes over are passed over all the same, up to the first that does not fit
    skipped = store.get_messages("g", "T", 0, 0, 32, TagFilter("B"), max_bytes=5, hold_one=False)
    assert (skipped.status, skipped.messages, skipped.next_begin_offset) == (S.NO_MATCHED_MESSAGE, [], 3)


@pytest.mark.parametrize("bad_size", [0x7FFF_FFF0, 0, -5])
def test_a_read_not_holding_one_passes_over_a_damaged_head(open_store: Opener, bad_size: int) -> None:
    """An implausible size is damage, not a message that does not fit: taken for one, it stopped
    every such read of the queue at the entry, and the queue behind it was never read."""
    store = open_store()
    recs = store.put_messages([msg(body=b"m" * 100) for _ in range(3)])
    cq = store.find_consume_queue("T", 0)
    assert cq is not None
    cq.truncate(0)
    entries = [(r.commit_log_offset, bad_size if i == 0 else r.size, 0) for i, r in enumerate(recs)]
    cq.put_entries(0, entries, None)
    res = store.get_messages("g", "T", 0, 0, 32, max_bytes=10_000, hold_one=False)
    assert ([m.queue_offset for m in res.messages], res.next_begin_offset) == ([1, 2], 3)
    assert store.damaged_reads == 1


class BloomishDispatcher:
    """A test bitmap dispatcher: bit (hash of the Region property) % 112 set in a 14-byte bitmap."""

    def __init__(self) -> None:
        self.batches: list[int] = []
        self.seen: list[DispatchRequest] = []

    def compute_bitmaps(self, requests: Sequence[DispatchRequest]) -> list[bytes | None]:
        out: list[bytes | None] = []
        for req in requests:
            region = req.properties.get("Region")
            if region is None:
                out.append(None)
                continue
            bits = bytearray(14)
            bit = _bit_of(region)
            bits[bit // 8] |= 1 << (bit % 8)
            out.append(bytes(bits))
        return out

    def dispatch(self, requests: Sequence[DispatchRequest]) -> None:
        self.batches.append(len(requests))
        self.seen.extend(requests)


def _bit_of(region: str) -> int:
    return sum(region.encode()) % 112


class RegionFilter:
    """Exact: Region == wanted; index: the bitmap must have the region's bit."""

    def __init__(self, region: str) -> None:
        self.region = region
        self.bit = _bit_of(region)
        self.index_rejected = 0

    def is_matched_by_consume_queue(self, tags_code: int | None, ext: CqExtUnit | None) -> bool:
        if ext is None or ext.filter_bitmap is None:
            return True
        hit = bool(ext.filter_bitmap[self.bit // 8] & (1 << (self.bit % 8)))
        self.index_rejected += not hit
        return hit

    def is_matched_by_commit_log(self, properties: Mapping[str, str]) -> bool:
        return properties.get("Region") == self.region


class VectorRegionFilter(RegionFilter):
    def match_consume_queue_block(
        self, tags_codes: npt.NDArray[np.int64], ext: CqExtBlock | None
    ) -> npt.NDArray[np.bool_]:
        if ext is None:
            return np.ones(len(tags_codes), dtype=bool)
        mask = np.ones(len(tags_codes), dtype=bool)
        has = ext.present & (ext.bitmap_lengths > 0)
        hit = (ext.bitmaps[:, self.bit // 8] & (1 << (self.bit % 8))) != 0
        mask[: len(has)] = ~has | hit
        return mask


@pytest.mark.parametrize("filter_cls", [RegionFilter, VectorRegionFilter])
def test_bitmaps_from_dispatcher_reach_the_filter(open_store: Opener, filter_cls: type[RegionFilter]) -> None:
    store = open_store(consume_queue_entries_per_file=1000)
    dispatcher = BloomishDispatcher()
    store.set_bitmap_dispatcher(dispatcher)
    store.add_dispatcher(dispatcher)
    regions = ["Hangzhou", "Beijing", "Shanghai"]
    store.put_messages([msg(body=str(i).encode(), Region=regions[i % 3]) for i in range(30)])
    store.put_message(msg(body=b"noregion"))
    store.wait_dispatched()  # dispatchers run on the reput thread
    assert sum(dispatcher.batches) == 31
    assert [r.consume_queue_offset for r in dispatcher.seen] == list(range(31))
    cq = store.find_consume_queue("T", 0)
    assert cq is not None and cq.ext is not None
    unit = cq.ext.get(0)
    assert unit is not None and unit.filter_bitmap is not None and len(unit.filter_bitmap) == 14
    assert unit.tags_code == 0 and unit.store_timestamp > 0
    no_bitmap = cq.ext.get(30)
    assert no_bitmap is not None and no_bitmap.filter_bitmap is None
    flt = filter_cls("Beijing")
    res = store.get_messages("g", "T", 0, 0, 32, flt)
    assert [m.body for m in res.messages] == [str(i).encode() for i in range(1, 30, 3)]
    if filter_cls is RegionFilter:
        assert flt.index_rejected == 20  # skipped on the bitmap, the CommitLog was not read
    # vectorized filters get the units lazily: the same data, read on first use
    eager = cq.ext.read_block(3, 40)
    lazy = cq.ext.lazy_block(3, 40)
    assert eager is not None and lazy is not None
    for name in ("store_timestamps", "tags_codes", "bitmap_lengths", "bitmaps", "present"):
        assert np.array_equal(getattr(lazy, name), getattr(eager, name))
    assert [lazy.unit(i) for i in range(28)] == [eager.unit(i) for i in range(28)]
    assert cq.ext.lazy_block(31, 5) is None and cq.ext.read_block(31, 5) is None


def test_failing_dispatchers_do_not_fail_appends(open_store: Opener) -> None:
    class Broken:
        def dispatch(self, requests: Sequence[DispatchRequest]) -> None:
            raise RuntimeError("boom")

        def compute_bitmaps(self, requests: Sequence[DispatchRequest]) -> list[bytes | None]:
            return [b"\xff" * 100 for _ in requests]  # too long: stored without bitmap

    store = open_store()
    store.add_dispatcher(Broken())
    store.set_bitmap_dispatcher(Broken())
    store.put_message(msg())
    res = store.get_messages("g", "T", 0, 0, 1)
    assert res.status is S.FOUND
    cq = store.find_consume_queue("T", 0)
    assert cq is not None and cq.ext is not None
    unit = cq.ext.get(0)
    assert unit is not None and unit.filter_bitmap is None


@pytest.mark.parametrize("filter_cls", [TagFilter, VectorTagFilter, CollidingFilter])
def test_filtered_pulls_across_segments_match_a_plain_scan(
    open_store: Opener, filter_cls: type[TagFilter]
) -> None:
    # runs of nearby candidates are read with one pread: mix record sizes (some runs cross a
    # CommitLog segment end), gaps, and hash collisions that only the exact stage rejects
    store = open_store(consume_queue_entries_per_file=64, max_transfer_count=7)
    tags = ["B" if i % 7 in (0, 1) or i % 23 == 5 else ("Aa" if i % 5 == 0 else "BB") for i in range(600)]
    sizes = [20 + (i * 7919) % (40_000 if i % 11 == 0 else 6000) for i in range(600)]
    store.put_messages([msg(body=bytes([i % 251]) * sizes[i], TAGS=tags[i]) for i in range(600)])
    assert len(store.commit_log.segments()) >= 3
    for wanted in (("B",), ("Aa",), ("BB", "B")):
        flt = filter_cls(*wanted)
        got: list[int] = []
        offset = 0
        while True:
            res = store.get_messages("g", "T", 0, offset, 32, flt)
            assert len(res.messages) <= 7
            got += [m.queue_offset for m in res.messages]
            for m in res.messages:
                assert m.body == bytes([m.queue_offset % 251]) * sizes[m.queue_offset]
            if res.status not in (S.FOUND, S.NO_MATCHED_MESSAGE):
                break
            offset = res.next_begin_offset
        assert got == [i for i in range(600) if tags[i] in wanted]


def test_entry_pointing_at_a_foreign_record_is_passed_over_as_damage(
    open_store: Opener, caplog: pytest.LogCaptureFixture
) -> None:
    store = open_store()
    a = store.put_message(msg(body=b"a", queue_id=0))
    store.put_message(msg(body=b"b", queue_id=1))
    cq1 = store.find_consume_queue("T", 1)
    assert cq1 is not None
    cq1.truncate(0)
    cq1.put_entries(0, [(a.commit_log_offset, a.size, 0)], None)  # queue 1 entry -> queue 0 record
    with caplog.at_level("ERROR"):
        res = store.get_messages("g", "T", 1, 0, 1)
    assert (res.messages, res.next_begin_offset, store.damaged_reads) == ([], 1, 1)  # passed over
    assert "points at a record of T:0@0" in caplog.text
    cq1.truncate(0)
    cq1.put_entries(0, [(a.commit_log_offset, a.size + 1, 0)], None)
    res = store.get_messages("g", "T", 1, 0, 1)
    assert (res.messages, res.next_begin_offset, store.damaged_reads) == ([], 1, 2)


def test_mapped_reads_match_preads_and_grow_with_the_segment(open_store: Opener) -> None:
    # a segment is read through a map once an eighth of it (here 128 KiB) was written past the map;
    # the tail beyond the map is read with pread, and the map is made again as the segment grows
    store = open_store()
    store.put_messages([msg(body=bytes([i % 251]) * 1000, TAGS="A") for i in range(100)])
    seg = store.commit_log.segments()[-1]
    assert seg.read_mapped(0, 100) is None  # under 128 KiB written: not mapped yet
    store.put_messages([msg(body=bytes([i % 251]) * 1000, TAGS="A") for i in range(100, 300)])
    assert seg.read_mapped(0, 100) == seg.read(0, 100)
    assert seg.read_map is not None
    mapped = seg.read_map[1]
    store.put_messages([msg(body=bytes([i % 251]) * 1000, TAGS="B") for i in range(300, 500)])
    assert seg.read_mapped(mapped, 10) == seg.read(mapped, 10)  # made again, larger
    assert seg.read_map[1] > mapped
    store.put_message(msg(body=b"tail", TAGS="B"))  # beyond the map: read with pread
    got: list[int] = []
    offset = 0
    while True:
        res = store.get_messages("g", "T", 0, offset, 32, VectorTagFilter("B"))
        got += [m.queue_offset for m in res.messages]
        for m in res.messages:
            assert m.body == (b"tail" if m.queue_offset == 500 else bytes([m.queue_offset % 251]) * 1000)
        if res.status not in (S.FOUND, S.NO_MATCHED_MESSAGE):
            break
        offset = res.next_begin_offset
    assert got == list(range(300, 501))


def test_corrupt_record_in_a_mapped_segment_is_detected_and_passed_over(open_store: Opener) -> None:
    store = open_store()
    recs = store.put_messages([msg(body=bytes([i % 251]) * 1000) for i in range(300)])
    seg = store.commit_log.segments()[-1]
    victim = recs[150]
    os.pwrite(seg.fd, b"\xff", victim.commit_log_offset + 100)  # one body byte: the CRC fails
    assert seg.read_mapped(0, 8) is not None
    assert store.get_messages("g", "T", 0, 149, 1).messages[0].queue_offset == 149
    res = store.get_messages("g", "T", 0, 150, 1)
    assert [m.queue_offset for m in res.messages] == [151] and store.damaged_reads == 1


def test_raw_records_decode_to_what_a_read_gives(open_store: Opener) -> None:
    """``get_records`` then ``decode_raw`` (the path of a consumer's filter program) gives exactly
    the messages ``get_messages`` gives: both stages of the filter are applied by the raw read."""
    store = open_store()
    _fill(store, 300, tag=lambda i: "ABC"[i % 3])
    for flt in (None, CollidingFilter("A", "C"), VectorTagFilter("B")):
        res, records = store.get_records("T", 0, 5, 64, flt)
        expected = store.get_messages("g", "T", 0, 5, 64, flt)
        assert res.messages == [] and (res.status, res.next_begin_offset) == (
            expected.status, expected.next_begin_offset,
        )  # fmt: skip
        assert [store.decode_raw("T", 0, r) for r in records] == expected.messages
        for r in records:
            assert r.body == str(r.queue_offset).encode() and b"TAGS\x01" in r.properties


def test_a_damaged_raw_record_is_caught_when_decoded(open_store: Opener) -> None:
    """A raw read skips the CRC (most records go no further than a program that passes them
    over); the decode of a kept one checks it, and a damaged one is passed over and counted."""
    store = open_store()
    recs = store.put_messages([msg(body=bytes([i % 251]) * 1000) for i in range(10)])
    seg = store.commit_log.segments()[-1]
    os.pwrite(seg.fd, b"\xff", recs[4].commit_log_offset + 100)
    _, records = store.get_records("T", 0, 0, 10)
    assert [r.queue_offset for r in records] == list(range(10))
    assert store.decode_raw("T", 0, records[4]) is None and store.damaged_reads == 1
    assert store.decode_raw("T", 0, records[5]) is not None and store.damaged_reads == 1
