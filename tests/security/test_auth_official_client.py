"""Authentication and authorization with the official ``rocketmq-python-client`` 5.1.2, which signs
every call with ``Credentials(access_key, secret_key)``, against a real broker process."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

rocketmq = pytest.importorskip("rocketmq")
from rocketmq import ClientConfiguration, Credentials, FilterExpression, Message, Producer, SimpleConsumer  # noqa: E402

pytestmark = pytest.mark.integration

SECRETS = {"admin": "Adm1n-s3cret", "alice": "Al1ce-s3cret", "mallory": "Mall0ry-s3cret"}
AUTH = {
    "users": [
        {"username": "admin", "password": SECRETS["admin"], "userType": "Super"},
        {"username": "alice", "password": SECRETS["alice"], "userType": "Normal"},
        {"username": "mallory", "password": SECRETS["mallory"], "userType": "Normal"},
    ],
    "acls": [
        {
            "subject": "User:alice",
            "policies": [
                {
                    "policyType": "Custom",
                    "entries": [
                        {
                            "resource": ["Topic:Orders"],
                            "actions": ["Pub", "Sub", "Create"],
                            "decision": "Allow",
                        },
                        {"resource": ["Group:alice-*"], "actions": ["Sub"], "decision": "Allow"},
                    ],
                }
            ],
        }
    ],
}


def start(start_broker: Any, tmp_path: Path) -> Any:
    auth_file = tmp_path / "auth.json"
    auth_file.write_text(json.dumps(AUTH))
    return start_broker(
        "data",
        config={
            "authentication_enabled": True,
            "authorization_enabled": True,
            "auth_file": str(auth_file),
        },
    )


def producer(endpoint: str, user: str | None, secret: str | None = None, topic: str = "Orders") -> Producer:
    credentials = Credentials() if user is None else Credentials(user, secret or SECRETS[user])
    p = Producer(ClientConfiguration(endpoint, credentials, request_timeout=10), (topic,))
    p.startup()
    return p


def send(p: Producer, topic: str, body: bytes) -> Any:
    msg = Message()
    msg.topic = topic
    msg.body = body
    msg.tag = "t"
    return p.send(msg)


def test_signed_allowed_calls_work_and_the_rest_are_refused(start_broker: Any, tmp_path: Path) -> None:
    broker = start(start_broker, tmp_path)
    alice = producer(broker.endpoint, "alice")
    try:
        receipt = send(alice, "Orders", b"from alice")
        assert receipt.message_id
        with pytest.raises(Exception, match="Secret"):  # not her topic: its route is refused
            send(alice, "Secret", b"nope")
    finally:
        alice.shutdown()

    for user, secret in ((None, None), ("alice", "wrong-secret"), ("nobody", "whatever")):
        with pytest.raises(Exception, match="Orders"):  # the client wraps the UNAUTHORIZED route answer
            bad = producer(broker.endpoint, user, secret)
            try:
                send(bad, "Orders", b"x")
            finally:
                bad.shutdown()

    consumer = SimpleConsumer(
        ClientConfiguration(broker.endpoint, Credentials("alice", SECRETS["alice"]), request_timeout=10),
        "alice-app",
        {"Orders": FilterExpression("*")},
        await_duration=5,
    )
    consumer.startup()
    try:
        got: list[bytes] = []
        deadline = time.monotonic() + 20
        while not got and time.monotonic() < deadline:
            for m in consumer.receive(16, 30):
                got.append(m.body)
                consumer.ack(m)
        assert got == [b"from alice"]
    finally:
        consumer.shutdown()

    metrics = broker.metrics_with('siftmq_auth_failures_total{reason="invalid"}')
    assert 'siftmq_auth_failures_total{reason="invalid"}' in metrics  # wrong secret, unknown user
    assert 'siftmq_authz_denials_total{action="Get"}' in metrics  # alice's route to Secret
    log = broker.log()
    assert "authentication failed" in log and "denied QueryRoute: user alice may not Get Topic:Secret" in log
    assert not any(secret in log for secret in SECRETS.values())  # secrets are never logged
    assert broker.stop() == 0


def test_a_malformed_auth_file_refuses_the_start_naming_what_is_wrong(
    start_broker: Any, tmp_path: Path
) -> None:
    auth_file = tmp_path / "auth.json"
    auth_file.write_text('{"users": [{"username": "a", "password": "p", "userType": "Root"}]}')
    with pytest.raises(RuntimeError, match="userType must be Super or Normal"):
        start_broker("data", config={"authentication_enabled": True, "auth_file": str(auth_file)})
