"""What every bulk job shares: the CommitLog as a DataFrame, store checks, progress, error summaries.

:func:`commitlog_dataframe` plans the store's byte ranges on the driver (:func:`siftmq.store.bulk.plan_scan`)
and reads them with :class:`CommitLogDataSource`, a Python data source whose ``read()`` runs
:func:`siftmq.store.bulk.read_range` in the executors and yields Arrow batches of
:data:`~siftmq.store.bulk.RECORD_SCHEMA` (one Spark partition per range). The classes live in this
package so the Python workers can import them.

The jobs only read segment files. A store a broker has open may be read (see
:func:`store_in_use`): the plan is a snapshot of the complete records at planning time. Spark must
run where the segment files are (``local[*]``, or executors sharing the store's filesystem).
"""

from __future__ import annotations

import json
import os
import re
import threading
import uuid
from collections.abc import Callable, Collection, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Final, TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.types import (
    BinaryType,
    DataType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
)

from siftmq import errors
from siftmq.errors import ConfigError
from siftmq.filter import CompiledFilter, compile_filter
from siftmq.store import bulk
from siftmq.store.bulk import ByteRange, RowFilter, ScanPlan

_T = TypeVar("_T")

SOURCE_NAME: Final = "siftmq_commitlog"
MIN_TARGET_BYTES: Final = 1024 * 1024
MAX_TARGET_BYTES: Final = bulk.DEFAULT_TARGET_BYTES
RANGES_PER_CORE: Final = 3  # ranges per core when a store is small enough to cut finer
# Arrow batches handed to the JVM: smaller than the bulk reader's default, to bound executor memory
SPARK_BATCH_ROWS: Final = 16384
SPARK_BATCH_BYTES: Final = 32 * 1024 * 1024

_SPARK_TYPES: Final[dict[pa.DataType, DataType]] = {
    pa.string(): StringType(),
    pa.int32(): IntegerType(),
    pa.int64(): LongType(),
    pa.binary(): BinaryType(),
    pa.map_(pa.string(), pa.string()): MapType(StringType(), StringType(), True),
}

RECORD_STRUCT: Final = StructType(
    [StructField(f.name, _SPARK_TYPES[f.type], f.nullable) for f in bulk.RECORD_SCHEMA]
)
"""The Spark schema of :data:`siftmq.store.bulk.RECORD_SCHEMA` (Arrow batches must match it exactly)."""


# ---------------------------------------------------------------------------------------- the source


class CommitLogDataSource(DataSource):
    """``spark.read.format("siftmq_commitlog")``: a store's CommitLog records, one row per message.

    Options: ``ranges`` (JSON list of ``[path, segment_start, start, end]``, as planned by
    :func:`commitlog_dataframe`) or ``store_dir`` (planned here, with ``target_bytes``,
    ``start_offset``, ``end_offset``); ``topics`` (JSON list; all topics when absent);
    ``with_body`` (``true``/``false``); ``batch_rows`` and ``batch_bytes`` (Arrow batch limits);
    ``prefilter`` (JSON ``[kind, expression]``): a TAG or SQL92 filter the reader applies to each
    batch (:func:`properties_row_filter`) so non-matching rows never reach the JVM.
    """

    @classmethod
    def name(cls) -> str:
        return SOURCE_NAME

    def schema(self) -> StructType:
        return RECORD_STRUCT

    def reader(self, schema: StructType) -> CommitLogReader:
        return CommitLogReader(dict(self.options))


class CommitLogReader(DataSourceReader):
    """Plans (or takes) the byte ranges; each Spark task decodes one range into Arrow batches."""

    def __init__(self, options: dict[str, str]) -> None:
        try:
            self.ranges = _ranges_option(options)
            topics = options.get("topics")
            self.topics: list[str] | None = None if topics is None else [str(t) for t in json.loads(topics)]
            self.with_body = _bool_option(options.get("with_body", "true"), "with_body")
            self.batch_rows = int(options.get("batch_rows", SPARK_BATCH_ROWS))
            self.batch_bytes = int(options.get("batch_bytes", SPARK_BATCH_BYTES))
            prefilter = options.get("prefilter")
            self.prefilter: tuple[str, str] | None = None
            if prefilter is not None:
                kind, text = json.loads(prefilter)
                compile_filter(kind, text)  # invalid text fails the planning, not every task
                self.prefilter = (str(kind), str(text))
        except (ValueError, TypeError) as exc:
            raise ConfigError(f"bad option of the {SOURCE_NAME} data source: {exc}") from exc

    def partitions(self) -> list[InputPartition]:
        return [InputPartition(rng) for rng in self.ranges]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        rng = partition.value
        if rng is None:  # Spark's stand-in partition for a source with none
            return
        where = None if self.prefilter is None else properties_row_filter(compile_filter(*self.prefilter))
        yield from bulk.read_range(
            rng,
            topics=self.topics,
            batch_rows=self.batch_rows,
            batch_bytes=self.batch_bytes,
            with_body=self.with_body,
            where=where,
        )


def _bool_option(value: str, name: str) -> bool:
    if value.lower() in ("true", "1", "yes"):
        return True
    if value.lower() in ("false", "0", "no"):
        return False
    raise ValueError(f"{name} must be true or false, not {value!r}")


def _ranges_option(options: dict[str, str]) -> list[ByteRange]:
    if "ranges" in options:
        return [ByteRange(str(p), int(s), int(a), int(b)) for p, s, a, b in json.loads(options["ranges"])]
    if "store_dir" not in options:
        raise ValueError("give 'ranges' or 'store_dir'")
    end = options.get("end_offset")
    return bulk.plan_ranges(
        Path(options["store_dir"]),
        target_bytes=int(options.get("target_bytes", bulk.DEFAULT_TARGET_BYTES)),
        start_offset=int(options.get("start_offset", 0)),
        end_offset=None if end is None else int(end),
    )


def properties_row_filter(compiled: CompiledFilter) -> RowFilter:
    """A :data:`~siftmq.store.bulk.RowFilter` keeping the rows ``compiled`` matches, evaluated with
    the vectorized pyarrow backend (``CompiledFilter.matches_batch``) on the referenced properties."""
    names = sorted(compiled.properties)

    def where(properties: pa.MapArray) -> Any:
        if not names:  # a constant filter (TRUE, 1 = 1, ...)
            return np.full(len(properties), compiled.matches({}), dtype=np.bool_)
        return compiled.matches_batch({name: pc.map_lookup(properties, name, "last") for name in names})

    return where


def register_source(spark: SparkSession) -> None:
    """Register :class:`CommitLogDataSource` on ``spark`` (idempotent)."""
    spark.dataSource.register(CommitLogDataSource)


# ------------------------------------------------------------------------------------------ planning


def store_dir_of(data_dir: Path) -> Path:
    """The MessageStore directory of a broker data directory (``<data-dir>/store``).

    Raises :class:`ConfigError` when it holds no CommitLog.
    """
    store = Path(data_dir) / "store"
    if not (store / "commitlog").is_dir():
        if (Path(data_dir) / "commitlog").is_dir():
            raise ConfigError(
                f"{data_dir} is a store directory, not a broker data directory: pass its parent "
                f"({Path(data_dir).parent})"
            )
        raise ConfigError(f"no broker store under {data_dir} (expected {store / 'commitlog'})")
    return store


def store_in_use(store_dir: Path) -> bool:
    """Whether a process (a broker) holds the store's ``lock`` file, i.e. has the store open.

    Looks the lock up in ``/proc/locks`` without taking it; where that file does not exist, probes
    with a shared non-blocking ``flock`` released at once.
    """
    lock = Path(store_dir) / "lock"
    try:
        st = os.stat(lock)
    except FileNotFoundError:
        return False
    try:
        with open("/proc/locks", encoding="ascii") as f:
            table = f.read()
    except OSError:
        return _probe_lock(lock)
    wanted = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    for line in table.splitlines():
        fields = line.split()
        if "FLOCK" in fields and wanted in fields:
            return True
    return False


def _probe_lock(lock: Path) -> bool:
    import fcntl

    fd = os.open(lock, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # drops the probe's lock too
    return False


def auto_target_bytes(log_bytes: int, parallelism: int) -> int:
    """A range size giving every core a few ranges: ``log_bytes`` over ``RANGES_PER_CORE`` × cores,
    within [1 MiB, 64 MiB]."""
    target = log_bytes // max(1, parallelism * RANGES_PER_CORE)
    return max(MIN_TARGET_BYTES, min(MAX_TARGET_BYTES, target))


def plan_commitlog(
    spark: SparkSession,
    store_dir: Path,
    *,
    target_bytes: int | None = None,
    start_offset: int = 0,
    end_offset: int | None = None,
    stopped_cleanly: bool = False,
) -> ScanPlan:
    """:func:`siftmq.store.bulk.plan_scan` on the driver (``stopped_cleanly`` as there);
    ``target_bytes`` None sizes ranges for the session's parallelism (:func:`auto_target_bytes`):
    the log is planned in 1 MiB ranges, which are then joined, as the files' sizes overstate a log
    a broker is writing (its last segment is preallocated)."""
    if target_bytes is not None:
        return bulk.plan_scan(
            store_dir,
            target_bytes=target_bytes,
            start_offset=start_offset,
            end_offset=end_offset,
            stopped_cleanly=stopped_cleanly,
        )
    plan = bulk.plan_scan(
        store_dir,
        target_bytes=MIN_TARGET_BYTES,
        start_offset=start_offset,
        end_offset=end_offset,
        stopped_cleanly=stopped_cleanly,
    )
    target = auto_target_bytes(plan.bytes, spark.sparkContext.defaultParallelism)
    return replace(plan, ranges=bulk.merge_ranges(plan.ranges, target))


def commitlog_dataframe(
    spark: SparkSession,
    store_dir: Path,
    *,
    topics: Collection[str] | None = None,
    with_body: bool = True,
    target_bytes: int | None = None,
    start_offset: int = 0,
    end_offset: int | None = None,
    plan: ScanPlan | None = None,
    prefilter: CompiledFilter | None = None,
    batch_rows: int = SPARK_BATCH_ROWS,
    batch_bytes: int = SPARK_BATCH_BYTES,
) -> DataFrame:
    """The CommitLog records of ``store_dir`` (a MessageStore directory) as a DataFrame of
    :data:`RECORD_STRUCT`, one partition per byte range.

    ``plan`` (from :func:`plan_commitlog`) is used as is; otherwise the log is planned now with
    ``target_bytes``/``start_offset``/``end_offset``. ``topics`` keeps only those topics' records
    (decided in the reader, before bodies and properties are built); ``with_body=False`` leaves
    ``body`` empty; ``prefilter`` drops the rows a filter does not match in the reader (Spark
    never sees them; callers still apply the filter in Spark if they want Spark to decide).
    Nothing is read until an action runs.
    """
    if plan is None:
        plan = plan_commitlog(
            spark, store_dir, target_bytes=target_bytes, start_offset=start_offset, end_offset=end_offset
        )
    register_source(spark)
    reader = (
        spark.read.format(SOURCE_NAME)
        .option("ranges", json.dumps([[r.path, r.segment_start, r.start, r.end] for r in plan.ranges]))
        .option("with_body", "true" if with_body else "false")
        .option("batch_rows", str(batch_rows))
        .option("batch_bytes", str(batch_bytes))
    )
    if topics is not None:
        reader = reader.option("topics", json.dumps(sorted(topics)))
    if prefilter is not None:
        reader = reader.option("prefilter", json.dumps([prefilter.kind, prefilter.text]))
    return reader.load()


# ------------------------------------------------------------------------------------------ progress


@dataclass(frozen=True, slots=True)
class JobProgress:
    """Tasks of the tracked action's Spark jobs so far (all stages together)."""

    done: int
    total: int
    active: int
    stages: int


ProgressCallback = Callable[[JobProgress], None]


def run_tracked(
    spark: SparkSession,
    action: Callable[[], _T],
    on_progress: ProgressCallback | None = None,
    *,
    description: str = "siftmq job",
    poll_s: float = 0.25,
) -> _T:
    """Run ``action`` (which starts Spark jobs) in a thread and report its tasks every ``poll_s``.

    The jobs are tagged with a job group, so only they are counted (Spark's status tracker).
    The action's result is returned and its exception re-raised; Ctrl-C cancels the jobs.
    """
    sc = spark.sparkContext
    group = f"siftmq-{uuid.uuid4().hex[:12]}"
    outcome: list[Any] = []
    failure: list[BaseException] = []

    def work() -> None:
        sc.setJobGroup(group, description, interruptOnCancel=True)
        try:
            outcome.append(action())
        except BaseException as exc:
            failure.append(exc)

    thread = threading.Thread(target=work, name=group, daemon=True)
    thread.start()
    tracker = sc.statusTracker()
    try:
        while thread.is_alive():
            thread.join(poll_s)
            if on_progress is not None:
                on_progress(_progress(tracker, group))
    except KeyboardInterrupt:
        sc.cancelJobGroup(group)
        thread.join(30)
        raise
    if on_progress is not None:
        on_progress(_progress(tracker, group))
    if failure:
        raise failure[0]
    return outcome[0]  # type: ignore[no-any-return]


def _progress(tracker: Any, group: str) -> JobProgress:
    done = total = active = stages = 0
    for job_id in tracker.getJobIdsForGroup(group):
        job = tracker.getJobInfo(job_id)
        if job is None:
            continue
        for stage_id in job.stageIds:
            stage = tracker.getStageInfo(stage_id)
            if stage is None:
                continue
            stages += 1
            done += stage.numCompletedTasks
            total += stage.numTasks
            active += stage.numActiveTasks
    return JobProgress(done, total, active, stages)


# ---------------------------------------------------------------------------------------- errors

_PYTHON_ERROR: Final = re.compile(r"^(?:siftmq\.errors\.)?(\w+Error): (.+)$", re.MULTILINE)
_SIFTMQ_ERRORS: Final = frozenset(
    name for name, obj in vars(errors).items() if isinstance(obj, type) and issubclass(obj, errors.SiftError)
)


def worker_error(exc: BaseException) -> str | None:
    """The siftmq error a Python worker raised inside a failed Spark job, as ``Name: message``.

    Spark wraps worker exceptions (with their Python traceback as text) in its own; this digs the
    last siftmq error line out, or returns None when there is none.
    """
    text = str(exc)
    found = [m for m in _PYTHON_ERROR.finditer(text) if m.group(1) in _SIFTMQ_ERRORS]
    if not found:
        return None
    last = found[-1]
    return f"{last.group(1)}: {last.group(2).strip()}"


def ranges_summary(ranges: Sequence[ByteRange]) -> str:
    """``"12 ranges, 3 segment files, 731.2 MiB"``."""
    size = sum(r.size for r in ranges) / (1024 * 1024)
    files = len({r.path for r in ranges})
    return f"{len(ranges)} ranges, {files} segment files, {size:.1f} MiB"
