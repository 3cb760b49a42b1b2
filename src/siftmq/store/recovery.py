"""Crash detection, checkpoint and recovery.

* An ``abort`` file is created when the store opens and removed at a clean close; finding it at
  open means the previous run crashed.
* The ``checkpoint`` file (JSON with a CRC) records the CommitLog offset up to which the
  ConsumeQueues (and their extensions) are known durable.

Recovery scans the CommitLog, verifying magic and CRC of every record. Bytes that fail and are
followed by an intact record are passed over (:mod:`siftmq.store.damage`): they cost the records in
them, not the log after them (RocketMQ truncates there). Only a torn tail, where nothing intact
follows in the last segment, is truncated. Either way the bytes are copied to ``quarantine/`` and
logged with their segment, position and length. After a crash, bad bytes past the checkpoint's
flushed offset that only the rest of one write follows are a torn tail too: the write the crash
interrupted, whose first record gets its size and magic code last (see
:meth:`~siftmq.store.commitlog.CommitLog.scan`). The scan starts at the first segment when the
key index is enabled (it is rebuilt by the same pass), otherwise at the segment holding the
checkpoint (after a crash) or at the last segment (after a clean stop); damage in segments before
that is found by the reads that meet it and by ``siftmq store check``.

Every scanned record is compared with its queue's entry and extension unit as the scan goes
(:mod:`siftmq.store.indexcheck`): an entry that disagrees is rewritten from the record, and a queue
missing entries below its first one is rebuilt from the scan. The ConsumeQueues are then made to
agree with the CommitLog: records past the checkpoint are
re-dispatched (entries verified, missing ones written, stale tails cut), queues are cut after
their last surviving record (entries of damaged records are kept: reads pass over them), and if
any queue misses entries that cannot be re-dispatched from the scanned range, every ConsumeQueue
is rebuilt from the CommitLog alone; records lost to damage then get filler entries, so the queue
offsets of the records after them do not move.
"""

from __future__ import annotations

import json
import logging
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from siftmq.durable import write_atomically
from siftmq.errors import StoreError
from siftmq.store.commitlog import CommitLog
from siftmq.store.consumequeue import ConsumeQueue, filler_entries
from siftmq.store.damage import DamagedRange, damaged_range, in_damaged, quarantine
from siftmq.store.dispatch import DispatchRequest, Reput
from siftmq.store.indexcheck import IndexCheck, IndexRepairs
from siftmq.store.keyindex import KeyIndex

_log = logging.getLogger(__name__)

_BATCH = 1024
#: Scanned records checked (and re-dispatched) at once: the check's cost per batch is spread thin.
_SCAN_BATCH = 8192
#: Records the recovery scan puts in the key index between two trims to its bound.
_TRIM_EVERY = 1 << 20
#: What recovery notes before it changes a queue: the offsets each had handed out.
TAKEN_FILE = "recovering_offsets.json"


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """Durable positions written by the flusher."""

    commit_log_flushed_offset: int
    consume_queue_flushed_offset: int
    #: the largest store timestamp of any record appended before this checkpoint (0: not known)
    max_store_timestamp: int = 0

    def save(self, path: Path) -> None:
        """Write atomically (temp file, fsync, rename, fsync dir)."""
        body = json.dumps(
            {
                "commit_log_flushed_offset": self.commit_log_flushed_offset,
                "consume_queue_flushed_offset": self.consume_queue_flushed_offset,
                "max_store_timestamp": self.max_store_timestamp,
            },
            sort_keys=True,
        )
        payload = json.dumps({"body": body, "crc": zlib.crc32(body.encode())}).encode()
        write_atomically(path, payload)

    @classmethod
    def load(cls, path: Path) -> Checkpoint | None:
        """The saved checkpoint, or None if absent or damaged."""
        try:
            outer = json.loads(path.read_bytes())
            body = outer["body"]
            if zlib.crc32(body.encode()) != outer["crc"]:
                raise ValueError("checkpoint CRC mismatch")
            inner = json.loads(body)
            return cls(
                int(inner["commit_log_flushed_offset"]),
                int(inner["consume_queue_flushed_offset"]),
                int(inner.get("max_store_timestamp", 0)),  # absent from checkpoints of earlier versions
            )
        except FileNotFoundError:
            return None
        except (ValueError, KeyError, TypeError, UnicodeDecodeError, AttributeError) as exc:
            _log.error("ignoring damaged checkpoint %s: %s", path, exc)
            return None


def recover(
    commit_log: CommitLog,
    queues: dict[tuple[str, int], ConsumeQueue],
    find_or_create: Callable[[str, int], ConsumeQueue],
    reput: Reput,
    key_index: KeyIndex | None,
    *,
    abnormal: bool,
    checkpoint: Checkpoint | None,
    key_index_max_messages: int = 0,
    repairs: IndexRepairs | None = None,
) -> int:
    """Bring the CommitLog and ConsumeQueues of a freshly loaded store into agreement.

    Returns the largest store timestamp of any record: the checkpoint's, or a larger one among the
    records scanned (every record appended after the checkpoint was written is scanned; without a
    checkpoint after a clean stop, only the last segment is). ``key_index_max_messages``: the
    key index is trimmed to it as the scan fills it (0: not trimmed here). What the check of the
    ConsumeQueues against the scanned records repaired is added to ``repairs``.
    """
    note = _TakenNote(commit_log, queues)
    handed_out = note.taken
    cl_min = commit_log.min_offset
    redispatch_from = commit_log.max_offset
    if abnormal:
        redispatch_from = checkpoint.consume_queue_flushed_offset if checkpoint else cl_min
        redispatch_from = max(cl_min, min(redispatch_from, commit_log.max_offset))
    if key_index is not None:
        scan_from = cl_min
    else:
        last_start = commit_log.segments()[-1].start_offset if commit_log.segments() else 0
        anchor = min(redispatch_from, last_start)
        scan_from = anchor - (anchor - cl_min) % commit_log.segment_size

    last_of_queue: dict[tuple[str, int], DispatchRequest] = {}
    check = IndexCheck(
        queues,
        reput,
        repairs if repairs is not None else IndexRepairs(),
        whole_log=scan_from <= cl_min,
        before_rebuild=note.ensure,
    )
    rebuild = False
    batch: list[DispatchRequest] = []
    latest = checkpoint.max_store_timestamp if checkpoint else 0
    dead = reput.tombstones
    # a crash can only have cut short a write past the offset last known flushed
    torn_writes_from = (checkpoint.commit_log_flushed_offset if checkpoint else cl_min) if abnormal else None
    scanned = 0
    for msg in commit_log.scan(scan_from, torn_writes_from=torn_writes_from):
        latest = max(latest, msg.store_timestamp)
        if dead and dead.is_dead(msg.topic, msg.commit_log_offset):
            continue  # of a deleted topic: indexed nowhere
        req = DispatchRequest.of(msg)
        last_of_queue[(req.topic, req.queue_id)] = req
        if key_index is not None:
            key_index.dispatch((req,))
            scanned += 1
            if key_index_max_messages and scanned % _TRIM_EVERY == 0:
                key_index.trim(key_index_max_messages)  # the bound holds while the index is rebuilt
        if rebuild:
            continue
        batch.append(req)
        if len(batch) >= _SCAN_BATCH:
            rebuild = not _index(batch, check, redispatch_from, find_or_create, reput, note=note)
            batch = []
    if batch and not rebuild:
        rebuild = not _index(batch, check, redispatch_from, find_or_create, reput, note=note)
    check.report()
    damaged = commit_log.damaged
    _quarantine_damage(commit_log)
    if commit_log.scan_error is not None:
        _log.error(
            "commit log recovery: %s; truncating %d bytes from offset %d (a torn tail)%s",
            commit_log.scan_error,
            commit_log.max_offset - commit_log.scan_end,
            commit_log.scan_end,
            _kept_as(_quarantine_tail(commit_log)),
        )
    elif abnormal and commit_log.scan_end != commit_log.max_offset:
        _log.warning("commit log recovery: truncating at %d", commit_log.scan_end)
    if scan_from < commit_log.max_offset or commit_log.scan_end != commit_log.max_offset:
        if commit_log.scan_error is not None:
            note.ensure()  # records are cut (not only a crash's unwritten zeros): their offsets stay taken
        commit_log.truncate(commit_log.scan_end)

    if not rebuild:
        rebuild = not _reconcile(
            commit_log, queues, last_of_queue, scan_from, damaged, before_cut=note.ensure
        )
    if rebuild:
        _log.error("consume queues disagree with the commit log; rebuilding them all from the commit log")
        note.ensure()
        _rebuild_all(commit_log, queues, reput)
    for key in sorted(handed_out.keys() - queues.keys()):
        try:
            find_or_create(*key)  # adds it to ``queues``
        except (ValueError, StoreError) as exc:  # no queue this store could have had: a damaged note
            _log.error("ignoring queue %s:%d noted in %s: %s", key[0], key[1], TAKEN_FILE, exc)
            del handed_out[key]
    _keep_taken(commit_log, queues, handed_out)
    if key_index is not None and key_index_max_messages:
        key_index.trim(key_index_max_messages)
    commit_log.queue_offsets = {key: cq.max_offset for key, cq in queues.items()}
    for cq in queues.values():  # the fillers are on disk before the note of what they keep goes
        cq.flush()
    note.remove()
    return latest


def _taken_file(commit_log: CommitLog) -> Path:
    return commit_log.directory.parent / TAKEN_FILE


class _TakenNote:
    """The queue offsets each queue had handed out (``taken``), noted durably before recovery's
    first change that could lose one (a record or a queue entry cut, the queues rebuilt): a
    recovery cut short at any point after finds the note at the next start and keeps them taken
    all the same. A start that changes nothing writes nothing (it can start on a full disk)."""

    def __init__(self, commit_log: CommitLog, queues: dict[tuple[str, int], ConsumeQueue]) -> None:
        self.path = _taken_file(commit_log)
        self.taken = {key: cq.written_max_offset() for key, cq in queues.items()}
        try:
            noted = [
                (str(t), int(q), int(o)) for t, q, o in json.loads(self.path.read_bytes()) if int(q) >= 0
            ]
        except FileNotFoundError:
            noted = []
        except (ValueError, TypeError) as exc:  # written whole or not at all: only damage gets here
            _log.error("ignoring the damaged %s: %s", self.path, exc)
            noted = []
        for topic, queue_id, offset in noted:  # (a queue a rebuild cut short had destroyed has no files)
            self.taken[(topic, queue_id)] = max(offset, self.taken.get((topic, queue_id), 0))
        self._written = False

    def ensure(self) -> None:
        if not self._written:
            note = json.dumps([[t, q, o] for (t, q), o in sorted(self.taken.items())]).encode()
            write_atomically(self.path, note)
            self._written = True

    def remove(self) -> None:
        self.path.unlink(missing_ok=True)


def _index(
    batch: list[DispatchRequest],
    check: IndexCheck,
    redispatch_from: int,
    find_or_create: Callable[[str, int], ConsumeQueue],
    reput: Reput,
    *,
    note: _TakenNote,
) -> bool:
    """Check the entries of the scanned records ``batch`` and re-dispatch the ones from
    ``redispatch_from``; False if the ConsumeQueues must be rebuilt."""
    rest = check.check(batch)
    if rest is None:
        return False
    todo = [req for req in rest if req.commit_log_offset >= redispatch_from]
    return not todo or _redispatch(todo, find_or_create, reput, before_cut=note.ensure)


def _redispatch(
    batch: list[DispatchRequest],
    find_or_create: Callable[[str, int], ConsumeQueue],
    reput: Reput,
    *,
    before_cut: Callable[[], None],
) -> bool:
    """Write the entries of ``batch`` the ConsumeQueues miss; False if a queue has a hole.
    ``before_cut`` runs before a stale entry is cut."""
    todo: list[DispatchRequest] = []
    next_offset: dict[tuple[str, int], int] = {}
    for req in batch:
        key = (req.topic, req.queue_id)
        cq = find_or_create(req.topic, req.queue_id)
        expected = next_offset.get(key, cq.max_offset)
        q = req.consume_queue_offset
        if q < cq.min_offset or q > expected:
            # a hole (or an empty queue whose earlier records we cannot see): rebuild
            return False
        if q < expected:
            entry = cq.get_entry(q)
            if entry is None:
                return False
            if entry[0] == req.commit_log_offset and entry[1] == req.msg_size:
                continue
            before_cut()
            cq.truncate(q)
        todo.append(req)
        next_offset[key] = q + 1
    reput.dispatch(todo)
    return True


def _reconcile(
    commit_log: CommitLog,
    queues: dict[tuple[str, int], ConsumeQueue],
    last_of_queue: dict[tuple[str, int], DispatchRequest],
    scan_from: int,
    damaged: list[DamagedRange],
    *,
    before_cut: Callable[[], None],
) -> bool:
    """Cut each queue after its last surviving record, keeping the entries of damaged records
    there (reads pass over them; their queue offsets stay taken); False if a queue misses entries.
    ``before_cut`` runs before the first entry is cut."""
    for key, cq in queues.items():
        cq.truncate_dirty(commit_log.max_offset, before_cut=before_cut)
        last = last_of_queue.get(key)
        if last is None:
            cq.correct_min_offset(commit_log.min_offset)
            whole_log = scan_from <= commit_log.min_offset
            if whole_log and _past_damage(cq, cq.min_offset, damaged) > cq.min_offset:
                return False  # the whole log was scanned and holds no record this queue indexes
            continue
        q = last.consume_queue_offset
        keep = _past_damage(cq, q + 1, damaged, fillers_too=True)
        if cq.max_offset > keep:
            before_cut()
            cq.truncate(keep)
        entry = cq.get_entry(q)
        if entry is None or entry[0] != last.commit_log_offset or entry[1] != last.msg_size:
            return False
        cq.correct_min_offset(commit_log.min_offset)
    return all(key in queues for key in last_of_queue)


def _past_damage(
    cq: ConsumeQueue, start: int, damaged: list[DamagedRange], *, fillers_too: bool = False
) -> int:
    """The first queue offset from ``start`` whose entry does not point into a damaged range
    (``fillers_too``: nor is a filler, which stands for a record lost before and keeps its offset).
    Read a block at a time: a queue can end in hundreds of thousands of fillers."""
    at = start
    while (damaged or fillers_too) and at < cq.max_offset:
        block = cq.read_block(at, min(cq.max_offset - at, _BATCH * 64))
        if block is None or not len(block):
            break
        passed = in_damaged(block["commit_log_offset"].astype(np.int64), damaged)
        if fillers_too:
            passed |= filler_entries(block)
        stop = np.flatnonzero(~passed)
        if len(stop):
            return at + int(stop[0])
        at += len(block)
    return at


def _quarantine_damage(commit_log: CommitLog) -> None:
    for damage in commit_log.damaged:
        seg = commit_log.segment_holding(damage.offset)
        copy = quarantine(commit_log.directory.parent, seg, damage) if seg is not None else None
        _log.error(
            "commit log recovery: %s; the records after it are kept%s",
            damage.describe(),
            _kept_as(copy),
        )


def _quarantine_tail(commit_log: CommitLog) -> Path | None:
    seg = commit_log.segment_holding(commit_log.scan_end)
    if seg is None:
        return None
    pos = commit_log.scan_end - seg.start_offset
    tail = damaged_range(seg, pos, seg.length, str(commit_log.scan_error))
    return quarantine(commit_log.directory.parent, seg, tail)


def _kept_as(copy: Path | None) -> str:
    return f"; the damaged bytes are kept in {copy}" if copy is not None else ""


def _rebuild_all(commit_log: CommitLog, queues: dict[tuple[str, int], ConsumeQueue], reput: Reput) -> None:
    for cq in queues.values():
        cq.destroy()
    batch: list[DispatchRequest] = []
    for msg in commit_log.scan(commit_log.min_offset):
        batch.append(DispatchRequest.of(msg))
        if len(batch) >= _BATCH:
            reput.dispatch(batch)
            batch = []
    reput.dispatch(batch)
    if commit_log.scan_error is not None:  # the log was just verified; a new error is an I/O problem
        commit_log.truncate(commit_log.scan_end)
    for cq in queues.values():
        cq.correct_min_offset(commit_log.min_offset)


def _keep_taken(
    commit_log: CommitLog, queues: dict[tuple[str, int], ConsumeQueue], handed_out: dict[tuple[str, int], int]
) -> None:
    """Give every queue back the offsets it had handed out before recovery cut or rebuilt it.

    Records cut from the log's end (damaged, or torn by a power loss) and records removed by
    retention before a rebuild no longer index anything, but consumers may have read past their
    queue offsets: given to new messages, those would be passed over as read. Filler entries keep
    them taken (at the log's end: a read counts them as lost, as a damaged record's)."""
    for key, cq in queues.items():
        taken = handed_out.get(key, 0)
        if cq.max_offset < taken:
            _log.warning(
                "%s:%d: queue offsets %d..%d stand for records no longer in the commit log; they stay taken",
                key[0], key[1], cq.max_offset, taken - 1,
            )  # fmt: skip
            cq.fill_to(taken, commit_log.max_offset)
            cq.correct_min_offset(commit_log.min_offset)
