"""Blocking calls to one broker for the Spark side: route, offsets, pulls, offset commits, sends.

Spark calls a data source from plain threads in several processes (the planning worker, the
long-lived streaming runner, the executors' Python workers). Each of those opens its own
:class:`BrokerGateway`, lazily, and never ships it anywhere: it owns a private asyncio event loop
and a :class:`siftmq.client.connection.Connection` (or a :class:`~siftmq.client.Producer`) created
on that loop, and runs each call to completion on it.

The gateway never sends a heartbeat or client settings as a consumer, so the broker treats its
pulls and offset commits as anonymous: no queue ownership check (``Broker._check_owner`` applies to
registered PULL_CONSUMER members only), no rebalancing. ``close()`` sends NotifyClientTermination
so the broker forgets the session (and its hold on the group's subscription) at once.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Coroutine, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from siftmq.client.connection import Connection, check
from siftmq.client.model import OutgoingMessage, ReceivedMessage
from siftmq.client.producer import Producer
from siftmq.errors import RemoteError
from siftmq.protocol import rocketmq_v2_pb2 as pb
from siftmq.spark.options import ConnectionOptions

T = TypeVar("T")

_NOT_FOUND = pb.Code.MESSAGE_NOT_FOUND
_ILLEGAL_OFFSET = pb.Code.ILLEGAL_OFFSET
_OK = pb.Code.OK


@dataclass(slots=True)
class Pulled:
    """One PullMessage answer: ``status`` is FOUND, NOT_FOUND or ILLEGAL_OFFSET."""

    status: str
    messages: list[ReceivedMessage] = field(default_factory=list)
    next_offset: int = 0
    detail: str = ""


class BrokerGateway:
    """Synchronous broker calls over a private event loop (one per process that needs one)."""

    def __init__(
        self, endpoint: str, *, timeout: float = 30.0, connection: ConnectionOptions | None = None
    ) -> None:
        self.endpoint = endpoint
        self.timeout = timeout
        self._client_options = (connection or ConnectionOptions()).client_options()
        self._loop = asyncio.new_event_loop()
        self._producer: Producer | None = None

        async def connect() -> Connection:  # grpc.aio channels belong to the loop they are made on
            return Connection(endpoint, request_timeout=timeout, **self._client_options)

        self._conn: Connection = self._loop.run_until_complete(connect())
        self._used = False  # a session exists on the broker only after a call

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        self._used = True
        return self._loop.run_until_complete(coro)

    def __enter__(self) -> BrokerGateway:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._loop.is_closed():
            return

        async def shutdown() -> None:
            if self._producer is not None:
                with contextlib.suppress(RemoteError):
                    await self._producer.stop()
            if used:
                with contextlib.suppress(RemoteError):
                    await self._conn.unary(
                        "NotifyClientTermination", pb.NotifyClientTerminationRequest(), timeout=5.0
                    )
            await self._conn.close()

        used = self._used
        try:
            self._run(shutdown())
        finally:
            self._loop.close()

    # ------------------------------------------------------------------------------------ topics

    def _queue(self, topic: str, queue_id: int) -> pb.MessageQueue:
        return pb.MessageQueue(topic=self._conn.resource(topic), id=queue_id)

    def queue_count(self, topic: str) -> int:
        """The topic's number of queues (QueryRoute; a broker with auto-creation creates the topic)."""
        request = pb.QueryRouteRequest(topic=self._conn.resource(topic), endpoints=self._conn.endpoints())
        response = self._run(self._conn.unary("QueryRoute", request))
        ids = [q.id for q in response.message_queues if q.id >= 0]
        return max(ids) + 1 if ids else 0

    def offsets(self, topic: str, queues: Iterable[int], policy: str) -> dict[int, int]:
        """``BEGINNING`` (min) or ``END`` (max) offset of each queue, asked concurrently."""
        qids = list(queues)
        kind: Any = pb.QueryOffsetPolicy.Value(policy)

        async def one(qid: int) -> int:
            request = pb.QueryOffsetRequest(message_queue=self._queue(topic, qid), query_offset_policy=kind)
            return int((await self._conn.unary("QueryOffset", request)).offset)

        async def all_() -> list[int]:
            return list(await asyncio.gather(*(one(q) for q in qids)))

        return dict(zip(qids, self._run(all_()), strict=True))

    def committed(self, group: str, topic: str, queues: Iterable[int]) -> dict[int, int | None]:
        """The group's committed offset of each queue (None where it has none)."""
        qids = list(queues)

        async def one(qid: int) -> int | None:
            request = pb.GetOffsetRequest(
                group=self._conn.resource(group), message_queue=self._queue(topic, qid)
            )
            try:
                return int((await self._conn.unary("GetOffset", request)).offset)
            except RemoteError as exc:
                if exc.status == "OFFSET_NOT_FOUND":
                    return None
                raise

        async def all_() -> list[int | None]:
            return list(await asyncio.gather(*(one(q) for q in qids)))

        return dict(zip(qids, self._run(all_()), strict=True))

    def commit(self, group: str, topic: str, offsets: dict[int, int]) -> None:
        """Store the group's offsets (UpdateOffset; the next offset to read, per queue)."""

        async def one(qid: int, offset: int) -> None:
            request = pb.UpdateOffsetRequest(
                group=self._conn.resource(group), message_queue=self._queue(topic, qid), offset=offset
            )
            await self._conn.unary("UpdateOffset", request)

        async def all_() -> None:
            await asyncio.gather(*(one(q, o) for q, o in offsets.items()))

        self._run(all_())

    # -------------------------------------------------------------------------------------- pull

    def pull(
        self,
        group: str,
        topic: str,
        queue_id: int,
        offset: int,
        *,
        batch_size: int,
        filter_kind: str,
        expression: str,
    ) -> Pulled:
        """One offset pull without long polling."""
        kind = pb.FilterType.SQL if filter_kind == "SQL92" else pb.FilterType.TAG
        request = pb.PullMessageRequest(
            group=self._conn.resource(group),
            message_queue=self._queue(topic, queue_id),
            offset=offset,
            batch_size=batch_size,
            filter_expression=pb.FilterExpression(type=kind, expression=expression),
        )
        # one frame through siftmq's batch extension when the broker offers it
        answer = self._run(self._conn.pull(request, timeout=self.timeout))
        out = Pulled("NOT_FOUND", list(answer.messages), offset)
        if answer.status is not None:
            code = answer.status.code
            if code == _OK:
                out.status = "FOUND"
            elif code == _ILLEGAL_OFFSET:
                out.status, out.detail = "ILLEGAL_OFFSET", answer.status.message
            elif code != _NOT_FOUND:
                check("PullMessage", answer.status)
        if answer.next_offset is not None:
            out.next_offset = int(answer.next_offset)
        return out

    # -------------------------------------------------------------------------------------- send

    def send(self, messages: Sequence[OutgoingMessage]) -> int:
        """Send one batch of one topic (retried by the producer); returns how many were sent."""

        async def go() -> int:
            if self._producer is None:
                producer = Producer(self.endpoint, request_timeout=self.timeout, **self._client_options)
                await producer.start()
                self._producer = producer
            return len(await self._producer.send_many(messages))

        # not _run: the producer has its own session on the broker and ends it itself
        return self._loop.run_until_complete(go())
