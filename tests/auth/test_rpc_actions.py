"""The one table of what each RPC needs (``siftmq.server.auth.ACTIONS``), row by row."""

from __future__ import annotations

import pytest

from siftmq.auth.acl import Action
from siftmq.protocol import rocketmq_v2_pb2 as pb
from siftmq.protocol import siftmq_batch_pb2 as batch_pb
from siftmq.protocol.service import BATCH_RPCS, RPCS
from siftmq.server.auth import ACTIONS

TOPIC = pb.Resource(name="Orders")
GROUP = pb.Resource(name="g")
QUEUE = pb.MessageQueue(topic=TOPIC)
SUB = {("Topic:Orders", Action.SUB), ("Group:g", Action.SUB)}

REQUESTS = {
    "SendMessage": (
        pb.SendMessageRequest(messages=[pb.Message(topic=TOPIC)] * 2),
        {("Topic:Orders", Action.PUB)},
    ),
    "SendMessages": (batch_pb.SendBatchRequest(topic=TOPIC), {("Topic:Orders", Action.PUB)}),
    "ReceiveMessage": (pb.ReceiveMessageRequest(group=GROUP, message_queue=QUEUE), SUB),
    "ReceiveMessages": (pb.ReceiveMessageRequest(group=GROUP, message_queue=QUEUE), SUB),
    "PullMessage": (pb.PullMessageRequest(group=GROUP, message_queue=QUEUE), SUB),
    "PullMessages": (pb.PullMessageRequest(group=GROUP, message_queue=QUEUE), SUB),
    "AckMessage": (pb.AckMessageRequest(group=GROUP, topic=TOPIC), SUB),
    "ChangeInvisibleDuration": (pb.ChangeInvisibleDurationRequest(group=GROUP, topic=TOPIC), SUB),
    "ForwardMessageToDeadLetterQueue": (
        pb.ForwardMessageToDeadLetterQueueRequest(group=GROUP, topic=TOPIC),
        SUB,
    ),
    "QueryAssignment": (pb.QueryAssignmentRequest(group=GROUP, topic=TOPIC), SUB),
    "UpdateOffset": (pb.UpdateOffsetRequest(group=GROUP, message_queue=QUEUE), SUB),
    "UpdateOffsets": (batch_pb.UpdateOffsetsRequest(group=GROUP, topic=TOPIC), SUB),
    "AckAndReceive": (
        batch_pb.AckAndReceiveRequest(
            ack=pb.AckMessageRequest(
                group=pb.Resource(name="h"), topic=pb.Resource(name="Old"), entries=[pb.AckMessageEntry()]
            ),
            receive=pb.ReceiveMessageRequest(group=GROUP, message_queue=QUEUE),
        ),
        SUB | {("Topic:Old", Action.SUB), ("Group:h", Action.SUB)},
    ),
    "GetOffset": (pb.GetOffsetRequest(group=GROUP, message_queue=QUEUE), SUB),
    "QueryOffset": (pb.QueryOffsetRequest(message_queue=QUEUE), {("Topic:Orders", Action.SUB)}),
    "Heartbeat": (pb.HeartbeatRequest(group=GROUP), {("Group:g", Action.SUB)}),
    "NotifyClientTermination": (pb.NotifyClientTerminationRequest(group=GROUP), {("Group:g", Action.SUB)}),
}
#: A Telemetry stream's commands, each checked as it comes (RocketMQ 5.3's rules)
TELEMETRY = [
    (
        pb.TelemetryCommand(
            settings=pb.Settings(publishing=pb.Publishing(topics=[TOPIC, pb.Resource(name="B")]))
        ),
        {("Topic:Orders", Action.PUB), ("Topic:B", Action.PUB)},
    ),
    (
        pb.TelemetryCommand(
            settings=pb.Settings(
                subscription=pb.Subscription(group=GROUP, subscriptions=[pb.SubscriptionEntry(topic=TOPIC)])
            )
        ),
        SUB,
    ),
    (pb.TelemetryCommand(settings=pb.Settings()), set()),
    (pb.TelemetryCommand(status=pb.Status(message="a reply")), set()),
]
#: Served without a resource check: answered UNSUPPORTED.
UNCHECKED = {"EndTransaction", "RecallMessage", "SyncLiteSubscription"}


def test_every_rpc_served_is_in_the_table_or_knowingly_unchecked() -> None:
    served = {rpc.name for rpc in (*RPCS, *BATCH_RPCS)}
    assert served - UNCHECKED == set(ACTIONS)


@pytest.mark.parametrize("name", sorted(REQUESTS))
def test_row(name: str) -> None:
    request, expected = REQUESTS[name]
    need = ACTIONS[name]
    assert need is not None and set(need(request)) == expected


@pytest.mark.parametrize(("command", "expected"), TELEMETRY)
def test_telemetry_commands(command: pb.TelemetryCommand, expected: set[tuple[str, Action]]) -> None:
    need = ACTIONS["Telemetry"]
    assert need is not None and set(need(command)) == expected


def test_a_route_lookup_needs_any_of_pub_sub_get() -> None:
    assert ACTIONS["QueryRoute"] is None
    assert (
        ACTIONS["Heartbeat"] is not None and ACTIONS["Heartbeat"](pb.HeartbeatRequest()) == ()
    )  # a producer


def test_an_ack_and_receive_without_acks_needs_only_the_receive() -> None:
    need = ACTIONS["AckAndReceive"]
    request = batch_pb.AckAndReceiveRequest(
        receive=pb.ReceiveMessageRequest(group=GROUP, message_queue=QUEUE)
    )
    assert need is not None and set(need(request)) == SUB
