"""``auto_renew`` receives (the official PushConsumer's): the broker keeps the delivery invisible
while its client is live, as RocketMQ's proxy renews it until the ack. Before, such a delivery came
back after the default invisible time (60 s) while the listener still worked on it, and the first
copy's ack was refused: every message a push consumer held longer was consumed twice."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

from siftmq.client import Producer
from siftmq.client.connection import Connection
from siftmq.errors import RemoteError
from siftmq.protocol import rocketmq_v2_pb2 as pb

pytestmark = pytest.mark.integration
TOPIC = "Renewed"


def _receive_request(auto_renew: bool) -> pb.ReceiveMessageRequest:
    request = pb.ReceiveMessageRequest(
        group=pb.Resource(name="push-g"),
        message_queue=pb.MessageQueue(topic=pb.Resource(name=TOPIC), id=-1),
        filter_expression=pb.FilterExpression(type=pb.FilterType.TAG, expression="*"),
        batch_size=8,
        auto_renew=auto_renew,
    )
    request.long_polling_timeout.FromMilliseconds(200)
    return request


async def _receive(connection: Connection, auto_renew: bool) -> list[pb.Message]:
    frames = await connection.stream("ReceiveMessage", _receive_request(auto_renew), timeout=10)
    return [f.message for f in frames if f.HasField("message")]


async def _delivered(connection: Connection, auto_renew: bool, within_s: float) -> list[pb.Message]:
    """What ``connection``'s receives get first, once a delivery comes (none within ``within_s``: [])."""
    got: list[pb.Message] = []
    deadline = time.monotonic() + within_s
    while not got and time.monotonic() < deadline:
        got = await _receive(connection, auto_renew)
    return got


@contextlib.asynccontextmanager
async def _sent_to_clients(endpoint: str, body: bytes, *client_ids: str) -> AsyncIterator[list[Connection]]:
    """``body`` sent, and a connection for each of ``client_ids`` (closed after)."""
    async with Producer(endpoint) as producer:
        await producer.send(TOPIC, body, tag="t")
    connections = [Connection(endpoint, client_id=c) for c in client_ids]
    try:
        yield connections
    finally:
        for connection in connections:
            await connection.close()


async def _ack(connection: Connection, message: pb.Message) -> str:
    """The AckMessage answer's status name."""
    entry = pb.AckMessageEntry(
        message_id=message.system_properties.message_id,
        receipt_handle=message.system_properties.receipt_handle,
    )
    request = pb.AckMessageRequest(
        group=pb.Resource(name="push-g"), topic=pb.Resource(name=TOPIC), entries=[entry]
    )
    try:
        await connection.unary("AckMessage", request)
    except RemoteError as exc:
        return exc.status
    return "OK"


def test_a_renewed_delivery_stays_with_its_client_until_it_is_acknowledged(start_broker: Any) -> None:
    broker = start_broker(config={"default_invisible_time_s": 1.0, "client_session_expire_s": 3.0})

    async def scenario() -> None:
        async with _sent_to_clients(broker.endpoint, b"slow work", "holder", "other") as (holder, other):
            [held] = await _receive(holder, auto_renew=True)
            until = time.monotonic() + 3.5  # 3.5 invisible times
            while time.monotonic() < until:
                assert await _receive(other, auto_renew=True) == []  # renewed: nobody else gets it
                await _receive(holder, auto_renew=True)  # the holder stays live (its long polls)
            assert await _ack(holder, held) == "OK"  # its handle still holds
            await asyncio.sleep(1.5)
            assert await _receive(other, auto_renew=True) == []  # acknowledged: never again

            async with Producer(broker.endpoint) as producer:
                await producer.send(TOPIC, b"left behind", tag="t")
            [abandoned] = await _receive(holder, auto_renew=True)
            # the holder goes away (no call for longer than client_session_expire_s): renewals stop
            # and the message is delivered again, to the client still polling
            again = await _delivered(other, auto_renew=True, within_s=15)
            assert [m.body for m in again] == [b"left behind"]
            assert again[0].system_properties.delivery_attempt == 2
            assert abandoned.system_properties.message_id == again[0].system_properties.message_id

    asyncio.run(scenario())


def test_without_auto_renew_the_invisible_time_still_ends(start_broker: Any) -> None:
    broker = start_broker(config={"default_invisible_time_s": 1.0})

    async def scenario() -> None:
        async with _sent_to_clients(broker.endpoint, b"plain", "first", "second") as (first, second):
            [taken] = await _receive(first, auto_renew=False)
            await asyncio.sleep(1.3)
            await _receive(first, auto_renew=False)
            again = await _delivered(second, auto_renew=False, within_s=5)
            assert [m.body for m in again] == [b"plain"]
            assert await _ack(first, taken) == "INVALID_RECEIPT_HANDLE"  # its time was over

    asyncio.run(scenario())
