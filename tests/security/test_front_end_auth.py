"""``--workers 2`` with authentication on: the front-ends check signatures against the users the
core sends them, refuse a bad one themselves (the core only counts and audits it), and hear of a
changed table at once. Real broker processes, raw gRPC calls."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest

from security_users import ALICE, ROOT, auth_file
from siftmq.auth.signature import DATE_HEADER, SCHEME, sign
from siftmq.protocol import rocketmq_v2_pb2 as pb
from siftmq.protocol.service import RPCS

pytestmark = pytest.mark.integration

RPC = {r.name: r for r in RPCS}
AUTH = auth_file([{"resource": ["Topic:Orders"], "actions": ["Pub", "Sub", "Create"]}])
CONNECTIONS = 8  # fresh connections per check: the kernel spreads them over both front-ends


def signed(user: str, secret: str, stamp: str | None = None) -> tuple[tuple[str, str], ...]:
    stamp = stamp or time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    header = f"{SCHEME} Credential={user}, SignedHeaders={DATE_HEADER}, Signature={sign(secret, stamp)}"
    return (DATE_HEADER, stamp), ("authorization", header), ("x-mq-client-id", "front-end-auth-test")


def route(endpoint: str, metadata: tuple[tuple[str, str], ...], timeout: float = 10) -> pb.Status:
    """A QueryRoute for Orders on a fresh connection."""
    with grpc.insecure_channel(endpoint) as channel:
        call = channel.unary_unary(
            RPC["QueryRoute"].path, pb.QueryRouteRequest.SerializeToString, pb.QueryRouteResponse.FromString
        )
        host, port = endpoint.rsplit(":", 1)
        where = pb.Endpoints(scheme=pb.AddressScheme.IPv4, addresses=[pb.Address(host=host, port=int(port))])
        request = pb.QueryRouteRequest(topic=pb.Resource(name="Orders"), endpoints=where)
        return call(request, metadata=metadata, timeout=timeout).status


def telemetry(endpoint: str, metadata: tuple[tuple[str, str], ...]) -> list[pb.TelemetryCommand]:
    """What a Telemetry stream opened with ``metadata`` answers before it ends (nothing sent on it)."""
    answered = threading.Event()

    def nothing() -> Iterator[pb.TelemetryCommand]:
        answered.wait(30)  # the stream stays open from the client's side; the broker must end it
        yield from ()

    with grpc.insecure_channel(endpoint) as channel:
        call = channel.stream_stream(
            RPC["Telemetry"].path, pb.TelemetryCommand.SerializeToString, pb.TelemetryCommand.FromString
        )
        try:
            return list(call(nothing(), metadata=metadata, timeout=10))
        finally:
            answered.set()


@pytest.fixture
def broker(start_broker: Any, tmp_path: Path) -> Any:
    auth = tmp_path / "auth.json"
    auth.write_text(json.dumps(AUTH))
    auth.chmod(0o600)
    config = {"authentication_enabled": True, "authorization_enabled": True, "auth_file": str(auth)}
    return start_broker("data", config={**config, "workers": 2})


def test_a_bad_signature_is_refused_by_the_front_end_while_the_core_is_stopped(broker: Any) -> None:
    for _ in range(CONNECTIONS):  # each front-end has the users before the core stops
        assert route(broker.endpoint, signed(*ALICE)).code == pb.Code.OK
    os.kill(broker.proc.pid, signal.SIGSTOP)
    try:
        for i in range(CONNECTIONS):  # answered in time with the core stopped: by a front-end
            wrong = route(broker.endpoint, signed("alice", f"wrong-{i}"), timeout=5)
            assert wrong.code == pb.Code.UNAUTHORIZED and wrong.message.startswith("QueryRoute: ")
            assert "not valid" in wrong.message
            unsigned = route(broker.endpoint, (("x-mq-client-id", "front-end-auth-test"),), timeout=5)
            assert unsigned.code == pb.Code.UNAUTHORIZED and "not signed" in unsigned.message
            unknown = route(broker.endpoint, signed("nobody", "x"), timeout=5)
            assert unknown.message == wrong.message  # says nothing of who exists
        (refusal,) = telemetry(broker.endpoint, signed("alice", "wrong"))
        assert refusal.status.code == pb.Code.UNAUTHORIZED and refusal.status.message.startswith(
            "Telemetry: "
        )
    finally:
        os.kill(broker.proc.pid, signal.SIGCONT)
    assert route(broker.endpoint, signed(*ALICE)).code == pb.Code.OK
    # every refusal reported to the core (together, within REPORT_INTERVAL_S), counted and audited
    expected = (
        f'siftmq_auth_failures_total{{reason="invalid"}} {2 * CONNECTIONS + 1}.0',
        f'siftmq_auth_failures_total{{reason="unsigned"}} {CONNECTIONS}.0',
    )
    metrics = broker.metrics_with(*expected, auth=ROOT)
    assert all(line in metrics for line in expected), [m for m in metrics.splitlines() if "auth_fail" in m]
    log = broker.log()
    assert "authentication failed for QueryRoute from ipv" in log and "(client front-end-auth-test)" in log
    assert ALICE[1] not in log  # secrets are never logged


def test_a_changed_password_reaches_every_front_end_before_the_next_call(broker: Any) -> None:
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    old = signed(*ALICE, stamp=stamp)
    for _ in range(CONNECTIONS):  # the front-ends remember this signature as verified
        assert route(broker.endpoint, old).code == pb.Code.OK
    with httpx.Client(base_url=broker.admin_url, timeout=10, auth=ROOT) as http:
        assert http.patch("/users/alice", json={"password": "N3w-alice-s3cret"}).status_code == 200
    os.kill(broker.proc.pid, signal.SIGSTOP)
    try:  # the change answered once every front-end had it: they refuse the old password alone
        for _ in range(CONNECTIONS):
            assert route(broker.endpoint, old, timeout=5).code == pb.Code.UNAUTHORIZED
    finally:
        os.kill(broker.proc.pid, signal.SIGCONT)
    for _ in range(CONNECTIONS):
        refused = route(broker.endpoint, old)  # the same date and signature: not taken from memory
        assert refused.code == pb.Code.UNAUTHORIZED
        assert route(broker.endpoint, signed("alice", "N3w-alice-s3cret")).code == pb.Code.OK
    with httpx.Client(base_url=broker.admin_url, timeout=10, auth=ROOT) as http:
        assert http.delete("/users/alice").status_code == 204
    for _ in range(CONNECTIONS):
        assert route(broker.endpoint, signed("alice", "N3w-alice-s3cret")).code == pb.Code.UNAUTHORIZED
