"""The gate's rules without a broker: which calls need Create, the Super-only paths, tokens."""

from __future__ import annotations

import json
from typing import Any

from siftmq.auth.acl import parse_auth_file
from siftmq.broker.config import BrokerConfig
from siftmq.protocol import rocketmq_v2_pb2 as pb
from siftmq.server.admin_auth import MAX_TOKENS_PER_USER, Tokens, needs_super
from siftmq.server.app import _check_protected_mode
from siftmq.server.auth import Gate

TABLE = parse_auth_file(
    json.dumps(
        {
            "users": [{"username": "alice", "password": "Al1ce-s3cret-pw"}],
            "acls": [{"subject": "User:alice", "policies": [{"entries": [
                {"resource": ["Topic:*", "Group:*"], "actions": ["Pub", "Sub"]}]}]}],
        }
    )
)  # fmt: skip


class Context:
    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return (("x-mq-client-id", "c1"),)

    def peer(self) -> str:
        return "ipv4:127.0.0.1:5000"


def gate() -> Gate:
    g = Gate(TABLE, authenticate=True, authorize=True, skew_s=900)
    g.missing_topic = lambda name: True  # every topic is new
    return g


def refused(rpc: str, request: Any) -> str | None:
    st = gate().authorized(TABLE.users["alice"], rpc, request, Context())
    return None if st is None else str(st.message)


def test_only_the_calls_that_create_a_topic_need_create() -> None:
    topic, group = pb.Resource(name="New"), pb.Resource(name="g")
    send = pb.SendMessageRequest(messages=[pb.Message(topic=topic)])
    assert "may not Create Topic:New" in (refused("SendMessage", send) or "")
    receive = pb.ReceiveMessageRequest(group=group, message_queue=pb.MessageQueue(topic=topic))
    assert "may not Create Topic:New" in (refused("ReceiveMessage", receive) or "")
    assert refused("AckMessage", pb.AckMessageRequest(group=group, topic=topic)) is None
    assert (
        refused("ChangeInvisibleDuration", pb.ChangeInvisibleDurationRequest(group=group, topic=topic))
        is None
    )
    sub = pb.TelemetryCommand(settings=pb.Settings(subscription=pb.Subscription(
        group=group, subscriptions=[pb.SubscriptionEntry(topic=topic)])))  # fmt: skip
    assert refused("Telemetry", sub) is None
    dlq = pb.ReceiveMessageRequest(
        group=group, message_queue=pb.MessageQueue(topic=pb.Resource(name="%DLQ%g"))
    )
    # a route lookup of a dead-letter topic not there yet would create it: Create, as any other
    assert "may not Create Topic:%DLQ%g" in (refused("ReceiveMessage", dlq) or "")


def test_a_namespace_is_part_of_the_names_authorized() -> None:
    """The broker acts on namespace%name: that is what the ACL is asked about (Topic:Orders
    allows nothing in namespace tenantA, a deny of Topic:tenantA%* holds)."""
    table = parse_auth_file(json.dumps({
        "users": [{"username": "alice", "password": "Al1ce-s3cret-pw"}],
        "acls": [{"subject": "User:alice", "policies": [{"entries": [
            {"resource": ["Topic:Orders", "Group:billing"], "actions": ["Pub", "Sub"]},
            {"resource": ["Topic:tenantA%*"], "actions": ["Pub", "Sub"], "decision": "Deny"}]}]}],
    }))  # fmt: skip
    g = Gate(table, authenticate=True, authorize=True, skew_s=900)
    g.missing_topic = lambda name: False
    alice = table.users["alice"]

    def receive(namespace: str) -> Any:
        return pb.ReceiveMessageRequest(
            group=pb.Resource(name="billing", resource_namespace=namespace),
            message_queue=pb.MessageQueue(topic=pb.Resource(name="Orders", resource_namespace=namespace)),
        )

    assert g.authorized(alice, "ReceiveMessage", receive(""), Context()) is None
    denied = g.authorized(alice, "ReceiveMessage", receive("tenantA"), Context())
    assert denied is not None and "may not Sub Topic:tenantA%Orders" in denied.message
    elsewhere = pb.Resource(name="Orders", resource_namespace="x")
    send = pb.SendMessageRequest(messages=[pb.Message(topic=elsewhere)])
    denied = g.authorized(alice, "SendMessage", send, Context())
    assert denied is not None and "Topic:x%Orders" in denied.message


def test_super_only_paths_as_the_router_splits_them() -> None:
    for path in ("/users", "/users/", "//users", "/users/bob", "/acls", "//acls/User:x"):
        assert needs_super(path), path
    for path in ("/", "", "/topics", "/groups/users", "/tokens"):
        assert not needs_super(path), path


def test_a_users_oldest_tokens_go_past_the_per_user_cap() -> None:
    g = gate()
    tokens = Tokens(3600)
    alice = TABLE.users["alice"]
    issued = [tokens.issue(alice) for _ in range(MAX_TOKENS_PER_USER + 1)]
    assert all(issued)
    assert tokens.user(g, issued[0] or "") is None  # the oldest went
    assert tokens.user(g, issued[-1] or "") == alice


def test_an_admin_api_on_the_network_without_tls_is_warned_about() -> None:
    exposed = BrokerConfig(authentication_enabled=True, admin_listen="0.0.0.0:8082")
    warnings = _check_protected_mode(exposed, "127.0.0.1")
    assert warnings and "without TLS" in warnings[0]
    assert _check_protected_mode(BrokerConfig(authentication_enabled=True), "127.0.0.1") == []


class Claimed(Context):
    """A call a front-end passed on: who it says signed it, against which users' generation."""

    def __init__(self, name: str, generation: int, metadata: tuple[tuple[str, str], ...] = ()) -> None:
        self.signed_by = (name, generation)
        self._metadata = metadata

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return self._metadata


def test_a_front_ends_claim_counts_only_against_the_users_in_force() -> None:
    import time

    from siftmq.auth import manage
    from siftmq.auth.signature import DATE_HEADER, SCHEME, sign

    g = gate()
    assert g.authenticated("SendMessage", Claimed("alice", g.generation)) == (TABLE.users["alice"], None)
    # a table put in force since (a changed password): the claim is checked again, here unsigned
    heard: list[int] = []
    g.on_change.append(lambda: heard.append(g.generation))
    g._install(manage.update_user(g.table, "alice", password="N3w-alice-s3cret"))
    assert heard == [g.generation]
    user, refused = g.authenticated("SendMessage", Claimed("alice", g.generation - 1))
    assert user is None and refused is not None and refused.code == pb.Code.UNAUTHORIZED
    # ... and taken when the call's own signature is good under the new table
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    header = (
        f"{SCHEME} Credential=alice, SignedHeaders={DATE_HEADER}, Signature={sign('N3w-alice-s3cret', stamp)}"
    )
    signed = Claimed("alice", g.generation - 1, ((DATE_HEADER, stamp), ("authorization", header)))
    assert g.authenticated("SendMessage", signed)[0] == g.table.users["alice"]
    # a user the table no longer has is not taken on a claim either
    g._install(manage.remove_user(g.table, "alice"))
    assert g.authenticated("SendMessage", Claimed("alice", g.generation))[0] is None
    assert g.failures == {"unsigned": 2}
    # generations fit a frame's 32 bits: past the last comes the first again
    from siftmq.server.auth import MAX_GENERATION

    g.generation = MAX_GENERATION
    g._install(g.table)
    assert g.generation == 1


def test_alike_refusals_reported_together_are_audited_as_one_line_with_their_count(caplog: Any) -> None:
    g = gate()
    with caplog.at_level("WARNING", logger="siftmq.server.auth"):
        g.failed("SendMessage", "ipv4:10.0.0.1:5", "c1", "invalid", "bad", count=5)
        g.failed("SendMessage", "ipv4:10.0.0.1:6", "c1", "invalid", "bad", count=3)  # held back
    assert g.failures == {"invalid": 8}
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and lines[0].endswith("(+4 more since the last line)")


class _FrontEnd:
    """A front-end's connection as the core sees it: what it was sent, which table it took."""

    def __init__(self) -> None:
        self.users_generation = 0
        self.sent: list[int] = []
        self.protocol = self
        self.writing_paused = False

    def send(self, kind: int, call_id: int, payload: bytes = b"") -> None:
        self.sent.append(kind)


def test_a_live_change_waits_for_every_front_end_but_not_for_one_that_left() -> None:
    import asyncio

    from siftmq.frontend import frames
    from siftmq.server.core_link import CoreLink

    async def run() -> float:
        g = gate()
        link = CoreLink([], b"token", 1 << 20, g)
        taking, leaving = _FrontEnd(), _FrontEnd()
        link.joined(taking)  # type: ignore[arg-type]
        link.joined(leaving)  # type: ignore[arg-type]
        g._install(g.table)  # a change: every front-end is sent the users again
        assert taking.sent == leaving.sent == [frames.USERS, frames.USERS]
        assert g.delivered is not None
        loop = asyncio.get_running_loop()

        def took() -> None:
            taking.users_generation = g.generation
            link.users_taken()

        loop.call_later(0.05, took)
        loop.call_later(0.1, link.left, leaving)  # type: ignore[arg-type]
        start = loop.time()
        await g.delivered()
        return loop.time() - start

    waited = asyncio.run(run())
    assert 0.09 < waited < 1.0  # until the one left; not the 2 s a silent front-end would cost


def test_a_client_id_cannot_forge_audit_lines(caplog: Any) -> None:
    class Forging(Context):
        def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
            return (("x-mq-client-id", "c1)\nWARNING siftmq: admin login ok for root (forged"),)

    g = gate()
    g.missing_topic = lambda name: False
    send = pb.SendMessageRequest(messages=[pb.Message(topic=pb.Resource(name="Orders"))])
    nobody = parse_auth_file(json.dumps({"users": [{"username": "eve", "password": "Ev3-s3cret-pw"}]}))
    with caplog.at_level("WARNING"):
        assert g.authorized(nobody.users["eve"], "SendMessage", send, Forging()) is not None
    lines = "\n".join(r.getMessage() for r in caplog.records)
    assert "denied SendMessage" in lines and "\n" not in lines and "c1)?WARNING" in lines


def test_a_resource_named_by_a_client_cannot_forge_audit_lines(caplog: Any) -> None:
    """A denial's line names the topic as the client sent it: a line break (or a terminal escape,
    U+2028, U+0085) in it wrote a line of its own, such as a user created by admin."""
    g = gate()  # (every topic new: alice may not Create)
    forged = "x\n2026-11-27 09:40:00,000 INFO siftmq.server.admin_users: user eve created\x1b[0m\u2028\x85"
    send = pb.SendMessageRequest(messages=[pb.Message(topic=pb.Resource(name=forged))])
    with caplog.at_level("WARNING"):
        assert g.authorized(TABLE.users["alice"], "SendMessage", send, Context()) is not None
    lines = "\n".join(r.getMessage() for r in caplog.records)
    assert "denied SendMessage" in lines and "\n" not in lines and "x?2026-11-27" in lines
    assert not any(c in lines for c in "\x1b\u2028\x85")


def test_a_namespace_goes_after_a_system_topics_prefix() -> None:
    """RocketMQ wraps %DLQ%/%RETRY% topics as %DLQ%ns%group, which is where the broker moves a
    namespaced group's dead letters: a reader asking for %DLQ%g in ns1 read ns1%%DLQ%g (empty)."""
    from siftmq.broker.validation import qualified_name

    assert qualified_name("ns1", "%DLQ%g") == "%DLQ%ns1%g"
    assert qualified_name("ns1", "%DLQ%ns1%g") == "%DLQ%ns1%g"  # already qualified
    assert qualified_name("ns1", "%RETRY%g") == "%RETRY%ns1%g"
    assert qualified_name("ns1", "Orders") == "ns1%Orders"
    assert qualified_name("", "%DLQ%g") == "%DLQ%g"
