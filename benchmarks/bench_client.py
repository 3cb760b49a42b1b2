"""siftmq.client throughput against a ``siftmq broker`` subprocess (1 KiB messages).

* send: ``Producer.send_many`` in batches of ``--batch`` (one request, one append each), with one and
  with four requests in flight, and one message at a time;
* filtered consume: a ``PullConsumer`` with TAG ``Sel`` (10% of the messages) draining the topic.

Run: ``.venv/bin/python benchmarks/bench_client.py [--messages N] [--batch B]``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time

from siftmq.client import FilterExpression, Producer, PullConsumer
from siftmq.testing import running_broker

BODY = os.urandom(1024)


async def bench(endpoint: str, total: int, batch: int) -> None:
    async with Producer(endpoint) as producer:
        for window in (1, 4):
            start = time.perf_counter()
            in_flight: set[asyncio.Task[object]] = set()
            for first in range(0, total, batch):
                msgs = [
                    producer.message("ClientBench", BODY, tag="Sel" if i % 10 == 0 else "Other")
                    for i in range(first, min(first + batch, total))
                ]
                in_flight.add(asyncio.ensure_future(producer.send_many(msgs)))
                if len(in_flight) >= window:
                    done, in_flight = await asyncio.wait(in_flight, return_when=asyncio.FIRST_COMPLETED)
                    for d in done:
                        d.result()
            for d in asyncio.as_completed(in_flight):
                await d
            elapsed = time.perf_counter() - start
            print(f"send_many x{batch}, {window} request(s) in flight: {total / elapsed:,.0f} msg/s")
        n = min(total // 10, 2000)
        start = time.perf_counter()
        for _ in range(n):
            await producer.send("ClientBench", BODY, tag="Other")
        print(f"send one at a time: {n / (time.perf_counter() - start):,.0f} msg/s")
    rounds = 2  # the two send_many runs above; the single sends are all "Other"
    expected = rounds * ((total + 9) // 10)
    scanned = rounds * total + min(total // 10, 2000)
    consumer = PullConsumer(endpoint, "bench-pull", "ClientBench", FilterExpression.tag("Sel"))
    await consumer.start()
    try:
        got = 0
        start = time.perf_counter()
        while got < expected:
            batch_got = await consumer.poll(512)
            if not batch_got:
                break
            got += len(batch_got)
        elapsed = time.perf_counter() - start
        print(
            f"pull TAG Sel (10% selective): {got:,} of {expected:,} matched, "
            f"{got / elapsed:,.0f} matched msg/s, {scanned / elapsed:,.0f} entries scanned/s"
        )
    finally:
        await consumer.stop()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--messages", type=int, default=50_000)
    parser.add_argument("--batch", type=int, default=256)
    args = parser.parse_args()
    with running_broker() as broker:
        asyncio.run(bench(broker.endpoint, args.messages, args.batch))


if __name__ == "__main__":
    main()
