"""The gRPC floor, and the broker's CPU per standard call as a ratio to it, in the same run.

The floor is a trivial ``grpc.aio`` server process with the broker's server options and the same
message types: SendMessage, ReceiveMessage (the frames a broker must send: status, one message,
the delivery timestamp) and AckMessage handlers that decode the request and answer a constant.
The load is the official client's shape, one message per call, with its metadata (client id,
language, protocol, request id, date): 8 threads of sync stubs. Against the floor server and
against a broker (async flush), in alternating rounds, it reports the server process's CPU per call
and the ratio broker / floor.

Run: ``.venv/bin/python benchmarks/bench_floor.py [--calls N] [--rounds R]``. With
``--profile`` it also records the broker under the send load with py-spy (if installed) and prints
its top functions.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import grpc
from google.protobuf.timestamp_pb2 import Timestamp

from siftmq.broker.config import BrokerConfig
from siftmq.frontend.limits import connection_limit, server_options, streams_per_connection
from siftmq.protocol import rocketmq_v2_pb2 as pb
from siftmq.protocol.service import RPCS, SERVICE_NAME
from siftmq.testing import running_broker

sys.path.insert(0, str(Path(__file__).parent))
from bench_client import cpu_seconds, run_threads

RPC = {r.name: r for r in RPCS}
HANDLES: dict[str, list[tuple[str, str]]] = {}
BODY = os.urandom(1024)
TOPIC, GROUP = "FloorBench", "floor-bench"
OPTIONS = [("grpc.max_receive_message_length", 8 << 20), ("grpc.max_send_message_length", 8 << 20)]
SERVER_OPTIONS = server_options(  # the broker's own
    8 << 20, connection_limit(0), streams_per_connection(BrokerConfig().max_queue_nums), reuse_port=False
)


# ------------------------------------------------------------------------------- the floor server


def serve_floor() -> None:
    """A trivial server (run as ``bench_floor.py --floor-server``): prints its port, serves until killed."""
    ok = pb.Status(code=pb.Code.OK, message="OK")
    sent = pb.SendMessageResponse(
        status=ok, entries=[pb.SendResultEntry(status=ok, message_id="01AB", offset=1)]
    )
    message = pb.Message(
        topic=pb.Resource(name=TOPIC),
        body=BODY,
        system_properties=pb.SystemProperties(message_id="01AB", receipt_handle="h"),
    )
    acked = pb.AckMessageResponse(status=ok, entries=[pb.AckMessageResultEntry(status=ok)])
    delivered = Timestamp(seconds=1_764_000_000)

    async def send(request: Any, context: Any) -> Any:
        return sent

    async def receive(request: Any, context: Any) -> Any:
        # the frames a broker must send: the official PushConsumer needs the trailing timestamp
        yield pb.ReceiveMessageResponse(status=ok)
        yield pb.ReceiveMessageResponse(message=message)
        yield pb.ReceiveMessageResponse(delivery_timestamp=delivered)

    async def ack(request: Any, context: Any) -> Any:
        return acked

    handlers = {
        "SendMessage": grpc.unary_unary_rpc_method_handler(
            send, pb.SendMessageRequest.FromString, pb.SendMessageResponse.SerializeToString
        ),
        "ReceiveMessage": grpc.unary_stream_rpc_method_handler(
            receive, pb.ReceiveMessageRequest.FromString, pb.ReceiveMessageResponse.SerializeToString
        ),
        "AckMessage": grpc.unary_unary_rpc_method_handler(
            ack, pb.AckMessageRequest.FromString, pb.AckMessageResponse.SerializeToString
        ),
    }

    async def main() -> None:
        server = grpc.aio.server(options=SERVER_OPTIONS)
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE_NAME, handlers),))
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        print(port, flush=True)
        await server.wait_for_termination()

    asyncio.run(main())


# ------------------------------------------------------------------------------------- the load


def metadata(client_id: str) -> tuple[tuple[str, str], ...]:
    return (
        ("x-mq-client-id", client_id),
        ("x-mq-language", "PYTHON"),
        ("x-mq-protocol", "GRPC_V2"),
        ("x-mq-client-version", "5.1.2"),
        ("x-mq-request-id", uuid.uuid4().hex),
        ("x-mq-date-time", time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())),
    )


def send_request(topic: str, body: bytes) -> pb.SendMessageRequest:
    """One message, as the official client sends it."""
    msg = pb.Message(
        topic=pb.Resource(name=topic),
        body=body,
        system_properties=pb.SystemProperties(
            message_id=uuid.uuid4().hex.upper(),
            tag="t",
            message_type=pb.MessageType.NORMAL,
            body_encoding=pb.Encoding.IDENTITY,
        ),
    )
    return pb.SendMessageRequest(messages=[msg])


def receive_request(group: str, topic: str, invisible_s: int) -> pb.ReceiveMessageRequest:
    """A receive of one message of any tag from any queue, held up to 1 s."""
    request = pb.ReceiveMessageRequest(
        group=pb.Resource(name=group),
        message_queue=pb.MessageQueue(topic=pb.Resource(name=topic), id=-1),
        filter_expression=pb.FilterExpression(type=pb.FilterType.TAG, expression="*"),
        batch_size=1,
        auto_renew=False,
    )
    request.invisible_duration.FromSeconds(invisible_s)
    request.long_polling_timeout.FromSeconds(1)
    return request


def ack_request(group: str, topic: str, message_id: str, handle: str) -> pb.AckMessageRequest:
    entry = pb.AckMessageEntry(message_id=message_id, receipt_handle=handle)
    return pb.AckMessageRequest(group=pb.Resource(name=group), topic=pb.Resource(name=topic), entries=[entry])


def calls(endpoint: str, kind: str, total: int, threads: int = 8) -> float:
    """``total`` calls of ``kind`` (send, receive, ack) from ``threads`` threads; seconds taken."""
    counter = iter(range(total))
    handles = HANDLES.setdefault(endpoint, [])  # what receive got, for ack to acknowledge
    lock = threading.Lock()

    def worker(n: int) -> None:
        client_id = f"floor-{n}-{uuid.uuid4().hex[:6]}"
        with grpc.insecure_channel(endpoint, options=OPTIONS) as channel:
            send = channel.unary_unary(
                RPC["SendMessage"].path,
                pb.SendMessageRequest.SerializeToString,
                pb.SendMessageResponse.FromString,
            )
            receive = channel.unary_stream(
                RPC["ReceiveMessage"].path,
                pb.ReceiveMessageRequest.SerializeToString,
                pb.ReceiveMessageResponse.FromString,
            )
            ack = channel.unary_unary(
                RPC["AckMessage"].path,
                pb.AckMessageRequest.SerializeToString,
                pb.AckMessageResponse.FromString,
            )
            for _ in counter:
                if kind == "send":
                    send(send_request(TOPIC, BODY), timeout=10, metadata=metadata(client_id))
                elif kind == "receive":
                    request = receive_request(GROUP, TOPIC, 60)
                    for answer in receive(request, timeout=10, metadata=metadata(client_id)):
                        if answer.WhichOneof("content") == "message":
                            with lock:
                                handles.append(
                                    (
                                        answer.message.system_properties.message_id,
                                        answer.message.system_properties.receipt_handle,
                                    )
                                )
                else:
                    with lock:
                        found = handles.pop() if handles else None
                    if found is None:
                        break
                    ack(ack_request(GROUP, TOPIC, *found), timeout=10, metadata=metadata(client_id))

    return run_threads(worker, threads)


def measure(pid: int, endpoint: str, kind: str, total: int) -> tuple[float, float]:
    """(calls/s, server CPU µs per call)."""
    if kind == "ack":  # as many as the receives got
        total = min(total, len(HANDLES.get(endpoint, [])))
    cpu = cpu_seconds(pid)
    elapsed = calls(endpoint, kind, total)
    return total / elapsed, (cpu_seconds(pid) - cpu) / total * 1e6


def profile(pid: int, endpoint: str, total: int) -> None:
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if not Path(spy).exists():
        print("py-spy not installed: no profile", flush=True)
        return
    out = Path(f"/tmp/siftmq-floor-{pid}.txt")
    recorder = subprocess.Popen(
        [spy, "record", "-p", str(pid), "-f", "raw", "-o", str(out), "-r", "200", "--nonblocking"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    time.sleep(1)
    calls(endpoint, "send", total)
    recorder.send_signal(signal.SIGINT)  # py-spy writes its output on an interrupt
    recorder.wait(30)
    inclusive: dict[str, int] = {}
    leaf: dict[str, int] = {}
    samples = 0
    for line in out.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        frames = stack.split(";")
        if "wait" in frames[-1] or "select" in frames[-1]:
            continue  # idle: a thread waiting
        samples += int(count)
        leaf[frames[-1]] = leaf.get(frames[-1], 0) + int(count)
        for frame in {f for f in frames if "siftmq" in f or "grpc" in f}:
            inclusive[frame] = inclusive.get(frame, 0) + int(count)
    print(f"py-spy, broker under SendMessage: {samples} busy samples")
    print("siftmq and grpc frames, by the share of busy samples they are on the stack of:")
    for frame, n in sorted(inclusive.items(), key=lambda kv: -kv[1])[:30]:
        print(f"  {n / samples:6.1%}  {frame[:140]}")
    print("where the samples were (the innermost frame):")
    for frame, n in sorted(leaf.items(), key=lambda kv: -kv[1])[:25]:
        print(f"  {n / samples:6.1%}  {frame[:140]}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=4000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--floor-server", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.floor_server:
        serve_floor()
        return
    floor = subprocess.Popen([sys.executable, __file__, "--floor-server"], stdout=subprocess.PIPE, text=True)
    try:
        assert floor.stdout is not None
        floor_endpoint = f"127.0.0.1:{floor.stdout.readline().strip()}"
        with running_broker({"auto_create_topics": True}) as broker:
            assert broker.proc is not None
            calls(broker.endpoint, "send", 100)  # the topic exists, routes warm
            for r in range(args.rounds):
                for kind in ("send", "receive", "ack"):
                    rows = {}
                    order = [
                        ("floor", floor.pid, floor_endpoint),
                        ("broker", broker.proc.pid, broker.endpoint),
                    ]
                    for label, pid, endpoint in order if r % 2 == 0 else order[::-1]:
                        rows[label] = measure(pid, endpoint, kind, args.calls)
                    ratio = rows["broker"][1] / rows["floor"][1]
                    (floor_rate, floor_cpu) = rows["floor"]
                    print(
                        f"round {r + 1}, {kind:7}: floor {floor_rate:,.0f} calls/s, {floor_cpu:.0f} us CPU; "
                        f"broker {rows['broker'][0]:,.0f} calls/s, {rows['broker'][1]:.0f} us CPU "
                        f"({ratio:.2f}x the floor)",
                        flush=True,
                    )
            if args.profile:
                profile(broker.proc.pid, broker.endpoint, args.calls)
    finally:
        floor.kill()
        floor.wait()


if __name__ == "__main__":
    main()
