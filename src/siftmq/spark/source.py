"""The ``siftmq`` PySpark data source: a topic as a DataFrame, read through the broker.

    spark.read.format("siftmq").option("endpoints", "127.0.0.1:8081").option("topic", "Orders").load()

Batch reads plan one partition per queue (split into offset ranges of ``maxMessagesPerPartition``
entries), each read on an executor by offset pulls (PullMessage) with the broker-side filter, and
yield Arrow record batches. ``readStream`` is :mod:`siftmq.spark.stream`; ``write`` and
``writeStream`` are :mod:`siftmq.spark.sink`. Options, schema and semantics: ``docs/spark-source.md``.

Filter pushdown needs option ``pushdown=true`` and ``spark.sql.python.filterPushdown.enabled``.
Spark checks, before it plans a read, whether the reader class overrides ``pushFilters`` and
fails the query when it does and the setting is off. So :meth:`SiftmqDataSource.reader` returns
the pushdown-capable reader only when Spark calls it from its pushdown planning worker
(``data_source_pushdown_filters.py``), and the plain reader otherwise: the source works with the
setting on or off.

Why opt-in: Spark 4.3 keeps the read plan of a Python data source on the loaded relation
(``PythonDataSourceV2.readInfo``) and refreshes it only when a query offers filters to push. A
later query on the same loaded DataFrame that offers none (no filter, or only an OR) reuses the
previous query's plan, pushed filters included, and silently returns too few rows. Nothing on
the Python side can tell the two queries apart, so pushdown is safe only when each loaded
DataFrame serves one query (``docs/spark-source.md``).
"""

from __future__ import annotations

import hashlib
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Final

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.types import StructType

from siftmq.errors import ConfigError, FilterError, RemoteError, SiftError
from siftmq.filter import compile_filter
from siftmq.spark.gateway import BrokerGateway
from siftmq.spark.options import (
    EARLIEST,
    LATEST,
    OffsetSpec,
    ReadOptions,
    option_error,
    parse_read_options,
    parse_write_options,
)
from siftmq.spark.pushdown import BrokerFilter, Pushdown, broker_filter, plan_pushdown
from siftmq.spark.rows import BatchBuilder, arrow_schema, message_schema

NAME: Final = "siftmq"
GROUP_PREFIX: Final = "siftmq-spark-"
#: A batch is emitted at ``rowsPerBatch`` rows or this many body bytes, whichever comes first.
MAX_BATCH_BODY_BYTES: Final = 64 << 20
_PUSHDOWN_WORKER: Final = "data_source_pushdown_filters.py"


class DataLossError(SiftError):
    """Messages the read was planned to include are gone (retention deleted them)."""

    code = "DATA_LOSS"


def default_group(topic: str, flt: BrokerFilter) -> str:
    """The pull group of a read without ``group``: one per topic and broker filter.

    Reads with the same filter share the broker's registration of it (SQL92: bloom bits computed
    at dispatch); reads with different filters never meet in one group, so a strict group never
    refuses them.
    """
    normalized = compile_filter(flt.kind, flt.expression).normalized
    digest = hashlib.sha256(f"{topic}\x00{flt.kind}\x00{normalized}".encode()).hexdigest()
    return GROUP_PREFIX + digest[:16]


@dataclass(frozen=True, slots=True)
class ReadPlan:
    """Everything an executor needs to read a queue range (pickled into each partition)."""

    endpoint: str
    topic: str
    group: str
    filter_kind: str
    expression: str
    hot_properties: tuple[str, ...]
    pull_batch_size: int
    rows_per_batch: int
    fail_on_data_loss: bool
    timeout: float

    @classmethod
    def of(cls, options: ReadOptions, flt: BrokerFilter) -> ReadPlan:
        return cls(
            endpoint=options.endpoint,
            topic=options.topic,
            group=options.group or default_group(options.topic, flt),
            filter_kind=flt.kind,
            expression=flt.expression,
            hot_properties=options.hot_properties,
            pull_batch_size=options.pull_batch_size,
            rows_per_batch=options.rows_per_batch,
            fail_on_data_loss=options.fail_on_data_loss,
            timeout=options.request_timeout,
        )


class QueueRange(InputPartition):
    """Offsets ``[start, end)`` of one queue."""

    def __init__(self, plan: ReadPlan, queue_id: int, start: int, end: int) -> None:
        super().__init__((queue_id, start, end))
        self.plan = plan
        self.queue_id = queue_id
        self.start = start
        self.end = end


def read_queue_range(plan: ReadPlan, schema: pa.Schema, queue_id: int, start: int, end: int) -> Iterator[Any]:
    """Pull ``[start, end)`` of one queue with the plan's filter; yield record batches."""
    if start >= end:
        return
    builder = BatchBuilder(schema, plan.topic, queue_id, plan.hot_properties)
    gateway = BrokerGateway(plan.endpoint, timeout=plan.timeout)
    try:
        cur = start
        while cur < end:
            got = gateway.pull(
                plan.group,
                plan.topic,
                queue_id,
                cur,
                batch_size=min(plan.pull_batch_size, end - cur),
                filter_kind=plan.filter_kind,
                expression=plan.expression,
            )
            if got.status == "ILLEGAL_OFFSET":
                if got.next_offset > cur:  # the queue's head was deleted (retention)
                    if plan.fail_on_data_loss:
                        raise DataLossError(
                            f"{plan.topic}:{queue_id} offsets {cur}..{got.next_offset - 1} were deleted "
                            "before they were read; set option 'failOnDataLoss' to false to skip them"
                        )
                    cur = got.next_offset
                    continue
                break
            past_end = False
            for message in got.messages:
                if message.queue_offset >= end:
                    past_end = True
                    break
                builder.add(message)
                if len(builder) >= plan.rows_per_batch or builder.nbytes >= MAX_BATCH_BODY_BYTES:
                    yield builder.flush()
            if past_end or got.next_offset <= cur:
                break
            cur = got.next_offset
        if len(builder):
            yield builder.flush()
    finally:
        gateway.close()


def resolve_offset(
    spec: OffsetSpec, queue_id: int, lo: int, hi: int, *, topic: str, fail_on_data_loss: bool
) -> int:
    """An offsets option's offset for one queue, checked against the queue's ``[lo, hi]``."""
    wanted = spec.for_queue(queue_id)
    if wanted == EARLIEST:
        return lo
    if wanted == LATEST:
        return hi
    if wanted > hi:
        raise option_error(
            spec.option, f"offset {wanted} of queue {queue_id} is past the end of {topic}:{queue_id} ({hi})"
        )
    if wanted < lo:
        if fail_on_data_loss:
            raise option_error(
                spec.option,
                f"offset {wanted} of queue {queue_id} was deleted; {topic}:{queue_id} starts at {lo} "
                "(set option 'failOnDataLoss' to false to start there)",
            )
        return lo
    return wanted


def split(plan: ReadPlan, queue_id: int, start: int, end: int, size: int) -> list[QueueRange]:
    return [QueueRange(plan, queue_id, s, min(s + size, end)) for s in range(start, end, size)]


def check_sql92(gateway: BrokerGateway, plan: ReadPlan, queue_count: int) -> bool:
    """Does the broker take the plan's SQL92 filter? (One empty pull at the end of queue 0.)

    It also registers the filter for the plan's group now, so messages dispatched while the read
    runs get bloom bits. False when SQL92 filtering is turned off on the broker.
    """
    end = gateway.offsets(plan.topic, [0], "END")[0] if queue_count else 0
    try:
        gateway.pull(
            plan.group,
            plan.topic,
            0,
            end,
            batch_size=1,
            filter_kind=plan.filter_kind,
            expression=plan.expression,
        )
    except RemoteError as exc:
        if exc.status == "UNSUPPORTED":
            return False
        raise
    return True


def connect(options: ReadOptions) -> BrokerGateway:
    return BrokerGateway(options.endpoint, timeout=options.request_timeout)


def queue_count(gateway: BrokerGateway, options: ReadOptions) -> int:
    try:
        count = gateway.queue_count(options.topic)
    except RemoteError as exc:
        if exc.status == "UNAVAILABLE":
            raise option_error("endpoints", f"cannot reach a broker at {options.endpoint}: {exc}") from exc
        raise option_error("topic", f"cannot read topic {options.topic!r}: {exc}") from exc
    if count <= 0:
        raise option_error("topic", f"topic {options.topic!r} has no queues")
    return count


class SiftmqReader(DataSourceReader):
    """Batch reader; filters named by options only (Spark applies every predicate itself)."""

    def __init__(self, options: ReadOptions, schema: StructType) -> None:
        self.options = options
        self.schema = schema
        self.pushdown: Pushdown | None = None
        self._sql92_ok: bool | None = None

    def broker_filter(self) -> BrokerFilter:
        o = self.options
        return broker_filter(sql_filter=o.filter, base_tags=o.tags, pushdown=self.pushdown)

    def partitions(self) -> list[InputPartition]:
        o = self.options
        flt = self.broker_filter()
        plan = ReadPlan.of(o, flt)
        with connect(o) as gateway:
            n = queue_count(gateway, o)
            o.starting.check_queues(n, o.topic)
            assert o.ending is not None
            o.ending.check_queues(n, o.topic)
            lows = gateway.offsets(o.topic, range(n), "BEGINNING")
            highs = gateway.offsets(o.topic, range(n), "END")
            ranges: list[tuple[int, int, int]] = []
            for q in range(n):
                lo, hi, loss = lows[q], highs[q], o.fail_on_data_loss
                start = resolve_offset(o.starting, q, lo, hi, topic=o.topic, fail_on_data_loss=loss)
                end = resolve_offset(o.ending, q, lo, hi, topic=o.topic, fail_on_data_loss=loss)
                if start > end:
                    raise option_error(
                        "startingOffsets",
                        f"queue {q} starts at {start}, after its ending offset {end} "
                        "(option 'endingOffsets')",
                    )
                if self.pushdown is not None:
                    if not self.pushdown.queues.contains(q):
                        continue
                    start, end = self.pushdown.offsets.clip(start, end)
                if end > start:
                    ranges.append((q, start, end))
            if self.pushdown is not None and self.pushdown.empty:
                return []
            if ranges and flt.needs_sql92 and not self._sql92_checked(gateway, plan, n):
                raise option_error(
                    "filter",
                    "the broker has SQL92 filtering turned off (enable_property_filter = false); "
                    "use option 'tags' or turn it on",
                )
        out: list[InputPartition] = []
        for q, start, end in ranges:
            out.extend(split(plan, q, start, end, o.max_messages_per_partition))
        return out

    def _sql92_checked(self, gateway: BrokerGateway, plan: ReadPlan, n: int) -> bool:
        if self.options.sql92 == "true":
            return True  # the user says so: no probe
        if self._sql92_ok is None:
            self._sql92_ok = check_sql92(gateway, plan, n)
        return self._sql92_ok

    def read(self, partition: InputPartition) -> Iterator[Any]:
        if not isinstance(partition, QueueRange):
            return iter(())  # Spark's stand-in partition when partitions() returned none
        return read_queue_range(
            partition.plan, arrow_schema(self.schema), partition.queue_id, partition.start, partition.end
        )


class SiftmqPushdownReader(SiftmqReader):
    """:class:`SiftmqReader` that also takes the predicates the broker can evaluate exactly."""

    def pushFilters(self, filters: list[Any]) -> Iterator[Any]:
        o = self.options
        self.pushdown = self._plan(filters, sql92=o.sql92 != "false")
        if self.pushdown.sql_terms and o.filter is None and o.sql92 == "auto":
            # SQL92 only because of what was pushed: make sure the broker takes it, else push tags only
            plan = ReadPlan.of(o, self.broker_filter())
            with connect(o) as gateway:
                ok = self._sql92_checked(gateway, plan, queue_count(gateway, o))
            if not ok:
                self.pushdown = self._plan(filters, sql92=False)
        yield from self.pushdown.rejected

    def _plan(self, filters: Sequence[Any], *, sql92: bool) -> Pushdown:
        o = self.options
        pushdown = plan_pushdown(
            filters, topic=o.topic, hot_properties=o.hot_properties, sql92=sql92, base_tags=o.tags
        )
        try:
            broker_filter(sql_filter=o.filter, base_tags=o.tags, pushdown=pushdown)
        except FilterError:  # e.g. too long for the broker: push what needs no SQL92
            pushdown = plan_pushdown(
                filters, topic=o.topic, hot_properties=o.hot_properties, sql92=False, base_tags=o.tags
            )
        return pushdown


def _planning_with_pushdown() -> bool:
    """Is Spark's filter pushdown worker the caller (so ``pushFilters`` will be called)?"""
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_filename.endswith(_PUSHDOWN_WORKER):
            return True
        frame = frame.f_back  # type: ignore[assignment]
    return False


class SiftmqDataSource(DataSource):
    """``format("siftmq")``: read, readStream, write and writeStream of one topic."""

    @classmethod
    def name(cls) -> str:
        return NAME

    def schema(self) -> StructType:
        return message_schema(parse_read_options(self.options, streaming=None).hot_properties)

    def _check_schema(self, schema: StructType, options: ReadOptions) -> None:
        expected = message_schema(options.hot_properties)
        if [(f.name, f.dataType) for f in schema.fields] != [(f.name, f.dataType) for f in expected.fields]:
            raise ConfigError(
                "siftmq data source: a user-specified schema is not supported; the schema is "
                f"{expected.simpleString()} (hot property columns come from option 'properties')"
            )

    def reader(self, schema: StructType) -> DataSourceReader:
        options = parse_read_options(self.options, streaming=False)
        self._check_schema(schema, options)
        if options.pushdown and _planning_with_pushdown():
            return SiftmqPushdownReader(options, schema)
        return SiftmqReader(options, schema)

    def streamReader(self, schema: StructType) -> Any:
        from siftmq.spark.stream import SiftmqStreamReader

        options = parse_read_options(self.options, streaming=True)
        self._check_schema(schema, options)
        return SiftmqStreamReader(options, schema)

    def writer(self, schema: StructType, overwrite: bool) -> Any:
        from siftmq.spark.sink import SiftmqWriter, check_write

        options = parse_write_options(self.options)
        check_write(schema, options, overwrite)
        return SiftmqWriter(options, schema)

    def streamWriter(self, schema: StructType, overwrite: bool) -> Any:
        from siftmq.spark.sink import SiftmqStreamWriter, check_write

        options = parse_write_options(self.options)
        check_write(schema, options, overwrite)
        return SiftmqStreamWriter(options, schema)
