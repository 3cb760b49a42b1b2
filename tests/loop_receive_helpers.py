"""Helpers of the tests of receives made on the event loop (``try_receive``, shared passes), on an
in-process broker."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from siftmq.broker import Broker
from siftmq.testing import open_broker


def make_broker(data_dir: Path, **overrides: Any) -> Broker:
    """A broker whose housekeeping saves no consumer progress during a test: the save takes the
    queues' locks, which makes a receive on the loop decline (rightly, but not what is tested)."""
    broker: Broker = open_broker(data_dir, consumer_state_flush_ms=10**6, **overrides)
    return broker


def in_flight(broker: Broker, group: str, topic: str) -> dict[int, list[int]]:
    """The queue offsets ``group`` has in flight on ``topic``, by queue (queues it never read: absent)."""
    queues = broker.topics.get(topic)
    assert queues is not None
    found = {}
    for qid in range(queues.queue_nums):
        prog = broker.consumers.get((group, topic, qid))
        if prog is not None:
            found[qid] = sorted(prog.inflight)
    return found
