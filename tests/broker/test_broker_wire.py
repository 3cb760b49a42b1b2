"""The gRPC edge with siftmq's own stubs: bad input, unsupported calls, route shape, process behaviour."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import grpc
import pytest

from siftmq.protocol import rocketmq_v2_pb2 as pb
from siftmq.protocol.service import RPCS

pytestmark = pytest.mark.integration
RPC = {r.name: r for r in RPCS}


class Stub:
    """Calls by RPC name over a plain channel."""

    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint
        self.channel = grpc.insecure_channel(endpoint)

    def __call__(self, name: str, request: Any, timeout: float = 10) -> Any:
        rpc = RPC[name]
        ser = (lambda b: b) if isinstance(request, bytes) else type(request).SerializeToString
        if rpc.shape == "unary_unary":
            call = self.channel.unary_unary(
                rpc.path, request_serializer=ser, response_deserializer=rpc.response.FromString
            )
            return call(request, timeout=timeout)
        call = self.channel.unary_stream(
            rpc.path, request_serializer=ser, response_deserializer=rpc.response.FromString
        )
        return list(call(request, timeout=timeout))

    def endpoints(self) -> pb.Endpoints:
        host, port = self.endpoint.rsplit(":", 1)
        return pb.Endpoints(scheme=pb.AddressScheme.IPv4, addresses=[pb.Address(host=host, port=int(port))])

    def send(
        self,
        topic: str = "Wire",
        body: bytes = b"hello",
        tag: str | None = "T",
        message_id: str = "01AB",
        **props: str,
    ) -> pb.SendMessageResponse:
        sp = pb.SystemProperties(
            message_id=message_id, body_encoding=pb.Encoding.IDENTITY, message_type=pb.MessageType.NORMAL
        )
        if tag is not None:
            sp.tag = tag
        msg = pb.Message(
            topic=pb.Resource(name=topic), body=body, system_properties=sp, user_properties=props
        )
        return self("SendMessage", pb.SendMessageRequest(messages=[msg]))


@pytest.fixture
def stub(start_broker: Any) -> Iterator[Stub]:
    broker = start_broker()
    s = Stub(broker.endpoint)
    yield s
    s.channel.close()


def test_route_gives_master_queues_at_the_callers_endpoint(stub: Stub) -> None:
    resp = stub(
        "QueryRoute", pb.QueryRouteRequest(topic=pb.Resource(name="Routed"), endpoints=stub.endpoints())
    )
    assert resp.status.code == pb.Code.OK
    assert [q.id for q in resp.message_queues] == list(range(8))
    for q in resp.message_queues:
        assert q.broker.id == 0 and q.permission == pb.Permission.READ_WRITE
        assert list(q.accept_message_types) == [pb.MessageType.NORMAL]
        assert q.broker.endpoints == stub.endpoints()


@pytest.mark.parametrize(
    ("kwargs", "code"),
    [
        ({"tag": "A|B"}, pb.Code.ILLEGAL_MESSAGE_TAG),
        ({"topic": "no spaces"}, pb.Code.ILLEGAL_TOPIC),
        ({"body": b""}, pb.Code.MESSAGE_BODY_EMPTY),
        ({"body": b"x" * (4 * 1024 * 1024 + 1)}, pb.Code.MESSAGE_BODY_TOO_LARGE),
        ({"message_id": ""}, pb.Code.ILLEGAL_MESSAGE_ID),
        ({"UNIQ_KEY": "mine"}, pb.Code.ILLEGAL_MESSAGE_PROPERTY_KEY),
        ({"bad": "\x01"}, pb.Code.BAD_REQUEST),
    ],
)
def test_bad_sends_get_their_status_and_the_broker_keeps_serving(
    stub: Stub, kwargs: dict[str, Any], code: int
) -> None:
    resp = stub.send(**kwargs)
    assert resp.status.code == code, resp.status.message
    assert resp.status.message
    ok = stub.send(message_id="01OK")
    assert ok.status.code == pb.Code.OK and len(ok.entries) == 1 and ok.entries[0].message_id == "01OK"


def test_a_send_may_not_forge_the_brokers_dead_letter_reason(start_broker: Any) -> None:
    """FILTER_ERROR is what the broker writes on a message a filter program failed on when it moves
    it to the dead-letter topic: a producer's own would be shown as the broker's reason."""
    import httpx

    broker = start_broker()
    stub = Stub(broker.endpoint)
    try:
        assert stub.send(message_id="01FIRST").status.code == pb.Code.OK
        forged = stub.send(message_id="01FORGED", FILTER_ERROR="SyntaxError: nothing wrong really")
        assert forged.status.code == pb.Code.ILLEGAL_MESSAGE_PROPERTY_KEY
        assert "'FILTER_ERROR' is reserved by the broker" in forged.status.message
    finally:
        stub.channel.close()
    stored = httpx.get(f"{broker.admin_url}/topics/Wire", timeout=10).json()
    assert stored["messages"] == 1  # the first only
    assert httpx.get(f"{broker.admin_url}/messages/01FORGED", timeout=10).status_code == 404


def _raw_send(stub: Stub, message_id: str, **system: Any) -> pb.SendMessageResponse:
    sp = pb.SystemProperties(message_id=message_id, body_encoding=pb.Encoding.IDENTITY, **system)
    msg = pb.Message(topic=pb.Resource(name="Typed"), body=b"x", system_properties=sp)
    return stub("SendMessage", pb.SendMessageRequest(messages=[msg]))


def test_message_types_other_than_normal_are_refused_by_name(start_broker: Any) -> None:
    """A TRANSACTION half message was delivered at once as a normal one (and could never be rolled
    back), as were DELAY, FIFO, PRIORITY and LITE messages without their fields; each is refused
    naming its type, and nothing is stored."""
    import httpx

    broker = start_broker()
    stub = Stub(broker.endpoint)
    try:
        kinds = ("FIFO", "DELAY", "TRANSACTION", "LITE", "PRIORITY")
        for kind in kinds:
            answer = _raw_send(stub, f"01{kind}", message_type=pb.MessageType.Value(kind))
            assert answer.status.code == pb.Code.UNSUPPORTED and kind in answer.status.message, kind
        assert _raw_send(stub, "01NINETY", message_type=99).status.code == pb.Code.UNSUPPORTED
        assert _raw_send(stub, "01PRIO", priority=3).status.code == pb.Code.UNSUPPORTED
        out_of_range = _raw_send(stub, "01BORN", born_timestamp={"seconds": 2**62})
        assert (
            out_of_range.status.code == pb.Code.BAD_REQUEST
            and "born_timestamp" in out_of_range.status.message
        )
        assert httpx.get(f"{broker.admin_url}/topics/Typed", timeout=10).status_code == 404  # nothing made
        for ok in (pb.MessageType.NORMAL, pb.MessageType.MESSAGE_TYPE_UNSPECIFIED):
            assert _raw_send(stub, f"01OK{ok}", message_type=ok).status.code == pb.Code.OK
    finally:
        stub.channel.close()


def test_a_send_the_store_refuses_creates_no_topic(start_broker: Any) -> None:
    """Properties too large for the store were refused only after the topic was created: refused
    sends to new names used up max_topics."""
    import httpx

    broker = start_broker(config={"max_topics": 3})
    stub = Stub(broker.endpoint)
    try:
        keys = ["\u20ac" * 252 + f"{i:03d}" for i in range(32)]  # 3-byte characters: within the key limits
        props = {f"p{i}": "v" * 250 for i in range(60)}  # within the user limits; together past the record's
        for i in range(3):
            sp = pb.SystemProperties(message_id=f"01BIG{i}", body_encoding=pb.Encoding.IDENTITY, keys=keys)
            msg = pb.Message(
                topic=pb.Resource(name=f"New{i}"), body=b"x", system_properties=sp, user_properties=props
            )
            refused = stub("SendMessage", pb.SendMessageRequest(messages=[msg]))
            assert refused.status.code == pb.Code.MESSAGE_BODY_TOO_LARGE, refused.status.message
        assert stub.send(topic="Good", message_id="01GOOD").status.code == pb.Code.OK
    finally:
        stub.channel.close()
    names = [t["name"] for t in httpx.get(f"{broker.admin_url}/topics", timeout=10).json()]
    assert not [n for n in names if n.startswith("New")]


def test_a_topics_route_permission_follows_its_read_and_write_bits(start_broker: Any) -> None:
    """perm 7 (read-write and RocketMQ's inherit bit) was routed as NONE, so the official clients
    found no queue to send to."""
    import httpx

    broker = start_broker()
    stub = Stub(broker.endpoint)
    try:
        expected = {7: pb.Permission.READ_WRITE, 6: pb.Permission.READ_WRITE, 5: pb.Permission.READ,
                    3: pb.Permission.WRITE, 1: pb.Permission.NONE}  # fmt: skip
        for perm, permission in expected.items():
            created = httpx.post(
                f"{broker.admin_url}/topics", json={"name": f"P{perm}", "perm": perm}, timeout=10
            )
            assert created.status_code == 201, created.text
            route = stub(
                "QueryRoute",
                pb.QueryRouteRequest(topic=pb.Resource(name=f"P{perm}"), endpoints=stub.endpoints()),
            )
            assert {q.permission for q in route.message_queues} == {permission}, perm
    finally:
        stub.channel.close()


def test_receive_ack_and_bad_handles_over_the_wire(stub: Stub) -> None:
    assert stub.send(message_id="01R1", Region="Hangzhou", price="100").status.code == pb.Code.OK
    assert stub.send(message_id="01R2", Region="Hangzhou", price="7").status.code == pb.Code.OK
    queue = pb.MessageQueue(topic=pb.Resource(name="Wire"), id=0, broker=pb.Broker(name="b"))
    req = pb.ReceiveMessageRequest(
        group=pb.Resource(name="wire-g"),
        message_queue=queue,
        batch_size=8,
        filter_expression=pb.FilterExpression(type=pb.FilterType.SQL, expression="price > 30"),
    )
    req.invisible_duration.FromSeconds(30)
    req.long_polling_timeout.FromSeconds(1)
    frames = stub("ReceiveMessage", req)
    kinds = [f.WhichOneof("content") for f in frames]
    assert kinds[0] == "status" and kinds[-1] == "delivery_timestamp"
    assert frames[0].status.code == pb.Code.OK
    messages = [f.message for f in frames if f.HasField("message")]
    assert [m.system_properties.message_id for m in messages] == ["01R1"]
    sp = messages[0].system_properties
    assert sp.body_encoding == pb.Encoding.IDENTITY and sp.delivery_attempt == 1 and sp.receipt_handle
    assert sp.body_digest.type == pb.DigestType.CRC32 and len(sp.body_digest.checksum) == 8
    ack = pb.AckMessageRequest(
        group=req.group,
        topic=queue.topic,
        entries=[pb.AckMessageEntry(message_id="01R1", receipt_handle=sp.receipt_handle)],
    )
    assert stub("AckMessage", ack).status.code == pb.Code.OK
    again = stub("AckMessage", ack)
    assert again.status.code == pb.Code.INVALID_RECEIPT_HANDLE
    ack.entries[0].receipt_handle = "v1:0:0:1:Nope"
    assert stub("AckMessage", ack).status.code == pb.Code.INVALID_RECEIPT_HANDLE
    change = pb.ChangeInvisibleDurationRequest(group=req.group, topic=queue.topic, receipt_handle="junk")
    resp = stub("ChangeInvisibleDuration", change)
    assert resp.status.code == pb.Code.INVALID_RECEIPT_HANDLE and resp.receipt_handle == "junk"
    # an empty long poll answers MESSAGE_NOT_FOUND in about the requested time
    t0 = time.monotonic()
    frames = stub("ReceiveMessage", req)
    assert frames[0].status.code == pb.Code.MESSAGE_NOT_FOUND and 0.8 < time.monotonic() - t0 < 5
    bad = pb.ReceiveMessageRequest()
    bad.CopyFrom(req)
    bad.filter_expression.expression = "price >"
    frames = stub("ReceiveMessage", bad)
    assert frames[0].status.code == pb.Code.ILLEGAL_FILTER_EXPRESSION
    assert "7" in frames[0].status.message


def test_long_poll_wakes_up_when_a_message_arrives(stub: Stub) -> None:
    queue = pb.MessageQueue(topic=pb.Resource(name="Wake"), id=-1)
    req = pb.ReceiveMessageRequest(
        group=pb.Resource(name="wake-g"),
        message_queue=queue,
        batch_size=1,
        filter_expression=pb.FilterExpression(type=pb.FilterType.TAG, expression="*"),
    )
    req.long_polling_timeout.FromSeconds(20)
    stub("QueryRoute", pb.QueryRouteRequest(topic=queue.topic, endpoints=stub.endpoints()))
    assert (
        stub("ReceiveMessage", pb.ReceiveMessageRequest(group=req.group, message_queue=queue, batch_size=1))[
            0
        ].status.code
        == pb.Code.MESSAGE_NOT_FOUND
    )
    future = stub.channel.unary_stream(
        RPC["ReceiveMessage"].path,
        request_serializer=pb.ReceiveMessageRequest.SerializeToString,
        response_deserializer=pb.ReceiveMessageResponse.FromString,
    )(req, timeout=25)
    time.sleep(0.5)
    t0 = time.monotonic()
    assert stub.send(topic="Wake", message_id="01WAKE").status.code == pb.Code.OK
    frames = list(future)
    assert time.monotonic() - t0 < 5
    assert [f.message.system_properties.message_id for f in frames if f.HasField("message")] == ["01WAKE"]


def test_unsupported_and_malformed_calls(stub: Stub) -> None:
    for name in ("EndTransaction", "RecallMessage", "SyncLiteSubscription"):
        resp = stub(name, b"\x0a\x00")
        assert resp.status.code == pb.Code.UNSUPPORTED and name in resp.status.message
    with pytest.raises(grpc.RpcError):
        stub("SendMessage", b"\xff\xff\xff garbage")
    assert stub.send(message_id="01AFTER").status.code == pb.Code.OK
    assert stub("Heartbeat", pb.HeartbeatRequest()).status.code == pb.Code.OK


def test_duplicate_send_is_stored_once(stub: Stub) -> None:
    first = stub.send(message_id="01SAME")
    second = stub.send(message_id="01SAME")
    assert first.entries[0].offset == second.entries[0].offset


def _broker_once(data_dir: Any, listen: str) -> subprocess.CompletedProcess[str]:
    """``siftmq broker`` expected to fail at start-up (so it returns)."""
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "siftmq",
            "broker",
            "--data-dir",
            str(data_dir),
            "--listen",
            listen,
            "--admin-listen",
            "127.0.0.1:0",
        ],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_second_broker_on_the_same_port_fails_loudly(start_broker: Any, tmp_path: Any) -> None:
    first = start_broker("one")
    proc = _broker_once(tmp_path / "two", first.endpoint)
    assert proc.returncode != 0
    assert "cannot listen" in proc.stderr and "ready" not in proc.stdout


def test_same_data_dir_twice_fails_loudly(start_broker: Any) -> None:
    first = start_broker("shared")
    proc = _broker_once(first.data_dir, "127.0.0.1:0")
    assert proc.returncode != 0 and "ready" not in proc.stdout


def test_sigterm_stops_cleanly(start_broker: Any) -> None:
    broker = start_broker()
    assert broker.stop() == 0
    assert any("stopped" in line for line in broker.output)


def test_offset_pull_family_over_the_wire(stub: Stub) -> None:
    for i in range(5):
        assert (
            stub.send(topic="Pulled", message_id=f"01P{i}", tag="Pay" if i % 2 else "X").status.code == 20000
        )
    stub("QueryRoute", pb.QueryRouteRequest(topic=pb.Resource(name="Pulled"), endpoints=stub.endpoints()))
    group = pb.Resource(name="pull-g")
    total = 0
    for qid in range(8):
        queue = pb.MessageQueue(topic=pb.Resource(name="Pulled"), id=qid)
        end = stub(
            "QueryOffset",
            pb.QueryOffsetRequest(message_queue=queue, query_offset_policy=pb.QueryOffsetPolicy.END),
        )
        assert end.status.code == pb.Code.OK
        req = pb.PullMessageRequest(
            group=group,
            message_queue=queue,
            offset=0,
            batch_size=32,
            filter_expression=pb.FilterExpression(type=pb.FilterType.TAG, expression="Pay"),
        )
        frames = stub("PullMessage", req)
        assert (
            frames[0].WhichOneof("content") == "status" and frames[-1].WhichOneof("content") == "next_offset"
        )
        got = [f.message for f in frames if f.HasField("message")]
        assert all(m.system_properties.tag == "Pay" for m in got)
        assert frames[-1].next_offset == end.offset
        total += len(got)
        update = pb.UpdateOffsetRequest(group=group, message_queue=queue, offset=frames[-1].next_offset)
        assert stub("UpdateOffset", update).status.code == pb.Code.OK
        got_offset = stub("GetOffset", pb.GetOffsetRequest(group=group, message_queue=queue))
        assert got_offset.status.code == pb.Code.OK and got_offset.offset == end.offset
    assert total == 2
    bad = pb.PullMessageRequest(
        group=group, message_queue=pb.MessageQueue(topic=pb.Resource(name="Pulled"), id=99)
    )
    assert stub("PullMessage", bad)[0].status.code == pb.Code.BAD_REQUEST


def test_system_topics_are_not_made_by_a_route_query(stub: Stub) -> None:
    """A QueryRoute of a dead-letter (or any %...) topic made an ordinary 8-queue topic, counted
    toward max_topics; only the broker makes one, when it moves a group's first message there."""
    for name in ("%DLQ%nogroup", "%RETRY%nogroup", "%SYS%abc"):
        route = stub(
            "QueryRoute", pb.QueryRouteRequest(topic=pb.Resource(name=name), endpoints=stub.endpoints())
        )
        assert route.status.code == pb.Code.TOPIC_NOT_FOUND, name
        again = stub(
            "QueryRoute", pb.QueryRouteRequest(topic=pb.Resource(name=name), endpoints=stub.endpoints())
        )
        assert again.status.code == pb.Code.TOPIC_NOT_FOUND, name  # still not made


def test_the_retry_backoff_is_told_in_whole_seconds(start_broker: Any) -> None:
    """The official clients read a Duration's seconds only: 0.5 s was a nack with no delay."""
    import asyncio

    from siftmq.client.connection import Connection

    broker = start_broker(config={"retry_backoff_s": [0.5, 2.5, 3.0]})

    async def settings() -> list[int]:
        connection = Connection(broker.endpoint)
        try:
            asked = pb.Settings(
                client_type=pb.ClientType.PUSH_CONSUMER,
                subscription=pb.Subscription(group=pb.Resource(name="g")),
            )
            reply = await connection.telemetry(asked)
        finally:
            await connection.close()
        return [d.seconds for d in reply.settings.backoff_policy.customized_backoff.next]

    assert asyncio.run(settings()) == [1, 3, 3]


def test_the_admin_api_listens_on_a_bracketed_ipv6_address(start_broker: Any) -> None:
    """ "[::1]:0", as gRPC's listen takes an IPv6 address, was refused ("Name or service not
    known"), and "::1:0" printed http://::1:port, which is no URL."""
    import socket

    import httpx

    try:
        with socket.socket(socket.AF_INET6) as probe:
            probe.bind(("::1", 0))
    except OSError:
        pytest.skip("no IPv6 loopback here")
    broker = start_broker(admin_listen="[::1]:0")
    assert broker.admin_url.startswith("http://[::1]:")
    assert httpx.get(f"{broker.admin_url}/healthz", timeout=10).status_code == 200
