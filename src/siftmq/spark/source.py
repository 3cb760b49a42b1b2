"""The ``siftmq`` PySpark data source: a topic as a DataFrame, read through the broker.

    spark.read.format("siftmq").option("endpoints", "127.0.0.1:8081").option("topic", "Orders").load()

Batch reads plan one partition per queue (split into offset ranges of ``maxMessagesPerPartition``
entries), each read on an executor by offset pulls (PullMessage) with the broker-side filter, and
yield Arrow record batches. ``readStream`` is :mod:`siftmq.spark.stream`; ``write`` and
``writeStream`` are :mod:`siftmq.spark.sink`. Options, schema and semantics: ``docs/spark-source.md``.

Option ``pushdown=true`` takes part in Spark's filter pushdown (with
``spark.sql.python.filterPushdown.enabled``) but accepts only predicates that hold for every row
the read returns anyway (``topic = '<the topic>'``, ``IS NOT NULL`` on a column that never is):
none changes what is read. Spark 4.3 keeps the read plan a pushdown produces (partitions and
read function, ``PythonFilterPushdownResult.readInfo``) on the loaded relation
(``PythonDataSourceV2.setReadInfo``), not on the scan, and every scan of that relation reads
with the plan of the pushdown planned last (``PythonBatch`` takes ``getOrCreateReadInfo``): in a
self-join both sides, and a scan with nothing to push (which never reaches Python) reads a plan
narrowed for another. Nothing reaches the reader that tells the scans apart, so a predicate
that narrowed the read would give some scan wrong rows; Spark applies them all instead. The
broker filters by the ``filter`` and ``tags`` options, which belong to the load.

Spark checks, before it plans a read, whether the reader class overrides ``pushFilters`` and
fails the query when it does and the setting is off. So :meth:`SiftmqDataSource.reader` returns
the pushdown-capable reader only when Spark calls it from its pushdown planning worker
(``data_source_pushdown_filters.py``), and the plain reader otherwise: the source works with the
setting on or off.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from typing import Any, Final

from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.types import StructType

from siftmq.errors import ConfigError
from siftmq.spark.gateway import BrokerGateway
from siftmq.spark.options import (
    ReadOptions,
    option_error,
    parse_read_options,
    parse_write_options,
)
from siftmq.spark.pushdown import BrokerFilter, broker_filter, plan_pushdown
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
        self._sql92_ok: bool | None = None

    def broker_filter(self) -> BrokerFilter:
        o = self.options
        return broker_filter(sql_filter=o.filter, base_tags=o.tags)

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
                if end > start:
                    ranges.append((q, start, end))
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
    """:class:`SiftmqReader` that takes the predicates every row it reads satisfies (see the module)."""

    def pushFilters(self, filters: list[Any]) -> Iterator[Any]:
        o = self.options
        for f in filters:
            plan = plan_pushdown(
                [f], topic=o.topic, hot_properties=o.hot_properties, sql92=False, base_tags=o.tags
            )
            if not (plan.accepted and plan.keeps_every_row):
                yield f


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
