"""A front-end process: it terminates gRPC (HTTP/2, TLS, the per-call machinery that is most of
a call's CPU) and passes every call to the core process as frames, without decoding it.

``siftmq broker --workers N`` runs N of these on one port (``SO_REUSEPORT``: the kernel spreads
the clients' connections over them). With authentication on, a front-end checks each call's
signature against the users the core sent it and answers a bad one itself (``UNAUTHORIZED``,
reported to the core for its metrics and audit log), so unauthenticated calls cost the one core
process nothing but a small frame; the core decodes, authorizes and answers the rest, so there is
one table of users and one state. A front-end holds no state worth keeping: when it dies its
clients reconnect to another, and the core starts a new one. It dies with the core.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import sys
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from pathlib import Path
from typing import Any, Final, TypeVar

import grpc

from siftmq.auth.signature import SignatureError, Verifier, peer_address, signature_headers
from siftmq.frontend import frames
from siftmq.frontend.limits import server_options
from siftmq.process_tuning import tune_gc
from siftmq.protocol import rocketmq_v2_pb2 as pb
from siftmq.protocol.service import BATCH_RPCS, BATCH_SERVICE_NAME, RPCS, SERVICE_NAME, Rpc

_log = logging.getLogger("siftmq.frontend")

TOKEN_ENV: Final = "SIFTMQ_FRONTEND_TOKEN"
#: The exit code of a front-end that could not listen on the broker's address (the core tells it
#: from a crash: see ``server/front_ends.py``).
EXIT_CANNOT_LISTEN: Final = 3
SHUTDOWN_GRACE_S: Final = 3.0
CORE_GONE_GRACE_S: Final = 0.5
#: Every RPC a front-end may pass on, in one order both processes share (a CALL names its index).
ALL_RPCS: Final[tuple[Rpc, ...]] = RPCS + BATCH_RPCS
_CODES: Final = {code.value[0]: code for code in grpc.StatusCode}
PR_SET_PDEATHSIG: Final = 1
MAX_STATUS_MESSAGE: Final = 4096
MAX_CLIENT_ID: Final = 128  # characters of a refused call's client id reported to the core
#: Refusals are reported to the core together, at most this often: under a flood of bad
#: signatures the core reads one small frame per interval, not one per call.
REPORT_INTERVAL_S: Final = 0.1
_T = TypeVar("_T")
Metadata = list[tuple[str, str | bytes]]
Signed = tuple[Metadata, str]
"""A call's metadata, and who signed it ("" when not checked)."""


def tls_credentials(cert_file: str, key_file: str, client_ca_file: str = "") -> grpc.ServerCredentials:
    """The server's TLS credentials from PEM files (OSError when one cannot be read)."""
    key = Path(key_file).read_bytes()
    cert = Path(cert_file).read_bytes()
    client_ca = Path(client_ca_file).read_bytes() if client_ca_file else None
    return grpc.ssl_server_credentials(
        [(key, cert)], root_certificates=client_ca, require_client_auth=client_ca is not None
    )


class _CoreGone(Exception):
    pass


class _TooLarge(Exception):
    """A call the core could not take in one frame: refused alone, before it has an id."""


class Link:
    """The front-end's side of the socket: numbered calls out, their answers back."""

    def __init__(self, max_frame: int, max_call: int) -> None:
        self.max_frame = max_frame
        #: the largest CALL payload the core takes: a larger frame would break the link, and with
        #: it every other call this front-end has open
        self.max_call = max_call
        self.protocol: frames.FrameProtocol | None = None
        self._next_id = 0
        # where each open call's frames go: a unary call's future, or a stream's queue
        self._calls: dict[int, Callable[[tuple[int, bytes]], None]] = {}
        # a client stream's requests the core has room for (CREDIT frames add to it)
        self.credits: dict[int, asyncio.Semaphore] = {}
        self.lost = asyncio.Event()
        # with authentication on: the users' secrets the core sent, and which table they are
        self.verifier: Verifier | None = None
        self.generation = 0
        # refusals not yet reported, by (method, reason, client, answer): [first address, count]
        self._refusals: dict[tuple[int, str, str, str], list[Any]] = {}

    async def connect(self, path: str, token: bytes) -> None:
        loop = asyncio.get_running_loop()
        _, protocol = await loop.create_unix_connection(
            lambda: frames.FrameProtocol(self._on_frame, self._on_lost, self.max_frame), path
        )
        self.protocol = protocol
        protocol.send(frames.HELLO, 0, token)

    def _on_frame(self, kind: int, call_id: int, payload: bytes) -> None:
        if kind == frames.USERS:
            users = frames.decode_users(payload)
            self.generation = users.generation
            self.verifier = Verifier(
                users.secrets, users.skew_s, local_time=users.local_time, stale=users.stale
            )
            self.send(frames.USERS_TAKEN, self.generation)  # a live change answers after this
            return
        if kind == frames.CREDIT:
            credit = self.credits.get(call_id)
            if credit is not None:
                credit.release()
            return
        deliver = self._calls.get(call_id)
        if deliver is not None:  # answers to calls already given up on are dropped
            deliver((kind, payload))

    def _on_lost(self, exc: Exception | None) -> None:
        self.lost.set()
        code = grpc.StatusCode.UNAVAILABLE.value[0]
        gone = (frames.ABORT, frames.encode_abort(code, "the broker's core went away"))
        for deliver in list(self._calls.values()):
            deliver(gone)

    def signer(self, method: int, context: grpc.aio.ServicerContext[Any, Any], metadata: Metadata) -> str:
        """Who signed the call ("" with authentication off); raises :class:`SignatureError` after
        reporting the refusal to the core."""
        if self.verifier is None:
            return ""
        try:
            return self.verifier.who(*signature_headers(metadata), peer_address(str(context.peer() or "")))
        except SignatureError as exc:
            client = next((str(v) for k, v in metadata if k == "x-mq-client-id"), "-")[:MAX_CLIENT_ID]
            self._refused((method, exc.reason, client, str(exc)), str(context.peer() or ""))
            raise

    def _refused(self, key: tuple[int, str, str, str], peer: str) -> None:
        refusals = self._refusals
        if not refusals:
            asyncio.get_running_loop().call_later(REPORT_INTERVAL_S, self._report)
        entry = refusals.get(key)
        if entry is None:
            if len(refusals) >= frames.MAX_REFUSED_ENTRIES:  # many clients: counted without their ids
                key = (key[0], key[1], "-", key[3])
                entry = refusals.setdefault(key, [peer, 0])
            else:
                entry = refusals[key] = [peer, 0]
        entry[1] += 1

    def report_refusals(self) -> None:
        """Report the refusals not yet reported now (before this process stops)."""
        if self._refusals:
            self._report()

    def _report(self) -> None:
        refusals, self._refusals = self._refusals, {}
        entries = [
            (method, reason, peer, client, answer, count)
            for (method, reason, client, answer), (peer, count) in refusals.items()
        ]
        for at in range(0, len(entries), frames.MAX_REFUSED_ENTRIES):
            chunk = entries[at : at + frames.MAX_REFUSED_ENTRIES]
            self.send(frames.REFUSED, 0, frames.encode_refused(chunk))

    def open_unary(
        self, method: int, context: grpc.aio.ServicerContext[Any, Any], request: bytes, signed: Signed
    ) -> tuple[int, asyncio.Future[tuple[int, bytes]]]:
        """A unary call: its one answer (REPLY or ABORT) completes the future."""
        answer: asyncio.Future[tuple[int, bytes]] = asyncio.get_running_loop().create_future()

        def deliver(frame: tuple[int, bytes]) -> None:
            if not answer.done():
                answer.set_result(frame)

        return self._open(method, context, request, signed, deliver), answer

    def open_stream(
        self, method: int, context: grpc.aio.ServicerContext[Any, Any], request: bytes, signed: Signed
    ) -> tuple[int, asyncio.Queue[tuple[int, bytes]]]:
        """A streaming call: its REPLY frames, then END or ABORT, in order on the queue."""
        frames_in: asyncio.Queue[tuple[int, bytes]] = asyncio.Queue()
        return self._open(method, context, request, signed, frames_in.put_nowait), frames_in

    def _open(
        self,
        method: int,
        context: grpc.aio.ServicerContext[Any, Any],
        request: bytes,
        signed: Signed,
        deliver: Callable[[tuple[int, bytes]], None],
    ) -> int:
        if self.protocol is None or self.lost.is_set():
            raise _CoreGone
        remaining = context.time_remaining()
        deadline_ms = -1 if remaining is None else int((time.monotonic() + remaining) * 1000)
        metadata, signed_by = signed
        try:
            # self.generation is the table the signer was checked against: nothing ran in between
            call = frames.encode_call(
                method,
                deadline_ms,
                str(context.peer() or ""),
                metadata,
                request,
                signed_by=signed_by,
                generation=self.generation if signed_by else 0,
            )
        except frames.FrameError as exc:  # more metadata entries, or a longer key, than a frame holds
            raise _TooLarge(str(exc)) from None
        if len(call) > self.max_call:
            raise _TooLarge(
                f"the call's request and metadata ({len(call)} bytes) exceed what the broker takes "
                f"({self.max_call} bytes)"
            )
        call_id = self._new_id()
        self._calls[call_id] = deliver
        self.protocol.send(frames.CALL, call_id, call)
        return call_id

    def _new_id(self) -> int:
        """The next call id: 1 to 2**32 - 1 (a frame holds 32 bits) and round again, past the ids of
        calls still open (a long poll may outlive four billion calls after it)."""
        while True:
            self._next_id = self._next_id % frames.MAX_CALL_ID + 1
            if self._next_id not in self._calls:
                return self._next_id

    def send(self, kind: int, call_id: int, payload: bytes = b"") -> None:
        if self.protocol is not None:
            self.protocol.send(kind, call_id, payload)

    def close(self, call_id: int, *, cancelled: bool) -> None:
        self.credits.pop(call_id, None)
        if self._calls.pop(call_id, None) is not None and cancelled:
            self.send(frames.CANCEL, call_id)


async def _abort(context: grpc.aio.ServicerContext[Any, Any], payload: bytes) -> None:
    code, details = frames.decode_abort(payload)
    await context.abort(_CODES.get(code, grpc.StatusCode.UNKNOWN), details)


def _metadata(context: grpc.aio.ServicerContext[Any, Any]) -> Metadata:
    return [(m.key, m.value) for m in context.invocation_metadata() or ()]


def _refusal(rpc: Rpc, exc: SignatureError) -> bytes:
    """``rpc``'s answer refusing an unauthenticated call, as the core's gate answers it."""
    st = pb.Status(code=pb.Code.UNAUTHORIZED, message=f"{rpc.name}: {exc}"[:MAX_STATUS_MESSAGE])
    return rpc.status_answer(st).SerializeToString()


def _handler(link: Link, index: int, rpc: Rpc) -> grpc.RpcMethodHandler:
    """The method's handler: bytes in, bytes out (no serializers: the core decodes and encodes).
    A call's signature is checked when it opens (a Telemetry stream's once), before anything of it
    reaches the core."""

    def checked(context: grpc.aio.ServicerContext[Any, Any]) -> Signed | bytes:
        """The call's metadata and signer, or the answer refusing it unauthenticated."""
        metadata = _metadata(context)
        try:
            return metadata, link.signer(index, context, metadata)
        except SignatureError as exc:
            return _refusal(rpc, exc)

    async def unary(request: bytes, context: grpc.aio.ServicerContext[Any, Any]) -> bytes:
        signed = checked(context)
        if isinstance(signed, bytes):
            return signed
        call_id, answer = await _opened(link.open_unary, index, context, request, signed)
        done = False
        try:
            kind, payload = await answer
            done = True
        finally:
            link.close(call_id, cancelled=not done)
        if kind != frames.REPLY:
            await _abort(context, payload)
        return payload

    async def answers(
        call_id: int, frames_in: asyncio.Queue[tuple[int, bytes]], context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncGenerator[bytes, None]:
        done = False
        try:
            while True:
                kind, payload = await frames_in.get()
                if kind != frames.REPLY:
                    done = True
                    break
                yield payload  # resumes once gRPC's flow control let the answer go to the client
                link.send(frames.TAKEN, call_id)
        finally:
            link.close(call_id, cancelled=not done)
        if kind == frames.ABORT:
            await _abort(context, payload)

    async def server_stream(
        request: bytes, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[bytes]:
        signed = checked(context)
        if isinstance(signed, bytes):
            yield signed
            return
        call_id, frames_in = await _opened(link.open_stream, index, context, request, signed)
        # closed at once when the client goes (not when collected): the core hears CANCEL now
        async with contextlib.aclosing(answers(call_id, frames_in, context)) as stream:
            async for answer in stream:
                yield answer

    async def bidi(
        requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[bytes]:
        signed = checked(context)
        if isinstance(signed, bytes):
            yield signed
            return
        call_id, frames_in = await _opened(link.open_stream, index, context, b"", signed)
        # gRPC's flow control, carried over: the next request is read from the client only when
        # the core has room for it (one process reads a request when the handler asks for one)
        credit = link.credits[call_id] = asyncio.Semaphore(frames.STREAM_CREDIT)

        async def pump() -> None:
            try:
                async for request in requests:
                    link.send(frames.MESSAGE, call_id, request)
                    await credit.acquire()
            except (grpc.RpcError, asyncio.CancelledError):
                return  # the client went away: the call is cancelled when the answers stop
            link.send(frames.HALF_CLOSE, call_id)

        sending = asyncio.create_task(pump())
        try:
            async with contextlib.aclosing(answers(call_id, frames_in, context)) as stream:
                async for answer in stream:
                    yield answer
        finally:
            sending.cancel()

    make = {
        "unary_unary": (grpc.unary_unary_rpc_method_handler, unary),
        "unary_stream": (grpc.unary_stream_rpc_method_handler, server_stream),
        "stream_stream": (grpc.stream_stream_rpc_method_handler, bidi),
    }
    wrap, behaviour = make[rpc.shape]
    return wrap(behaviour)


async def _opened(
    open_call: Callable[..., _T],
    index: int,
    context: grpc.aio.ServicerContext[Any, Any],
    request: bytes,
    signed: Signed,
) -> _T:
    try:
        return open_call(index, context, request, signed)
    except _CoreGone:
        # the core is gone: this process exits soon, and the client retries on another
        await context.abort(grpc.StatusCode.UNAVAILABLE, "the broker is restarting")
        raise
    except _TooLarge as exc:
        await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc))
        raise


def handlers(link: Link, *, batch_extension: bool) -> tuple[grpc.GenericRpcHandler, ...]:
    by_service: dict[str, dict[str, grpc.RpcMethodHandler]] = {SERVICE_NAME: {}}
    if batch_extension:
        by_service[BATCH_SERVICE_NAME] = {}
    for index, rpc in enumerate(ALL_RPCS):
        if rpc.service in by_service:
            by_service[rpc.service][rpc.name] = _handler(link, index, rpc)
    return tuple(grpc.method_handlers_generic_handler(name, table) for name, table in by_service.items())


def _die_with_parent() -> None:
    """The kernel sends SIGTERM to this process when the core dies, however it dies."""
    with contextlib.suppress(OSError, AttributeError):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)


async def serve(args: argparse.Namespace) -> int:
    max_call = args.frame_limit + frames.CALL_ROOM  # what the core's side of the link takes
    link = Link(max(max_call, frames.MAX_FROM_CORE), max_call)
    await link.connect(args.socket, os.environ.get(TOKEN_ENV, "").encode())
    # the front-ends share the port (SO_REUSEPORT); the core checked it was free
    server = grpc.aio.server(
        options=server_options(args.frame_limit, args.max_connections, args.max_streams, reuse_port=True)
    )
    server.add_generic_rpc_handlers(handlers(link, batch_extension=args.batch_extension))
    try:
        if args.tls_cert:
            port = server.add_secure_port(
                args.listen, tls_credentials(args.tls_cert, args.tls_key, args.tls_client_ca)
            )
        else:
            port = server.add_insecure_port(args.listen)
    except (RuntimeError, OSError) as exc:
        _log.error("front-end %s cannot listen on %s: %s", args.index, args.listen, exc)
        return EXIT_CANNOT_LISTEN
    if port == 0:
        _log.error("front-end %s cannot listen on %s", args.index, args.listen)
        return EXIT_CANNOT_LISTEN
    await server.start()
    link.send(frames.READY, int(args.index))  # which one listens: the core tells when none does
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    lost = asyncio.create_task(link.lost.wait())
    stopping = asyncio.create_task(stop.wait())
    await asyncio.wait([lost, stopping], return_when=asyncio.FIRST_COMPLETED)
    core_gone = link.lost.is_set()
    if core_gone:
        _log.error("front-end %s: the core process went away; stopping", args.index)
    # with the core gone every open call has its UNAVAILABLE answer; a short grace lets the handlers
    # send it (a stop without one cancels them, and their clients read CANCELLED: not retryable)
    await server.stop(CORE_GONE_GRACE_S if core_gone else SHUTDOWN_GRACE_S)
    link.report_refusals()
    await asyncio.sleep(0.01)  # the last frames leave (the socket writes on the next turn)
    return 1 if core_gone else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m siftmq.frontend")
    parser.add_argument("--socket", required=True)
    parser.add_argument("--listen", required=True)
    parser.add_argument("--index", default="0")
    parser.add_argument("--frame-limit", type=int, required=True)
    parser.add_argument("--max-connections", type=int, required=True)
    parser.add_argument("--max-streams", type=int, required=True)
    parser.add_argument("--tls-cert", default="")
    parser.add_argument("--tls-key", default="")
    parser.add_argument("--tls-client-ca", default="")
    parser.add_argument("--batch-extension", action=argparse.BooleanOptionalAction, default=True)
    args = parser.parse_args(argv)
    # Ctrl-C and a hangup reach the whole process group, from the first moment: the core stops the
    # front-ends in its own order (and a hangup only reloads the core's users)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    _die_with_parent()
    logging.basicConfig(
        level=logging.INFO,
        stream=sys.stderr,
        format=f"%(asctime)s %(levelname)s %(name)s[{args.index}]: %(message)s",
    )
    logging.getLogger("grpc").setLevel(logging.WARNING)
    tune_gc()
    return asyncio.run(serve(args))
