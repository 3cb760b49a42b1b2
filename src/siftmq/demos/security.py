"""``siftmq demo security``: the official RocketMQ client against a broker with authentication and
authorization on.

Two users: ``alice`` may publish to and consume ``Orders`` in her groups (``alice-*``); ``mallory``
may only read ``Orders``, in no group. Calls are made with the official ``rocketmq-python-client``
5.1.2, which raises one generic error for a refused route; the status the broker answered (40100
UNAUTHORIZED, 40300 FORBIDDEN) is then read from the error line the client logs, so what is shown
is what the client received.
"""

from __future__ import annotations

import json
import logging
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from siftmq.testing import running_broker

TOPIC: Final = "Orders"
PASSWORDS: Final = {"alice": "Al1ce-demo-secret", "mallory": "Mall0ry-demo-secret"}
AUTH: Final = {
    "users": [{"username": name, "password": secret, "userType": "Normal"}
              for name, secret in PASSWORDS.items()],
    "acls": [
        {"subject": "User:alice", "policies": [{"policyType": "Custom", "entries": [
            {"resource": [f"Topic:{TOPIC}"], "actions": ["Pub", "Sub", "Create"], "decision": "Allow"},
            {"resource": ["Group:alice-*"], "actions": ["Sub"], "decision": "Allow"},
        ]}]},
        {"subject": "User:mallory", "policies": [{"policyType": "Custom", "entries": [
            {"resource": [f"Topic:{TOPIC}"], "actions": ["Sub"], "decision": "Allow"},
        ]}]},
    ],
}  # fmt: skip
_CODES: Final = {40100: "UNAUTHORIZED", 40300: "FORBIDDEN"}
_LOGGED: Final = re.compile(r"\b(40100|40300)\b,?\s*(.*)")


@dataclass
class Outcome:
    who: str
    call: str
    expected: str
    got: str
    detail: str

    @property
    def as_expected(self) -> bool:
        return self.got == self.expected


class _Refusals(logging.Handler):
    """The official client's error lines that carry a status code."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.seen: list[tuple[str, str]] = []

    def emit(self, record: logging.LogRecord) -> None:
        found = _LOGGED.search(record.getMessage())
        if found:
            self.seen.append((_CODES[int(found.group(1))], found.group(2).strip()))


def run() -> list[Outcome]:
    from rocketmq import ClientConfiguration, Credentials, FilterExpression, Message, Producer, SimpleConsumer

    refusals = _Refusals()
    client_log = logging.getLogger("rocketmq-python-client")
    client_log.addHandler(refusals)
    outcomes: list[Outcome] = []

    def attempt(who: str, secret: str | None, call: str, expected: str, action: Any) -> None:
        credentials = Credentials() if secret is None else Credentials(who, secret)
        refusals.seen.clear()
        try:
            detail = action(ClientConfiguration(endpoint, credentials, request_timeout=5))
            got = "OK"
        except Exception as exc:
            found = _LOGGED.search(str(exc))
            if found:  # the status is in the error itself
                got, detail = _CODES[int(found.group(1))], found.group(2).strip()
            else:
                got, detail = refusals.seen[-1] if refusals.seen else ("ERROR", str(exc))
        outcomes.append(Outcome(who, call, expected, got, detail))

    def send(config: Any) -> str:
        producer = Producer(config, (TOPIC,))
        producer.startup()
        try:
            message = Message()
            message.topic, message.body, message.tag = TOPIC, b"order #1", "created"
            return f"message id {producer.send(message).message_id}"
        finally:
            producer.shutdown()

    def receive(config: Any) -> str:
        consumer = SimpleConsumer(config, "alice-app", {TOPIC: FilterExpression("*")}, await_duration=5)
        consumer.startup()
        try:
            got = consumer.receive(16, 30)
            for m in got:
                consumer.ack(m)
            return f"received {[m.body.decode() for m in got]}"
        finally:
            consumer.shutdown()

    with tempfile.TemporaryDirectory(prefix="siftmq-demo-") as tmp:
        auth_file = Path(tmp) / "auth.json"
        auth_file.write_text(json.dumps(AUTH))
        auth_file.chmod(0o600)
        settings: dict[str, object] = {"authentication_enabled": True, "authorization_enabled": True}
        settings["auth_file"] = str(auth_file)
        try:
            with running_broker(settings) as broker:
                endpoint = broker.endpoint
                attempt("anonymous", None, f"send to {TOPIC}", "UNAUTHORIZED", send)
                attempt("alice", "a-wrong-secret", f"send to {TOPIC}", "UNAUTHORIZED", send)
                attempt("alice", PASSWORDS["alice"], f"send to {TOPIC}", "OK", send)
                attempt("mallory", PASSWORDS["mallory"], f"send to {TOPIC}", "FORBIDDEN", send)
                attempt("mallory", PASSWORDS["mallory"], "receive as alice-app", "FORBIDDEN", receive)
                attempt("alice", PASSWORDS["alice"], "receive as alice-app", "OK", receive)
        finally:
            client_log.removeHandler(refusals)
    return outcomes
