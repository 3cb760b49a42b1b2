"""``siftmq demo filter-server``: a consumer's own filter program, run on the broker in the sandbox.

Orders with JSON bodies go to ``Orders``. Group ``big-a`` registers a program keeping the orders
that have an item whose sku starts with ``A`` and a total over 100 — a condition on the body that
no SQL92 filter can express — and receives exactly those; the bytes it did not receive are what
client-side filtering would have cost. Then group ``hostile`` registers a program that passes its
sample but spins forever on real orders: the broker suspends it, while ``big-a`` keeps receiving
the next orders.
"""

from __future__ import annotations

import asyncio
import json
import random
from dataclasses import dataclass, field
from typing import Any, Final

import httpx

from siftmq.client import FilterExpression, Producer, SimpleConsumer
from siftmq.errors import RemoteError
from siftmq.testing import running_broker

TOPIC: Final = "Orders"
PROGRAM: Final = """import json

def match(message):
    order = json.loads(message.body)
    return order["total"] > 100 and any(item["sku"].startswith("A") for item in order["items"])
"""
HOSTILE: Final = """def match(message):
    if message.body == b"{}":  # the sample it is registered with
        return True
    while True:
        pass
"""


def make_order(i: int, rng: random.Random) -> dict[str, Any]:
    items = [{"sku": rng.choice("ABC") + str(rng.randrange(1000)), "qty": rng.randint(1, 3)}
             for _ in range(rng.randint(1, 3))]  # fmt: skip
    return {"id": i, "total": rng.randint(10, 300), "items": items}


def wanted(order: dict[str, Any]) -> bool:
    return order["total"] > 100 and any(item["sku"].startswith("A") for item in order["items"])


@dataclass
class Outcome:
    sent: int = 0
    sent_bytes: int = 0
    expected: set[int] = field(default_factory=set)
    received: set[int] = field(default_factory=set)
    received_bytes: int = 0
    later_expected: set[int] = field(default_factory=set)
    later_received: set[int] = field(default_factory=set)
    hostile: dict[str, Any] = field(default_factory=dict)


async def _send(endpoint: str, orders: list[dict[str, Any]]) -> int:
    async with Producer(endpoint) as producer:
        bodies = [json.dumps(o).encode() for o in orders]
        for first in range(0, len(orders), 200):
            await producer.send_many([
                producer.message(TOPIC, body, tag="order", keys=(str(o["id"]),))
                for o, body in zip(orders[first : first + 200], bodies[first : first + 200], strict=True)
            ])  # fmt: skip
        return sum(len(b) for b in bodies)


async def _receive(endpoint: str, group: str, want: int, rounds: int = 30) -> tuple[set[int], int]:
    got: set[int] = set()
    size = 0
    async with SimpleConsumer(endpoint, group, {TOPIC: FilterExpression.tag()}, await_duration=1) as consumer:
        empty = 0
        for _ in range(rounds):
            try:
                batch = await consumer.receive(32, 30)
            except RemoteError as exc:
                if not exc.is_retriable:
                    raise
                # a program killed and replaced (the hostile one) can hold a read past the call's
                # time on a busy machine: the round counts as empty, as a consumer would go on
                batch = []
            for m in batch:
                got.add(json.loads(m.body)["id"])
                size += len(m.body)
                await consumer.ack(m)
            empty = 0 if batch else empty + 1
            if len(got) >= want and empty >= 1:
                break
    return got, size


def run(count: int = 2000, seed: int = 7) -> Outcome:
    rng = random.Random(seed)
    orders = [make_order(i, rng) for i in range(count)]
    later = [make_order(count + i, rng) for i in range(200)]
    out = Outcome(sent=count, expected={o["id"] for o in orders if wanted(o)},
                  later_expected={o["id"] for o in later if wanted(o)})  # fmt: skip
    settings: dict[str, object] = {"filter_program_max_failures": 6}
    with running_broker(settings) as broker:
        admin = broker.admin_url
        with httpx.Client(base_url=admin, timeout=60) as http:
            http.post("/topics", json={"name": TOPIC, "queue_nums": 4}).raise_for_status()
            out.sent_bytes = asyncio.run(_send(broker.endpoint, orders))
            http.put(f"/groups/big-a/programs/{TOPIC}", json={"source": PROGRAM}).raise_for_status()
            out.received, out.received_bytes = asyncio.run(
                _receive(broker.endpoint, "big-a", len(out.expected))
            )
            http.put(f"/groups/hostile/programs/{TOPIC}", json={"source": HOSTILE, "sample": {"body": "{}"}}
                     ).raise_for_status()  # fmt: skip
            asyncio.run(_receive(broker.endpoint, "hostile", 1, rounds=6))  # spins: suspended
            asyncio.run(_send(broker.endpoint, later))
            out.later_received, _ = asyncio.run(_receive(broker.endpoint, "big-a", len(out.later_expected)))
            out.hostile = http.get(f"/groups/hostile/programs/{TOPIC}").json()
    return out
