"""siftmq.client throughput against a ``siftmq broker`` subprocess (1 KiB messages).

* send: ``Producer.send_many`` in batches of ``--batch`` (one request, one append each), and one at a time;
* filtered consume: a ``PullConsumer`` with TAG ``Sel`` (10% of the messages) draining the topic.

Run: ``.venv/bin/python benchmarks/bench_client.py [--messages N] [--batch B]``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from siftmq.client import FilterExpression, Producer, PullConsumer

BODY = os.urandom(1024)


def start_broker(data_dir: Path) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "siftmq",
            "broker",
            "--data-dir",
            str(data_dir),
            "--listen",
            "127.0.0.1:0",
            "--admin-listen",
            "127.0.0.1:0",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert proc.stdout is not None
    for line in proc.stdout:
        if "ready on" in line:
            return proc, line.split("ready on ", 1)[1].split()[0]
    raise RuntimeError("broker did not start")


async def bench(endpoint: str, total: int, batch: int) -> None:
    async with Producer(endpoint) as producer:
        start = time.perf_counter()
        for first in range(0, total, batch):
            msgs = [
                producer.message("ClientBench", BODY, tag="Sel" if i % 10 == 0 else "Other")
                for i in range(first, min(first + batch, total))
            ]
            await producer.send_many(msgs)
        elapsed = time.perf_counter() - start
        print(f"send_many x{batch}: {total / elapsed:,.0f} msg/s")
        n = min(total // 10, 2000)
        start = time.perf_counter()
        for _ in range(n):
            await producer.send("ClientBench", BODY, tag="Other")
        print(f"send one at a time: {n / (time.perf_counter() - start):,.0f} msg/s")
    expected = (total + 9) // 10
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
            f"{got / elapsed:,.0f} matched msg/s, {total / elapsed:,.0f} entries scanned/s"
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
    with tempfile.TemporaryDirectory(prefix="siftmq-bench-") as tmp:
        proc, endpoint = start_broker(Path(tmp) / "data")
        try:
            asyncio.run(bench(endpoint, args.messages, args.batch))
        finally:
            proc.terminate()
            proc.wait(30)


if __name__ == "__main__":
    main()
