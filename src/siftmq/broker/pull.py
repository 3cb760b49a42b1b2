"""Pulling (pull consumers): reads by queue offset through the group's filter, committed offsets,
and the assignment of queues to a clustering group's live pull members (RocketMQ's
PullMessageProcessor, ConsumerManageProcessor and QueryAssignment)."""

from __future__ import annotations

import logging
from collections.abc import Sequence

from siftmq.broker.model import (
    PullResult,
    Subscription,
)
from siftmq.broker.parts import MAX_SCAN_PER_RECEIVE, _positive_batch, check_queue, check_readable
from siftmq.broker.subscriptions import Subscribing
from siftmq.broker.topics import TopicConfig
from siftmq.broker.validation import (
    check_group,
)
from siftmq.errors import (
    BadRequestError,
    NotFoundError,
    StatusCode,
)
from siftmq.store import (
    GetMessageStatus,
    StoredMessage,
)

_log = logging.getLogger(__name__)


class Pulling(Subscribing):
    """Pull, offset and assignment requests of :class:`~siftmq.broker.broker.Broker`."""

    def _queue(self, topic_name: str, queue_id: int) -> TopicConfig:
        return check_queue(self._readable_topic(topic_name), queue_id)

    def pull(
        self,
        group: str,
        subscription: Subscription,
        queue_id: int,
        offset: int,
        batch_size: int,
        *,
        client_id: str = "",
    ) -> PullResult:
        """Messages of one queue from ``offset`` that match the subscription (no invisible time, no acks).

        Non-matching entries are passed over within the call's scan bound; ``next_offset`` is where
        the next pull starts.
        """
        check_group(group)
        topic = check_readable(self._queue(subscription.topic, queue_id))
        if offset < 0:
            raise BadRequestError(
                f"offset must not be negative, got {offset}", status=StatusCode.ILLEGAL_OFFSET
            )
        batch_size = min(_positive_batch(batch_size), self.config.max_pull_batch_size)
        self._check_owner(group, topic, queue_id, client_id)
        message_filter, own = self._resolve(group, client_id, subscription)
        S = GetMessageStatus
        messages: list[StoredMessage] = []
        scanned = size = 0
        next_offset = offset
        while True:
            r, delivered = self._read(
                group,
                topic.name,
                queue_id,
                next_offset,
                batch_size - len(messages),
                message_filter=message_filter,
            )
            lo, hi = r.min_offset, r.max_offset
            if r.status in (S.OFFSET_TOO_SMALL, S.OFFSET_OVERFLOW_BADLY):
                return PullResult("ILLEGAL_OFFSET", messages, r.next_begin_offset, lo, hi)
            if r.status in (S.NO_MATCHED_LOGIC_QUEUE, S.NO_MESSAGE_IN_QUEUE, S.OFFSET_OVERFLOW_ONE):
                break
            if delivered is None:  # the group's program is held: nothing delivered, nothing passed
                break
            messages.extend(delivered)
            size += sum(m.store_size for m in r.messages)
            scanned += max(r.scanned, 1)
            moved = r.next_begin_offset != next_offset
            next_offset = r.next_begin_offset
            full = (
                len(messages) >= batch_size
                or scanned >= MAX_SCAN_PER_RECEIVE
                or size >= self.config.max_pull_bytes
            )
            if full or not moved or next_offset >= hi:
                break
        hi = self.store.get_max_offset_in_queue(topic.name, queue_id)
        lo = self.store.get_min_offset_in_queue(topic.name, queue_id)
        if own is not None:  # compat group: the client's own filter drops the rest (lost to it)
            kept = [m for m in messages if own.matches(m.properties)]
            if len(kept) < len(messages):
                self.groups.note_dropped(group, len(messages) - len(kept))
            messages = kept
        if messages:
            self.stats.delivered(group, topic.name, len(messages), sum(len(m.body) for m in messages))
            return PullResult("FOUND", messages, next_offset, lo, hi)
        status = "NO_NEW_MESSAGE" if next_offset >= hi else "NO_MATCHED_MESSAGE"
        return PullResult(status, messages, next_offset, lo, hi)

    def update_offset(
        self, group: str, topic_name: str, queue_id: int, offset: int, *, client_id: str = ""
    ) -> None:
        """Commit a pull consumer's offset (the next offset it will read).

        In a clustering group a registered pull member commits only the queues assigned to it, as
        it pulls only those (a former owner's commit landing after a rebalance would move the new
        owner's position); a caller that is no member (an admin tool) commits any queue.
        """
        check_group(group)
        topic = self._queue(topic_name, queue_id)
        self._check_owner(group, topic, queue_id, client_id, action="commit the offset of")
        key = self._offset_key(group, topic.name, queue_id, offset, client_id)
        self.groups.register(group)  # the offsets are the group's state: counted toward max_groups
        self.offsets.set(key, offset)

    def update_offsets(
        self, group: str, topic_name: str, offsets: Sequence[tuple[int, int]], *, client_id: str = ""
    ) -> list[int]:
        """Commit offsets of many queues of one topic: those of the queues ``client_id`` owns now
        (its assignment), all checked before any is stored. Returns that assignment."""
        check_group(group)
        topic = self.route(topic_name)
        if len(offsets) > topic.queue_nums:
            raise BadRequestError(f"{len(offsets)} offsets for a topic of {topic.queue_nums} queues")
        assigned = self.assignment(group, topic.name, client_id)
        owned = list(range(topic.queue_nums)) if assigned is None else assigned
        keys = [
            (self._offset_key(group, topic.name, qid, offset, client_id), offset)
            for qid, offset in offsets
            if qid in owned
        ]
        if keys:
            self.groups.register(group)  # as update_offset: a group's first commit makes the group
        for key, offset in keys:
            self.offsets.set(key, offset)
        return owned

    def _offset_key(
        self, group: str, topic_name: str, queue_id: int, offset: int, client_id: str
    ) -> tuple[str, str, int]:
        """Where a commit goes, once its queue and offset are checked."""
        topic = self._queue(topic_name, queue_id)
        hi = self.store.get_max_offset_in_queue(topic.name, queue_id)
        if not 0 <= offset <= hi:
            raise BadRequestError(
                f"offset {offset} is outside 0..{hi} of {topic.name}:{queue_id}",
                status=StatusCode.ILLEGAL_OFFSET,
            )
        return (self.progress_group(group, client_id), topic.name, queue_id)

    def get_offset(self, group: str, topic_name: str, queue_id: int, *, client_id: str = "") -> int:
        """The group's committed offset on a queue (pull commits, else its receive progress). A pull
        commit may go back (a seek), so it is not weighed against the receive progress: a group
        that pulls again after receiving reads again what its receives acknowledged since its last
        commit, never less."""
        check_group(group)
        topic = self._queue(topic_name, queue_id)
        pgroup = self.progress_group(group, client_id)
        found = self.offsets.get((pgroup, topic.name, queue_id))
        if found is not None:
            return found
        prog = self.consumers.get((pgroup, topic.name, queue_id))
        if prog is not None:
            with prog.lock:
                return prog.committed_offset
        carried = self.member_start(pgroup, topic.name, queue_id)  # a broadcasting member: its group's
        if carried is not None:
            return carried
        raise NotFoundError(
            f"group {group!r} has no offset on {topic.name}:{queue_id}", status=StatusCode.OFFSET_NOT_FOUND
        )

    def query_offset(
        self, topic_name: str, queue_id: int, policy: str, timestamp_ms: int | None = None
    ) -> int:
        """``BEGINNING`` (min), ``END`` (max), or ``TIMESTAMP``: the first offset stored at or after it."""
        topic = self._queue(topic_name, queue_id)
        lo = self.store.get_min_offset_in_queue(topic.name, queue_id)
        hi = self.store.get_max_offset_in_queue(topic.name, queue_id)
        if policy == "BEGINNING":
            return lo
        if policy == "END":
            return hi
        if policy != "TIMESTAMP" or timestamp_ms is None:
            raise BadRequestError(f"unknown offset policy {policy!r} (or TIMESTAMP without a timestamp)")
        while lo < hi:  # first offset whose store time is >= timestamp_ms
            mid = (lo + hi) // 2
            r = self.store.get_messages("", topic.name, queue_id, mid, 1, None)
            if not r.messages:
                lo = max(r.next_begin_offset, mid + 1)
                continue
            if r.messages[0].store_timestamp >= timestamp_ms:
                hi = mid
            else:
                lo = mid + 1
        return lo

    # --------------------------------------------------------------------------------- assignment

    def _pull_members(self, group: str, topic: str) -> list[str]:
        return [
            m.client_id
            for m in self.clients.members(group)
            if m.client_type == "PULL_CONSUMER"
            and not m.refused  # a refused member consumes nothing, so it gets no queues
            and (not m.subscriptions or topic in m.subscriptions)
        ]

    def assignment(self, group: str, topic_name: str, client_id: str) -> list[int] | None:
        """The queues ``client_id`` consumes: None means every queue, shared by receive (pop) calls.

        Pull consumers of a clustering group get disjoint queue sets, averagely allocated over the
        group's live pull members in client-id order (RocketMQ's AllocateMessageQueueAveragely);
        in a broadcasting group each gets every queue.
        """
        check_group(group)
        topic = self.route(topic_name)
        session = self.clients.touch(client_id, group=group)
        if session.client_type != "PULL_CONSUMER":
            return None
        queues = list(range(topic.queue_nums))
        if self.groups.mode(group) == "broadcasting":
            return queues
        members = self._pull_members(group, topic.name)
        if client_id not in members:
            return []
        return allocate_averagely(queues, members, client_id)

    def _check_owner(
        self, group: str, topic: TopicConfig, queue_id: int, client_id: str, *, action: str = "pull"
    ) -> None:
        """In a clustering group, a registered pull member may pull (or commit) only the queues
        assigned to it; PRECONDITION_FAILED otherwise."""
        session = self.clients.get(client_id)
        if (
            session is None
            or session.client_type != "PULL_CONSUMER"
            or self.groups.mode(group) != "clustering"
        ):
            return
        members = self._pull_members(group, topic.name)
        if client_id in members and queue_id not in allocate_averagely(
            list(range(topic.queue_nums)), members, client_id
        ):
            raise BadRequestError(
                f"client {client_id!r} may not {action} queue {queue_id} of topic {topic.name!r}: it is "
                f"assigned to another member of group {group!r}, not to this client; query the assignment "
                "again",
                status=StatusCode.PRECONDITION_FAILED,
            )


def allocate_averagely(queues: list[int], members: list[str], member: str) -> list[int]:
    """RocketMQ's AllocateMessageQueueAveragely: contiguous, nearly equal shares in member order."""
    n, m = len(queues), len(members)
    index = members.index(member)
    mod = n % m
    size = 1 if n <= m else (n // m + 1 if mod > 0 and index < mod else n // m)
    start = index * size if mod > 0 and index < mod else index * size + mod
    return queues[start : start + min(size, n - start)] if start < n else []
