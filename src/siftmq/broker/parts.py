"""The state the broker's request families share, and the topic lookups they all use.

The broker is split as RocketMQ's has a processor per request code: sending
(:mod:`~siftmq.broker.send`), subscriptions (:mod:`~siftmq.broker.subscriptions`), receiving with
invisible time, acks and dead letters (:mod:`~siftmq.broker.receive`), offset pulls and queue
assignment (:mod:`~siftmq.broker.pull`) and the admin views (:mod:`~siftmq.broker.reports`). Each
is a class over :class:`BrokerParts`; :class:`~siftmq.broker.broker.Broker` combines them and owns
the lifecycle and wiring.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Callable
from typing import Final

from siftmq.broker.client_state import ClientStateSweeper
from siftmq.broker.clients import ClientRegistry
from siftmq.broker.config import BrokerConfig
from siftmq.broker.consumer_state import ConsumerStateTable
from siftmq.broker.filter_registry import FilterRegistry
from siftmq.broker.groups import GroupManager
from siftmq.broker.offsets import OffsetTable
from siftmq.broker.programs import ProgramRegistry
from siftmq.broker.stats import BrokerStats
from siftmq.broker.topics import TopicConfig, TopicManager
from siftmq.broker.validation import (
    check_topic,
)
from siftmq.errors import (
    BadRequestError,
    NotFoundError,
    StatusCode,
)
from siftmq.filter import BloomFilter
from siftmq.store import (
    MessageStore,
)

_log = logging.getLogger(__name__)

#: Dead-letter topics are named after the group: ``%DLQ%<group>``.
DLQ_PREFIX: Final = "%DLQ%"
#: Index entries a single receive may scan per queue before it answers (bounds one call's work).
MAX_SCAN_PER_RECEIVE: Final = 64_000


class NotOnTheLoop(Exception):
    """A receive served on an event loop (``Broker.try_receive``) met what it must leave to a
    thread: a lock held elsewhere, a file to write, a filter program to run, a dead-letter move,
    index work to wait for. It stops there."""


def dlq_topic(group: str) -> str:
    return f"{DLQ_PREFIX}{group}"


def check_queue(topic: TopicConfig, queue_id: int) -> TopicConfig:
    """``topic``, after checking that it has queue ``queue_id``."""
    if not 0 <= queue_id < topic.queue_nums:
        raise BadRequestError(
            f"queue {queue_id} does not exist: topic {topic.name!r} has queues 0..{topic.queue_nums - 1}"
        )
    return topic


def check_readable(topic: TopicConfig) -> TopicConfig:
    """``topic``, after checking that it may be read (receives and pulls)."""
    if not topic.readable:
        raise BadRequestError(f"topic {topic.name!r} is not readable", status=StatusCode.FORBIDDEN)
    return topic


class BrokerParts:
    """The state every request family works on; :class:`~siftmq.broker.broker.Broker` sets it up."""

    config: BrokerConfig
    bloom: BloomFilter
    topics: TopicManager
    filters: FilterRegistry
    programs: ProgramRegistry
    groups: GroupManager
    consumers: ConsumerStateTable
    offsets: OffsetTable
    clients: ClientRegistry
    client_states: ClientStateSweeper
    stats: BrokerStats
    store: MessageStore
    _arrival_listeners: list[Callable[[set[str]], None]]
    _queue_cursor: itertools.count[int]
    _send_locks: list[threading.Lock]

    # ------------------------------------------------------------------------------------- topics

    def route(self, topic: str) -> TopicConfig:
        """The topic's config, created with the default queue count when auto-creation is on; a
        system topic (``%...``: a dead-letter topic) only the broker creates, as it needs it."""
        if topic.startswith("%"):
            check_topic(topic)
            return self._made_by_the_broker(topic, "topic")
        return self.topics.get_or_create(topic)

    def _readable_topic(self, topic: str) -> TopicConfig:
        check_topic(topic)
        if topic.startswith(DLQ_PREFIX):
            return self._made_by_the_broker(topic, "dead-letter topic")
        return self.topics.get_or_create(topic)

    def _made_by_the_broker(self, topic: str, what: str) -> TopicConfig:
        """A topic no call creates: TOPIC_NOT_FOUND until the broker has made it."""
        found = self.topics.get(topic)
        if found is None:
            raise NotFoundError(f"{what} {topic!r} does not exist yet", status=StatusCode.TOPIC_NOT_FOUND)
        return found


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def _positive_batch(batch_size: int) -> int:
    """A request's batch size: a number below 1 is the client's error, not a request for one."""
    if batch_size < 1:
        raise BadRequestError(f"batch_size must be positive, got {batch_size}")
    return batch_size
