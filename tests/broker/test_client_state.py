"""Broadcasting clients' own progress is dropped once the client is gone longer than the limit."""

from __future__ import annotations

from pathlib import Path

from siftmq.broker.client_state import ClientStateSweeper
from siftmq.broker.clients import ClientRegistry
from siftmq.broker.consumer_state import ConsumerStateTable
from siftmq.broker.offsets import OffsetTable


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_progress_of_clients_unseen_for_the_limit_is_dropped(tmp_path: Path) -> None:
    consumers, offsets = ConsumerStateTable(tmp_path), OffsetTable(tmp_path)
    clients = ClientRegistry(expire_s=1e9)
    clock = Clock()
    sweeper = ClientStateSweeper(consumers, offsets, clients, expire_s=600, monotonic=clock)
    consumers.get_or_create(("g@alive", "T", 0), 0)
    consumers.get_or_create(("g@gone", "T", 0), 5)
    consumers.get_or_create(("clustered", "T", 0), 7)  # a clustering group's progress: never dropped
    offsets.set(("g@gone", "T", 1), 9)
    offsets.set(("puller", "T", 1), 3)
    clients.touch("alive", group="g")
    assert sweeper.sweep() == []  # first seen now
    clock.now += 599
    assert sweeper.sweep() == []
    clock.now += 2
    assert sweeper.sweep() == ["g@gone"]  # unseen for 601 s; "alive" has a session
    assert {k[0] for k, _ in consumers.items()} == {"g@alive", "clustered"}
    assert {k[0] for k, _ in offsets.items()} == {"puller"}
    consumers.save()
    assert {k[0] for k, _ in ConsumerStateTable(tmp_path).items()} == {"g@alive", "clustered"}
    clients.remove("alive")
    clock.now += 601
    assert sweeper.sweep() == ["g@alive"]
    assert {k[0] for k, _ in consumers.items()} == {"clustered"}
