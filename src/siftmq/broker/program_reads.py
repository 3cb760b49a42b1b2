"""Filter programs on the read path, and their registration (the admin API's calls).

Receive and pull read through :meth:`ProgramReads._read`: the messages that passed the group's
TAG/SQL92 filter go to its program; the ones it accepts are delivered, the rejected ones passed
over like any filtered message, and the ones it failed on moved to the dead-letter topic before
the group's progress moves past them.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from siftmq.broker.model import (
    PROPERTY_DLQ_ORIGIN_MESSAGE_ID,
    PROPERTY_DLQ_ORIGIN_TOPIC,
    PROPERTY_FILTER_ERROR,
    filter_error_text,
)
from siftmq.broker.parts import BrokerParts, NotOnTheLoop, dlq_topic
from siftmq.broker.programs import Program, check_sample, row_of
from siftmq.broker.validation import check_group, check_topic
from siftmq.filterserver.message import Row
from siftmq.filterserver.wire import ERROR, MATCH
from siftmq.store import GetMessageResult, Message, MessageFilter, RawRecord, StoredMessage

_log = logging.getLogger(__name__)


class ProgramReads(BrokerParts):
    """Program filtering and dead letters for :class:`~siftmq.broker.broker.Broker`."""

    def _read(
        self,
        group: str,
        topic: str,
        queue_id: int,
        offset: int,
        want: int,
        *,
        message_filter: MessageFilter | None,
        inline: bool = False,
        max_bytes: int | None = None,
        hold_one: bool = True,
    ) -> tuple[GetMessageResult, list[StoredMessage] | None]:
        """``store.get_messages`` for up to ``want`` deliverable messages, through the group's
        program when it has one: (the read, the messages to deliver).

        A program passes over most of what it is given when it is selective, so its reads ask the
        store for more (by the share it has been keeping) and stop at ``want``: the read's
        ``next_begin_offset`` is then the first accepted message left over (or the first the
        program had no time for), so nothing past it is passed over or dead-lettered, and the
        verdicts past it are kept for the next read. ``None``: the program is held (suspended or
        failed), and the caller delivers nothing and keeps the group's progress where it was.
        ``inline`` (an event loop's read, once the index is caught up: ``catch_up_now``) reads
        without the store's waiting catch-up, and raises :class:`NotOnTheLoop` rather than run a
        program. ``max_bytes`` bounds the read's bytes (it holds one message at least, unless
        ``hold_one`` is False: then a first message past it ends the read there, nothing read).
        """
        ask = self.programs.read_size(group, topic, want)
        if ask is None:  # no program
            result = self.store.get_messages(
                group,
                topic,
                queue_id,
                offset,
                want,
                message_filter,
                catch_up=not inline,
                max_bytes=max_bytes,
                hold_one=hold_one,
            )
            return result, result.messages
        if inline:
            raise NotOnTheLoop
        result, records = self.store.get_records(topic, queue_id, offset, ask, message_filter)
        filtered = self.programs.apply(group, topic, queue_id, records)
        if filtered is None:  # removed meanwhile: read again without it
            result = self.store.get_messages(
                group, topic, queue_id, offset, want, message_filter, max_bytes=max_bytes, hold_one=hold_one
            )
            return result, result.messages
        if filtered.held:
            return result, None
        codes, errors = filtered.codes, filtered.errors
        kept = _positions(codes, MATCH, want + 1)
        room = want if max_bytes is None else _fitting(records, kept, want, max_bytes, hold_one=hold_one)
        cut = len(codes)
        if len(kept) > room:
            cut = kept[room]  # the first kept one left over: the next read starts there
            del kept[room:]
        elif cut < len(records):
            # the read's time ran out in a bisection: the failures it ended on wait (their verdicts
            # kept) for a read that gets past them, so a program failing every message is
            # suspended before it dead-letters them
            while cut > 0 and codes[cut - 1] == ERROR:
                cut -= 1
        if cut < len(records):  # or the first not evaluated in time
            stop = records[cut].queue_offset
            left = {records[i].queue_offset: (codes[i], errors.get(i, "")) for i in range(cut, len(codes))}
            self.programs.leave(group, topic, queue_id, filtered.version, left)
            result = replace(result, next_begin_offset=stop, scanned=stop - offset)
        done = self.programs.dead_lettered(group, topic, queue_id, filtered.version)
        for i, why in errors.items():
            if i < cut and records[i].queue_offset not in done:
                failed = self.store.decode_raw(topic, queue_id, records[i])
                if failed is not None:  # (None: damaged, its CRC failed)
                    self._to_dlq(group, failed, 0, {PROPERTY_FILTER_ERROR: why})
        # every failure of [offset, next_begin_offset) is in the dead-letter topic now: a pull that
        # seeks back over them does not copy them again
        read = range(offset, result.next_begin_offset)
        self.programs.note_dead_lettered(group, topic, queue_id, filtered.version, read)
        decoded = [self.store.decode_raw(topic, queue_id, records[i]) for i in kept]
        messages = [m for m in decoded if m is not None]
        return replace(result, messages=messages), messages

    def _to_dlq(
        self, group: str, msg: StoredMessage, attempts: int, extra: dict[str, str] | None = None
    ) -> None:
        """Store a copy of ``msg`` in ``group``'s dead-letter topic (created when missing).

        The copy's added properties fit within what every send leaves free (``DEAD_LETTER_RESERVE``),
        a FILTER_ERROR text cut to :data:`MAX_FILTER_ERROR_BYTES`.
        """
        topic = dlq_topic(group)
        cfg = self.topics.get_or_create(topic, system=True)
        extra = dict(extra or {})
        if PROPERTY_FILTER_ERROR in extra:
            extra[PROPERTY_FILTER_ERROR] = filter_error_text(extra[PROPERTY_FILTER_ERROR])
        props = dict(msg.properties)
        props[PROPERTY_DLQ_ORIGIN_TOPIC] = msg.topic
        props[PROPERTY_DLQ_ORIGIN_MESSAGE_ID] = msg.uniq_key or msg.offset_msg_id
        props.update(extra)
        self.store.put_message(
            Message(
                topic=cfg.name,
                body=msg.body,
                queue_id=0,
                properties=props,
                born_timestamp=msg.born_timestamp,
                born_host=msg.born_host,
                reconsume_times=attempts,
            )
        )
        self.stats.count(self.stats.dead_letters, group)
        why = f" ({extra[PROPERTY_FILTER_ERROR]})" if PROPERTY_FILTER_ERROR in extra else ""
        _log.info(
            "message %s of %s moved to %s after %d attempts%s", msg.uniq_key, msg.topic, topic, attempts, why
        )

    # -------------------------------------------------------------------------- registration

    def set_program(self, group: str, topic: str, source: str, sample: Any = None) -> Program:
        """Register ``group``'s program on ``topic``; it runs on ``sample`` (or, without one, on the
        topic's newest message, when it has one) and must not fail there."""
        check_group(group)
        check_topic(topic)
        self.topics.existing(topic)
        rows: list[Row] = [check_sample(sample)] if sample is not None else self._newest(topic)
        return self.programs.register(group, topic, source, rows)

    def _newest(self, topic: str) -> list[Row]:
        cfg = self.topics.get(topic)
        newest: Row | None = None
        for qid in range(cfg.queue_nums if cfg else 0):
            last = self.store.get_max_offset_in_queue(topic, qid) - 1
            if last < self.store.get_min_offset_in_queue(topic, qid):
                continue
            found = self.store.get_records(topic, qid, last, 1)[1]
            if found and (newest is None or found[0].store_timestamp > newest[7]):
                newest = row_of(found[0], topic, qid)
        return [newest] if newest is not None else []


def _fitting(
    records: Sequence[RawRecord], kept: list[int], want: int, max_bytes: int, *, hold_one: bool
) -> int:
    """How many of the first ``want`` ``kept`` records' bodies fit in ``max_bytes`` (one at least
    with ``hold_one``)."""
    total = 0
    for n, i in enumerate(kept[:want]):
        total += len(records[i].body)
        if (n or not hold_one) and total > max_bytes:
            return n
    return min(want, len(kept))


def _positions(codes: bytes, code: int, limit: int) -> list[int]:
    """The first ``limit`` indexes of ``code`` in ``codes`` (a search in C: most codes are rejects)."""
    found: list[int] = []
    needle = bytes([code])
    at = codes.find(needle)
    while at >= 0 and len(found) < limit:
        found.append(at)
        at = codes.find(needle, at + 1)
    return found
