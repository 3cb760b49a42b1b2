"""Checks on what clients send: topic and group names, tags, keys, user properties.

Each check raises :class:`~siftmq.errors.BadRequestError` with the wire status RocketMQ uses
(``ILLEGAL_TOPIC``, ``ILLEGAL_MESSAGE_TAG``, ...) and a message naming what was wrong.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from typing import Final

from siftmq.errors import BadRequestError, StatusCode

MAX_TOPIC_LENGTH: Final = 127
MAX_GROUP_LENGTH: Final = 122  # %DLQ%<group> must be a valid topic (127)
MAX_TAG_LENGTH: Final = 255
MAX_KEY_LENGTH: Final = 255
MAX_KEYS: Final = 32
MAX_MESSAGE_ID_LENGTH: Final = 128
TAG_CACHE_SIZE: Final = 4096  # distinct tags whose check is remembered
_NAME_RE: Final = re.compile(r"[%|a-zA-Z0-9_-]+")  # RocketMQ's TopicValidator characters
_WHITESPACE: Final = re.compile(r"\s")  # the characters of str.isspace() (re uses the same table)
# Java's Character.isISOControl, which RocketMQ's proxy refuses in tags and keys (\x01 and \x02 among
# them: they separate properties in a stored record)
_CONTROL: Final = re.compile("[\x00-\x1f\x7f-\x9f]")
_SYSTEM_PREFIX: Final = "%"
#: Property names the broker writes itself; a user property may not take them.
RESERVED_PROPERTIES: Final = frozenset(
    {
        "TAGS",
        "KEYS",
        "UNIQ_KEY",
        "WAIT",
        "DELAY",
        "RETRY_TOPIC",
        "REAL_TOPIC",
        "REAL_QID",
        "TRAN_MSG",
        "PGROUP",
        "MIN_OFFSET",
        "MAX_OFFSET",
        "BUYER_ID",
        "ORIGIN_MESSAGE_ID",
        "TRANSFER_FLAG",
        "CORRECTION_FLAG",
        "MQ2_FLAG",
        "RECONSUME_TIME",
        "MSG_REGION",
        "TRACE_ON",
        "MAX_RECONSUME_TIMES",
        "CONSUME_START_TIME",
        "DLQ_ORIGIN_TOPIC",
        "DLQ_ORIGIN_MESSAGE_ID",
        "FILTER_ERROR",  # siftmq's: why a filter program sent the message to the dead-letter topic
        "INNER_NUM",
        "INNER_BASE",
        "TIMER_DELIVER_MS",
        "TIMER_DELAY_SEC",
    }
)


#: System topic prefixes a namespace goes after, as RocketMQ wraps them (``%DLQ%ns%group``).
_SYSTEM_PREFIXES: Final = ("%DLQ%", "%RETRY%")


def qualified_name(namespace: str, name: str) -> str:
    """RocketMQ's namespaced resource name: ``namespace%name`` (just ``name`` without a namespace),
    and for a group's dead-letter or retry topic the namespace after the prefix, as the broker names
    the topic it moves the group's messages to (``%DLQ%`` + the group's qualified name)."""
    if not namespace:
        return name
    for prefix in _SYSTEM_PREFIXES:
        if name.startswith(prefix):
            rest = name[len(prefix) :]
            return name if rest.startswith(namespace + "%") else f"{prefix}{namespace}%{rest}"
    return f"{namespace}%{name}"


def check_topic(topic: str, *, for_send: bool = False) -> None:
    """1..127 characters of ``[%|a-zA-Z0-9_-]``; producers may not write system topics (``%...``)."""
    if not topic:
        raise BadRequestError("topic name is empty", status=StatusCode.ILLEGAL_TOPIC)
    if len(topic) > MAX_TOPIC_LENGTH:
        raise BadRequestError(
            f"topic name of {len(topic)} characters exceeds {MAX_TOPIC_LENGTH}",
            status=StatusCode.ILLEGAL_TOPIC,
        )
    if not _NAME_RE.fullmatch(topic):
        raise BadRequestError(
            f"illegal topic name {topic!r}: use characters of [%|a-zA-Z0-9_-]",
            status=StatusCode.ILLEGAL_TOPIC,
        )
    if for_send and topic.startswith(_SYSTEM_PREFIX) and "%" in topic[1:]:
        raise BadRequestError(
            f"topic {topic!r} is a system topic; producers cannot send to it", status=StatusCode.ILLEGAL_TOPIC
        )


def check_group(group: str) -> None:
    """1..255 characters of ``[%|a-zA-Z0-9_-]`` (so ``group#topic`` bloom keys are unambiguous)."""
    if not group:
        raise BadRequestError("consumer group name is empty", status=StatusCode.ILLEGAL_CONSUMER_GROUP)
    if len(group) > MAX_GROUP_LENGTH or not _NAME_RE.fullmatch(group):
        raise BadRequestError(
            f"illegal consumer group name {group[:300]!r}: use 1..{MAX_GROUP_LENGTH} characters of "
            "[%|a-zA-Z0-9_-]",
            status=StatusCode.ILLEGAL_CONSUMER_GROUP,
        )


@functools.lru_cache(maxsize=TAG_CACHE_SIZE)  # tags repeat; a refused tag raises, and raising is never cached
def check_tag(tag: str) -> None:
    """A tag is non-blank, at most 255 characters, and never contains ``|`` (the subscription separator)."""
    if not tag.strip():
        raise BadRequestError("message tag is blank", status=StatusCode.ILLEGAL_MESSAGE_TAG)
    if "|" in tag:
        raise BadRequestError(
            f"message tag {tag[:300]!r} contains '|'", status=StatusCode.ILLEGAL_MESSAGE_TAG
        )
    if len(tag) > MAX_TAG_LENGTH:
        raise BadRequestError(
            f"message tag must be at most {MAX_TAG_LENGTH} characters", status=StatusCode.ILLEGAL_MESSAGE_TAG
        )
    if _CONTROL.search(tag) is not None:
        raise BadRequestError(
            f"message tag {tag[:300]!r} contains a control character", status=StatusCode.ILLEGAL_MESSAGE_TAG
        )


def check_counts(
    counts: Sequence[int],
    sent: int,
    what: str,
    *,
    limit: int,
    status: StatusCode,
    limit_status: StatusCode | None = None,
) -> None:
    """Per-message counts of a flattened column of ``sent`` entries: none negative, adding up to
    ``sent``, none above ``limit`` (refused with ``limit_status``, by default ``status``)."""
    if sent != sum(counts) or (counts and min(counts) < 0):
        raise BadRequestError(
            f"the counts of {what} ({sum(counts)} in all) do not match the {sent} sent", status=status
        )
    most = max(counts, default=0)
    if most > limit:
        raise BadRequestError(f"{most} {what} exceed the limit {limit}", status=limit_status or status)


def check_key_columns(counts: Sequence[int], keys: Sequence[str]) -> None:
    """The keys of a batch, flattened: message i has ``counts[i]`` of them, in order, in ``keys``.

    At most 32 keys per message, each a valid key (:func:`check_key`).
    """
    check_counts(counts, len(keys), "message keys", limit=MAX_KEYS, status=StatusCode.ILLEGAL_MESSAGE_KEY)
    for key in set(keys):
        check_key(key)


def check_key(key: str) -> None:
    """1..255 characters without whitespace or control separators (keys are stored space-separated)."""
    if (
        not key
        or len(key) > MAX_KEY_LENGTH
        or _WHITESPACE.search(key) is not None
        or _CONTROL.search(key) is not None
    ):
        raise BadRequestError(
            f"illegal message key {key[:300]!r}: 1..{MAX_KEY_LENGTH} characters, no whitespace or control "
            "characters",
            status=StatusCode.ILLEGAL_MESSAGE_KEY,
        )


def check_message_id(message_id: str) -> None:
    """A client message id: 1..128 printable ASCII characters without spaces."""
    if (
        not message_id
        or len(message_id) > MAX_MESSAGE_ID_LENGTH
        or not (message_id.isascii() and message_id.isprintable() and " " not in message_id)
    ):
        raise BadRequestError(
            f"illegal message id {message_id[:200]!r}", status=StatusCode.ILLEGAL_MESSAGE_ID
        )


def check_property_columns(
    counts: Sequence[int], names: Sequence[str], values: Sequence[str], *, max_count: int, max_bytes: int
) -> None:
    """The user properties of a batch, flattened: message i has ``counts[i]`` of them, in order,
    in ``names`` and ``values``.

    Names non-empty, not reserved, no separator characters (:func:`check_property_name`); values
    without separator characters; per message, at most ``max_count`` properties of at most
    ``max_bytes`` bytes (UTF-8 names plus values). A name given twice for one message is refused
    by the caller, which builds each message's properties.
    """
    if len(names) != len(values):
        raise BadRequestError(
            f"{len(values)} property values for {len(names)} property names", status=StatusCode.BAD_REQUEST
        )
    check_counts(
        counts,
        len(names),
        "user properties",
        limit=max_count,
        status=StatusCode.BAD_REQUEST,
        limit_status=StatusCode.MESSAGE_PROPERTIES_TOO_LARGE,
    )
    for name in set(names):
        (_check_short_property_name if len(name) <= _CACHED_NAME_LENGTH else check_property_name)(name)
    joined = "\x00".join(values)
    if "\x01" in joined or "\x02" in joined:
        bad = next(i for i, v in enumerate(values) if "\x01" in v or "\x02" in v)
        raise BadRequestError(
            f"value of user property {names[bad][:200]!r} contains a control separator (\\x01/\\x02)",
            status=StatusCode.BAD_REQUEST,
        )
    if len("".join(names).encode()) + len(joined.encode()) - max(len(values) - 1, 0) <= max_bytes:
        return  # the whole batch's properties fit one message's limit: so does every message's
    pos = 0
    for count in counts:
        end = pos + count
        total = len("".join(names[pos:end]).encode()) + len("".join(values[pos:end]).encode())
        if total > max_bytes:
            raise BadRequestError(
                f"user properties of {total} bytes exceed the limit {max_bytes}",
                status=StatusCode.MESSAGE_PROPERTIES_TOO_LARGE,
            )
        pos = end


def check_property_name(name: str) -> None:
    """Non-empty, no surrounding whitespace, not reserved by the broker, no control separators."""
    if not name or name.strip() != name:
        raise BadRequestError(
            f"illegal user property name {name[:200]!r}", status=StatusCode.ILLEGAL_MESSAGE_PROPERTY_KEY
        )
    if name in RESERVED_PROPERTIES or name.startswith("__"):
        raise BadRequestError(
            f"user property name {name[:200]!r} is reserved by the broker",
            status=StatusCode.ILLEGAL_MESSAGE_PROPERTY_KEY,
        )
    if _CONTROL.search(name) is not None:
        raise BadRequestError(
            f"user property name {name[:200]!r} contains a control character",
            status=StatusCode.ILLEGAL_MESSAGE_PROPERTY_KEY,
        )


# Names repeat from message to message: short ones are remembered once accepted (a refused name
# raises, which is never cached), so the cache holds at most 4096 names of 255 characters.
_CACHED_NAME_LENGTH: Final = 255
_check_short_property_name: Final = functools.lru_cache(maxsize=4096)(check_property_name)
