"""Filter programs on the read path, and their registration (the admin API's calls).

Receive and pull call :meth:`ProgramReads._programmed` on the messages that passed the group's
TAG/SQL92 filter: the program's accepted ones are delivered, the rejected ones passed over like any
filtered message, and the ones it failed on moved to the dead-letter topic before the group's
progress moves past them. ``None`` means the program is held (suspended or failed): the caller
delivers nothing and keeps the progress where it was.
"""

from __future__ import annotations

import logging
from typing import Any

from siftmq.broker.model import (
    PROPERTY_DLQ_ORIGIN_MESSAGE_ID,
    PROPERTY_DLQ_ORIGIN_TOPIC,
    PROPERTY_FILTER_ERROR,
)
from siftmq.broker.parts import BrokerParts, dlq_topic
from siftmq.broker.programs import Program, check_sample, to_row
from siftmq.broker.validation import check_group, check_topic
from siftmq.errors import NotFoundError, StatusCode
from siftmq.filterserver.message import Row
from siftmq.store import Message, StoredMessage

_log = logging.getLogger(__name__)


class ProgramReads(BrokerParts):
    """Program filtering and dead letters for :class:`~siftmq.broker.broker.Broker`."""

    def _programmed(
        self, group: str, topic: str, messages: list[StoredMessage]
    ) -> list[StoredMessage] | None:
        filtered = self.programs.apply(group, topic, messages)
        if filtered is None:
            return messages
        if filtered.held:
            return None
        for msg, why in filtered.failed:
            self._to_dlq(group, msg, 0, {PROPERTY_FILTER_ERROR: why})
        return filtered.kept

    def _to_dlq(
        self, group: str, msg: StoredMessage, attempts: int, extra: dict[str, str] | None = None
    ) -> None:
        topic = dlq_topic(group)
        cfg = self.topics.get_or_create(topic, system=True)
        props = dict(msg.properties)
        props[PROPERTY_DLQ_ORIGIN_TOPIC] = msg.topic
        props[PROPERTY_DLQ_ORIGIN_MESSAGE_ID] = msg.uniq_key or msg.offset_msg_id
        props.update(extra or {})
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
        why = f" ({extra[PROPERTY_FILTER_ERROR]})" if extra and PROPERTY_FILTER_ERROR in extra else ""
        _log.info(
            "message %s of %s moved to %s after %d attempts%s", msg.uniq_key, msg.topic, topic, attempts, why
        )

    # -------------------------------------------------------------------------- registration

    def set_program(self, group: str, topic: str, source: str, sample: Any = None) -> Program:
        """Register ``group``'s program on ``topic``; it runs on ``sample`` (or, without one, on the
        topic's newest message, when it has one) and must not fail there."""
        check_group(group)
        check_topic(topic)
        if self.topics.get(topic) is None:
            raise NotFoundError(f"topic {topic!r} does not exist", status=StatusCode.TOPIC_NOT_FOUND)
        rows: list[Row] = [check_sample(sample)] if sample is not None else self._newest(topic)
        return self.programs.register(group, topic, source, rows)

    def _newest(self, topic: str) -> list[Row]:
        cfg = self.topics.get(topic)
        newest: StoredMessage | None = None
        for qid in range(cfg.queue_nums if cfg else 0):
            last = self.store.get_max_offset_in_queue(topic, qid) - 1
            if last < self.store.get_min_offset_in_queue(topic, qid):
                continue
            found = self.store.get_messages("", topic, qid, last, 1, None).messages
            if found and (newest is None or found[0].store_timestamp > newest.store_timestamp):
                newest = found[0]
        return [to_row(newest)] if newest is not None else []
