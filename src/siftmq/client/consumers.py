"""Consumers: SimpleConsumer (receive/ack), PullConsumer (assigned queues, poll/seek/commit), PushConsumer.

Every message handed to the application is checked again on the client against its own
subscription (RocketMQ's second stage: the exact tag, or the SQL92 expression); a mismatch is
dropped (acknowledged so it does not come back) and counted in ``dropped``.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import inspect
import json
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from siftmq.client.connection import Connection, Started, check
from siftmq.client.model import FilterExpression, ReceivedMessage, check_count
from siftmq.client.prefetch import Prefetching
from siftmq.durable import write_atomically
from siftmq.errors import ConfigError, RemoteError
from siftmq.protocol import rocketmq_v2_pb2 as pb
from siftmq.protocol.service import MAX_ACK_ENTRIES

_log = logging.getLogger(__name__)
HEARTBEAT_S = 10.0
MODES = ("CLUSTERING", "BROADCASTING")
_PULL_ANSWERS = (pb.Code.OK, pb.Code.MESSAGE_NOT_FOUND, pb.Code.ILLEGAL_OFFSET)  # statuses of a served pull
MAX_ACK_BATCH = 256  # entries per AckMessage a PushConsumer sends
RELEASE_S = 1.0  # a stopping push consumer makes its unprocessed messages visible again this soon


class _Consumer(Started):
    """What every consumer shares: subscriptions, heartbeats, the client-side re-check.

    ``mode`` (``CLUSTERING`` or ``BROADCASTING``) is declared to the broker, which refuses a model
    that differs from the one the group's live members use; ``None`` consumes with the group's model
    (clustering unless the broker configures the group otherwise).
    """

    client_type: pb.ClientType = pb.ClientType.CLIENT_TYPE_UNSPECIFIED

    def __init__(
        self,
        endpoint: str,
        group: str,
        subscriptions: Mapping[str, FilterExpression],
        *,
        mode: str | None = None,
        **options: Any,
    ) -> None:
        if not subscriptions:
            raise ValueError("subscribe at least one topic")
        for topic, expression in subscriptions.items():
            if not isinstance(expression, FilterExpression):
                raise TypeError(
                    f"subscriptions[{topic!r}] must be a FilterExpression (FilterExpression.tag(...) or "
                    f".sql92(...)), not {type(expression).__name__}"
                )
        if mode is not None and mode not in MODES:
            raise ValueError(f"mode must be {' or '.join(MODES)} or None (the group's model), not {mode!r}")
        self.mode = mode
        self.connection = Connection(endpoint, **options)
        if mode is not None:  # declared to the broker, as RocketMQ's heartbeat declares the message model
            self.connection.extra_metadata = (("x-siftmq-message-model", mode.lower()),)
        self.group = group
        self.subscriptions = dict(subscriptions)
        self.dropped = 0
        self._heartbeat: asyncio.Task[None] | None = None

    def _settings(self) -> pb.Settings:
        entries = [
            pb.SubscriptionEntry(topic=self.connection.resource(t), expression=f.to_proto())
            for t, f in self.subscriptions.items()
        ]
        return pb.Settings(
            client_type=self.client_type,
            subscription=pb.Subscription(group=self.connection.resource(self.group), subscriptions=entries),
        )

    async def start(self) -> None:
        """Declare the subscriptions (refused at once if the group subscribes differently)."""
        await self.connection.telemetry(self._settings())
        self._heartbeat = asyncio.create_task(self._beat())

    async def _beat(self) -> None:
        request = pb.HeartbeatRequest(
            group=self.connection.resource(self.group), client_type=self.client_type
        )
        while True:
            await asyncio.sleep(HEARTBEAT_S)
            try:
                await self.connection.unary("Heartbeat", request)
            except RemoteError as exc:
                _log.warning("heartbeat of %s failed: %s", self.group, exc)

    async def stop(self) -> None:
        try:
            if self._heartbeat is not None:
                self._heartbeat.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await self._heartbeat
            with contextlib.suppress(RemoteError):
                await self.connection.unary(
                    "NotifyClientTermination",
                    pb.NotifyClientTerminationRequest(group=self.connection.resource(self.group)),
                )
        finally:  # a channel left open is finalized later, outside its event loop
            await self.connection.close()

    def _accept(
        self, topic: str, messages: Sequence[ReceivedMessage]
    ) -> tuple[list[ReceivedMessage], list[ReceivedMessage]]:
        """Messages that pass the client-side re-check, and those dropped (counted)."""
        expression = self.subscriptions[topic]
        accepted: list[ReceivedMessage] = []
        dropped: list[ReceivedMessage] = []
        for m in messages:
            (accepted if expression.matches(m) else dropped).append(m)
        self.dropped += len(dropped)
        return accepted, dropped


class SimpleConsumer(_Consumer):
    """``receive`` a batch, then ``ack`` (or ``change_invisible_duration``) each message."""

    client_type = pb.ClientType.SIMPLE_CONSUMER

    def __init__(
        self,
        endpoint: str,
        group: str,
        subscriptions: Mapping[str, FilterExpression],
        *,
        await_duration: float = 5.0,
        **options: Any,
    ) -> None:
        super().__init__(endpoint, group, subscriptions, **options)
        self.await_duration = await_duration
        self._next_topic = 0

    async def receive(
        self,
        max_messages: int = 16,
        invisible_duration: float = 30.0,
        *,
        ack: Sequence[ReceivedMessage] = (),
        await_duration: float | None = None,
        topic: str | None = None,
    ) -> list[ReceivedMessage]:
        """Up to ``max_messages`` messages of the next subscribed topic (or of ``topic``), the broker
        waiting up to ``await_duration`` seconds for some (the consumer's own by default; 0 asks
        without waiting).

        ``ack``: messages to acknowledge first, as :meth:`ack_many` does; those of the topic received
        from go in the same call when the broker offers siftmq's extension (one round trip instead
        of two). If an acknowledgement fails this raises as :meth:`ack_many` does (once every
        acknowledgement was made), and nothing has been received.
        """
        check_count("max_messages", max_messages)
        hold_s = self.await_duration if await_duration is None else await_duration
        if topic is None:
            topics = list(self.subscriptions)
            topic = topics[self._next_topic % len(topics)]
            self._next_topic += 1
        elif topic not in self.subscriptions:
            raise ValueError(f"{topic!r} is not a topic this consumer subscribes to")
        request = pb.ReceiveMessageRequest(
            group=self.connection.resource(self.group),
            message_queue=pb.MessageQueue(topic=self.connection.resource(topic), id=-1),
            filter_expression=self.subscriptions[topic].to_proto(),
            batch_size=max_messages,
        )
        request.invisible_duration.FromMilliseconds(int(invisible_duration * 1000))
        request.long_polling_timeout.FromMilliseconds(int(hold_s * 1000))
        timeout = hold_s + self.connection.request_timeout
        along = [m for m in ack if m.topic == topic]
        first = [m for m in ack if m.topic != topic]
        if len(along) > MAX_ACK_ENTRIES:  # more than one request takes: the rest first
            first += along[:-MAX_ACK_ENTRIES]
            along = along[-MAX_ACK_ENTRIES:]
        if first:
            try:
                await self.ack_many(first)
            except RemoteError:  # every acknowledgement is still made; then nothing is received
                if along:
                    await self.ack_many(along)  # a failure here carries the first as its context
                raise
        both = None
        if along:
            both = await self.connection.ack_and_receive(
                self._ack_request(topic, along), request, timeout=timeout
            )
            if both is None:  # a broker without the call
                await self.ack_many(along)
            else:
                self._check_acked(both[0], len(along))
        answer = both[1] if both is not None else await self.connection.receive(request, timeout=timeout)
        if answer.status is not None and answer.status.code != pb.Code.MESSAGE_NOT_FOUND:
            check("ReceiveMessage", answer.status)
        out, dropped = self._accept(topic, answer.messages)
        if dropped:
            try:
                await self.ack_many(dropped)
            except RemoteError as exc:  # they come again and are dropped again; ``out`` is not lost
                _log.warning("messages this client's filter dropped were not acknowledged: %s", exc)
        return out

    async def ack(self, message: ReceivedMessage) -> None:
        await self.ack_many([message])

    async def ack_many(self, messages: Sequence[ReceivedMessage]) -> None:
        """Acknowledge messages in one request per topic (per 1,024 messages); raises, once every
        request was made, if any entry failed (a request refused as a whole, as when all its entries
        fail, does not keep the others from being made)."""
        by_topic: dict[str, list[ReceivedMessage]] = {}
        for m in messages:
            by_topic.setdefault(m.topic, []).append(m)
        failed: list[pb.AckMessageResultEntry] = []
        refused: list[tuple[RemoteError, int]] = []  # requests that failed as a whole, and their sizes
        for topic, group in by_topic.items():
            for at in range(0, len(group), MAX_ACK_ENTRIES):
                part = group[at : at + MAX_ACK_ENTRIES]
                try:
                    response = await self.connection.unary("AckMessage", self._ack_request(topic, part))
                except RemoteError as exc:  # every entry failed, or the call did: the others are still made
                    refused.append((exc, len(part)))
                    continue
                failed += _failed_entries(response)
        _raise_refused(refused, len(failed), len(messages))
        _raise_failed(failed, len(messages))

    def _ack_request(self, topic: str, messages: Sequence[ReceivedMessage]) -> pb.AckMessageRequest:
        return pb.AckMessageRequest(
            group=self.connection.resource(self.group),
            topic=self.connection.resource(topic),
            entries=[  # dicts: protobuf builds them in C
                {"message_id": m.message_id, "receipt_handle": m.receipt_handle} for m in messages
            ],
        )

    @staticmethod
    def _check_acked(response: pb.AckMessageResponse, count: int) -> None:
        """Raise :class:`RemoteError` when any entry (or the whole request) failed."""
        _raise_failed(_failed_entries(response), count)
        check("AckMessage", response.status)

    async def change_invisible_duration(self, message: ReceivedMessage, seconds: float) -> ReceivedMessage:
        """Make the message visible again in ``seconds`` (0 = now); returns it with its new handle."""
        request = pb.ChangeInvisibleDurationRequest(
            group=self.connection.resource(self.group),
            topic=self.connection.resource(message.topic),
            receipt_handle=message.receipt_handle,
            message_id=message.message_id,
        )
        request.invisible_duration.FromMilliseconds(int(seconds * 1000))
        response = await self.connection.unary("ChangeInvisibleDuration", request)
        from dataclasses import replace

        return replace(message, receipt_handle=response.receipt_handle)

    def prefetching(
        self, max_messages: int = 16, invisible_duration: float = 30.0, *, depth: int = 2
    ) -> Prefetching:
        """A receiver that keeps ``depth`` calls asking for the next batches in flight while the
        application handles this one (see :class:`~siftmq.client.prefetch.Prefetching` for what
        changes: an acknowledgement's failure is raised a few calls later)."""
        check_count("max_messages", max_messages)
        return Prefetching(self, max_messages, invisible_duration, depth)

    async def release(self, messages: Sequence[ReceivedMessage]) -> None:
        """Make received messages visible to the group again in ``RELEASE_S`` instead of after their
        invisible duration (each counts a delivery attempt, as any redelivery does). A failure is
        logged: that message comes back when its invisible duration ends."""
        results = await asyncio.gather(
            *(self.change_invisible_duration(m, RELEASE_S) for m in messages), return_exceptions=True
        )
        for m, result in zip(messages, results, strict=True):
            if isinstance(result, BaseException):
                _log.warning("releasing %s failed: %r", m.message_id, result)

    def __aiter__(self) -> Any:
        return self._iterate()

    async def _iterate(self) -> Any:
        while True:
            for m in await self.receive():
                yield m


class PushConsumer(SimpleConsumer):
    """Calls ``listener(message)`` (sync or async; truthy = consumed), ``concurrency`` messages at once.

    A receiving loop per subscribed topic keeps up to its share of ``capacity`` = ``concurrency`` ×
    ``HELD_PER_WORKER`` (8) messages received (queued or with a listener) — so a message waits for
    at most ~8 listener calls before its own, inside its 60 s invisible time while a listener call
    takes under ~7 s — and asks for more once at most half of its share is held: after a full answer,
    on siftmq's broker, with a receive that does not wait and carries the acknowledgements of that
    topic consumed meanwhile; otherwise with a waiting receive (a separate task acknowledges what no
    receive took within ``ACK_GRACE_S``, retrying while the handles may be valid what failed for a
    reason a retry can mend, as the broker being unreachable). A failed message is made visible
    again after a backoff (1 s, 5 s, 10 s, ...); after the broker's maximum delivery attempts it
    goes to ``%DLQ%<group>``. ``stop()`` makes what was received and not consumed visible again in
    ``RELEASE_S``.
    """

    client_type = pb.ClientType.PUSH_CONSUMER
    BACKOFF_S = (1.0, 5.0, 10.0, 30.0, 60.0)
    HELD_PER_WORKER = 8
    INVISIBLE_S = 60.0
    ACK_GRACE_S = 0.1  # what the next receive did not take along by then is acknowledged on its own
    ACK_RETRY_S = 1.0  # between attempts of acknowledgements that failed for a reason a retry can mend
    STOP_GRACE_S = 0.5  # stop() lets a waiting receive end this long: an answer may be on its way
    FULL_AT = 32  # an answer this large counts as full (a broker may cap a receive below what was asked)

    def __init__(
        self,
        endpoint: str,
        group: str,
        subscriptions: Mapping[str, FilterExpression],
        listener: Callable[[ReceivedMessage], bool | Awaitable[bool]],
        *,
        concurrency: int = 4,
        **options: Any,
    ) -> None:
        if concurrency < 1:
            raise ValueError(f"concurrency must be at least 1, not {concurrency}")
        super().__init__(endpoint, group, subscriptions, **options)
        self.listener = listener
        self.concurrency = concurrency
        self.capacity = concurrency * self.HELD_PER_WORKER
        # each topic's share; 2 x concurrency at least, so a backlog on one topic of many keeps every
        # listener busy (with many topics busy at once the hold can then pass ``capacity``)
        self._share = max(self.capacity // len(self.subscriptions), 2 * concurrency)
        self._ready: asyncio.Queue[ReceivedMessage] = asyncio.Queue()
        self._held = dict.fromkeys(self.subscriptions, 0)  # received, not yet settled, by topic
        self._room = asyncio.Event()
        self._pumps: dict[str, asyncio.Task[None]] = {}
        self._trying: set[str] = set()  # topics whose call is a try (it may carry acknowledgements)
        self._receiving: set[str] = set()  # topics whose loop is in a receive of either kind
        self._workers: list[asyncio.Task[None]] = []
        self._unsettled: list[ReceivedMessage] = []  # what stopped listeners held: released by stop()
        self._to_ack: list[ReceivedMessage] = []  # consumed; acknowledged by a receive or the acker
        self._ack_wanted = asyncio.Event()
        self._acker: asyncio.Task[None] | None = None
        self._stopping = False
        self._closing = False
        self._stopper: asyncio.Future[None] | None = None

    @property
    def held(self) -> int:
        """Messages received and not yet consumed or given back (at most the topics' shares together)."""
        return sum(self._held.values())

    async def start(self) -> None:
        await super().start()
        self._acker = asyncio.create_task(self._ack_loop())
        self._workers = [asyncio.create_task(self._work()) for _ in range(self.concurrency)]
        self._pumps = {t: asyncio.create_task(self._receive_loop(t)) for t in self.subscriptions}

    async def stop(self) -> None:
        """Stop receiving, give back what was not consumed, acknowledge what was, close. Runs to its
        end once started, even if the caller is cancelled meanwhile."""
        if self._stopper is None:
            self._stopper = asyncio.ensure_future(self._stop())
        await asyncio.shield(self._stopper)

    async def _stop(self) -> None:
        try:
            self._stopping = True
            for topic, pump in self._pumps.items():
                if topic not in self._receiving:  # waiting for room, or paused
                    pump.cancel()
            waiting = [p for t, p in self._pumps.items() if t in self._receiving and t not in self._trying]
            if waiting:  # a long poll has taken nothing; an answer on its way lands in the grace
                _, late = await asyncio.wait(waiting, timeout=self.STOP_GRACE_S)
                for pump in late:
                    pump.cancel()
            if self._pumps:  # a try (it may carry acknowledgements) ends in its own time
                await asyncio.wait(self._pumps.values())
            for w in self._workers:
                w.cancel()
            if self._workers:
                await asyncio.wait(self._workers)
            # hand back what was received and not consumed instead of leaving it invisible
            queued = [self._ready.get_nowait() for _ in range(self._ready.qsize())]
            for m in queued:
                self._held[m.topic] -= 1
            left, self._unsettled = self._unsettled + queued, []
            await self.release(left)
            if self._acker is not None:  # what the listeners consumed last is acknowledged before leaving
                self._closing = True
                self._ack_wanted.set()
                await asyncio.wait([self._acker])
        finally:
            await super().stop()

    def _take_acks(self, topic: str | None = None, limit: int = MAX_ACK_ENTRIES) -> list[ReceivedMessage]:
        """Up to ``limit`` consumed messages to acknowledge (of ``topic`` only, when given), taken out."""
        if topic is None:
            first, self._to_ack = self._to_ack[:limit], self._to_ack[limit:]
            return first
        taken: list[ReceivedMessage] = []
        kept: list[ReceivedMessage] = []
        for m in self._to_ack:
            (taken if m.topic == topic and len(taken) < limit else kept).append(m)
        self._to_ack = kept
        return taken

    async def _receive_loop(self, topic: str) -> None:
        """Receive ``topic`` while at most half its share is held: a try (no waiting, with the
        topic's acknowledgements due) on siftmq's broker after a full answer, else a waiting receive."""
        full = True
        while not self._stopping:
            while self._held[topic] > self._share - max(self._share // 2, 1):
                self._room.clear()
                await self._room.wait()
            wanted = self._share - self._held[topic]
            acks: list[ReceivedMessage] = []
            self._receiving.add(topic)
            try:
                if full and self.connection.batch_extension is True:
                    self._trying.add(topic)
                    try:
                        acks = self._take_acks(topic)
                        batch = await self.receive(
                            wanted, self.INVISIBLE_S, ack=acks, await_duration=0, topic=topic
                        )
                    finally:
                        self._trying.discard(topic)
                else:
                    batch = await self.receive(wanted, self.INVISIBLE_S, topic=topic)
            except RemoteError as exc:
                full = False
                if exc.call == "AckMessage" and not exc.retriable:
                    # acknowledgements refused one by one (handles gone stale): the others were made
                    _log.warning("acknowledging messages of %s failed: %s", self.group, exc)
                    continue
                self._give_back_acks(acks)
                _log.warning("receive of %s for %s failed: %s", topic, self.group, exc)
                if not self._stopping:
                    await asyncio.sleep(1)
                continue
            except Exception:  # the loop must outlive any one failure: it is the consumer
                self._give_back_acks(acks)
                full = False
                _log.exception("receive of %s for %s failed", topic, self.group)
                if not self._stopping:
                    await asyncio.sleep(1)
                continue
            finally:
                self._receiving.discard(topic)
            full = len(batch) >= min(wanted, self.FULL_AT)
            self._held[topic] += len(batch)
            for m in batch:
                self._ready.put_nowait(m)

    def _give_back_acks(self, acks: list[ReceivedMessage]) -> None:
        """Acknowledgements a failed call may not have made: the acker sends them again (a second
        time is refused, harmlessly)."""
        if acks:
            self._to_ack[:0] = acks
            self._ack_wanted.set()

    async def _ack_loop(self) -> None:
        """Acknowledge what no receive took along within ``ACK_GRACE_S``, in batches. A failure a
        retry can mend (the broker unreachable, busy) is retried every ``ACK_RETRY_S`` while the
        handles may still be valid: for ``INVISIBLE_S`` since the failures began (they were
        received before it), and not once the consumer is stopping."""
        loop = asyncio.get_running_loop()
        failing_since: float | None = None
        while True:
            await self._ack_wanted.wait()
            if not self._closing:
                await asyncio.sleep(self.ACK_GRACE_S)
            self._ack_wanted.clear()
            while self._to_ack:
                by_topic: dict[str, list[ReceivedMessage]] = {}
                for message in self._take_acks(limit=MAX_ACK_BATCH):
                    by_topic.setdefault(message.topic, []).append(message)
                retry: list[ReceivedMessage] = []
                # a topic at a time: a retry sends again only what was not made (made ones, sent
                # again, would be refused as unknown and end the retries)
                for batch in by_topic.values():
                    try:
                        await self.ack_many(batch)
                    except RemoteError as exc:
                        now = loop.time()
                        failing_since = now if failing_since is None else failing_since
                        if exc.retriable and not self._closing and now - failing_since < self.INVISIBLE_S:
                            _log.warning("acknowledging messages of %s failed, retrying: %s", self.group, exc)
                            retry.extend(batch)
                            continue
                        # not acknowledged: redelivered after its invisible time
                        _log.warning(
                            "acknowledging %d messages of %s failed: %s", len(batch), self.group, exc
                        )
                    except Exception:  # the acker must outlive any one failure, as the receiving loops do
                        _log.exception("acknowledging %d messages of %s failed", len(batch), self.group)
                if retry:
                    self._give_back_acks(retry)
                    await asyncio.sleep(self.ACK_RETRY_S)
                    continue
                failing_since = None
            if self._closing:
                return

    async def _work(self) -> None:
        while True:
            m = await self._ready.get()
            try:
                await self._consume(m)
            except asyncio.CancelledError:
                self._unsettled.append(m)  # stopping: released by stop()
                raise
            finally:
                self._held[m.topic] -= 1
                self._room.set()

    async def _consume(self, m: ReceivedMessage) -> None:
        try:
            result = self.listener(m)
            ok = await result if inspect.isawaitable(result) else result
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is None or task.cancelling():  # stop() cancelled this worker
                raise
            # the listener's own (an awaited future cancelled under it): a failure, the worker lives
            _log.error("listener was cancelled on %s: counted as failed", m.message_id)
            ok = False
        except Exception:
            _log.exception("listener failed on %s", m.message_id)
            ok = False
        try:
            if ok:
                self._to_ack.append(m)
                self._ack_wanted.set()
            else:
                delay = self.BACKOFF_S[min(m.delivery_attempt, len(self.BACKOFF_S)) - 1]
                await self.change_invisible_duration(m, delay)
        except RemoteError as exc:
            _log.warning("settling %s failed: %s", m.message_id, exc)
        except Exception:  # the worker must outlive any one failure: it comes back after its invisible time
            _log.exception("settling %s failed", m.message_id)


class PullConsumer(_Consumer):
    """Pulls its assigned queues by offset: ``poll``, ``seek``, ``commit``.

    In ``CLUSTERING`` mode (or ``mode=None`` in a clustering group) the broker assigns queues and
    keeps the group's offsets; in ``BROADCASTING`` mode the consumer reads every queue and keeps its
    offsets in a local file, as RocketMQ does: ``<offset_dir>/<group>@<topic>@<instance_name>.json``
    (``~/.siftmq/offsets``, ``DEFAULT``), found again after a restart; consumers of one group and
    topic sharing the directory need an ``instance_name`` each.
    """

    client_type = pb.ClientType.PULL_CONSUMER

    def __init__(
        self,
        endpoint: str,
        group: str,
        topic: str,
        expression: FilterExpression | None = None,
        *,
        mode: str | None = None,
        offset_dir: Path | None = None,
        instance_name: str = "DEFAULT",
        **options: Any,
    ) -> None:
        super().__init__(endpoint, group, {topic: expression or FilterExpression.tag()}, mode=mode, **options)
        self.topic = topic
        self.assignment_ttl_s = 1.0  # how long a queried assignment is reused by poll()
        self._assigned: tuple[float, list[int]] | None = None
        self._offsets: dict[int, int] = {}  # where each queue's next pull starts
        #: prefetch bounds per queue (RocketMQ's pullThresholdForQueue / pullThresholdSizeForQueue):
        #: a queue is pulled ahead of the application while it buffers fewer messages and body bytes
        self.prefetch_messages = 1000
        self.prefetch_bytes = 32 * 1024 * 1024
        self.pull_batch_size = 32  # messages a pull asks for at least (more when a poll asks for more)
        self._buffered: dict[int, collections.deque[ReceivedMessage]] = {}  # pulled, not yet returned
        self._buffered_bytes: dict[int, int] = {}  # body bytes in _buffered, per queue
        self._fetching: dict[int, asyncio.Future[None]] = {}  # the pull in flight per queue
        self._generation: dict[int, int] = {}  # bumped by seek/rebalance: an older pull's answer is dropped
        self._serve_from = 0  # the position in the assignment the next poll serves first
        # named by what it holds and by a name that outlives the process (a client id is new at
        # every start): RocketMQ's instanceName, "DEFAULT" unless several consumers of one group
        # and topic share the directory
        self._offset_file = (
            offset_dir or Path.home() / ".siftmq" / "offsets"
        ) / f"{group}@{topic}@{instance_name}.json"
        if mode == "BROADCASTING" and self._offset_file.exists():
            self._offsets = _read_offsets(self._offset_file)

    def _queue(self, qid: int) -> pb.MessageQueue:
        return pb.MessageQueue(topic=self.connection.resource(self.topic), id=qid)

    async def _cached_assignment(self) -> list[int]:
        now = asyncio.get_running_loop().time()
        if self._assigned is None or now - self._assigned[0] > self.assignment_ttl_s:
            self._assigned = (now, await self.assignment())
        return self._assigned[1]

    async def assignment(self) -> list[int]:
        """The queues the broker assigns this member now. A broker that answers as to a receiving
        client (one assignment of every queue, id -1) has forgotten this one's settings, as after
        a restart: they are sent again and the broker asked again."""
        request = pb.QueryAssignmentRequest(
            topic=self.connection.resource(self.topic),
            group=self.connection.resource(self.group),
            endpoints=self.connection.endpoints(),
        )
        response = await self.connection.unary("QueryAssignment", request)
        if any(a.message_queue.id < 0 for a in response.assignments):
            await self.connection.telemetry(self._settings())
            response = await self.connection.unary("QueryAssignment", request)
        return sorted(a.message_queue.id for a in response.assignments if a.message_queue.id >= 0)

    async def _position(self, qid: int) -> int:
        if qid in self._offsets:
            return self._offsets[qid]
        offset = None
        if self.mode != "BROADCASTING":
            try:
                got = await self.connection.unary(
                    "GetOffset",
                    pb.GetOffsetRequest(
                        group=self.connection.resource(self.group), message_queue=self._queue(qid)
                    ),
                )
                offset = int(got.offset)
            except RemoteError as exc:
                if exc.status != "OFFSET_NOT_FOUND":
                    raise
        if offset is None:
            got = await self.connection.unary(
                "QueryOffset",
                pb.QueryOffsetRequest(
                    message_queue=self._queue(qid), query_offset_policy=pb.QueryOffsetPolicy.BEGINNING
                ),
            )
            offset = int(got.offset)
        self._offsets[qid] = offset
        return offset

    def seek(self, queue_id: int, offset: int) -> None:
        """Read ``queue_id`` from ``offset`` on the next poll (what was buffered from it is dropped).
        A queue not assigned to this member at the next poll is let go, its seek with it."""
        check_count("queue_id", queue_id, 0)
        check_count("offset", offset, 0)
        self._forget(queue_id)
        self._offsets[queue_id] = offset

    def _forget(self, qid: int) -> None:
        """Drop a queue's buffered messages and disown its pull in flight (its answer is discarded)."""
        self._buffered.pop(qid, None)
        self._buffered_bytes.pop(qid, None)
        self._generation[qid] = self._generation.get(qid, 0) + 1
        task = self._fetching.pop(qid, None)
        if task is not None:
            task.cancel()

    def _rebalanced_away(self, qid: int) -> None:
        """Let go of a queue another member owns now: its new owner continues from the group's offset."""
        self._forget(qid)
        self._offsets.pop(qid, None)

    def _resume_offset(self, qid: int) -> int:
        """Where this queue continues after a restart: its first message not yet returned by poll."""
        buffered = self._buffered.get(qid)
        return buffered[0].queue_offset if buffered else self._offsets[qid]

    async def poll(self, max_messages: int = 32, timeout: float = 0.0) -> list[ReceivedMessage]:
        """Up to ``max_messages`` from the assigned queues, waiting up to ``timeout`` for new ones.

        Queues are pulled concurrently (answered in one frame when the broker offers siftmq's batch
        extension) and ahead of the application, as RocketMQ's consumers prefetch: a queue is pulled
        again in the background while it buffers fewer than :attr:`prefetch_messages` messages and
        :attr:`prefetch_bytes` body bytes, so the broker reads while the application works. A poll
        that finds fewer than ``max_messages`` buffered waits for the pulls in flight until enough
        arrived or all answered. :meth:`commit` stores the offset of the first message not yet
        returned: nothing buffered is skipped after a restart. Not safe to call concurrently.
        """
        check_count("max_messages", max_messages)
        self._reap()  # a background pull that failed raises here
        queues = await self._cached_assignment()
        if self.mode != "BROADCASTING":
            # Rebalanced away: the new owner goes on from the group's committed offset, and so does
            # this consumer should the queue come back (its own position there is stale by then:
            # what the other member consumed and committed would be read again)
            for qid in {*self._buffered, *self._fetching, *self._offsets} - set(queues):
                self._rebalanced_away(qid)
        if self._buffered_count() < max_messages:
            self._prefetch(queues, max_messages)
            pending = set(self._fetching.values())
            while pending and self._buffered_count() < max_messages:
                _, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            self._reap()
            if timeout > 0 and not any(self._buffered.values()):
                if not queues:  # none of this member's (more members than queues): wait all the same
                    queues, timeout = await self._await_assignment(timeout)
                    self._prefetch(queues, max_messages)
                if queues and timeout > 0:
                    await self._long_poll(queues, max_messages, timeout)
        out: list[ReceivedMessage] = []
        # each poll starts where the last one stopped: a backlog on one queue does not starve the rest
        start = self._serve_from % len(queues) if queues else 0
        for qid in queues[start:] + queues[:start]:
            buffered = self._buffered.get(qid)
            if not buffered:
                continue
            if len(out) >= max_messages:
                break
            taken = 0
            while buffered and len(out) < max_messages:
                message = buffered.popleft()
                taken += len(message.body)
                out.append(message)
            self._buffered_bytes[qid] -= taken
            self._serve_from = queues.index(qid) + 1
        self._prefetch(queues, max_messages)
        return out

    async def _await_assignment(self, timeout: float) -> tuple[list[int], float]:
        """Until this member is assigned a queue or ``timeout`` passes (looking again as the
        assignment's cache expires): the queues, and the time left."""
        loop = asyncio.get_running_loop()
        end = loop.time() + timeout
        queues: list[int] = []
        while not queues and (left := end - loop.time()) > 0:
            await asyncio.sleep(min(left, self.assignment_ttl_s))
            queues = await self._cached_assignment()
        return queues, end - loop.time()

    def _buffered_count(self) -> int:
        return sum(map(len, self._buffered.values()))

    def _prefetch(self, queues: list[int], batch_size: int) -> None:
        """Start a pull (no waiting) on every queue below the prefetch bounds with no pull in flight
        (a failed pull stays until the next poll raises its failure)."""
        for qid in queues:
            task = self._fetching.get(qid)
            if task is not None and (
                not task.done() or (not task.cancelled() and task.exception() is not None)
            ):
                continue
            buffered = self._buffered.get(qid)
            if buffered and (
                len(buffered) >= self.prefetch_messages
                or self._buffered_bytes.get(qid, 0) >= self.prefetch_bytes
            ):
                continue
            self._fetching[qid] = asyncio.ensure_future(
                self._fetch(qid, max(batch_size, self.pull_batch_size), 0.0)
            )

    def _reap(self) -> None:
        """Forget finished pulls; raise the first failure among them."""
        failure: BaseException | None = None
        for qid, task in list(self._fetching.items()):
            if task.done():
                del self._fetching[qid]
                if not task.cancelled() and task.exception() is not None and failure is None:
                    failure = task.exception()
        if failure is not None:
            raise failure

    async def _long_poll(self, queues: list[int], max_messages: int, timeout: float) -> None:
        """Hold a pull on every queue; the first to find messages ends the wait (the rest are cancelled)."""
        for qid in queues:
            if qid not in self._fetching:
                self._fetching[qid] = asyncio.ensure_future(self._fetch(qid, max_messages, timeout))
        pending = set(self._fetching.values())
        try:
            while pending and not any(self._buffered.values()):
                _, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                self._reap()
        finally:
            for qid, task in list(self._fetching.items()):
                if task in pending:  # a cancelled pull moved no offset: nothing is skipped
                    task.cancel()
                    del self._fetching[qid]
            await asyncio.gather(*pending, return_exceptions=True)

    async def _fetch(self, qid: int, batch_size: int, hold: float) -> None:
        """One pull of queue ``qid``; re-checked messages are buffered and its position advanced.

        The answer is dropped when the queue was sought or rebalanced away meanwhile.
        """
        generation = self._generation.get(qid, 0)
        request = pb.PullMessageRequest(
            group=self.connection.resource(self.group),
            message_queue=self._queue(qid),
            offset=await self._position(qid),
            batch_size=batch_size,
            filter_expression=self.subscriptions[self.topic].to_proto(),
        )
        request.long_polling_timeout.FromMilliseconds(int(hold * 1000))
        answer = await self.connection.pull(request, timeout=hold + self.connection.request_timeout)
        if self._generation.get(qid, 0) != generation:
            return
        status = answer.status
        if status is not None and status.code == pb.Code.PRECONDITION_FAILED:
            self._assigned = None  # the queue moved to another member: ask again next time
            return
        if status is not None and status.code not in _PULL_ANSWERS:
            check("PullMessage", status)
        accepted, _ = self._accept(self.topic, answer.messages)
        if accepted:
            self._buffered.setdefault(qid, collections.deque()).extend(accepted)
            self._buffered_bytes[qid] = self._buffered_bytes.get(qid, 0) + sum(len(m.body) for m in accepted)
        if answer.next_offset is not None:
            self._offsets[qid] = answer.next_offset

    async def stop(self) -> None:
        tasks = list(self._fetching.values())
        for qid in list(self._fetching):
            self._forget(qid)
        try:
            await asyncio.gather(*tasks, return_exceptions=True)
        finally:
            await super().stop()

    async def commit(self) -> None:
        """Store the current positions: on the broker (clustering) or in the local file (broadcasting)."""
        if self.mode == "BROADCASTING":
            _write_offsets(self._offset_file, {qid: self._resume_offset(qid) for qid in self._offsets})
            return
        committed = await self.connection.update_offsets(
            self.group, self.topic, {qid: self._resume_offset(qid) for qid in self._offsets}
        )
        if committed is not None:  # one call through siftmq's extension; it answers the assignment
            owned = set(committed)
            for qid in [q for q in self._offsets if q not in owned]:
                self._rebalanced_away(qid)
            return
        owned = set(await self.assignment())
        refused: list[tuple[int, RemoteError]] = []
        for qid in list(self._offsets):
            if qid not in owned:
                self._rebalanced_away(qid)
                continue
            try:
                await self.connection.unary(
                    "UpdateOffset",
                    pb.UpdateOffsetRequest(
                        group=self.connection.resource(self.group),
                        message_queue=self._queue(qid),
                        offset=self._resume_offset(qid),
                    ),
                )
            except RemoteError as exc:  # one queue's refusal does not keep the others' positions unstored
                if exc.status == "PRECONDITION_FAILED":
                    # rebalanced away since the assignment above: the broker keeps a queue's offset
                    # for its owner, whose position this one would move
                    self._rebalanced_away(qid)
                    self._assigned = None  # ask again before the next pull
                    continue
                refused.append((qid, exc))
        if refused:
            qid, first = refused[0]
            attempted = len(owned & set(self._offsets))
            raise RemoteError.for_status(
                f"{len(refused)} of {attempted} queue offsets were not stored (the others were); "
                f"queue {qid}: {first}",
                status=first.status,
                status_code=first.status_code,
            ) from first


def _failed_entries(response: pb.AckMessageResponse) -> list[pb.AckMessageResultEntry]:
    ok_code = pb.Code.OK
    return [e for e in response.entries if e.status.code != ok_code]


def _raise_refused(refused: Sequence[tuple[RemoteError, int]], failed: int, count: int) -> None:
    """Raise the first of the acknowledgement requests refused as a whole, if any: as it is when it
    was the only request, else counting every acknowledgement that failed (``failed`` of the others'
    entries besides)."""
    if not refused:
        return
    first, size = refused[0]
    if size == count:
        raise first
    failures = failed + sum(size for _, size in refused)
    raise RemoteError.for_status(
        f"{failures} of {count} acknowledgements failed ({len(refused)} requests refused as a whole, "
        f"the others made); a request of {size}: {first}",
        status=first.status,
        status_code=first.status_code,
        call="AckMessage",
    ) from first


def _raise_failed(failed: Sequence[pb.AckMessageResultEntry], count: int) -> None:
    """Raise :class:`RemoteError` naming the first of the acknowledgements that failed, if any (the
    answer was MULTIPLE_RESULTS: the others were made)."""
    if failed:
        first = failed[0]
        text = f"{len(failed)} of {count} acknowledgements failed; {first.message_id}: "
        check("AckMessage", pb.Status(code=first.status.code, message=text + first.status.message))


def _read_offsets(path: Path) -> dict[int, int]:
    """A broadcasting consumer's offsets file; a damaged one is refused naming it."""
    try:
        data = json.loads(path.read_text())
        return {int(qid): int(offset) for qid, offset in data.items()}
    except (ValueError, TypeError, AttributeError) as exc:
        raise ConfigError(
            f"the offsets file {path} is damaged ({exc}); remove it to read the topic from the start"
        ) from exc


def _write_offsets(path: Path, offsets: dict[int, int]) -> None:
    """Replace the offsets file as a whole and durably: a crash leaves the old one or the new one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(path, json.dumps(offsets).encode())
