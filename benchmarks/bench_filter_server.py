"""Filter programs: a worker's evaluation rate, and a group reading through a program against the
same group reading through the equivalent SQL92 filter, on one broker in the same minutes.

* evaluation: ``return message.properties.get("region") == "eu"`` on 1 KiB messages, through the
  pool (the broker's side: rows encoded, the pipe, the worker, the result checked), per batch size;
* reads: ``--messages`` 1 KiB messages, 10% with ``region = eu``; a PullConsumer (siftmq's client)
  drains the topic with SQL92 ``region = 'eu'`` and, in another group, with TAG ``*`` and the
  program, in alternating rounds. Each line gives matched msg/s, the broker's CPU per matched
  message and the body bytes delivered per matched body byte (1.00: nothing else crossed the
  network).

Run: ``.venv/bin/python benchmarks/bench_filter_server.py [--messages N] [--rounds R]``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from pathlib import Path

import httpx

from siftmq.client import FilterExpression, Producer, PullConsumer
from siftmq.filterserver.message import row
from siftmq.filterserver.pool import FilterServer, Limits, ProgramKey
from siftmq.testing import running_broker

sys.path.insert(0, str(Path(__file__).parent))
from bench_client import cpu_seconds

BODY = os.urandom(1024)
TOPIC = "ProgramBench"
PROGRAM = 'def match(message):\n    return message.properties.get("region") == "eu"\n'


def evaluation_rate() -> None:
    rows = [
        row(topic=TOPIC, body=BODY, properties={"region": "eu" if i % 10 == 0 else "us", "i": str(i)},
            tag="t", message_id=f"01ABC{i}", queue_offset=i)
        for i in range(1000)
    ]  # fmt: skip
    server = FilterServer(Limits(timeout_ms=50, batch_timeout_ms=5000), 1)
    key = ProgramKey("bench", TOPIC, 1)
    try:
        server.evaluate(key, PROGRAM, rows)
        for n in (32, 256, 1000):
            start, total = time.perf_counter(), 0
            while time.perf_counter() - start < 2:
                server.evaluate(key, PROGRAM, rows[:n])
                total += n
            rate = total / (time.perf_counter() - start)
            print(f"evaluation, one worker, batches of {n}: {rate:,.0f} msg/s", flush=True)
    finally:
        server.close()


async def send(endpoint: str, total: int) -> int:
    async with Producer(endpoint) as producer:
        for first in range(0, total, 500):
            await producer.send_many([
                producer.message(TOPIC, BODY, tag="t", properties={"region": "eu" if i % 10 == 0 else "us"})
                for i in range(first, min(first + 500, total))
            ])  # fmt: skip
    return (total + 9) // 10


async def drain(
    endpoint: str, group: str, expression: FilterExpression, expected: int
) -> tuple[float, int, int]:
    got = body_bytes = 0
    async with PullConsumer(endpoint, group, TOPIC, expression) as consumer:
        start = time.perf_counter()
        idle = 0
        while got < expected and idle < 20:
            batch = await consumer.poll(256, timeout=0.5)
            idle = 0 if batch else idle + 1
            got += len(batch)
            body_bytes += sum(len(m.body) for m in batch)
        return time.perf_counter() - start, got, body_bytes


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    evaluation_rate()
    with running_broker({"filter_server_nums": 2}) as broker:
        assert broker.proc is not None
        admin = broker.admin_url
        httpx.post(f"{admin}/topics", json={"name": TOPIC, "queue_nums": 8}, timeout=10).raise_for_status()
        expected = asyncio.run(send(broker.endpoint, args.messages))
        for r in range(args.rounds):
            cases = [("SQL92 region = 'eu'", False), ("TAG * + program", True)]
            for label, programmed in cases if r % 2 == 0 else cases[::-1]:
                group = f"bench-{'prog' if programmed else 'sql'}-{r}"
                if programmed:
                    httpx.put(f"{admin}/groups/{group}/programs/{TOPIC}", json={"source": PROGRAM},
                              timeout=30).raise_for_status()  # fmt: skip
                expression = FilterExpression.tag() if programmed else FilterExpression.sql92("region = 'eu'")
                cpu = cpu_seconds(broker.proc.pid)
                elapsed, got, body_bytes = asyncio.run(drain(broker.endpoint, group, expression, expected))
                per = (cpu_seconds(broker.proc.pid) - cpu) / max(got, 1) * 1e6
                rate = f"{got / elapsed:,.0f} matched msg/s ({got:,} of {expected:,})"
                print(f"round {r + 1}, pull, {label}: {rate}, "
                      f"{body_bytes / max(got * len(BODY), 1):.2f} body bytes per matched byte  "
                      f"[broker CPU {per:.0f} us per matched message]", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
