"""``siftmq spark reindex``: rebuild a stopped broker's ConsumeQueues and ConsumeQueueExt from its CommitLog.

The CommitLog is the truth; the per-queue indexes are derived from it (DESIGN.md). This job derives
them again, in parallel, from the segment files alone, so a store whose index files were lost or
damaged serves again after a broker restart, with the same results as before.

Steps:

1. :func:`~siftmq.store.offline.open_offline` holds the store's lock for the whole job (a running
   broker makes it refuse, naming the data dir; so does a store that was not closed cleanly) and
   finishes an index install a crash interrupted.
2. The driver cuts the CommitLog into byte ranges at record boundaries
   (:func:`~siftmq.store.bulk.plan_scan`); a log that does not end cleanly is refused.
3. One Spark task per range decodes its records without bodies
   (:func:`~siftmq.store.bulk.read_range`) and computes each record's index entry: CommitLog offset,
   size, tags code (Java ``String.hashCode`` of the tag, 0 without one), and its ConsumeQueueExt
   unit: store time, tags code and bitmap.
4. The entries are shuffled by queue and sorted by queue offset
   (``repartitionAndSortWithinPartitions``); each task writes the queues of its partition into a
   staging tree with the store's own ConsumeQueue writers, checking that every queue's offsets are
   consecutive (a gap or a duplicate means a damaged log: it is reported and nothing is installed).
5. Queues that have index files but no record left in the CommitLog (retention deleted them all,
   or every record was lost to damage) are carried over, so their offsets continue where they were
   (their extension units too, unless they are of a store made before the bitmap check: step 7).
6. Every queue offset handed out before stays taken, as the broker's recovery keeps them: a queue
   whose last records were lost to damage (the log going on with other queues' records) would
   otherwise end before them, and the broker would give their offsets to new messages, which a
   consumer already past them never reads. What a queue had handed out is the larger of its old
   ConsumeQueue's end (where its files are readable) and the furthest any group's progress went in
   ``<data>/config`` (receive positions in ``consumer_state.json``, committed pull offsets in
   ``consumer_offsets.json``); the offsets past the rebuilt queue's last record get filler entries
   as recovery writes them at a queue's end (size 0, the log's end offset, no store time). A
   queue that lost its first records starts after them, as recovery's rebuild leaves it (reads
   before the first offset move to it). Progress of a deleted topic (a tombstone) counts only for
   queues the job finds otherwise: a deletion cut short by a crash can leave it behind.
7. The new ``consumequeue/`` and ``consumequeue_ext/`` replace the old ones in one crash-safe install
   (:func:`~siftmq.store.offline.install`), and the checkpoint is set to the end of the log. The
   new extension units always hold a bitmap check, and the new tree has the marker, so a store made
   before the check is moved to it here. A queue carried over (step 5) keeps its extension units
   only when they hold checks already; older ones describe records the log no longer has and go
   with the old tree (a read finds no unit there, as in a store whose ``consumequeue_ext/`` was
   removed).

Bitmaps: the registrations in ``<data>/config/filters.json`` are evaluated with the evaluator live
dispatch uses (``CompiledFilter.matches_batch`` over the property columns, an evaluation failure
setting the bits). A registration's bloom bits go into a record's bitmap when its expression matches
the record *and* the registration covers the record
(:func:`~siftmq.filter.registrations.bitmap_trusted`: stored more than the margin after its born
time, or up to its backfill coverage), the rule the broker's SqlMessageFilter applies when it reads
them. A record that no registration covers gets no bitmap. So for every registration and every
record, the broker skips exactly the entries it skipped before; the rebuilt ConsumeQueue files are
byte-for-byte the ones dispatch wrote, ext units carry the same store times and tags codes, and
bitmaps differ only where no current registration reads them (records before a registration's born
time, bits of registrations that have since been dropped or changed).

The executors write the staging tree directly: run on a local master, or on a cluster whose
executors all see the store directory at the same path.
"""

from __future__ import annotations

import functools
import itertools
import logging
import zlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Final, TypeVar

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from siftmq.errors import ConfigError, SiftError, StoreError
from siftmq.filter import BloomFilter
from siftmq.filter.registrations import Registration, bitmap_trusted
from siftmq.spark.jobs.common import (
    ProgressCallback,
    plan_commitlog,
    run_tracked,
    store_dir_of,
    worker_error,
)
from siftmq.spark.jobs.registrations import RegistrationFile, RegistrationSpec, specs_by_topic
from siftmq.store import StoreConfig, tags_code_of
from siftmq.store.bulk import ByteRange, ScanPlan, data_after, plan_scan, read_range
from siftmq.store.codec import check_topic_name
from siftmq.store.consumequeue import CQ_STORE_UNIT_SIZE, ConsumeQueue, encode_entry_columns
from siftmq.store.consumequeue_ext import mark_checked, units_checked
from siftmq.store.offline import (
    CONSUME_QUEUE_DIR,
    CONSUME_QUEUE_EXT_DIR,
    JOURNAL_FILE,
    IndexLayout,
    IndexStaging,
    install,
    open_offline,
    open_queue,
    queue_path,
    stored_queues,
)
from siftmq.store.recovery import Checkpoint
from siftmq.store.segment import list_segment_starts
from siftmq.store.statefile import peek_json
from siftmq.store.tombstones import read_tombstones

_log = logging.getLogger(__name__)

#: Entries written per ``put_encoded`` call (bounds the memory of one queue writer).
WRITE_CHUNK: Final = 8192
#: Problems (gaps, duplicates) reported per queue.
MAX_PROBLEMS_PER_QUEUE: Final = 5
#: The broker's consumer progress in its config directory (``broker/consumer_state.py``,
#: ``broker/offsets.py``), keyed ``group\ttopic\tqueue_id``.
CONSUMER_STATE_FILE: Final = "consumer_state.json"
CONSUMER_OFFSETS_FILE: Final = "consumer_offsets.json"

_T = TypeVar("_T")

QueueKey = tuple[str, int, int]
"""(topic, queue_id, queue_offset): the shuffle key of an index entry."""


# ------------------------------------------------------------------------------------- store layout


def store_paths(data_dir: Path) -> tuple[Path, Path]:
    """The store and config directories of a broker data dir (``<data>/store``, ``<data>/config``).

    Raises :class:`ConfigError` when ``data_dir`` holds no broker store.
    """
    return store_dir_of(data_dir), Path(data_dir) / "config"


def checked_plan(
    spark: Any, store_dir: Path, plan: ScanPlan | None, target_bytes: int | None, job: str
) -> ScanPlan:
    """``plan``, or a new plan of the whole log; refuses a log that does not end cleanly.

    Called with the store held offline (closed cleanly, no broker): the log is planned as the
    broker's recovery scans it (``stopped_cleanly``: zeros with data after them and a missing
    segment file are damage passed over). A ``plan`` made that way before the job took the store's
    lock is checked to still end where the log ends (nothing was appended in between); one made
    otherwise is planned again.
    """
    if plan is None or not plan.stopped_cleanly:
        plan = plan_commitlog(spark, store_dir, target_bytes=target_bytes, stopped_cleanly=True)
    elif plan.stop_reason is None:
        try:
            tail = plan_scan(store_dir, start_offset=plan.end_offset).records
        except StoreError:
            tail = -1
        if tail:
            raise StoreError(
                f"the commit log in {store_dir} changed after it was planned (did a broker run?); "
                f"run {job} again"
            )
    if plan.stop_reason is not None:
        raise StoreError(
            f"the commit log in {store_dir} does not end cleanly ({plan.stop_reason}); "
            f"start the broker once so its recovery settles the log, then run {job} again"
        )
    found = data_after(store_dir, plan.end_offset)
    if found is not None:
        # a plan handed in that ends before the data does (planned to an end offset, say): the
        # job would leave out every record after its end
        raise StoreError(
            f"the commit log in {store_dir} holds data at offset {found}, after the end of the plan "
            f"at offset {plan.end_offset}: {job} would leave out the records after it. Run "
            "`siftmq store check` to see whether the log is damaged there"
        )
    return plan


def store_layout(store_dir: Path) -> IndexLayout:
    """The index geometry the broker opens ``store_dir`` with (its StoreConfig, its bloom filter).

    Raises :class:`ConfigError` if existing ConsumeQueue files were written with another geometry.
    """
    layout = IndexLayout(
        StoreConfig(data_dir=store_dir).consume_queue_entries_per_file,
        BloomFilter().bitmap_size,
        # the job holds the store: a tree without units yet is marked as the broker would mark it
        units_checked(store_dir / CONSUME_QUEUE_EXT_DIR, mark_new=True),
    )
    segment_bytes = layout.entries_per_file * CQ_STORE_UNIT_SIZE
    for topic, queue_id in stored_queues(store_dir):
        starts = list_segment_starts(store_dir / queue_path(CONSUME_QUEUE_DIR, topic, queue_id))
        if any(start % segment_bytes for start in starts):
            raise ConfigError(
                f"the consume queue files of {topic}:{queue_id} in {store_dir} do not have "
                f"{layout.entries_per_file} entries per file; this job cannot write that layout"
            )
    return layout


# ------------------------------------------------------------------------------ entries (executors)


def tags_codes(tags: pa.Array | pa.ChunkedArray) -> npt.NDArray[np.int64]:
    """The tags code of every row (each distinct tag hashed once; 0 where there is no tag)."""
    encoded = pc.dictionary_encode(tags)
    if isinstance(encoded, pa.ChunkedArray):
        encoded = encoded.combine_chunks()
    codes = np.fromiter(
        (tags_code_of(t) for t in encoded.dictionary.to_pylist()),
        dtype=np.int64,
        count=len(encoded.dictionary),
    )
    indices = encoded.indices.fill_null(-1).to_numpy(zero_copy_only=False)
    out = np.zeros(len(indices), dtype=np.int64)
    present = indices >= 0
    out[present] = codes[indices[present]]
    return out


def filter_bitmaps(
    batch: pa.RecordBatch,
    specs: Sequence[RegistrationSpec],
    bitmap_size: int,
    *,
    covers_all: str | None = None,
) -> tuple[npt.NDArray[np.uint8], npt.NDArray[np.bool_], npt.NDArray[np.bool_]]:
    """Bitmaps of the rows of ``batch`` (records of one topic) for the registrations ``specs``.

    Returns ``(bits, covered, hit)``: ``bits`` is ``(n, bitmap_size)``, with a registration's bloom
    bits set in the rows it matches and covers; ``covered[i]`` tells whether any registration covers
    row ``i`` (a row no registration covers gets no bitmap); ``hit[i]`` whether the registration of
    the group ``covers_all`` matched row ``i``. That registration is taken to cover every row: the
    backfill computes its bits for the history its coverage will include.
    """
    n = batch.num_rows
    bits = np.zeros((n, bitmap_size), dtype=np.uint8)
    covered = np.zeros(n, dtype=np.bool_)
    hit = np.zeros(n, dtype=np.bool_)
    if n == 0 or not specs:
        return bits, covered, hit
    compiled = [spec.compiled() for spec in specs]
    names = sorted(set().union(*(c.properties for c in compiled)))
    properties = batch.column("properties")
    columns = {name: pc.map_lookup(properties, name, "last") for name in names}
    columns["\0rows"] = pa.nulls(n, pa.string())  # keeps the row count when no property is read
    table = pa.RecordBatch.from_pydict(columns)
    store_timestamps = batch.column("store_timestamp").to_numpy()
    for spec, flt in zip(specs, compiled, strict=True):
        if spec.group == covers_all:
            trusted = np.ones(n, dtype=np.bool_)
        else:
            trusted = bitmap_trusted(store_timestamps, spec.born_time_ms, spec.backfilled_until_ms)
        if not trusted.any():
            continue
        covered |= trusted
        try:
            matched = flt.matches_batch(table)
        except Exception:  # as live dispatch: a filter bug sets the bits, so reads evaluate exactly
            matched = np.ones(n, dtype=np.bool_)
        if spec.group == covers_all:
            hit = matched.copy()
        matched &= trusted
        if not matched.any():
            continue
        for p in spec.positions:
            if p >> 3 < bitmap_size:
                bits[matched, p >> 3] |= np.uint8(1 << (p & 7))
    return bits, covered, hit


def _topic_rows(batch: pa.RecordBatch) -> dict[str, npt.NDArray[np.int64]]:
    """Row indexes of each topic in ``batch``."""
    encoded = pc.dictionary_encode(batch.column("topic"))
    indices = encoded.indices.to_numpy(zero_copy_only=False)
    return {topic: np.flatnonzero(indices == i) for i, topic in enumerate(encoded.dictionary.to_pylist())}


def index_entries(
    ranges: Iterable[ByteRange],
    *,
    specs: dict[str, tuple[RegistrationSpec, ...]],
    bitmap_size: int,
) -> Iterator[tuple[QueueKey, tuple[int, int, int, int, bytes | None]]]:
    """The index entry of every record in ``ranges`` (a Spark task's partition of the plan).

    Yields ``((topic, queue_id, queue_offset), (commit_log_offset, size, tags_code,
    store_timestamp, bitmap))``.
    """
    for rng in ranges:
        for batch in read_range(rng, with_body=False):
            n = batch.num_rows
            codes = tags_codes(batch.column("tags"))
            bitmaps: list[bytes | None] = [None] * n
            for topic, rows in _topic_rows(batch).items():
                topic_specs = specs.get(topic)
                if not topic_specs:
                    continue
                bits, covered, _hit = filter_bitmaps(batch.take(pa.array(rows)), topic_specs, bitmap_size)
                for j in np.flatnonzero(covered).tolist():
                    bitmaps[int(rows[j])] = bits[j].tobytes()
            keys = zip(
                batch.column("topic").to_pylist(),
                batch.column("queue_id").to_numpy().tolist(),
                batch.column("queue_offset").to_numpy().tolist(),
                strict=True,
            )
            values = zip(
                batch.column("physical_offset").to_numpy().tolist(),
                batch.column("store_size").to_numpy().tolist(),
                codes.tolist(),
                batch.column("store_timestamp").to_numpy().tolist(),
                bitmaps,
                strict=True,
            )
            yield from zip(keys, values, strict=True)


def queue_partition(key: QueueKey) -> int:
    """The shuffle partition of an entry: by queue, stable across processes (``hash`` of a str is not)."""
    return zlib.crc32(f"{key[0]}\0{key[1]}".encode())


# ---------------------------------------------------------------------------------- writing (executors)


@dataclass(slots=True)
class QueueReport:
    """What a writer task did with one queue (sent back to the driver)."""

    topic: str
    queue_id: int
    first_offset: int = -1
    next_offset: int = -1
    records: int = 0
    bitmaps: int = 0  # entries given a bitmap
    matched: int = 0  # entries whose bitmap has bits set (some registration matched)
    gaps: int = 0
    duplicates: int = 0
    filled: int = 0  # queue offsets of records lost to damage, given filler entries
    problems: list[str] | None = None

    def problem(self, text: str) -> None:
        if self.problems is None:
            self.problems = []
        if len(self.problems) < MAX_PROBLEMS_PER_QUEUE:
            self.problems.append(text)

    @property
    def ok(self) -> bool:
        return not self.gaps and not self.duplicates


class ConsecutiveChecker:
    """Follows one queue's sorted offsets; reports gaps and duplicates into a :class:`QueueReport`.

    With ``fill_gaps`` a gap is not a problem but records lost to damage (the reads passed over
    them, as the broker's recovery does): :attr:`missing` then holds the offsets to fill.
    """

    def __init__(self, report: QueueReport, *, fill_gaps: bool = False) -> None:
        self.report = report
        self.fill_gaps = fill_gaps
        self.missing = range(0)

    def accept(self, queue_offset: int, commit_log_offset: int) -> bool:
        """True if ``queue_offset`` continues the queue (the first offset always does)."""
        r = self.report
        self.missing = range(0)
        if r.first_offset < 0:
            r.first_offset = r.next_offset = queue_offset
        if queue_offset == r.next_offset:
            r.next_offset += 1
            r.records += 1
            return True
        if queue_offset < r.next_offset:
            r.duplicates += 1
            r.problem(
                f"{r.topic}:{r.queue_id} offset {queue_offset} is stored twice "
                f"(again at commit log offset {commit_log_offset})"
            )
        elif self.fill_gaps:
            self.missing = range(r.next_offset, queue_offset)
            r.filled += len(self.missing)
            r.next_offset = queue_offset + 1
            r.records += 1
            return True
        else:
            r.gaps += 1
            r.problem(
                f"{r.topic}:{r.queue_id} offsets {r.next_offset}..{queue_offset - 1} are missing "
                f"(the next record is at commit log offset {commit_log_offset})"
            )
            r.next_offset = queue_offset + 1
            r.records += 1
        return False


def group_by_queue(
    rows: Iterable[tuple[QueueKey, Any]],
) -> Iterator[tuple[tuple[str, int], Iterator[tuple[int, Any]]]]:
    """Split sorted ``((topic, queue_id, queue_offset), value)`` rows into per-queue runs of
    ``(queue_offset, value)`` (consume each run before asking for the next)."""
    for queue, run in itertools.groupby(rows, key=_queue_of):
        yield queue, ((key[2], value) for key, value in run)


def _queue_of(row: tuple[QueueKey, Any]) -> tuple[str, int]:
    return row[0][0], row[0][1]


class _QueueWriter:
    """Writes one queue's entries, in chunks, with the store's ConsumeQueue (and ext) writer."""

    def __init__(self, cq: ConsumeQueue) -> None:
        self.cq = cq
        self.first = -1
        self.offsets: list[int] = []
        self.sizes: list[int] = []
        self.codes: list[int] = []
        self.timestamps: list[int] = []
        self.bitmaps: list[bytes | None] = []

    def add(self, queue_offset: int, entry: tuple[int, int, int, int, bytes | None]) -> None:
        if self.first < 0:
            self.first = queue_offset
        offset, size, code, ts, bitmap = entry
        self.offsets.append(offset)
        self.sizes.append(size)
        self.codes.append(code)
        self.timestamps.append(ts)
        self.bitmaps.append(bitmap)
        if len(self.offsets) >= WRITE_CHUNK:
            self.write()

    def write(self) -> None:
        if not self.offsets:
            return
        ext = self.cq.ext
        ext_units = ext.encode_columns(self.timestamps, self.codes, self.bitmaps) if ext is not None else None
        self.cq.put_encoded(self.first, encode_entry_columns(self.offsets, self.sizes, self.codes), ext_units)
        self.first += len(self.offsets)
        for column in (self.offsets, self.sizes, self.codes, self.timestamps, self.bitmaps):
            column.clear()

    def close(self) -> None:
        self.write()
        self.cq.flush()
        self.cq.close()


def write_queues(
    rows: Iterable[tuple[QueueKey, tuple[int, int, int, int, bytes | None]]],
    *,
    staging_root: str,
    layout: IndexLayout,
) -> Iterator[QueueReport]:
    """Write the queues of one sorted shuffle partition into the staging tree; one report per queue.

    Queue offsets missing between two records are records lost to damage (the reads passed over
    them): each gets a filler entry (size 0, the next record's CommitLog offset and store time), as
    the broker's recovery writes, so the offsets after it do not move. A queue with a duplicate
    offset stops being written (the job installs nothing then) but is still followed to the end,
    so the report counts all its problems.
    """
    root = Path(staging_root)
    for (topic, queue_id), entries in group_by_queue(rows):
        report = QueueReport(topic, queue_id)
        checker = ConsecutiveChecker(report, fill_gaps=True)
        writer: _QueueWriter | None = _QueueWriter(open_queue(root, topic, queue_id, layout))
        try:
            for queue_offset, entry in entries:
                if not checker.accept(queue_offset, entry[0]):
                    if writer is not None:
                        writer.cq.close()
                        writer = None
                    continue
                if writer is not None:
                    for missing in checker.missing:  # as the broker's recovery writes them
                        writer.add(missing, (entry[0], 0, 0, entry[3], None))
                    writer.add(queue_offset, entry)
                    if entry[4] is not None:
                        report.bitmaps += 1
                        report.matched += any(entry[4])
        finally:
            if writer is not None:
                writer.close()
        yield report


# --------------------------------------------------------------------- offsets handed out (driver)


def consumed_offsets(config_dir: Path) -> dict[tuple[str, int], int]:
    """Per (topic, queue_id), the furthest any group's progress went: its receive position (the
    next offset a receive reads; its messages in flight are below it) or its committed pull offset.
    Every queue offset below it was handed out. The files are read as the broker reads them, but
    nothing is moved or logged (:func:`~siftmq.store.statefile.peek_json`); a file with no good
    generation, or an entry that is not the broker's, raises :class:`ConfigError`: the broker would
    not start with it either."""
    found: dict[tuple[str, int], int] = {}
    for name in (CONSUMER_STATE_FILE, CONSUMER_OFFSETS_FILE):
        path = config_dir / name
        entries = peek_json(path, {})
        try:
            for key, value in entries.items():
                _group, topic, queue_id = key.split("\t")
                offset = int(value["pop"]) if name == CONSUMER_STATE_FILE else int(value)
                queue = (topic, int(queue_id))
                found[queue] = max(offset, found.get(queue, 0))
        except (AttributeError, ValueError, TypeError, KeyError) as exc:
            raise ConfigError(f"{path} is not consumer progress this broker wrote: {exc!r}") from exc
    return found


def handed_out_offsets(
    store_dir: Path, config_dir: Path, layout: IndexLayout, rebuilt: Iterable[tuple[str, int]]
) -> dict[tuple[str, int], int]:
    """Per queue, how far its offsets were handed out before this job: the end of the old
    ConsumeQueue of each ``rebuilt`` queue (written entries only; a queue whose files cannot be
    read tells nothing) and the groups' progress (:func:`consumed_offsets`), whichever is larger.
    Progress of a deleted topic's queue that neither ``rebuilt`` nor the old index holds is left
    out: a deletion cut short by a crash leaves it, and the topic created again starts at 0."""
    rebuilt = set(rebuilt)
    stored = set(stored_queues(store_dir))
    taken: dict[tuple[str, int], int] = {}
    for topic, queue_id in sorted(rebuilt & stored):
        try:
            cq = open_queue(store_dir, topic, queue_id, layout, ext=False)
        except (OSError, StoreError, ValueError) as exc:
            _log.warning("%s:%d: the old consume queue cannot be read (%s)", topic, queue_id, exc)
            continue
        try:
            taken[(topic, queue_id)] = cq.written_max_offset()
        finally:
            cq.close()
    deleted = read_tombstones(store_dir)
    for (topic, queue_id), offset in consumed_offsets(config_dir).items():
        key = (topic, queue_id)
        if topic in deleted and key not in rebuilt and key not in stored:
            continue
        try:
            check_topic_name(topic)
        except (ValueError, SiftError) as exc:
            _log.error("ignoring progress of queue %s:%d in %s: %s", topic, queue_id, config_dir, exc)
            continue
        if queue_id >= 0:
            taken[key] = max(offset, taken.get(key, 0))
    return taken


def keep_handed_out(
    staging: IndexStaging,
    layout: IndexLayout,
    taken: dict[tuple[str, int], int],
    written: dict[tuple[str, int], int],
    *,
    end_offset: int,
) -> int:
    """Give each staged queue filler entries up to the offset it had handed out (``taken``), as the
    broker's recovery does at a queue's end (size 0, the CommitLog's ``end_offset``, no store time);
    ``written``: the next offset of each rebuilt queue. Returns how many queue offsets were kept
    that way (an empty queue gets one filler, just below its offset: those before it are below its
    min offset)."""
    kept = 0
    for (topic, queue_id), offset in sorted(taken.items()):
        if written.get((topic, queue_id), 0) >= offset:
            continue
        cq = open_queue(staging.root, topic, queue_id, layout)
        try:
            if cq.max_offset >= offset:  # a queue carried over
                continue
            _log.warning(
                "%s:%d: queue offsets %d..%d stand for records no longer in the commit log; they stay taken",
                topic, queue_id, cq.max_offset, offset - 1,
            )  # fmt: skip
            kept += offset - cq.max_offset
            cq.fill_to(offset, end_offset)
            cq.flush()
        finally:
            cq.close()
    return kept


# ---------------------------------------------------------------------------------------- progress


def run_action(
    spark: Any, action: Callable[[], _T], on_progress: ProgressCallback | None, description: str
) -> _T:
    """Run a Spark action reporting its tasks to ``on_progress``; a siftmq error raised in a worker
    becomes a :class:`StoreError` with the worker's message (instead of Spark's wrapped traceback)."""
    try:
        return run_tracked(spark, action, on_progress, description=description)
    except SiftError:
        raise
    except Exception as exc:
        found = worker_error(exc)
        if found is None:
            raise
        raise StoreError(f"{description} failed in a Spark task: {found}") from exc


# -------------------------------------------------------------------------------------------- the job


@dataclass(frozen=True, slots=True)
class ReindexResult:
    """The summary of a reindex run."""

    data_dir: Path
    ranges: int
    bytes: int
    records: int
    queues: int
    carried_over: int
    bitmaps: int
    matched: int
    registrations: int
    end_offset: int
    #: queue offsets of records lost to damage between two records of a queue, given filler entries
    filled: int = 0
    #: queue offsets handed out past a queue's last record in the log (lost to damage, or known only
    #: from consumer progress), kept taken with filler entries at the queue's end
    tail_filled: int = 0
    #: (offset, length) of the damaged CommitLog bytes the plan passed over
    damaged: tuple[tuple[int, int], ...] = ()


def run_reindex(
    spark: Any,
    data_dir: Path,
    *,
    plan: ScanPlan | None = None,
    on_progress: ProgressCallback | None = None,
    target_bytes: int | None = None,
    before_install: Callable[[IndexStaging], None] | None = None,
) -> ReindexResult:
    """Rebuild the ConsumeQueues and ConsumeQueueExt units of the stopped broker at ``data_dir``.

    Every queue offset handed out before (by the old ConsumeQueue or the groups' progress in
    ``<data>/config``) stays taken (step 6 of the module doc).

    Raises :class:`~siftmq.errors.StoreLockedError` while a broker has the store open,
    :class:`StoreError` for a store that was not closed cleanly or whose CommitLog is damaged (a
    gap or a duplicate queue offset: nothing is installed then), :class:`ConfigError` for consumer
    progress that cannot be read (the broker would not start with it). ``before_install`` is called with
    the complete staging tree just before it is installed (tests use it to simulate a crash).

    ``plan`` (of the stopped store) is used as is, else the log is planned with ``target_bytes``
    (None: sized for the session); ``on_progress`` gets the Spark tasks' progress.
    """
    store_dir, config_dir = store_paths(data_dir)
    with open_offline(store_dir, what=f"the broker data dir {data_dir}") as offline:
        layout = store_layout(store_dir)
        # the new tree's units always hold a bitmap check, whatever the store's held (its upgrade)
        staged = replace(layout, ext_checked=True)
        registrations = RegistrationFile(config_dir).all()
        plan = checked_plan(spark, store_dir, plan, target_bytes, "reindex")
        staging = offline.new_staging()
        try:
            reports = _build(
                spark,
                on_progress,
                ranges=plan.ranges,
                registrations=registrations,
                layout=staged,
                staging=staging,
            )
            bad = [r for r in reports if not r.ok]
            if bad:
                problems = [p for r in bad for p in (r.problems or [])]
                raise StoreError(
                    f"the commit log in {store_dir} is damaged: {len(bad)} queue(s) have gaps or duplicate "
                    "offsets; nothing was installed:\n  " + "\n  ".join(problems[:20])
                )
            written = {(r.topic, r.queue_id): r.next_offset for r in reports}
            taken = handed_out_offsets(store_dir, config_dir, layout, written)
            carried = 0
            for topic, queue_id in stored_queues(store_dir):
                if (topic, queue_id) not in written:
                    carried += staging.copy_from_store(queue_path(CONSUME_QUEUE_DIR, topic, queue_id))
                    if layout.ext_checked:
                        # units without checks go with the old tree: they describe records the log no
                        # longer holds, and a read finds no unit there, as in a store whose tree was removed
                        staging.copy_from_store(queue_path(CONSUME_QUEUE_EXT_DIR, topic, queue_id))
            tail_filled = keep_handed_out(staging, staged, taken, written, end_offset=plan.end_offset)
            for name in (CONSUME_QUEUE_DIR, CONSUME_QUEUE_EXT_DIR):
                (staging.root / name).mkdir(exist_ok=True)
            mark_checked(staging.root / CONSUME_QUEUE_EXT_DIR)  # replaces the store's tree, marker and all
            if before_install is not None:
                before_install(staging)
            install(
                staging,
                [CONSUME_QUEUE_DIR, CONSUME_QUEUE_EXT_DIR],
                checkpoint=Checkpoint(plan.end_offset, plan.end_offset),
            )
        except BaseException:
            if not (store_dir / JOURNAL_FILE).exists():
                staging.discard()
            raise
    return ReindexResult(
        data_dir=data_dir,
        ranges=len(plan.ranges),
        bytes=plan.bytes,
        records=sum(r.records for r in reports),
        queues=len(reports),
        carried_over=carried,
        bitmaps=sum(r.bitmaps for r in reports),
        matched=sum(r.matched for r in reports),
        registrations=len(registrations),
        end_offset=plan.end_offset,
        filled=sum(r.filled for r in reports),
        tail_filled=tail_filled,
        damaged=plan.damaged,
    )


def _build(
    spark: Any,
    on_progress: ProgressCallback | None,
    *,
    ranges: Sequence[ByteRange],
    registrations: Sequence[Registration],
    layout: IndexLayout,
    staging: IndexStaging,
) -> list[QueueReport]:
    if not ranges:
        return []
    sc = spark.sparkContext
    entries = sc.parallelize(list(ranges), len(ranges)).mapPartitions(
        functools.partial(index_entries, specs=specs_by_topic(registrations), bitmap_size=layout.bitmap_size)
    )
    partitions = max(1, int(sc.defaultParallelism))
    written = entries.repartitionAndSortWithinPartitions(partitions, queue_partition).mapPartitions(
        functools.partial(write_queues, staging_root=str(staging.root), layout=layout)
    )
    reports: list[QueueReport] = run_action(spark, written.collect, on_progress, "reindex")
    return sorted(reports, key=lambda r: (r.topic, r.queue_id))
