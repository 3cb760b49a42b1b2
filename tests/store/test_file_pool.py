"""The index files' descriptor pool: a small budget, many queues, nothing lost or misread."""

from __future__ import annotations

from pathlib import Path

import pytest

from siftmq.store import MessageStore
from siftmq.store.filepool import POOL
from store_helpers import msg, small_config


@pytest.fixture
def tiny_pool(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(POOL, "_budget", 6)


def _read_queue(store: MessageStore, topic: str, queue_id: int) -> list[bytes]:
    out: list[bytes] = []
    offset = store.get_min_offset_in_queue(topic, queue_id)
    while True:
        res = store.get_messages("g", topic, queue_id, offset, 64)
        out += [m.body for m in res.messages]
        if not res.messages:
            return out
        offset = res.next_begin_offset


def test_many_queues_through_six_descriptors(tmp_path: Path, tiny_pool: None) -> None:
    cfg = small_config(tmp_path)
    expected: dict[tuple[str, int], list[bytes]] = {}
    with MessageStore.open(cfg) as store:
        for i in range(600):  # 40 queues, 15 messages each (more than one 16-entry file for some)
            key = (f"T{i % 20}", i % 2)
            body = f"m{i}".encode()
            store.put_message(msg(topic=key[0], queue_id=key[1], body=body, TAGS="t"))
            expected.setdefault(key, []).append(body)
            assert POOL.open_count <= 6
        store.wait_dispatched(10)
        for key, bodies in expected.items():
            assert _read_queue(store, *key) == bodies
            assert POOL.open_count <= 6
    with MessageStore.open(cfg) as store:  # what was written through evicted descriptors is there
        for key, bodies in expected.items():
            assert _read_queue(store, *key) == bodies
