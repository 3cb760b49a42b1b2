"""``df.write.format("siftmq")`` and ``writeStream``: rows -> messages, sent in batches.

Columns (by name; order does not matter):

=============  =================================================  ======================
``body``       binary or string (UTF-8), required, not empty       the message body
``tag``        string                                              the tag (NULL: none)
``keys``       array<string>, or string (split on whitespace)      the message keys
``properties`` map<string,string> (NULL values are left out)       user properties
``topic``      string                                              used when option ``topic`` is absent
=============  =================================================  ======================

The columns named by option ``properties`` are written as user properties too (a row's value
wins over the map; NULL leaves the property out). The read side's ``queue_id``,
``queue_offset``, ``message_id``, ``born_timestamp`` and ``store_timestamp`` are ignored, so a
DataFrame read from a topic can be written to another; any other column is an error.

Messages go in ``send_many`` requests of at most ``maxBatchMessages`` (<= 1024) messages and
``maxBatchBytes`` body bytes, one topic each. Only ``append`` exists: a topic cannot be truncated.

Exactly-once for streams: the stream writer derives every message id from (``producerId`` or
the topic and the streaming query id, the batch id, the partition, the row's index in the
partition). A replayed micro-batch (same batch id after a failure or a restart) sends the same
ids and the broker drops every id it has already stored (``Broker.send_many``). This holds as long
as the replay produces the same rows in the same partitions in the same order, which it does for
a deterministic plan over a replayable source (such as ``siftmq`` itself). Batch writes use
random ids: a retried task may send its messages again.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Final

from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import ArrayType, BinaryType, MapType, StringType, StructType

from siftmq.client.model import OutgoingMessage
from siftmq.client.producer import new_message_id
from siftmq.errors import ConfigError, RemoteError, SiftError
from siftmq.spark.gateway import BrokerGateway
from siftmq.spark.options import WriteOptions

#: Read-side columns a writer accepts and ignores (a read DataFrame can be written as it is).
IGNORED_COLUMNS: Final = frozenset(
    {"queue_id", "queue_offset", "message_id", "born_timestamp", "store_timestamp"}
)
MESSAGE_COLUMNS: Final = ("body", "tag", "keys", "properties", "topic")


class WriteError(SiftError):
    """A row cannot be turned into a message."""

    code = "BAD_ROW"


def _sink_error(problem: str) -> ConfigError:
    return ConfigError(f"siftmq data source (write): {problem}")


def check_write(schema: StructType, options: WriteOptions, overwrite: bool) -> None:
    """Refuse what cannot be written, before any task runs."""
    if overwrite:
        raise _sink_error(
            "save mode 'overwrite' is not supported: a topic cannot be truncated; use mode('append')"
        )
    types = {f.name.lower(): f.dataType for f in schema.fields}
    body = types.get("body")
    if body is None:
        raise _sink_error(
            f"the DataFrame needs a 'body' column (binary or string); it has {schema.fieldNames()}"
        )
    if not isinstance(body, BinaryType | StringType):
        raise _sink_error(f"column 'body' must be binary or string, not {body.simpleString()}")
    wanted = {
        "tag": (StringType,),
        "topic": (StringType,),
        "keys": (ArrayType, StringType),
        "properties": (MapType,),
    }
    for name, kinds in wanted.items():
        t = types.get(name)
        if t is not None and not isinstance(t, kinds):
            raise _sink_error(f"column {name!r} has type {t.simpleString()}, which cannot be written")
    keys = types.get("keys")
    if isinstance(keys, ArrayType) and not isinstance(keys.elementType, StringType):
        raise _sink_error("column 'keys' must be array<string> or string")
    props = types.get("properties")
    if isinstance(props, MapType) and not (
        isinstance(props.keyType, StringType) and isinstance(props.valueType, StringType)
    ):
        raise _sink_error("column 'properties' must be map<string,string>")
    for name in options.property_columns:
        t = types.get(name.lower())
        if t is None:
            raise _sink_error(f"option 'properties' names column {name!r}, which the DataFrame does not have")
        if not isinstance(t, StringType):
            raise _sink_error(f"property column {name!r} must be a string column, not {t.simpleString()}")
    if options.topic is None and "topic" not in types:
        raise _sink_error("give option 'topic' or a 'topic' column")
    known = set(MESSAGE_COLUMNS) | IGNORED_COLUMNS | {n.lower() for n in options.property_columns}
    extra = [f.name for f in schema.fields if f.name.lower() not in known]
    if extra:
        raise _sink_error(
            f"column(s) {extra} are not message fields; drop them, or name string columns in option "
            "'properties' to write them as user properties"
        )


@dataclass
class SentCount(WriterCommitMessage):
    partition: int
    messages: int


class _Sender:
    """Turns record batches into messages and sends them in bounded batches per topic."""

    def __init__(self, options: WriteOptions, schema: StructType) -> None:
        self.options = options
        self.names = {f.name.lower(): f.name for f in schema.fields}
        self.gateway: BrokerGateway | None = None
        self.pending: dict[str, list[OutgoingMessage]] = {}
        self.pending_bytes: dict[str, int] = {}
        self.sent = 0

    def _column(self, batch: Any, name: str) -> list[Any] | None:
        real = self.names.get(name.lower())
        return None if real is None else batch.column(real).to_pylist()

    def run(self, batches: Iterator[Any], message_id: Any) -> int:
        """Send every row; ``message_id(row_index)`` names each message. Returns the count sent."""
        row = 0
        try:
            for batch in batches:
                n = batch.num_rows
                bodies = self._column(batch, "body") or []
                tags = self._column(batch, "tag") or [None] * n
                keys = self._column(batch, "keys") or [None] * n
                maps = self._column(batch, "properties") or [None] * n
                topics = self._column(batch, "topic") or [None] * n
                extra = [(p, self._column(batch, p) or [None] * n) for p in self.options.property_columns]
                born_ms = time.time_ns() // 1_000_000
                for i in range(n):
                    topic = self.options.topic or topics[i]
                    if not topic:
                        raise WriteError(f"row {row} has no topic (NULL 'topic' and no option 'topic')")
                    body = bodies[i]
                    if isinstance(body, str):
                        body = body.encode()
                    if not body:
                        raise WriteError(
                            f"row {row} has a NULL or empty body; the broker refuses empty messages"
                        )
                    if tags[i] == "":
                        raise WriteError(
                            f"row {row} has an empty tag; a message without a tag has a NULL one"
                        )
                    props = {k: v for k, v in (maps[i] or ()) if v is not None}
                    for name, values in extra:
                        if values[i] is not None:
                            props[name] = values[i]
                    row_keys = keys[i]
                    if isinstance(row_keys, str):
                        row_keys = row_keys.split()
                    message = OutgoingMessage(
                        topic,
                        body,
                        message_id(row),
                        tags[i],
                        tuple(k for k in (row_keys or ()) if k is not None),
                        props,
                        born_ms,
                    )
                    self._add(topic, message, _size_of(message))
                    row += 1
            for topic in list(self.pending):
                self._flush(topic)
        finally:
            if self.gateway is not None:
                self.gateway.close()
        return self.sent

    def _add(self, topic: str, message: OutgoingMessage, size: int) -> None:
        queue = self.pending.setdefault(topic, [])
        if queue and self.pending_bytes.get(topic, 0) + size > self.options.max_batch_bytes:
            self._flush(topic)
            queue = self.pending.setdefault(topic, [])
        queue.append(message)
        self.pending_bytes[topic] = self.pending_bytes.get(topic, 0) + size
        if len(queue) >= self.options.max_batch_messages:
            self._flush(topic)

    def _flush(self, topic: str) -> None:
        messages = self.pending.pop(topic, [])
        self.pending_bytes.pop(topic, None)
        if not messages:
            return
        if self.gateway is None:
            self.gateway = BrokerGateway(
                self.options.endpoint,
                timeout=self.options.request_timeout,
                connection=self.options.connection,
            )
        try:
            self.sent += self.gateway.send(messages)
        except RemoteError as exc:
            if exc.status != "GRPC_RESOURCE_EXHAUSTED":
                raise
            raise WriteError(
                f"a send request of {len(messages)} messages was larger than the broker takes ({exc}); "
                f"lower the option maxBatchBytes (now {self.options.max_batch_bytes})"
            ) from exc


def _size_of(message: OutgoingMessage) -> int:
    """The bytes a message takes in a send request, near enough: body, tag, keys and properties."""
    size = len(message.body) + len(message.tag or "") + sum(len(k) + 1 for k in message.keys)
    return size + sum(len(k) + len(v) + 2 for k, v in message.properties.items())


def _partition_id() -> int:
    from pyspark import TaskContext

    context = TaskContext.get()
    return context.partitionId() if context is not None else 0


class SiftmqWriter(DataSourceArrowWriter):
    """Batch writes: random message ids (a retried task may send its rows again)."""

    def __init__(self, options: WriteOptions, schema: StructType) -> None:
        self.options = options
        self.schema = schema

    def write(self, iterator: Iterator[Any]) -> SentCount:
        sent = _Sender(self.options, self.schema).run(iterator, lambda row: new_message_id())
        return SentCount(_partition_id(), sent)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        pass  # every message is visible once sent: nothing to publish

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        pass  # sent messages cannot be taken back; a rerun of a batch write may duplicate them


def stream_message_ids(sink_id: str, batch_id: int, partition: int) -> Any:
    """Message ids of one micro-batch partition: a hash of (sink, batch, partition) + row index."""
    prefix = hashlib.blake2b(f"{sink_id}\x00{batch_id}\x00{partition}".encode(), digest_size=12).hexdigest()
    head = "SPK" + prefix.upper()

    def message_id(row: int) -> str:
        return f"{head}{row:08X}"

    return message_id


class SiftmqStreamWriter(DataSourceStreamArrowWriter):
    """Streaming writes with deterministic message ids per (sink, batch, partition, row)."""

    def __init__(self, options: WriteOptions, schema: StructType) -> None:
        self.options = options
        self.schema = schema

    def write(self, iterator: Iterator[Any]) -> SentCount:
        from pyspark import TaskContext

        context = TaskContext.get()
        batch_id = context.getLocalProperty("streaming.sql.batchId") if context is not None else None
        if context is None or batch_id is None:
            raise WriteError("the siftmq stream writer needs a micro-batch id (streaming.sql.batchId)")
        # The query id (kept in the checkpoint) is always part of it: batch ids start again at 0
        # with a new checkpoint, whose batches hold other rows than the old one's of the same
        # number, and the broker would drop them as retries of those
        query_id = context.getLocalProperty("sql.streaming.queryId") or ""
        sink_id = f"{self.options.producer_id or self.options.topic or '<topic column>'}/{query_id}"
        partition = context.partitionId()
        ids = stream_message_ids(sink_id, int(batch_id), partition)
        return SentCount(partition, _Sender(self.options, self.schema).run(iterator, ids))

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        pass

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        pass  # a replay of the batch sends the same ids: the broker keeps one copy
