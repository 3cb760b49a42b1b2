"""Helpers of the tests that consume through siftmq's own client against a real broker, or call its
RPCs raw."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import grpc
import pytest

from siftmq.client import FilterExpression, ReceivedMessage, SimpleConsumer
from siftmq.errors import RemoteError
from siftmq.protocol.service import RPCS


async def drain(
    endpoint: str, group: str, topic: str, *, limit: int | None = None, batch: int = 32
) -> list[ReceivedMessage]:
    """Receive and acknowledge ``topic``'s messages as ``group`` until a receive comes back empty
    (or ``limit`` were received)."""
    got: list[ReceivedMessage] = []
    async with SimpleConsumer(endpoint, group, {topic: FilterExpression.tag("*")}) as consumer:
        while limit is None or len(got) < limit:
            size = batch if limit is None else min(batch, limit - len(got))
            messages = await consumer.receive(size, invisible_duration=60)
            if not messages:
                break
            for m in messages:
                got.append(m)
                await consumer.ack(m)
    return got


async def assert_all_acknowledged(consumer: SimpleConsumer, messages: Sequence[ReceivedMessage]) -> None:
    """Every one of ``messages`` (at most 1,024, of one topic: one request) was acknowledged already:
    acknowledging them again fails for each."""
    with pytest.raises(RemoteError) as again:
        await consumer.ack_many(messages)
    # every entry failed: the answer's own status is theirs (some only: "k of n acknowledgements failed")
    assert again.value.status == "INVALID_RECEIPT_HANDLE" and "not in flight" in str(again.value)
    assert "acknowledgements failed" not in str(again.value)


def rpc_stub(channel: grpc.Channel, name: str) -> Any:
    """A stub of the broker's RPC ``name`` on ``channel``, of the call's own shape."""
    rpc = next(r for r in RPCS if r.name == name)
    make = {"unary_unary": channel.unary_unary, "unary_stream": channel.unary_stream}
    make["stream_stream"] = channel.stream_stream
    return make[rpc.shape](rpc.path, lambda m: m.SerializeToString(), rpc.response.FromString)
