"""The core process's side of the front-ends' Unix socket: each CALL frame runs the same handler
stack a gRPC call does in a single process (decoding guard, authentication and authorization,
:class:`~siftmq.server.service.MessagingService`), with a context made of what the front-end sent.

With authentication on, the front-ends hold the users' secrets (a USERS frame, sent again whenever
the table changes) and refuse a bad signature themselves, reporting it here (REFUSED) for the
metrics and the audit log, together every 0.1 s at most: a flood of unauthenticated calls costs
the core next to nothing. A call they pass on names its signer and the table it was checked
against; authorization stays here, with the state it needs.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import hmac
import logging
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import grpc

from siftmq.auth.signature import REASONS
from siftmq.frontend import frames
from siftmq.frontend.edge import ALL_RPCS
from siftmq.protocol.service import Rpc
from siftmq.server.auth import Gate, printable

_log = logging.getLogger(__name__)

#: How long a live change of the users waits for the front-ends to take it.
USERS_DELIVERY_S = 2.0


@dataclass(frozen=True, slots=True)
class Behaviour:
    """What a call of one RPC runs: the handler stack, and how its messages are read and written."""

    rpc: Rpc
    run: Callable[..., Any]
    deserialize: Callable[[bytes], Any]
    serialize: Callable[[Any], bytes]


class Aborted(Exception):
    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(details)
        self.code = code
        self.details = details


class CallContext:
    """The parts of ``grpc.aio.ServicerContext`` the handlers use, from the CALL frame."""

    __slots__ = (
        "_deadline", "_header_count", "_headers", "_metadata", "_peer", "answers_not_taken", "signed_by",
    )  # fmt: skip

    def __init__(self, call: frames.Call) -> None:
        # decoded when first asked for: a send's handlers never ask (with authentication on, the
        # front-end's claim stands in for the signature headers)
        self._headers = call.headers
        self._header_count = call.header_count
        self._metadata: tuple[tuple[str, str | bytes], ...] | None = None
        self._peer = call.peer
        # the front-end's clock is this one (CLOCK_MONOTONIC is the host's)
        self._deadline = None if call.deadline_ms < 0 else call.deadline_ms / 1000
        #: who signed the call and the users' generation the front-end checked it against
        self.signed_by = (call.signed_by, call.generation) if call.signed_by else None
        #: (a stream) how many of its answers sent the front-end holds still, never handed to the
        #: client: a receive cut short gives back their messages too (see ``ReceiveMessage``)
        self.answers_not_taken: Callable[[], int] = _none

    def invocation_metadata(self) -> tuple[tuple[str, str | bytes], ...]:
        if self._metadata is None:
            self._metadata = frames.decode_headers(self._headers, self._header_count)
        return self._metadata

    def peer(self) -> str:
        return self._peer

    def time_remaining(self) -> float | None:
        return None if self._deadline is None else max(0.0, self._deadline - time.monotonic())

    async def abort(self, code: grpc.StatusCode, details: str = "") -> None:
        raise Aborted(code, details)


def _none() -> int:
    return 0


class _Requests:
    """A client stream's requests as the handler iterates them (fed by MESSAGE frames). Each one
    taken gives the front-end a CREDIT for the next, so at most a few wait here (gRPC's flow
    control, carried over); a front-end that sends more breaks the protocol."""

    def __init__(self, deserialize: Callable[[bytes], Any], taken: Callable[[], None]) -> None:
        self._deserialize = deserialize
        self._taken = taken
        self._queue: asyncio.Queue[bytes | None] = asyncio.Queue()

    def put(self, payload: bytes | None) -> None:
        if payload is not None and self._queue.qsize() > frames.STREAM_CREDIT:
            raise frames.FrameError("a client stream's requests beyond the credit the core gave")
        self._queue.put_nowait(payload)

    def __aiter__(self) -> AsyncIterator[Any]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[Any]:
        while (payload := await self._queue.get()) is not None:
            self._taken()
            yield self._deserialize(payload)


class _AnswerCredit:
    """A stream's answers sent and not yet handed to its client (TAKEN frames, in order): at most
    :data:`~siftmq.frontend.frames.ANSWER_CREDIT` of them and
    :data:`~siftmq.frontend.frames.ANSWER_CREDIT_BYTES` (one answer at least, however large), so
    that a client that does not read holds its call, not a front-end's memory."""

    __slots__ = ("_changed", "_sizes", "_waiting")

    def __init__(self) -> None:
        self._sizes: collections.deque[int] = collections.deque()
        self._waiting = 0  # bytes in _sizes
        self._changed = asyncio.Event()

    async def acquire(self, size: int) -> None:
        while self._sizes and (
            len(self._sizes) >= frames.ANSWER_CREDIT or self._waiting + size > frames.ANSWER_CREDIT_BYTES
        ):
            self._changed.clear()
            await self._changed.wait()
        self._sizes.append(size)
        self._waiting += size

    def waiting(self) -> int:
        """Answers sent and not yet handed to the client."""
        return len(self._sizes)

    def release(self) -> None:
        if not self._sizes:
            raise frames.FrameError("a TAKEN frame for an answer the core did not send")
        self._waiting -= self._sizes.popleft()
        self._changed.set()


class FrontEndConnection:
    """One front-end's connection: its calls, each an asyncio task on the core's loop."""

    def __init__(
        self, table: Sequence[Behaviour | None], token: bytes, max_frame: int, links: CoreLink
    ) -> None:
        self._max_reply = max_frame - frames.CALL_ROOM
        self._table = table
        self._token = token
        self._links = links
        self._hello = False
        self._tasks: dict[int, asyncio.Task[None]] = {}
        self._streams: dict[int, _Requests] = {}
        self._answer_credit: dict[int, _AnswerCredit] = {}  # per streaming call
        self.users_generation = 0  # the users table this front-end said it checks against
        self.protocol = frames.FrameProtocol(self._on_frame, self._on_lost, max_frame)
        self.protocol.on_resumed = functools.partial(links.resumed, self)

    def _on_frame(self, kind: int, call_id: int, payload: bytes) -> None:
        if not self._hello:
            if kind != frames.HELLO or not hmac.compare_digest(payload, self._token):
                raise frames.FrameError("a connection did not open with the front-ends' token")
            self._hello = True
            self._links.joined(self)
            return
        if kind == frames.CALL:
            self._open(call_id, payload)
        elif kind == frames.MESSAGE:
            stream = self._streams.get(call_id)
            if stream is not None:
                stream.put(payload)
        elif kind == frames.HALF_CLOSE:
            stream = self._streams.get(call_id)
            if stream is not None:
                stream.put(None)
        elif kind == frames.TAKEN:
            credit = self._answer_credit.get(call_id)
            if credit is not None:
                credit.release()
        elif kind == frames.CANCEL:
            task = self._tasks.get(call_id)
            if task is not None:
                task.cancel()
        elif kind == frames.REFUSED:
            self._links.refused(payload)
        elif kind == frames.USERS_TAKEN:
            self.users_generation = call_id
            self._links.users_taken()
        elif kind == frames.READY:
            self._links.front_end_ready(call_id)
        else:
            raise frames.FrameError(f"unknown frame kind {kind}")

    def _open(self, call_id: int, payload: bytes) -> None:
        call = frames.decode_call(payload)
        method, request = call.method, call.request
        behaviour = self._table[method] if method < len(self._table) else None
        if behaviour is None:
            self.protocol.send(
                frames.ABORT,
                call_id,
                frames.encode_abort(grpc.StatusCode.UNIMPLEMENTED.value[0], "method not served"),
            )
            return
        context = CallContext(call)
        shape = behaviour.rpc.shape
        if shape == "unary_unary":
            work = self._unary(call_id, behaviour, behaviour.deserialize(request), context)
        elif shape == "unary_stream":
            work = self._stream(call_id, behaviour, behaviour.deserialize(request), context)
        else:
            taken = functools.partial(self.protocol.send, frames.CREDIT, call_id)
            requests = self._streams[call_id] = _Requests(behaviour.deserialize, taken)
            work = self._stream(call_id, behaviour, requests, context)
        task = asyncio.get_running_loop().create_task(work)
        self._tasks[call_id] = task
        task.add_done_callback(lambda _: self._ended(call_id))

    def _ended(self, call_id: int) -> None:
        self._tasks.pop(call_id, None)
        self._streams.pop(call_id, None)
        self._answer_credit.pop(call_id, None)

    async def _unary(self, call_id: int, behaviour: Behaviour, request: Any, context: CallContext) -> None:
        try:
            answer = await behaviour.run(request, context)
            self._reply(call_id, behaviour.serialize(answer))
        except (Exception, asyncio.CancelledError) as exc:
            self._abort(call_id, behaviour, exc)

    async def _stream(self, call_id: int, behaviour: Behaviour, request: Any, context: CallContext) -> None:
        credit = self._answer_credit[call_id] = _AnswerCredit()
        context.answers_not_taken = credit.waiting
        try:
            async for answer in behaviour.run(request, context):
                payload = behaviour.serialize(answer)
                # as a gRPC handler's yield waits while its client does not read
                await credit.acquire(len(payload))
                self._reply(call_id, payload)
            self.protocol.send(frames.END, call_id)
        except (Exception, asyncio.CancelledError) as exc:
            self._abort(call_id, behaviour, exc)

    def _reply(self, call_id: int, answer: bytes) -> None:
        if len(answer) > self._max_reply:  # what gRPC refuses to send, refused for this call only
            raise Aborted(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"the answer ({len(answer)} bytes) exceeds the largest message ({self._max_reply} bytes)",
            )
        self.protocol.send(frames.REPLY, call_id, answer)

    def _abort(self, call_id: int, behaviour: Behaviour, exc: BaseException) -> None:
        """End the call with the status a gRPC server answers for ``exc``."""
        if isinstance(exc, asyncio.CancelledError):
            if _cancelled_from_outside():  # a CANCEL, or the link went: nobody waits for an answer
                raise exc
            # raised inside the handler (a future cancelled under it): gRPC answers CANCELLED
            code, details = grpc.StatusCode.CANCELLED, "the call was cancelled in the broker"
        elif isinstance(exc, Aborted):
            code, details = exc.code, exc.details
        else:  # what grpc answers for a handler's unexpected exception, logged here as there
            _log.exception("%s failed", behaviour.rpc.name, exc_info=exc)
            code, details = grpc.StatusCode.UNKNOWN, f"Unexpected error in {behaviour.rpc.name}"
        self.protocol.send(frames.ABORT, call_id, frames.encode_abort(code.value[0], details))

    def _on_lost(self, exc: Exception | None) -> None:
        self._links.left(self)
        for task in list(self._tasks.values()):
            task.cancel()  # the front-end is gone and so are its clients' calls


def _cancelled_from_outside() -> bool:
    """Whether the running task was cancelled by a ``cancel()`` (not by a CancelledError raised
    inside it)."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


class CoreLink:
    """The Unix socket the front-ends connect to."""

    def __init__(
        self, table: Sequence[Behaviour | None], token: bytes, max_frame: int, gate: Gate | None = None
    ) -> None:
        self._table = table
        self._token = token
        self._max_frame = max_frame
        self._server: asyncio.AbstractServer | None = None
        self._readied = asyncio.Event()
        self.ready_count = 0
        #: the front-ends (by index) that said they listen: the one that exits is taken out by
        #: whoever starts it again
        self.listening: set[int] = set()
        self._connections: set[FrontEndConnection] = set()
        # with authentication on, the front-ends check signatures against the users in force
        self._gate = gate if gate is not None and gate.authenticate else None
        self._users_news = asyncio.Event()  # a front-end confirmed a users table, or left
        self._users_owed: set[FrontEndConnection] = set()  # not reading when the table changed
        if self._gate is not None:
            self._gate.on_change.append(self._users_changed)
            self._gate.delivered = self.users_delivered

    @property
    def connected(self) -> int:
        """Front-ends connected now (that said the token)."""
        return len(self._connections)

    def joined(self, connection: FrontEndConnection) -> None:
        """A front-end said the token: it gets the users before anything else."""
        self._connections.add(connection)
        if self._gate is not None:
            connection.protocol.send(frames.USERS, 0, self._users())

    def left(self, connection: FrontEndConnection) -> None:
        self._connections.discard(connection)
        self._users_owed.discard(connection)
        self._users_news.set()  # a change waiting for it waits no more

    def _users(self) -> bytes:
        assert self._gate is not None
        gate = self._gate
        return frames.encode_users(
            gate.generation, gate.skew_s, gate.secrets(), local_time=gate.local_time, stale=gate.stale
        )

    def _users_changed(self) -> None:
        payload = self._users()
        for connection in self._connections:
            if connection.protocol.writing_paused:
                # a front-end that does not read (stopped, or its loop blocked) gets the table in
                # force once it does, not every one made meanwhile (up to ~20 MB each)
                self._users_owed.add(connection)
            else:
                connection.protocol.send(frames.USERS, 0, payload)

    def resumed(self, connection: FrontEndConnection) -> None:
        """``connection`` takes writes again: the users table it missed, if any."""
        if connection in self._users_owed:
            self._users_owed.discard(connection)
            connection.protocol.send(frames.USERS, 0, self._users())

    def users_taken(self) -> None:
        self._users_news.set()

    async def users_delivered(self) -> None:
        """Until every connected front-end checks signatures against the users in force (a live
        change answers after this); one that has not said so in :data:`USERS_DELIVERY_S` is logged."""
        assert self._gate is not None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + USERS_DELIVERY_S
        while lagging := [c for c in self._connections if c.users_generation != self._gate.generation]:
            if loop.time() >= deadline:
                _log.warning(
                    "%d front-end(s) have not taken users table %d in %.0f s; they check calls against "
                    "an older one until they do",
                    len(lagging),
                    self._gate.generation,
                    USERS_DELIVERY_S,
                )
                return
            self._users_news.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._users_news.wait(), deadline - loop.time())

    def refused(self, payload: bytes) -> None:
        """A front-end refused calls unauthenticated: counted and audited as if refused here."""
        if self._gate is None:
            raise frames.FrameError("a REFUSED frame with authentication off")
        for method, reason, *texts, count in frames.decode_refused(payload):
            if not 0 <= method < len(ALL_RPCS):
                raise frames.FrameError(f"a REFUSED frame names method {method}")
            known = reason if reason in REASONS else "malformed"  # the metric's labels stay few
            # the log is the core's: a front-end's text is filtered as a client's is in one process
            peer, client, message = (printable(text, frames.MAX_REFUSED_FIELD) for text in texts)
            self._gate.failed(ALL_RPCS[method].name, peer, client, known, message, count=count)

    async def start(self, path: str) -> None:
        """Listen on ``path`` (again: a new path replaces the old; connections made stay open)."""
        loop = asyncio.get_running_loop()
        server = await loop.create_unix_server(
            lambda: FrontEndConnection(self._table, self._token, self._max_frame, self).protocol, path
        )
        if self._server is not None:
            self._server.close()
        self._server = server

    def front_end_ready(self, index: int) -> None:
        """Front-end ``index`` listens."""
        self.ready_count += 1
        self.listening.add(index)
        self._readied.set()

    async def wait_ready(self, count: int) -> None:
        """Until ``count`` front-ends have said they listen (restarted ones count again)."""
        while self.ready_count < count:
            self._readied.clear()
            await self._readied.wait()

    async def stop(self) -> None:
        if self._gate is not None:
            self._gate.on_change.remove(self._users_changed)
            if self._gate.delivered == self.users_delivered:
                self._gate.delivered = None
        if self._server is not None:
            self._server.close()


def behaviour_table(behaviours: dict[str, Behaviour]) -> list[Behaviour | None]:
    """The behaviours in the order of the front-ends' method indexes (None: not served here)."""
    return [behaviours.get(rpc.path) for rpc in ALL_RPCS]
