"""What one hostile client may hold of a real broker over gRPC, from a review that took brokers down
with traffic they accepted: small requests that decode to hundreds of MiB, and connections held
until the process ran out of file descriptors."""

from __future__ import annotations

import asyncio
import select
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import grpc
import h2.config
import h2.connection
import h2.errors
import httpx
import pytest

from siftmq.client import Producer, PullConsumer
from siftmq.protocol import rocketmq_v2_pb2 as pb

pytestmark = pytest.mark.integration

SERVICE = "/apache.rocketmq.v2.MessagingService/"
BIG = [("grpc.max_send_message_length", 64 * 1024 * 1024)]


def _peak_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmHWM")


def _call(
    channel: grpc.Channel, method: str, payload: bytes, *, timeout: float = 30
) -> tuple[grpc.StatusCode, str]:
    try:
        channel.unary_unary(SERVICE + method)(payload, timeout=timeout)
    except grpc.RpcError as exc:
        return exc.code(), exc.details() or ""
    return grpc.StatusCode.OK, ""


def test_requests_of_millions_of_empty_entries_are_refused_before_they_are_decoded(start_broker: Any) -> None:
    """11 MiB of empty ack entries (or of empty keys in one message) decoded to ~500 MiB before the
    handler's count was checked; they are now counted on the wire and refused, naming the bound."""
    broker = start_broker("data")
    before = _peak_rss_mib(broker.proc.pid)
    empty_entries = b"\x1a\x00" * (11 * 1024 * 1024 // 2)
    hostile = {
        "AckMessage": empty_entries,
        # an unknown group field first: the decoder keeps it and the rest, the count must not stop
        "ChangeInvisibleDuration": b"\xa3\x06\xa4\x06" + empty_entries,
        "SendMessage": pb.SendMessageRequest(
            messages=[pb.Message(system_properties=pb.SystemProperties(keys=[""] * 5_000_000))]
        ).SerializeToString(),
    }
    with grpc.insecure_channel(broker.endpoint, options=BIG) as channel:
        for method, payload in hostile.items():
            for _ in range(3):
                code, details = _call(channel, method, payload)
                assert code == grpc.StatusCode.INVALID_ARGUMENT, (method, code, details)
                assert "fields and repeated items" in details or "group field" in details, details
        # the largest batch of the standard protocol goes through: 1,024 messages of 128 properties
        # and 32 keys each
        batch = [
            pb.Message(
                topic=pb.Resource(name="Big"),
                body=b"b",
                user_properties={f"p{n}": "v" for n in range(128)},
                system_properties=pb.SystemProperties(
                    message_id=f"01FULLBATCH{i:05d}", keys=[f"k{n}" for n in range(32)]
                ),
            )
            for i in range(1024)
        ]
        answer = channel.unary_unary(SERVICE + "SendMessage")(
            pb.SendMessageRequest(messages=batch).SerializeToString(), timeout=60
        )
        assert pb.SendMessageResponse.FromString(answer).status.code == pb.Code.OK
        # and so does a large message
        body = pb.Message(
            topic=pb.Resource(name="Big"),
            body=b"x" * (3 * 1024 * 1024),
            system_properties=pb.SystemProperties(message_id="01BIGLIMIT", keys=["k"] * 8),
        )
        answer = channel.unary_unary(SERVICE + "SendMessage")(
            pb.SendMessageRequest(messages=[body]).SerializeToString(), timeout=30
        )
    assert pb.SendMessageResponse.FromString(answer).status.code == pb.Code.OK
    assert _peak_rss_mib(broker.proc.pid) - before < 150


def _silent_http2_connection(endpoint: str) -> socket.socket:
    """A connection that does its HTTP/2 handshake and then says nothing."""
    host, port = endpoint.rsplit(":", 1)
    conn = socket.create_connection((host, int(port)), timeout=10)
    conn.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00")
    return conn


def test_connections_past_max_connections_are_refused_and_the_held_ones_keep_being_served(
    start_broker: Any,
) -> None:
    """Silent connections without end took every file descriptor: every call failed, and so did
    the store's own writes. Past max_connections a new connection is refused; the broker and the
    connections it holds go on."""
    broker = start_broker("data", config={"max_connections": 3})
    with grpc.insecure_channel(broker.endpoint) as held:
        route = pb.QueryRouteRequest(topic=pb.Resource(name="Held")).SerializeToString()
        assert _call(held, "QueryRoute", route)[0] == grpc.StatusCode.OK
        silent = [_silent_http2_connection(broker.endpoint) for _ in range(2)]
        try:
            time.sleep(0.5)
            # (channels of one process share connections unless told not to)
            with grpc.insecure_channel(
                broker.endpoint, options=[("grpc.use_local_subchannel_pool", 1)]
            ) as late:
                code, _ = _call(late, "QueryRoute", route, timeout=3)
                assert code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED), code
            assert _call(held, "QueryRoute", route)[0] == grpc.StatusCode.OK
        finally:
            for conn in silent:
                conn.close()
        time.sleep(0.5)
        with grpc.insecure_channel(broker.endpoint, options=[("grpc.use_local_subchannel_pool", 1)]) as after:
            assert _call(after, "QueryRoute", route)[0] == grpc.StatusCode.OK


def _rapid_reset(endpoint: str, stop: threading.Event, sent: list[int]) -> None:
    """HTTP/2 rapid reset (CVE-2023-44487) on one connection until ``stop``: a call's HEADERS and
    at once its RST_STREAM, a hundred a write, reading what the server says in between."""
    host, port = endpoint.rsplit(":", 1)
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    headers = [
        (":method", "POST"),
        (":scheme", "http"),
        (":path", SERVICE + "QueryRoute"),
        (":authority", endpoint),
        ("content-type", "application/grpc"),
        ("te", "trailers"),
    ]
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        conn.initiate_connection()
        sock.sendall(conn.data_to_send())
        sock.setblocking(False)
        while not stop.is_set():
            for _ in range(100):
                stream = conn.get_next_available_stream_id()
                conn.send_headers(stream, headers)
                conn.reset_stream(stream, h2.errors.ErrorCodes.CANCEL)
            sent[0] += 100
            out = conn.data_to_send()
            while out and not stop.is_set():
                readable, writable, _ = select.select([sock], [sock], [], 0.5)
                if writable:
                    out = out[sock.send(out) :]
                if readable:
                    data = sock.recv(1 << 20)
                    if not data:
                        return  # the server closed the connection: nothing more to send
                    conn.receive_data(data)  # answers its SETTINGS and PINGs
                    out += conn.data_to_send()


def test_one_connection_resetting_calls_as_fast_as_it_opens_them_does_not_fail_other_clients_calls(
    start_broker: Any,
) -> None:
    """A connection opening calls and resetting them at once filled gRPC core's queue of calls not
    yet taken up, shared by every connection, and core refused other clients' calls at random: 65%
    of a well-behaved client's calls failed CANCELLED. One connection can no longer fill it."""
    broker = start_broker("data")
    route = pb.QueryRouteRequest(topic=pb.Resource(name="Victim")).SerializeToString()
    stop, sent = threading.Event(), [0]
    attacker = threading.Thread(target=_rapid_reset, args=(broker.endpoint, stop, sent), daemon=True)
    codes: dict[grpc.StatusCode, int] = {}
    with grpc.insecure_channel(broker.endpoint) as victim:
        assert _call(victim, "QueryRoute", route)[0] == grpc.StatusCode.OK
        attacker.start()
        try:
            deadline = time.monotonic() + 8
            while time.monotonic() < deadline:
                code, _ = _call(victim, "QueryRoute", route, timeout=20)
                codes[code] = codes.get(code, 0) + 1
        finally:
            stop.set()
            attacker.join(10)
    assert sent[0] > 5_000, sent  # the attack ran
    assert set(codes) == {grpc.StatusCode.OK}, codes


@pytest.mark.parametrize("workers", [1, 2])
def test_a_pull_of_every_queue_of_a_topic_larger_than_the_default_fits_one_connection(
    start_broker: Any, workers: int
) -> None:
    """The calls a connection may hold at once follow ``max_queue_nums``: siftmq's PullConsumer
    holds a pull on every queue of its topic, and with 1,150 queues (more than the default bound of
    1,100 calls) every pull was refused past the bound. Topics are made with that many queues
    through the admin API and the CLI too, whose own bounds were 1,024."""
    queues = 1150  # past the default bound of 1,100 calls
    broker = start_broker("data", workers=workers, config={"max_queue_nums": 2048})
    cli = [sys.executable, "-m", "siftmq", "admin", "create-topic", "Wide", "--queues", str(queues)]
    made = subprocess.run(
        [*cli, "--url", broker.admin_url],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert made.returncode == 0 and f"{queues} queues" in made.stdout, made.stdout + made.stderr
    topics = f"{broker.admin_url}/topics"
    too_many = httpx.post(topics, json={"name": "Wider", "queue_nums": 2049}, timeout=30)
    assert too_many.status_code == 400 and "1..2048" in too_many.text

    async def scenario(endpoint: str, body: bytes) -> list[bytes]:
        # (a freshly started broker's first pull of every queue may take seconds on a loaded host)
        async with PullConsumer(endpoint, "wide-pull", "Wide", request_timeout=60) as puller:
            assert len(await puller.assignment()) == queues
            assert await puller.poll(16, timeout=1.0) == []  # a pull held on every queue, none refused
            async with Producer(endpoint) as producer:
                await producer.send("Wide", body, tag="t")
            got: list[bytes] = []
            for _ in range(20):
                got += [m.body for m in await puller.poll(16, timeout=1.0)]
                if got:
                    break
            await puller.commit()
            return got

    assert asyncio.run(scenario(broker.endpoint, b"late")) == [b"late"]
    # max_queue_nums lowered below the topic's count: the bound still covers the largest topic
    assert broker.stop() == 0
    again = start_broker("data", workers=workers)
    assert asyncio.run(scenario(again.endpoint, b"later")) == [b"later"]
