"""``check_store``: damaged ranges found and the messages they cost listed, nothing changed."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from siftmq.errors import StoreLockedError
from siftmq.store import MessageStore, StoreConfig
from siftmq.store.check import check_store
from store_helpers import flip_log_byte, msg, small_config


def _fill(cfg: StoreConfig, n: int) -> list[tuple[int, int, int]]:
    """``n`` messages over 2 queues in several segments; (commit log offset, queue, queue offset)."""
    with MessageStore.open(cfg) as store:
        results = [store.put_message(msg(body=bytes([i % 251]) * 20_000, queue_id=i % 2)) for i in range(n)]
    return [(r.commit_log_offset, r.queue_id, r.queue_offset) for r in results]


def _digest(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def test_a_clean_store_checks_clean(tmp_path: Path) -> None:
    cfg = small_config(tmp_path)
    placed = _fill(cfg, 150)
    report = check_store(tmp_path)
    assert report.ok and report.records == 150 and report.segments >= 3
    assert not report.damaged and report.torn_tail is None and not report.lost
    assert len({p[0] // cfg.commit_log_segment_size for p in placed}) == report.segments


def test_damage_is_reported_with_the_messages_it_costs_and_nothing_changes(tmp_path: Path) -> None:
    cfg = small_config(tmp_path)
    placed = _fill(cfg, 150)
    victims = [placed[10], placed[77], placed[120]]  # in three different segments
    for phy, _q, _o in victims:
        flip_log_byte(cfg.data_dir, phy + 300, 0xFF)
    before = _digest(tmp_path)
    report = check_store(tmp_path)
    assert not report.ok and report.records == 147
    assert sorted(d.offset for d in report.damaged) == sorted(v[0] for v in victims)
    assert all(d.length == 20_000 + (placed[1][0] - placed[0][0] - 20_000) for d in report.damaged)
    lost = {(e.topic, e.queue_id, o) for e in report.lost for o in e.queue_offsets}
    assert lost == {("T", q, o) for _p, q, o in victims}
    assert _digest(tmp_path) == before  # read-only: not a byte changed, nothing quarantined


def test_a_torn_tail_is_reported_as_what_recovery_would_cut(tmp_path: Path) -> None:
    cfg = small_config(tmp_path)
    placed = _fill(cfg, 20)
    last = sorted((tmp_path / "commitlog").iterdir())[-1]
    os.truncate(last, last.stat().st_size - 100)
    end = int(last.name) + last.stat().st_size
    report = check_store(tmp_path)
    assert report.torn_tail is not None and report.records == 19 and not report.damaged
    assert (report.torn_tail.offset, report.torn_tail.length) == (placed[19][0], end - placed[19][0])
    assert [(e.queue_id, e.queue_offsets) for e in report.lost] == [(1, (9,))]


def test_a_running_broker_makes_the_check_refuse(tmp_path: Path) -> None:
    cfg = small_config(tmp_path)
    with MessageStore.open(cfg), pytest.raises(StoreLockedError, match="stop it"):
        check_store(tmp_path)
    assert check_store(tmp_path).ok


def test_fillers_left_by_recovery_are_counted(tmp_path: Path) -> None:
    cfg = small_config(tmp_path)
    placed = _fill(cfg, 40)
    flip_log_byte(cfg.data_dir, placed[4][0] + 300, 0xFF)
    for p in (tmp_path / "consumequeue").rglob("*"):
        if p.is_file():
            p.unlink()
    (tmp_path / "abort").touch()
    with MessageStore.open(cfg):  # recovery rebuilds the queues around the damaged record
        pass
    report = check_store(tmp_path)
    assert report.fillers == 1 and [d.offset for d in report.damaged] == [placed[4][0]]
    assert report.quarantined == [f"commitlog-{placed[4][0]:020d}-{placed[5][0] - placed[4][0]}.bin"]


def test_the_segment_size_comes_from_layout_json_not_from_a_stray_file(tmp_path: Path) -> None:
    # one segment and a stray file: their spacing is not the segment size, layout.json knows it
    cfg = small_config(tmp_path)
    _fill(cfg, 3)
    stray = tmp_path / "commitlog" / f"{3 * cfg.commit_log_segment_size:020d}"
    stray.write_bytes(bytes(4096))
    before = _digest(tmp_path)
    report = check_store(tmp_path)
    assert report.records == 3 and not report.damaged and report.torn_tail is None
    assert report.misplaced_segments == [stray.name]  # as recovery would put it aside
    assert _digest(tmp_path) == before
