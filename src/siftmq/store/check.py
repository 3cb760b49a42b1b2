"""``siftmq store check``: find the damaged bytes of a stopped store without changing anything.

Every CommitLog segment is read and every record verified (magic, size, CRC, physical offset), as
recovery does, but nothing is truncated, quarantined or rebuilt: files are opened read-only, and
the store's lock is taken shared, so a running broker (which holds it exclusively) makes the check
refuse rather than report a tail that is being written. For each damaged range the ConsumeQueue
entries that point into it are listed: those are the messages the damage cost, by topic, queue
and queue offset. Filler entries (size 0, written by recovery for records lost to damage) are
counted too.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

import numpy as np

from siftmq.errors import StoreError, StoreLockedError
from siftmq.store import codec
from siftmq.store.commitlog import CommitLog, open_segments
from siftmq.store.config import GIB
from siftmq.store.consumequeue import CQ_DTYPE, filler_entries, written_slots
from siftmq.store.damage import QUARANTINE_DIR, DamagedRange, damaged_range, in_damaged
from siftmq.store.layout import saved_segment_size
from siftmq.store.recovery import TAKEN_FILE, Checkpoint
from siftmq.store.segment import list_segment_starts, missing_starts

#: The segment size of a store with neither ``layout.json`` nor two segment files to show it
#: (StoreConfig's default).
DEFAULT_SEGMENT_SIZE: Final = GIB
#: Queue offsets listed per damaged range (the count is always complete).
MAX_LISTED: Final = 20


@dataclass(frozen=True, slots=True)
class LostEntry:
    """ConsumeQueue entries of one queue that point into damaged bytes (or are fillers)."""

    topic: str
    queue_id: int
    queue_offsets: tuple[int, ...]  # the first MAX_LISTED
    count: int


@dataclass(slots=True)
class CheckReport:
    """What :func:`check_store` found."""

    store_dir: Path
    segments: int = 0
    records: int = 0
    bytes_scanned: int = 0
    damaged: list[DamagedRange] = field(default_factory=list)
    #: bytes at the end that recovery would cut (nothing intact follows them), if any
    torn_tail: DamagedRange | None = None
    #: segment files that break the sequence of start offsets
    misplaced_segments: list[str] = field(default_factory=list)
    #: segment files missing between two present ones (their ranges are in ``damaged`` too)
    missing_segments: list[str] = field(default_factory=list)
    lost: list[LostEntry] = field(default_factory=list)
    #: index entries that point outside the commit log or give an impossible size: the index is
    #: damaged (the records they stand for may be intact; reads pass over these entries)
    bad_entries: list[LostEntry] = field(default_factory=list)
    fillers: int = 0
    quarantined: list[str] = field(default_factory=list)
    crashed: bool = False

    @property
    def ok(self) -> bool:
        problems = (
            self.damaged,
            self.torn_tail,
            self.misplaced_segments,
            self.missing_segments,
            self.lost,
            self.bad_entries,
        )
        return not (any(problems) or self.fillers)


def check_store(
    store_dir: Path,
    *,
    segment_size: int | None = None,
    on_progress: Callable[[int, int], None] | None = None,
) -> CheckReport:
    """Verify every record of the stopped store at ``store_dir``; nothing is changed.

    ``segment_size`` defaults to the one ``layout.json`` keeps, then to the spacing of the segment
    files (or the store default when there is one file: a store written before ``layout.json``).
    ``on_progress(bytes_done, bytes_total)`` is called as segments are read.
    Raises :class:`StoreError` if there is no store there and :class:`StoreLockedError` while a
    broker has it open.
    """
    log_dir = store_dir / "commitlog"
    if not log_dir.is_dir():
        raise StoreError(f"{store_dir} holds no siftmq store ({log_dir} does not exist)")
    with _shared_lock(store_dir):
        # a recovery cut short leaves its note of taken offsets, as a crash leaves the abort marker
        crashed = (store_dir / "abort").exists() or (store_dir / TAKEN_FILE).exists()
        report = CheckReport(store_dir, crashed=crashed)
        starts = list_segment_starts(log_dir)
        size = segment_size or saved_segment_size(store_dir) or _segment_size(starts)
        largest = size - codec.BLANK_MARKER_SIZE
        segments, misplaced = open_segments(log_dir, size, largest, writable=False)
        kept = [seg.start_offset for seg in segments]
        report.misplaced_segments = [f"{s:020d}" for s in misplaced]
        report.missing_segments = [f"{s:020d}" for s in missing_starts(kept, size)]
        commit_log = CommitLog(log_dir, size, largest)
        try:
            commit_log.adopt(segments)
            total = sum(seg.length for seg in segments)
            report.segments = len(segments)
            first = kept[0] if kept else 0
            torn_writes_from = None
            if report.crashed:  # as recovery will classify the end of the log
                checkpoint = Checkpoint.load(store_dir / "checkpoint")
                torn_writes_from = checkpoint.commit_log_flushed_offset if checkpoint else first
            for msg in commit_log.scan(first, torn_writes_from=torn_writes_from):
                report.records += 1
                if on_progress is not None and report.records % 65536 == 0:
                    on_progress(msg.commit_log_offset + msg.store_size - first, total)
            report.bytes_scanned = total
            log_span = (commit_log.min_offset, commit_log.max_offset)
            report.damaged = list(commit_log.damaged)
            if commit_log.scan_error is not None:
                report.torn_tail = _tail(commit_log, crashed=report.crashed)
        finally:
            for seg in segments:
                seg.close()
        report.lost, report.bad_entries, report.fillers = _lost_entries(
            store_dir, [*report.damaged, *_opt(report.torn_tail)], log_span, size
        )
        quarantine = store_dir / QUARANTINE_DIR
        report.quarantined = sorted(p.name for p in quarantine.iterdir()) if quarantine.is_dir() else []
        return report


def _opt(damage: DamagedRange | None) -> list[DamagedRange]:
    return [damage] if damage is not None else []


def _tail(commit_log: CommitLog, *, crashed: bool) -> DamagedRange:
    seg = commit_log.segment_holding(commit_log.scan_end)
    assert seg is not None and commit_log.scan_error is not None
    pos = commit_log.scan_end - seg.start_offset
    if not crashed:  # a clean stop cut the file back to its data: every byte of it was written
        return damaged_range(seg, pos, seg.length, str(commit_log.scan_error))
    # the zeros of a segment preallocated at a crash are not data: the tail ends at its last byte
    # that is not zero (zeros can come first: a zeroed header, or a record whose body is zeros)
    end = pos
    at = pos
    while at < seg.length:
        data = seg.read(at, 4 << 20)
        kept = len(data.rstrip(b"\0"))
        if kept:
            end = at + kept
        at += len(data)
    return damaged_range(seg, pos, end, str(commit_log.scan_error))


def _segment_size(starts: list[int]) -> int:
    if len(starts) >= 2:
        return starts[1] - starts[0]
    return DEFAULT_SEGMENT_SIZE


def _lost_entries(
    store_dir: Path, damaged: list[DamagedRange], log_span: tuple[int, int], segment_size: int
) -> tuple[list[LostEntry], list[LostEntry], int]:
    """The entries of every ConsumeQueue that point into ``damaged``, those that point past the
    log's end ``log_span[1]`` or give an impossible size, and the number of filler entries."""
    lost: list[LostEntry] = []
    bad: list[LostEntry] = []
    fillers = 0
    for topic, queue_id, first, entries in _queue_entries(store_dir):
        phy = entries["commit_log_offset"].astype(np.int64)
        sizes = entries["size"].astype(np.int64)
        fillers += int(np.count_nonzero(filler_entries(entries)))
        # below the log's start is removed by retention, not damage; a filler may sit at the end
        impossible = (sizes < 0) | (sizes > segment_size) | (phy + sizes > log_span[1])
        impossible &= phy + sizes > log_span[0]
        wrong = np.nonzero(impossible)[0]
        if len(wrong):
            listed = tuple(int(first + i) for i in wrong[:MAX_LISTED])
            bad.append(LostEntry(topic, queue_id, listed, len(wrong)))
        if not len(damaged):
            continue
        hits = np.nonzero(in_damaged(phy, damaged) & (sizes > 0))[0]
        if len(hits):
            offsets = tuple(int(first + i) for i in hits[:MAX_LISTED])
            lost.append(LostEntry(topic, queue_id, offsets, len(hits)))
    return lost, bad, fillers


def _queue_entries(store_dir: Path) -> Iterator[tuple[str, int, int, np.ndarray]]:
    """(topic, queue_id, first queue offset, entries) of every ConsumeQueue file, read as they are."""
    root = store_dir / "consumequeue"
    if not root.is_dir():
        return
    unit = CQ_DTYPE.itemsize
    for topic_dir in sorted(p for p in root.iterdir() if p.is_dir()):
        for queue_dir in sorted(p for p in topic_dir.iterdir() if p.is_dir() and p.name.isdigit()):
            for start in list_segment_starts(queue_dir):
                raw = (queue_dir / f"{start:020d}").read_bytes()
                entries = np.frombuffer(raw[: len(raw) - len(raw) % unit], dtype=CQ_DTYPE)
                # the unused leading slots of a queue's first file, and a zero tail, are not entries
                used = np.nonzero(written_slots(entries))[0]
                if len(used):
                    lo, hi = int(used[0]), int(used[-1]) + 1
                    yield topic_dir.name, int(queue_dir.name), start // unit + lo, entries[lo:hi]


@contextlib.contextmanager
def _shared_lock(store_dir: Path) -> Iterator[None]:
    """The store's lock, shared: a broker holds it exclusively, so a running broker is refused."""
    path = store_dir / "lock"
    if not path.exists():
        yield
        return
    fd = os.open(path, os.O_RDONLY)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError as exc:
            raise StoreLockedError(
                f"{store_dir} is in use: a broker (or a job) has it open; stop it and run this again"
            ) from exc
        yield
    finally:
        os.close(fd)
