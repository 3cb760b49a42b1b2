"""Seed 002: the e-commerce scenario on ``Trade_Topic`` with its downstream systems.

Order, payment and logistics messages (logistics with a ``Region``, every message with a
``price``) go to one topic; each downstream system is a consumer group with its own TAG or SQL92
filter. Every group drains the topic; the report compares what each received with what its
filter should select, and counts the body bytes that crossed the network for it.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

from siftmq.client import FilterExpression, Producer, PullConsumer

TOPIC = "Trade_Topic"
KINDS = ("Order", "Pay", "Logistics")
REGIONS = ("Hangzhou", "Shanghai", "Beijing")

Row = dict[str, str]


@dataclass(frozen=True)
class System:
    name: str
    group: str
    expression: FilterExpression
    wants: Callable[[Row], bool]


SYSTEMS = (
    System("payment system", "payment", FilterExpression.tag("Pay"), lambda r: r["tag"] == "Pay"),
    System(
        "logistics system", "logistics", FilterExpression.tag("Logistics"), lambda r: r["tag"] == "Logistics"
    ),
    System(
        "success-rate analysis",
        "success-rate",
        FilterExpression.tag("Order||Pay"),
        lambda r: r["tag"] in ("Order", "Pay"),
    ),
    System("real-time computing", "realtime", FilterExpression.tag("*"), lambda r: True),
    System(
        "logistics Hangzhou",
        "logistics-hz",
        FilterExpression.sql92("TAGS = 'Logistics' AND Region IS NOT NULL AND Region = 'Hangzhou'"),
        lambda r: r["tag"] == "Logistics" and r["Region"] == "Hangzhou",
    ),
    System(
        "logistics Hangzhou or Shanghai",
        "logistics-hz-sh",
        FilterExpression.sql92("TAGS = 'Logistics' AND Region IN ('Hangzhou', 'Shanghai')"),
        lambda r: r["tag"] == "Logistics" and r["Region"] in ("Hangzhou", "Shanghai"),
    ),
    System(
        "big Hangzhou orders",
        "orders-hz-30",
        FilterExpression.sql92(
            "Region IS NOT NULL AND price IS NOT NULL AND Region = 'Hangzhou' AND price > 30"
        ),
        lambda r: r["Region"] == "Hangzhou" and int(r["price"]) > 30,
    ),
    System("order tracking", "order-tracking", FilterExpression.tag("Order"), lambda r: r["tag"] == "Order"),
)


@dataclass
class Report:
    system: System
    expected: int
    received: int
    wrong: int
    body_bytes: int


def make_rows(count: int, seed: int = 2) -> list[Row]:
    rng = random.Random(seed)
    return [
        {
            "i": str(i),
            "tag": rng.choice(KINDS),
            "Region": rng.choice(REGIONS),
            "price": str(rng.randint(1, 100)),
        }
        for i in range(count)
    ]


BODY_SIZE = 256  # bytes of each demo message's body
SEND_BATCH = 256  # messages per send_many call


async def run(endpoint: str, count: int, progress: Callable[[str, int], None] | None = None) -> list[Report]:
    """Send ``count`` messages, drain every system's group, and report per system."""
    rows = make_rows(count)
    body = b"x" * BODY_SIZE
    async with Producer(endpoint) as producer:
        for first in range(0, count, SEND_BATCH):
            chunk = rows[first : first + SEND_BATCH]
            await producer.send_many(
                [
                    producer.message(
                        TOPIC, body, tag=r["tag"], properties={k: r[k] for k in ("i", "Region", "price")}
                    )
                    for r in chunk
                ]
            )
            if progress:
                progress("send", len(chunk))
    reports = []
    for system in SYSTEMS:
        consumer = PullConsumer(endpoint, system.group, TOPIC, system.expression)
        await consumer.start()
        try:
            seen: dict[str, int] = {}
            size = 0
            while True:
                batch = await consumer.poll(1024)
                if not batch:
                    break
                for m in batch:
                    seen[m.properties["i"]] = seen.get(m.properties["i"], 0) + 1
                    size += len(m.body)
            await consumer.commit()
        finally:
            await consumer.stop()
        wanted = {r["i"] for r in rows if system.wants(r)}
        wrong = sum(1 for i in seen if i not in wanted) + sum(n - 1 for n in seen.values())
        reports.append(Report(system, len(wanted), len(seen.keys() & wanted), wrong, size))
        if progress:
            progress("consume", 1)
    return reports
