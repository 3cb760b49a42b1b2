"""``spark.readStream.format("siftmq")``: micro-batches of offset ranges per queue.

Offsets are ``{"<queue id>": <next offset>, ...}`` with the keys in sorted (string) order: Spark
stores ``json.dumps(offset)`` and compares those strings, so one order must always be used
(``spark-facts.md`` 2c). A queue added to the topic appears in the next offset, read from its
earliest offset.

* ``initialOffset`` (a fresh checkpoint only): the ``group``'s committed offsets where it has
  them, else ``startingOffsets`` (default ``latest``).
* ``latestOffset(start, limit)``: the queues' end offsets, capped at the availableNow target and
  at ``maxMessagesPerTrigger`` queue entries, shared fairly between the queues with data.
* ``commit(end)`` runs in the driver-side runner before the next batch is planned; with ``group``
  it stores ``end`` on the broker (UpdateOffset). The last batch of a run is committed by the next
  run (Spark never calls ``commit`` for it nor ``stop``), so the checkpoint stays the truth and the
  broker's offsets trail it by one batch at most.

No filter pushdown: Spark offers streaming readers none; ``filter``/``tags`` still filter on the
broker, and other predicates are applied by Spark.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    ReadMinRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from siftmq.spark.gateway import BrokerGateway
from siftmq.spark.options import ReadOptions, option_error
from siftmq.spark.pushdown import broker_filter
from siftmq.spark.reading import (
    QueueRange,
    ReadPlan,
    check_sql92,
    connect,
    queue_count,
    read_queue_range,
    resolve_offset,
    split,
)
from siftmq.spark.rows import arrow_schema


def offsets_json(offsets: Mapping[int, int]) -> dict[str, int]:
    """``{queue: offset}`` as the JSON-able dict Spark stores, keys in sorted string order."""
    return dict(sorted((str(q), int(o)) for q, o in offsets.items()))


def parse_offsets_json(offsets: Mapping[str, Any]) -> dict[int, int]:
    return {int(q): int(o) for q, o in offsets.items()}


def share(available: Mapping[int, int], budget: int) -> dict[int, int]:
    """Split ``budget`` entries between queues fairly (round-robin water filling, deterministic)."""
    take = dict.fromkeys(available, 0)
    active = sorted(q for q, n in available.items() if n > 0)
    remaining = budget
    while remaining > 0 and active:
        each = max(1, remaining // len(active))
        for q in list(active):
            t = min(each, available[q] - take[q], remaining)
            take[q] += t
            remaining -= t
            if take[q] >= available[q]:
                active.remove(q)
            if remaining == 0:
                break
    return take


class SiftmqStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, options: ReadOptions, schema: StructType) -> None:
        self.options = options
        self.schema = schema
        self.plan = ReadPlan.of(options, broker_filter(sql_filter=options.filter, base_tags=options.tags))
        self._target: dict[int, int] | None = None
        self._gateway: BrokerGateway | None = None
        self._checked = False

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_gateway"] = None  # executors open their own connections
        return state

    def _broker(self) -> BrokerGateway:
        if self._gateway is None:
            self._gateway = connect(self.options)
        return self._gateway

    def _queue_count(self) -> int:
        gateway = self._broker()
        n = queue_count(gateway, self.options)
        if not self._checked:
            if self.plan.filter_kind == "SQL92" and not check_sql92(gateway, self.plan, n):
                raise option_error(
                    "filter", "the broker has SQL92 filtering turned off (enable_property_filter = false)"
                )
            self._checked = True
        return n

    def initialOffset(self) -> dict[str, int]:
        o = self.options
        n = self._queue_count()
        o.starting.check_queues(n, o.topic)
        gateway = self._broker()
        lows = gateway.offsets(o.topic, range(n), "BEGINNING")
        highs = gateway.offsets(o.topic, range(n), "END")
        committed = gateway.committed(o.group, o.topic, range(n)) if o.group else {}
        out: dict[int, int] = {}
        for q in range(n):
            done = committed.get(q)
            if done is not None:
                out[q] = min(max(done, lows[q]), highs[q])
            else:
                out[q] = resolve_offset(
                    o.starting, q, lows[q], highs[q], topic=o.topic, fail_on_data_loss=o.fail_on_data_loss
                )
        return offsets_json(out)

    def getDefaultReadLimit(self) -> ReadLimit:
        n = self.options.max_messages_per_trigger
        return ReadMaxRows(n) if n else ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        n = self._queue_count()
        self._target = self._broker().offsets(self.options.topic, range(n), "END")

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, int]:
        o = self.options
        n = self._queue_count()
        gateway = self._broker()
        highs = gateway.offsets(o.topic, range(n), "END")
        begun = parse_offsets_json(start)
        new = [q for q in range(n) if q not in begun]
        lows = gateway.offsets(o.topic, new, "BEGINNING") if new else {}
        current = {q: begun.get(q, lows.get(q, 0)) for q in sorted(set(range(n)) | set(begun))}
        if self._target is not None:  # availableNow: nothing stored after the trigger started
            highs = {q: min(highs.get(q, 0), self._target.get(q, current[q])) for q in current}
        available = {q: max(0, highs.get(q, 0) - current[q]) for q in current}
        if isinstance(limit, ReadMaxRows):
            take = share(available, limit.max_rows)
        elif isinstance(limit, ReadMinRows) and sum(available.values()) < limit.min_rows:
            take = dict.fromkeys(available, 0)
        else:  # ReadAllAvailable (or a limit that does not apply to messages)
            take = available
        return offsets_json({q: current[q] + take[q] for q in current})

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[InputPartition]:
        begun, until = parse_offsets_json(start), parse_offsets_json(end)
        new = [q for q in until if q not in begun]
        if new:
            begun.update(self._broker().offsets(self.options.topic, new, "BEGINNING"))
        size = self.options.max_messages_per_partition
        out: list[InputPartition] = []
        for q in sorted(until):
            if until[q] > begun[q]:
                out.extend(split(self.plan, q, begun[q], until[q], size))
        return out

    def read(self, partition: InputPartition) -> Iterator[Any]:
        if not isinstance(partition, QueueRange):
            return iter(())
        return read_queue_range(
            partition.plan, arrow_schema(self.schema), partition.queue_id, partition.start, partition.end
        )

    def commit(self, end: dict[str, Any]) -> None:
        if self.options.group:
            self._broker().commit(self.options.group, self.options.topic, parse_offsets_json(end))

    def stop(self) -> None:
        if self._gateway is not None:
            self._gateway.close()
            self._gateway = None
