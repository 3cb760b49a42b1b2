"""The producer: ``send`` one message or ``send_many`` in one request, retried with backoff."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any

from siftmq.client.connection import Connection, Started
from siftmq.client.model import OutgoingMessage, SendReceipt, check_count
from siftmq.errors import RemoteError
from siftmq.protocol import rocketmq_v2_pb2 as pb

_seq = iter(range(1 << 62))
_NO_PROPERTIES: Mapping[str, str] = MappingProxyType({})
_PREFIX = f"01{os.getpid() & 0xFFFF:04X}{os.urandom(4).hex().upper()}"


def new_message_id() -> str:
    """A client message id ("01" + process + sequence), the same on every retry of one send."""
    return f"{_PREFIX}{time.time_ns() & 0xFFFFFFFF:08X}{next(_seq) & 0xFFFFFFFF:08X}"


class Producer(Started):
    """``async with Producer("127.0.0.1:8081") as p: await p.send("Orders", b"...", tag="Pay")``."""

    def __init__(
        self, endpoint: str, *, max_attempts: int = 3, backoff_s: float = 0.05, **options: Any
    ) -> None:
        check_count("max_attempts", max_attempts)
        if not backoff_s >= 0:
            raise ValueError(f"backoff_s must be 0 or more, not {backoff_s!r}")
        self.connection = Connection(endpoint, **options)
        self.max_attempts = max_attempts
        self.backoff_s = backoff_s

    async def start(self) -> None:
        settings = pb.Settings(client_type=pb.ClientType.PRODUCER, publishing=pb.Publishing())
        await self.connection.telemetry(settings)

    async def stop(self) -> None:
        try:
            await self.connection.unary("NotifyClientTermination", pb.NotifyClientTerminationRequest())
        except RemoteError:
            pass
        finally:
            await self.connection.close()

    def message(
        self,
        topic: str,
        body: bytes,
        *,
        tag: str | None = None,
        keys: Sequence[str] = (),
        properties: Mapping[str, str] | None = None,
        message_id: str | None = None,
    ) -> OutgoingMessage:
        """A message for :meth:`send_many`; ``message_id`` defaults to a new client id."""
        if type(body) is not bytes:
            if not isinstance(body, (bytes, bytearray, memoryview)):
                raise TypeError(f"body must be bytes, not {type(body).__name__} (encode a str first)")
            body = bytes(body)  # what the protobuf encoder takes
        if isinstance(keys, str):  # (a key or property that is no string is named when it is sent)
            raise TypeError(f"keys must be a list of strings, not one string: {keys!r}")
        return OutgoingMessage(
            topic,
            body,
            message_id or new_message_id(),
            tag,
            tuple(keys),
            dict(properties) if properties else _NO_PROPERTIES,
            time.time_ns() // 1_000_000,
        )

    async def send(
        self,
        topic: str,
        body: bytes,
        *,
        tag: str | None = None,
        keys: Sequence[str] = (),
        properties: Mapping[str, str] | None = None,
    ) -> SendReceipt:
        return (await self.send_many([self.message(topic, body, tag=tag, keys=keys, properties=properties)]))[
            0
        ]

    async def send_many(self, messages: Sequence[OutgoingMessage]) -> list[SendReceipt]:
        """Send messages of one topic in one request (one append on the broker); retried as a whole.

        The messages travel column by column through siftmq's batch extension when the broker
        offers it, else as RocketMQ's SendMessage request. Raises ``ValueError`` for no messages
        or messages of several topics, :class:`RemoteError` when the broker refuses them.
        """
        for attempt in range(1, self.max_attempts + 1):
            try:
                return await self.connection.send(messages)
            except RemoteError as exc:
                if not exc.is_retriable or attempt == self.max_attempts:
                    raise
                await asyncio.sleep(self.backoff_s * 2 ** (attempt - 1))
        raise AssertionError("unreachable")
