"""One gRPC channel to a broker, with RocketMQ's client metadata and status checking."""

from __future__ import annotations

import contextlib
import itertools
import os
import socket
import time
import uuid
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Self

import grpc

from siftmq import __version__
from siftmq.auth.signature import DATE_HEADER, SCHEME, sign
from siftmq.client.model import OutgoingMessage, ReceivedMessage, SendReceipt
from siftmq.errors import RemoteError
from siftmq.protocol import rocketmq_v2_pb2 as pb
from siftmq.protocol import siftmq_batch_pb2 as batch_pb
from siftmq.protocol.service import BATCH_RPCS, RPCS, Rpc

_RPC = {r.name: r for r in (*RPCS, *BATCH_RPCS)}
#: Batch calls a broker serving the extension may lack (an older siftmq): their UNIMPLEMENTED says
#: nothing about the extension's other calls.
_LATER_BATCH_CALLS: Final = frozenset({"AckAndReceive"})
#: The first and the longest wait (ms) before a connection to a broker that went away is tried again.
RECONNECT_BACKOFF_MS: Final = (250, 2000)
_SUCCESS = (pb.Code.OK, pb.Code.MULTIPLE_RESULTS)
# enum attribute lookups go through a slow Python wrapper: resolve the per-message ones once
_IDENTITY = pb.Encoding.IDENTITY
_NORMAL = pb.MessageType.NORMAL
_counter = iter(range(1 << 62))


@dataclass(frozen=True, slots=True)
class Answer:
    """A pull's or receive's answer however it travelled: status, messages, next offset (pull only)."""

    status: pb.Status | None
    messages: Sequence[ReceivedMessage]
    next_offset: int | None = None


def new_client_id() -> str:
    """``host@pid@n@time``: unique per client object, as RocketMQ's clients build it."""
    return f"{socket.gethostname()}@{os.getpid()}@{next(_counter)}@{time.time_ns():x}"


class Started:
    """``async with`` for a producer or consumer: ``start()`` on entry (the channel closed again if
    that fails, since no ``__aexit__`` follows), ``stop()`` on exit."""

    connection: Connection

    async def start(self) -> None:
        raise NotImplementedError

    async def stop(self) -> None:
        raise NotImplementedError

    async def __aenter__(self) -> Self:
        try:
            await self.start()
        except BaseException:
            await self.connection.close()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()


class Connection:
    """Calls ``apache.rocketmq.v2.MessagingService`` on one endpoint (``host:port``)."""

    def __init__(
        self,
        endpoint: str,
        *,
        client_id: str | None = None,
        namespace: str = "",
        request_timeout: float = 5.0,
        access_key: str | None = None,
        secret_key: str | None = None,
        tls: bool = False,
        ca_file: str | None = None,
        cert_file: str | None = None,
        key_file: str | None = None,
    ) -> None:
        host, sep, port = endpoint.rpartition(":")
        if not sep or not port.isdigit() or not 0 < int(port) <= 65535:  # gRPC would wrap a larger one
            raise ValueError(f"endpoint must be host:port (port 1..65535), not {endpoint!r}")
        _check_security(access_key, secret_key, cert_file, key_file)
        self.endpoint = endpoint
        self.host, self.port = host, int(port)
        self.client_id = client_id or new_client_id()
        self.namespace = namespace
        self.request_timeout = request_timeout
        self.extra_metadata: tuple[tuple[str, str], ...] = ()
        #: whether the broker serves siftmq's batch extension (None: not asked yet; False: the first
        #: call of it was refused, or set by hand to use only the standard calls)
        self.batch_extension: bool | None = None
        self._unimplemented: set[str] = set()  # batch calls the broker refused (an older extension)
        # a broker with authentication on wants every call signed with the user's secret key
        self._access_key, self._secret_key = access_key or None, secret_key or ""
        options = [
            ("grpc.max_receive_message_length", -1),
            ("grpc.max_send_message_length", -1),
            # gRPC's own backoff grows to minutes: after a 30 s outage calls went on failing for
            # ~7 s once the broker was back, longer than a send's retries wait
            ("grpc.initial_reconnect_backoff_ms", RECONNECT_BACKOFF_MS[0]),
            ("grpc.min_reconnect_backoff_ms", RECONNECT_BACKOFF_MS[0]),
            ("grpc.max_reconnect_backoff_ms", RECONNECT_BACKOFF_MS[1]),
        ]
        if tls or ca_file or cert_file:  # a CA or a client certificate means TLS
            credentials = grpc.ssl_channel_credentials(
                root_certificates=_read(ca_file),
                private_key=_read(key_file),
                certificate_chain=_read(cert_file),
            )
            self._channel = grpc.aio.secure_channel(endpoint, credentials, options=options)
        else:
            self._channel = grpc.aio.insecure_channel(endpoint, options=options)

    def metadata(self) -> tuple[tuple[str, str], ...]:
        return (
            ("x-mq-client-id", self.client_id),
            ("x-mq-language", "PYTHON"),
            ("x-mq-protocol", "GRPC_V2"),
            ("x-mq-client-version", f"siftmq-{__version__}"),
            ("x-mq-namespace", self.namespace),
            ("x-mq-request-id", uuid.uuid4().hex),
            *self._signature(),
            *self.extra_metadata,
        )

    def _signature(self) -> tuple[tuple[str, str], ...]:
        if self._access_key is None:
            return ()
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        signed = sign(self._secret_key, stamp)
        authorization = (
            f"{SCHEME} Credential={self._access_key}, SignedHeaders={DATE_HEADER}, Signature={signed}"
        )
        return ((DATE_HEADER, stamp), ("authorization", authorization))

    def endpoints(self) -> pb.Endpoints:
        scheme = (
            pb.AddressScheme.IPv4 if self.host.replace(".", "").isdigit() else pb.AddressScheme.DOMAIN_NAME
        )
        return pb.Endpoints(scheme=scheme, addresses=[pb.Address(host=self.host, port=self.port)])

    def resource(self, name: str) -> pb.Resource:
        return pb.Resource(resource_namespace=self.namespace, name=name)

    def _method(self, rpc: Rpc, request: Any) -> Any:
        kinds = {
            "unary_unary": self._channel.unary_unary,
            "unary_stream": self._channel.unary_stream,
            "stream_stream": self._channel.stream_stream,
        }
        return kinds[rpc.shape](
            rpc.path,
            request_serializer=type(request).SerializeToString,
            response_deserializer=rpc.response.FromString,
        )

    async def unary(self, name: str, request: Any, *, timeout: float | None = None) -> Any:
        """One unary call; a non-OK top-level status raises :class:`RemoteError`."""
        rpc = _RPC[name]
        try:
            response = await self._method(rpc, request)(
                request, timeout=timeout or self.request_timeout, metadata=self.metadata()
            )
        except grpc.aio.AioRpcError as exc:
            raise _transport_error(name, exc) from exc
        check(name, response.status)
        return response

    async def stream(self, name: str, request: Any, *, timeout: float) -> list[Any]:
        """A server-streaming call, collected; its status frame is checked by the caller."""
        rpc = _RPC[name]
        frames = []
        try:
            call = self._method(rpc, request)(request, timeout=timeout, metadata=self.metadata())
            async for frame in call:
                frames.append(frame)
        except grpc.aio.AioRpcError as exc:
            raise _transport_error(name, exc) from exc
        return frames

    async def _batch(self, name: str, request: Any, timeout: float) -> Any | None:
        """The batch extension's answer, or None when the broker does not offer the call (remembered)."""
        if self.batch_extension is False or name in self._unimplemented:
            return None
        try:
            response = await self._method(_RPC[name], request)(
                request, timeout=timeout, metadata=self.metadata()
            )
        except grpc.aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.UNIMPLEMENTED:
                self._unimplemented.add(name)
                if self.batch_extension is None and name not in _LATER_BATCH_CALLS:
                    self.batch_extension = False
                return None
            raise _transport_error(name, exc) from exc
        self.batch_extension = True
        return response

    async def send(self, messages: Sequence[OutgoingMessage]) -> list[SendReceipt]:
        """SendMessage of messages of one topic: column by column through siftmq's extension when
        the broker offers it, else as the standard request. A non-OK status raises RemoteError."""
        answer = await self._batch(
            "SendMessages", send_columns(self.namespace, messages), self.request_timeout
        )
        if answer is not None:
            check("SendMessages", answer.status)
            if not len(answer.queue_offset) == len(answer.queue_id) == len(messages):
                raise RemoteError(
                    f"malformed answer: {len(answer.queue_offset)} offsets and {len(answer.queue_id)} "
                    f"queues for {len(messages)} messages",
                    status="BAD_ANSWER",
                    call="SendMessages",
                )
            return [
                SendReceipt(m.message_id, offset, queue_id)
                for m, offset, queue_id in zip(messages, answer.queue_offset, answer.queue_id, strict=True)
            ]
        with _naming_bad_fields(messages):
            request = pb.SendMessageRequest(messages=[message_frame(self.namespace, m) for m in messages])
        response = await self.unary("SendMessage", request)
        entries = response.entries
        if len(entries) != len(messages):
            raise RemoteError(
                f"malformed answer: {len(entries)} entries for {len(messages)} messages",
                status="BAD_ANSWER",
                call="SendMessage",
            )
        # a batch stored in part answers MULTIPLE_RESULTS: each entry says whether its message was
        for entry in entries:
            if entry.status.code != pb.Code.OK:
                check("SendMessage", entry.status)
        return [SendReceipt(e.message_id, e.offset) for e in entries]

    async def pull(self, request: pb.PullMessageRequest, *, timeout: float) -> Answer:
        """PullMessage: one frame through siftmq's extension when offered, else the standard stream."""
        batch = await self._batch("PullMessages", request, timeout)
        if batch is not None:
            messages = _from_columns("PullMessages", request.message_queue.topic.name, batch.messages)
            return Answer(batch.status, messages, batch.next_offset)
        return _answer_of(await self.stream("PullMessage", request, timeout=timeout))

    async def receive(self, request: pb.ReceiveMessageRequest, *, timeout: float) -> Answer:
        """ReceiveMessage: one frame through siftmq's extension when offered, else the standard stream."""
        batch = await self._batch("ReceiveMessages", request, timeout)
        if batch is not None:
            messages = _from_columns("ReceiveMessages", request.message_queue.topic.name, batch.messages)
            return Answer(batch.status, messages)
        return _answer_of(await self.stream("ReceiveMessage", request, timeout=timeout))

    async def ack_and_receive(
        self, ack: pb.AckMessageRequest, receive: pb.ReceiveMessageRequest, *, timeout: float
    ) -> tuple[pb.AckMessageResponse, Answer] | None:
        """AckMessage and then ReceiveMessage in one call through siftmq's extension; None when the
        broker does not offer it (the caller then makes the two calls)."""
        answer = await self._batch(
            "AckAndReceive", batch_pb.AckAndReceiveRequest(ack=ack, receive=receive), timeout
        )
        if answer is None:
            return None
        if not answer.HasField("ack"):  # refused as a whole (authorization, a malformed request)
            check("AckAndReceive", answer.status)
        topic = receive.message_queue.topic.name
        messages = _from_columns("AckAndReceive", topic, answer.receive.messages)
        return answer.ack, Answer(answer.receive.status, messages)

    async def update_offsets(self, group: str, topic: str, offsets: dict[int, int]) -> list[int] | None:
        """Commit ``offsets`` (queue id -> offset) in one call through siftmq's extension; the queues
        the client owns now, or None when the broker does not offer the call."""
        request = batch_pb.UpdateOffsetsRequest(
            group=self.resource(group),
            topic=self.resource(topic),
            queue_id=list(offsets),
            offset=list(offsets.values()),
        )
        answer = await self._batch("UpdateOffsets", request, self.request_timeout)
        if answer is None:
            return None
        check("UpdateOffsets", answer.status)
        return list(answer.assigned_queue_id)

    async def telemetry(self, settings: pb.Settings) -> pb.TelemetryCommand:
        """Send the client's settings and wait for the broker's reply (the stream is then closed)."""
        rpc = _RPC["Telemetry"]

        async def commands() -> AsyncIterator[pb.TelemetryCommand]:
            yield pb.TelemetryCommand(settings=settings)

        call = self._method(rpc, pb.TelemetryCommand())(
            commands(), timeout=self.request_timeout, metadata=self.metadata()
        )
        try:
            async for reply in call:
                check("Telemetry", reply.status)
                return reply  # type: ignore[no-any-return]
        except grpc.aio.AioRpcError as exc:
            raise _transport_error("Telemetry", exc) from exc
        finally:
            call.cancel()
        raise RemoteError.for_status(
            "the broker closed the stream without a reply", status="UNAVAILABLE", call="Telemetry"
        )

    async def close(self) -> None:
        await self._channel.close()


def send_columns(namespace: str, messages: Sequence[OutgoingMessage]) -> batch_pb.SendBatchRequest:
    """The SendMessages request of ``messages``; ``ValueError`` unless there are some, of one topic."""
    if not messages:
        raise ValueError("no message to send")
    topics, bodies, ids, tags, keys, properties, born = zip(*messages, strict=True)
    if len(set(topics)) != 1:
        raise ValueError(f"send_many sends messages of one topic, not of {sorted(set(topics))}")
    with _naming_bad_fields(messages):
        return batch_pb.SendBatchRequest(
            topic={"resource_namespace": namespace, "name": topics[0]},
            body=bodies,
            message_id=ids,
            tag=[tag or "" for tag in tags],
            key_count=list(map(len, keys)),
            key=list(itertools.chain.from_iterable(keys)),
            property_count=list(map(len, properties)),
            property_name=list(itertools.chain.from_iterable(properties)),
            property_value=list(itertools.chain.from_iterable(p.values() for p in properties)),
            born_timestamp_ms=born,
        )


@contextlib.contextmanager
def _naming_bad_fields(messages: Sequence[OutgoingMessage]) -> Iterator[None]:
    """A ``TypeError`` of the protobuf encoder (which names nothing) said again naming the message's
    key or property that is not a string; looked for only then, so a good send pays nothing."""
    try:
        yield
    except TypeError:
        for n, m in enumerate(messages):
            for key in m.keys:
                if type(key) is not str:
                    raise TypeError(f"message {n}: keys must be strings, not {key!r}") from None
            for name, value in m.properties.items():
                if type(name) is not str or type(value) is not str:
                    raise TypeError(
                        f"message {n}: properties must map strings to strings, not {name!r}: {value!r}"
                    ) from None
        raise


def message_frame(namespace: str, m: OutgoingMessage) -> dict[str, Any]:
    """``m`` as ``pb.Message`` constructor arguments (built in C from dicts: several times faster)."""
    born = m.born_timestamp_ms
    sp: dict[str, Any] = {
        "message_id": m.message_id,
        "body_encoding": _IDENTITY,
        "message_type": _NORMAL,
        "born_timestamp": {"seconds": born // 1000, "nanos": born % 1000 * 1_000_000},
        "tag": m.tag,  # None leaves it unset
    }
    if m.keys:
        sp["keys"] = list(m.keys)
    fields: dict[str, Any] = {
        "topic": {"resource_namespace": namespace, "name": m.topic},
        "body": m.body,
        "system_properties": sp,
    }
    if m.properties:
        fields["user_properties"] = dict(m.properties)
    return fields


def _from_columns(call: str, topic: str, columns: Any) -> list[ReceivedMessage]:
    """A batch answer's messages; a malformed answer raises :class:`RemoteError` (BAD_ANSWER)."""
    try:
        return ReceivedMessage.from_columns(topic, columns)
    except ValueError as exc:
        raise RemoteError(f"malformed answer: {exc}", status="BAD_ANSWER", call=call) from exc


def _answer_of(frames: list[Any]) -> Answer:
    """The frames of a standard PullMessage/ReceiveMessage stream as one answer."""
    status: pb.Status | None = None
    messages: list[ReceivedMessage] = []
    next_offset: int | None = None
    for frame in frames:
        which = frame.WhichOneof("content")
        if which == "message":
            messages.append(ReceivedMessage.from_proto(frame.message))
        elif which == "status" and status is None:
            status = frame.status
        elif which == "next_offset" and next_offset is None:  # pull only
            next_offset = frame.next_offset
    return Answer(status, messages, next_offset)


def _check_security(
    access_key: str | None, secret_key: str | None, cert_file: str | None, key_file: str | None
) -> None:
    """``ValueError`` naming the option missing from a pair that goes together: a certificate
    without its key (or a key alone) aborts the process inside gRPC, and a secret key without an
    access key would leave every call unsigned."""
    if bool(cert_file) != bool(key_file):
        given, missing = ("cert_file", "key_file") if cert_file else ("key_file", "cert_file")
        raise ValueError(f"{given} needs {missing}: a client certificate and its private key go together")
    if bool(access_key) != bool(secret_key):
        given, missing = ("access_key", "secret_key") if access_key else ("secret_key", "access_key")
        raise ValueError(f"{given} needs {missing}: calls are signed with both or neither")


def _read(path: str | None) -> bytes | None:
    return None if path is None else Path(path).read_bytes()


def check(call: str, status: pb.Status) -> None:
    if status.code not in _SUCCESS:
        name = pb.Code.Name(status.code) if status.code in pb.Code.values() else str(status.code)
        raise RemoteError.for_status(
            status.message or name, status=name, status_code=int(status.code), call=call
        )


def _transport_error(call: str, exc: grpc.aio.AioRpcError) -> RemoteError:
    code = exc.code()
    transient = code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
    status = "UNAVAILABLE" if transient else f"GRPC_{code.name}"
    return RemoteError.for_status(exc.details() or code.name, status=status, call=call)
