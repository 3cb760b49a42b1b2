"""A Telemetry stream: authenticated once when it opens (it outlives the clock-skew window), and each
settings command's group and topics authorized as RocketMQ 5.3 does, against a real broker."""

from __future__ import annotations

import json
import queue
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from siftmq.auth.signature import DATE_HEADER, SCHEME, sign
from siftmq.protocol import rocketmq_v2_pb2 as pb
from siftmq.protocol.service import RPCS

pytestmark = pytest.mark.integration

RPC = {r.name: r for r in RPCS}
SKEW_S = 2.0
AUTH = {
    "users": [
        {"username": "alice", "password": "Al1ce-s3cret-pw"},
        {"username": "bob", "password": "B0b-s3cret-pw-x"},
    ],
    "acls": [
        {
            "subject": "User:alice",
            "policies": [
                {
                    "entries": [
                        {"resource": ["Topic:Orders"], "actions": ["Pub", "Sub", "Create"]},
                        {"resource": ["Group:alice-*"], "actions": ["Sub"]},
                    ]
                }
            ],
        }
    ],
}


def signed(stamp: str | None = None) -> tuple[tuple[str, str], ...]:
    stamp = stamp or time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    authorization = (
        f"{SCHEME} Credential=alice, SignedHeaders={DATE_HEADER}, Signature={sign('Al1ce-s3cret-pw', stamp)}"
    )
    return ((DATE_HEADER, stamp), ("authorization", authorization), ("x-mq-client-id", "telemetry-test"))


def consumer_settings(group: str) -> pb.TelemetryCommand:
    return pb.TelemetryCommand(
        settings=pb.Settings(
            client_type=pb.ClientType.SIMPLE_CONSUMER,
            subscription=pb.Subscription(
                group=pb.Resource(name=group),
                subscriptions=[pb.SubscriptionEntry(
                    topic=pb.Resource(name="Orders"),
                    expression=pb.FilterExpression(type=pb.FilterType.TAG, expression="*"),
                )],
            ),
        )
    )  # fmt: skip


class Stream:
    """One Telemetry stream fed command by command."""

    def __init__(self, channel: grpc.Channel, metadata: tuple[tuple[str, str], ...]) -> None:
        self._commands: queue.Queue[pb.TelemetryCommand | None] = queue.Queue()
        rpc = RPC["Telemetry"]
        fn = channel.stream_stream(rpc.path, request_serializer=pb.TelemetryCommand.SerializeToString,
                                   response_deserializer=pb.TelemetryCommand.FromString)  # fmt: skip
        self.call = fn(self._feed(), timeout=30, metadata=metadata)
        self._replies = iter(self.call)

    def _feed(self) -> Iterator[pb.TelemetryCommand]:
        while (command := self._commands.get()) is not None:
            yield command

    def ask(self, command: pb.TelemetryCommand) -> pb.Status:
        self._commands.put(command)
        return next(self._replies).status

    def close(self) -> None:
        self._commands.put(None)
        self.call.cancel()


@pytest.fixture
def broker(start_broker: Any, tmp_path: Path) -> Any:
    auth = tmp_path / "auth.json"
    auth.write_text(json.dumps(AUTH))
    return start_broker(
        "data",
        config={"authentication_enabled": True, "authorization_enabled": True, "auth_file": str(auth),
                "auth_clock_skew_s": SKEW_S},
    )  # fmt: skip


def test_a_stream_outlives_the_skew_window_and_each_command_is_authorized(broker: Any) -> None:
    with grpc.insecure_channel(broker.endpoint) as channel:
        metadata = signed()
        stream = Stream(channel, metadata)
        try:
            assert stream.ask(consumer_settings("alice-app")).code == pb.Code.OK
            time.sleep(SKEW_S + 1.5)  # the stream's date is now outside the window
            assert stream.ask(consumer_settings("alice-app")).code == pb.Code.OK  # checked when it opened
            denied = stream.ask(consumer_settings("payments"))  # not her group
            assert denied.code == pb.Code.FORBIDDEN and "may not Sub Group:payments" in denied.message
            with pytest.raises(StopIteration):  # a denial ends the stream
                stream.ask(consumer_settings("alice-app"))
        finally:
            stream.close()

        late = Stream(channel, metadata)  # a new stream with the old date is refused
        try:
            refused = late.ask(consumer_settings("alice-app"))
            assert refused.code == pb.Code.UNAUTHORIZED and "clock skew" in refused.message
        finally:
            late.close()

        producer = Stream(channel, signed())
        try:
            publishing = pb.Settings(
                client_type=pb.ClientType.PRODUCER,
                publishing=pb.Publishing(topics=[pb.Resource(name="Orders"), pb.Resource(name="Payroll")]),
            )
            denied = producer.ask(pb.TelemetryCommand(settings=publishing))
            assert denied.code == pb.Code.FORBIDDEN and "may not Pub Topic:Payroll" in denied.message
        finally:
            producer.close()
    assert "denied Telemetry: user alice may not Sub Group:payments" in broker.log()
    assert "client telemetry-test)" in broker.log()  # the audit line names the client


@pytest.mark.parametrize("authorization", [True, False])
def test_an_open_stream_ends_when_its_users_password_changes(
    start_broker: Any, tmp_path: Path, authorization: bool
) -> None:
    """Checked at every command, with authorization off too: authentication alone must not let a
    stream opened with an old password go on."""
    import signal

    (tmp_path / "auth.json").write_text(json.dumps(AUTH))
    broker = start_broker(
        "data",
        config={"authentication_enabled": True, "authorization_enabled": authorization,
                "auth_file": str(tmp_path / "auth.json"), "auth_clock_skew_s": SKEW_S},
    )  # fmt: skip

    with grpc.insecure_channel(broker.endpoint) as channel:
        stream = Stream(channel, signed())
        try:
            assert stream.ask(consumer_settings("alice-app")).code == pb.Code.OK
            changed = json.loads(json.dumps(AUTH))
            changed["users"][0]["password"] = "N3w-alice-s3cret"
            (tmp_path / "auth.json").write_text(json.dumps(changed))
            broker.proc.send_signal(signal.SIGHUP)
            deadline = time.monotonic() + 10
            while "reloaded" not in broker.log() and time.monotonic() < deadline:
                time.sleep(0.05)
            ended = stream.ask(consumer_settings("alice-app"))
            assert ended.code == pb.Code.UNAUTHORIZED and "no longer valid" in ended.message
        finally:
            stream.close()


def _route_signed_as(channel: grpc.Channel, user: str, secret: str) -> pb.Status:
    rpc = RPC["QueryRoute"]
    call = channel.unary_unary(rpc.path, request_serializer=pb.QueryRouteRequest.SerializeToString,
                               response_deserializer=pb.QueryRouteResponse.FromString)  # fmt: skip
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    header = f"{SCHEME} Credential={user}, SignedHeaders={DATE_HEADER}, Signature={sign(secret, stamp)}"
    metadata = ((DATE_HEADER, stamp), ("authorization", header))
    return call(pb.QueryRouteRequest(topic=pb.Resource(name="Orders")), timeout=30, metadata=metadata).status


def test_a_password_cannot_be_guessed_at_the_servers_speed(broker: Any) -> None:
    """A user's password is its secret key: unbounded, ~800 guesses a second went through one
    connection. Past 10 wrong signatures a minute for one credential from one address, that
    credential's calls from there are refused unchecked (the right password too, or the guesser
    would learn it); other credentials are served."""
    with grpc.insecure_channel(broker.endpoint) as channel:  # one connection: one process checks
        for i in range(12):
            wrong = _route_signed_as(channel, "alice", f"guess-{i}")
            assert wrong.code == pb.Code.UNAUTHORIZED
        right = _route_signed_as(channel, "alice", "Al1ce-s3cret-pw")
        assert right.code == pb.Code.UNAUTHORIZED and "too many wrong signatures" in right.message, right
        other = _route_signed_as(channel, "bob", "B0b-s3cret-pw-x")
        assert other.code != pb.Code.UNAUTHORIZED, other  # (bob may not route Orders: forbidden)
    assert 'siftmq_auth_failures_total{reason="throttled"}' in broker.metrics_with("throttled")


def test_a_thousand_bad_signatures_leave_a_good_client_served(broker: Any) -> None:
    """Functional half (the timing half is benchmarks/bench_auth_e2e.py): every bad call refused,
    every good one served meanwhile, the failures counted, the audit log rate limited. The flood
    signs as another credential: alice's own would be held to 10 wrong a minute from here."""
    import asyncio
    import threading

    from siftmq.client import Producer

    answers: list[int] = []

    def bad_calls(count: int) -> None:
        with grpc.insecure_channel(broker.endpoint) as channel:
            for i in range(count):
                answers.append(_route_signed_as(channel, "mallory", str(i)).code)

    async def good_sends() -> int:
        sent = 0
        async with Producer(broker.endpoint, access_key="alice", secret_key="Al1ce-s3cret-pw") as producer:
            while any(t.is_alive() for t in flooders) or sent == 0:
                assert (await producer.send("Orders", b"good", tag="t")).message_id
                sent += 1
        return sent

    flooders = [threading.Thread(target=bad_calls, args=(250,)) for _ in range(4)]
    for t in flooders:
        t.start()
    sent = asyncio.run(good_sends())
    for t in flooders:
        t.join()
    assert sent > 0 and len(answers) == 1000 and set(answers) == {pb.Code.UNAUTHORIZED}
    # 10 checked (per process that saw them: one, or each front-end), the rest refused unchecked;
    # (front-ends report their refusals every 0.1 s)
    deadline = time.monotonic() + 10
    while True:
        counts = {}
        for line in broker.metrics_with("throttled").splitlines():
            if line.startswith("siftmq_auth_failures_total{"):
                counts[line.split('"')[1]] = float(line.rsplit(" ", 1)[1])
        if counts.get("invalid", 0) + counts.get("throttled", 0) >= 1000 or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert counts.get("invalid", 0) + counts.get("throttled", 0) == 1000, counts
    assert 10 <= counts.get("invalid", 0) <= 20, counts
    assert broker.log().count("authentication failed") <= 3  # one line per 10 s, the rest counted
