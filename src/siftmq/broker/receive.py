"""Receiving (pop consumers): due redeliveries first, then new entries through the group's filter,
each delivered message in flight under a receipt handle until acked; invisible time, change of
invisible duration, and dead letters after ``max_delivery_attempts`` (RocketMQ's PopMessageProcessor,
AckMessageProcessor, ChangeInvisibleTimeProcessor)."""

from __future__ import annotations

import functools
import logging
import secrets
import struct
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Final, overload

from siftmq.broker.consumer_state import InFlight, QueueProgress
from siftmq.broker.model import (
    Delivery,
    Subscription,
)
from siftmq.broker.parts import MAX_SCAN_PER_RECEIVE, NotOnTheLoop, _now_ms, _positive_batch, check_readable
from siftmq.broker.receipts import ReceiptHandle, encode_handle
from siftmq.broker.subscriptions import Resolved, Subscribing
from siftmq.broker.topics import TopicConfig
from siftmq.broker.validation import (
    check_group,
    check_topic,
)
from siftmq.errors import (
    BadRequestError,
    CorruptRecordError,
    DiskFullError,
    StatusCode,
)
from siftmq.store import (
    MIN_RECORD_SIZE,
    GetMessageStatus,
    MessageFilter,
    StoredMessage,
)

_log = logging.getLogger(__name__)
_new_delivery: Final = functools.partial(tuple.__new__, Delivery)  # one per message received

#: A dead-letter move that failed (a full disk, or anything else) is tried again this much later (ms).
DLQ_RETRY_MS: Final = 1000
#: Seconds between two log lines about failed dead-letter moves of one group and topic (or about
#: receives cut short by an error); the ones in between are counted in the next line.
FAILURE_LOG_INTERVAL_S: Final = 10.0
#: A receipt handle's nonce: 48 random bits.
NONCE_BYTES: Final = 6
#: How soon a delivery its receiver never got is visible again (ms): RocketMQ's proxy gives a
#: message it could not write to its client's stream 1 s.
GIVE_BACK_MS: Final = 1000
#: Index entries after which :meth:`Receiving.try_receive` reads no more, over all queues (a read
#: takes up to ~800 more: a TAG filter's index pass reads 16,000 bytes of index at least); also the
#: largest due-heap it passes through. What bounds an event loop's wait for one receive.
INLINE_SCAN: Final = 4096
#: Message bytes after which :meth:`Receiving.try_receive` reads no more (a read holds one message
#: at least): what bounds its copying, as :data:`INLINE_SCAN` bounds its index reading.
INLINE_BYTES: Final = 1 << 20


def _ack_queue(
    prog: QueueProgress, handles: list[tuple[int, ReceiptHandle]], outcomes: list[BadRequestError | None]
) -> int:
    """Acknowledge the handles (entry n, handle) of one queue, its lock held; how many were."""
    acked = 0
    now = _now_ms()
    inflight = prog.inflight
    renew = prog.renew
    for n, handle in handles:
        item = inflight.get(handle.queue_offset)
        if (
            item is not None
            and item.nonce == handle.nonce
            and (item.visible_at_ms > now or (renew and _renewing(prog, handle)))
        ):
            del inflight[handle.queue_offset]  # outcomes[n] stays None: acknowledged
            if renew:
                renew.pop(handle.queue_offset, None)
            acked += 1
        else:
            outcomes[n] = _handle_problem(item, handle, now)
    return acked


def _renewing(prog: QueueProgress, handle: ReceiptHandle) -> bool:
    """Whether the delivery ``handle`` names is kept invisible for its client (``auto_renew``):
    renewed when it comes due, so past its invisible time its handle still holds."""
    entry = prog.renew.get(handle.queue_offset)
    return entry is not None and entry[0] == handle.nonce


def _take_all(locks: Sequence[threading.Lock]) -> bool:
    """Acquire every lock without waiting, or none of them (False)."""
    for n, lock in enumerate(locks):
        if not lock.acquire(blocking=False):
            for taken in locks[:n]:
                taken.release()
            return False
    return True


def _handle_problem(
    item: InFlight | None, handle: ReceiptHandle, now_ms: int, *, renewing: bool = False
) -> BadRequestError | None:
    """Why ``handle`` cannot act on the in-flight entry it names (``item``), or None when it can."""
    if item is None:
        problem = "the message is not in flight (already acknowledged, or moved to the dead-letter queue)"
    elif item.nonce != handle.nonce:
        problem = "the receipt handle is stale: the message was delivered again with a new handle"
    elif item.visible_at_ms <= now_ms and not renewing:
        problem = "the receipt handle expired: the message's invisible time is over"
    else:
        return None
    return BadRequestError(problem, status=StatusCode.INVALID_RECEIPT_HANDLE)


class _FailureLog:
    """One WARNING per (what, group, topic) per :data:`FAILURE_LOG_INTERVAL_S`: a failure that
    repeats on every receive (a dead-letter move that cannot succeed yet) must not flood the log."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._last: dict[tuple[str, str, str], tuple[float, int]] = {}

    def warn(self, what: str, group: str, topic: str, text: str, exc: BaseException) -> None:
        now = time.monotonic()
        key = (what, group, topic)
        with self._lock:
            last, suppressed = self._last.get(key, (-FAILURE_LOG_INTERVAL_S, 0))
            if now - last < FAILURE_LOG_INTERVAL_S:
                self._last[key] = (last, suppressed + 1)
                return
            if len(self._last) >= 4096:  # bounded: groups and topics come and go
                self._last.clear()
            self._last[key] = (now, 0)
        more = f" ({suppressed} more since the last such line)" if suppressed else ""
        _log.warning("%s%s: %s: %s", text, more, type(exc).__name__, exc)


_failures = _FailureLog()


class Receiving(Subscribing):
    """Receive, ack, change-invisible and dead-letter requests of :class:`~siftmq.broker.broker.Broker`."""

    def receive(
        self,
        group: str,
        subscription: Subscription,
        *,
        client_id: str = "",
        queue_id: int = -1,
        batch_size: int = 32,
        invisible_ms: int | None = None,
        auto_renew: bool = False,
    ) -> list[Delivery]:
        """Deliver up to ``batch_size`` messages of ``subscription.topic`` that match its filter.

        Reads the requested queue first, then the topic's other queues; redeliveries whose
        invisible time is over come before new messages. Non-matching messages are passed over
        (the group's progress moves past them). Returns [] when nothing is available now.
        """
        delivered, _ = self._receive(
            group,
            subscription,
            client_id=client_id,
            queue_id=queue_id,
            batch_size=batch_size,
            invisible_ms=invisible_ms,
            auto_renew=auto_renew,
            inline=False,
        )
        assert delivered is not None
        return delivered

    def try_receive(
        self,
        group: str,
        subscription: Subscription,
        *,
        client_id: str = "",
        queue_id: int = -1,
        batch_size: int = 32,
        invisible_ms: int | None = None,
        auto_renew: bool = False,
    ) -> list[Delivery] | None:
        """:meth:`receive` that an event loop may call, or None (nothing delivered, nothing else
        changed but progress past non-matching messages): then call :meth:`receive` in a thread.

        A hop to a thread and back costs more CPU than a small receive itself (an official
        client's receive of one message: ~920 against ~770 µs of broker CPU per call, A/B). So a
        receive is served on the loop when it is the steady kind: a TAG filter the group already
        holds, every queue's progress known, no filter program, no lock held elsewhere, the index
        caught up (or nearly: see ``MessageStore.catch_up_now``), no redelivery due for the
        dead-letter queue, a due-heap of at most :data:`INLINE_SCAN` entries. It writes no state
        file (with async flush it may index a small backlog, as a send on the loop does), waits for
        no lock and stops reading the index after :data:`INLINE_SCAN` entries: None when those ran
        out with nothing found.
        """
        return self._receive(
            group,
            subscription,
            client_id=client_id,
            queue_id=queue_id,
            batch_size=batch_size,
            invisible_ms=invisible_ms,
            auto_renew=auto_renew,
            inline=True,
        )[0]

    def try_receive_shared(
        self,
        group: str,
        subscription: Subscription,
        asks: Sequence[tuple[str, int]],
        *,
        queue_id: int = -1,
        invisible_ms: int | None = None,
        auto_renew: bool = False,
    ) -> list[list[Delivery] | None]:
        """:meth:`try_receive` for several receives of ``group`` that ask alike (filter, invisible
        time), each a (client id, batch size), made in as few passes as give each what it would
        get alone: one for the group's members (clustering), one per member whose progress or
        renewals are its own (broadcasting, ``auto_renew``). Each receive gets its share of its
        pass's deliveries, in order, no more than its batch size; None for a receive to make
        alone (in a thread, as after :meth:`try_receive`'s None): one whose pass could not be made
        on the loop or failed, or that a pass cut short (on a bound) left without a share. A
        receive left without a share of a pass that read the queues through gets [], as it would
        alone: nothing to deliver now. With one receive, its error is raised.

        Why: official clients receive one message per call, and a core process meets many such
        calls of a group's members in one turn of its event loop. A pass's own work (the topic,
        the group's filter, the queues' locks and due checks, an index read) costs more than the
        message it delivers: ~170 us against ~20 us per message of a pass of 64.
        """
        shares: list[list[Delivery] | None] = [None] * len(asks)
        try:  # before any client is recorded or filter registered, as a receive alone checks
            topic = self._topic_on_the_loop(group, subscription)
            self._invisible_ms(invisible_ms)
        except BadRequestError:
            if len(asks) == 1:
                raise
            return shares  # made alone, each earns its own error
        if topic is None:
            return shares
        sizes: dict[int, int] = {}
        for n, (_, size) in enumerate(asks):
            try:
                sizes[n] = self._batch_cap(size)
            except BadRequestError:
                if len(asks) == 1:
                    raise
                # made alone, it earns its own error
        by_client: dict[str, list[int]] = {}
        for n in sizes:
            by_client.setdefault(asks[n][0], []).append(n)
        passes: list[tuple[str, list[int], Resolved | None]] = []
        if len(by_client) > 1 and not auto_renew and self.groups.mode(group) != "broadcasting":
            members: list[int] = []
            lead: tuple[str, Resolved] | None = None
            for client_id, ns in by_client.items():
                try:
                    resolved = self._resolve(group, client_id, subscription, held_only=True)
                except Exception:
                    continue  # refused, say: made alone, it earns its own error
                if resolved is None or resolved[1] is not None:
                    continue  # a subscription to record, a filter of its own: alone, in a thread
                members += ns
                lead = lead or (client_id, resolved)
            if lead is not None:
                passes.append((lead[0], sorted(members), lead[1]))
        else:
            passes = [(client_id, ns, None) for client_id, ns in by_client.items()]
        for client_id, ns, resolved in passes:
            try:
                out, read_through = self._receive(
                    group,
                    subscription,
                    client_id=client_id,
                    queue_id=queue_id,
                    batch_size=sum(sizes[n] for n in ns),
                    invisible_ms=invisible_ms,
                    auto_renew=auto_renew,
                    inline=True,
                    topic=topic,
                    resolved=resolved,
                    batch_capped=True,
                )
            except Exception:
                if len(asks) == 1:
                    raise
                continue  # made alone, each earns its own answer
            if out is None:
                continue
            at = 0
            for n in ns:
                share = out[at : at + sizes[n]]
                at += len(share)
                shares[n] = share if share or read_through else None
        return shares

    def _topic_on_the_loop(self, group: str, subscription: Subscription) -> TopicConfig | None:
        """The topic a receive on the loop reads, once the group and topic names pass their
        checks; None, having recorded nothing, when a thread must make the receive: a topic to
        create (which writes the topics file), a SQL92 filter to register (which may wait for the
        filters' lock and write their file), a program to run."""
        check_group(group)
        check_topic(subscription.topic)
        found = self.topics.get(subscription.topic)
        if found is None or subscription.kind != "TAG" or self.programs.holds(group, found.name):
            return None
        check_readable(found)
        return found

    def _batch_cap(self, batch_size: int) -> int:
        """A request's batch size, within :attr:`~BrokerConfig.max_batch_size`."""
        return min(_positive_batch(batch_size), self.config.max_batch_size)

    def _receive(
        self,
        group: str,
        subscription: Subscription,
        *,
        client_id: str,
        queue_id: int,
        batch_size: int,
        invisible_ms: int | None,
        auto_renew: bool = False,
        inline: bool,
        topic: TopicConfig | None = None,
        resolved: Resolved | None = None,
        batch_capped: bool = False,
    ) -> tuple[list[Delivery] | None, bool]:
        """The deliveries (inline: None, nothing delivered, when a thread must make it), and
        whether the pass read every queue through (it did not stop on a bound or an error).
        ``topic`` and ``resolved``: what :meth:`_topic_on_the_loop` and :meth:`_resolve` answered,
        and ``batch_capped``: ``batch_size`` is its receives' sizes each within the bound (a
        shared pass checked them)."""
        if topic is None:
            if not inline:
                check_group(group)
                topic = self._readable_topic(subscription.topic)
                check_readable(topic)
            else:
                topic = self._topic_on_the_loop(group, subscription)
                if topic is None:
                    return None, False
        invisible = self._invisible_ms(invisible_ms)
        if not batch_capped:
            batch_size = self._batch_cap(batch_size)
        if resolved is None:
            resolved = self._resolve(group, client_id, subscription, held_only=inline)
        if resolved is None:
            return None, False  # (inline only) a subscription to record first
        message_filter, own = resolved
        pgroup = self.progress_group(group, client_id)
        queues = list(range(topic.queue_nums))
        if 0 <= queue_id < topic.queue_nums:
            queues = queues[queue_id:] + queues[:queue_id]
        else:
            shift = next(self._queue_cursor) % topic.queue_nums
            queues = queues[shift:] + queues[:shift]
        rp = _ReceivePass(group, pgroup, topic.name, _now_ms(), invisible, batch_size, message_filter)
        if inline:
            rp.inline, rp.scan_left, rp.bytes_left = True, INLINE_SCAN, INLINE_BYTES
        else:
            # what one answer may hold: siftmq's batch calls answer in one gRPC message, whose bound
            # is this plus room for the rest (the server's frame limit)
            rp.bytes_left = max(self.config.max_pull_bytes, self.config.max_body_size)
        if auto_renew and client_id:
            rp.renew_for, rp.renew_ms = client_id, int(self.config.max_invisible_time_s * 1000)
        try:
            for qid in queues:  # redeliveries first, across queues
                prog = self._locked_progress(rp, qid, only_due=True)
                if prog is None:
                    continue
                try:
                    self._take_due(rp, qid, prog)
                finally:
                    prog.lock.release()
                if len(rp.out) >= batch_size or rp.full:
                    break
            else:
                if inline and not self.store.catch_up_now():  # read-your-writes, without waiting
                    raise NotOnTheLoop
                for qid in queues:
                    prog = self._locked_progress(rp, qid)
                    try:
                        self._take_new(rp, qid, prog)
                    finally:
                        prog.lock.release()
                    if len(rp.out) >= batch_size or rp.scan_left <= 0 or rp.full:
                        break
        except NotOnTheLoop:
            rp.stopped = True  # (inline only) what was delivered so far is the answer
        except Exception as exc:
            if not rp.out:
                raise
            rp.stopped = True
            # What was taken before the error is in flight under new handles, its attempt counted:
            # thrown away with the answer, it would only come back once its invisible time is over.
            _failures.warn(
                "receive", group, topic.name, f"a receive of {group} on {topic.name} was cut short", exc
            )
        read_through = not rp.stopped and not rp.full and rp.scan_left > 0
        if inline and not rp.out and not read_through:
            return None, False
        if rp.out:
            self.stats.delivered(group, topic.name, len(rp.out), sum(len(d.message.body) for d in rp.out))
        if own is None:
            return rp.out, read_through
        kept = [d for d in rp.out if own.matches(d.message.properties)]
        for d in rp.out:
            if d not in kept:  # compat group: what the group's filter passed but the client's rejects is lost
                self.ack(group, topic.name, d.receipt_handle, client_id=client_id)
        if len(kept) < len(rp.out):
            self.groups.note_dropped(group, len(rp.out) - len(kept))
        return kept, read_through

    def next_redelivery_ms(self, group: str, topic: str, client_id: str = "") -> int | None:
        """When the earliest in-flight message of ``group`` on ``topic`` becomes visible again."""
        cfg = self.topics.get(topic)
        if cfg is None:
            return None
        due = []
        pgroup = self.progress_group(group, client_id)
        for qid in range(cfg.queue_nums):
            prog = self.consumers.get((pgroup, topic, qid))
            if prog is not None:
                with prog.lock:
                    t = prog.next_due_ms()
                if t is not None:
                    due.append(t)
        return min(due, default=None)

    def _invisible_ms(self, invisible_ms: int | None) -> int:
        cfg = self.config
        if invisible_ms is None:
            return int(cfg.default_invisible_time_s * 1000)
        if not cfg.min_invisible_time_s * 1000 <= invisible_ms <= cfg.max_invisible_time_s * 1000:
            raise BadRequestError(
                f"invisible duration {invisible_ms} ms is outside {cfg.min_invisible_time_s:g} s.."
                f"{cfg.max_invisible_time_s:g} s",
                status=StatusCode.ILLEGAL_INVISIBLE_TIME,
            )
        return invisible_ms

    def _progress(self, group: str, topic: str, qid: int) -> QueueProgress:
        prog = self.consumers.get((group, topic, qid))
        if prog is not None:
            return prog
        # A broadcasting member starts where its group was (a switch from clustering carried it), a
        # group's first receive where its pulls committed; else RocketMQ's rule for a new group:
        # from the start while the queue still holds its first message, otherwise only what
        # arrives from now on.
        start = self.member_start(group, topic, qid)
        if start is None:  # the position the group's pull consumers committed, if they did
            start = self.offsets.get((group, topic, qid))
        if start is None:
            lo = self.store.get_min_offset_in_queue(topic, qid)
            start = 0 if lo == 0 else self.store.get_max_offset_in_queue(topic, qid)
        prog = self.consumers.get_or_create((group, topic, qid), start)
        if start:  # a start that is not 0 must survive a crash, or a restart would skip what came since
            self.consumers.save()
        return prog

    @overload
    def _locked_progress(self, rp: _ReceivePass, qid: int) -> QueueProgress: ...
    @overload
    def _locked_progress(self, rp: _ReceivePass, qid: int, *, only_due: bool) -> QueueProgress | None: ...

    def _locked_progress(self, rp: _ReceivePass, qid: int, *, only_due: bool = False) -> QueueProgress | None:
        """The queue's progress with its lock held (the caller releases it); inline, without
        waiting for the lock or creating the progress (a new one may be saved to disk).
        ``only_due``: None, no lock taken, when nothing of the queue has come due."""
        if not rp.inline:
            prog = self._progress(rp.pgroup, rp.topic, qid)
        else:
            found = self.consumers.get((rp.pgroup, rp.topic, qid))
            if found is None:
                if only_due:  # nothing is due on a queue never read
                    return None
                raise NotOnTheLoop
            prog = found
        if only_due and not prog.may_have_due(rp.now):
            return None
        if not prog.lock.acquire(blocking=not rp.inline):
            raise NotOnTheLoop
        return prog

    def _take_due(self, rp: _ReceivePass, qid: int, prog: QueueProgress) -> None:
        limit = rp.batch_size - len(rp.out)
        if limit <= 0:
            return
        if rp.inline and prog.due_count() > INLINE_SCAN:
            raise NotOnTheLoop  # passing over (or rebuilding) a large heap: left to a thread
        due = list(prog.pop_due(rp.now, limit))
        if prog.renew and due:
            due = self._renew(rp, prog, due)
        left: list[InFlight] = []  # due, but past what the loop copies or the answer holds
        if rp.inline and any(item.attempt >= self.config.max_delivery_attempts for item in due):
            for item in due:  # a dead-letter move appends to the store: left to a thread
                prog.put(item)
            raise NotOnTheLoop
        for n, item in enumerate(due):
            if item.size > rp.bytes_left and (rp.inline or rp.out or n):  # (one message at least)
                due, left = due[:n], due[n:]
                break
            rp.bytes_left -= item.size
        for item in left:
            prog.put(item)
        accept = rp.message_filter.is_matched_by_commit_log if rp.message_filter is not None else None
        for n, item in enumerate(due):
            try:
                msg = self._load(item, rp.topic, qid)
                if msg is None or (  # removed by retention: nothing left to deliver
                    # or no longer the group's: its subscription changed since, and the filter in
                    # force passes over it, as over the queue's other messages it rejects
                    accept is not None and not accept(msg.properties)
                ):
                    del prog.inflight[item.queue_offset]
                    self.consumers.mark_dirty()
                    continue
                if item.attempt >= self.config.max_delivery_attempts:
                    try:
                        self._to_dlq(rp.group, msg, item.attempt)
                    except Exception as exc:  # whatever failed, the group must go on
                        # The message stays in flight and the move is tried again later: raised,
                        # the failure would end every receive of the group on the topic, since the
                        # message is first in line. The rest of the group is served meanwhile.
                        prog.put(item._replace(visible_at_ms=rp.now + DLQ_RETRY_MS))
                        if not isinstance(exc, DiskFullError):  # (a full disk is reported by sends)
                            _failures.warn(
                                "dead letter",
                                rp.group,
                                rp.topic,
                                f"message {msg.uniq_key} of {rp.topic} could not be moved to the dead-letter "
                                f"topic of {rp.group} after {item.attempt} attempts; it stays in flight and "
                                f"is tried again every {DLQ_RETRY_MS} ms",
                                exc,
                            )
                        continue
                    del prog.inflight[item.queue_offset]
                    self.consumers.mark_dirty()
                    continue
                rp.out.append(self._deliver(rp, qid, prog, msg, item.attempt + 1))
            except Exception:
                for rest in due[n:]:  # keep them due: nothing may stay in flight unseen
                    if prog.inflight.get(rest.queue_offset) is rest:
                        prog.put(rest)
                raise
        if left and rp.inline:
            raise NotOnTheLoop  # what was taken is the answer; the rest is a thread's, or the next's
        rp.full = bool(left)

    def _renew(self, rp: _ReceivePass, prog: QueueProgress, due: list[InFlight]) -> list[InFlight]:
        """``due`` without the deliveries kept invisible for their client (``auto_renew``, as the
        RocketMQ proxy renews a push consumer's messages until they are acknowledged): each is
        made invisible again for its invisible time while its client is live and the renewals
        have not run past :attr:`max_invisible_time_s` since the delivery; the others are due."""
        live: set[str] | None = None
        kept: list[InFlight] = []
        for item in due:
            entry = prog.renew.get(item.queue_offset)
            if entry is None:
                kept.append(item)
                continue
            nonce, client_id, until_ms, invisible_ms = entry
            if live is None:
                live = self.clients.live_ids(rp.group)
            if nonce == item.nonce and rp.now < until_ms and client_id in live:
                prog.put(item._replace(visible_at_ms=min(rp.now + invisible_ms, until_ms)))
                self.consumers.mark_dirty()
                continue
            del prog.renew[item.queue_offset]  # nacked since, its client gone, or renewed long enough
            kept.append(item)
        return kept

    def _take_new(self, rp: _ReceivePass, qid: int, prog: QueueProgress) -> None:
        scanned = 0
        S = GetMessageStatus
        limit = rp.batch_size - len(rp.out)
        max_scan = min(MAX_SCAN_PER_RECEIVE, rp.scan_left)
        while limit > 0 and scanned < max_scan:
            # an answer holds one message at least; past that, only what fits in one (in a thread)
            hold_one = rp.inline or not rp.out
            if not hold_one and rp.bytes_left < MIN_RECORD_SIZE:
                rp.full = True  # no message fits what is left
                break
            result, delivered = self._read(
                rp.group,
                rp.topic,
                qid,
                prog.pop_offset,
                limit,
                message_filter=rp.message_filter,
                inline=rp.inline,
                max_bytes=max(rp.bytes_left, 1),
                hold_one=hold_one,
            )
            if delivered is None:  # the group's program is held: nothing delivered, nothing passed
                break
            moved = result.next_begin_offset != prog.pop_offset
            if not (moved or delivered or hold_one) and result.status in (S.FOUND, S.NO_MATCHED_MESSAGE):
                break  # the queue's next message does not fit what is left (another queue's may)
            if result.status in (
                S.FOUND,
                S.NO_MATCHED_MESSAGE,
                S.OFFSET_FOUND_NULL,
                S.MESSAGE_WAS_REMOVING,
                S.OFFSET_TOO_SMALL,
                S.OFFSET_OVERFLOW_BADLY,
            ):
                prog.pop_offset = result.next_begin_offset
            if moved:
                self.consumers.mark_dirty()
            if delivered:
                self._deliver_new(rp, qid, prog, delivered)
                rp.bytes_left -= sum(len(m.body) for m in delivered)
            limit -= len(delivered)
            scanned += max(result.scanned, 1)
            rp.scan_left -= max(result.scanned, 1)
            if rp.inline and rp.bytes_left <= 0 and limit > 0:
                raise NotOnTheLoop  # what was delivered is the answer
            if (
                not moved
                or prog.pop_offset >= result.max_offset
                or result.status in (S.OFFSET_OVERFLOW_ONE, S.NO_MESSAGE_IN_QUEUE, S.NO_MATCHED_LOGIC_QUEUE)
            ):
                break

    def _deliver(
        self, rp: _ReceivePass, qid: int, prog: QueueProgress, msg: StoredMessage, attempt: int
    ) -> Delivery:
        nonce = rp.nonce()
        prog.put(
            InFlight(
                msg.queue_offset,
                msg.commit_log_offset,
                msg.store_size,
                attempt,
                rp.now + rp.invisible_ms,
                nonce,
            )
        )
        self.consumers.mark_dirty()
        if rp.renew_for:
            prog.renew[msg.queue_offset] = (nonce, rp.renew_for, rp.now + rp.renew_ms, rp.invisible_ms)
        handle = encode_handle(rp.topic, qid, msg.queue_offset, nonce)
        return _new_delivery((msg, handle, attempt, rp.invisible_ms))

    def _deliver_new(
        self, rp: _ReceivePass, qid: int, prog: QueueProgress, msgs: Sequence[StoredMessage]
    ) -> None:
        """:meth:`_deliver` of first deliveries, for a read's messages at once (this runs once
        per message received, so what the loop looks up is looked up before it)."""
        out, put, topic = rp.out, prog.put, rp.topic
        invisible_ms = rp.invisible_ms
        visible_at = rp.now + invisible_ms
        nonces = rp.nonces(len(msgs))
        for msg, n in zip(msgs, nonces, strict=True):
            put(InFlight(msg.queue_offset, msg.commit_log_offset, msg.store_size, 1, visible_at, n))
            out.append(_new_delivery((msg, encode_handle(topic, qid, msg.queue_offset, n), 1, invisible_ms)))
        if rp.renew_for:
            entry = (rp.renew_for, rp.now + rp.renew_ms, invisible_ms)
            for msg, n in zip(msgs, nonces, strict=True):
                prog.renew[msg.queue_offset] = (n, *entry)
        self.consumers.mark_dirty()

    def _load(self, item: InFlight, topic: str, queue_id: int) -> StoredMessage | None:
        """The in-flight message, or None when its record is gone (retention) or is not it any more.

        A corrupt record counts as gone; any other read error propagates, so the entry stays in
        flight for later.
        """
        try:
            msg = self.store.look_message_by_offset(item.commit_log_offset, item.size)
        except CorruptRecordError:  # unreadable for good: delivering it again can never succeed
            _log.exception("in-flight %s:%d@%d cannot be read; dropped", topic, queue_id, item.queue_offset)
            return None
        if msg is not None and (msg.topic, msg.queue_id, msg.queue_offset) != (
            topic,
            queue_id,
            item.queue_offset,
        ):
            _log.error(
                "in-flight %s:%d@%d points at another record (commit log offset %d) after a crash; dropped",
                topic,
                queue_id,
                item.queue_offset,
                item.commit_log_offset,
            )
            return None
        return msg

    # -------------------------------------------------------------------------------- ack / nack

    def _in_flight(
        self, group: str, topic: str, handle_text: str, client_id: str
    ) -> tuple[QueueProgress, InFlight]:
        """The in-flight entry a receipt handle names; the caller then holds ``prog.lock``."""
        check_group(group)
        handle = ReceiptHandle.decode(handle_text)
        prog = self._progress_of(group, topic, handle, client_id)
        prog.lock.acquire()
        item = prog.inflight.get(handle.queue_offset)
        problem = _handle_problem(
            item, handle, _now_ms(), renewing=bool(prog.renew) and _renewing(prog, handle)
        )
        if problem is not None:
            prog.lock.release()
            raise problem
        assert item is not None
        return prog, item

    def _progress_of(self, group: str, topic: str, handle: ReceiptHandle, client_id: str) -> QueueProgress:
        """The progress a decoded handle of ``topic`` points into (``INVALID_RECEIPT_HANDLE`` if none)."""
        if handle.topic != topic:
            raise BadRequestError(
                f"receipt handle belongs to topic {handle.topic!r}, not {topic!r}",
                status=StatusCode.INVALID_RECEIPT_HANDLE,
            )
        prog = self.consumers.get((self.progress_group(group, client_id), topic, handle.queue_id))
        if prog is None:
            raise BadRequestError(
                f"receipt handle is unknown to group {group!r}", status=StatusCode.INVALID_RECEIPT_HANDLE
            )
        return prog

    def ack(self, group: str, topic: str, handle_text: str, *, client_id: str = "") -> None:
        """Acknowledge one delivery (the message is done for the group)."""
        [problem] = self.ack_many(group, topic, [handle_text], client_id=client_id)
        if problem is not None:
            raise problem

    def ack_many(
        self, group: str, topic: str, handle_texts: Sequence[str], *, client_id: str = ""
    ) -> list[BadRequestError | None]:
        """Acknowledge many deliveries: one outcome per handle, in order (None: acknowledged), as
        :meth:`ack` one by one would give; each queue's lock is taken once for all its handles."""
        outcomes = self._ack_many(group, topic, handle_texts, client_id, wait=True)
        assert outcomes is not None
        return outcomes

    def try_ack_many(
        self, group: str, topic: str, handle_texts: Sequence[str], *, client_id: str = ""
    ) -> list[BadRequestError | None] | None:
        """:meth:`ack_many` that never waits for a lock, so an event loop may call it: when a queue's
        lock is held elsewhere (a receive reading that queue) it acknowledges nothing: None."""
        return self._ack_many(group, topic, handle_texts, client_id, wait=False)

    def _ack_many(
        self, group: str, topic: str, handle_texts: Sequence[str], client_id: str, *, wait: bool
    ) -> list[BadRequestError | None] | None:
        try:
            check_group(group)
        except BadRequestError as exc:
            return [exc] * len(handle_texts)
        outcomes: list[BadRequestError | None] = [None] * len(handle_texts)
        by_queue: dict[int, tuple[QueueProgress, list[tuple[int, ReceiptHandle]]]] = {}
        for n, text in enumerate(handle_texts):
            try:
                handle = ReceiptHandle.decode(text)
                mine = by_queue.get(handle.queue_id)
                if mine is None or handle.topic != topic:  # the progress is looked up once per queue
                    mine = (self._progress_of(group, topic, handle, client_id), [])
                    by_queue[handle.queue_id] = mine
            except BadRequestError as exc:
                outcomes[n] = exc
                continue
            mine[1].append((n, handle))
        acked = 0
        if wait:
            for prog, handles in by_queue.values():
                with prog.lock:
                    acked += _ack_queue(prog, handles, outcomes)
        else:
            locks = [prog.lock for prog, _ in by_queue.values()]
            if not _take_all(locks):
                return None
            try:
                for prog, handles in by_queue.values():
                    acked += _ack_queue(prog, handles, outcomes)
            finally:
                for lock in locks:
                    lock.release()
        if acked:
            self.consumers.mark_dirty()
            self.stats.count(self.stats.acks, (group, topic), acked)
        return outcomes

    def change_invisible_duration(
        self, group: str, topic: str, handle_text: str, invisible_ms: int, *, client_id: str = ""
    ) -> str:
        """Make the message visible again ``invisible_ms`` from now; returns the new receipt handle.

        A consumer's negative acknowledgement: the message is redelivered then, with
        ``delivery_attempt`` + 1.
        """
        if not 0 <= invisible_ms <= self.config.max_invisible_time_s * 1000:
            raise BadRequestError(
                f"invisible duration {invisible_ms} ms is outside 0..{self.config.max_invisible_time_s:g} s",
                status=StatusCode.ILLEGAL_INVISIBLE_TIME,
            )
        handle = ReceiptHandle.decode(handle_text)
        prog, item = self._in_flight(group, topic, handle_text, client_id)
        try:
            nonce = int.from_bytes(secrets.token_bytes(NONCE_BYTES))
            prog.put(
                InFlight(
                    item.queue_offset,
                    item.commit_log_offset,
                    item.size,
                    item.attempt,
                    _now_ms() + invisible_ms,
                    nonce,
                )
            )
            self.consumers.mark_dirty()
        finally:
            prog.lock.release()
        return ReceiptHandle(topic, handle.queue_id, handle.queue_offset, nonce).encode()

    def give_back(
        self, group: str, topic: str, deliveries: Sequence[Delivery], *, client_id: str = ""
    ) -> int:
        """Make ``deliveries`` that never reached their receiver (its call was cancelled, or the
        stream of its answer broke) visible again in :data:`GIVE_BACK_MS`, as a nack does, instead
        of in flight for nobody until their invisible time (renewed, for an auto-renewing receive,
        while its client lives). One acknowledged, given back or redelivered since is passed over.
        Returns how many were given back."""
        given = 0
        back_ms = min(GIVE_BACK_MS, int(self.config.max_invisible_time_s * 1000))
        for delivery in deliveries:
            try:
                self.change_invisible_duration(
                    group, topic, delivery.receipt_handle, back_ms, client_id=client_id
                )
            except BadRequestError:
                continue  # its handle is no longer the one in flight: nothing to give back
            given += 1
        return given

    def forward_to_dlq(self, group: str, topic: str, handle_text: str, *, client_id: str = "") -> None:
        """Move the delivered message to the group's dead-letter topic now."""
        prog, item = self._in_flight(group, topic, handle_text, client_id)
        try:
            msg = self._load(item, topic, ReceiptHandle.decode(handle_text).queue_id)
            if msg is not None:
                self._to_dlq(group, msg, item.attempt)
            del prog.inflight[item.queue_offset]
            prog.renew.pop(item.queue_offset, None)
            self.consumers.mark_dirty()
        finally:
            prog.lock.release()


@dataclass(slots=True)
class _ReceivePass:
    """The state of one receive call across the queues it reads."""

    group: str
    pgroup: str  # whose progress: the group, or group@client in broadcasting
    topic: str
    now: int
    invisible_ms: int
    batch_size: int
    message_filter: MessageFilter | None
    out: list[Delivery] = field(default_factory=list)
    inline: bool = False  # on an event loop (Receiving.try_receive)
    scan_left: int = 1 << 62  # index entries it may still read (bounded inline only)
    bytes_left: int = 1 << 62  # message bytes it may still copy (an answer's worth; less inline)
    stopped: bool = False  # it met what must be left to a thread (inline), or an error
    full: bool = False  # (in a thread) its answer holds what one may: the rest is the next receive's
    renew_for: str = ""  # auto_renew: the client its deliveries are kept invisible for
    renew_ms: int = 0  # ... for at most this long after each delivery
    _nonces: list[int] = field(default_factory=list)  # drawn, not handed out yet

    def nonces(self, count: int) -> list[int]:
        """``count`` fresh 48-bit nonces. Those of the whole pass are drawn at once: a draw is a
        system call, which cost a third of a receive's own time when made per message."""
        if len(self._nonces) < count:
            # a shared pass's batch is its receives' together (up to 4,096): not drawn at once
            want = max(count, min(self.batch_size, 64))
            drawn = struct.unpack(f">{want}Q", secrets.token_bytes(8 * want))
            self._nonces += [value >> (64 - 8 * NONCE_BYTES) for value in drawn]
        taken, self._nonces = self._nonces[:count], self._nonces[count:]
        return taken

    def nonce(self) -> int:
        return self.nonces(1)[0]
