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

import sys
from collections.abc import Iterator, Sequence
from typing import Any, Final

from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.types import StructType

from siftmq.errors import ConfigError, FilterError
from siftmq.spark.gateway import BrokerGateway
from siftmq.spark.options import (
    ReadOptions,
    option_error,
    parse_read_options,
    parse_write_options,
)
from siftmq.spark.pushdown import BrokerFilter, Pushdown, broker_filter, plan_pushdown
from siftmq.spark.reading import (
    DataLossError,
    QueueRange,
    ReadPlan,
    check_sql92,
    connect,
    default_group,
    queue_count,
    read_queue_range,
    resolve_offset,
    split,
)
from siftmq.spark.rows import arrow_schema, message_schema
from siftmq.spark.sink import SiftmqStreamWriter, SiftmqWriter, check_write
from siftmq.spark.stream import SiftmqStreamReader

# what other modules and users import from here
__all__ = ["NAME", "BrokerFilter", "DataLossError", "SiftmqDataSource", "default_group"]

NAME: Final = "siftmq"
_PUSHDOWN_WORKER: Final = "data_source_pushdown_filters.py"


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
        options = parse_read_options(self.options, streaming=True)
        self._check_schema(schema, options)
        return SiftmqStreamReader(options, schema)

    def writer(self, schema: StructType, overwrite: bool) -> Any:
        options = parse_write_options(self.options)
        check_write(schema, options, overwrite)
        return SiftmqWriter(options, schema)

    def streamWriter(self, schema: StructType, overwrite: bool) -> Any:
        options = parse_write_options(self.options)
        check_write(schema, options, overwrite)
        return SiftmqStreamWriter(options, schema)
