"""Reports: what the admin API shows of groups and queues (committed offsets, matching lag, filter
work), group configuration set by the operator, and client sessions' heartbeats."""

from __future__ import annotations

import logging
import time

import numpy as np

from siftmq.broker.groups import GroupSubscription, SubscriptionConflictError
from siftmq.broker.message_filters import TagMessageFilter
from siftmq.broker.model import (
    Subscription,
)
from siftmq.broker.stats import FilterStats
from siftmq.broker.subscriptions import Subscribing
from siftmq.broker.validation import (
    check_group,
    check_topic,
)
from siftmq.errors import (
    BadRequestError,
    NotFoundError,
    StatusCode,
)
from siftmq.filter import compile_filter
from siftmq.store import (
    MessageFilter,
)

_log = logging.getLogger(__name__)


class Reporting(Subscribing):
    """Admin views and session bookkeeping of :class:`~siftmq.broker.broker.Broker`."""

    def committed_offset(self, group: str, topic: str, queue_id: int) -> int | None:
        """The group's committed offset on a queue: its pull commit, else its receive progress."""
        found = self.offsets.get((group, topic, queue_id))
        if found is not None:
            return found
        prog = self.consumers.get((group, topic, queue_id))
        if prog is None:
            return None
        with prog.lock:
            return prog.committed_offset

    def lag(self, group: str, topic: str, *, max_scan: int = 2_000_000) -> list[dict[str, object]]:
        """Per queue: committed offset, max offset, entries behind, and matching entries behind.

        ``matching`` counts the entries the group's filter may match, from the index alone (tag
        hashes, bloom bitmaps; never the CommitLog): exact for ``*``, an upper bound when hash or
        bloom collisions occur. ``estimated`` is True when more than ``max_scan`` entries were behind.
        """
        cfg = self.topics.existing(topic)
        index_filter = self._index_filter(group, topic)
        rows: list[dict[str, object]] = []
        for qid in range(cfg.queue_nums):
            hi = self.store.get_max_offset_in_queue(topic, qid)
            lo = self.store.get_min_offset_in_queue(topic, qid)
            committed = self.committed_offset(group, topic, qid)
            start = max(lo, committed if committed is not None else lo)
            behind = max(hi - start, 0)
            matching, estimated = self._count_matching(topic, qid, (start, hi), index_filter, max_scan)
            rows.append(
                {
                    "queue_id": qid,
                    "committed_offset": committed,
                    "min_offset": lo,
                    "max_offset": hi,
                    "lag": behind,
                    "matching_lag": matching,
                    "estimated": estimated,
                }
            )
        return rows

    def _index_filter(self, group: str, topic: str) -> MessageFilter | None:
        entry = self.groups.subscription(group, topic)
        if entry is None:
            return None
        if entry.kind == "TAG":
            compiled = compile_filter("TAG", entry.expression)
            tf = compiled.tag_filter
            return None if tf is None or tf.sub_all else TagMessageFilter(tf, FilterStats())
        registration = self.filters.get(group, topic)
        return None if registration is None else registration.message_filter(FilterStats())

    def _count_matching(
        self, topic: str, qid: int, span: tuple[int, int], index_filter: MessageFilter | None, max_scan: int
    ) -> tuple[int, bool]:
        start, end = span
        if index_filter is None or end <= start:
            return max(end - start, 0), False
        cq = self.store.find_consume_queue(topic, qid)
        block_fn = getattr(index_filter, "match_consume_queue_block", None)
        if cq is None or block_fn is None:
            return end - start, True
        count, offset = 0, start
        while offset < end and offset - start < max_scan:
            entries = cq.read_block(offset, min(65_536, end - offset))
            if entries is None or len(entries) == 0:
                break
            ext = cq.ext.read_block(offset, len(entries)) if cq.ext is not None else None
            count += int(np.count_nonzero(block_fn(entries["tags_code"].astype(np.int64), ext)))
            offset += len(entries)
        if offset < end:
            return count + (end - offset), True
        return count, False

    def existing_group(self, group: str) -> None:
        """Raises :class:`NotFoundError` for a group the broker knows nothing of: no settings, no
        live member, no filter program (one is often registered before the consumers start), no
        progress and no committed offsets (a tool's commits) — every report on a group answers 404
        for it alike."""
        if (
            self.groups.get(group) is None
            and not self.clients.members(group)
            and not any(p.group == group for p in self.programs.all())
            and not any(key[0] == group for key, _ in self.offsets.items())
            and not any(key[0] == group for key, _ in self.consumers.items())
        ):
            raise NotFoundError(
                f"consumer group {group!r} is unknown", status=StatusCode.CONSUMER_GROUP_NOT_FOUND
            )

    def group_report(self, group: str) -> dict[str, object]:
        """Everything the admin API shows of a group."""
        self.existing_group(group)
        info = self.groups.get(group)
        members = self.clients.members(group)
        now = time.monotonic()
        subs = info.subscriptions if info is not None else {}
        return {
            "group": group,
            "mode": info.mode if info is not None else "clustering",
            "consistency": info.consistency if info is not None else "strict",
            "inconsistencies": info.inconsistencies if info is not None else 0,
            "last_inconsistency": info.last_inconsistency if info is not None else None,
            "last_inconsistency_topic": info.last_inconsistency_topic if info is not None else None,
            "dropped_by_inconsistency": info.dropped if info is not None else 0,
            "clients": [
                {
                    "client_id": m.client_id,
                    "client_type": m.client_type,
                    "address": m.address,
                    "last_seen_s": round(now - m.last_seen, 3),
                    "subscriptions": {t: f"{s.kind} {s.expression}" for t, s in m.subscriptions.items()},
                }
                for m in members
            ],
            "subscriptions": [
                {
                    "topic": t,
                    "type": s.kind,
                    "expression": s.expression,
                    "version": s.version,
                    "holders": sorted(s.holders),
                    "pinned": s.pinned,
                    "filter_stats": self.stats.filter(group, t).as_dict(),
                    "lag": self.lag(group, t) if self.topics.get(t) is not None else [],
                }
                for t, s in sorted(subs.items())
            ],
        }

    def configure_group(self, group: str, *, mode: str | None = None, consistency: str | None = None) -> None:
        """Set a group's message model or consistency policy (a mode switch needs the group idle).

        Setting a mode may create the group (its members will find it); a consistency alone is a
        change to a group that exists, and a change of nothing is refused: neither leaves a group
        nobody asked for behind."""
        check_group(group)
        if mode is None and consistency is None:
            raise BadRequestError("nothing to change: give the group's mode, consistency or both")
        if mode is None and self.groups.get(group) is None:
            raise NotFoundError(
                f"consumer group {group!r} is unknown", status=StatusCode.CONSUMER_GROUP_NOT_FOUND
            )
        self.groups.configure(group, mode=mode, consistency=consistency,
                              live_clients=len(self.clients.live_ids(group)),
                              on_switch=self.carry_position)  # fmt: skip

    def set_group_subscription(self, group: str, subscription: Subscription) -> GroupSubscription:
        """Set the group's subscription of a topic deliberately: a new version filtering for every member."""
        check_group(group)
        check_topic(subscription.topic)
        compiled = self._compile(subscription)
        entry = self.groups.set_subscription(group, subscription.topic, compiled.kind, compiled.normalized)
        self._entry_filter(group, entry)
        return entry

    # ---------------------------------------------------------------------------------- sessions

    def heartbeat(self, client_id: str, client_type: str, group: str | None, *, address: str = "") -> None:
        """Keep a client's session alive; a client whose subscription was refused hears so again."""
        if group:
            check_group(group)
        session = self.clients.touch(client_id, client_type=client_type, group=group, address=address)
        if session.refused:
            raise SubscriptionConflictError(session.refused)

    def client_terminated(self, client_id: str) -> None:
        self.clients.remove(client_id)
