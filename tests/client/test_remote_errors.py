"""The client raises the RemoteError subclass of each failure's family, with the gRPC error as cause."""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import grpc
import pytest

from siftmq.client import Producer
from siftmq.errors import RemoteBadRequest, RemoteError, RemoteUnavailable


def test_a_refused_send_is_a_bad_request(start_broker: Any) -> None:
    broker = start_broker()

    async def send() -> None:
        async with Producer(broker.endpoint) as producer:
            await producer.send("not a topic!", b"x")

    with pytest.raises(RemoteBadRequest) as refused:
        asyncio.run(send())
    assert refused.value.status == "ILLEGAL_TOPIC" and not refused.value.is_retriable
    assert isinstance(refused.value, RemoteError)


def test_an_unreachable_broker_is_unavailable_caused_by_the_grpc_error() -> None:
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]

    async def send() -> None:
        async with Producer(f"127.0.0.1:{port}", request_timeout=2, max_attempts=1) as producer:
            await producer.send("T", b"x")

    with pytest.raises(RemoteUnavailable) as down:
        asyncio.run(send())
    assert down.value.is_retriable
    assert isinstance(down.value.__cause__, grpc.aio.AioRpcError)
