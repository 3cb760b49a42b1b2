"""The rows of the ``siftmq`` source: the Spark schema and pulled messages -> ``pyarrow.RecordBatch``.

One row per message::

    topic string NOT NULL, queue_id int NOT NULL, queue_offset bigint NOT NULL,
    message_id string NOT NULL, tag string, keys array<string> NOT NULL,
    properties map<string,string> NOT NULL, body binary NOT NULL,
    born_timestamp timestamp NOT NULL, store_timestamp timestamp NOT NULL,
    <one nullable string column per hot property>

``properties`` holds the user properties only (the broker's own ``TAGS``/``KEYS``/``UNIQ_KEY`` are
the ``tag``/``keys``/``message_id`` columns); a hot property stays in the map as well.

Batches are built column-wise from the protobuf messages (no per-row tuples: Spark converts
tuples value by value, 6-9x slower, ``spark-facts.md`` 2a) with the exact Arrow types Spark expects
for the schema it planned with (``to_arrow_schema``), or Spark rejects the batch.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from siftmq.client.model import ReceivedMessage


def message_schema(hot_properties: Sequence[str] = ()) -> StructType:
    """The source's schema; hot properties become trailing string columns."""
    fields = [
        StructField("topic", StringType(), False),
        StructField("queue_id", IntegerType(), False),
        StructField("queue_offset", LongType(), False),
        StructField("message_id", StringType(), False),
        StructField("tag", StringType(), True),
        StructField("keys", ArrayType(StringType(), False), False),
        StructField("properties", MapType(StringType(), StringType(), False), False),
        StructField("body", BinaryType(), False),
        StructField("born_timestamp", TimestampType(), False),
        StructField("store_timestamp", TimestampType(), False),
    ]
    fields.extend(StructField(name, StringType(), True) for name in hot_properties)
    return StructType(fields)


def arrow_schema(schema: StructType) -> pa.Schema:
    """The Arrow schema Spark checks each batch against (``DATA_SOURCE_RETURN_SCHEMA_MISMATCH``)."""
    return to_arrow_schema(schema, timezone="UTC")


class BatchBuilder:
    """Collects pulled messages of one queue and emits Arrow record batches."""

    __slots__ = (
        "_body",
        "_born",
        "_hot",
        "_hot_names",
        "_ids",
        "_key_offsets",
        "_keys",
        "_map_offsets",
        "_offsets",
        "_pkeys",
        "_pvals",
        "_store",
        "_tags",
        "nbytes",
        "queue_id",
        "schema",
        "topic",
    )

    def __init__(self, schema: pa.Schema, topic: str, queue_id: int, hot_properties: Sequence[str]) -> None:
        self.schema = schema
        self.topic = topic
        self.queue_id = queue_id
        self._hot_names = tuple(hot_properties)
        self._reset()

    def _reset(self) -> None:
        self._offsets: list[int] = []
        self._ids: list[str] = []
        self._tags: list[str | None] = []
        self._keys: list[str] = []
        self._key_offsets: list[int] = [0]
        self._pkeys: list[str] = []
        self._pvals: list[str] = []
        self._map_offsets: list[int] = [0]
        self._body: list[bytes] = []
        self._born: list[int] = []
        self._store: list[int] = []
        self._hot: list[list[str | None]] = [[] for _ in self._hot_names]
        self.nbytes = 0

    def __len__(self) -> int:
        return len(self._offsets)

    def add(self, message: ReceivedMessage) -> None:
        """Append one pulled message."""
        self._offsets.append(message.queue_offset)
        self._ids.append(message.message_id)
        self._tags.append(message.tag)
        keys = message.keys
        if keys:
            self._keys.extend(keys)
        self._key_offsets.append(len(self._keys))
        props = message.properties
        if props:
            self._pkeys.extend(props)
            self._pvals.extend(props.values())
        self._map_offsets.append(len(self._pkeys))
        for column, name in zip(self._hot, self._hot_names, strict=True):
            column.append(props.get(name))
        body = message.body
        self._body.append(body)
        self.nbytes += len(body)
        self._born.append(message.born_timestamp_ms * 1000)
        self._store.append(message.store_timestamp_ms * 1000)

    def flush(self) -> pa.RecordBatch:
        """The collected rows as one batch (then empty again)."""
        n = len(self._offsets)
        s = self.schema
        ts_type = s.field("born_timestamp").type
        columns = [
            pa.array([self.topic] * n, type=s.field("topic").type),
            pa.array(np.full(n, self.queue_id, dtype=np.int32), type=s.field("queue_id").type),
            pa.array(self._offsets, type=s.field("queue_offset").type),
            pa.array(self._ids, type=s.field("message_id").type),
            pa.array(self._tags, type=s.field("tag").type),
            pa.ListArray.from_arrays(
                pa.array(self._key_offsets, type=pa.int32()),
                pa.array(self._keys, type=pa.string()),
                type=s.field("keys").type,
            ),
            pa.MapArray.from_arrays(
                pa.array(self._map_offsets, type=pa.int32()),
                pa.array(self._pkeys, type=pa.string()),
                pa.array(self._pvals, type=pa.string()),
                type=s.field("properties").type,
            ),
            pa.array(self._body, type=s.field("body").type),
            pa.array(self._born, type=pa.int64()).cast(ts_type),
            pa.array(self._store, type=pa.int64()).cast(s.field("store_timestamp").type),
        ]
        for name, values in zip(self._hot_names, self._hot, strict=True):
            columns.append(pa.array(values, type=s.field(name).type))
        batch = pa.RecordBatch.from_arrays(columns, schema=s)
        self._reset()
        return batch
