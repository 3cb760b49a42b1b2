"""Inspection for the console and the admin API: a queue browsed through a TAG or SQL92 expression,
an expression tried on a topic's newest messages, expressions checked as they are typed, and dead
letters listed and resent to where they came from.

Every answer comes from the broker's own filter engine (the exact stage a subscription runs, on
each message's properties): what the console shows is what a consumer would be delivered.
"""

from __future__ import annotations

import base64
import heapq
import itertools
from collections.abc import Iterator
from typing import Any, Final

from siftmq.broker.model import (
    PROPERTY_DLQ_ORIGIN_MESSAGE_ID,
    PROPERTY_DLQ_ORIGIN_TOPIC,
    PROPERTY_FILTER_ERROR,
    PROPERTY_RESENT_FROM,
    ProducedMessage,
    Subscription,
    user_properties,
)
from siftmq.broker.parts import DLQ_PREFIX, check_queue
from siftmq.broker.send import Sending
from siftmq.broker.subscriptions import Subscribing
from siftmq.broker.topics import TopicConfig
from siftmq.errors import (
    BadRequestError,
    FilterError,
    FilterSyntaxError,
    FilterTypeError,
    NotFoundError,
    StatusCode,
)
from siftmq.filter import CompiledFilter
from siftmq.store import StoredMessage

MAX_BROWSE: Final = 200  # messages one browse answers
MAX_BROWSE_SCAN: Final = 20_000  # entries one browse reads looking for matches
MAX_TRY: Final = 1000  # newest messages an expression is tried on
TRY_CHUNK: Final = 16  # messages of a queue read at once when trying
MAX_BODY_SHOWN: Final = 64 * 1024  # body bytes a message view carries
_DLQ_PROPERTIES: Final = frozenset(
    {PROPERTY_DLQ_ORIGIN_TOPIC, PROPERTY_DLQ_ORIGIN_MESSAGE_ID, PROPERTY_FILTER_ERROR}
)


def message_view(m: StoredMessage, *, body: bool = False) -> dict[str, Any]:
    """A stored message as the admin API and the console show it; with ``body``, its first
    :data:`MAX_BODY_SHOWN` bytes as base64 (``body_truncated`` says when there were more)."""
    view: dict[str, Any] = {
        "topic": m.topic, "queue_id": m.queue_id, "queue_offset": m.queue_offset,
        "commit_log_offset": m.commit_log_offset, "message_id": m.uniq_key or m.offset_msg_id,
        "tag": m.tags, "keys": m.keys, "properties": m.properties, "store_timestamp": m.store_timestamp,
        "born_timestamp": m.born_timestamp, "body_size": len(m.body), "reconsume_times": m.reconsume_times,
    }  # fmt: skip
    if body:
        view["body_base64"] = base64.b64encode(m.body[:MAX_BODY_SHOWN]).decode()
        view["body_truncated"] = len(m.body) > MAX_BODY_SHOWN
    return view


class Inspecting(Sending, Subscribing):
    """Browsing, trying and checking expressions, and dead letters (:class:`~siftmq.broker.broker.Broker`)."""

    def check_expression(self, kind: str, expression: str) -> dict[str, Any]:
        """Whether ``expression`` compiles; if not, why and where (0-based ``start``/``end``,
        1-based ``line``/``column`` when the engine knows the place)."""
        try:
            compiled = self._compile(Subscription("", kind, expression))
        except FilterError as exc:
            error: dict[str, Any] = {"message": exc.message}
            if isinstance(exc, FilterSyntaxError | FilterTypeError) and exc.start is not None:
                error |= {"description": exc.description, "start": exc.start, "end": exc.end}
                if isinstance(exc, FilterSyntaxError):
                    error |= {"line": exc.line, "column": exc.column}
            return {"valid": False, "error": error}
        return {"valid": True, "type": compiled.kind, "normalized": compiled.normalized}

    def browse(
        self,
        topic: str,
        queue_id: int,
        offset: int,
        count: int,
        *,
        kind: str | None = None,
        expression: str | None = None,
    ) -> dict[str, Any]:
        """Up to ``count`` messages of a queue from ``offset`` that ``expression`` matches (every
        message without one), bodies included. At most :data:`MAX_BROWSE_SCAN` entries are read:
        ``next_offset`` is where to go on."""
        cfg = self._inspected_queue(topic, queue_id)
        if not 1 <= count <= MAX_BROWSE:
            raise BadRequestError(f"count must be in 1..{MAX_BROWSE}")
        if offset < 0:
            raise BadRequestError(f"offset must not be negative, got {offset}")
        # a filter not applied would answer every message as if it matched: refused, named
        if kind is None and expression:
            raise BadRequestError("expression needs a type (TAG or SQL92): the browse would not be filtered")
        if kind == "SQL92" and not expression:
            raise BadRequestError("type SQL92 needs an expression: the browse would not be filtered")
        compiled = self._compile(Subscription(topic, kind, expression)) if kind and expression else None
        found: list[dict[str, Any]] = []
        hi = self.store.get_max_offset_in_queue(cfg.name, queue_id)
        at = start = max(offset, self.store.get_min_offset_in_queue(cfg.name, queue_id))
        while len(found) < count and at - start < MAX_BROWSE_SCAN and at < hi:
            r = self.store.get_messages("", cfg.name, queue_id, at, min(256, MAX_BROWSE_SCAN), None)
            if r.next_begin_offset <= at:
                break
            at = r.next_begin_offset
            for m in r.messages:
                if len(found) == count:
                    at = m.queue_offset  # the next browse starts here
                    break
                if compiled is None or compiled.matches(m.properties):
                    found.append(message_view(m, body=True))
        scanned = at - start
        return {"topic": cfg.name, "queue_id": queue_id, "messages": found, "next_offset": at,
                "scanned": scanned, "max_offset": hi}  # fmt: skip

    def try_expression(self, topic: str, kind: str, expression: str, last: int = 100) -> dict[str, Any]:
        """``expression`` on ``topic``'s newest ``last`` messages: which it matches, its selectivity,
        and the body bytes a broker-side filter keeps off the network."""
        cfg = self.topics.existing(topic)
        if not 1 <= last <= MAX_TRY:
            raise BadRequestError(f"last must be in 1..{MAX_TRY}")
        compiled = self._compile(Subscription(topic, kind, expression))
        per_queue = [self._newest_first(cfg.name, q, compiled) for q in range(cfg.queue_nums)]
        rows = list(itertools.islice(heapq.merge(*per_queue, key=lambda row: -row[0]), last))
        total = sum(size for _, _, size in rows)
        kept = sum(size for _, view, size in rows if view["matched"])
        matched = sum(1 for _, view, _ in rows if view["matched"])
        return {
            "topic": cfg.name, "type": compiled.kind, "normalized": compiled.normalized,
            "messages": [view for _, view, _ in rows], "tried": len(rows), "matched": matched,
            "selectivity": matched / len(rows) if rows else None,
            "body_bytes": total, "body_bytes_saved": total - kept,
        }  # fmt: skip

    def _newest_first(
        self, topic: str, queue_id: int, compiled: CompiledFilter
    ) -> Iterator[tuple[int, dict[str, Any], int]]:
        """A queue's messages, newest first, each as (CommitLog offset, its view with ``matched``,
        body size). The CommitLog offset orders appends across queues, which store times in ms
        cannot. Read :data:`TRY_CHUNK` at a time, and no body kept: trying an expression holds
        little however large the messages or many the queues."""
        end = self.store.get_max_offset_in_queue(topic, queue_id)
        lo = self.store.get_min_offset_in_queue(topic, queue_id)
        while end > lo:
            start = max(lo, end - TRY_CHUNK)
            chunk = []
            at = start
            while at < end:  # a read may stop short (its byte bound)
                r = self.store.get_messages("", topic, queue_id, at, end - at, None)
                for m in r.messages:
                    if m.queue_offset < end:
                        view = message_view(m) | {"matched": compiled.matches(m.properties)}
                        chunk.append((m.commit_log_offset, view, len(m.body)))
                if r.next_begin_offset <= at:
                    break
                at = r.next_begin_offset
            yield from reversed(chunk)
            end = start

    # ------------------------------------------------------------------------------ dead letters

    def dead_letters(self) -> list[dict[str, Any]]:
        """The dead-letter topics: their group and how many messages each holds."""
        out = []
        for cfg in self.topics.all():
            if cfg.name.startswith(DLQ_PREFIX):
                held = sum(
                    self.store.get_max_offset_in_queue(cfg.name, q)
                    - self.store.get_min_offset_in_queue(cfg.name, q)
                    for q in range(cfg.queue_nums)
                )
                out.append({"topic": cfg.name, "group": cfg.name[len(DLQ_PREFIX) :],
                            "queue_nums": cfg.queue_nums, "messages": held})  # fmt: skip
        return sorted(out, key=lambda d: d["topic"])

    def dead_letter(self, dlq: str, queue_id: int, offset: int) -> tuple[StoredMessage, str]:
        """The dead letter at ``dlq``/``queue_id``/``offset`` and its origin topic (which exists)."""
        if not dlq.startswith(DLQ_PREFIX):
            raise BadRequestError(f"{dlq!r} is not a dead-letter topic (they start with {DLQ_PREFIX})")
        self._inspected_queue(dlq, queue_id)
        r = self.store.get_messages("", dlq, queue_id, offset, 1, None)
        if not r.messages or r.messages[0].queue_offset != offset:
            raise NotFoundError(
                f"no message at {dlq}:{queue_id}@{offset}", status=StatusCode.MESSAGE_NOT_FOUND
            )
        m = r.messages[0]
        origin = m.properties.get(PROPERTY_DLQ_ORIGIN_TOPIC)
        if not origin:
            raise BadRequestError(f"the message at {dlq}:{queue_id}@{offset} does not say where it came from")
        if self.topics.get(origin) is None:  # a resend must not create it again
            raise NotFoundError(
                f"the dead letter's origin topic {origin!r} no longer exists",
                status=StatusCode.TOPIC_NOT_FOUND,
            )
        return m, origin

    def resend_dead_letter(self, dlq: str, queue_id: int, offset: int) -> dict[str, Any]:
        """Send the dead letter at ``dlq``/``queue_id``/``offset`` to its origin topic again (its
        body, tag, keys and user properties; the dead-letter ones dropped). The resent copy has an id
        of its own, the same for every resend of this dead letter: resending twice stores it once.

        siftmq has no per-group retry topics: every group subscribed to the origin topic receives
        the copy, not only the dead-letter topic's group. The copy names the first message's id in
        :data:`PROPERTY_RESENT_FROM`, so the groups that consumed it can tell it is that one again."""
        m, origin = self.dead_letter(dlq, queue_id, offset)
        first_id = m.properties.get(PROPERTY_DLQ_ORIGIN_MESSAGE_ID) or m.uniq_key or m.offset_msg_id
        props = {k: v for k, v in user_properties(m.properties).items() if k not in _DLQ_PROPERTIES}
        props[PROPERTY_RESENT_FROM] = first_id
        sent = self.send(
            ProducedMessage(
                topic=origin,
                body=m.body,
                message_id=f"{first_id[:96]}-R{queue_id}-{offset}",
                tag=m.tags,
                keys=m.keys,
                user_properties=props,
                born_timestamp_ms=m.born_timestamp,
            )
        )
        return {"topic": origin, "message_id": sent.message_id, "queue_id": sent.queue_id,
                "queue_offset": sent.queue_offset, "duplicate": sent.duplicate}  # fmt: skip

    # ------------------------------------------------------------------------------------ checks

    def _inspected_queue(self, topic: str, queue_id: int) -> TopicConfig:
        return check_queue(self.topics.existing(topic), queue_id)
