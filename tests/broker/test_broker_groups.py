"""Consumer groups in-process: consistency (strict, compat = seed 004), broadcasting, pull assignment."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from siftmq.broker import Broker, ProducedMessage, Subscription, deletion
from siftmq.broker import clients as clients_module
from siftmq.broker import groups as groups_module
from siftmq.broker.groups import SubscriptionConflictError
from siftmq.broker.pull import allocate_averagely
from siftmq.errors import BadRequestError, StatusCode
from siftmq.testing import SteppedClock
from siftmq.testing import open_broker as make_broker

TOPIC = "SUBSCRIBE_TEST"
GROUP = "SUBSCRIBE_TEST_CONSUMER_GROUP"


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[Broker]:
    b = make_broker(tmp_path / "data")
    yield b
    b.close()


def tag(expr: str, topic: str = TOPIC) -> Subscription:
    return Subscription(topic, "TAG", expr)


def send_seed_004(broker: Broker) -> None:
    """Seed 004's producer: 8 messages, the first 4 tagged tagA, the last 4 tagB."""
    for i in range(8):
        broker.send(
            ProducedMessage(topic=TOPIC, body=f"MsgStr{i}".encode(), message_id=f"01SEED{i}",
                            tag="tagA" if i < 4 else "tagB")
        )  # fmt: skip


def receive_all(broker: Broker, client: str, sub: Subscription, group: str = GROUP) -> list[str]:
    got = []
    for _ in range(20):
        batch = broker.receive(group, sub, client_id=client, batch_size=16, invisible_ms=60_000)
        for d in batch:
            got.append(d.message.body.decode())
            broker.ack(group, sub.topic, d.receipt_handle, client_id=client)
        if not batch:
            break
    return got


def test_strict_group_refuses_a_second_subscription_and_loses_nothing(broker: Broker) -> None:
    broker.subscribe("ConsumerForTagA", "SIMPLE_CONSUMER", GROUP, [tag("tagA")])
    with pytest.raises(SubscriptionConflictError) as exc:
        broker.subscribe("ConsumerForTagB", "SIMPLE_CONSUMER", GROUP, [tag("tagB")])
    text = exc.value.message
    assert exc.value.status == "PRECONDITION_FAILED"
    for part in (GROUP, TOPIC, "'tagA'", "'tagB'", "ConsumerForTagA"):
        assert part in text
    with pytest.raises(SubscriptionConflictError):
        broker.receive(GROUP, tag("tagB"), client_id="ConsumerForTagB")
    with pytest.raises(SubscriptionConflictError):  # its heartbeats hear it too
        broker.heartbeat("ConsumerForTagB", "SIMPLE_CONSUMER", GROUP)
    broker.heartbeat("ConsumerForTagA", "SIMPLE_CONSUMER", GROUP)
    send_seed_004(broker)
    assert sorted(receive_all(broker, "ConsumerForTagA", tag("tagA"))) == [f"MsgStr{i}" for i in range(4)]
    # once the holder is gone, the new subscription is accepted; the group had passed over the tagB
    # messages under its tagA subscription, so B gets what is sent from now on
    broker.client_terminated("ConsumerForTagA")
    broker.subscribe("ConsumerForTagB", "SIMPLE_CONSUMER", GROUP, [tag("tagB")])
    entry = broker.groups.subscription(GROUP, TOPIC)
    assert entry is not None and entry.expression == "tagB" and entry.version == 2
    for i in range(8, 12):
        broker.send(
            ProducedMessage(topic=TOPIC, body=f"MsgStr{i}".encode(), message_id=f"01L{i}", tag="tagB")
        )
    assert set(receive_all(broker, "ConsumerForTagB", tag("tagB"))) == {f"MsgStr{i}" for i in range(8, 12)}


def test_strict_group_refuses_different_topic_sets(broker: Broker) -> None:
    broker.subscribe("c1", "PUSH_CONSUMER", "g", [tag("*", "TopicA"), tag("*", "TopicB")])
    with pytest.raises(SubscriptionConflictError) as exc:
        broker.subscribe("c2", "PUSH_CONSUMER", "g", [tag("*", "TopicA")])
    assert "TopicB" in exc.value.message and "c1" in exc.value.message
    broker.subscribe("c3", "PUSH_CONSUMER", "g", [tag("*", "TopicB"), tag("*", "TopicA")])  # same set


def test_a_member_refused_for_its_topics_stays_refused_on_receive_and_pull(broker: Broker) -> None:
    """A refusal of the settings holds for the member's requests: one receive or pull with the group's
    expression cleared it, and the member then took queues of a topic it never reads."""
    for topic in ("T1", "T2"):
        broker.send(ProducedMessage(topic=topic, body=b"m", message_id=f"01TS{topic}", tag="a"))
    broker.subscribe("A", "PULL_CONSUMER", "G", [tag("*", "T1"), tag("*", "T2")])
    with pytest.raises(SubscriptionConflictError):
        broker.subscribe("B", "PULL_CONSUMER", "G", [tag("*", "T1")])
    with pytest.raises(SubscriptionConflictError, match="subscribes topics"):
        broker.pull("G", tag("*", "T1"), 0, 0, 8, client_id="B")
    with pytest.raises(SubscriptionConflictError, match="subscribes topics"):
        broker.receive("G", tag("*", "T1"), client_id="B", batch_size=8, invisible_ms=60_000)
    with pytest.raises(SubscriptionConflictError):
        broker.heartbeat("B", "PULL_CONSUMER", "G")
    assert broker.assignment("G", "T2", "A") == [0, 1, 2, 3]  # B, refused, holds none of them
    broker.client_terminated("A")  # the member B disagreed with is gone: B's requests are served
    assert broker.receive("G", tag("*", "T1"), client_id="B", batch_size=8, invisible_ms=60_000)
    broker.heartbeat("B", "PULL_CONSUMER", "G")


def test_a_strict_clustering_group_consumes_one_way(broker: Broker) -> None:
    """Receives keep the group's progress and pulls its committed offsets, each on its own: a pull
    member beside a receiving one would be handed every message the other is."""
    broker.subscribe("popper", "SIMPLE_CONSUMER", "G", [tag("*")])
    with pytest.raises(SubscriptionConflictError, match="consume the same way") as exc:
        broker.subscribe("puller", "PULL_CONSUMER", "G", [tag("*")])
    assert "popper" in exc.value.message and "PULL_CONSUMER" in exc.value.message
    with pytest.raises(SubscriptionConflictError):
        broker.pull("G", tag("*"), 0, 0, 8, client_id="puller")
    broker.subscribe("pusher", "PUSH_CONSUMER", "G", [tag("*")])  # a push consumer receives too
    broker.subscribe("puller", "PULL_CONSUMER", "other", [tag("*")])
    broker.configure_group("G2", mode="clustering", consistency="compat")
    broker.subscribe("popper2", "SIMPLE_CONSUMER", "G2", [tag("*")])
    broker.subscribe("puller2", "PULL_CONSUMER", "G2", [tag("*")])  # compat groups are not checked


def test_a_groups_first_receive_starts_where_its_pulls_committed(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """A group that consumed by pull and then by receive goes on from its committed offset (the rule
    for a new group started over at the queue's start, or past everything once retention had begun)."""
    broker = make_broker(tmp_path / "d", default_queue_nums=1)
    request.addfinalizer(broker.close)
    for i in range(6):
        broker.send(ProducedMessage(topic=TOPIC, body=str(i).encode(), message_id=f"01PC{i}", tag="t"))
    broker.subscribe("puller", "PULL_CONSUMER", "H", [tag("*")])
    pulled = broker.pull("H", tag("*"), 0, 0, 4, client_id="puller")
    broker.update_offset("H", TOPIC, 0, pulled.next_offset, client_id="puller")
    broker.client_terminated("puller")
    broker.subscribe("popper", "SIMPLE_CONSUMER", "H", [tag("*")])
    got = broker.receive("H", tag("*"), client_id="popper", queue_id=0, batch_size=16, invisible_ms=60_000)
    assert [d.message.body for d in got] == [b"4", b"5"]
    for d in got:
        broker.ack("H", TOPIC, d.receipt_handle, client_id="popper")
    broker.client_terminated("popper")
    # and back to pulling: from the group's last pull commit, which may have gone back on purpose
    # (a seek): what the receives acknowledged since is read again, nothing is skipped
    broker.subscribe("puller2", "PULL_CONSUMER", "H", [tag("*")])
    assert broker.get_offset("H", TOPIC, 0, client_id="puller2") == 4


def test_a_redelivery_the_groups_new_filter_rejects_is_not_delivered(broker: Broker) -> None:
    """The group's only member changes its subscription while a message is in flight: the message is
    the group's no longer, as the queue's other messages that filter rejects."""
    broker.subscribe("c1", "SIMPLE_CONSUMER", GROUP, [tag("tagA")])
    broker.send(ProducedMessage(topic=TOPIC, body=b"a", message_id="01REDA", tag="tagA"))
    assert broker.receive(GROUP, tag("tagA"), client_id="c1", batch_size=16, invisible_ms=50)
    broker.subscribe("c1", "SIMPLE_CONSUMER", GROUP, [tag("tagB")])
    broker.send(ProducedMessage(topic=TOPIC, body=b"b", message_id="01REDB", tag="tagB"))
    time.sleep(0.1)  # the tagA message is due again
    got = broker.receive(GROUP, tag("tagB"), client_id="c1", batch_size=16, invisible_ms=60_000)
    assert [d.message.body for d in got] == [b"b"]
    time.sleep(0.1)
    assert broker.receive(GROUP, tag("tagB"), client_id="c1", batch_size=16, invisible_ms=60_000) == []


def test_groups_past_max_groups_are_refused_until_one_is_deleted(tmp_path: Path) -> None:
    """Each group costs memory and a share of every write of the groups and progress files (a new
    group's first read writes both whole: ~90 ms each at 6,000 groups): one past max_groups is refused."""
    broker = make_broker(tmp_path / "d", max_groups=2, compat_groups=("ops1", "ops2"))
    try:
        broker.send(ProducedMessage(topic=TOPIC, body=b"m", message_id="01MAXG", tag="a"))
        with pytest.raises(BadRequestError, match="max_groups") as exc:
            broker.receive("g1", tag("*"), client_id="c1", batch_size=1, invisible_ms=60_000)
        assert exc.value.status == StatusCode.PRECONDITION_FAILED and "'g1'" in exc.value.message
        with pytest.raises(BadRequestError, match="max_groups"):
            broker.subscribe("c1", "SIMPLE_CONSUMER", "g1", [tag("*")])
        assert broker.groups.get("g1") is None
        assert broker.receive("ops1", tag("*"), client_id="c2", batch_size=1, invisible_ms=60_000)
        broker.client_terminated("c2")
        deletion.delete_group(broker, "ops1")
        assert broker.receive("g1", tag("*"), client_id="c1", batch_size=1, invisible_ms=60_000)
    finally:
        broker.close()


def test_groups_known_by_loaded_offsets_or_progress_count_toward_max_groups(tmp_path: Path) -> None:
    """Offsets and progress kept under groups the groups file lacks (committed before commits made
    groups) are groups all the same: counted after a restart, and never refused their own commits."""
    broker = make_broker(tmp_path / "d", max_groups=2)
    try:
        broker.send(ProducedMessage(topic=TOPIC, body=b"m", message_id="01ADOPT", tag="a"))
        broker.offsets.set(("legacy", TOPIC, 0), 0)
        broker.consumers.get_or_create(("bc@client-1", TOPIC, 0), 0)  # a broadcasting member's progress
    finally:
        broker.close()
    broker = make_broker(tmp_path / "d", max_groups=2)
    try:
        assert broker.groups.get("legacy") is not None and broker.groups.get("bc") is not None
        broker.update_offset("legacy", TOPIC, 0, 1)
        assert broker.get_offset("legacy", TOPIC, 0) == 1
        with pytest.raises(BadRequestError, match="max_groups") as exc:
            broker.update_offset("new", TOPIC, 0, 1)
        assert exc.value.status == StatusCode.PRECONDITION_FAILED and "'new'" in exc.value.message
        with pytest.raises(BadRequestError, match="max_groups"):
            broker.update_offsets("new", TOPIC, [(0, 1)])
        assert broker.groups.get("new") is None and broker.offsets.get(("new", TOPIC, 0)) is None
    finally:
        broker.close()


def test_compat_group_reproduces_seed_004(tmp_path: Path) -> None:
    broker = make_broker(tmp_path / "d", compat_groups=[GROUP])
    try:
        broker.subscribe("ConsumerForTagA", "PUSH_CONSUMER", GROUP, [tag("tagA")])
        broker.subscribe("ConsumerForTagB", "PUSH_CONSUMER", GROUP, [tag("tagB")])  # the newest wins
        entry = broker.groups.subscription(GROUP, TOPIC)
        assert entry is not None and entry.expression == "tagB" and entry.version == 2
        send_seed_004(broker)
        assert receive_all(broker, "ConsumerForTagA", tag("tagA")) == []  # sees only tagB and drops it
        got_b = receive_all(broker, "ConsumerForTagB", tag("tagB"))
        assert set(got_b) <= {f"MsgStr{i}" for i in range(4, 8)}
        # the tagA messages are gone for the group: nobody ever receives them
        assert receive_all(broker, "ConsumerForTagA", tag("tagA")) == []
        info = broker.groups.get(GROUP)
        assert info is not None and info.inconsistencies >= 1 and "tagA" in (info.last_inconsistency or "")
        total_b = len(got_b) + info.dropped
        assert total_b >= 4  # every tagB message went to B or was dropped by A
    finally:
        broker.close()


def test_broadcasting_gives_every_member_every_message(tmp_path: Path) -> None:
    broker = make_broker(tmp_path / "d", broadcasting_groups=["bc"])
    try:
        for c in ("c1", "c2", "c3"):
            broker.subscribe(c, "SIMPLE_CONSUMER", "bc", [tag("*")])
        send_seed_004(broker)
        for c in ("c1", "c2", "c3"):
            assert sorted(receive_all(broker, c, tag("*"), group="bc")) == [f"MsgStr{i}" for i in range(8)]
        with pytest.raises(BadRequestError) as exc:  # switching modes under live clients is refused
            broker.groups.configure("bc", mode="clustering", live_clients=len(broker.clients.live_ids("bc")))
        assert exc.value.status == "PRECONDITION_FAILED"
    finally:
        broker.close()


@pytest.mark.parametrize(("queues", "members"), [(8, 3), (4, 4), (3, 5), (16, 3), (1, 2)])
def test_average_allocation_is_disjoint_and_complete(queues: int, members: int) -> None:
    ids = [f"m{i}" for i in range(members)]
    shares = [allocate_averagely(list(range(queues)), ids, m) for m in ids]
    flat = [q for share in shares for q in share]
    assert sorted(flat) == list(range(queues))
    assert max(map(len, shares)) - min(map(len, shares)) <= 1


def test_pull_members_share_queues_and_rebalance(broker: Broker) -> None:
    for i in range(40):
        broker.send(ProducedMessage(topic=TOPIC, body=str(i).encode(), message_id=f"01PULL{i}", tag="t"))
    members = ["p1", "p2", "p3"]
    for m in members:
        broker.subscribe(m, "PULL_CONSUMER", "pullers", [tag("*")])
    shares = {m: broker.assignment("pullers", TOPIC, m) for m in members}
    assert sorted(q for s in shares.values() for q in s or []) == [0, 1, 2, 3]
    owner_of = {q: m for m, s in shares.items() for q in s or []}
    not_mine = next(q for q, m in owner_of.items() if m != "p1")
    with pytest.raises(BadRequestError) as exc:
        broker.pull("pullers", tag("*"), not_mine, 0, 32, client_id="p1")
    assert "assigned to another member" in exc.value.message

    consumed: dict[str, list[str]] = {}
    lock = threading.Lock()

    def consume(member: str, stop: threading.Event) -> None:
        while not stop.is_set():
            for q in broker.assignment("pullers", TOPIC, member) or []:
                try:
                    offset = broker.get_offset("pullers", TOPIC, q, client_id=member)
                except Exception:
                    offset = 0
                try:
                    r = broker.pull("pullers", tag("*"), q, offset, 8, client_id=member)
                except BadRequestError:
                    continue  # the queue moved to another member meanwhile
                with lock:
                    for msg in r.messages:
                        consumed.setdefault(msg.body.decode(), []).append(member)
                broker.update_offset("pullers", TOPIC, q, r.next_offset, client_id=member)
            time.sleep(0.005)

    stops = {m: threading.Event() for m in members}
    threads = [threading.Thread(target=consume, args=(m, stops[m])) for m in members]
    for t in threads:
        t.start()
    time.sleep(0.1)
    stops["p3"].set()
    broker.client_terminated("p3")  # p3 leaves mid-stream: its queues go to p1 and p2
    for i in range(40, 80):
        broker.send(ProducedMessage(topic=TOPIC, body=str(i).encode(), message_id=f"01PULL{i}", tag="t"))
    deadline = time.monotonic() + 10
    while len(consumed) < 80 and time.monotonic() < deadline:
        time.sleep(0.05)
    for e in stops.values():
        e.set()
    for t in threads:
        t.join()
    assert sorted(consumed, key=int) == [str(i) for i in range(80)]  # every message at least once
    late = {m for body, who in consumed.items() if int(body) >= 40 for m in who}
    assert "p3" not in late
    assert broker.assignment("pullers", TOPIC, "p1") and broker.assignment("pullers", TOPIC, "p2")


def test_expired_members_free_the_subscription(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    clock = SteppedClock()
    monkeypatch.setattr(clients_module, "time", clock)
    broker = make_broker(tmp_path / "d", client_session_expire_s=0.2)
    try:
        broker.subscribe("old", "SIMPLE_CONSUMER", GROUP, [tag("tagA")])
        with pytest.raises(SubscriptionConflictError):
            broker.subscribe("new", "SIMPLE_CONSUMER", GROUP, [tag("tagB")])
        clock.advance(0.3)
        assert [s.client_id for s in broker.clients.expire()] == ["old", "new"] or broker.clients.get(
            "old"
        ) is None
        broker.subscribe("new", "SIMPLE_CONSUMER", GROUP, [tag("tagB")])
    finally:
        broker.close()


def test_strict_subscription_survives_a_restart(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    clock = SteppedClock()
    monkeypatch.setattr(clients_module, "time", clock)
    monkeypatch.setattr(groups_module, "time", clock)
    broker = make_broker(tmp_path / "d", client_session_expire_s=0.5)
    broker.subscribe("A", "SIMPLE_CONSUMER", GROUP, [tag("tagA")])
    broker.close()
    broker = make_broker(tmp_path / "d", client_session_expire_s=0.5)
    try:  # A's subscription counts as held until A had time to come back
        with pytest.raises(SubscriptionConflictError) as exc:
            broker.subscribe("C", "SIMPLE_CONSUMER", GROUP, [tag("tagB")])
        assert "before the broker restarted" in exc.value.message
        broker.subscribe("A2", "SIMPLE_CONSUMER", GROUP, [tag("tagA")])  # the same subscription is welcome
        broker.client_terminated("A2")
        clock.advance(0.6)
        broker.subscribe("C", "SIMPLE_CONSUMER", GROUP, [tag("tagB")])  # nobody came back: accepted
    finally:
        broker.close()


def test_a_group_a_commit_could_not_write_is_not_made(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A commit's new group is written before it counts: when the groups file cannot be written the
    commit is refused and the group not made, so the next commit writes it (before, the group stayed
    in memory unwritten and later commits never wrote it)."""
    manager = groups_module.GroupManager(tmp_path, max_groups=10)
    real = groups_module.write_json

    def full_disk(*args: object, **kwargs: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(groups_module, "write_json", full_disk)
    with pytest.raises(OSError):
        manager.register("late")
    assert manager.get("late") is None
    monkeypatch.setattr(groups_module, "write_json", real)
    manager.register("late")
    assert groups_module.GroupManager(tmp_path).get("late") is not None  # written
