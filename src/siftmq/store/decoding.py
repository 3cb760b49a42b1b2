"""Reading CommitLog records: the header peek, the full check, and the decoders.

The layout and the encoders are in :mod:`siftmq.store.codec`. A record is checked before anything
of it is believed: size, magic code, CRC-32 of every byte after the CRC field, and its own
physical offset; a failed check raises :class:`~siftmq.errors.CorruptRecordError` naming it.
:func:`decode_entry` is the pull path's decoder: one pass per candidate, positional arguments,
the filter's exact stage applied before a :class:`~siftmq.store.codec.StoredMessage` is built.
"""

from __future__ import annotations

import functools
import struct
import zlib
from collections.abc import Callable
from typing import Any, Final, NamedTuple, cast

from siftmq.errors import CorruptRecordError
from siftmq.store.codec import (
    BLANK_STRUCT,
    CRC_FROM,
    HEADER_SIZE,
    HEADER_STRUCT,
    MESSAGE_MAGIC_CODE,
    MIN_RECORD_SIZE,
    NAME_VALUE_SEPARATOR,
    PREFIX_STRUCT,
    PROPERTY_SEPARATOR,
    U16_STRUCT,
    StoredMessage,
    decode_properties,
    offset_msg_id,
)


def peek_header(data: bytes | memoryview, pos: int = 0) -> tuple[int, int]:
    """``(total_size, magic_code)`` at ``pos``; the caller ensures 8 bytes are available."""
    total_size, magic = BLANK_STRUCT.unpack_from(data, pos)
    return int(total_size), int(magic)


def check_record(data: bytes | memoryview, pos: int, expected_offset: int, *, max_record_size: int) -> int:
    """Verify the record at ``data[pos:]`` (length, magic, CRC, physical offset); return its size.

    Raises :class:`CorruptRecordError` describing the first failed check.
    """
    available = len(data) - pos
    if available < PREFIX_STRUCT.size:
        raise CorruptRecordError("truncated record header", offset=expected_offset)
    total_size, magic, record_crc = PREFIX_STRUCT.unpack_from(data, pos)
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
    ) = HEADER_STRUCT.unpack_from(data, pos)
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
        (properties_length,) = U16_STRUCT.unpack_from(data, p)
        p += 2
        if p + properties_length != end:
            raise ValueError("properties length")
        properties = decode_properties(bytes(data[p : p + properties_length]))
    except (ValueError, UnicodeDecodeError, IndexError) as exc:
        # only reachable if a record with a valid CRC was written inconsistently
        raise CorruptRecordError(f"inconsistent record fields ({exc})", offset=offset) from exc
    return _new_stored_message(
        (
            topic,
            body,
            queue_id,
            queue_offset,
            physical_offset,
            total_size,
            properties,
            flag,
            sys_flag,
            born_timestamp,
            born_host,
            store_timestamp,
            store_host,
            reconsume_times,
            prepared_transaction_offset,
            body_crc,
        )
    )


_new_stored_message: Final = functools.partial(tuple.__new__, StoredMessage)


class RawRecord(NamedTuple):
    """A record of a queue checked as :func:`split_entry` checks it, but not decoded: its
    properties as stored (``name \\x01 value`` pairs joined by ``\\x02``) and its body, for a
    consumer's filter program to see before the broker decodes the few it keeps
    (:func:`decode_raw`)."""

    record: bytes  # the whole record
    commit_log_offset: int
    queue_offset: int
    properties: bytes
    body: bytes
    born_timestamp: int
    store_timestamp: int
    store_host: bytes

    @property
    def offset_msg_id(self) -> str:
        """As :attr:`StoredMessage.offset_msg_id`."""
        return offset_msg_id(self.store_host, self.commit_log_offset)


def _checked_entry(  # noqa: PLR0917 - positional on purpose: it runs once per candidate of a pull
    data: bytes,
    pos: int,
    offset: int,
    size: int,
    max_record_size: int,
    topic: str,
    topic_bytes: bytes,
    queue_id: int,
    queue_offset: int,
    verify_crc: bool,
) -> tuple[tuple[Any, ...], int, int, int]:
    """The checks of :func:`decode_entry` (the CRC's only with ``verify_crc``): (the header's
    fields, body start, body end, topic end)."""
    if len(data) - pos < MIN_RECORD_SIZE:
        check_record(data, pos, offset, max_record_size=max_record_size)  # raises
    header: tuple[Any, ...] = HEADER_STRUCT.unpack_from(data, pos)
    total_size, magic, record_crc = header[0], header[1], header[2]
    record_queue_id, record_queue_offset, physical_offset = header[4], header[6], header[7]
    body_length = header[15]
    end = pos + total_size
    if (
        magic != MESSAGE_MAGIC_CODE
        or total_size != size
        or physical_offset != offset
        or not MIN_RECORD_SIZE <= total_size <= max_record_size
        or end > len(data)
    ):
        # the precise error; when only the size differs, check_record passes
        check_record(data, pos, offset, max_record_size=max_record_size)
        raise CorruptRecordError(f"record size {total_size} differs from index size {size}", offset=offset)
    if verify_crc:
        # a small record's bytes are copied faster than a memoryview is made
        covered = (
            data[pos + CRC_FROM : end]
            if total_size <= _COPY_TO_CRC
            else memoryview(data)[pos + CRC_FROM : end]
        )
        if zlib.crc32(covered) != record_crc:
            raise CorruptRecordError("record CRC mismatch", offset=offset)
    body_start = pos + HEADER_SIZE
    body_end = body_start + body_length
    if body_length < 0 or body_end + 3 > end:
        raise CorruptRecordError("inconsistent record fields (body length)", offset=offset)
    topic_end = body_end + 1 + data[body_end]
    if topic_end + 2 > end or (data[topic_end] << 8 | data[topic_end + 1]) != end - topic_end - 2:
        raise CorruptRecordError("inconsistent record fields (topic or properties length)", offset=offset)
    if (
        record_queue_id != queue_id
        or record_queue_offset != queue_offset
        or topic_end - body_end - 1 != len(topic_bytes)
        or not data.startswith(topic_bytes, body_end + 1)
    ):
        record_topic = data[body_end + 1 : topic_end]
        raise CorruptRecordError(
            f"consume queue {topic}:{queue_id} entry {queue_offset} points at a record of "
            f"{record_topic.decode('utf-8', 'replace')}:{record_queue_id}@{record_queue_offset}",
            offset=offset,
        )
    return header, body_start, body_end, topic_end


def decode_entry(  # noqa: PLR0917 - positional on purpose: it runs once per candidate of a pull
    data: bytes,
    pos: int,
    offset: int,
    size: int,
    max_record_size: int,
    topic: str,
    topic_bytes: bytes,
    queue_id: int,
    queue_offset: int,
    accept: Callable[[dict[str, str]], bool] | None,
) -> StoredMessage | None:
    """Verify and decode the record a ConsumeQueue entry points at, in one pass.

    ``data[pos:]`` holds the record at CommitLog ``offset``; the entry says it is ``size`` bytes
    of ``topic`` (whose UTF-8 is ``topic_bytes``) / ``queue_id`` at ``queue_offset``. Every check
    of :func:`decode_record` is made, plus the entry's; a mismatch raises
    :class:`CorruptRecordError`. When ``accept`` is given it is called with the decoded properties
    first, and a record it rejects returns None without building a :class:`StoredMessage`.
    """
    header, body_start, body_end, topic_end = _checked_entry(
        data, pos, offset, size, max_record_size, topic, topic_bytes, queue_id, queue_offset, True
    )
    (
        total_size,
        _magic,
        _record_crc,
        body_crc,
        _record_queue_id,
        flag,
        _record_queue_offset,
        _physical_offset,
        sys_flag,
        born_timestamp,
        born_host,
        store_timestamp,
        store_host,
        reconsume_times,
        prepared_transaction_offset,
        _body_length,
    ) = header
    end = pos + total_size
    properties = _properties(data, topic_end + 2, end, offset)
    if accept is not None and not accept(properties):
        return None
    return _new_stored_message(
        (
            topic,
            data[body_start:body_end],
            queue_id,
            queue_offset,
            offset,
            total_size,
            properties,
            flag,
            sys_flag,
            born_timestamp,
            born_host,
            store_timestamp,
            store_host,
            reconsume_times,
            prepared_transaction_offset,
            body_crc,
        )
    )


def _properties(data: bytes, start: int, end: int, offset: int) -> dict[str, str]:
    properties: dict[str, str] = {}
    if start < end:
        try:
            for item in data[start:end].decode("utf-8").split(PROPERTY_SEPARATOR):
                name, sep, value = item.partition(NAME_VALUE_SEPARATOR)
                if sep:
                    properties[name] = value
        except UnicodeDecodeError as exc:
            raise CorruptRecordError(f"inconsistent record fields ({exc})", offset=offset) from exc
    return properties


def split_entry(  # noqa: PLR0917 - decode_entry's arguments, so the read path takes either
    data: bytes,
    pos: int,
    offset: int,
    size: int,
    max_record_size: int,
    topic: str,
    topic_bytes: bytes,
    queue_id: int,
    queue_offset: int,
    accept: Callable[[dict[str, str]], bool] | None,
) -> RawRecord | None:
    """The record a ConsumeQueue entry points at as a :class:`RawRecord` (None: ``accept``, the
    filter's exact stage, rejects it), checked as :func:`decode_entry` checks it but for the CRC:
    that is :func:`decode_raw`'s, for the few records a program keeps. A damaged record a program
    passes over is passed over as a damaged one would be, only not counted. Without ``accept`` the
    properties are not decoded."""
    header, body_start, body_end, topic_end = _checked_entry(
        data, pos, offset, size, max_record_size, topic, topic_bytes, queue_id, queue_offset, False
    )
    end = pos + header[0]
    if accept is not None and not accept(_properties(data, topic_end + 2, end, offset)):
        return None
    return RawRecord(
        data[pos:end],
        offset,
        queue_offset,
        data[topic_end + 2 : end],
        data[body_start:body_end],
        header[9],
        header[11],
        header[12],
    )


def decode_raw(raw: RawRecord, max_record_size: int, topic: str, queue_id: int) -> StoredMessage:
    """The message of a :class:`RawRecord` of ``topic``/``queue_id``, its CRC checked."""
    msg = decode_entry(
        raw.record, 0, raw.commit_log_offset, len(raw.record), max_record_size, topic,
        topic.encode(), queue_id, raw.queue_offset, None,
    )  # fmt: skip
    return cast(StoredMessage, msg)  # no accept: never None


_COPY_TO_CRC: Final = 4096
