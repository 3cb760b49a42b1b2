"""A receive whose client goes while its answer is being written gives back the messages it could not
write: another consumer gets them a second later, not after their invisible time (RocketMQ's proxy
does the same). A real broker, in one process and behind front-ends, over gRPC."""

from __future__ import annotations

import os
import time
import uuid
from typing import Any

import grpc
import pytest

from client_helpers import rpc_stub
from siftmq.protocol import rocketmq_v2_pb2 as pb

pytestmark = pytest.mark.integration

TOPIC, GROUP = "GiveBack", "g-give-back"
MESSAGES = 32
BIG = [("grpc.max_receive_message_length", 64 << 20), ("grpc.max_send_message_length", 64 << 20)]


def _metadata(client_id: str) -> tuple[tuple[str, str], ...]:
    return (("x-mq-client-id", client_id), ("x-mq-language", "PYTHON"), ("x-mq-protocol", "v2"))


def _message(body: bytes) -> pb.Message:
    sp = pb.SystemProperties(
        message_id=uuid.uuid4().hex.upper(),
        message_type=pb.MessageType.NORMAL,
        body_encoding=pb.Encoding.IDENTITY,
        tag="t",
    )
    sp.born_timestamp.GetCurrentTime()
    return pb.Message(topic=pb.Resource(name=TOPIC), body=body, system_properties=sp)


def _receive_request(batch_size: int) -> pb.ReceiveMessageRequest:
    request = pb.ReceiveMessageRequest(
        group=pb.Resource(name=GROUP),
        message_queue=pb.MessageQueue(topic=pb.Resource(name=TOPIC), id=-1),
        filter_expression=pb.FilterExpression(type=pb.FilterType.TAG, expression="*"),
        batch_size=batch_size,
    )
    request.invisible_duration.FromSeconds(60)
    request.long_polling_timeout.FromSeconds(1)
    return request


@pytest.mark.parametrize("workers", [1, 2])
def test_a_receive_whose_client_goes_mid_answer_gives_back_what_it_could_not_write(
    start_broker: Any, workers: int
) -> None:
    broker = start_broker("data", workers=workers)
    body = os.urandom(1 << 20)  # 32 MiB in all: more than gRPC's buffers take without a reader
    with grpc.insecure_channel(broker.endpoint, options=BIG) as channel:
        send, receive = rpc_stub(channel, "SendMessage"), rpc_stub(channel, "ReceiveMessage")
        for _ in range(MESSAGES):
            sent = send(pb.SendMessageRequest(messages=[_message(body)]), metadata=_metadata("p"), timeout=30)
            assert sent.status.code == pb.Code.OK, sent.status

        gone = receive(_receive_request(MESSAGES), metadata=_metadata("c1"), timeout=30)
        assert next(gone).status.code == pb.Code.OK  # the status; the client reads no further
        time.sleep(1)  # the broker writes what the transport takes, then waits
        gone.cancel()

        got = 0
        deadline = time.monotonic() + 6  # the messages' invisible time is 60 s
        while time.monotonic() < deadline and got < MESSAGES:
            for answer in receive(_receive_request(MESSAGES), metadata=_metadata("c2"), timeout=30):
                got += answer.WhichOneof("content") == "message"
    # what the transport had taken (a few MiB) stays in flight until its time; the rest came back
    assert got >= MESSAGES // 4, got
