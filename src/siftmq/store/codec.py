"""CommitLog record codec: pure encode/decode with magic and CRC checks.

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

import re
import struct
import zlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final

from siftmq.errors import CorruptRecordError, MessageTooLargeError
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

_HEADER = struct.Struct(">iiIIiiqqiq8sq8siqi")
HEADER_SIZE: Final = _HEADER.size  # 92 (fixed part up to and including body_length)
_PREFIX = struct.Struct(">iiI")  # total_size, magic_code, record_crc
_BLANK = struct.Struct(">ii")
_U8 = struct.Struct(">B")
_U16 = struct.Struct(">H")
MIN_RECORD_SIZE: Final = HEADER_SIZE + 1 + 2

_DEFAULT_HOST: Final = bytes(8)


def encode_host(ip: str, port: int) -> bytes:
    """8 bytes for an IPv4 ``ip`` and ``port`` (RocketMQ's born/store host layout)."""
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


def check_topic(topic: str) -> None:
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
        if not item:
            continue
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


@dataclass(frozen=True, slots=True)
class StoredMessage:
    """A message decoded from the CommitLog, with the positions the store assigned."""

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
        """RocketMQ's offsetMsgId: hex of store host (8 bytes) + commit log offset (8 bytes)."""
        return (self.store_host + self.commit_log_offset.to_bytes(8, "big")).hex().upper()


@dataclass(frozen=True, slots=True)
class EncodedParts:
    """The variable parts of a message, validated and encoded once (before taking the append lock)."""

    message: Message
    topic_bytes: bytes
    properties_bytes: bytes
    body_crc: int
    size: int


def prepare(message: Message, *, max_body_size: int) -> EncodedParts:
    """Validate ``message`` against the limits and encode its topic and properties.

    Raises :class:`MessageTooLargeError` for a body, topic or properties over their limits and
    ``ValueError`` for a malformed message (bad separators, negative queue id, ...).
    """
    if not isinstance(message.body, bytes | bytearray | memoryview):
        raise ValueError("message body must be bytes")
    if len(message.body) > max_body_size:
        raise MessageTooLargeError(
            f"message body of {len(message.body)} bytes exceeds the limit {max_body_size}"
        )
    check_topic(message.topic)
    topic_bytes = message.topic.encode("ascii")
    if message.queue_id < 0 or message.queue_id > 0x7FFFFFFF:
        raise ValueError(f"queue id out of range: {message.queue_id}")
    if len(message.born_host) != 8 or len(message.store_host) != 8:
        raise ValueError("born_host and store_host must be 8 bytes (see encode_host)")
    properties_bytes = encode_properties(message.properties)
    if len(properties_bytes) > MAX_PROPERTIES_LENGTH:
        raise MessageTooLargeError(
            f"properties of {len(properties_bytes)} bytes exceed the limit {MAX_PROPERTIES_LENGTH}"
        )
    size = HEADER_SIZE + len(message.body) + 1 + len(topic_bytes) + 2 + len(properties_bytes)
    return EncodedParts(message, topic_bytes, properties_bytes, zlib.crc32(message.body), size)


def encode_record(
    parts: EncodedParts, *, queue_offset: int, physical_offset: int, store_timestamp: int
) -> bytes:
    """The full record bytes of a prepared message at its assigned positions."""
    m = parts.message
    buf = bytearray(parts.size)
    _HEADER.pack_into(
        buf,
        0,
        parts.size,
        MESSAGE_MAGIC_CODE,
        0,
        parts.body_crc,
        m.queue_id,
        m.flag,
        queue_offset,
        physical_offset,
        m.sys_flag,
        m.born_timestamp,
        bytes(m.born_host),
        store_timestamp,
        bytes(m.store_host),
        m.reconsume_times,
        m.prepared_transaction_offset,
        len(m.body),
    )
    pos = HEADER_SIZE
    buf[pos : pos + len(m.body)] = m.body
    pos += len(m.body)
    buf[pos] = len(parts.topic_bytes)
    pos += 1
    buf[pos : pos + len(parts.topic_bytes)] = parts.topic_bytes
    pos += len(parts.topic_bytes)
    _U16.pack_into(buf, pos, len(parts.properties_bytes))
    pos += 2
    buf[pos : pos + len(parts.properties_bytes)] = parts.properties_bytes
    struct.pack_into(">I", buf, 8, zlib.crc32(memoryview(buf)[12:]))
    return bytes(buf)


def encode_blank(remaining: int) -> bytes:
    """The end-of-segment marker: ``remaining`` bytes are unused up to the segment end."""
    return _BLANK.pack(remaining, BLANK_MAGIC_CODE)


def peek_header(data: bytes | memoryview, pos: int = 0) -> tuple[int, int]:
    """``(total_size, magic_code)`` at ``pos``; the caller ensures 8 bytes are available."""
    total_size, magic = _BLANK.unpack_from(data, pos)
    return int(total_size), int(magic)


def check_record(data: bytes | memoryview, pos: int, expected_offset: int, *, max_record_size: int) -> int:
    """Verify the record at ``data[pos:]`` (length, magic, CRC, physical offset); return its size.

    Raises :class:`CorruptRecordError` describing the first failed check.
    """
    available = len(data) - pos
    if available < _PREFIX.size:
        raise CorruptRecordError("truncated record header", offset=expected_offset)
    total_size, magic, record_crc = _PREFIX.unpack_from(data, pos)
    if magic != MESSAGE_MAGIC_CODE:
        raise CorruptRecordError(f"bad magic code {magic:#x}", offset=expected_offset)
    if total_size < MIN_RECORD_SIZE or total_size > max_record_size:
        raise CorruptRecordError(f"implausible record size {total_size}", offset=expected_offset)
    if total_size > available:
        raise CorruptRecordError(
            f"truncated record: {total_size} bytes announced, {available} present", offset=expected_offset
        )
    view = memoryview(data)[pos + 12 : pos + total_size]
    if zlib.crc32(view) != record_crc:
        raise CorruptRecordError("record CRC mismatch", offset=expected_offset)
    (physical_offset,) = struct.unpack_from(">q", data, pos + 32)
    if physical_offset != expected_offset:
        raise CorruptRecordError(f"record claims physical offset {physical_offset}", offset=expected_offset)
    return int(total_size)


def decode_record(
    data: bytes | memoryview, pos: int, expected_offset: int, *, max_record_size: int
) -> StoredMessage:
    """Verify and decode the record at ``data[pos:]`` (see :func:`check_record`)."""
    total_size = check_record(data, pos, expected_offset, max_record_size=max_record_size)
    return _decode_checked(data, pos, total_size, expected_offset)


def _decode_checked(data: bytes | memoryview, pos: int, total_size: int, offset: int) -> StoredMessage:
    (
        _size,
        _magic,
        _crc,
        body_crc,
        queue_id,
        flag,
        queue_offset,
        physical_offset,
        sys_flag,
        born_timestamp,
        born_host,
        store_timestamp,
        store_host,
        reconsume_times,
        prepared_transaction_offset,
        body_length,
    ) = _HEADER.unpack_from(data, pos)
    end = pos + total_size
    p = pos + HEADER_SIZE
    try:
        if body_length < 0 or p + body_length + 3 > end:
            raise ValueError("body length")
        body = bytes(data[p : p + body_length])
        p += body_length
        topic_length = data[p]
        p += 1
        if p + topic_length + 2 > end:
            raise ValueError("topic length")
        topic = bytes(data[p : p + topic_length]).decode("utf-8")
        p += topic_length
        (properties_length,) = _U16.unpack_from(data, p)
        p += 2
        if p + properties_length != end:
            raise ValueError("properties length")
        properties = decode_properties(bytes(data[p : p + properties_length]))
    except (ValueError, UnicodeDecodeError, IndexError) as exc:
        # only reachable if a record with a valid CRC was written inconsistently
        raise CorruptRecordError(f"inconsistent record fields ({exc})", offset=offset) from exc
    return StoredMessage(
        topic=topic,
        body=body,
        queue_id=queue_id,
        queue_offset=queue_offset,
        commit_log_offset=physical_offset,
        store_size=total_size,
        properties=properties,
        flag=flag,
        sys_flag=sys_flag,
        born_timestamp=born_timestamp,
        born_host=born_host,
        store_timestamp=store_timestamp,
        store_host=store_host,
        reconsume_times=reconsume_times,
        prepared_transaction_offset=prepared_transaction_offset,
        body_crc=body_crc,
    )
