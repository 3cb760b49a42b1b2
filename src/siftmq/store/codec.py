"""CommitLog record layout and encoding: pure, with magic and CRC checks (decoding: ``decoding.py``).

The layout follows RocketMQ's message record (all integers big-endian), with one addition: a
``record_crc`` right after the magic code covering every byte of the record after it, so any
torn or corrupted record is detected on every read and on every recovery scan::

    offset  size  field
    0       4     total_size                 whole record, header included
    4       4     magic_code                 MESSAGE_MAGIC_CODE (BLANK_MAGIC_CODE for end-of-segment)
    8       4     record_crc                 zlib.crc32 of bytes [12, total_size)
    12      4     body_crc                   zlib.crc32 of the body (RocketMQ's bodyCRC)
    16      4     queue_id
    20      4     flag
    24      8     queue_offset
    32      8     physical_offset            commit log offset of this record
    40      4     sys_flag
    44      8     born_timestamp             ms
    52      8     born_host                  IPv4 (4) + port (4)
    60      8     store_timestamp            ms
    68      8     store_host                 IPv4 (4) + port (4)
    76      4     reconsume_times
    80      8     prepared_transaction_offset
    88      4     body_length, then body
    .       1     topic_length, then topic (UTF-8, <= 127 bytes)
    .       2     properties_length, then properties (``name\\x01value\\x02`` pairs, <= 32767 bytes)

The magic code differs from RocketMQ's because the layout does (the extra CRC): a RocketMQ
reader must not mistake our records for its own. The end-of-segment blank marker is RocketMQ's:
``total_size`` (the bytes left in the segment) followed by ``BLANK_MAGIC_CODE``.
"""

from __future__ import annotations

import functools
import re
import struct
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final, NamedTuple

from siftmq.errors import MessageTooLargeError
from siftmq.hashing import java_string_hash

MESSAGE_MAGIC_CODE: Final = 0x5346_4D31  # "SFM1"
BLANK_MAGIC_CODE: Final = -875286124  # RocketMQ's end-of-file marker (0xCBD43194 as signed int32)
BLANK_MARKER_SIZE: Final = 8  # total_size + magic_code; a segment always keeps room for it

NAME_VALUE_SEPARATOR: Final = "\x01"
PROPERTY_SEPARATOR: Final = "\x02"

PROPERTY_TAGS: Final = "TAGS"
PROPERTY_KEYS: Final = "KEYS"
PROPERTY_UNIQ_KEY: Final = "UNIQ_KEY"
KEY_SEPARATOR: Final = " "

MAX_TOPIC_LENGTH: Final = 127
_TOPIC_RE: Final = re.compile(r"^[%|a-zA-Z0-9_-]+$")  # RocketMQ's TopicValidator characters
MAX_PROPERTIES_LENGTH: Final = 32767  # RocketMQ stores the length as a Java short

HEADER_STRUCT = struct.Struct(">iiIIiiqqiq8sq8siqi")
HEADER_SIZE: Final = HEADER_STRUCT.size  # 92 (fixed part up to and including body_length)
PREFIX_STRUCT = struct.Struct(">iiI")  # total_size, magic_code, record_crc
# the fields assigned under the append lock, packed into a prepared record in place
_POSITIONS = struct.Struct(">qq")  # queue_offset, physical_offset
_POSITIONS_AT: Final = 24
_STORE_TIMESTAMP = struct.Struct(">q")
_STORE_TIMESTAMP_AT: Final = 60
_RECORD_CRC = struct.Struct(">I")
CRC_FROM: Final = 12  # the record CRC covers bytes [12, total_size)
BLANK_STRUCT = struct.Struct(">ii")
_U8 = struct.Struct(">B")
U16_STRUCT = struct.Struct(">H")
MIN_RECORD_SIZE: Final = HEADER_SIZE + 1 + 2

_DEFAULT_HOST: Final = bytes(8)


@functools.lru_cache(maxsize=4096)
def encode_host(ip: str, port: int) -> bytes:
    """8 bytes for an IPv4 ``ip`` and ``port`` (RocketMQ's born/store host layout); cached: hosts repeat."""
    parts = ip.split(".")
    if len(parts) != 4 or not all(p.isdigit() and 0 <= int(p) <= 255 for p in parts):
        raise ValueError(f"not an IPv4 address: {ip!r}")
    if not 0 <= port <= 0xFFFF:
        raise ValueError(f"port out of range: {port}")
    return bytes(int(p) for p in parts) + port.to_bytes(4, "big")


def decode_host(raw: bytes) -> tuple[str, int]:
    """Inverse of :func:`encode_host`."""
    return ".".join(str(b) for b in raw[:4]), int.from_bytes(raw[4:8], "big")


def tags_code_of(tags: str | None) -> int:
    """RocketMQ's ``tagsString2tagsCode``: the tag's Java hash widened to long; 0 when there is no tag."""
    if not tags:
        return 0
    return java_string_hash(tags)


def check_topic_name(topic: str) -> None:
    """RocketMQ's topic rules: 1..127 characters of ``[%|a-zA-Z0-9_-]`` (also safe as a directory name)."""
    if not isinstance(topic, str) or not _TOPIC_RE.match(topic):
        raise ValueError(
            f"illegal topic name {topic!r}: use 1..{MAX_TOPIC_LENGTH} characters of [%|a-zA-Z0-9_-]"
        )
    if len(topic) > MAX_TOPIC_LENGTH:
        raise MessageTooLargeError(f"topic of {len(topic)} characters exceeds the limit {MAX_TOPIC_LENGTH}")


def check_property(name: str, value: str) -> None:
    """Reject property names/values that would break the ``name\\x01value\\x02`` encoding."""
    if not name:
        raise ValueError("property names must not be empty")
    for what, text in (("name", name), ("value", value)):
        if NAME_VALUE_SEPARATOR in text or PROPERTY_SEPARATOR in text:
            raise ValueError(
                f"property {what} {text!r} contains a reserved separator character (\\x01 or \\x02)"
            )


def encode_properties(properties: Mapping[str, str]) -> bytes:
    """``name\\x01value\\x02`` pairs, UTF-8; names and values are checked for separators."""
    if not properties:
        return b""
    parts: list[str] = []
    for name, value in properties.items():
        if type(name) is not str or type(value) is not str or not name:
            return _encode_properties_checked(properties)
        parts.append(f"{name}{NAME_VALUE_SEPARATOR}{value}{PROPERTY_SEPARATOR}")
    text = "".join(parts)
    # each pair contributes exactly one of each separator unless a name or value holds one
    n = len(parts)
    if text.count(NAME_VALUE_SEPARATOR) != n or text.count(PROPERTY_SEPARATOR) != n:
        return _encode_properties_checked(properties)
    return text.encode("utf-8")


def _encode_properties_checked(properties: Mapping[str, str]) -> bytes:
    """The pair-by-pair encoder: raises the precise error for a bad name or value."""
    parts: list[str] = []
    for name, value in properties.items():
        if not isinstance(name, str) or not isinstance(value, str):
            raise ValueError(f"property {name!r} must map a str to a str")
        check_property(name, value)
        parts.append(f"{name}{NAME_VALUE_SEPARATOR}{value}{PROPERTY_SEPARATOR}")
    return "".join(parts).encode("utf-8")


def decode_properties(raw: bytes) -> dict[str, str]:
    """Inverse of :func:`encode_properties` (tolerates a missing final separator, as RocketMQ)."""
    props: dict[str, str] = {}
    if not raw:
        return props
    for item in raw.decode("utf-8").split(PROPERTY_SEPARATOR):
        name, sep, value = item.partition(NAME_VALUE_SEPARATOR)
        if sep:
            props[name] = value
    return props


@dataclass(frozen=True, slots=True)
class Message:
    """A message to append: what a producer sends plus broker-side metadata.

    ``properties`` holds TAGS, KEYS (space-separated), UNIQ_KEY and user properties.
    """

    topic: str
    body: bytes
    queue_id: int = 0
    properties: Mapping[str, str] = field(default_factory=dict)
    flag: int = 0
    sys_flag: int = 0
    born_timestamp: int = 0
    born_host: bytes = _DEFAULT_HOST
    store_host: bytes = _DEFAULT_HOST
    reconsume_times: int = 0
    prepared_transaction_offset: int = 0

    @property
    def tags(self) -> str | None:
        """The TAGS property, or None."""
        return self.properties.get(PROPERTY_TAGS)


class StoredMessage(NamedTuple):
    """A message decoded from the CommitLog, with the positions the store assigned.

    A named tuple: one is built per record read, and a tuple is built in one step where a
    slotted object takes one per field (~0.2 against ~1.2 us).
    """

    topic: str
    body: bytes
    queue_id: int
    queue_offset: int
    commit_log_offset: int
    store_size: int
    properties: dict[str, str]
    flag: int
    sys_flag: int
    born_timestamp: int
    born_host: bytes
    store_timestamp: int
    store_host: bytes
    reconsume_times: int
    prepared_transaction_offset: int
    body_crc: int

    @property
    def tags(self) -> str | None:
        """The TAGS property, or None."""
        return self.properties.get(PROPERTY_TAGS)

    @property
    def keys(self) -> list[str]:
        """The KEYS property split on spaces."""
        return [k for k in self.properties.get(PROPERTY_KEYS, "").split(KEY_SEPARATOR) if k]

    @property
    def uniq_key(self) -> str | None:
        """The client-generated message id (UNIQ_KEY), or None."""
        return self.properties.get(PROPERTY_UNIQ_KEY)

    @property
    def offset_msg_id(self) -> str:
        """RocketMQ's offsetMsgId (:func:`offset_msg_id`)."""
        return offset_msg_id(self.store_host, self.commit_log_offset)


def offset_msg_id(store_host: bytes, commit_log_offset: int) -> str:
    """RocketMQ's offsetMsgId: hex of store host (8 bytes) + commit log offset (8 bytes)."""
    return (store_host + commit_log_offset.to_bytes(8, "big")).hex().upper()


class EncodedParts(NamedTuple):
    """A message validated and encoded once, before taking the append lock.

    ``record`` holds the whole record with the fields assigned under the lock (queue offset,
    physical offset, store timestamp, record CRC) still zero; :func:`finish_record` fills them
    in place. ``properties`` is a snapshot of the message's properties (the caller may mutate
    its mapping after the append returns). Treat instances as owned by one append.
    """

    topic: str
    queue_id: int
    size: int
    record: bytearray
    properties: dict[str, str]


_topic_prefixes: dict[str, bytes] = {}  # topic -> topic_length byte + topic bytes, for checked topics
_MAX_CACHED_TOPICS: Final = 4096


def _topic_prefix(topic: str) -> bytes:
    """The topic_length byte + topic bytes of a record, for a checked topic."""
    check_topic_name(topic)
    topic_bytes = topic.encode("ascii")
    prefix = bytes((len(topic_bytes),)) + topic_bytes
    if len(_topic_prefixes) >= _MAX_CACHED_TOPICS:
        _topic_prefixes.clear()
    _topic_prefixes[topic] = prefix
    return prefix


def _checked_prefix(topic: str, queue_id: int) -> bytes:
    """The topic_length byte + topic bytes of a record for ``topic``, after checking it and the queue id."""
    topic_prefix = _topic_prefixes.get(topic) if type(topic) is str else None
    if topic_prefix is None:
        topic_prefix = _topic_prefix(topic)
    if queue_id < 0 or queue_id > 0x7FFFFFFF:
        raise ValueError(f"queue id out of range: {queue_id}")
    return topic_prefix


def _checked_body(body: object, max_body_size: int) -> bytes:
    """A body that is not plain ``bytes`` or is too long: as bytes, or the error."""
    if not isinstance(body, bytes | bytearray | memoryview):
        raise ValueError("message body must be bytes")
    if len(body) > max_body_size:
        raise MessageTooLargeError(f"message body of {len(body)} bytes exceeds the limit {max_body_size}")
    return bytes(body)


def _encode_bounded(properties: Mapping[str, str], reserve: int = 0) -> bytes:
    """:func:`encode_properties`, refusing more than :data:`MAX_PROPERTIES_LENGTH` less ``reserve`` bytes."""
    encoded = encode_properties(properties)
    if len(encoded) > MAX_PROPERTIES_LENGTH - reserve:
        raise MessageTooLargeError(_too_long(len(encoded), reserve))
    return encoded


def check_properties(properties: Mapping[str, str], reserve: int = 0) -> None:
    """Raise :class:`MessageTooLargeError` for properties a put would refuse (see :func:`prepare_batch`)."""
    _encode_bounded(properties, reserve)


def _too_long(length: int, reserve: int) -> str:
    if not reserve:
        return f"properties of {length} bytes exceed the limit {MAX_PROPERTIES_LENGTH}"
    return (
        f"properties of {length} bytes exceed the limit {MAX_PROPERTIES_LENGTH - reserve} (the record "
        f"limit {MAX_PROPERTIES_LENGTH} less {reserve} bytes kept for the properties the broker adds "
        "to a copy it makes, such as a dead letter)"
    )


def prepare(message: Message, *, max_body_size: int) -> EncodedParts:
    """Validate ``message`` against the limits and encode its record (positions left zero).

    Raises :class:`MessageTooLargeError` for a body, topic or properties over their limits and
    ``ValueError`` for a malformed message (bad separators, negative queue id, ...).
    """
    body = message.body
    if type(body) is not bytes or len(body) > max_body_size:
        body = _checked_body(body, max_body_size)
    body_length = len(body)
    topic = message.topic
    queue_id = message.queue_id
    topic_prefix = _checked_prefix(topic, queue_id)
    born_host = message.born_host
    store_host = message.store_host
    if len(born_host) != 8 or len(store_host) != 8:
        raise ValueError("born_host and store_host must be 8 bytes (see encode_host)")
    properties = dict(message.properties)
    properties_bytes = _encode_bounded(properties)
    properties_length = len(properties_bytes)
    size = HEADER_SIZE + body_length + len(topic_prefix) + 2 + properties_length
    body_crc = zlib.crc32(body)
    header = HEADER_STRUCT.pack(
        size,
        MESSAGE_MAGIC_CODE,
        0,
        body_crc,
        queue_id,
        message.flag,
        0,
        0,
        message.sys_flag,
        message.born_timestamp,
        born_host if type(born_host) is bytes else bytes(born_host),
        0,
        store_host if type(store_host) is bytes else bytes(store_host),
        message.reconsume_times,
        message.prepared_transaction_offset,
        body_length,
    )
    record = _EMPTY.join((header, body, topic_prefix, U16_STRUCT.pack(properties_length), properties_bytes))
    return _encoded_parts((topic, queue_id, size, record, properties))


_EMPTY: Final = bytearray()  # bytearray().join gives a bytearray without copying the joined bytes


@dataclass(slots=True)
class EncodedBatch:
    """Messages of one topic and queue encoded back to back into one buffer, before the append lock.

    The fields assigned under the lock are still zero in every record; :func:`finish_batch` fills
    them in place. ``properties`` are the callers' dicts, owned by the batch from then on.
    """

    topic: str
    queue_id: int
    buffer: bytearray
    sizes: list[int]
    properties: list[dict[str, str]]


#: One message of an :class:`EncodedBatch`: body, properties, born timestamp (ms), born host (8 bytes).
BatchEntry = tuple[bytes, dict[str, str], int, bytes]


def prepare_batch(
    topic: str,
    queue_id: int,
    entries: Sequence[BatchEntry],
    *,
    max_body_size: int,
    properties_reserve: int = 0,
) -> EncodedBatch:
    """Validate and encode messages of one topic and queue (flag, sys flag and reconsume times 0).

    The batch counterpart of :func:`prepare`, with its checks and errors; the properties dicts
    are not copied, so the caller must not change them afterwards. ``properties_reserve``: bytes
    each message's properties must leave free below :data:`MAX_PROPERTIES_LENGTH`, so that a copy
    with properties added (a dead letter) still fits.
    """
    topic_prefix = _checked_prefix(topic, queue_id)
    chunks: list[bytes] = []
    sizes: list[int] = []
    props_list: list[dict[str, str]] = []
    fixed = HEADER_SIZE + len(topic_prefix) + 2
    pack_header = HEADER_STRUCT.pack
    pack_u16 = U16_STRUCT.pack
    crc32 = zlib.crc32
    for given_body, properties, born_timestamp, born_host in entries:
        body = given_body
        if type(body) is not bytes or len(body) > max_body_size:
            body = _checked_body(body, max_body_size)
        body_length = len(body)
        if type(born_host) is not bytes or len(born_host) != 8:
            raise ValueError("born_host must be 8 bytes (see encode_host)")
        properties_bytes = _encode_bounded(properties, properties_reserve)
        properties_length = len(properties_bytes)
        size = fixed + body_length + properties_length
        chunks += (
            pack_header(size, MESSAGE_MAGIC_CODE, 0, crc32(body), queue_id, 0, 0, 0, 0,
                        born_timestamp, born_host, 0, _DEFAULT_HOST, 0, 0, body_length),
            body,
            topic_prefix,
            pack_u16(properties_length),
            properties_bytes,
        )  # fmt: skip
        sizes.append(size)
        props_list.append(properties)
    return EncodedBatch(topic, queue_id, _EMPTY.join(chunks), sizes, props_list)


def finish_batch(
    batch: EncodedBatch, first_queue_offset: int, first_physical_offset: int, store_timestamp: int
) -> None:
    """:func:`finish_record` for each record of ``batch``, numbered from the given offsets."""
    buffer = batch.buffer
    view = memoryview(buffer)
    pos = 0
    queue_offset = first_queue_offset
    pack_positions = _POSITIONS.pack_into
    pack_timestamp = _STORE_TIMESTAMP.pack_into
    pack_crc = _RECORD_CRC.pack_into
    crc32 = zlib.crc32
    try:
        for size in batch.sizes:
            pack_positions(buffer, pos + _POSITIONS_AT, queue_offset, first_physical_offset + pos)
            pack_timestamp(buffer, pos + _STORE_TIMESTAMP_AT, store_timestamp)
            end = pos + size
            pack_crc(buffer, pos + 8, crc32(view[pos + CRC_FROM : end]))
            pos = end
            queue_offset += 1
    finally:
        view.release()


# ``EncodedParts((topic, queue_id, size, record, properties))`` minus the generated ``__new__``'s
# argument handling (it runs once per message appended)
_encoded_parts: Final = functools.partial(tuple.__new__, EncodedParts)


def split_batch(batch: EncodedBatch) -> list[EncodedParts]:
    """The records of ``batch`` one by one (for appends that must roll to a new segment part-way)."""
    parts: list[EncodedParts] = []
    pos = 0
    for size, properties in zip(batch.sizes, batch.properties, strict=True):
        parts.append(
            _encoded_parts((batch.topic, batch.queue_id, size, batch.buffer[pos : pos + size], properties))
        )
        pos += size
    return parts


def finish_record(record: bytearray, queue_offset: int, physical_offset: int, store_timestamp: int) -> None:
    """Fill the fields assigned under the append lock into a prepared record, then its CRC."""
    _POSITIONS.pack_into(record, _POSITIONS_AT, queue_offset, physical_offset)
    _STORE_TIMESTAMP.pack_into(record, _STORE_TIMESTAMP_AT, store_timestamp)
    _RECORD_CRC.pack_into(record, 8, zlib.crc32(memoryview(record)[CRC_FROM:]))


def encode_record(
    parts: EncodedParts, *, queue_offset: int, physical_offset: int, store_timestamp: int
) -> bytes:
    """The full record bytes of a prepared message at its assigned positions (``parts`` is unchanged)."""
    record = bytearray(parts.record)
    finish_record(record, queue_offset, physical_offset, store_timestamp)
    return bytes(record)


def encode_blank(remaining: int) -> bytes:
    """The end-of-segment marker: ``remaining`` bytes are unused up to the segment end."""
    return BLANK_STRUCT.pack(remaining, BLANK_MAGIC_CODE)
