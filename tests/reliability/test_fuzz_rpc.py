"""Hostile bytes over every RPC of a real broker: each call gets a status, the log gets no traceback
and stays small, and the broker keeps serving.

Seeded, so a failure reproduces: random bytes, bytes with invalid UTF-8 where a string goes, and
requests of the right type with every field set at random (negative and huge numbers, unknown enum
values, control characters and long strings) — the input a broken or malicious client sends.
"""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from typing import Any

import grpc
import pytest
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

from siftmq.client import Producer
from siftmq.protocol import rocketmq_v2_pb2 as pb
from siftmq.protocol.service import BATCH_RPCS, RPCS

pytestmark = pytest.mark.integration

SEED = 20261124
PER_RPC = 40
_INTS = [0, 1, -1, 2**31 - 1, -(2**31), 2**63 - 1, -(2**63), 7, 1000, 10**12]
_STRINGS = [
    "",
    "a",
    "Orders",
    "%DLQ%g",
    "a|b",
    "\x00",
    "\n\t",
    "é",
    "😀",
    "x" * 300,
    "' OR 1=1 --",
    "NOT ((a",
]
FD = FieldDescriptor


def _value(rng: random.Random, field: FieldDescriptor, depth: int) -> Any:
    kind = field.type
    if kind == FD.TYPE_MESSAGE:
        return None if depth > 3 else field.message_type
    if kind == FD.TYPE_ENUM:
        return rng.choice([*(v.number for v in field.enum_type.values), 99, -5])
    if kind == FD.TYPE_STRING:
        return rng.choice(_STRINGS)
    if kind == FD.TYPE_BYTES:
        return rng.randbytes(rng.randrange(0, 64))
    if kind == FD.TYPE_BOOL:
        return rng.random() < 0.5
    if kind in (FD.TYPE_DOUBLE, FD.TYPE_FLOAT):
        return rng.choice([0.0, -1.0, 1e300, float("nan")])
    value = rng.choice(_INTS)
    if kind in (FD.TYPE_UINT32, FD.TYPE_UINT64, FD.TYPE_FIXED32, FD.TYPE_FIXED64):
        value = abs(value) % (2**32 if kind in (FD.TYPE_UINT32, FD.TYPE_FIXED32) else 2**64)
    elif kind in (FD.TYPE_INT32, FD.TYPE_SINT32, FD.TYPE_SFIXED32):
        value = max(-(2**31), min(2**31 - 1, value))
    return value


def _fill(rng: random.Random, message: Message, depth: int = 0) -> None:
    """Set a random subset of ``message``'s fields to random values, recursively."""
    for field in message.DESCRIPTOR.fields:
        if rng.random() < 0.3:
            continue
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            target = getattr(message, field.name)
            for _ in range(rng.randrange(0, 3)):
                key_field, value_field = (
                    field.message_type.fields_by_name["key"],
                    field.message_type.fields_by_name["value"],
                )
                key = _value(rng, key_field, depth)
                if value_field.type == FD.TYPE_MESSAGE:
                    continue
                target[key] = _value(rng, value_field, depth)
            continue
        repeated = field.is_repeated
        for _ in range(rng.randrange(1, 4) if repeated else 1):
            value = _value(rng, field, depth)
            if field.type == FD.TYPE_MESSAGE:
                if value is None:
                    continue
                child = getattr(message, field.name).add() if repeated else getattr(message, field.name)
                _fill(rng, child, depth + 1)
                if not repeated and not child.ListFields():
                    child.SetInParent()
            elif repeated:
                getattr(message, field.name).append(value)
            else:
                setattr(message, field.name, value)


def _payloads(rng: random.Random, request_type: Any) -> list[bytes]:
    out = [rng.randbytes(rng.randrange(0, 120)) for _ in range(PER_RPC // 4)]
    out += [b"\x0a\x03\xff\xfe\xfd", b"\x0a\x05\x12\x03\xff\xfe\xfd"]  # invalid UTF-8 in a string field
    for _ in range(PER_RPC):
        request = request_type()
        _fill(rng, request)
        out.append(request.SerializeToString())
    return out


def _call(channel: grpc.Channel, rpc: Any, payload: bytes) -> str:
    path = f"/{rpc.service}/{rpc.name}"
    metadata = (("x-mq-client-id", "fuzzer"),)
    try:
        if rpc.shape == "unary_unary":
            raw = channel.unary_unary(path)(payload, timeout=10, metadata=metadata)
            return "status:" + pb.Code.Name(rpc.response.FromString(raw).status.code)
        if rpc.shape == "unary_stream":
            frames = list(channel.unary_stream(path)(payload, timeout=10, metadata=metadata))
            first = rpc.response.FromString(frames[0]) if frames else None
            return "status:" + pb.Code.Name(first.status.code) if first is not None else "empty"
        list(channel.stream_stream(path)(iter([payload]), timeout=3, metadata=metadata))
        return "bidi"
    except grpc.RpcError as exc:
        return "grpc:" + exc.code().name


def test_hostile_payloads_get_a_status_and_no_traceback(start_broker: Any) -> None:
    broker = start_broker(config={"max_long_polling_s": 0.2})
    rng = random.Random(SEED)
    outcomes: Counter[tuple[str, str]] = Counter()
    with grpc.insecure_channel(broker.endpoint) as channel:
        for rpc in (*RPCS, *BATCH_RPCS):
            if rpc.request is None:
                continue
            for payload in _payloads(rng, rpc.request):
                outcomes[(rpc.name, _call(channel, rpc, payload))] += 1
    bad = {
        k: n
        for k, n in outcomes.items()
        if k[1] in ("grpc:UNKNOWN", "grpc:INTERNAL", "status:INTERNAL_ERROR")
    }
    assert not bad, f"server errors for client input: {bad}"
    assert sum(outcomes.values()) > 15 * PER_RPC

    async def still_serving() -> None:
        async with Producer(broker.endpoint) as producer:
            assert (await producer.send("AfterFuzz", b"ok", tag="t")).message_id

    asyncio.run(still_serving())
    log = broker.log()
    assert "Traceback" not in log
    assert len(log) < 200_000, f"{len(log)} bytes of log for {sum(outcomes.values())} hostile calls"


def test_absurd_numbers_are_refused_naming_the_field(start_broker: Any) -> None:
    broker = start_broker()

    async def create_topic() -> None:
        async with Producer(broker.endpoint) as producer:
            await producer.send("Numbers", b"x", tag="t")

    asyncio.run(create_topic())
    topic = pb.Resource(name="Numbers")
    queue = pb.MessageQueue(topic=topic, id=0)
    tag_all = pb.FilterExpression(type=pb.FilterType.TAG, expression="*")
    group = pb.Resource(name="g")
    requests = {
        "PullMessage": pb.PullMessageRequest(
            group=group, message_queue=queue, offset=0, batch_size=-1, filter_expression=tag_all
        ),
        "ReceiveMessage": pb.ReceiveMessageRequest(
            group=group,
            message_queue=pb.MessageQueue(topic=topic, id=-1),
            batch_size=-1,
            filter_expression=tag_all,
        ),
        "QueryOffset": pb.QueryOffsetRequest(message_queue=queue, query_offset_policy=99),
    }
    rpcs = {rpc.name: rpc for rpc in RPCS}
    with grpc.insecure_channel(broker.endpoint) as channel:
        for name, request in requests.items():
            answer = _call(channel, rpcs[name], request.SerializeToString())
            assert answer == "status:BAD_REQUEST", (name, answer)
