"""The bulk CommitLog reader (siftmq.store.bulk) against stores written by MessageStore."""

from __future__ import annotations

import itertools
import os
import pickle
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from siftmq.errors import CorruptRecordError, StoreError
from siftmq.store import Message, MessageStore, StoreConfig, bulk, codec
from siftmq.store.segment import list_segment_starts, segment_name
from store_helpers import flip_byte

TOPICS = ("Orders", "Payments", "Audit")


def small_config(data_dir: Path, **overrides: Any) -> StoreConfig:
    """1 MiB segments, so a few thousand messages roll the CommitLog over several times."""
    settings: dict[str, Any] = {
        "commit_log_segment_size": 1 << 20,
        "max_message_size": 64 * 1024,
        "consume_queue_entries_per_file": 64,
        "flush_interval_ms": 50,
        **overrides,
    }
    return StoreConfig(data_dir, **settings)


def message(i: int) -> Message:
    """Message ``i``: varied topics, queues, bodies and properties (some messages have none)."""
    props: dict[str, str] = {}
    if i % 11:
        props = {"TAGS": f"Tag{i % 4}", "UNIQ_KEY": f"ID{i:06d}", "price": str(i % 97), "region": "eu"}
        if i % 3 == 0:
            props["KEYS"] = f"k{i} order-{i // 3}"
        if i % 5 == 0:
            props["note"] = "ünïcødé ✓ with = and spaces"
        if i % 13 == 0:
            props["empty"] = ""
    body = bytes((i + k) % 256 for k in range((i * 37) % 1500))  # 0..1499 bytes, \x01 and \x02 included
    return Message(topic=TOPICS[i % 3], body=body, queue_id=i % 4, properties=props, born_timestamp=1_000 + i)


def write_store(data_dir: Path, count: int = 3000, **overrides: Any) -> list[Message]:
    messages = [message(i) for i in range(count)]
    with MessageStore.open(small_config(data_dir, **overrides)) as store:
        for k in range(0, count, 250):
            store.put_messages(messages[k : k + 250])
    return messages


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[Message]]:
    data_dir = tmp_path_factory.mktemp("bulk") / "store"
    return data_dir, write_store(data_dir)


def read_rows(ranges: list[bulk.ByteRange], **kwargs: Any) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for rng in ranges:
        for batch in bulk.read_range(rng, **kwargs):
            assert batch.schema.equals(bulk.RECORD_SCHEMA)
            rows.extend(batch.to_pylist())
    return rows


def as_reference(msg: codec.StoredMessage) -> dict[str, Any]:
    """The row :func:`bulk.read_range` must produce for a record decoded by the codec."""
    return {
        "topic": msg.topic,
        "queue_id": msg.queue_id,
        "queue_offset": msg.queue_offset,
        "physical_offset": msg.commit_log_offset,
        "store_size": msg.store_size,
        "tags": msg.properties.get("TAGS"),
        "keys": msg.properties.get("KEYS"),
        "message_id": msg.properties.get("UNIQ_KEY"),
        "properties": msg.properties,
        "body": msg.body,
        "born_timestamp": msg.born_timestamp,
        "store_timestamp": msg.store_timestamp,
        "reconsume_times": msg.reconsume_times,
        "sys_flag": msg.sys_flag,
        "flag": msg.flag,
    }


def normalized(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{**row, "properties": dict(row["properties"])} for row in rows]


def test_reference_reader_returns_what_was_written(written: tuple[Path, list[Message]]) -> None:
    data_dir, messages = written
    stored = list(bulk.iter_records(data_dir))
    assert len(list_segment_starts(data_dir / "commitlog")) >= 3  # the log rolled over
    assert [(m.topic, m.body, m.queue_id, m.properties) for m in stored] == [
        (m.topic, m.body, m.queue_id, dict(m.properties)) for m in messages
    ]
    assert [m.commit_log_offset for m in stored] == sorted(m.commit_log_offset for m in stored)


def test_read_range_equals_codec_decoding_across_segments(written: tuple[Path, list[Message]]) -> None:
    data_dir, messages = written
    plan = bulk.plan_scan(data_dir, target_bytes=256 * 1024)
    assert plan.stop_reason is None
    assert plan.records == len(messages)
    assert len({r.path for r in plan.ranges}) >= 3
    expected = [as_reference(m) for m in bulk.iter_records(data_dir)]
    assert normalized(read_rows(list(plan.ranges), batch_rows=300)) == expected


def test_batches_hold_at_most_batch_rows(written: tuple[Path, list[Message]]) -> None:
    data_dir, _ = written
    rng = bulk.plan_ranges(data_dir, target_bytes=1 << 30)[0]
    sizes = [b.num_rows for b in bulk.read_range(rng, batch_rows=64)]
    assert max(sizes) == 64
    assert sum(sizes) == sum(1 for m in bulk.iter_records(data_dir) if m.commit_log_offset < rng.end)
    by_bytes = list(bulk.read_range(rng, batch_bytes=20_000))
    assert all(sum(b.column("store_size").to_pylist()) <= 20_000 for b in by_bytes)
    assert sum(b.num_rows for b in by_bytes) == sum(sizes)
    one_each = itertools.islice(bulk.read_range(rng, batch_bytes=1), 3)
    assert [b.num_rows for b in one_each] == [1, 1, 1]  # one record at least


def test_topics_filter_keeps_only_those_topics(written: tuple[Path, list[Message]]) -> None:
    data_dir, _ = written
    ranges = bulk.plan_ranges(data_dir, target_bytes=512 * 1024)
    expected = [as_reference(m) for m in bulk.iter_records(data_dir, topics={"Payments", "Audit"})]
    assert normalized(read_rows(ranges, topics=["Payments", "Audit", "Missing"])) == expected
    assert read_rows(ranges, topics=["Missing", "Order"]) == []
    assert read_rows(ranges, topics=[]) == []


def test_without_body_every_body_is_empty_and_the_rest_equal(written: tuple[Path, list[Message]]) -> None:
    data_dir, _ = written
    ranges = bulk.plan_ranges(data_dir)
    expected = [{**as_reference(m), "body": b""} for m in bulk.iter_records(data_dir, topics=["Orders"])]
    assert normalized(read_rows(ranges, topics=["Orders"], with_body=False)) == expected


def test_where_drops_the_rows_it_does_not_keep(written: tuple[Path, list[Message]]) -> None:
    data_dir, _ = written
    ranges = bulk.plan_ranges(data_dir, target_bytes=300_000)
    seen: list[int] = []

    def tag1(properties: pa.MapArray) -> Any:
        seen.append(len(properties))
        return pc.fill_null(pc.equal(pc.map_lookup(properties, "TAGS", "last"), "Tag1"), False)

    expected = [as_reference(m) for m in bulk.iter_records(data_dir, topics=["Audit"]) if m.tags == "Tag1"]
    assert expected
    assert normalized(read_rows(ranges, topics=["Audit"], where=tag1)) == expected
    assert sum(seen) == sum(
        1 for _ in bulk.iter_records(data_dir, topics=["Audit"])
    )  # after the topic filter
    assert read_rows(ranges, where=lambda p: np.zeros(len(p), dtype=bool)) == []
    with pytest.raises(ValueError, match="returned 1 values"):
        read_rows(ranges, where=lambda p: [True])


def test_plan_cuts_contiguous_ranges_at_record_boundaries(written: tuple[Path, list[Message]]) -> None:
    data_dir, _ = written
    target = 100_000
    plan = bulk.plan_scan(data_dir, target_bytes=target)
    records = list(bulk.iter_records(data_dir))
    starts = list_segment_starts(data_dir / "commitlog")
    offsets = {m.commit_log_offset for m in records}
    segment_of = {m.commit_log_offset: max(s for s in starts if s <= m.commit_log_offset) for m in records}
    segment_end = {
        s: max(m.commit_log_offset + m.store_size for m in records if segment_of[m.commit_log_offset] == s)
        for s in starts
    }
    largest = max(m.store_size for m in records)
    assert plan.start_offset == 0 and len(plan.ranges) > len(starts)
    for prev, rng in zip((None, *plan.ranges), plan.ranges, strict=False):
        assert rng.start in offsets and segment_of[rng.start] == rng.segment_start
        assert rng.end in offsets or rng.end == segment_end[rng.segment_start]
        assert Path(rng.path).name == segment_name(rng.segment_start)
        assert rng.size < target + largest
        if prev is not None and prev.segment_start == rng.segment_start:
            assert prev.end == rng.start and prev.size >= target
        elif prev is not None:
            assert prev.end == segment_end[prev.segment_start]
    covered = [m for m in records if any(r.start <= m.commit_log_offset < r.end for r in plan.ranges)]
    assert len(covered) == len(records) == plan.records
    assert plan.bytes == sum(m.store_size for m in records)
    assert plan.end_offset == segment_end[starts[-1]]


def test_plan_with_start_and_end_offsets(written: tuple[Path, list[Message]]) -> None:
    data_dir, _ = written
    records = list(bulk.iter_records(data_dir))
    start, end = records[700].commit_log_offset, records[2100].commit_log_offset
    plan = bulk.plan_scan(data_dir, target_bytes=200_000, start_offset=start, end_offset=end)
    assert plan.ranges[0].start == start
    assert plan.records == 1400 and plan.stop_reason is None and plan.end_offset == end
    rows = read_rows(list(plan.ranges), with_body=False)
    assert [r["physical_offset"] for r in rows] == [m.commit_log_offset for m in records[700:2100]]
    assert bulk.plan_ranges(data_dir, start_offset=plan.end_offset, end_offset=plan.end_offset) == []
    past = bulk.plan_scan(data_dir, start_offset=records[-1].commit_log_offset + 10**6)
    assert past.ranges == () and past.stop_reason is None
    at_end = bulk.plan_scan(data_dir, start_offset=records[-1].commit_log_offset + records[-1].store_size)
    assert at_end.ranges == () and at_end.stop_reason is None
    assert len(bulk.plan_ranges(data_dir, start_offset=records[-1].commit_log_offset)) == 1
    tail = list(bulk.iter_records(data_dir, start_offset=start))
    assert [m.commit_log_offset for m in tail] == [m.commit_log_offset for m in records[700:]]


def test_merge_ranges_joins_neighbours_within_a_segment(written: tuple[Path, list[Message]]) -> None:
    data_dir, messages = written
    fine = bulk.plan_scan(data_dir, target_bytes=16 * 1024).ranges
    merged = bulk.merge_ranges(fine, 100 * 1024)
    assert len(merged) < len(fine)
    for seg in {r.segment_start for r in fine}:  # the same bytes of every segment, in order
        mine = [r for r in merged if r.segment_start == seg]
        theirs = [r for r in fine if r.segment_start == seg]
        assert (mine[0].start, mine[-1].end) == (theirs[0].start, theirs[-1].end)
        assert all(a.end == b.start for a, b in itertools.pairwise(mine))
        assert {r.path for r in mine} == {theirs[0].path}
    assert all(r.size <= 100 * 1024 or r in fine for r in merged)
    assert len(read_rows(list(merged))) == len(messages)
    assert bulk.merge_ranges(fine, 1) == tuple(fine)


def test_byte_range_is_picklable(written: tuple[Path, list[Message]]) -> None:
    rng = bulk.plan_ranges(written[0])[0]
    assert pickle.loads(pickle.dumps(rng)) == rng


def last_segment(data_dir: Path) -> Path:
    return data_dir / "commitlog" / segment_name(list_segment_starts(data_dir / "commitlog")[-1])


@pytest.mark.parametrize("cut", [1, 7, 20, 93, -1])
def test_torn_tail_ends_the_plan_after_the_last_complete_record(tmp_path: Path, cut: int) -> None:
    data_dir = tmp_path / "store"
    write_store(data_dir, 400)
    records = list(bulk.iter_records(data_dir))
    last = records[-1]
    seg = last_segment(data_dir)
    seg_start = int(seg.name)
    # cut the file inside the last record, as a crash in the middle of a write leaves it
    keep = last.commit_log_offset - seg_start + (cut if cut > 0 else last.store_size - 1)
    os.truncate(seg, keep)
    plan = bulk.plan_scan(data_dir, target_bytes=50_000)
    assert plan.records == len(records) - 1
    assert plan.end_offset == last.commit_log_offset
    assert plan.stop_reason is not None and str(last.commit_log_offset) in plan.stop_reason
    rows = read_rows(list(plan.ranges))
    assert normalized(rows) == [as_reference(m) for m in records[:-1]]
    assert [m.commit_log_offset for m in bulk.iter_records(data_dir)] == [
        m.commit_log_offset for m in records[:-1]
    ]


def test_zero_tail_is_the_end_of_the_log(tmp_path: Path) -> None:
    """A zero header is where a preallocated segment's data ends: a clean end of the whole log,
    but a broken one in a segment that another follows (a full segment ends with its blank marker)."""
    data_dir = tmp_path / "store"
    write_store(data_dir, 3000)
    with open(last_segment(data_dir), "ab") as f:
        f.write(bytes(4096))  # the preallocated tail a crash leaves
    plan = bulk.plan_scan(data_dir)
    assert plan.stop_reason is None and plan.records == 3000
    starts = list_segment_starts(data_dir / "commitlog")
    first = bulk.plan_scan(data_dir, end_offset=starts[1])
    with open(data_dir / "commitlog" / segment_name(starts[0]), "r+b") as f:
        f.seek(first.ranges[-1].start - starts[0])
        f.write(bytes(8))  # the first segment's data now "ends" at its last range's start
    plan = bulk.plan_scan(data_dir)
    assert plan.stop_reason is not None and "without a blank marker" in plan.stop_reason
    assert plan.end_offset == first.ranges[-1].start


def test_planning_and_reading_race_a_writer(open_store: Callable[..., MessageStore]) -> None:
    """Plans made while a writer appends, and rolls segments (cutting the full one's preallocated
    tail), end cleanly and hold complete records only."""
    store = open_store()
    stop = threading.Event()

    def write() -> None:
        i = 0
        while not stop.is_set():
            store.put_message(message(i))
            i += 1

    writer = threading.Thread(target=write)
    writer.start()
    try:
        seen = 0
        start = time.monotonic()
        # two seconds at least, and until the writer rolled segments twice (slower on a loaded host)
        while time.monotonic() - start < 2.0 or (
            len(store.commit_log.segments()) <= 2 and time.monotonic() - start < 60.0
        ):
            plan = bulk.plan_scan(store.data_dir)
            assert plan.stop_reason is None, plan.stop_reason
            assert len(read_rows(list(plan.ranges), with_body=False)) == plan.records >= seen
            seen = plan.records
    finally:
        stop.set()
        writer.join()
    assert seen > 0 and len(store.commit_log.segments()) > 2


@pytest.mark.parametrize("where", ["body", "properties", "queue_offset", "topic"])
def test_a_damaged_record_is_passed_over_and_the_rest_read(
    tmp_path: Path, where: str, caplog: pytest.LogCaptureFixture
) -> None:
    data_dir = tmp_path / "store"
    write_store(data_dir, 500)
    records = list(bulk.iter_records(data_dir))
    victim = next(m for m in records[200:] if m.body and m.properties)
    seg_start = max(s for s in list_segment_starts(data_dir / "commitlog") if s <= victim.commit_log_offset)
    rel = victim.commit_log_offset - seg_start
    position = {
        "body": rel + codec.HEADER_SIZE + len(victim.body) // 2,
        "topic": rel + codec.HEADER_SIZE + len(victim.body) + 2,
        "properties": rel + victim.store_size - 3,
        "queue_offset": rel + 30,
    }[where]
    flip_byte(data_dir / "commitlog" / segment_name(seg_start), position, 0x40)
    plan = bulk.plan_scan(data_dir, target_bytes=1 << 30)
    assert plan.records == len(records)  # the walk reads only sizes and magic codes
    expected = [as_reference(m) for m in records if m.commit_log_offset != victim.commit_log_offset]
    with caplog.at_level("WARNING"):
        assert normalized(read_rows(list(plan.ranges))) == expected  # as the broker's reads: that one only
    assert f"damaged bytes at commit log offset {victim.commit_log_offset}" in caplog.text
    # the topic filter still checks other topics' records, and passes over the damaged one
    others = [t for t in TOPICS if t != victim.topic]
    assert len(read_rows(list(plan.ranges), topics=others, with_body=False)) == sum(
        1 for m in records if m.topic in others
    )
    with pytest.raises(CorruptRecordError) as ref:  # the reference reader stays strict
        list(bulk.iter_records(data_dir))
    assert ref.value.offset == victim.commit_log_offset


def test_a_damaged_size_inside_a_planned_range_is_passed_over(tmp_path: Path) -> None:
    data_dir = tmp_path / "store"
    write_store(data_dir, 200)
    records = list(bulk.iter_records(data_dir))
    plan = bulk.plan_scan(data_dir, target_bytes=1 << 30)
    flip_byte(data_dir / "commitlog" / segment_name(0), records[50].commit_log_offset + 5, 0x40)  # the magic
    rows = normalized(read_rows(list(plan.ranges)))
    assert rows == [as_reference(m) for i, m in enumerate(records) if i != 50]


def test_gap_between_segments_ends_the_plan(tmp_path: Path) -> None:
    data_dir = tmp_path / "store"
    write_store(data_dir, 3000)
    starts = list_segment_starts(data_dir / "commitlog")
    assert len(starts) >= 3
    (data_dir / "commitlog" / segment_name(starts[1])).unlink()
    plan = bulk.plan_scan(data_dir)
    assert plan.stop_reason is not None and "gap" in plan.stop_reason
    assert {r.segment_start for r in plan.ranges} == {starts[0]}
    assert all(m.commit_log_offset < starts[1] for m in bulk.iter_records(data_dir))


def test_log_after_retention_starts_at_the_first_segment(tmp_path: Path) -> None:
    data_dir = tmp_path / "store"
    write_store(data_dir, 2000)
    starts = list_segment_starts(data_dir / "commitlog")
    (data_dir / "commitlog" / segment_name(starts[0])).unlink()
    plan = bulk.plan_scan(data_dir)
    assert plan.start_offset == starts[1] == plan.ranges[0].start
    assert plan.stop_reason is None
    assert plan.records == sum(1 for _ in bulk.iter_records(data_dir))


def test_reading_a_store_that_is_open_sees_what_was_put(open_store: Callable[..., MessageStore]) -> None:
    store = open_store()
    store.put_messages([message(i) for i in range(120)])
    store.wait_dispatched()
    data_dir = store.data_dir

    def files() -> list[str]:  # but a state file the store's flush thread is writing at the time
        return sorted(p.name for p in data_dir.iterdir() if not p.name.endswith(".tmp"))

    before = files()
    plan = bulk.plan_scan(data_dir)
    rows = read_rows(list(plan.ranges), topics=["Orders"])
    assert len(rows) == 40 and plan.stop_reason is None
    store.put_messages([message(i) for i in range(120, 150)])
    assert len(read_rows(list(plan.ranges), topics=["Orders"])) == 40  # the plan is a snapshot
    assert bulk.plan_scan(data_dir).records == 150
    assert files() == before  # reading wrote nothing


def test_missing_store_and_vanished_segment_are_store_errors(tmp_path: Path) -> None:
    with pytest.raises(StoreError, match="no commit log"):
        bulk.plan_scan(tmp_path / "nothing")
    data_dir = tmp_path / "store"
    write_store(data_dir, 50)
    rng = bulk.plan_ranges(data_dir)[0]
    Path(rng.path).unlink()
    with pytest.raises(StoreError, match="gone"):
        read_rows([rng])


def test_empty_store_plans_nothing(tmp_path: Path) -> None:
    data_dir = tmp_path / "store"
    with MessageStore.open(small_config(data_dir)):
        pass
    plan = bulk.plan_scan(data_dir)
    assert plan.ranges == () and plan.records == 0 and plan.stop_reason is None
    assert list(bulk.iter_records(data_dir)) == []


def test_record_schema_columns() -> None:
    assert bulk.RECORD_SCHEMA.names == [
        "topic", "queue_id", "queue_offset", "physical_offset", "store_size", "tags", "keys", "message_id",
        "properties", "body", "born_timestamp", "store_timestamp", "reconsume_times", "sys_flag", "flag",
    ]  # fmt: skip
    assert bulk.RECORD_SCHEMA.field("properties").type == pa.map_(pa.string(), pa.string())
    assert [f.name for f in bulk.RECORD_SCHEMA if f.nullable] == ["tags", "keys", "message_id"]


def test_the_plan_passes_over_a_damaged_header_and_goes_on(tmp_path: Path) -> None:
    data_dir = tmp_path / "store"
    write_store(data_dir, 3000)
    records = list(bulk.iter_records(data_dir))
    starts = list_segment_starts(data_dir / "commitlog")
    assert len(starts) >= 3
    victims = [records[50], next(m for m in records if m.commit_log_offset > starts[1] + 1000)]
    for victim in victims:
        seg_start = max(s for s in starts if s <= victim.commit_log_offset)
        flip_byte(
            data_dir / "commitlog" / segment_name(seg_start), victim.commit_log_offset - seg_start + 5, 0x40
        )
    plan = bulk.plan_scan(data_dir, target_bytes=50_000)
    assert plan.stop_reason is None and plan.records == len(records) - 2
    assert [offset for offset, _ in plan.damaged] == [v.commit_log_offset for v in victims]
    assert [length for _, length in plan.damaged] == [v.store_size for v in victims]
    gone = {v.commit_log_offset for v in victims}
    rows = normalized(read_rows(list(plan.ranges)))
    assert rows == [as_reference(m) for m in records if m.commit_log_offset not in gone]


def test_intact_at_offsets_tells_records_from_damage_and_from_offsets_outside_the_log(tmp_path: Path) -> None:
    data_dir = tmp_path / "store"
    write_store(data_dir, 3000)
    records = list(bulk.iter_records(data_dir))
    starts = list_segment_starts(data_dir / "commitlog")
    assert len(starts) >= 3
    victim = records[1000]
    seg_start = max(s for s in starts if s <= victim.commit_log_offset)
    flip_byte(
        data_dir / "commitlog" / segment_name(seg_start), victim.commit_log_offset - seg_start + 40, 0x40
    )
    end = records[-1].commit_log_offset + records[-1].store_size
    offsets = [
        records[0].commit_log_offset,
        records[999].commit_log_offset,
        victim.commit_log_offset,  # fails its CRC
        victim.commit_log_offset + 20,  # inside a record
        records[-1].commit_log_offset,
        end + (1 << 40),  # past every segment file
        -1,  # before the first
    ]
    found = bulk.intact_at_offsets(data_dir, offsets)
    assert found == [True, True, False, False, True, None, None]


def test_data_after_finds_what_follows_zeros_the_plan_took_for_the_end(tmp_path: Path) -> None:
    """Zeros where a record should start in the last segment end the plan; the bytes that are not
    zero after them show it stopped before the data did (the offline jobs refuse such a plan)."""
    data_dir = tmp_path / "store"
    write_store(data_dir, 3000)
    assert bulk.data_after(data_dir, bulk.plan_scan(data_dir).end_offset) is None
    with open(last_segment(data_dir), "ab") as f:
        f.write(bytes(4096))  # zeros only: the unwritten tail of a preallocated file
    assert bulk.data_after(data_dir, bulk.plan_scan(data_dir).end_offset) is None
    records = list(bulk.iter_records(data_dir))
    seg = last_segment(data_dir)
    victim = records[-20]
    with open(seg, "r+b") as f:
        f.seek(victim.commit_log_offset - int(seg.name))
        f.write(bytes(512))  # a zeroed sector at a record's header
    plan = bulk.plan_scan(data_dir)
    assert plan.end_offset == victim.commit_log_offset
    found = bulk.data_after(data_dir, plan.end_offset)
    assert found is not None and victim.commit_log_offset + 512 <= found < records[-1].commit_log_offset


def test_a_cleanly_stopped_log_passes_over_zeros_with_data_after_them(tmp_path: Path) -> None:
    """Planned as stopped cleanly (every file cut back to its data), zeros where a record should
    start are damage, as the broker's recovery takes them: the plan goes on at the next intact
    record. Zeros to the end of the last file are a torn tail there; a broker may be writing a log
    planned otherwise, so that plan still ends at the zeros."""
    data_dir = tmp_path / "store"
    write_store(data_dir, 3000)
    records = list(bulk.iter_records(data_dir))
    seg = last_segment(data_dir)
    victim = records[-20]
    with open(seg, "r+b") as f:
        f.seek(victim.commit_log_offset - int(seg.name))
        f.write(bytes(512))
    lost = [
        m for m in records if victim.commit_log_offset <= m.commit_log_offset < victim.commit_log_offset + 512
    ]
    plan = bulk.plan_scan(data_dir, target_bytes=50_000, stopped_cleanly=True)
    assert plan.stop_reason is None and plan.stopped_cleanly
    assert plan.records == len(records) - len(lost)
    assert [offset for offset, _ in plan.damaged] == [victim.commit_log_offset]
    gone = {m.commit_log_offset for m in lost}
    assert normalized(read_rows(list(plan.ranges))) == [
        as_reference(m) for m in records if m.commit_log_offset not in gone
    ]
    assert bulk.plan_scan(data_dir).end_offset == victim.commit_log_offset  # a live log's plan
    with open(seg, "ab") as f:
        f.write(bytes(4096))
    plan = bulk.plan_scan(data_dir, stopped_cleanly=True)
    assert plan.stop_reason is not None and "zeros" in plan.stop_reason
    assert plan.end_offset == records[-1].commit_log_offset + records[-1].store_size


def test_a_cleanly_stopped_log_passes_over_a_missing_segment_file(tmp_path: Path) -> None:
    data_dir = tmp_path / "store"
    write_store(data_dir, 3000)
    records = list(bulk.iter_records(data_dir))
    starts = list_segment_starts(data_dir / "commitlog")
    assert len(starts) >= 3
    (data_dir / "commitlog" / segment_name(starts[1])).unlink()
    plan = bulk.plan_scan(data_dir, target_bytes=50_000, stopped_cleanly=True)
    assert plan.stop_reason is None
    assert plan.damaged == ((starts[1], starts[2] - starts[1]),)
    kept = [m for m in records if not starts[1] <= m.commit_log_offset < starts[2]]
    assert plan.records == len(kept) < len(records)
    assert normalized(read_rows(list(plan.ranges))) == [as_reference(m) for m in kept]
