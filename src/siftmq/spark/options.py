"""Options of the ``siftmq`` data source: parsed and checked before any data moves.

Spark hands a data source its options as a case-insensitive ``str -> str`` mapping. Everything that
can be checked without the broker is checked here (unknown names, numbers, offsets JSON, filter
syntax, hot property names), and every error names the option it is about. What needs the broker
(queue ids that exist, offsets in range, SQL92 turned on) is checked when the read is planned
(:mod:`siftmq.spark.source`, :mod:`siftmq.spark.stream`).

No pyspark import: this module is plain Python and unit-testable on its own.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from siftmq.errors import ConfigError, FilterError
from siftmq.filter import TagFilter, compile_filter

#: Offsets JSON values meaning "the queue's earliest / latest offset" (Kafka's convention).
EARLIEST: Final = -2
LATEST: Final = -1
MAX_PULL_BATCH: Final = 1024  # the broker's cap on messages per pull and per send request

#: Options Spark itself puts into a source's or sink's options: accepted and ignored.
SPARK_OPTIONS: Final = frozenset({"path", "checkpointlocation", "queryname"})

#: how to reach a broker with security on (see :class:`ConnectionOptions`)
CONNECTION_OPTIONS: Final = ("accessKey", "secretKey", "tls", "caFile", "certFile", "keyFile")
_COMMON: Final = ("endpoints", "topic", "requestTimeout", *CONNECTION_OPTIONS)
READ_OPTIONS: Final = (
    *_COMMON,
    "filter",
    "tags",
    "startingOffsets",
    "endingOffsets",
    "properties",
    "group",
    "maxMessagesPerPartition",
    "pullBatchSize",
    "rowsPerBatch",
    "sql92",
    "pushdown",
    "failOnDataLoss",
    "maxMessagesPerTrigger",
)
MAX_BATCH_BYTES: Final = 8 << 20
WRITE_OPTIONS: Final = (*_COMMON, "properties", "producerId", "maxBatchMessages", "maxBatchBytes")

#: Column names of every row the source produces (a hot property column may not take one).
MESSAGE_COLUMNS: Final = (
    "topic",
    "queue_id",
    "queue_offset",
    "message_id",
    "tag",
    "keys",
    "properties",
    "body",
    "born_timestamp",
    "store_timestamp",
)
#: Properties the broker keeps for itself; they are columns (tag, keys, message_id) or hidden.
SYSTEM_PROPERTY_NAMES: Final = frozenset({"TAGS", "KEYS", "UNIQ_KEY"})
_SQL92_IDENTIFIER: Final = re.compile(r"[A-Za-z_$][A-Za-z0-9_$]*")
_SQL92_KEYWORDS: Final = frozenset(
    {"NOT", "AND", "OR", "BETWEEN", "IN", "TRUE", "FALSE", "NULL", "IS", "CONTAINS", "STARTSWITH", "ENDSWITH"}
)
_ENDPOINT: Final = re.compile(r"[A-Za-z0-9._\-\[\]:]+:[0-9]{1,5}")


def option_error(name: str, problem: str) -> ConfigError:
    return ConfigError(f"siftmq data source: option {name!r}: {problem}")


@dataclass(frozen=True, slots=True)
class OffsetSpec:
    """``earliest``, ``latest`` or per-queue offsets (``EARLIEST``/``LATEST`` allowed as values).

    ``default`` applies to the queues the JSON does not name.
    """

    option: str
    default: int  # EARLIEST or LATEST
    per_queue: tuple[tuple[int, int], ...] = ()

    def for_queue(self, queue_id: int) -> int:
        return dict(self.per_queue).get(queue_id, self.default)

    def check_queues(self, queue_count: int, topic: str) -> None:
        for qid, _ in self.per_queue:
            if qid >= queue_count:
                raise option_error(
                    self.option,
                    f"names queue {qid}, but topic {topic!r} has queues 0..{queue_count - 1}",
                )


def parse_offsets(name: str, text: str | None, default: int) -> OffsetSpec:
    """Parse ``earliest`` / ``latest`` / ``{"0": 12, "3": -2}`` (keys are queue ids)."""
    if text is None or not text.strip():
        return OffsetSpec(name, default)
    word = text.strip().lower()
    if word == "earliest":
        return OffsetSpec(name, EARLIEST)
    if word == "latest":
        return OffsetSpec(name, LATEST)
    try:
        raw = json.loads(text)
    except ValueError as exc:
        raise option_error(
            name, f'expected "earliest", "latest" or a JSON object like {{"0": 42}}, got {text[:200]!r}'
        ) from exc
    if not isinstance(raw, dict):
        raise option_error(name, f"the JSON must be an object of queue id -> offset, got {text[:200]!r}")
    per_queue: dict[int, int] = {}
    for key, value in raw.items():
        if not (isinstance(key, str) and key.isascii() and key.isdigit()):
            raise option_error(name, f"queue id {key!r} is not a non-negative integer")
        if isinstance(value, bool) or not isinstance(value, int):
            raise option_error(name, f"offset of queue {key} must be an integer, got {value!r}")
        if value < EARLIEST:
            raise option_error(
                name,
                f"offset {value} of queue {key} is negative "
                f"(only {EARLIEST} = earliest and {LATEST} = latest are allowed)",
            )
        per_queue[int(key)] = value
    return OffsetSpec(name, default, tuple(sorted(per_queue.items())))


def _text(options: Mapping[str, str], name: str) -> str | None:
    value = options.get(name.lower())
    if value is None:
        return None
    return str(value)


def _required(options: Mapping[str, str], name: str) -> str:
    value = _text(options, name)
    if value is None or not value.strip():
        raise option_error(name, "is required")
    return value.strip()


def _int(options: Mapping[str, str], name: str, default: int | None, lo: int, hi: int) -> int | None:
    text = _text(options, name)
    if text is None or not text.strip():
        return default
    try:
        value = int(text.strip())
    except ValueError:
        raise option_error(name, f"expected an integer, got {text[:100]!r}") from None
    if not lo <= value <= hi:
        raise option_error(name, f"must be in {lo}..{hi}, got {value}")
    return value


def _float(options: Mapping[str, str], name: str, default: float, lo: float, hi: float) -> float:
    text = _text(options, name)
    if text is None or not text.strip():
        return default
    try:
        value = float(text.strip())
    except ValueError:
        raise option_error(name, f"expected a number, got {text[:100]!r}") from None
    if not lo <= value <= hi:
        raise option_error(name, f"must be in {lo}..{hi}, got {value}")
    return value


def _bool(options: Mapping[str, str], name: str, default: bool) -> bool:
    text = _text(options, name)
    if text is None or not text.strip():
        return default
    word = text.strip().lower()
    if word in ("true", "1", "yes", "on"):
        return True
    if word in ("false", "0", "no", "off"):
        return False
    raise option_error(name, f"expected true or false, got {text[:100]!r}")


def _check_known(
    options: Mapping[str, str], known: tuple[str, ...], other: tuple[str, ...], what: str
) -> None:
    names = {n.lower(): n for n in known}
    for key in options:
        k = str(key).lower()
        if k in names or k in SPARK_OPTIONS:
            continue
        hint = ""
        if k in {n.lower() for n in other}:
            hint = f" (it is not a {what} option)"
        raise ConfigError(
            f"siftmq data source: unknown option {key!r}{hint}; {what} options are: {', '.join(known)}"
        )


def _endpoint(options: Mapping[str, str]) -> str:
    text = _required(options, "endpoints")
    parts = [part.strip() for part in re.split(r"[;,]", text) if part.strip()]
    if len(parts) != 1:
        raise option_error("endpoints", f"give one broker as host:port, got {text[:200]!r}")
    if not _ENDPOINT.fullmatch(parts[0]):
        raise option_error("endpoints", f"expected host:port, got {parts[0][:200]!r}")
    return parts[0]


def _topic(options: Mapping[str, str]) -> str:
    topic = _required(options, "topic")
    if not re.fullmatch(r"[%|a-zA-Z0-9_-]{1,127}", topic):
        raise option_error("topic", f"{topic[:200]!r} is not a valid topic name")
    return topic


def is_sql92_identifier(name: str) -> bool:
    """Can an SQL92 filter name the property ``name`` (an identifier that is not a keyword)?"""
    return bool(_SQL92_IDENTIFIER.fullmatch(name)) and name.upper() not in _SQL92_KEYWORDS


def _hot_properties(options: Mapping[str, str]) -> tuple[str, ...]:
    text = _text(options, "properties")
    if text is None or not text.strip():
        return ()
    names = [n.strip() for n in text.split(",")]
    seen: dict[str, str] = {}
    taken = {c.lower() for c in MESSAGE_COLUMNS}
    for name in names:
        if not name:
            raise option_error("properties", f"empty property name in {text[:200]!r}")
        if name in SYSTEM_PROPERTY_NAMES or name.startswith("__"):
            raise option_error(
                "properties",
                f"{name!r} is a broker property, not a user property "
                "(use the tag, keys or message_id column)",
            )
        if name.lower() in taken:
            raise option_error("properties", f"{name!r} would clash with the message column {name.lower()!r}")
        if name.lower() in seen:
            raise option_error(
                "properties",
                f"{name!r} and {seen[name.lower()]!r} differ only in case; "
                "Spark columns are case-insensitive",
            )
        seen[name.lower()] = name
    return tuple(names)


@dataclass(frozen=True, slots=True)
class ConnectionOptions:
    """Credentials and TLS for a broker with security on (picklable: executors connect with it)."""

    access_key: str | None = None
    secret_key: str | None = field(default=None, repr=False)  # never printed
    tls: bool = False
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None

    def client_options(self) -> dict[str, Any]:
        """The keyword options of siftmq's client (``Connection``, ``Producer``)."""
        return {
            "access_key": self.access_key,
            "secret_key": self.secret_key,
            "tls": self.tls,
            "ca_file": self.ca_file,
            "cert_file": self.cert_file,
            "key_file": self.key_file,
        }


def _connection(options: Mapping[str, str]) -> ConnectionOptions:
    access_key, secret_key = _text(options, "accessKey"), _text(options, "secretKey")
    if bool(access_key) != bool(secret_key):
        raise option_error("accessKey" if secret_key else "secretKey", "accessKey and secretKey go together")
    tls = (_text(options, "tls") or "false").strip().lower()
    if tls not in ("true", "false"):
        raise option_error("tls", f"must be true or false, not {tls[:20]!r}")
    return ConnectionOptions(
        access_key,
        secret_key,
        tls == "true",
        _text(options, "caFile"),
        _text(options, "certFile"),
        _text(options, "keyFile"),
    )


@dataclass(frozen=True, slots=True)
class ReadOptions:
    endpoint: str
    topic: str
    filter: str | None  # SQL92 text as given (validated)
    tags: frozenset[str] | None  # the TAG expression's tag set; None = every message
    tags_text: str | None
    starting: OffsetSpec
    ending: OffsetSpec | None  # batch only
    hot_properties: tuple[str, ...]
    group: str | None
    max_messages_per_partition: int
    pull_batch_size: int
    rows_per_batch: int
    sql92: str  # auto | true | false
    pushdown: bool
    fail_on_data_loss: bool
    max_messages_per_trigger: int | None
    request_timeout: float
    connection: ConnectionOptions = ConnectionOptions()


def parse_read_options(options: Mapping[str, str], *, streaming: bool | None) -> ReadOptions:
    """Check a reader's options; raises :class:`ConfigError` naming the first bad option.

    ``streaming=None`` (the schema, before Spark says which kind of read it is) skips the checks
    that differ between batch and streaming reads.
    """
    _check_known(options, READ_OPTIONS, WRITE_OPTIONS, "read")
    endpoint = _endpoint(options)
    topic = _topic(options)
    sql92 = (_text(options, "sql92") or "auto").strip().lower()
    if sql92 not in ("auto", "true", "false"):
        raise option_error("sql92", f"expected auto, true or false, got {sql92[:100]!r}")
    sql_filter = _text(options, "filter")
    if sql_filter is not None:
        if not sql_filter.strip():
            raise option_error("filter", "is empty; leave it out to read every message")
        if sql92 == "false":
            raise option_error("filter", "is an SQL92 filter, but option 'sql92' is false")
        try:
            compile_filter("SQL92", sql_filter)
        except FilterError as exc:
            raise option_error("filter", f"invalid SQL92 filter: {exc}") from exc
    tags_text = _text(options, "tags")
    tags: frozenset[str] | None = None
    if tags_text is not None:
        try:
            tag_filter = TagFilter.parse(tags_text)
        except FilterError as exc:
            raise option_error("tags", f"invalid TAG expression: {exc}") from exc
        tags = None if tag_filter.sub_all else tag_filter.tags
    group = _text(options, "group")
    if group is not None:
        group = group.strip()
        if not re.fullmatch(r"[%|a-zA-Z0-9_-]{1,255}", group):
            raise option_error("group", f"{group[:200]!r} is not a valid consumer group name")
    ending_text = _text(options, "endingOffsets")
    if streaming is True and ending_text is not None:
        raise option_error("endingOffsets", "applies to batch reads only (a stream has no end)")
    per_trigger = _int(options, "maxMessagesPerTrigger", None, 1, 1 << 62)
    if streaming is False and per_trigger is not None:
        raise option_error("maxMessagesPerTrigger", "applies to streaming reads only")
    starting = parse_offsets(
        "startingOffsets", _text(options, "startingOffsets"), LATEST if streaming else EARLIEST
    )
    ending = None if streaming is True else parse_offsets("endingOffsets", ending_text, LATEST)
    if ending is not None and (ending.default == EARLIEST or any(v == EARLIEST for _, v in ending.per_queue)):
        raise option_error("endingOffsets", "'earliest' is not allowed as an ending offset")
    return ReadOptions(
        endpoint=endpoint,
        topic=topic,
        filter=sql_filter,
        tags=tags,
        tags_text=tags_text,
        starting=starting,
        ending=ending,
        hot_properties=_hot_properties(options),
        group=group,
        max_messages_per_partition=_int(options, "maxMessagesPerPartition", 100_000, 1, 1 << 62) or 100_000,
        pull_batch_size=_int(options, "pullBatchSize", MAX_PULL_BATCH, 1, MAX_PULL_BATCH) or MAX_PULL_BATCH,
        rows_per_batch=_int(options, "rowsPerBatch", 8192, 1, 1 << 20) or 8192,
        sql92=sql92,
        pushdown=_bool(options, "pushdown", False),
        fail_on_data_loss=_bool(options, "failOnDataLoss", True),
        max_messages_per_trigger=per_trigger,
        request_timeout=_float(options, "requestTimeout", 30.0, 0.1, 3600.0),
        connection=_connection(options),
    )


@dataclass(frozen=True, slots=True)
class WriteOptions:
    endpoint: str
    topic: str | None  # None: every row names its topic in a ``topic`` column
    property_columns: tuple[str, ...]
    producer_id: str | None
    max_batch_messages: int
    max_batch_bytes: int
    request_timeout: float
    connection: ConnectionOptions = ConnectionOptions()


def parse_write_options(options: Mapping[str, str]) -> WriteOptions:
    """Check a writer's options; raises :class:`ConfigError` naming the first bad option."""
    _check_known(options, WRITE_OPTIONS, READ_OPTIONS, "write")
    producer_id = _text(options, "producerId")
    if producer_id is not None and not producer_id.strip():
        raise option_error("producerId", "is empty")
    topic = _topic(options) if _text(options, "topic") is not None else None
    return WriteOptions(
        endpoint=_endpoint(options),
        topic=topic,
        property_columns=_hot_properties(options),
        producer_id=producer_id.strip() if producer_id else None,
        max_batch_messages=_int(options, "maxBatchMessages", MAX_PULL_BATCH, 1, MAX_PULL_BATCH)
        or MAX_PULL_BATCH,
        # a send request must fit the broker's gRPC frame: by default its largest message plus
        # 4 MiB (12 MiB); 8 MiB of message bytes leaves room for the request's own fields
        max_batch_bytes=_int(options, "maxBatchBytes", 4 << 20, 1, MAX_BATCH_BYTES) or (4 << 20),
        request_timeout=_float(options, "requestTimeout", 30.0, 0.1, 3600.0),
        connection=_connection(options),
    )
