"""The MessageFilter contract the store calls, and the get_messages result types.

As in RocketMQ the store runs two checks, both implemented by the broker:

* ``is_matched_by_consume_queue(tags_code, ext)`` — a cheap "may match" on the index entry (tag
  hash, bloom bitmap); False skips the entry without reading the CommitLog;
* ``is_matched_by_commit_log(properties)`` — the exact match on the stored message.

A filter may implement ``tally_exact(evaluated, matched)``: the store calls it once per read with
how many messages that read put to ``is_matched_by_commit_log`` and how many passed, so the
per-message call need not count (a count per message, under a lock, cost more than the check).

A filter may also implement :class:`BlockMessageFilter` ``match_consume_queue_block``: the
vectorized index check over a whole block of entries (numpy), used instead of the per-entry
call when present. It must agree with ``is_matched_by_consume_queue`` entry by entry. Its
``ext`` block is read from disk only when the filter first uses one of its fields, so a
filter that needs only the tags codes should not touch it.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

from siftmq.store.codec import StoredMessage
from siftmq.store.consumequeue_ext import CqExtBlock, CqExtUnit


@runtime_checkable
class MessageFilter(Protocol):
    """RocketMQ's MessageFilter: index-stage and CommitLog-stage checks."""

    def is_matched_by_consume_queue(self, tags_code: int | None, ext: CqExtUnit | None) -> bool:
        """May the entry match? ``ext`` is None when the queue has no extension unit for it."""
        ...

    def is_matched_by_commit_log(self, properties: Mapping[str, str]) -> bool:
        """Does the stored message match exactly?"""
        ...


@runtime_checkable
class BlockMessageFilter(Protocol):
    """Optional vectorized index check."""

    def match_consume_queue_block(
        self, tags_codes: npt.NDArray[np.int64], ext: CqExtBlock | None
    ) -> npt.NDArray[np.bool_]:
        """A boolean mask, one per entry: may the entry match?"""
        ...


class GetMessageStatus(enum.Enum):
    """RocketMQ's GetMessageStatus."""

    FOUND = "FOUND"
    NO_MATCHED_MESSAGE = "NO_MATCHED_MESSAGE"
    MESSAGE_WAS_REMOVING = "MESSAGE_WAS_REMOVING"
    OFFSET_FOUND_NULL = "OFFSET_FOUND_NULL"
    OFFSET_OVERFLOW_BADLY = "OFFSET_OVERFLOW_BADLY"
    OFFSET_OVERFLOW_ONE = "OFFSET_OVERFLOW_ONE"
    OFFSET_TOO_SMALL = "OFFSET_TOO_SMALL"
    NO_MATCHED_LOGIC_QUEUE = "NO_MATCHED_LOGIC_QUEUE"
    NO_MESSAGE_IN_QUEUE = "NO_MESSAGE_IN_QUEUE"


@dataclass(frozen=True, slots=True)
class GetMessageResult:
    """What :meth:`MessageStore.get_messages` returns.

    ``next_begin_offset`` is where the consumer pulls next; ``min_offset``/``max_offset`` are the
    queue's bounds at the time of the call (``max_offset`` is the next offset to be written).
    ``scanned`` counts the index entries examined.
    """

    status: GetMessageStatus
    next_begin_offset: int
    min_offset: int
    max_offset: int
    messages: list[StoredMessage] = field(default_factory=list)
    scanned: int = 0

    @property
    def message_count(self) -> int:
        """How many messages were returned."""
        return len(self.messages)

    @property
    def buffer_total_size(self) -> int:
        """Total stored size of the returned messages."""
        return sum(m.store_size for m in self.messages)
