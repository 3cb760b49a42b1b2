"""ACL 2.0 resource patterns (exact, prefix, wildcard), Deny over Allow and source-IP conditions,
on a real broker with siftmq's client signing its calls (the peer is 127.0.0.1)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from siftmq.client import FilterExpression, Producer, SimpleConsumer
from siftmq.errors import RemoteForbidden
from siftmq.protocol import rocketmq_v2_pb2 as pb

pytestmark = pytest.mark.integration

PUB = ["Pub", "Create"]


def user(name: str, *entries: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    return (
        {"username": name, "password": f"{name}-s3cret-pw"},
        {"subject": f"User:{name}", "policies": [{"entries": list(entries)}]},
    )


USERS = [
    user("exact", {"resource": ["Topic:Orders"], "actions": PUB}),
    user("prefix", {"resource": ["Topic:orders-*"], "actions": [*PUB, "Sub"]},
         {"resource": ["Group:team-*"], "actions": ["Sub"]}),
    user("kind", {"resource": ["Topic:*"], "actions": PUB}),
    user("everything", {"resource": ["*"], "actions": ["All"]},
         {"resource": ["Topic:secret"], "actions": ["Pub"], "decision": "Deny"}),
    user("lan", {"resource": ["Topic:*"], "actions": PUB, "sourceIps": ["10.0.0.0/8"]}),
    user("local", {"resource": ["Topic:*"], "actions": PUB, "sourceIps": ["192.168.0.0/16", "127.0.0.1"]}),
    user("denied-here", {"resource": ["Topic:*"], "actions": PUB},
         {"resource": ["*"], "actions": ["All"], "sourceIps": ["127.0.0.0/8"], "decision": "Deny"}),
]  # fmt: skip

SENDS = [
    ("exact", "Orders", True),
    ("exact", "Orders2", False),
    ("prefix", "orders-eu", True),
    ("prefix", "orders", False),
    ("prefix", "Orders", False),  # names are case-sensitive
    ("kind", "anything", True),
    ("everything", "whatever", True),
    ("everything", "secret", False),  # Deny beats Allow
    ("lan", "Orders", False),  # the peer is not in 10.0.0.0/8
    ("local", "Orders", True),
    ("denied-here", "Orders", False),
]


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from siftmq.testing import BrokerProcess

    tmp = tmp_path_factory.mktemp("patterns")
    auth = tmp / "auth.json"
    auth.write_text(json.dumps({"users": [u for u, _ in USERS], "acls": [a for _, a in USERS]}))
    process = BrokerProcess(
        tmp / "data",
        config={"authentication_enabled": True, "authorization_enabled": True, "auth_file": str(auth)},
    ).start()
    yield process
    process.stop()


def creds(name: str) -> dict[str, str]:
    return {"access_key": name, "secret_key": f"{name}-s3cret-pw"}


@pytest.mark.parametrize(("name", "topic", "allowed"), SENDS)
def test_send(broker: Any, name: str, topic: str, allowed: bool) -> None:
    async def go() -> str:
        async with Producer(broker.endpoint, max_attempts=1, request_timeout=5, **creds(name)) as producer:
            return (await producer.send(topic, b"x", tag="t")).message_id

    if allowed:
        assert asyncio.run(go())
    else:
        with pytest.raises(RemoteForbidden, match=f"user {name} may not"):
            asyncio.run(go())


@pytest.mark.parametrize(("group", "allowed"), [("team-a", True), ("other", False)])
def test_receive_needs_the_group_too(broker: Any, group: str, allowed: bool) -> None:
    async def go() -> int:
        async with Producer(broker.endpoint, **creds("prefix")) as producer:
            await producer.send("orders-eu", b"x", tag="t")
        async with SimpleConsumer(
            broker.endpoint,
            group,
            {"orders-eu": FilterExpression.tag("*")},
            await_duration=1,
            **creds("prefix"),
        ) as consumer:
            return len(await consumer.receive(16, 30))

    if allowed:
        assert asyncio.run(go()) >= 1
    else:
        with pytest.raises(RemoteForbidden, match=f"may not Sub Group:{group}"):
            asyncio.run(go())


@pytest.mark.parametrize(("ack_group", "allowed"), [("team-a", True), ("other", False)])
def test_ack_and_receive_checks_the_acks_group_too(broker: Any, ack_group: str, allowed: bool) -> None:
    """AckAndReceive needs Sub on the acknowledgements' group as well as on the receive's."""

    async def go() -> int:
        async with Producer(broker.endpoint, **creds("prefix")) as producer:
            await producer.send_many([producer.message("orders-eu", b"x", tag="t") for _ in range(2)])
        async with SimpleConsumer(
            broker.endpoint,
            "team-a",
            {"orders-eu": FilterExpression.tag("*")},
            await_duration=1,
            **creds("prefix"),
        ) as consumer:
            first = await consumer.receive(1, 30)
            ack = consumer._ack_request("orders-eu", first)
            ack.group.name = ack_group
            request = pb.ReceiveMessageRequest(
                group=pb.Resource(name="team-a"),
                message_queue=pb.MessageQueue(topic=pb.Resource(name="orders-eu"), id=-1),
                filter_expression=pb.FilterExpression(type=pb.TAG, expression="*"),
                batch_size=16,
            )
            request.invisible_duration.FromSeconds(30)
            both = await consumer.connection.ack_and_receive(ack, request, timeout=10)
            assert both is not None
            return len(both[1].messages)

    if allowed:
        assert asyncio.run(go()) >= 1
    else:
        with pytest.raises(RemoteForbidden, match="may not Sub Group:other"):
            asyncio.run(go())
