"""The standard SendMessage path (a broker without siftmq's extension, such as RocketMQ's proxy)
reads each entry of the answer: a batch stored in part (MULTIPLE_RESULTS, one entry failed) raises
that entry's error instead of handing back receipts for every message.

RocketMQ's proxy cannot run here and siftmq's broker never answers in part, so a small gRPC server
answers as the proxy does for a batch whose second message failed."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import pytest

from siftmq.client import Producer
from siftmq.errors import RemoteError
from siftmq.protocol import rocketmq_v2_pb2 as pb
from siftmq.protocol.service import SERVICE_NAME

pytestmark = pytest.mark.integration


async def _send_message(request: Any, context: Any) -> Any:
    ok = pb.Status(code=pb.Code.OK)
    entries = [
        pb.SendResultEntry(status=ok, message_id=m.system_properties.message_id, offset=i)
        for i, m in enumerate(request.messages)
    ]
    if len(entries) > 1:
        entries[1].status.code = pb.Code.INTERNAL_SERVER_ERROR
        entries[1].status.message = "store failed"
    status = pb.Code.MULTIPLE_RESULTS if len(entries) > 1 else pb.Code.OK
    return pb.SendMessageResponse(status=pb.Status(code=status), entries=entries)


async def _telemetry(requests: Any, context: Any) -> Any:
    async for command in requests:
        yield pb.TelemetryCommand(status=pb.Status(code=pb.Code.OK), settings=command.settings)


async def _notify(request: Any, context: Any) -> Any:
    return pb.NotifyClientTerminationResponse(status=pb.Status(code=pb.Code.OK))


def test_a_batch_stored_in_part_raises_the_failed_entrys_error() -> None:
    async def scenario() -> None:
        server = grpc.aio.server()
        handlers = {
            "SendMessage": grpc.unary_unary_rpc_method_handler(
                _send_message, pb.SendMessageRequest.FromString, pb.SendMessageResponse.SerializeToString
            ),
            "Telemetry": grpc.stream_stream_rpc_method_handler(
                _telemetry, pb.TelemetryCommand.FromString, pb.TelemetryCommand.SerializeToString
            ),
            "NotifyClientTermination": grpc.unary_unary_rpc_method_handler(
                _notify,
                pb.NotifyClientTerminationRequest.FromString,
                pb.NotifyClientTerminationResponse.SerializeToString,
            ),
        }
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE_NAME, handlers),))
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        try:
            async with Producer(f"127.0.0.1:{port}", max_attempts=1) as producer:
                receipt = await producer.send("T", b"alone")  # one message, stored: its receipt
                assert receipt.queue_offset == 0
                with pytest.raises(RemoteError) as failed:
                    await producer.send_many([producer.message("T", b"%d" % i) for i in range(3)])
                assert failed.value.status == "INTERNAL_SERVER_ERROR" and "store failed" in str(failed.value)
        finally:
            await server.stop(None)

    asyncio.run(scenario())
