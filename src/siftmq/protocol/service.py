"""The RPCs of ``apache.rocketmq.v2.MessagingService``: wire paths, message types and call shapes.

Our protobuf package is ``siftmq.protocol.v2``; the method paths here are the protocol's, so the
official clients reach these handlers unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Literal

from google.protobuf.message import Message

from siftmq.protocol import rocketmq_v2_pb2 as pb

SERVICE_NAME: Final = "apache.rocketmq.v2.MessagingService"

Shape = Literal["unary_unary", "unary_stream", "stream_stream"]


@dataclass(frozen=True, slots=True)
class Rpc:
    name: str
    shape: Shape
    request: type[Message] | None  # None: not decoded (calls siftmq does not serve)
    response: type[Message]

    @property
    def path(self) -> str:
        return f"/{SERVICE_NAME}/{self.name}"


RPCS: Final[tuple[Rpc, ...]] = (
    Rpc("QueryRoute", "unary_unary", pb.QueryRouteRequest, pb.QueryRouteResponse),
    Rpc("Heartbeat", "unary_unary", pb.HeartbeatRequest, pb.HeartbeatResponse),
    Rpc("SendMessage", "unary_unary", pb.SendMessageRequest, pb.SendMessageResponse),
    Rpc("QueryAssignment", "unary_unary", pb.QueryAssignmentRequest, pb.QueryAssignmentResponse),
    Rpc("ReceiveMessage", "unary_stream", pb.ReceiveMessageRequest, pb.ReceiveMessageResponse),
    Rpc("AckMessage", "unary_unary", pb.AckMessageRequest, pb.AckMessageResponse),
    Rpc(
        "ForwardMessageToDeadLetterQueue",
        "unary_unary",
        pb.ForwardMessageToDeadLetterQueueRequest,
        pb.ForwardMessageToDeadLetterQueueResponse,
    ),
    Rpc("PullMessage", "unary_stream", pb.PullMessageRequest, pb.PullMessageResponse),
    Rpc("UpdateOffset", "unary_unary", pb.UpdateOffsetRequest, pb.UpdateOffsetResponse),
    Rpc("GetOffset", "unary_unary", pb.GetOffsetRequest, pb.GetOffsetResponse),
    Rpc("QueryOffset", "unary_unary", pb.QueryOffsetRequest, pb.QueryOffsetResponse),
    Rpc("EndTransaction", "unary_unary", None, pb.StatusOnlyResponse),
    Rpc("Telemetry", "stream_stream", pb.TelemetryCommand, pb.TelemetryCommand),
    Rpc(
        "NotifyClientTermination",
        "unary_unary",
        pb.NotifyClientTerminationRequest,
        pb.NotifyClientTerminationResponse,
    ),
    Rpc(
        "ChangeInvisibleDuration",
        "unary_unary",
        pb.ChangeInvisibleDurationRequest,
        pb.ChangeInvisibleDurationResponse,
    ),
    Rpc("RecallMessage", "unary_unary", None, pb.StatusOnlyResponse),
    Rpc("SyncLiteSubscription", "unary_unary", None, pb.StatusOnlyResponse),
)
