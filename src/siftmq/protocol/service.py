"""The RPCs siftmq serves: wire paths, message types and call shapes.

``apache.rocketmq.v2.MessagingService`` is RocketMQ's protocol: our protobuf package is
``siftmq.protocol.v2`` but the method paths here are the protocol's, so the official clients reach
these handlers unchanged. ``siftmq.v2.BatchMessagingService`` is siftmq's own extension (see
``siftmq_batch.proto``): pull and receive answered in one frame, and sends column by column, used by
siftmq's client when offered.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Literal

from google.protobuf.message import Message

from siftmq.protocol import rocketmq_v2_pb2 as pb
from siftmq.protocol import siftmq_batch_pb2 as batch_pb

SERVICE_NAME: Final = "apache.rocketmq.v2.MessagingService"
#: Entries of one AckMessage (also the ack of an AckAndReceive) a siftmq broker takes: acks are
#: made on the event loop when they can be, so their count is bounded like every other input.
MAX_ACK_ENTRIES: Final = 1024
BATCH_SERVICE_NAME: Final = "siftmq.v2.BatchMessagingService"

Shape = Literal["unary_unary", "unary_stream", "stream_stream"]


@dataclass(frozen=True, slots=True)
class Rpc:
    name: str
    shape: Shape
    request: type[Message] | None  # None: not decoded (calls siftmq does not serve)
    response: type[Message]
    service: str = SERVICE_NAME

    @property
    def path(self) -> str:
        return f"/{self.service}/{self.name}"

    def status_answer(self, status: pb.Status) -> Message:
        """This RPC's answer carrying only ``status`` (a refused call's): SendMessage's in its one
        entry too, since the official client reads the entry's status."""
        if self.response is pb.SendMessageResponse:
            return pb.SendMessageResponse(status=status, entries=[pb.SendResultEntry(status=status)])
        return self.response(status=status)


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

#: siftmq's extension: the requests of PullMessage and ReceiveMessage, every message in one answer;
#: SendMessage's messages sent column by column; a pull consumer's commit of many queues; and a
#: simple consumer's acknowledgements with its next receive.
BATCH_RPCS: Final[tuple[Rpc, ...]] = (
    Rpc("PullMessages", "unary_unary", pb.PullMessageRequest, batch_pb.PullBatchResponse, BATCH_SERVICE_NAME),
    Rpc(
        "ReceiveMessages",
        "unary_unary",
        pb.ReceiveMessageRequest,
        batch_pb.ReceiveBatchResponse,
        BATCH_SERVICE_NAME,
    ),
    Rpc(
        "SendMessages",
        "unary_unary",
        batch_pb.SendBatchRequest,
        batch_pb.SendBatchResponse,
        BATCH_SERVICE_NAME,
    ),
    Rpc(
        "UpdateOffsets",
        "unary_unary",
        batch_pb.UpdateOffsetsRequest,
        batch_pb.UpdateOffsetsResponse,
        BATCH_SERVICE_NAME,
    ),
    Rpc(
        "AckAndReceive",
        "unary_unary",
        batch_pb.AckAndReceiveRequest,
        batch_pb.AckAndReceiveResponse,
        BATCH_SERVICE_NAME,
    ),
)
