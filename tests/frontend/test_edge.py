"""A broker with ``--workers 2``, from a review that reached past its front-ends: one call whose
metadata made a frame the core refuses (which broke the link, and every other call on it), the
port left free while no front-end listened, and a refused call's client id forging audit lines."""

from __future__ import annotations

import contextlib
import functools
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import grpc
import h2.config
import h2.connection
import h2.events
import h2.exceptions
import h2.settings
import pytest

from siftmq.protocol import rocketmq_v2_pb2 as pb
from siftmq.protocol.service import RPCS
from siftmq.testing import BrokerProcess

pytestmark = [pytest.mark.integration, pytest.mark.slow]
PATHS = {rpc.name: rpc.path for rpc in RPCS}


@pytest.fixture
def broker_of(start_broker: Any) -> Any:
    """``start_broker`` with two front-ends."""
    return functools.partial(start_broker, workers=2)


def front_end_pids(core_pid: int) -> list[int]:
    out = subprocess.run(
        ["ps", "-o", "pid=,args=", "--ppid", str(core_pid)], check=False, capture_output=True, text=True
    )
    return sorted(int(line.split()[0]) for line in out.stdout.splitlines() if "siftmq.frontend" in line)


def _two_front_ends(broker: BrokerProcess) -> list[int] | None:
    assert broker.proc is not None
    pids = front_end_pids(broker.proc.pid)
    return pids if len(pids) == 2 else None


def wait_for(predicate: Any, timeout: float = 30.0, what: str = "") -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := predicate():
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what or predicate}")


def raw_call(
    endpoint: str,
    path: str,
    headers: list[tuple[str, str]],
    body: bytes,
    timeout: float = 30,
    *,
    settled: bool = False,
) -> dict[str, Any]:
    """One gRPC call over HTTP/2 by hand (no client-side bound on the metadata, as a hostile client
    sends it): the response's trailers, or how the connection ended. ``settled``: the call's headers
    go only after the server's settings are acknowledged (its bound on metadata then holds)."""
    host, port = endpoint.rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=timeout)
    config = h2.config.H2Configuration(
        client_side=True,
        validate_outbound_headers=False,
        normalize_outbound_headers=False,
        validate_inbound_headers=False,
    )
    conn = h2.connection.H2Connection(config=config)
    encode = conn.encoder.encode
    conn.encoder.encode = lambda headers, huffman=True: encode(headers, huffman=False)  # fast on MBs
    conn.initiate_connection()
    conn.update_settings({h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 1 << 30})
    if settled:  # (h2 queues its acknowledgement of the settings ahead of the headers)
        sock.sendall(conn.data_to_send())
        events: list[Any] = []
        while not any(isinstance(event, h2.events.RemoteSettingsChanged) for event in events):
            data = sock.recv(1 << 16)
            assert data, "the server closed the connection before its settings"
            events = conn.receive_data(data)
    all_headers = [
        (":method", "POST"),
        (":scheme", "http"),
        (":path", path),
        (":authority", endpoint),
        ("content-type", "application/grpc"),
        ("te", "trailers"),
        *headers,
    ]
    conn.send_headers(1, [(k.encode(), v.encode()) for k, v in all_headers])
    sock.sendall(conn.data_to_send())
    unsent = b"\x00" + struct.pack(">I", len(body)) + body
    out: dict[str, Any] = {"trailers": {}, "ended": ""}
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            if unsent:
                room = min(conn.local_flow_control_window(1), conn.max_outbound_frame_size, len(unsent))
                if room > 0:
                    conn.send_data(1, unsent[:room], end_stream=room == len(unsent))
                    unsent = unsent[room:]
                    sock.sendall(conn.data_to_send())
                    continue
            data = sock.recv(1 << 16)
            if not data:
                out["ended"] = "closed"
                return out
            for event in conn.receive_data(data):
                if isinstance(event, h2.events.DataReceived):
                    conn.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
                elif isinstance(event, h2.events.TrailersReceived | h2.events.ResponseReceived):
                    # a trailers-only answer (an error before any message) has its status here
                    out["trailers"].update((k.decode(), v.decode()) for k, v in event.headers)
                elif isinstance(event, h2.events.StreamReset):
                    out["ended"] = f"reset {event.error_code}"
                elif isinstance(event, h2.events.ConnectionTerminated):
                    out["ended"] = f"goaway {event.error_code}"
                if isinstance(
                    event, h2.events.StreamEnded | h2.events.StreamReset | h2.events.ConnectionTerminated
                ):
                    return out
            sock.sendall(conn.data_to_send())
        out["ended"] = "timeout"
        return out
    except (OSError, h2.exceptions.ProtocolError) as exc:  # the connection went
        out["ended"] = f"error {exc}"
        return out
    finally:
        sock.close()


def _unknown_field(size: int) -> bytes:
    """A request the decoder passes over: field 1000, ``size`` bytes."""
    from google.protobuf.internal.encoder import _VarintBytes  # type: ignore[attr-defined]

    return bytes(_VarintBytes((1000 << 3) | 2)) + bytes(_VarintBytes(size)) + b"x" * size


def _long_polls(endpoint: str, count: int, seconds: int) -> tuple[list[threading.Thread], list[str]]:
    """``count`` receives held open on their own connections (spread over the front-ends); each
    records how it ended."""
    outcomes: list[str] = []

    def receive() -> None:
        request = pb.ReceiveMessageRequest(
            group=pb.Resource(name="g-bystander"),
            message_queue=pb.MessageQueue(topic=pb.Resource(name="Bystander"), id=-1),
            filter_expression=pb.FilterExpression(type=pb.FilterType.TAG, expression="*"),
            batch_size=1,
        )
        request.invisible_duration.FromSeconds(30)
        request.long_polling_timeout.FromSeconds(seconds)
        with grpc.insecure_channel(endpoint, options=[("grpc.use_local_subchannel_pool", 1)]) as channel:
            stub = channel.unary_stream(
                PATHS["ReceiveMessage"],
                pb.ReceiveMessageRequest.SerializeToString,
                pb.ReceiveMessageResponse.FromString,
            )
            try:
                codes = [answer.status.code for answer in stub(request, timeout=seconds + 15)]
                outcomes.append("ok" if codes[:1] == [pb.Code.MESSAGE_NOT_FOUND] else f"answered {codes}")
            except grpc.RpcError as exc:
                outcomes.append(f"{exc.code()}: {exc.details()}")

    threads = [threading.Thread(target=receive) for _ in range(count)]
    for thread in threads:
        thread.start()
    return threads, outcomes


def test_a_call_larger_than_the_core_takes_is_refused_alone(broker_of: Any) -> None:
    """Metadata and a request that together exceed what the core reads in one frame: the call is
    refused RESOURCE_EXHAUSTED by the front-end; the other calls on it, and the front-end, go on."""
    broker = broker_of()
    assert broker.proc is not None
    pids = wait_for(lambda: _two_front_ends(broker), what="2 front-ends")
    threads, outcomes = _long_polls(broker.endpoint, 6, 6)
    time.sleep(1.5)  # the long polls are held by the core
    limit = 12 * 1024 * 1024  # the largest message of the defaults' frame limit, less room for its head
    tries = [(100_000, limit - 200), (1_000_000, limit - 200), (12_700_000, 64), (200_000, 64)]
    answers = []
    for metadata, request in tries:
        answers.append(
            raw_call(
                broker.endpoint, PATHS["QueryRoute"], [("x-pad", "p" * metadata)], _unknown_field(request)
            )
        )
    for thread in threads:
        thread.join(30)
    assert outcomes == ["ok"] * 6, outcomes
    for answer in answers[:3]:
        trailers = answer["trailers"]
        assert trailers.get("grpc-status") == str(grpc.StatusCode.RESOURCE_EXHAUSTED.value[0]), answer
        assert "exceed what the broker takes" in trailers.get("grpc-message", ""), answer
    assert answers[3]["trailers"].get("grpc-status") == "0", answers[3]  # large metadata alone is served
    assert front_end_pids(broker.proc.pid) == pids
    assert not any("closing the front-end link" in line for line in broker.output), broker.log()


@pytest.mark.parametrize("workers", [1, 2])
def test_the_same_metadata_is_always_answered_the_same_way(start_broker: Any, workers: int) -> None:
    """gRPC core refuses metadata between two bounds at random (it refused about one call in seventeen of
    1 MB sent before the settings' acknowledgement, half of those of 12 KB sent after it): the
    broker's bounds are exact, served under them and refused past them, every time."""
    broker = start_broker(workers=workers)
    tries = [(12_000, True, "0"), (17_000, True, "8"), (1_000_000, False, "0")]
    for size, settled, status in tries:
        statuses = [
            raw_call(broker.endpoint, PATHS["QueryRoute"], [("x-pad", "p" * size)], b"", settled=settled)[
                "trailers"
            ].get("grpc-status")
            for _ in range(6)
        ]
        assert statuses == [status] * 6, (size, settled, statuses)


@pytest.mark.parametrize("listen", ["127.0.0.1", "0.0.0.0"])
def test_no_other_socket_binds_the_port_while_no_front_end_listens(broker_of: Any, listen: str) -> None:
    """Both front-ends killed (a crash): until they listen again the port is still held, so no
    other program (another user's, or this user's without SO_REUSEPORT) takes the broker's clients;
    on a wildcard address, IPv6's too (gRPC listens there as [::], dual stack)."""
    broker = broker_of(listen=f"{listen}:0", config={"allow_anonymous": True})
    assert broker.proc is not None
    pids = wait_for(lambda: _two_front_ends(broker), what="2 front-ends")
    host, port = broker.endpoint.rsplit(":", 1)
    os.kill(broker.proc.pid, signal.SIGSTOP)  # the core starts no front-end again until SIGCONT
    try:
        for pid in pids:
            os.kill(pid, signal.SIGKILL)
        for pid in pids:
            wait_for(lambda pid=pid: _zombie(pid), 10, f"front-end {pid} to die")
        binds = [_try_bind(host, int(port), reuse_port=False)]
        if listen == "0.0.0.0" and socket.has_ipv6:
            binds.append(_try_bind_ipv6_only(int(port)))
        if os.geteuid() == 0:  # another user, even with SO_REUSEPORT
            binds.append(_try_bind_as_nobody(host, int(port)))
    finally:
        os.kill(broker.proc.pid, signal.SIGCONT)
    assert binds == ["refused"] * len(binds), binds
    wait_for(lambda: len(front_end_pids(broker.proc.pid)) == 2, what="front-ends started again")
    with grpc.insecure_channel(broker.endpoint) as channel:
        stub = channel.unary_unary(
            PATHS["QueryRoute"], pb.QueryRouteRequest.SerializeToString, pb.QueryRouteResponse.FromString
        )
        answer = stub(pb.QueryRouteRequest(topic=pb.Resource(name="Held")), timeout=10, wait_for_ready=True)
    assert answer.status.code == pb.Code.ILLEGAL_ACCESS_POINT, answer  # the broker answered (no endpoints)


def _zombie(pid: int) -> bool:
    """Dead (its sockets closed), whether or not its parent has reaped it."""
    with contextlib.suppress(OSError):
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    return True


def _try_bind(host: str, port: int, *, reuse_port: bool) -> str:
    with socket.socket() as other:
        other.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if reuse_port:
            other.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        try:
            other.bind((host, port))
            other.listen()
        except OSError:
            return "refused"
    return "bound"


def _try_bind_ipv6_only(port: int) -> str:
    """An IPv6-only socket on [::] (on a host without IPv6 there is nothing to take: refused too)."""
    with socket.socket(socket.AF_INET6) as other:
        other.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        try:
            other.bind(("::", port))
            other.listen()
        except OSError:
            return "refused"
    return "bound"


def _try_bind_as_nobody(host: str, port: int) -> str:
    code = (
        "import socket\n"
        "s = socket.socket()\n"
        "s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
        "s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)\n"
        "try:\n"
        f"    s.bind(({host!r}, {port})); s.listen(); print('bound')\n"
        "except OSError:\n"
        "    print('refused')\n"
    )
    drop = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
    done = subprocess.run(
        [*drop, sys.executable, "-I", "-c", code], check=False, capture_output=True, text=True, timeout=30
    )
    return done.stdout.strip() or done.stderr.strip()


def test_a_refused_calls_client_id_cannot_forge_audit_lines(broker_of: Any, tmp_path: Path) -> None:
    """A front-end refuses a bad signature and reports it with the client id the call named; the
    core writes it to the audit log with its unprintable characters replaced, as in one process."""
    auth_file = tmp_path / "auth.json"
    users = [{"username": "alice", "password": "Al1ce-s3cret-pw", "userType": "Super"}]
    auth_file.write_text(json.dumps({"users": users, "acls": []}))
    auth_file.chmod(0o600)
    config = {"authentication_enabled": True, "authorization_enabled": True, "auth_file": str(auth_file)}
    broker = broker_of(config=config)
    forged = "1999-01-01 00:00:00,000 WARNING siftmq.server.auth: FORGED LINE"
    headers = [
        ("x-mq-client-id", f"evil\r\n{forged}"),
        ("authorization", "MQv2-HMAC-SHA1 Credential=alice, SignedHeaders=x-mq-date-time, Signature=00"),
        ("x-mq-date-time", time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())),
    ]
    answer = raw_call(broker.endpoint, PATHS["QueryRoute"], headers, b"")
    assert answer["trailers"].get("grpc-status") == "0", answer  # the UNAUTHORIZED status is in the body
    wait_for(lambda: any("authentication failed" in line for line in broker.output), 10, "the audit line")
    assert not any(line.startswith("1999-01-01") for line in broker.output), broker.log()
    audit = next(line for line in broker.output if "authentication failed" in line)
    assert "evil??1999-01-01" in audit, audit
