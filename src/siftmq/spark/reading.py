"""Reading a topic's queue ranges through the broker, shared by batch reads (:mod:`siftmq.spark.source`)
and streaming reads (:mod:`siftmq.spark.stream`): the read plan an executor gets, its partitions,
the pull loop that turns a range into Arrow record batches, and the checks made while planning."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Final

import pyarrow as pa
from pyspark.sql.datasource import InputPartition

from siftmq.errors import RemoteError, SiftError
from siftmq.filter import compile_filter
from siftmq.spark.gateway import BrokerGateway
from siftmq.spark.options import EARLIEST, LATEST, ConnectionOptions, OffsetSpec, ReadOptions, option_error
from siftmq.spark.pushdown import BrokerFilter
from siftmq.spark.rows import BatchBuilder

GROUP_PREFIX: Final = "siftmq-spark-"
#: A batch is emitted at ``rowsPerBatch`` rows or this many body bytes, whichever comes first.
MAX_BATCH_BODY_BYTES: Final = 64 << 20


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
    connection: ConnectionOptions

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
            connection=options.connection,
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
    gateway = BrokerGateway(plan.endpoint, timeout=plan.timeout, connection=plan.connection)
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
    return BrokerGateway(options.endpoint, timeout=options.request_timeout, connection=options.connection)


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
