"""Handlers of ``apache.rocketmq.v2.MessagingService``: decode, call the broker, encode.

Every handler answers with a status (never a bare gRPC error) so the official clients always get
a response they understand: unary handlers through one edge, :func:`answering`; streams and
per-entry answers (Telemetry, Receive, Pull, each Ack entry) map each failure where it happens. The mapping of
errors to codes is :mod:`siftmq.server.status`; undecodable requests never reach a handler
(:mod:`siftmq.server.decoding`).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from concurrent.futures import Executor
from typing import Any

import grpc
from google.protobuf.duration_pb2 import Duration
from google.protobuf.timestamp_pb2 import Timestamp

from siftmq.broker.broker import Broker
from siftmq.broker.coalescing import OneHop, ReceiveCoalescer, SendCoalescer
from siftmq.broker.long_polling import (
    ArrivalNotifier,
    give_back_later,
    pull_long_polling,
    receive_long_polling,
)
from siftmq.broker.model import Subscription
from siftmq.broker.send import MAX_BATCH_MESSAGES
from siftmq.errors import BadRequestError, StatusCode
from siftmq.protocol import rocketmq_v2_pb2 as pb
from siftmq.protocol import siftmq_batch_pb2 as batch_pb
from siftmq.protocol.service import MAX_ACK_ENTRIES
from siftmq.server import convert
from siftmq.server.status import OK_FIELDS, ok, status, status_of
from siftmq.store import StoredMessage

_log = logging.getLogger(__name__)

#: Time left to the client after a long poll ends, to receive the answer before its deadline.
DEADLINE_MARGIN_S = 0.5
PRODUCER_MAX_ATTEMPTS = 3
MESSAGE_MODEL_HEADER = "x-siftmq-message-model"
_ROUTE_PERMISSION = {  # a topic's read (4) and write (2) bits, as QueryRoute tells them
    6: pb.Permission.READ_WRITE,
    4: pb.Permission.READ,
    2: pb.Permission.WRITE,
    0: pb.Permission.NONE,
}


def _message_model(context: grpc.aio.ServicerContext[Any, Any]) -> str | None:
    """siftmq's own clients declare their message model (official v5 clients only cluster)."""
    model = convert.call_header(context, MESSAGE_MODEL_HEADER, 32)
    return model.lower() if model is not None else None


def _peer(context: grpc.aio.ServicerContext[Any, Any]) -> str:
    """The client's address as gRPC reports it (``ipv4:127.0.0.1:53211``), without the scheme."""
    peer = str(context.peer() or "")
    return peer.split(":", 1)[1] if peer.startswith(("ipv4:", "ipv6:")) else peer


def _client_type(value: int) -> str:
    """The client type's name (unknown numbers from newer clients are named, not an error)."""
    try:
        return pb.ClientType.Name(value)
    except ValueError:
        return f"CLIENT_TYPE_{value}"


def _now() -> Timestamp:
    now = Timestamp()
    now.FromNanoseconds(time.time_ns())
    return now


def _seconds(seconds: float) -> Duration:
    d = Duration()
    d.FromMilliseconds(int(seconds * 1000))
    return d


def answering(
    response: type[Any], *, on_error: Callable[[Any, pb.Status], dict[str, Any]] | None = None
) -> Callable[[Callable[..., Awaitable[Any]]], Callable[..., Awaitable[Any]]]:
    """The one error edge of a unary RPC: whatever the handler raises becomes ``response`` with the
    status :func:`~siftmq.server.status.status_of` maps it to (``on_error`` adds the fields a client
    reads from a failed answer), so every call gets an answer the official clients understand."""

    def wrap(handler: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
        call = handler.__name__

        @functools.wraps(handler)
        async def rpc(self: Any, request: Any, context: Any) -> Any:
            try:
                return await handler(self, request, context)
            except Exception as exc:
                st = status_of(exc, call=call)
                return response(status=st, **(on_error(request, st) if on_error is not None else {}))

        return rpc

    return wrap


def _send_error_entries(request: Any, st: pb.Status) -> dict[str, Any]:
    return {"entries": [pb.SendResultEntry(status=st)]}  # clients read the entry's status


def _same_receipt_handle(request: Any, st: pb.Status) -> dict[str, Any]:
    return {"receipt_handle": request.receipt_handle}


def _ack_entries(entries: Any, statuses: Sequence[Any]) -> list[dict[str, Any]]:
    """An AckMessage answer's entries, one per request entry with its status (dicts: protobuf builds
    them in C)."""
    return [
        {"message_id": e.message_id, "receipt_handle": e.receipt_handle, "status": st}
        for e, st in zip(entries, statuses, strict=True)
    ]


def _each_ack_failed(request: Any, st: pb.Status) -> dict[str, Any]:
    if len(request.entries) > MAX_ACK_ENTRIES:  # refused as a whole, as AckMessage answers it
        return {}
    return {"entries": _ack_entries(request.entries, [st] * len(request.entries))}


class MessagingService:
    """One instance per server; ``notifier`` drives long polling."""

    def __init__(
        self,
        broker: Broker,
        notifier: ArrivalNotifier,
        read_executor: Executor | None = None,
        send_executor: Executor | None = None,
        program_executor: Executor | None = None,
        *,
        share_receives: bool = False,
    ) -> None:
        self.broker = broker
        self.notifier = notifier
        self.config = broker.config
        # where pulls/receives read and sends append (None: the loop's default pool); few threads,
        # since CPU-bound work in many threads loses time fighting over the GIL
        self.read_executor = read_executor
        self.send_executor = send_executor
        # reads through a group's filter program: a program slow to start or to run (up to its
        # deadlines) holds these threads, not the ones every other group's reads wait for
        self.program_executor = program_executor
        # With async flush a single message's append is a copy into the mapped CommitLog (no fsync):
        # done on the event loop it costs less than the hop to the send thread and back (measured:
        # ~15% of the broker's CPU per official-client send). Batches and sync flush keep the hop.
        self._inline_sends = broker.config.flush == "async"
        self._coalescer = SendCoalescer(functools.partial(broker.send_many, on_loop=True))
        # Receives of one turn served by shared passes: where a turn brings many calls (a core
        # process, whose front-ends' frames arrive many to a read). In one process gRPC hands the
        # loop a few calls at a time, and a receive that waits a turn for others costs more than
        # it shares (the floor bench, A/B 2026-11-27: ~8% more broker CPU per receive).
        self._receives = ReceiveCoalescer(broker.try_receive_shared) if share_receives else None
        self._acks = OneHop()

    def _reads_for(self, group: str, topic: str) -> Executor | None:
        """Where a read of ``group`` on ``topic`` runs: the program threads when it has a program."""
        if self.program_executor is not None and self.broker.programs.holds(group, topic):
            return self.program_executor
        return self.read_executor

    @staticmethod
    async def _call(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Run a broker call in the RPC thread pool (store I/O and fsync never block the event loop)."""
        return await asyncio.to_thread(functools.partial(fn, **kwargs), *args)

    def _hold_s(self, long_polling_timeout: Duration | None, context: Any) -> float:
        """How long a receive or pull may wait: the client's long poll, capped by config and its deadline."""
        hold = 0.0
        if long_polling_timeout is not None:
            hold = min(convert.duration_ms(long_polling_timeout) / 1000, self.config.max_long_polling_s)
        remaining = context.time_remaining()
        if remaining is not None:
            hold = min(hold, remaining - DEADLINE_MARGIN_S)
        return hold

    # ------------------------------------------------------------------------------- route, session

    @answering(pb.QueryRouteResponse)
    async def QueryRoute(self, request: pb.QueryRouteRequest, context: Any) -> pb.QueryRouteResponse:
        topic = await self._call(self.broker.route, convert.topic_name(request.topic))
        if not request.endpoints.addresses:
            return pb.QueryRouteResponse(
                status=status(
                    StatusCode.ILLEGAL_ACCESS_POINT, "QueryRoute needs the endpoints the client used"
                )
            )
        perm = _ROUTE_PERMISSION[topic.perm & 6]  # the read and write bits; 1 is RocketMQ's inherit bit
        broker = pb.Broker(name=self.config.broker_name, id=0, endpoints=request.endpoints)
        queues = [
            pb.MessageQueue(
                topic=request.topic,
                id=qid,
                permission=perm,
                broker=broker,
                accept_message_types=[pb.MessageType.NORMAL],
            )
            for qid in range(topic.queue_nums)
        ]
        return pb.QueryRouteResponse(status=ok(), message_queues=queues)

    @answering(pb.HeartbeatResponse)
    async def Heartbeat(self, request: pb.HeartbeatRequest, context: Any) -> pb.HeartbeatResponse:
        group = convert.topic_name(request.group) if request.HasField("group") else None
        self.broker.heartbeat(
            convert.client_id_of(context), _client_type(request.client_type), group, address=_peer(context)
        )
        return pb.HeartbeatResponse(status=ok())

    async def NotifyClientTermination(
        self, request: pb.NotifyClientTerminationRequest, context: Any
    ) -> pb.NotifyClientTerminationResponse:
        self.broker.client_terminated(convert.client_id_of(context))
        return pb.NotifyClientTerminationResponse(status=ok())

    async def Telemetry(
        self, requests: AsyncIterator[pb.TelemetryCommand], context: Any
    ) -> AsyncIterator[pb.TelemetryCommand]:
        client_id = convert.client_id_of(context)
        model = _message_model(context)
        async for command in requests:
            if command.WhichOneof("command") != "settings":
                continue  # results of commands siftmq never sends
            settings = command.settings
            try:
                await self._call(self._apply_settings, client_id, settings, _peer(context), model)
                reply_status = ok()
            except Exception as exc:
                reply_status = status_of(exc, call="Telemetry")
            yield pb.TelemetryCommand(status=reply_status, settings=self._reply_settings(settings))

    def _apply_settings(
        self, client_id: str, settings: pb.Settings, address: str, model: str | None = None
    ) -> None:
        client_type = _client_type(settings.client_type)
        if settings.WhichOneof("pub_sub") != "subscription":
            self.broker.heartbeat(client_id, client_type, None, address=address)
            return
        sub = settings.subscription
        group = convert.topic_name(sub.group) if sub.HasField("group") else None
        subscriptions = [
            convert.subscription_of(convert.topic_name(e.topic), e.expression) for e in sub.subscriptions
        ]
        self.broker.subscribe(
            client_id, client_type, group, subscriptions, address=address, message_model=model
        )

    def _reply_settings(self, settings: pb.Settings) -> pb.Settings:
        reply = pb.Settings()
        reply.CopyFrom(settings)
        reply.metric.CopyFrom(pb.Metric(on=False))
        if settings.WhichOneof("pub_sub") == "subscription":
            sub = reply.subscription
            sub.fifo = False
            sub.receive_batch_size = min(32, self.config.max_batch_size)
            if not settings.subscription.HasField("long_polling_timeout"):
                sub.long_polling_timeout.CopyFrom(_seconds(self.config.push_long_polling_s))
            reply.backoff_policy.CopyFrom(
                pb.RetryPolicy(
                    max_attempts=self.config.max_delivery_attempts,
                    customized_backoff=pb.CustomizedBackoff(
                        # whole seconds: the official clients read only a Duration's seconds,
                        # so 0.5 s would be a nack with no delay at all
                        next=[_seconds(math.ceil(s)) for s in self.config.retry_backoff_s]
                    ),
                )
            )
        else:
            reply.publishing.max_body_size = self.config.max_body_size
            reply.publishing.validate_message_type = True
            reply.backoff_policy.CopyFrom(
                pb.RetryPolicy(
                    max_attempts=PRODUCER_MAX_ATTEMPTS,
                    exponential_backoff=pb.ExponentialBackoff(
                        initial=_seconds(0.01), max=_seconds(1.0), multiplier=2.0
                    ),
                )
            )
        return reply

    # --------------------------------------------------------------------------------------- send

    @answering(pb.SendMessageResponse, on_error=_send_error_entries)
    async def SendMessage(self, request: pb.SendMessageRequest, context: Any) -> pb.SendMessageResponse:
        if (
            self._inline_sends
            and len(request.messages) == 1
            and self.broker.sends_inline(convert.topic_name(request.messages[0].topic))
        ):
            # memory work, cheaper on the loop than a thread hop; with the other single sends of
            # this turn of the loop, in one append
            message = convert.outgoing_message(request.messages[0], self.config.max_body_size)
            results = [await self._coalescer.send(message)]
        else:
            loop = asyncio.get_running_loop()
            results = await loop.run_in_executor(self.send_executor, self._send, request)
        # entries as dicts: protobuf builds them in C, twice as fast as objects
        entries = [
            {"status": OK_FIELDS, "message_id": r.message_id, "offset": r.queue_offset} for r in results
        ]
        return pb.SendMessageResponse(status=OK_FIELDS, entries=entries)

    def _send(self, request: pb.SendMessageRequest) -> list[Any]:
        """Decode (bounded: count first, then the decompressed total) and store, in a worker thread."""
        if len(request.messages) > MAX_BATCH_MESSAGES:
            raise BadRequestError(
                f"{len(request.messages)} messages in one request exceed the limit {MAX_BATCH_MESSAGES}"
            )
        budget = self.config.max_body_size * 4
        msgs = []
        for m in request.messages:
            msg = convert.outgoing_message(m, min(self.config.max_body_size, budget))
            budget -= len(msg.body)
            msgs.append(msg)
        return self.broker.send_many(msgs)

    @answering(batch_pb.SendBatchResponse)
    async def SendMessages(
        self, request: batch_pb.SendBatchRequest, context: Any
    ) -> batch_pb.SendBatchResponse:
        """siftmq's batch extension: SendMessage with the messages column by column."""
        loop = asyncio.get_running_loop()
        batch = convert.outgoing_batch(request)
        results = await loop.run_in_executor(self.send_executor, self.broker.send_batch, batch)
        return batch_pb.SendBatchResponse(
            status=OK_FIELDS,
            queue_id=[r.queue_id for r in results],
            queue_offset=[r.queue_offset for r in results],
        )

    # ------------------------------------------------------------------------------------ receive

    @answering(pb.QueryAssignmentResponse)
    async def QueryAssignment(
        self, request: pb.QueryAssignmentRequest, context: Any
    ) -> pb.QueryAssignmentResponse:
        topic_name = convert.topic_name(request.topic)
        topic = await self._call(self.broker.route, topic_name)
        group = convert.topic_name(request.group)
        queue_ids = await self._call(self.broker.assignment, group, topic_name, convert.client_id_of(context))
        broker = pb.Broker(name=self.config.broker_name, id=0, endpoints=request.endpoints)
        perm = pb.Permission.READ_WRITE if topic.perm & 6 == 6 else pb.Permission.READ
        # As RocketMQ's proxy: receive (pop) consumers get one assignment per broker (queue id -1 = every
        # queue of the broker); pull consumers get their own queues.
        assignments = [
            pb.Assignment(
                message_queue=pb.MessageQueue(
                    topic=request.topic,
                    id=qid,
                    permission=perm,
                    broker=broker,
                    accept_message_types=[pb.MessageType.NORMAL],
                )
            )
            for qid in (queue_ids if queue_ids is not None else [-1])
        ]
        return pb.QueryAssignmentResponse(status=ok(), assignments=assignments)

    async def _receive(self, request: pb.ReceiveMessageRequest, context: Any) -> tuple[pb.Status, list[Any]]:
        """A receive's status and deliveries (as frames by ReceiveMessage, at once by the batch call)."""
        try:
            group = convert.topic_name(request.group)
            topic = convert.topic_name(request.message_queue.topic)
            subscription: Subscription = convert.subscription_of(topic, request.filter_expression)
            invisible = (
                convert.duration_ms(request.invisible_duration)
                if request.HasField("invisible_duration") and not request.auto_renew
                else None
            )
            hold = self._hold_s(
                request.long_polling_timeout if request.HasField("long_polling_timeout") else None, context
            )
            deliveries = await receive_long_polling(
                self.broker,
                self.notifier,
                group,
                subscription,
                queue_id=request.message_queue.id,
                batch_size=request.batch_size or 1,
                invisible_ms=invisible,
                hold_s=hold,
                client_id=convert.client_id_of(context),
                executor=self._reads_for(group, subscription.topic),
                auto_renew=request.auto_renew,
                coalescer=self._receives,
            )
        except Exception as exc:
            return status_of(exc, call="ReceiveMessage"), []
        return (
            ok() if deliveries else status(StatusCode.MESSAGE_NOT_FOUND, "no matching message")
        ), deliveries

    async def ReceiveMessage(
        self, request: pb.ReceiveMessageRequest, context: Any
    ) -> AsyncIterator[pb.ReceiveMessageResponse]:
        st, deliveries = await self._receive(request, context)
        sent = 0
        try:
            yield pb.ReceiveMessageResponse(status=st)
            topic = request.message_queue.topic
            for delivery in deliveries:
                yield pb.ReceiveMessageResponse(message=convert.delivery_fields(delivery, topic))
                sent += 1
            yield pb.ReceiveMessageResponse(delivery_timestamp=_now())
        except (asyncio.CancelledError, GeneratorExit):
            # the stream broke (the client gone, its call cancelled): the messages not written,
            # and the one being written, come back in a second, not at their invisible time
            # (renewed while the client lives, for an auto-renewing receive), as RocketMQ's proxy does;
            # so do those a front-end still held, never written (the last ones sent: after the status)
            not_taken = getattr(context, "answers_not_taken", None)
            if not_taken is not None:
                sent -= min(not_taken(), sent)
            if sent < len(deliveries):
                group = convert.topic_name(request.group)
                topic_name = convert.topic_name(request.message_queue.topic)
                give_back_later(
                    self.broker,
                    self.notifier,
                    group,
                    topic_name,
                    deliveries[sent:],
                    client_id=convert.client_id_of(context),
                    executor=self._reads_for(group, topic_name),
                )
            raise

    async def ReceiveMessages(
        self, request: pb.ReceiveMessageRequest, context: Any
    ) -> batch_pb.ReceiveBatchResponse:
        """siftmq's batch extension: ReceiveMessage's answer in one frame."""
        return batch_pb.ReceiveBatchResponse(**await self._receive_batch(request, context))

    async def _receive_batch(self, request: pb.ReceiveMessageRequest, context: Any) -> dict[str, Any]:
        """ReceiveMessages' answer as constructor arguments (so AckAndReceive builds it in place:
        a finished sub-message passed to a constructor is copied, ~1 us per message here)."""
        st, deliveries = await self._receive(request, context)
        return {
            "status": st,
            "messages": convert.message_columns([d.message for d in deliveries], deliveries),
            "delivery_timestamp": _now(),
        }

    @answering(batch_pb.AckAndReceiveResponse)
    async def AckAndReceive(
        self, request: batch_pb.AckAndReceiveRequest, context: Any
    ) -> batch_pb.AckAndReceiveResponse:
        """siftmq's batch extension: AckMessage, then ReceiveMessages when every ack succeeded."""
        acked: dict[str, Any] = {"status": OK_FIELDS}  # every entry acknowledged: no entries
        if request.ack.entries:
            top, entries = await self._ack(request.ack, context)
            if entries is not None:
                skipped = status(
                    StatusCode.BAD_REQUEST, "nothing received: an acknowledgement failed (see ack)"
                )
                return batch_pb.AckAndReceiveResponse(
                    status=top, ack={"status": top, "entries": entries}, receive={"status": skipped}
                )
        received = await self._receive_batch(request.receive, context)
        return batch_pb.AckAndReceiveResponse(status=received["status"], ack=acked, receive=received)

    @answering(pb.AckMessageResponse, on_error=_each_ack_failed)
    async def AckMessage(self, request: pb.AckMessageRequest, context: Any) -> pb.AckMessageResponse:
        top, entries = await self._ack(request, context)
        if entries is None:  # every entry acknowledged; AckMessage answers each one all the same
            entries = _ack_entries(request.entries, [OK_FIELDS] * len(request.entries))
        return pb.AckMessageResponse(status=top, entries=entries)

    async def _ack(
        self, request: pb.AckMessageRequest, context: Any
    ) -> tuple[pb.Status | dict[str, Any], list[dict[str, Any]] | None]:
        """Acknowledge an AckMessage's entries: the answer's status, and its entries (as
        constructor arguments) unless every entry was acknowledged (None)."""
        group = convert.topic_name(request.group)
        topic = convert.topic_name(request.topic)
        client_id = convert.client_id_of(context)

        if len(request.entries) > MAX_ACK_ENTRIES:
            return status(
                StatusCode.BAD_REQUEST,
                f"AckMessage has {len(request.entries)} entries; at most {MAX_ACK_ENTRIES} are taken",
            ), []
        if not request.entries:
            return status(StatusCode.BAD_REQUEST, "AckMessage has no entries"), []
        handles = [entry.receipt_handle for entry in request.entries]

        def ack_all(wait: bool) -> list[pb.Status | None] | None:  # None (an entry's): acked
            ack = self.broker.ack_many if wait else self.broker.try_ack_many
            try:
                outcomes = ack(group, topic, handles, client_id=client_id)
            except Exception as exc:
                failed = status_of(exc, call="AckMessage")
                return [failed] * len(handles)
            if outcomes is None:
                return None
            return [None if e is None else status_of(e, call="AckMessage") for e in outcomes]

        # On the event loop while no receive holds the queues' locks (a hop to a thread and back
        # costs ~75 us of CPU, more than most acks); else in one hop with the other acks of this turn
        errors = ack_all(False)
        if errors is None:
            errors = await self._acks.run(functools.partial(ack_all, True))
        assert errors is not None
        failed = [err for err in errors if err is not None]
        if not failed:
            return OK_FIELDS, None
        entries = _ack_entries(request.entries, [err or OK_FIELDS for err in errors])
        if len(failed) < len(errors):
            some = status(StatusCode.MULTIPLE_RESULTS, "some entries failed; see each entry's status")
            return some, entries
        return failed[0], entries

    @answering(pb.ChangeInvisibleDurationResponse, on_error=_same_receipt_handle)
    async def ChangeInvisibleDuration(
        self, request: pb.ChangeInvisibleDurationRequest, context: Any
    ) -> pb.ChangeInvisibleDurationResponse:
        topic = convert.topic_name(request.topic)
        invisible_ms = convert.duration_ms(request.invisible_duration)
        handle = await self._call(
            self.broker.change_invisible_duration,
            convert.topic_name(request.group),
            topic,
            request.receipt_handle,
            invisible_ms,
            client_id=convert.client_id_of(context),
        )
        self.notifier.wake_at(topic, invisible_ms / 1000)  # receives waiting already look again then
        return pb.ChangeInvisibleDurationResponse(status=ok(), receipt_handle=handle)

    @answering(pb.ForwardMessageToDeadLetterQueueResponse)
    async def ForwardMessageToDeadLetterQueue(
        self, request: pb.ForwardMessageToDeadLetterQueueRequest, context: Any
    ) -> pb.ForwardMessageToDeadLetterQueueResponse:
        await self._call(
            self.broker.forward_to_dlq,
            convert.topic_name(request.group),
            convert.topic_name(request.topic),
            request.receipt_handle,
            client_id=convert.client_id_of(context),
        )
        return pb.ForwardMessageToDeadLetterQueueResponse(status=ok())

    # ------------------------------------------------------------------------------- offset pull

    async def _pull(
        self, request: pb.PullMessageRequest, context: Any
    ) -> tuple[pb.Status, list[StoredMessage], int]:
        """A pull's status, messages and next offset (as frames by PullMessage, at once by the batch call)."""
        try:
            group = convert.topic_name(request.group)
            topic = convert.topic_name(request.message_queue.topic)
            subscription = convert.subscription_of(topic, request.filter_expression)
            hold = self._hold_s(request.long_polling_timeout, context)
            result = await pull_long_polling(
                self.broker,
                self.notifier,
                group,
                subscription,
                queue_id=request.message_queue.id,
                offset=request.offset,
                batch_size=request.batch_size or 32,
                hold_s=hold,
                client_id=convert.client_id_of(context),
                executor=self._reads_for(group, subscription.topic),
            )
        except Exception as exc:
            return status_of(exc, call="PullMessage"), [], request.offset
        if result.status == "FOUND":
            st = ok()
        elif result.status == "ILLEGAL_OFFSET":
            st = status(
                StatusCode.ILLEGAL_OFFSET,
                f"offset {request.offset} is outside {result.min_offset}.."
                f"{result.max_offset}; resume at {result.next_offset}",
            )
        else:
            st = status(
                StatusCode.MESSAGE_NOT_FOUND,
                "no matching message" if result.status == "NO_MATCHED_MESSAGE" else "no new message",
            )
        return st, result.messages, result.next_offset

    async def PullMessage(
        self, request: pb.PullMessageRequest, context: Any
    ) -> AsyncIterator[pb.PullMessageResponse]:
        st, messages, next_offset = await self._pull(request, context)
        yield pb.PullMessageResponse(status=st)
        topic = request.message_queue.topic
        for msg in messages:
            yield pb.PullMessageResponse(message=convert.message_fields(msg, topic))
        yield pb.PullMessageResponse(next_offset=next_offset)

    async def PullMessages(self, request: pb.PullMessageRequest, context: Any) -> batch_pb.PullBatchResponse:
        """siftmq's batch extension: PullMessage's answer in one frame."""
        st, messages, next_offset = await self._pull(request, context)
        return batch_pb.PullBatchResponse(
            status=st, messages=convert.message_columns(messages), next_offset=next_offset
        )

    @answering(pb.UpdateOffsetResponse)
    async def UpdateOffset(self, request: pb.UpdateOffsetRequest, context: Any) -> pb.UpdateOffsetResponse:
        await self._call(
            self.broker.update_offset,
            convert.topic_name(request.group),
            convert.topic_name(request.message_queue.topic),
            request.message_queue.id,
            request.offset,
            client_id=convert.client_id_of(context),
        )
        return pb.UpdateOffsetResponse(status=ok())

    @answering(batch_pb.UpdateOffsetsResponse)
    async def UpdateOffsets(
        self, request: batch_pb.UpdateOffsetsRequest, context: Any
    ) -> batch_pb.UpdateOffsetsResponse:
        """siftmq's batch extension: a pull consumer's commit of every queue in one call."""
        if len(request.queue_id) != len(request.offset):
            raise BadRequestError(f"{len(request.queue_id)} queue ids for {len(request.offset)} offsets")
        assigned = await self._call(
            self.broker.update_offsets,
            convert.topic_name(request.group),
            convert.topic_name(request.topic),
            list(zip(request.queue_id, request.offset, strict=True)),
            client_id=convert.client_id_of(context),
        )
        return batch_pb.UpdateOffsetsResponse(status=ok(), assigned_queue_id=assigned)

    @answering(pb.GetOffsetResponse)
    async def GetOffset(self, request: pb.GetOffsetRequest, context: Any) -> pb.GetOffsetResponse:
        offset = await self._call(
            self.broker.get_offset,
            convert.topic_name(request.group),
            convert.topic_name(request.message_queue.topic),
            request.message_queue.id,
            client_id=convert.client_id_of(context),
        )
        return pb.GetOffsetResponse(status=ok(), offset=offset)

    @answering(pb.QueryOffsetResponse)
    async def QueryOffset(self, request: pb.QueryOffsetRequest, context: Any) -> pb.QueryOffsetResponse:
        policy = convert.enum_name(pb.QueryOffsetPolicy, request.query_offset_policy, "query_offset_policy")
        ts = convert.timestamp_ms(request.timestamp) if request.HasField("timestamp") else None
        offset = await self._call(
            self.broker.query_offset,
            convert.topic_name(request.message_queue.topic),
            request.message_queue.id,
            policy,
            ts,
        )
        return pb.QueryOffsetResponse(status=ok(), offset=offset)

    # ----------------------------------------------------------------------------- not served yet

    def unsupported(self, name: str, response: type[Any], streaming: bool) -> Callable[..., Any]:
        message = f"{name} is not supported by this broker"
        code = StatusCode.UNSUPPORTED

        if streaming:

            async def stream(request: Any, context: Any) -> AsyncIterator[Any]:
                yield response(status=status(code, message))

            return stream

        async def unary(request: Any, context: Any) -> Any:
            return response(status=status(code, message))

        return unary
