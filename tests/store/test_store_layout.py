"""The settings a store's files were written under (layout.json): a changed segment size is refused
before anything is touched, and a lowered max_message_size limits new messages only."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from siftmq.errors import ConfigError, MessageTooLargeError
from siftmq.store import GetMessageStatus, MessageStore
from store_helpers import flip_byte, msg, small_config


def _bodies(store: MessageStore) -> list[bytes]:
    out: list[bytes] = []
    offset = 0
    while True:
        res = store.get_messages("g", "T", 0, offset, 32)
        out += [m.body for m in res.messages]
        if res.status is not GetMessageStatus.FOUND:
            return out
        offset = res.next_begin_offset


def _files(data: Path) -> dict[str, int]:
    found = {str(p.relative_to(data)): p.stat().st_size for p in sorted(data.rglob("*")) if p.is_file()}
    found.pop("lock", None)
    return found


@pytest.mark.parametrize("segments", [1, 3])
def test_a_changed_segment_size_is_refused_and_changes_nothing(tmp_path: Path, segments: int) -> None:
    cfg = small_config(tmp_path)
    with MessageStore.open(cfg) as store:
        while len(store.commit_log.segments()) < segments:
            store.put_message(msg(body=bytes(50_000)))
        written = _bodies(store)
    before = _files(tmp_path)
    doubled = small_config(tmp_path, commit_log_segment_size=2 * cfg.commit_log_segment_size)
    with pytest.raises(ConfigError, match=f"written with {cfg.commit_log_segment_size}"):
        MessageStore.open(doubled)
    assert _files(tmp_path) == before  # nothing moved to quarantine, nothing cut
    with MessageStore.open(cfg) as store:
        assert _bodies(store) == written


def test_a_store_without_a_layout_file_is_checked_by_its_segment_files(tmp_path: Path) -> None:
    cfg = small_config(tmp_path)
    with MessageStore.open(cfg) as store:
        while len(store.commit_log.segments()) < 3:
            store.put_message(msg(body=bytes(50_000)))
    (tmp_path / "layout.json").unlink()  # as a store written before the file existed
    with pytest.raises(ConfigError, match="a store's segment size cannot change"):
        MessageStore.open(small_config(tmp_path, commit_log_segment_size=2 * cfg.commit_log_segment_size))
    with MessageStore.open(cfg):
        pass
    saved = json.loads((tmp_path / "layout.json").read_text())["data"]
    assert saved["commit_log_segment_size"] == cfg.commit_log_segment_size


def test_a_lowered_max_message_size_limits_new_messages_only(tmp_path: Path) -> None:
    cfg = small_config(tmp_path, max_message_size=64 * 1024)
    with MessageStore.open(cfg) as store:
        for i in range(6):  # large ones in the middle and at the end of the log
            store.put_message(msg(body=(b"big%d" % i).ljust(40_000, b".") if i % 2 else b"small%d" % i))
        written = _bodies(store)
    lowered = small_config(tmp_path, max_message_size=16 * 1024)
    for _ in range(2):  # and after a restart under the lower limit
        with MessageStore.open(lowered) as store:
            assert _bodies(store) == written
            assert store.damaged_reads == 0
    with MessageStore.open(lowered) as store:
        with pytest.raises(MessageTooLargeError):
            store.put_message(msg(body=bytes(20_000)))
        assert store.put_message(msg(body=b"new")).queue_offset == 6


@pytest.mark.parametrize("at", [30, None], ids=["in-data", "in-format"])
@pytest.mark.parametrize("previous", [False, True], ids=["alone", "beside-prev"])
def test_a_damaged_layout_file_is_refused_and_changes_nothing(
    tmp_path: Path, previous: bool, at: int | None
) -> None:
    """layout.json damaged after max_message_size was lowered: opened with the limit in force (or
    with its previous generation's, lower when the limit grew), the larger records read as damage
    and the lower limit was written back. The open is refused, naming the file and the remedy."""
    if previous:  # the first generation holds the lower limit; the limit grew since
        with MessageStore.open(small_config(tmp_path, max_message_size=16 * 1024)):
            pass
    cfg = small_config(tmp_path, max_message_size=64 * 1024)
    with MessageStore.open(cfg) as store:
        for i in range(6):
            store.put_message(msg(body=(b"big%d" % i).ljust(40_000, b".") if i % 2 else b"small%d" % i))
        written = _bodies(store)
    assert (tmp_path / "layout.json.prev").exists() == previous
    lowered = small_config(tmp_path, max_message_size=16 * 1024)
    with MessageStore.open(lowered):
        pass
    layout = tmp_path / "layout.json"
    flip_byte(layout, layout.stat().st_size // 2 if at is None else at, 0x01)
    before = {p: p.read_bytes() for p in sorted(tmp_path.rglob("*")) if p.is_file() and p.name != "lock"}
    refused = r"layout\.json (does not match its checksum|is not a whole).*backup"
    for _ in range(2):
        with pytest.raises(ConfigError, match=refused):
            MessageStore.open(lowered)
    after = {p: p.read_bytes() for p in sorted(tmp_path.rglob("*")) if p.is_file() and p.name != "lock"}
    assert after == before

    # the remedy for a limit not known: the largest record a segment holds
    size = cfg.commit_log_segment_size
    remedy = {"commit_log_segment_size": size, "max_record_size": size - 8}
    (tmp_path / "layout.json").write_text(json.dumps(remedy))
    with MessageStore.open(lowered) as store:
        assert _bodies(store) == written
        assert store.damaged_reads == 0
    assert not (tmp_path / "quarantine").exists()


def test_a_layout_file_missing_beside_its_previous_generation_is_read_from_it(tmp_path: Path) -> None:
    """A crash between the renames of a write leaves the previous generation alone: the write is
    made at open, before any record under its limit, so that generation is what the files hold."""
    cfg = small_config(tmp_path, max_message_size=64 * 1024)
    with MessageStore.open(small_config(tmp_path, max_message_size=16 * 1024)):
        pass
    with MessageStore.open(cfg) as store:
        store.put_message(msg(body=bytes(40_000)))
        written = _bodies(store)
    (tmp_path / "layout.json").replace(tmp_path / "layout.json.prev")
    with MessageStore.open(small_config(tmp_path, max_message_size=16 * 1024)) as store:
        assert _bodies(store) == written
        assert store.damaged_reads == 0
