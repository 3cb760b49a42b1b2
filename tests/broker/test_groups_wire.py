"""Consumer groups against a real broker process: broadcasting, pull rebalancing, client expiry."""

from __future__ import annotations

import threading
import time
from typing import Any

import grpc
import pytest

from siftmq.protocol import rocketmq_v2_pb2 as pb
from siftmq.protocol import siftmq_batch_pb2 as batch_pb
from siftmq.protocol.service import BATCH_RPCS, RPCS

pytestmark = pytest.mark.integration
RPC = {r.name: r for r in (*RPCS, *BATCH_RPCS)}
TOPIC = "GroupTopic"


class RawClient:
    """A minimal pull consumer over siftmq's own stubs (x-mq-client-id set on every call)."""

    def __init__(self, endpoint: str, client_id: str, group: str, expression: str = "*",
                 client_type: int = pb.ClientType.PULL_CONSUMER) -> None:  # fmt: skip
        self.channel = grpc.insecure_channel(endpoint)
        self.metadata = (("x-mq-client-id", client_id),)
        self.client_id = client_id
        self.group = pb.Resource(name=group)
        self.expression = expression
        self.client_type = client_type
        host, port = endpoint.rsplit(":", 1)
        self.endpoints = pb.Endpoints(
            scheme=pb.AddressScheme.IPv4, addresses=[pb.Address(host=host, port=int(port))]
        )

    def call(self, name: str, request: Any) -> Any:
        rpc = RPC[name]
        if rpc.shape == "unary_unary":
            fn = self.channel.unary_unary(rpc.path, request_serializer=type(request).SerializeToString,
                                          response_deserializer=rpc.response.FromString)  # fmt: skip
            return fn(request, timeout=10, metadata=self.metadata)
        fn = self.channel.unary_stream(rpc.path, request_serializer=type(request).SerializeToString,
                                       response_deserializer=rpc.response.FromString)  # fmt: skip
        return list(fn(request, timeout=10, metadata=self.metadata))

    def declare(self) -> pb.Status:
        """Telemetry settings: client type, group and subscription (one command, first reply)."""
        settings = pb.Settings(
            client_type=self.client_type,
            subscription=pb.Subscription(
                group=self.group,
                subscriptions=[pb.SubscriptionEntry(
                    topic=pb.Resource(name=TOPIC),
                    expression=pb.FilterExpression(type=pb.FilterType.TAG, expression=self.expression),
                )],
            ),
        )  # fmt: skip
        rpc = RPC["Telemetry"]
        fn = self.channel.stream_stream(rpc.path, request_serializer=pb.TelemetryCommand.SerializeToString,
                                        response_deserializer=pb.TelemetryCommand.FromString)  # fmt: skip
        call = fn(iter([pb.TelemetryCommand(settings=settings)]), timeout=10, metadata=self.metadata)
        reply = next(iter(call))
        call.cancel()
        return reply.status

    def assignment(self) -> list[int]:
        resp = self.call("QueryAssignment", pb.QueryAssignmentRequest(
            topic=pb.Resource(name=TOPIC), group=self.group, endpoints=self.endpoints))  # fmt: skip
        assert resp.status.code == pb.Code.OK, resp.status.message
        return [a.message_queue.id for a in resp.assignments]

    def pull_once(self, seen: dict[str, list[str]], lock: threading.Lock) -> None:
        for qid in self.assignment():
            queue = pb.MessageQueue(topic=pb.Resource(name=TOPIC), id=qid)
            got = self.call("GetOffset", pb.GetOffsetRequest(group=self.group, message_queue=queue))
            offset = got.offset if got.status.code == pb.Code.OK else 0
            expression = pb.FilterExpression(type=pb.FilterType.TAG, expression=self.expression)
            request = pb.PullMessageRequest(
                group=self.group,
                message_queue=queue,
                offset=offset,
                batch_size=16,
                filter_expression=expression,
            )
            frames = self.call("PullMessage", request)
            if frames[0].status.code not in (pb.Code.OK, pb.Code.MESSAGE_NOT_FOUND):
                continue  # e.g. the queue moved to another member meanwhile
            with lock:
                for f in frames:
                    if f.HasField("message"):
                        seen.setdefault(f.message.body.decode(), []).append(self.client_id)
            self.call("UpdateOffset", pb.UpdateOffsetRequest(
                group=self.group, message_queue=queue, offset=frames[-1].next_offset))  # fmt: skip

    def leave(self) -> None:
        self.call("NotifyClientTermination", pb.NotifyClientTerminationRequest(group=self.group))
        self.channel.close()


def send(endpoint: str, first: int, count: int) -> None:
    client = RawClient(endpoint, "producer", "unused")
    for i in range(first, first + count):
        sp = pb.SystemProperties(message_id=f"01G{i:06d}", tag="t", body_encoding=pb.Encoding.IDENTITY)
        msg = pb.Message(topic=pb.Resource(name=TOPIC), body=str(i).encode(), system_properties=sp)
        assert client.call("SendMessage", pb.SendMessageRequest(messages=[msg])).status.code == pb.Code.OK
    client.channel.close()


def test_pull_consumers_rebalance_as_members_join_and_leave(start_broker: Any) -> None:
    broker = start_broker()
    send(broker.endpoint, 0, 40)
    seen: dict[str, list[str]] = {}
    lock = threading.Lock()
    members: dict[str, RawClient] = {}
    stops: dict[str, threading.Event] = {}
    threads: dict[str, threading.Thread] = {}

    def join(name: str) -> None:
        client = RawClient(broker.endpoint, name, "pull-group")
        assert client.declare().code == pb.Code.OK
        members[name], stops[name] = client, threading.Event()

        def loop() -> None:
            while not stops[name].is_set():
                client.pull_once(seen, lock)
                time.sleep(0.02)

        threads[name] = threading.Thread(target=loop)
        threads[name].start()

    join("p1")
    join("p2")
    time.sleep(0.5)
    join("p3")  # joins mid-stream
    assert sorted(q for c in members.values() for q in c.assignment()) == list(range(8))
    send(broker.endpoint, 40, 40)
    time.sleep(0.5)
    stops["p1"].set()
    threads["p1"].join(30)
    members["p1"].leave()  # leaves mid-stream: its queues go to p2 and p3
    send(broker.endpoint, 80, 40)
    deadline = time.monotonic() + 30
    while len(seen) < 120 and time.monotonic() < deadline:
        time.sleep(0.1)
    for e in stops.values():
        e.set()
    for t in threads.values():
        t.join(30)
    assert sorted(seen, key=int) == [str(i) for i in range(120)]  # every message consumed at least once
    assert sorted(members["p2"].assignment() + members["p3"].assignment()) == list(range(8))
    # one member at a time: a queue that is not yours is refused
    foreign = members["p3"].assignment()[0]
    queue = pb.MessageQueue(topic=pb.Resource(name=TOPIC), id=foreign)
    frames = members["p2"].call(
        "PullMessage", pb.PullMessageRequest(group=members["p2"].group, message_queue=queue)
    )
    assert (
        frames[0].status.code == pb.Code.PRECONDITION_FAILED
        and "assigned to another" in frames[0].status.message
    )


def test_broadcasting_group_delivers_everything_to_each_member(start_broker: Any) -> None:
    broker = start_broker(config={"broadcasting_groups": ["bc-group"]})
    send(broker.endpoint, 0, 24)
    clients = [RawClient(broker.endpoint, f"b{i}", "bc-group") for i in range(3)]
    for c in clients:
        assert c.declare().code == pb.Code.OK
        assert c.assignment() == list(range(8))
    for c in clients:
        seen: dict[str, list[str]] = {}
        for _ in range(3):
            c.pull_once(seen, threading.Lock())
        assert sorted(seen, key=int) == [str(i) for i in range(24)], c.client_id


def test_expired_clients_release_their_subscription(start_broker: Any) -> None:
    broker = start_broker(config={"client_session_expire_s": 1.5})
    old = RawClient(broker.endpoint, "old", "exp-group", "tagA", pb.ClientType.SIMPLE_CONSUMER)
    new = RawClient(broker.endpoint, "new", "exp-group", "tagB", pb.ClientType.SIMPLE_CONSUMER)
    assert old.declare().code == pb.Code.OK
    refused = new.declare()
    assert refused.code == pb.Code.PRECONDITION_FAILED and "old" in refused.message
    hb = new.call(
        "Heartbeat", pb.HeartbeatRequest(group=new.group, client_type=pb.ClientType.SIMPLE_CONSUMER)
    )
    assert hb.status.code == pb.Code.PRECONDITION_FAILED
    time.sleep(2.0)  # "old" stops heartbeating and expires
    assert new.declare().code == pb.Code.OK


def _send_seed_004(endpoint: str) -> None:
    client = RawClient(endpoint, "seed-producer", "unused")
    for i in range(8):
        sp = pb.SystemProperties(message_id=f"01S{i:06d}", tag="tagA" if i < 4 else "tagB",
                                 body_encoding=pb.Encoding.IDENTITY)  # fmt: skip
        msg = pb.Message(topic=pb.Resource(name=TOPIC), body=f"MsgStr{i}".encode(), system_properties=sp)
        assert client.call("SendMessage", pb.SendMessageRequest(messages=[msg])).status.code == pb.Code.OK
    client.channel.close()


@pytest.mark.parametrize("policy", ["strict", "compat"])
def test_seed_004_with_pull_consumers(start_broker: Any, policy: str) -> None:
    group = "SUBSCRIBE_TEST_CONSUMER_GROUP"
    config = {"compat_groups": [group]} if policy == "compat" else {}
    broker = start_broker(config=config)
    a = RawClient(broker.endpoint, "ConsumerForTagA", group, "tagA")
    b = RawClient(broker.endpoint, "ConsumerForTagB", group, "tagB")
    assert a.declare().code == pb.Code.OK
    b_status = b.declare()
    _send_seed_004(broker.endpoint)
    seen_a: dict[str, list[str]] = {}
    seen_b: dict[str, list[str]] = {}
    lock = threading.Lock()
    for _ in range(3):
        a.pull_once(seen_a, lock)
        b.pull_once(seen_b, lock)
    if policy == "strict":
        assert b_status.code == pb.Code.PRECONDITION_FAILED and "tagA" in b_status.message
        assert a.assignment() == list(range(8)) and b.assignment() == []  # refused: no queues
        assert sorted(seen_a) == [f"MsgStr{i}" for i in range(4)] and seen_b == {}  # nothing lost
    else:
        assert b_status.code == pb.Code.OK  # the newest subscription (tagB) now filters for the group
        assert seen_a == {}  # ConsumerForTagA's queues yield only tagB messages, which it drops
        assert set(seen_b) <= {f"MsgStr{i}" for i in range(4, 8)} and seen_b  # B: only tagB, from its queues
    a.channel.close()
    b.channel.close()


def test_update_offset_commits_only_the_members_own_queues(start_broker: Any) -> None:
    broker = start_broker(config={"broadcasting_groups": ["bc-commits"]})
    send(broker.endpoint, 0, 40)
    p1, p2 = RawClient(broker.endpoint, "p1", "commits"), RawClient(broker.endpoint, "p2", "commits")
    for c in (p1, p2):
        assert c.declare().code == pb.Code.OK
    mine, theirs = p1.assignment(), p2.assignment()
    assert sorted(mine + theirs) == list(range(8)) and mine and theirs

    def commit(client: RawClient, qid: int, offset: int, group: pb.Resource | None = None) -> pb.Status:
        queue = pb.MessageQueue(topic=pb.Resource(name=TOPIC), id=qid)
        request = pb.UpdateOffsetRequest(group=group or client.group, message_queue=queue, offset=offset)
        return client.call("UpdateOffset", request).status

    def committed(qid: int, group: str = "commits") -> int:
        queue = pb.MessageQueue(topic=pb.Resource(name=TOPIC), id=qid)
        answer = p1.call("GetOffset", pb.GetOffsetRequest(group=pb.Resource(name=group), message_queue=queue))
        assert answer.status.code == pb.Code.OK, answer.status.message
        return int(answer.offset)

    assert commit(p2, theirs[0], 3).code == pb.Code.OK  # its own queue
    # p1 moving p2's queue (a former owner's late commit, say) is refused and changes nothing
    refused = commit(p1, theirs[0], 0)
    assert refused.code == pb.Code.PRECONDITION_FAILED, refused.message
    assert f"queue {theirs[0]} of topic {TOPIC!r}" in refused.message and "'p1'" in refused.message
    assert "assigned to another member" in refused.message
    assert committed(theirs[0]) == 3
    assert commit(p1, mine[0], 2).code == pb.Code.OK and committed(mine[0]) == 2
    # a caller that is no member of the group (an admin tool) commits any queue, as before
    admin = RawClient(broker.endpoint, "admin-tool", "commits")
    assert commit(admin, theirs[0], 1).code == pb.Code.OK and committed(theirs[0]) == 1
    # in a broadcasting group every member owns every queue
    b1 = RawClient(broker.endpoint, "b1", "bc-commits")
    assert b1.declare().code == pb.Code.OK
    assert all(commit(b1, qid, 1).code == pb.Code.OK for qid in range(8))
    for c in (p1, p2, admin, b1):
        c.channel.close()


def test_commits_for_new_groups_count_toward_max_groups(start_broker: Any) -> None:
    """A commit stores offsets under its group: for a group the broker does not know it makes the
    group, as a first pull would, so one past max_groups is refused, and stays refused after a restart."""
    config = {"max_groups": 2}
    broker = start_broker(config=config)
    send(broker.endpoint, 0, 16)  # 2 messages in each of the 8 queues
    tool = RawClient(broker.endpoint, "offset-tool", "unused")  # no settings: no member of any group
    queue = pb.MessageQueue(topic=pb.Resource(name=TOPIC), id=0)

    def commit(group: str, offset: int = 1) -> pb.Status:
        request = pb.UpdateOffsetRequest(group=pb.Resource(name=group), message_queue=queue, offset=offset)
        return tool.call("UpdateOffset", request).status

    def commit_batch(group: str) -> pb.Status:
        request = batch_pb.UpdateOffsetsRequest(
            group=pb.Resource(name=group), topic=pb.Resource(name=TOPIC), queue_id=[0, 1], offset=[1, 1]
        )
        return tool.call("UpdateOffsets", request).status

    def committed(group: str) -> pb.GetOffsetResponse:
        request = pb.GetOffsetRequest(group=pb.Resource(name=group), message_queue=queue)
        return tool.call("GetOffset", request)

    def refused(st: pb.Status, group: str) -> bool:
        return (
            st.code == pb.Code.PRECONDITION_FAILED
            and f"{group!r}" in st.message
            and "max_groups" in st.message
        )

    assert commit("g1").code == pb.Code.OK
    assert commit_batch("g2").code == pb.Code.OK
    assert refused(commit("g3"), "g3")
    assert refused(commit_batch("g4"), "g4")
    assert committed("g3").status.code == pb.Code.OFFSET_NOT_FOUND  # nothing stored for it
    # the commits' groups are counted as a pull's: a pull of a new group is refused too
    pull = pb.PullMessageRequest(
        group=pb.Resource(name="g5"), message_queue=queue, offset=0, batch_size=1,
        filter_expression=pb.FilterExpression(type=pb.FilterType.TAG, expression="*"),
    )  # fmt: skip
    assert refused(tool.call("PullMessage", pull)[0].status, "g5")
    # the groups that exist commit as before
    assert commit("g1", 2).code == pb.Code.OK and committed("g1").offset == 2
    assert commit_batch("g2").code == pb.Code.OK
    tool.channel.close()
    assert broker.stop() == 0
    broker = start_broker(config=config)  # the same data directory
    tool = RawClient(broker.endpoint, "offset-tool", "unused")
    assert refused(commit("g3"), "g3")
    assert commit("g2", 2).code == pb.Code.OK and committed("g2").offset == 2
    tool.channel.close()
