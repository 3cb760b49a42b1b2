"""Recovery checks every ConsumeQueue entry (and extension unit) against the record it indexes:
one damaged index byte costs no intact message (see siftmq.store.indexcheck)."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from siftmq.store import CqExtUnit, DispatchRequest, MessageStore, StoreConfig, tags_code_of
from siftmq.store import store as store_module
from siftmq.store.consumequeue import CQ_STORE_UNIT_SIZE
from siftmq.store.consumequeue_ext import CHECK_MARKER, ConsumeQueueExt
from siftmq.store.recovery import Checkpoint
from store_helpers import flip_byte, msg, small_config

N = 100  # messages in queue T:0, tags alternating "a", "b"; 16 entries a ConsumeQueue file


class TagFilter:
    """Tag subscription: index stage on the entry's tags code, exact stage on the record."""

    def __init__(self, tag: str) -> None:
        self.tag = tag
        self.code = tags_code_of(tag)

    def is_matched_by_consume_queue(self, tags_code: int | None, ext: CqExtUnit | None) -> bool:
        return tags_code is None or tags_code == self.code

    def is_matched_by_commit_log(self, properties: Mapping[str, str]) -> bool:
        return properties.get("TAGS") == self.tag


class OnesBitmaps:
    """A bitmap dispatcher giving every record a full bitmap."""

    def compute_bitmaps(self, requests: Sequence[DispatchRequest]) -> list[bytes | None]:
        return [b"\xff" * 14 for _ in requests]


def _tag(i: int) -> str:
    return "ab"[i % 2]


def _write(cfg: StoreConfig, *, bitmaps: bool = False) -> None:
    store = MessageStore.open(cfg, bitmap_dispatcher=OnesBitmaps() if bitmaps else None)
    for start in range(0, N, 10):
        store.put_messages([msg(body=f"m{i}".encode(), TAGS=_tag(i)) for i in range(start, start + 10)])
    store.close()


def _entry_at(cfg: StoreConfig, queue_offset: int) -> tuple[Path, int]:
    """The ConsumeQueue file of T:0 holding ``queue_offset``, and the entry's position in it."""
    per_file = cfg.consume_queue_entries_per_file
    first = queue_offset - queue_offset % per_file
    path = cfg.data_dir / "consumequeue" / "T" / "0" / f"{first * CQ_STORE_UNIT_SIZE:020d}"
    return path, (queue_offset - first) * CQ_STORE_UNIT_SIZE


def _read(store: MessageStore, tag: str | None, queue_id: int = 0) -> list[bytes]:
    """Bodies a consumer of T:``queue_id`` starting at offset 0 gets, with a tag filter (None: all)."""
    flt = TagFilter(tag) if tag is not None else None
    got: list[bytes] = []
    offset = 0
    while offset < store.get_max_offset_in_queue("T", queue_id):
        res = store.get_messages("g", "T", queue_id, offset, 32, flt)
        got += [m.body for m in res.messages]
        assert res.next_begin_offset > offset, res.status
        offset = res.next_begin_offset
    return got


def _expected(tag: str | None) -> list[bytes]:
    return [f"m{i}".encode() for i in range(N) if tag is None or _tag(i) == tag]


@pytest.mark.parametrize("crash", [False, True])
@pytest.mark.parametrize(
    ("field", "byte"),
    [("tags_code", 12 + 7), ("size", 8 + 3), ("commit_log_offset", 7), ("commit_log_offset", 2)],
)
def test_a_damaged_entry_is_rewritten_from_its_record(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, field: str, byte: int, crash: bool
) -> None:
    cfg = small_config(tmp_path / "data")
    _write(cfg)
    damaged = 40  # tag "a"
    path, pos = _entry_at(cfg, damaged)
    flip_byte(path, pos + byte)
    if crash:
        (cfg.data_dir / "abort").touch()
    with caplog.at_level(logging.ERROR), MessageStore.open(cfg) as store:
        assert _read(store, "a") == _expected("a")
        assert _read(store, None) == _expected(None)
        assert store.damaged_reads == 0
        assert store.index_repairs.entries == 1
    assert [r.getMessage() for r in caplog.records if r.name == "siftmq.store.indexcheck"] == [
        "T:0: 1 of 100 index entries and 0 extension units disagreed with their records and were "
        "rewritten from them (the units without their filter bitmaps: filters evaluate those "
        "messages exactly)"
    ]
    with MessageStore.open(cfg) as store:  # repaired on disk: nothing to do at the next start
        assert store.index_repairs.entries == 0
        assert _read(store, "a") == _expected("a")


@pytest.mark.parametrize("byte", [8 + 3, 7])
def test_damage_to_a_queues_first_entry_keeps_its_min_offset(tmp_path: Path, byte: int) -> None:
    """The size (read as a hole: the queue seemed to start at 1) or the CommitLog offset of entry 0."""
    cfg = small_config(tmp_path / "data")
    _write(cfg)
    path, pos = _entry_at(cfg, 0)
    flip_byte(path, pos + byte, 0x80)
    with MessageStore.open(cfg) as store:
        assert store.get_min_offset_in_queue("T", 0) == 0
        assert _read(store, "a") == _expected("a")
        assert store.damaged_reads == 0


@pytest.mark.parametrize("how", ["deleted", "emptied"])
def test_a_queues_missing_first_file_is_rebuilt(tmp_path: Path, how: str) -> None:
    cfg = small_config(tmp_path / "data")
    _write(cfg)
    path, _pos = _entry_at(cfg, 0)
    if how == "deleted":
        path.unlink()
    else:
        path.write_bytes(b"")
    with MessageStore.open(cfg) as store:
        assert store.get_min_offset_in_queue("T", 0) == 0
        assert store.get_max_offset_in_queue("T", 0) == N
        assert _read(store, "b") == _expected("b")
        assert _read(store, None) == _expected(None)
        # an emptied file cuts the queue's later files at load: every queue is rebuilt, as before
        assert store.index_repairs.queues_rebuilt == (how == "deleted")
    with MessageStore.open(cfg) as store:
        assert store.index_repairs.queues_rebuilt == 0
        assert _read(store, None) == _expected(None)


def test_the_check_does_not_take_the_place_of_redispatch(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """After a crash the queues miss the tail the checkpoint did not cover; one of them also lost
    its first file. Both are made whole, and the other queue keeps its entries."""
    cfg = small_config(tmp_path / "data")
    store = MessageStore.open(cfg)
    store.put_messages([msg(body=f"m{i}".encode(), TAGS=_tag(i)) for i in range(N)])
    store.put_messages([msg(body=f"q{i}".encode(), queue_id=1) for i in range(40)])
    store.close()
    for queue_id, keep in ((0, 90), (1, 30)):
        cq_dir = cfg.data_dir / "consumequeue" / "T" / str(queue_id)
        last = sorted(cq_dir.iterdir())[-1]
        start = int(last.name) // CQ_STORE_UNIT_SIZE
        last.write_bytes(last.read_bytes()[: (keep - start) * CQ_STORE_UNIT_SIZE])
    _entry_at(cfg, 0)[0].unlink()
    (cfg.data_dir / "abort").touch()
    checkpoint = cfg.data_dir / "checkpoint"
    saved = Checkpoint.load(checkpoint)
    assert saved is not None
    Checkpoint(saved.commit_log_flushed_offset, 0, saved.max_store_timestamp).save(checkpoint)
    with caplog.at_level(logging.ERROR), MessageStore.open(cfg) as store:
        assert _read(store, None) == _expected(None)
        assert _read(store, None, queue_id=1) == [f"q{i}".encode() for i in range(40)]
        assert store.index_repairs.queues_rebuilt == 1
    assert "rebuilding them all" not in caplog.text


# a unit: store timestamp (8 bytes), tags code (8), bitmap length (2), bitmap check (4), bitmap (14);
# in a store made before the check: the same without it
_CHECKED_UNIT = {"store timestamp": 0, "tags code": 8, "length": 16, "check": 18, "bitmap": 22, "size": 36}
_OLD_UNIT = {"store timestamp": 0, "tags code": 8, "length": 16, "bitmap": 18, "size": 32}


@pytest.mark.parametrize(
    ("what", "field", "at", "mask"),
    [
        ("store timestamp", "store timestamp", 5, 0x5A),
        ("tags code", "tags code", 7, 0x5A),
        ("bitmap length shortened", "length", 1, 0x0E ^ 0x06),
        ("bitmap length past the size", "length", 0, 0x80),
        ("a bitmap bit cleared", "bitmap", 3, 0x04),
        ("a bitmap byte damaged", "bitmap", 13, 0xA5),
        ("the bitmap check", "check", 2, 0x10),
    ],
)
def test_a_damaged_extension_unit_loses_its_bitmap(
    tmp_path: Path, what: str, field: str, at: int, mask: int
) -> None:
    cfg = small_config(tmp_path / "data")
    _write(cfg, bitmaps=True)
    unit_size = _CHECKED_UNIT["size"]
    damaged = 41
    ext_file = cfg.data_dir / "consumequeue_ext" / "T" / "0" / f"{32 * unit_size:020d}"
    flip_byte(ext_file, (damaged - 32) * unit_size + _CHECKED_UNIT[field] + at, mask)
    with MessageStore.open(cfg, bitmap_dispatcher=OnesBitmaps()) as store:
        cq = store.find_consume_queue("T", 0)
        assert cq is not None and cq.ext is not None and cq.ext.unit_size == unit_size
        record = store.get_messages("g", "T", 0, damaged, 1).messages[0]
        assert cq.ext.get(damaged) == CqExtUnit(record.store_timestamp, tags_code_of("b"), None), what
        assert cq.ext.get(damaged + 1) == CqExtUnit(record.store_timestamp, tags_code_of("a"), b"\xff" * 14)
        assert store.index_repairs.ext_units == 1
        assert _read(store, "b") == _expected("b")


def test_a_damaged_bitmap_reads_as_none_before_the_next_start(tmp_path: Path) -> None:
    """Damage while the store runs: every read passes over the bitmap (the filter evaluates the
    message exactly) until recovery rewrites the unit at the next start."""
    cfg = small_config(tmp_path / "data")
    unit_size, bitmap = _CHECKED_UNIT["size"], _CHECKED_UNIT["bitmap"]
    with MessageStore.open(cfg, bitmap_dispatcher=OnesBitmaps()) as store:
        store.put_messages([msg(body=f"m{i}".encode(), TAGS=_tag(i)) for i in range(20)])
        store.wait_dispatched(20)
        cq = store.find_consume_queue("T", 0)
        assert cq is not None and cq.ext is not None
        flip_byte(cq.ext.log.directory / f"{0:020d}", 7 * unit_size + bitmap + 5, 0x01)
        expected = [0 if i == 7 else 14 for i in range(20)]
        block, lazy = cq.ext.read_block(0, 20), cq.ext.lazy_block(0, 20)
        assert block is not None and [int(n) for n in block.bitmap_lengths] == expected
        assert lazy is not None and [int(n) for n in lazy.bitmap_lengths] == expected
        assert [cq.ext.get(i) is not None for i in (7, 8)] == [True, True]
        assert [cq.ext.get(i).filter_bitmap for i in (7, 8)] == [None, b"\xff" * 14]  # type: ignore[union-attr]


def test_a_store_made_before_the_bitmap_check_keeps_its_units(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Units written without a check (as a store made before it has them) are read as before, the
    store is not marked, and the checks it could make (a shortened length) still hold."""
    cfg = small_config(tmp_path / "data")
    with monkeypatch.context() as old_version:
        old_version.setattr(store_module, "units_checked", lambda root, mark_new: False)
        _write(cfg, bitmaps=True)
    ext_root = cfg.data_dir / "consumequeue_ext"
    assert not (ext_root / CHECK_MARKER).exists()
    unit_size = _OLD_UNIT["size"]
    damaged = 41
    at = (damaged - 32) * unit_size + _OLD_UNIT["length"] + 1
    flip_byte(ext_root / "T" / "0" / f"{32 * unit_size:020d}", at, 0x08)
    with MessageStore.open(cfg, bitmap_dispatcher=OnesBitmaps()) as store:
        cq = store.find_consume_queue("T", 0)
        assert cq is not None and cq.ext is not None and cq.ext.unit_size == unit_size
        record = store.get_messages("g", "T", 0, damaged, 1).messages[0]
        assert cq.ext.get(damaged) == CqExtUnit(record.store_timestamp, tags_code_of("b"), None)
        assert cq.ext.get(damaged + 1) == CqExtUnit(record.store_timestamp, tags_code_of("a"), b"\xff" * 14)
        assert store.index_repairs.ext_units == 1
        store.put_messages([msg(body=b"later", TAGS="a")])
        store.wait_dispatched(N + 1)
        later = cq.ext.get(N)
        assert later is not None and later.filter_bitmap == b"\xff" * 14
    assert not (ext_root / CHECK_MARKER).exists()


def test_a_new_store_marks_its_extension_units_checked(tmp_path: Path) -> None:
    cfg = small_config(tmp_path / "data")
    _write(cfg, bitmaps=True)
    assert (cfg.data_dir / "consumequeue_ext" / CHECK_MARKER).exists()
    with MessageStore.open(cfg) as store:  # and the marker is kept
        cq = store.find_consume_queue("T", 0)
        assert cq is not None and cq.ext is not None and cq.ext.checked


@settings(max_examples=300, deadline=None)
@given(
    bitmap=st.binary(min_size=0, max_size=14),
    at=st.integers(min_value=16, max_value=35),
    mask=st.integers(min_value=1, max_value=255),
)
def test_any_one_damaged_byte_of_a_bitmap_its_length_or_its_check_is_told(
    tmp_path_factory: pytest.TempPathFactory, bitmap: bytes, at: int, mask: int
) -> None:
    ext = ConsumeQueueExt(tmp_path_factory.mktemp("ext"), 16, 14, checked=True)
    ext.log.load()
    try:
        unit = bytearray(ext.encode(1_700_000_000_000, 7, bitmap))
        assert len(unit) == ext.unit_size == 36
        ext.put_units(0, [bytes(unit)])
        assert ext.bitmap_intact(ext.read_units(0, 1)).tolist() == [True]
        assert ext.bitmap_lengths_of(ext.read_units(0, 1)).tolist() == [len(bitmap)]
        unit[at] ^= mask
        ext.log.overwrite(0, bytes(unit))
        assert ext.bitmap_intact(ext.read_units(0, 1)).tolist() == [False]
        assert ext.bitmap_lengths_of(ext.read_units(0, 1)).tolist() == [0]
    finally:
        ext.log.close()


@settings(max_examples=50, deadline=None)
@given(
    size=st.sampled_from([1, 14, 4096]),
    data=st.data(),
)
def test_units_encoded_one_at_a_time_and_as_a_block_are_the_same_bytes(
    tmp_path_factory: pytest.TempPathFactory, size: int, data: st.DataObject
) -> None:
    """The check computed for one unit (a big-endian number modulo the prime) and for a block
    (numpy's weighted sum) agree, up to the largest bitmap."""
    ext = ConsumeQueueExt(tmp_path_factory.mktemp("ext"), 16, size, checked=True)
    bitmaps = data.draw(st.lists(st.none() | st.binary(min_size=0, max_size=size), min_size=40, max_size=40))
    stamps, codes = list(range(1, 41)), [-(2**31)] * 40
    block = ext.encode_columns(stamps, codes, bitmaps)
    assert block == b"".join(map(ext.encode, stamps, codes, bitmaps))


def test_a_checked_bitmap_larger_than_its_check_is_exact_for_is_refused(tmp_path: Path) -> None:
    ConsumeQueueExt(tmp_path / "a", 16, 4096, checked=True)
    ConsumeQueueExt(tmp_path / "b", 16, 4097, checked=False)  # no check: the old bound
    with pytest.raises(ValueError, match="at most 4096 bytes"):
        ConsumeQueueExt(tmp_path / "c", 16, 4097, checked=True)
