"""``siftmq spark backfill --group G --topic T``: bloom bits of a late SQL92 registration for the history.

A SQL92 registration's bits are computed by live dispatch only for records stored after it was
registered, so the broker evaluates every older record exactly (RocketMQ's ``isMsgInLive`` rule,
and RocketMQ has no way out of it). This job computes the registration ``G#T``'s bits for the records
already stored, so the bitmap skip covers the history too:

1. :func:`~siftmq.store.offline.open_offline` holds the store's lock (a running broker makes it
   refuse, naming the data dir); the registration must exist in ``<data>/config/filters.json``
   (otherwise the error lists the registrations that do).
2. One Spark task per CommitLog byte range decodes the records of ``T`` without bodies and
   evaluates the expression with the evaluator live dispatch uses (``matches_batch``). Every record
   of ``T`` is processed (the job is idempotent), and each gets the bitmap it would have if the
   registration had always existed: ``G#T``'s bits where it matches, plus the bits of the topic's
   other registrations where they match and cover the record (the rule of
   :func:`~siftmq.filter.registrations.bitmap_trusted`).
3. The records are shuffled by queue and sorted by queue offset; each task writes complete new
   ConsumeQueueExt files for its queues into a staging tree: each unit is the record's store time,
   tags code, and its existing bitmap OR-ed with the computed one (a missing unit or bitmap is
   created from the computed bitmap alone). The ConsumeQueue is checked on the way: its entries
   must point at exactly these records, except at queue offsets whose records were lost to damage
   (the reads pass over them, as the broker's do): a queue offset no record read holds, between
   two records or before the first or after the last, is accepted only where its entry is a filler
   (size 0) or points into damaged bytes the plan passed over or at bytes where no intact record
   starts. Those offsets keep their units as they were (no new bits: the broker passes over such
   entries) and are counted. Any other disagreement, such as an entry pointing at an intact record
   that was not read for its queue, refuses the job (run ``reindex`` first; nothing is installed).
4. The new ext directories of ``T``'s queues are installed crash-safely
   (:func:`~siftmq.store.offline.install`), and only then the coverage is recorded in
   ``filters.json`` (:meth:`~siftmq.spark.jobs.registrations.RegistrationFile.record_backfill`):
   the registration's version and the latest store time processed, ``backfilled_until_ms``. From
   then on the broker's SqlMessageFilter trusts the group's bits in bitmaps of records stored up to
   that time, so the history is skipped by bitmap like new messages are. The coverage belongs to the
   version: when the group's expression changes, the new version starts without it.

OR-ing bits only adds bits, so a bitmap written here never hides a message from any registration;
until the coverage is recorded, the broker does not rely on the new bits at all. A crash at any
point leaves a usable store (see :mod:`siftmq.store.offline`); running the job again finishes it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from siftmq.errors import NotFoundError, StatusCode, StoreError
from siftmq.filter.registrations import REGISTRATION_MARGIN_MS
from siftmq.spark.jobs.common import ProgressCallback
from siftmq.spark.jobs.registrations import RegistrationFile, RegistrationSpec, specs_by_topic
from siftmq.spark.jobs.reindex import (
    WRITE_CHUNK,
    ConsecutiveChecker,
    QueueKey,
    QueueReport,
    checked_plan,
    filter_bitmaps,
    group_by_queue,
    queue_partition,
    run_action,
    store_layout,
    store_paths,
    tags_codes,
)
from siftmq.store.bulk import ByteRange, ScanPlan, intact_at_offsets, read_range
from siftmq.store.consumequeue import CQ_DTYPE, filler_entries
from siftmq.store.consumequeue_ext import ConsumeQueueExt
from siftmq.store.damage import in_spans
from siftmq.store.offline import (
    CONSUME_QUEUE_EXT_DIR,
    JOURNAL_FILE,
    IndexLayout,
    IndexStaging,
    install,
    open_offline,
    open_queue,
    open_queue_ext,
    queue_path,
)

_Entry = tuple[int, int, int, int, bytes, bool]
"""(commit_log_offset, size, tags_code, store_timestamp, computed bitmap, the group's filter matched)"""

_MAX_LISTED: Final = 20


# ------------------------------------------------------------------------------------------ executors


def backfill_entries(
    ranges: Iterable[ByteRange],
    *,
    topic: str,
    specs: tuple[RegistrationSpec, ...],
    group: str,
    bitmap_size: int,
) -> Iterator[tuple[QueueKey, _Entry]]:
    """Every record of ``topic`` in ``ranges`` with its computed bitmap (``group`` covering all)."""
    for rng in ranges:
        for batch in read_range(rng, topics=(topic,), with_body=False):
            bits, _covered, hit = filter_bitmaps(batch, specs, bitmap_size, covers_all=group)
            keys = zip(
                batch.column("topic").to_pylist(),
                batch.column("queue_id").to_numpy().tolist(),
                batch.column("queue_offset").to_numpy().tolist(),
                strict=True,
            )
            values = zip(
                batch.column("physical_offset").to_numpy().tolist(),
                batch.column("store_size").to_numpy().tolist(),
                tags_codes(batch.column("tags")).tolist(),
                batch.column("store_timestamp").to_numpy().tolist(),
                [row.tobytes() for row in bits],
                hit.tolist(),
                strict=True,
            )
            yield from zip(keys, values, strict=True)


@dataclass(slots=True)
class ExtReport(QueueReport):
    """What a writer task did with one queue's ext units."""

    matched: int = 0  # records the group's expression matches
    bits_set: int = 0  # records whose bitmap gained the group's bits
    created: int = 0  # units (or bitmaps) that did not exist
    mismatches: int = 0  # entries where the ConsumeQueue disagrees with the CommitLog
    damaged: int = 0  # queue offsets whose records were lost to damage (their units kept as they were)
    max_store_timestamp: int = 0

    @property
    def ok(self) -> bool:
        return not self.gaps and not self.duplicates and not self.mismatches


class _LogView:
    """What the plan saw of the CommitLog: its span and the damaged bytes the plan passed over."""

    def __init__(self, store_dir: Path, span: tuple[int, int], damaged: tuple[tuple[int, int], ...]) -> None:
        self.store_dir = store_dir
        self.start, self.end = span
        self.damaged = damaged

    def lost(self, entries: npt.NDArray[np.void]) -> npt.NDArray[np.bool_]:
        """Which ConsumeQueue ``entries`` stand for records lost to damage: fillers, and entries
        pointing into damaged bytes or at bytes of the log where no intact record starts. An entry
        pointing at an intact record, or outside the log, does not."""
        offsets = entries["commit_log_offset"].astype(np.int64)
        lost = filler_entries(entries)
        lost |= in_spans(offsets, self.damaged)
        check = np.flatnonzero(~lost & (offsets >= self.start) & (offsets < self.end))
        if len(check):
            intact = intact_at_offsets(self.store_dir, offsets[check].tolist())
            lost[check] = [found is False for found in intact]
        return lost


class _ExtWriter:
    """Merges one queue's computed bitmaps into its existing units, chunk by chunk, into a new ext log."""

    def __init__(
        self,
        report: ExtReport,
        store_dir: Path,
        staging_root: Path,
        layout: IndexLayout,
        positions: tuple[int, ...],
        *,
        commit_log: _LogView,
    ) -> None:
        topic, queue_id = report.topic, report.queue_id
        self.report = report
        self.commit_log = commit_log
        self.cq = open_queue(store_dir, topic, queue_id, layout, ext=False)
        # entries for records retention removed are not the queue's any more (the broker's open
        # passes over them the same way, in memory): the queue starts at the first record kept
        self.cq.correct_min_offset(commit_log.start)
        self.old = open_queue_ext(store_dir, topic, queue_id, layout)
        self.new = ConsumeQueueExt(
            staging_root / queue_path(CONSUME_QUEUE_EXT_DIR, topic, queue_id),
            layout.entries_per_file,
            layout.bitmap_size,
            checked=layout.ext_checked,
        )
        self.bitmap_size = layout.bitmap_size
        self.byte_index = np.array([p >> 3 for p in positions], dtype=np.intp)
        self.masks = np.array([1 << (p & 7) for p in positions], dtype=np.uint8)
        self.first = -1
        self.rows: list[_Entry] = []

    def add(self, queue_offset: int, entry: _Entry) -> None:
        if self.first < 0:
            self.first = queue_offset
            if self.cq.min_offset < queue_offset:  # entries before the first record read
                self.first = self.cq.min_offset
                self.pass_over(queue_offset)
        self.rows.append(entry)
        if len(self.rows) >= WRITE_CHUNK:
            self.write()

    def write(self) -> None:
        rows, first, n = self.rows, self.first, len(self.rows)
        if not n:
            return
        r = self.report
        offsets, sizes, codes, timestamps, wanted, hits = (list(col) for col in zip(*rows, strict=True))
        self._check_consume_queue(first, offsets, sizes)
        ts = np.array(timestamps, dtype=np.int64)
        hit = np.array(hits, dtype=np.bool_)
        bits = np.frombuffer(b"".join(wanted), dtype=np.uint8).reshape(n, self.bitmap_size).copy()
        have = np.zeros(n, dtype=np.bool_)
        had_ours = np.zeros(n, dtype=np.bool_)
        old = self.old.read_block(first, n)
        if old is not None and len(old.present):
            m = min(n, len(old.present))
            same_record = old.store_timestamps[:m].astype(np.int64) == ts[:m]  # else the unit is stale
            have[:m] = old.present[:m] & (old.bitmap_lengths[:m] > 0) & same_record
            old_bits = np.asarray(old.bitmaps[:m], dtype=np.uint8)
            bits[:m][have[:m]] |= old_bits[have[:m]]
            if len(self.byte_index):
                had_ours[:m] = have[:m] & np.all((old_bits[:, self.byte_index] & self.masks) != 0, axis=1)
        r.matched += int(np.count_nonzero(hit))
        r.bits_set += int(np.count_nonzero(hit & ~had_ours))
        r.created += int(np.count_nonzero(~have))
        r.max_store_timestamp = max(r.max_store_timestamp, int(ts.max()))
        self.new.put_encoded(
            first, self.new.encode_columns(timestamps, codes, [row.tobytes() for row in bits])
        )
        self.first += n
        self.rows = []

    def _check_consume_queue(self, first: int, offsets: list[int], sizes: list[int]) -> None:
        data = (
            self.cq.log.read(first, len(offsets), within_segment=False)
            if first >= self.cq.min_offset
            else None
        )
        entries = np.frombuffer(data or b"", dtype=CQ_DTYPE)
        agree = np.zeros(len(offsets), dtype=np.bool_)
        k = len(entries)
        agree[:k] = (entries["commit_log_offset"] == np.array(offsets[:k])) & (
            entries["size"] == np.array(sizes[:k])
        )
        bad = int(np.count_nonzero(~agree))
        if bad:
            r = self.report
            at = first + int(np.argmin(agree))
            r.mismatches += bad
            r.problem(
                f"{r.topic}:{r.queue_id}: the consume queue disagrees with the commit log at offset {at} "
                f"({bad} entries in {first}..{first + len(offsets) - 1})"
            )

    def pass_over(self, stop: int) -> None:
        """Take the queue offsets from the next one up to ``stop``, which no record read holds: each
        ConsumeQueue entry there must stand for a record lost to damage, and keeps its unit as it was
        (no new bits: the broker passes over such entries, and an absent unit is evaluated exactly)."""
        self.write()
        r = self.report
        while self.first < stop:
            first = self.first
            data = self.cq.log.read(first, min(WRITE_CHUNK, stop - first), within_segment=False)
            entries = np.frombuffer(data or b"", dtype=CQ_DTYPE) if first >= self.cq.min_offset else None
            if entries is None or not len(entries):
                r.mismatches += stop - first
                r.problem(
                    f"{r.topic}:{r.queue_id}: the consume queue has no entries {first}..{stop - 1} "
                    "and the commit log no records for them"
                )
                self.first = stop
                return
            n = len(entries)
            lost = self.commit_log.lost(entries)
            if not lost.all():
                at = first + int(np.argmin(lost))
                bad = n - int(np.count_nonzero(lost))
                r.mismatches += bad
                r.problem(
                    f"{r.topic}:{r.queue_id}: the consume queue entry at offset {at} (commit log offset "
                    f"{int(entries['commit_log_offset'][at - first])}) stands for no record read for the "
                    f"queue and no record lost to damage ({bad} such entries in {first}..{first + n - 1})"
                )
            r.damaged += int(np.count_nonzero(lost))
            kept = self.old.read_units(first, n).tobytes()
            self.new.put_encoded(first, kept + bytes(n * self.new.unit_size - len(kept)))
            self.first += n

    def close(self) -> None:
        self.write()
        r = self.report
        if r.ok and self.cq.max_offset > r.next_offset:  # entries after the last record read
            self.pass_over(self.cq.max_offset)
        self.new.log.flush()
        self.new.log.close()
        self.old.log.close()
        self.cq.close()

    def abandon(self) -> None:
        self.new.log.close()
        self.old.log.close()
        self.cq.close()


def write_ext_units(
    rows: Iterable[tuple[QueueKey, _Entry]],
    *,
    store_dir: str,
    staging_root: str,
    layout: IndexLayout,
    positions: tuple[int, ...],
    log_span: tuple[int, int],
    damaged: tuple[tuple[int, int], ...],
) -> Iterator[ExtReport]:
    """Write new ext logs for the queues of one sorted shuffle partition; one report per queue.

    ``log_span`` is the planned CommitLog's ``[start, end)`` and ``damaged`` the ``(offset, length)``
    of the damaged bytes the plan passed over: queue offsets no record read holds are accepted where
    the ConsumeQueue's entries stand for records lost to damage (see :meth:`_ExtWriter.pass_over`).
    """
    commit_log = _LogView(Path(store_dir), log_span, damaged)
    for (topic, queue_id), entries in group_by_queue(rows):
        report = ExtReport(topic, queue_id)
        checker = ConsecutiveChecker(report, fill_gaps=True)
        writer: _ExtWriter | None = _ExtWriter(
            report, Path(store_dir), Path(staging_root), layout, positions, commit_log=commit_log
        )
        try:
            for queue_offset, entry in entries:
                if not checker.accept(queue_offset, entry[0]):
                    if writer is not None:
                        writer.abandon()
                        writer = None
                    continue
                if writer is not None:
                    if checker.missing:
                        writer.pass_over(checker.missing.stop)
                    writer.add(queue_offset, entry)
        except BaseException:
            if writer is not None:
                writer.abandon()
            raise
        if writer is not None:
            writer.close()
        yield report


# -------------------------------------------------------------------------------------------- the job


@dataclass(frozen=True, slots=True)
class BackfillResult:
    """The summary of a backfill run."""

    data_dir: Path
    group: str
    topic: str
    version: int
    expression: str
    records: int
    queues: int
    matched: int
    bits_set: int
    created: int
    backfilled_until_ms: int
    #: queue offsets whose records were lost to damage: passed over, their units left as they were
    lost_to_damage: int = 0


def run_backfill(
    spark: Any,
    data_dir: Path,
    group: str,
    topic: str,
    *,
    plan: ScanPlan | None = None,
    on_progress: ProgressCallback | None = None,
    target_bytes: int | None = None,
    before_install: Callable[[IndexStaging], None] | None = None,
) -> BackfillResult:
    """Compute ``group#topic``'s bloom bits for the stored history of the stopped broker at ``data_dir``.

    Raises :class:`NotFoundError` (listing the registrations there are) when ``group#topic`` is not
    registered, :class:`~siftmq.errors.StoreLockedError` while a broker has the store open, and
    :class:`StoreError` for a log that does not end cleanly, a record that cannot be decoded, or a
    ConsumeQueue that disagrees with the CommitLog other than at records lost to damage (nothing
    is installed then). ``before_install`` is called with the staging tree just before the
    install (tests use it to simulate a crash). ``plan``, ``on_progress`` and ``target_bytes`` are as
    for :func:`~siftmq.spark.jobs.reindex.run_reindex`.
    """
    store_dir, config_dir = store_paths(data_dir)
    with open_offline(store_dir, what=f"the broker data dir {data_dir}") as offline:
        layout = store_layout(store_dir)
        registry = RegistrationFile(config_dir)
        registration = registry.get(group, topic)
        if registration is None:
            known = [f"{r.bloom_key} (v{r.version}: {r.expression})" for r in registry.all()]
            listing = "; ".join(known[:_MAX_LISTED]) + (" ..." if len(known) > _MAX_LISTED else "")
            raise NotFoundError(
                f"no SQL92 filter registration {group}#{topic} in {config_dir / 'filters.json'}; "
                f"registered: {listing or 'none'}",
                status=StatusCode.CONSUMER_GROUP_NOT_FOUND,
            )
        specs = specs_by_topic(r for r in registry.all() if r.topic == topic)[topic]
        plan = checked_plan(spark, store_dir, plan, target_bytes, "backfill")
        staging = offline.new_staging()
        try:
            reports: list[ExtReport] = []
            if plan.ranges:
                sc = spark.sparkContext
                computed = sc.parallelize(list(plan.ranges), len(plan.ranges)).mapPartitions(
                    functools.partial(
                        backfill_entries,
                        topic=topic,
                        specs=specs,
                        group=group,
                        bitmap_size=layout.bitmap_size,
                    )
                )
                written = computed.repartitionAndSortWithinPartitions(
                    max(1, int(sc.defaultParallelism)), queue_partition
                ).mapPartitions(
                    functools.partial(
                        write_ext_units,
                        store_dir=str(store_dir),
                        staging_root=str(staging.root),
                        layout=layout,
                        positions=RegistrationSpec.of(registration).positions,
                        log_span=(plan.start_offset, plan.end_offset),
                        damaged=plan.damaged,
                    )
                )
                reports = run_action(spark, written.collect, on_progress, f"backfill {group}#{topic}")
            bad = [r for r in reports if not r.ok]
            if bad:
                problems = [p for r in bad for p in (r.problems or [])]
                raise StoreError(
                    f"{len(bad)} queue(s) of {topic} in {store_dir} cannot be backfilled "
                    "(run reindex first); "
                    "nothing was installed:\n  " + "\n  ".join(problems[:20])
                )
            if before_install is not None:
                before_install(staging)
            paths = [queue_path(CONSUME_QUEUE_EXT_DIR, r.topic, r.queue_id) for r in reports]
            if paths:
                install(staging, paths)
            else:
                staging.discard()
        except BaseException:
            if not (store_dir / JOURNAL_FILE).exists():
                staging.discard()
            raise
        records = sum(r.records for r in reports)
        until = max((r.max_store_timestamp for r in reports), default=0)
        if not records:
            until = registration.born_time_ms + REGISTRATION_MARGIN_MS
        recorded = registry.record_backfill(group, topic, version=registration.version, until_ms=until)
    return BackfillResult(
        data_dir=data_dir,
        group=group,
        topic=topic,
        version=registration.version,
        expression=registration.expression,
        records=records,
        queues=len(reports),
        matched=sum(r.matched for r in reports),
        bits_set=sum(r.bits_set for r in reports),
        created=sum(r.created for r in reports),
        backfilled_until_ms=recorded.backfilled_until_ms or until,
        lost_to_damage=sum(r.damaged for r in reports),
    )
