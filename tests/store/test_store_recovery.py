"""Recovery: torn tails, corrupted bytes, lost indexes, garbage segments (hypothesis)."""

from __future__ import annotations

import errno
import json
import os
import shutil
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from siftmq.errors import ConfigError, StoreError
from siftmq.store import GetMessageStatus, MessageStore, StoreConfig, codec
from siftmq.store import store as store_module
from siftmq.store.check import check_store
from siftmq.store.commitlog import AppendedRecord
from siftmq.store.recovery import Checkpoint
from siftmq.testing import SteppedClock
from store_helpers import flip_byte, msg, small_config


def _write(cfg: StoreConfig, n: int, *, crash: bool, body_size: int = 3000) -> dict[int, bytes]:
    """Write ``n`` messages over 2 queues; leave the abort marker if ``crash``."""
    store = MessageStore.open(cfg)
    bodies: dict[int, bytes] = {}
    for i in range(n):
        body = bytes([i % 251]) * (body_size + i)
        r = store.put_message(msg(body=body, queue_id=i % 2, TAGS=f"t{i % 3}", UNIQ_KEY=f"u{i}"))
        bodies[r.commit_log_offset] = body
    store.close()
    if crash:
        (cfg.data_dir / "abort").touch()
    return bodies


def _read_all(store: MessageStore) -> list[tuple[int, int, bytes]]:
    """(queue_id, queue_offset, body) of every readable message; checks index/log agreement."""
    out = []
    for topic, q in store.queues():
        offset = store.get_min_offset_in_queue(topic, q)
        while True:
            res = store.get_messages("g", topic, q, offset, 32)
            for m in res.messages:
                assert (m.topic, m.queue_id) == (topic, q)
                out.append((q, m.queue_offset, m.body))
            if res.status is not GetMessageStatus.FOUND:
                break
            offset = res.next_begin_offset
    return out


def _commitlog_files(data: Path) -> list[Path]:
    return sorted((data / "commitlog").iterdir())


@pytest.mark.parametrize("crash", [True, False])
def test_torn_tail_is_truncated(tmp_path: Path, crash: bool) -> None:
    cfg = small_config(tmp_path)
    bodies = _write(cfg, 40, crash=crash)
    last = _commitlog_files(tmp_path)[-1]
    size = last.stat().st_size
    os.truncate(last, size - 100)  # tear the last record
    with MessageStore.open(cfg) as store:
        got = _read_all(store)
        assert len(got) == 39
        assert store.max_commit_log_offset == max(bodies)
        assert {b for _q, _o, b in got} == set(list(bodies.values())[:39])
        r = store.put_message(msg(body=b"after", queue_id=1))
        assert r.commit_log_offset == max(bodies)
        # message 39 (queue 1, offset 19) was lost; a consumer may have read it, so its offset stays
        # taken (given to "after", a consumer resuming at 20 would pass over it)
        assert r.queue_offset == 20
        assert [m.body for m in store.get_messages("g", "T", 1, 20, 8).messages] == [b"after"]
        assert store.get_messages("g", "T", 1, 19, 8).messages[0].body == b"after"  # 19 passed over
    [copy] = (tmp_path / "quarantine").iterdir()  # the torn bytes are kept aside
    assert copy.name.startswith(f"commitlog-{max(bodies):020d}-") and copy.stat().st_size == size - 100 - (
        max(bodies) - int(last.name)
    )


@pytest.mark.parametrize("crash", [True, False])
def test_a_corrupted_byte_costs_that_record_only(
    tmp_path: Path, crash: bool, caplog: pytest.LogCaptureFixture
) -> None:
    cfg = small_config(tmp_path)
    bodies = _write(cfg, 20, crash=crash)
    offsets = sorted(bodies)
    victim, after = offsets[10], offsets[11]  # message 10: queue 0, offset 5
    end = offsets[-1] + len(bodies[offsets[-1]])  # (a lower bound: headers come on top)
    flip_byte(_commitlog_files(tmp_path)[0], victim + 200, 0x40)
    with caplog.at_level("ERROR"), MessageStore.open(cfg) as store:
        assert store.max_commit_log_offset > end  # nothing truncated
        got = _read_all(store)
        assert [(q, o) for q, o, _b in got if q == 0] == [(0, o) for o in range(10) if o != 5]
        assert sorted(b for _q, _o, b in got) == sorted(bodies[o] for o in offsets if o != victim)
        assert store.damaged_reads == 1
        assert store.query_message_by_uniq_key("u12") is not None
        r = store.put_message(msg(body=b"after", queue_id=0))
        assert r.queue_offset == 10  # the damaged record keeps its queue offset
    copy = tmp_path / "quarantine" / f"commitlog-{victim:020d}-{after - victim}.bin"
    damaged = bytearray((tmp_path / "commitlog" / f"{0:020d}").read_bytes()[victim:after])
    assert copy.read_bytes() == bytes(damaged)
    assert f"{after - victim} damaged bytes at commit log offset {victim}" in caplog.text
    assert "segment 00000000000000000000" in caplog.text and "truncating" not in caplog.text


def test_records_lost_to_damage_keep_their_queue_offsets_when_the_queues_are_rebuilt(tmp_path: Path) -> None:
    cfg = small_config(tmp_path)
    bodies = _write(cfg, 30, crash=False)
    offsets = sorted(bodies)
    with MessageStore.open(cfg) as store:
        expected = _read_all(store)
    for i in (4, 6, 7):  # queue 0 offsets 2 and 3, queue 1 offset 3
        flip_byte(_commitlog_files(tmp_path)[0], offsets[i] + 150, 0x40)
    shutil.rmtree(tmp_path / "consumequeue")
    (tmp_path / "abort").touch()
    with MessageStore.open(cfg) as store:
        got = _read_all(store)
        assert got == [e for e in expected if (e[0], e[1]) not in {(0, 2), (0, 3), (1, 3)}]
        assert store.damaged_reads == 3  # the filler entries, passed over and counted
        assert store.put_message(msg(body=b"x", queue_id=0)).queue_offset == 15


def test_lost_consume_queues_are_rebuilt(tmp_path: Path) -> None:
    cfg = small_config(tmp_path)
    _write(cfg, 50, crash=False)
    with MessageStore.open(cfg) as store:
        expected = _read_all(store)
    shutil.rmtree(tmp_path / "consumequeue" / "T" / "1")
    with MessageStore.open(cfg) as store:
        assert _read_all(store) == expected


def test_stale_consume_queue_tail_is_cut_and_its_offset_stays_taken(tmp_path: Path) -> None:
    """An index entry past the log's end (the log's tail lost in a crash) is cut, a torn partial
    entry dropped; the whole entry's queue offset stays taken (a consumer may have read it)."""
    cfg = small_config(tmp_path)
    _write(cfg, 30, crash=True)
    cq_file = sorted((tmp_path / "consumequeue" / "T" / "0").iterdir())[-1]
    with open(cq_file, "ab") as f:
        f.write(b"\x00\x00\x00\x00\x7f\x00\x00\x00" + b"\x00\x00\x01\x00" + bytes(8) + b"\x01\x02\x03")
    with MessageStore.open(cfg) as store:
        assert store.get_max_offset_in_queue("T", 0) == 16
        assert len(_read_all(store)) == 30
        assert store.put_message(msg(body=b"next", queue_id=0)).queue_offset == 16


def test_crash_rebuilds_index_past_checkpoint(tmp_path: Path) -> None:
    cfg = small_config(tmp_path, build_key_index=False)
    _write(cfg, 30, crash=True)
    # lose the last index entries, as if they were never flushed
    cq_file = sorted((tmp_path / "consumequeue" / "T" / "0").iterdir())[-1]
    os.truncate(cq_file, cq_file.stat().st_size - 20 * 3)
    (tmp_path / "checkpoint").unlink()
    with MessageStore.open(cfg) as store:
        assert store.get_max_offset_in_queue("T", 0) == 15
        assert len(_read_all(store)) == 30


_garbage = st.binary(min_size=1, max_size=3000)
# A position drawn without the file's size: sizes differ from run to run (the checkpoint holds a
# store timestamp), and hypothesis needs every replay of an example to draw the same way.
_anywhere = st.integers(0, 2**32)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_random_damage_never_yields_a_corrupted_message(
    tmp_path_factory: pytest.TempPathFactory, data: st.DataObject
) -> None:
    root = tmp_path_factory.mktemp("fuzz")
    cfg = small_config(root, consume_queue_entries_per_file=8, max_message_size=16 * 1024)
    crash = data.draw(st.booleans(), label="crash")
    bodies = _write(cfg, 40, crash=crash, body_size=data.draw(st.integers(10, 12_000), label="body_size"))
    valid = set(bodies.values())
    files = sorted(p for p in root.rglob("*") if p.is_file() and p.name not in ("lock", "abort"))
    for _ in range(data.draw(st.integers(1, 4), label="damages")):
        target = data.draw(st.sampled_from(files), label="file")
        size = target.stat().st_size
        action = data.draw(st.sampled_from(["flip", "truncate", "garbage", "append"]), label="action")
        if action == "flip" and size:
            pos = data.draw(_anywhere, label="pos") % size
            with open(target, "r+b") as f:
                f.seek(pos)
                byte = f.read(1)[0]
                f.seek(pos)
                f.write(bytes([byte ^ data.draw(st.integers(1, 255), label="xor")]))
        elif action == "truncate":
            os.truncate(target, data.draw(_anywhere, label="len") % (size + 1))
        elif action == "garbage":
            target.write_bytes(data.draw(_garbage, label="garbage"))
        else:
            with open(target, "ab") as f:
                f.write(data.draw(_garbage, label="tail"))
    if data.draw(st.booleans(), label="extra_segment"):
        (root / "commitlog" / f"{5 << 20:020d}").write_bytes(data.draw(_garbage, label="segment"))
    try:
        store = MessageStore.open(cfg)
    except (StoreError, ConfigError):  # refused to open (a damaged layout.json names its remedy)
        return
    try:
        for topic, q in store.queues():
            offset = store.get_min_offset_in_queue(topic, q)
            for _ in range(100):
                try:
                    res = store.get_messages("g", topic, q, offset, 32)
                except StoreError:
                    offset += 1
                    continue
                for m in res.messages:
                    assert m.body in valid
                if res.status is not GetMessageStatus.FOUND:
                    break
                offset = res.next_begin_offset
        for off in list(bodies)[:10]:
            try:
                m = store.look_message_by_offset(off)
            except StoreError:
                continue
            assert m is None or m.body == bodies[off]
        r = store.put_message(msg(body=b"still writable"))
        m = store.look_message_by_offset(r.commit_log_offset)
        assert m is not None and m.body == b"still writable"
    finally:
        store.close()
    with MessageStore.open(cfg) as again:  # and it reopens cleanly
        assert again.max_commit_log_offset >= r.commit_log_offset + r.size


def test_the_largest_store_timestamp_survives_restarts_and_crashes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = small_config(tmp_path, build_key_index=False)
    clock = SteppedClock(3600 * 10**9)  # an hour ahead, then the wall clock steps back
    monkeypatch.setattr(store_module, "time", clock)
    with MessageStore.open(cfg) as store:
        assert store.max_store_timestamp == 0
        early = store.put_message(msg(body=b"x" * 3000)).store_timestamp
        clock.offset_ns = 0
        later = [store.put_message(msg(body=b"x" * 3000)).store_timestamp for _ in range(600)]
        assert store.max_store_timestamp == early > max(later)
    assert len(_commitlog_files(tmp_path)) > 1  # the largest is in a segment a clean start does not scan
    with MessageStore.open(cfg) as store:  # clean stop: from the checkpoint
        assert store.max_store_timestamp == early
    (tmp_path / "abort").touch()
    (tmp_path / "checkpoint").unlink()
    with MessageStore.open(cfg) as store:  # a crash without a checkpoint: the whole log is scanned
        assert store.max_store_timestamp == early
    body = json.loads((tmp_path / "checkpoint").read_bytes())["body"]
    assert json.loads(body)["max_store_timestamp"] == early


def _crashed_copy(cfg: StoreConfig, n: int, target: Path) -> tuple[dict[int, bytes], int]:
    """Write ``n`` messages, copy the open store's files to ``target`` (a crash: the abort marker
    and the preallocated tail of the segment being written are there), then close the original.

    Returns the bodies by CommitLog offset and the CommitLog's end.
    """
    store = MessageStore.open(cfg)
    bodies: dict[int, bytes] = {}
    for start in range(0, n, 10):  # one at a time (map writes), then a batch over 16 KiB (pwrite)
        messages = [
            msg(body=bytes([i % 251]) * (3000 + i), queue_id=i % 2, TAGS=f"t{i % 3}", UNIQ_KEY=f"u{i}")
            for i in range(start, min(n, start + 10))
        ]
        results = [store.put_message(m) for m in messages[:4]] + store.put_messages(messages[4:])
        for m, r in zip(messages, results, strict=True):
            bodies[r.commit_log_offset] = m.body
    store.flush()
    end = store.max_commit_log_offset
    active = _commitlog_files(cfg.data_dir)[-1]
    assert active.stat().st_size == cfg.commit_log_segment_size  # preallocated while open
    # (a checkpoint being written meanwhile is a .tmp file that may vanish under the copy)
    shutil.copytree(cfg.data_dir, target, ignore=shutil.ignore_patterns("lock", "*.tmp"))
    store.close()
    files = _commitlog_files(cfg.data_dir)
    # at rest every file holds its data only: full ones up to their blank marker, the last to the end
    assert all(p.stat().st_size < cfg.commit_log_segment_size for p in files[:-1])
    assert int(files[-1].name) + files[-1].stat().st_size == end
    return bodies, end


def test_preallocated_tail_after_a_crash_is_cut_quietly(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cfg = small_config(tmp_path / "data")
    bodies, end = _crashed_copy(cfg, 700, tmp_path / "crashed")
    assert len(_commitlog_files(cfg.data_dir)) >= 3  # the log rolled over
    crashed = small_config(tmp_path / "crashed")
    assert (crashed.data_dir / "abort").exists()
    with caplog.at_level("WARNING"), MessageStore.open(crashed) as store:
        assert store.max_commit_log_offset == end
        assert sorted(b for _q, _o, b in _read_all(store)) == sorted(bodies.values())
        r = store.put_message(msg(body=b"after", queue_id=1))
        assert r.commit_log_offset == end and r.queue_offset == 350
    assert not [rec for rec in caplog.records if rec.levelname == "ERROR"], caplog.text
    last = _commitlog_files(crashed.data_dir)[-1]
    assert int(last.name) + last.stat().st_size == r.commit_log_offset + r.size


def test_zeroed_header_with_data_after_it_is_damage(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    cfg = small_config(tmp_path / "data")
    bodies, end = _crashed_copy(cfg, 30, tmp_path / "crashed")
    offsets = sorted(bodies)
    crashed = small_config(tmp_path / "crashed")
    with open(_commitlog_files(crashed.data_dir)[0], "r+b") as f:
        f.seek(offsets[20])
        f.write(bytes(8))  # size and magic code of message 20
    with caplog.at_level("WARNING"), MessageStore.open(crashed) as store:
        assert store.max_commit_log_offset == end
        assert sorted(b for _q, _o, b in _read_all(store)) == sorted(
            bodies[o] for o in offsets if o != offsets[20]
        )
    assert f"{offsets[21] - offsets[20]} damaged bytes at commit log offset {offsets[20]}" in caplog.text
    assert "torn tail" not in caplog.text  # only the preallocated zeros after the end are cut


def _as_if_killed_during(cfg: StoreConfig, flushed: int, written: list[AppendedRecord]) -> None:
    """Make a cleanly closed store look killed while it wrote ``written`` (records of queue 1):
    the checkpoint back at ``flushed``, the records never indexed, the abort marker there, and
    the segment preallocated to its full size again."""
    cq_file = sorted((cfg.data_dir / "consumequeue" / "T" / "1").iterdir())[-1]
    os.truncate(cq_file, cq_file.stat().st_size - 20 * len(written))
    Checkpoint(flushed, flushed).save(cfg.data_dir / "checkpoint")
    (cfg.data_dir / "abort").touch()
    os.truncate(_commitlog_files(cfg.data_dir)[-1], cfg.commit_log_segment_size)


@pytest.mark.parametrize(
    "unfinished", ["first header", "first bytes", "first bytes into its stamp", "last record"]
)
def test_a_write_a_crash_cut_short_is_cut_whole(
    tmp_path: Path, unfinished: str, caplog: pytest.LogCaptureFixture
) -> None:
    # A write stores its first 8 bytes (size, magic code) last; a kill before that can leave the
    # later records of a batch complete. They were never acknowledged, and keeping them would leave
    # the first record's queue offset indexed with no record behind it.
    cfg = small_config(tmp_path)
    with MessageStore.open(cfg) as store:
        before = [store.put_message(msg(body=bytes([i]) * 2000, queue_id=i % 3)) for i in range(9)]
        store.flush()
        flushed = store.max_commit_log_offset
        host = codec.encode_host("127.0.0.1", 1)
        cut = store.put_batch("T", 1, [(bytes([60 + j]) * 3000, {"TAGS": "b"}, 0, host) for j in range(3)])
    start = cut[0].commit_log_offset
    with open(_commitlog_files(tmp_path)[-1], "r+b") as f:
        f.seek(start)
        # memcpy may store its first bytes last, as far as into the store timestamp at byte 60 (a
        # kill -9 in the kill -9 test left 63 bytes unwritten: the stamp's top 3 bytes)
        zeros = {"first bytes": 40, "first bytes into its stamp": 63}.get(unfinished, 8)
        f.write(bytes(zeros))
        if unfinished == "last record":
            f.seek(cut[-1].commit_log_offset + cut[-1].size - 128)
            f.write(bytes(128))
    _as_if_killed_during(cfg, flushed, cut)
    report = check_store(tmp_path)
    assert report.torn_tail is not None and report.torn_tail.offset == start and not report.damaged
    with caplog.at_level("WARNING"), MessageStore.open(cfg) as store:
        assert store.max_commit_log_offset == start
        assert sorted((q, o) for q, o, _b in _read_all(store)) == sorted(
            (r.queue_id, r.queue_offset) for r in before
        )
        assert [store.get_max_offset_in_queue("T", q) for q in range(3)] == [3, 3, 3]
        assert store.damaged_reads == 0
        r = store.put_message(msg(body=b"after", queue_id=1))
        assert (r.commit_log_offset, r.queue_offset) == (start, 3)
        assert [m.queue_offset for m in store.commit_log.scan(0) if m.queue_id == 1] == [0, 1, 2, 3]
        assert store.commit_log.damaged == []
    assert "damaged bytes at" not in caplog.text and "a write cut short" in caplog.text
    [copy] = (tmp_path / "quarantine").iterdir()  # the cut bytes are kept aside
    assert copy.name.startswith(f"commitlog-{start:020d}-")


def test_a_bad_header_past_the_checkpoint_followed_by_later_writes_is_damage(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    cfg = small_config(tmp_path)
    clock = SteppedClock()
    monkeypatch.setattr(store_module, "time", clock)
    with MessageStore.open(cfg) as store:
        for i in range(3):
            store.put_message(msg(body=bytes([i]) * 2000, queue_id=1))
        store.flush()
        flushed = store.max_commit_log_offset
        victim = store.put_message(msg(body=b"v" * 2000, queue_id=1))
        clock.advance(1.0)  # acknowledged writes of their own come after it
        later = [store.put_message(msg(body=bytes([9]) * 2000, queue_id=1)) for _ in range(2)]
        end = store.max_commit_log_offset
    with open(_commitlog_files(tmp_path)[-1], "r+b") as f:
        f.seek(victim.commit_log_offset)
        f.write(bytes(8))
    _as_if_killed_during(cfg, flushed, [])
    with caplog.at_level("WARNING"), MessageStore.open(cfg) as store:
        assert store.max_commit_log_offset == end  # nothing acknowledged is cut
        assert [o for _q, o, _b in _read_all(store)] == [0, 1, 2, 4, 5]
        assert store.put_message(msg(body=b"after", queue_id=1)).queue_offset == later[-1].queue_offset + 1
    assert f"damaged bytes at commit log offset {victim.commit_log_offset}" in caplog.text


def test_writes_fall_back_to_pwrite_when_a_segment_cannot_be_preallocated(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def refuse(fd: int, offset: int, length: int) -> None:
        raise OSError(errno.EOPNOTSUPP, "Operation not supported")

    monkeypatch.setattr(os, "posix_fallocate", refuse)
    cfg = small_config(tmp_path)
    with caplog.at_level("WARNING"), MessageStore.open(cfg) as store:
        results = [store.put_message(msg(body=bytes([i]) * 40_000, queue_id=i % 2)) for i in range(60)]
        assert all(seg.write_map is None for seg in store.commit_log.segments())
        last = _commitlog_files(tmp_path)[-1]
        assert int(last.name) + last.stat().st_size == store.max_commit_log_offset  # no tail
        for i, r in enumerate(results):
            m = store.look_message_by_offset(r.commit_log_offset)
            assert m is not None and m.body == bytes([i]) * 40_000
    assert "writing with pwrite" in caplog.text
    with MessageStore.open(cfg) as store:
        assert len(_read_all(store)) == 60


def test_a_damaged_index_entry_costs_that_entry_only(tmp_path: Path) -> None:
    """One flipped high byte of an old index entry's commit log offset points it past the log's
    end: while the store runs, that entry is passed over and counted, not every entry of its block
    (as if removed by retention); ``store check`` names it, and the next open rewrites it from its
    record (tests/store/test_store_index_check.py)."""
    cfg = small_config(tmp_path, consume_queue_entries_per_file=4096, commit_log_segment_size=8 << 20)
    with MessageStore.open(cfg) as store:
        for i in range(3000):
            store.put_message(msg(body=b"m%05d" % i))
        [cq_file] = (tmp_path / "consumequeue" / "T" / "0").iterdir()
        with open(cq_file, "r+b") as f:
            f.seek(100 * 20 + 2)
            f.write(b"\x7f")
        got = [o for _q, o, _b in _read_all(store)]
        assert got == [o for o in range(3000) if o != 100]
        assert store.damaged_reads == 1
    report = check_store(tmp_path)
    assert not report.ok and [(e.topic, e.queue_id, e.queue_offsets) for e in report.bad_entries] == [
        ("T", 0, (100,))
    ]
    with MessageStore.open(cfg) as store:
        assert [o for _q, o, _b in _read_all(store)] == list(range(3000))
        assert store.damaged_reads == 0 and store.index_repairs.entries == 1


def _queue_emptied_by_retention(tmp_path: Path) -> StoreConfig:
    """A store whose queue A had 10 messages, all removed by retention (its offsets 0..9 handed
    out), and whose queue B's index is lost: the next open rebuilds the consume queues."""
    import time

    cfg = small_config(tmp_path)
    with MessageStore.open(cfg) as store:
        for i in range(10):
            store.put_message(msg(topic="A", body=b"a%d" % i))
        while len(store.commit_log.segments()) < 3:
            store.put_message(msg(topic="B", body=bytes(60_000)))
        store.delete_expired_files(now_ms=int(time.time() * 1000) + 10**12)
        assert (store.get_min_offset_in_queue("A", 0), store.get_max_offset_in_queue("A", 0)) == (10, 10)
    shutil.rmtree(tmp_path / "consumequeue" / "B")
    return cfg


def test_a_rebuild_keeps_the_offsets_of_a_queue_retention_emptied(tmp_path: Path) -> None:
    """Retention removed every record of queue A; a rebuild of the consume queues (another queue's
    index was lost) starts A where it was, not at 0 below its consumers' progress."""
    cfg = _queue_emptied_by_retention(tmp_path)
    for _ in range(2):  # and again after a restart: the offsets were kept on disk
        with MessageStore.open(cfg) as store:
            assert (store.get_min_offset_in_queue("A", 0), store.get_max_offset_in_queue("A", 0)) == (10, 10)
    with MessageStore.open(cfg) as store:
        assert store.put_message(msg(topic="A", body=b"new")).queue_offset == 10
        assert [m.body for m in store.get_messages("g", "A", 0, 10, 8).messages] == [b"new"]


def test_filler_entries_do_not_make_every_start_rebuild(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Fillers (size 0) stand for records lost to damage; the next start keeps them, rather than
    cutting the queue there and rebuilding every consume queue from the whole log each time."""
    cfg = small_config(tmp_path)
    bodies = _write(cfg, 20, crash=False, body_size=100)
    offsets = sorted(bodies)
    flip_byte(_commitlog_files(tmp_path)[0], offsets[4] + 80, 0x40)  # queue 0, offset 2
    shutil.rmtree(tmp_path / "consumequeue" / "T" / "1")  # a lost index: one rebuild writes the filler
    with caplog.at_level("ERROR"), MessageStore.open(cfg) as store:
        first = _read_all(store)
    assert "rebuilding them all" in caplog.text
    caplog.clear()
    with caplog.at_level("ERROR"), MessageStore.open(cfg) as store:
        assert _read_all(store) == first
        assert [o for q, o, _b in first if q == 0] == [o for o in range(10) if o != 2]
    assert "rebuilding" not in caplog.text


def test_a_rebuild_cut_short_keeps_the_offsets_at_the_next_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The rebuild destroys every queue before it scans the log: killed meanwhile, the next start
    measured an emptied queue from nothing and gave its offsets again. Recovery notes the offsets
    handed out (on disk) before it changes a queue, and the next start reads the note."""
    from siftmq.store import recovery

    cfg = _queue_emptied_by_retention(tmp_path)
    rebuild = recovery._rebuild_all

    def killed(commit_log: object, queues: dict[object, object], reput: object) -> None:
        for cq in list(queues.values()):
            cq.destroy()  # type: ignore[attr-defined]
        raise KeyboardInterrupt("killed during the rebuild")

    monkeypatch.setattr(recovery, "_rebuild_all", killed)
    with pytest.raises(KeyboardInterrupt):
        MessageStore.open(cfg)
    monkeypatch.setattr(recovery, "_rebuild_all", rebuild)
    with MessageStore.open(cfg) as store:
        assert store.get_max_offset_in_queue("A", 0) == 10
        assert store.put_message(msg(topic="A", body=b"new")).queue_offset == 10
    assert not (tmp_path / recovery.TAKEN_FILE).exists()  # a finished recovery leaves no note


def test_fillers_at_a_queues_end_stay_through_later_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A record cut from the log's end leaves a filler; later starts cut it again (the queue's last
    record is before it) and wrote it again, so a kill in between gave its offset away."""
    from siftmq.store import recovery

    cfg = small_config(tmp_path)
    _write(cfg, 40, crash=False)
    last = _commitlog_files(tmp_path)[-1]
    os.truncate(last, last.stat().st_size - 100)  # message 39 (queue 1, offset 19) is lost
    with MessageStore.open(cfg) as store:
        assert store.get_max_offset_in_queue("T", 1) == 20
    caplog.clear()

    def killed(*args: object) -> None:
        raise KeyboardInterrupt("killed mid-start")

    monkeypatch.setattr(recovery, "_keep_taken", killed)
    with caplog.at_level("WARNING"), pytest.raises(KeyboardInterrupt):
        MessageStore.open(cfg)
    monkeypatch.undo()
    with caplog.at_level("WARNING"), MessageStore.open(cfg) as store:
        assert store.get_max_offset_in_queue("T", 1) == 20
        assert store.put_message(msg(body=b"n", queue_id=1)).queue_offset == 20
    assert "stay taken" not in caplog.text  # kept as they were, not cut and written again


def test_the_key_index_is_within_its_bound_right_after_an_open(tmp_path: Path) -> None:
    """The open rebuilds the key index from the whole log; its bound applied only at the first
    retention pass, so a restart held every id of the retained log at once."""
    cfg = small_config(tmp_path, key_index_max_messages=100)
    with MessageStore.open(cfg) as store:
        for i in range(2000):
            store.put_message(msg(body=b"x", UNIQ_KEY=f"u{i}"))
    with MessageStore.open(cfg) as store:
        assert store.key_index is not None
        assert len(store.key_index._by_uniq_key) <= 100
        assert store.query_message_by_uniq_key("u1999") is not None


def test_a_deleted_topics_queue_of_fillers_only_goes_at_the_next_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A queue retention emptied keeps its offsets with a filler. Deleted, and the deletion cut
    short after its tombstone: the next start finishes a deletion by a queue's first entry, which
    a queue of fillers only lacks; it came back, and the topic made again started at its old offset."""
    from siftmq.store.tombstones import Tombstones

    cfg = _queue_emptied_by_retention(tmp_path)  # the rebuild keeps A's offsets with a filler
    with MessageStore.open(cfg) as store:
        assert store.get_max_offset_in_queue("A", 0) == 10
        added = Tombstones.add

        def cut_short(self: Tombstones, topic: str, offset: int) -> None:
            added(self, topic, offset)
            raise KeyboardInterrupt("killed after the tombstone")

        monkeypatch.setattr(Tombstones, "add", cut_short)
        with pytest.raises(KeyboardInterrupt):
            store.delete_topic("A")
        monkeypatch.undo()
    with MessageStore.open(cfg) as store:
        assert ("A", 0) not in store.queues()
        assert store.put_message(msg(topic="A", body=b"new")).queue_offset == 0


def test_offline_jobs_refuse_a_store_whose_recovery_was_cut_short(tmp_path: Path) -> None:
    """A recovery killed halfway leaves its note of taken offsets and no abort marker: the offline
    jobs (store check, Spark reindex and backfill) would have read a half-recovered store."""
    from siftmq.store import recovery
    from siftmq.store.offline import open_offline

    cfg = small_config(tmp_path)
    _write(cfg, 10, crash=False)
    (tmp_path / recovery.TAKEN_FILE).write_text("[]")
    with pytest.raises(StoreError, match=recovery.TAKEN_FILE), open_offline(tmp_path, what="the store"):
        pass
    assert check_store(tmp_path).crashed
    with MessageStore.open(cfg):  # the broker's open finishes the recovery
        pass
    assert not (tmp_path / recovery.TAKEN_FILE).exists()
    with open_offline(tmp_path, what="the store"):
        pass


def test_a_redispatch_cut_short_keeps_the_offsets_at_the_next_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What a power loss can leave: queue T:0 holds records 0..9, its index also has entries 10..13
    for records the log lost (handed out to consumers), and entry 6's page is zeros; the checkpoint
    says the queues were flushed up to record 5. The redispatch cuts the queue at 6; killed right
    after, the next start gave offsets 10..13 again (its note was written only later)."""
    import struct

    from siftmq.store import recovery
    from siftmq.store.consumequeue import ConsumeQueue

    cfg = small_config(tmp_path)
    with MessageStore.open(cfg) as store:
        for i in range(10):
            store.put_message(msg(body=b"m%d" % i))
    entry = struct.Struct(">qiq")
    index = sorted((tmp_path / "consumequeue" / "T" / "0").iterdir())[0]
    data = bytearray(index.read_bytes())
    last, size, _ = entry.unpack_from(data, 9 * 20)
    data[6 * 20 : 7 * 20] = bytes(20)  # entry 6: its page lost
    lost = b"".join(entry.pack(last + size * (k + 1), size, 0) for k in range(4))  # 10..13
    index.write_bytes(bytes(data[:200]) + lost)
    fifth = entry.unpack_from(data, 5 * 20)[0]
    Checkpoint(fifth, fifth, 0).save(tmp_path / "checkpoint")
    (tmp_path / "abort").touch()

    cut = ConsumeQueue.truncate

    def killed_after_the_cut(self: ConsumeQueue, offset: int) -> None:
        cut(self, offset)
        raise KeyboardInterrupt("killed right after the redispatch's cut")

    monkeypatch.setattr(ConsumeQueue, "truncate", killed_after_the_cut)
    with pytest.raises(KeyboardInterrupt):
        MessageStore.open(cfg)
    monkeypatch.setattr(ConsumeQueue, "truncate", cut)
    assert (tmp_path / recovery.TAKEN_FILE).exists()
    with MessageStore.open(cfg) as store:
        assert store.put_message(msg(body=b"new")).queue_offset == 14
