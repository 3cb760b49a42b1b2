"""Zeros inside the CommitLog's data and a segment file missing between others: each costs the
records it holds, never the intact records after it (real files, reopened)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from siftmq.store import MessageStore, StoreConfig
from siftmq.store import store as store_module
from siftmq.store.check import check_store
from siftmq.store.commitlog import MISSING_SEGMENT
from siftmq.testing import SteppedClock
from store_helpers import msg, small_config

ZERO_BODY = 100 * 1024  # a record whose body is zeros looks unwritten for longer than 64 KiB


def _readable(store: MessageStore, queue_id: int = 0) -> dict[int, bytes]:
    """queue offset -> body of every message of T:queue_id that reads back."""
    out: dict[int, bytes] = {}
    offset = store.get_min_offset_in_queue("T", queue_id)
    end = store.get_max_offset_in_queue("T", queue_id)
    while offset < end:  # a batch of damaged records only is passed over as a whole, not FOUND
        res = store.get_messages("g", "T", queue_id, offset, 32)
        out.update((m.queue_offset, m.body) for m in res.messages)
        assert res.next_begin_offset > offset, res.status
        offset = res.next_begin_offset
    return out


def _segment(cfg: StoreConfig, offset: int) -> tuple[Path, int]:
    size = cfg.commit_log_segment_size
    return cfg.data_dir / "commitlog" / f"{offset - offset % size:020d}", offset % size


def _zero(cfg: StoreConfig, offset: int, length: int) -> None:
    path, pos = _segment(cfg, offset)
    with open(path, "r+b") as f:
        f.seek(pos)
        f.write(bytes(length))


def _write_around_a_zero_body(
    store: MessageStore, clock: SteppedClock, *, flush_after_it: bool
) -> tuple[dict[int, bytes], int, int]:
    """20 messages, one whose body is zeros, 50 more (each a store timestamp of its own); returns
    the bodies by queue offset, the zero-body record's CommitLog offset and the next record's."""
    bodies: dict[int, bytes] = {}
    offsets: list[int] = []
    for i in range(71):
        body = bytes(ZERO_BODY) if i == 20 else f"m{i:04d}".encode() * 50
        r = store.put_message(msg(body=body))
        bodies[r.queue_offset] = body
        offsets.append(r.commit_log_offset)
        clock.advance(0.01)
        if i == 20 and flush_after_it:
            store.flush()
    return bodies, offsets[20], offsets[21]


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> SteppedClock:
    stepped = SteppedClock()
    monkeypatch.setattr(store_module, "time", stepped)
    return stepped


def _config(data_dir: Path) -> StoreConfig:
    return small_config(data_dir, max_message_size=128 * 1024)


def test_a_zeroed_sector_after_a_clean_stop_costs_its_record_only(
    tmp_path: Path, clock: SteppedClock, caplog: pytest.LogCaptureFixture
) -> None:
    # A clean stop cuts the file back to its data, so zeros in it are damage, not its unwritten end:
    # before, a zero header followed by 64 KiB of zeros ended the scan and the 50 records after it
    # were cut from the file (no copy kept, a WARNING).
    cfg = _config(tmp_path)
    with MessageStore.open(cfg) as store:
        bodies, victim, after = _write_around_a_zero_body(store, clock, flush_after_it=False)
        end = store.max_commit_log_offset
    path, pos = _segment(cfg, victim)
    size = path.stat().st_size
    _zero(cfg, victim, 512)  # the sector holding its size and magic code reads back as zeros
    damaged_bytes = path.read_bytes()[pos : pos + after - victim]
    report = check_store(tmp_path)
    assert report.torn_tail is None and [(d.offset, d.length) for d in report.damaged] == [
        (victim, after - victim)
    ]
    assert [(e.queue_offsets, e.count) for e in report.lost] == [((20,), 1)]
    with caplog.at_level("WARNING"), MessageStore.open(cfg) as store:
        assert store.max_commit_log_offset == end  # nothing cut
        assert _readable(store) == {o: b for o, b in bodies.items() if o != 20}
        assert store.damaged_reads == 1
        assert store.put_message(msg(body=b"after")).queue_offset == 71
    assert path.stat().st_size > size  # the new message went after everything that was there
    copy = tmp_path / "quarantine" / f"commitlog-{victim:020d}-{after - victim}.bin"
    assert copy.read_bytes() == damaged_bytes
    assert f"{after - victim} damaged bytes at commit log offset {victim}" in caplog.text
    assert "truncating" not in caplog.text


@pytest.mark.parametrize("flushed", [True, False], ids=["checkpointed", "past-the-checkpoint"])
def test_a_zeroed_sector_after_a_crash_costs_its_record_only(
    tmp_path: Path, clock: SteppedClock, flushed: bool, caplog: pytest.LogCaptureFixture
) -> None:
    # After a crash the segment being written ends in its preallocated zeros; zeros with intact
    # records after them are not that end. Past the checkpoint too, when what follows are other writes.
    cfg = _config(tmp_path / "data")
    crashed = _config(tmp_path / "crashed")
    store = MessageStore.open(cfg)
    bodies, victim, after = _write_around_a_zero_body(store, clock, flush_after_it=flushed)
    end = store.max_commit_log_offset
    if not flushed:
        store.commit_log.flush()  # the bytes are on disk, the checkpoint still before them
    shutil.copytree(cfg.data_dir, crashed.data_dir, ignore=shutil.ignore_patterns("lock", "*.tmp"))
    store.close()
    path, _pos = _segment(crashed, victim)
    assert path.stat().st_size == cfg.commit_log_segment_size  # preallocated: a crash's zero tail
    _zero(crashed, victim, 512)
    report = check_store(crashed.data_dir)
    assert report.torn_tail is None and [d.offset for d in report.damaged] == [victim]
    with caplog.at_level("WARNING"), MessageStore.open(crashed) as store:
        assert store.max_commit_log_offset == end  # the intact records kept; the zero tail cut
        assert _readable(store) == {o: b for o, b in bodies.items() if o != 20}
        assert store.put_message(msg(body=b"after")).queue_offset == 71
    assert (tmp_path / "crashed" / "quarantine" / f"commitlog-{victim:020d}-{after - victim}.bin").exists()
    assert "torn tail" not in caplog.text and "a write cut short" not in caplog.text


def test_bytes_past_a_crash_zero_run_are_kept_aside_before_the_tail_is_cut(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # The end after a crash is where only zeros follow; anything else is cut only once copied.
    cfg = small_config(tmp_path / "data")
    crashed = small_config(tmp_path / "crashed")
    store = MessageStore.open(cfg)
    results = [store.put_message(msg(body=bytes([i + 1]) * 3000)) for i in range(20)]
    store.flush()
    end = store.max_commit_log_offset
    shutil.copytree(cfg.data_dir, crashed.data_dir, ignore=shutil.ignore_patterns("lock", "*.tmp"))
    store.close()
    path, pos = _segment(crashed, end)
    stray = pos + 200 * 1024
    with open(path, "r+b") as f:
        f.seek(stray)
        f.write(b"not zero")
    report = check_store(crashed.data_dir)
    assert report.torn_tail is not None and report.torn_tail.offset == end
    assert report.torn_tail.length == stray + 8 - pos
    with caplog.at_level("WARNING"), MessageStore.open(crashed) as store:
        assert store.max_commit_log_offset == end
        assert len(_readable(store)) == len(results)
    copy = crashed.data_dir / "quarantine" / f"commitlog-{end:020d}-{cfg.commit_log_segment_size - pos}.bin"
    kept = copy.read_bytes()
    assert kept[stray - pos : stray - pos + 8] == b"not zero" and kept.strip(b"\0") == b"not zero"
    assert f"truncating {cfg.commit_log_segment_size - pos} bytes from offset {end}" in caplog.text


def test_zeros_at_the_end_after_a_clean_stop_are_reported_and_their_offsets_stay_taken(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cfg = _config(tmp_path)
    with MessageStore.open(cfg) as store:
        results = [store.put_message(msg(body=bytes([i + 1]) * 30_000)) for i in range(10)]
        end = store.max_commit_log_offset
    lost_from = results[7].commit_log_offset
    _zero(cfg, lost_from, end - lost_from)  # the file's last 3 records read back as zeros
    report = check_store(tmp_path)
    assert report.torn_tail is not None and (report.torn_tail.offset, report.torn_tail.length) == (
        lost_from,
        end - lost_from,
    )
    assert [(e.queue_offsets, e.count) for e in report.lost] == [((7, 8, 9), 3)]
    with caplog.at_level("WARNING"), MessageStore.open(cfg) as store:
        assert sorted(_readable(store)) == list(range(7))
        assert store.put_message(msg(body=b"after")).queue_offset == 10
    assert f"truncating {end - lost_from} bytes from offset {lost_from}" in caplog.text


def _four_segments(cfg: StoreConfig) -> dict[int, tuple[int, int, bytes]]:
    """Messages over 2 queues filling four segments; queue offset... by CommitLog offset:
    (queue, queue offset, body)."""
    placed: dict[int, tuple[int, int, bytes]] = {}
    with MessageStore.open(cfg) as store:
        i = 0
        while len(store.commit_log.segments()) < 4 or len(placed) < 170:
            body = bytes([i % 251]) * 20_000
            r = store.put_message(msg(body=body, queue_id=i % 2))
            placed[r.commit_log_offset] = (r.queue_id, r.queue_offset, body)
            i += 1
    return placed


@pytest.mark.parametrize("crash", [False, True], ids=["clean", "crash-queues-lost"])
def test_a_missing_middle_segment_costs_its_records_only(
    tmp_path: Path, crash: bool, caplog: pytest.LogCaptureFixture
) -> None:
    # Before, the segments after a missing one went to quarantine (their records no longer served)
    # and new records were written at their offsets, so they could not be put back.
    cfg = small_config(tmp_path)
    size = cfg.commit_log_segment_size
    placed = _four_segments(cfg)
    files = sorted((tmp_path / "commitlog").iterdir())
    assert len(files) == 4
    saved = tmp_path / "saved-segment"
    shutil.move(files[1], saved)
    if crash:  # and the queues rebuilt from the log: the lost records get fillers
        shutil.rmtree(tmp_path / "consumequeue")
        (tmp_path / "abort").touch()
    in_gap = {phy for phy in placed if size <= phy < 2 * size}
    report = check_store(tmp_path)
    assert report.missing_segments == [files[1].name] and not report.misplaced_segments
    assert [(d.offset, d.length, d.reason) for d in report.damaged] == [(size, size, MISSING_SEGMENT)]
    if not crash:
        assert sum(e.count for e in report.lost) == len(in_gap)
    end = max(placed) + len(placed[max(placed)][2])  # a lower bound (headers come on top)
    with caplog.at_level("WARNING"), MessageStore.open(cfg) as store:
        assert store.max_commit_log_offset > end
        for q in (0, 1):
            expected = {o: b for phy, (qq, o, b) in placed.items() if qq == q and phy not in in_gap}
            assert _readable(store, q) == expected  # every intact record, at its queue offset
        assert store.damaged_reads == len(in_gap)
        r = store.put_message(msg(body=b"after"))
        assert r.commit_log_offset >= 3 * size  # after the last segment, never inside the gap
        assert r.queue_offset == sum(1 for q, _o, _b in placed.values() if q == 0)
    assert sorted(p.name for p in (tmp_path / "commitlog").iterdir()) == [
        f.name for f in files if f != files[1]
    ]
    assert not (tmp_path / "quarantine").exists()
    assert f"commit log segment file(s) {files[1].name} missing" in caplog.text
    if crash:
        return  # the rebuilt queues have fillers for the lost records
    shutil.move(saved, files[1])  # put back: its records are read again
    with MessageStore.open(cfg) as store:
        assert _readable(store, 0)[placed[min(in_gap)][1]] == placed[min(in_gap)][2]
        assert len(_readable(store, 0)) + len(_readable(store, 1)) == len(placed) + 1
    assert check_store(tmp_path).ok


def test_a_file_after_a_gap_with_no_record_is_still_put_aside(tmp_path: Path) -> None:
    cfg = small_config(tmp_path)
    with MessageStore.open(cfg) as store:
        bodies = {
            store.put_message(msg(body=bytes([i]) * 1000)).queue_offset: bytes([i]) * 1000 for i in range(5)
        }
    stray = tmp_path / "commitlog" / f"{3 * cfg.commit_log_segment_size:020d}"
    stray.write_bytes(b"garbage" * 100)
    report = check_store(tmp_path)
    assert report.misplaced_segments == [stray.name] and not report.missing_segments
    with MessageStore.open(cfg) as store:
        assert _readable(store) == bodies
        assert store.put_message(msg(body=b"after")).commit_log_offset < cfg.commit_log_segment_size
    assert (tmp_path / "quarantine" / f"commitlog-segment-{stray.name}").read_bytes() == b"garbage" * 100
