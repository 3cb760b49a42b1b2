"""siftmq.client throughput against a ``siftmq broker`` subprocess (1 KiB messages), and the official client.

* send: ``Producer.send_many`` in batches of ``--batch`` (one request, one append each) with one and
  with four requests in flight, and ``send`` one message at a time;
* filtered consume, 10% selective (tag ``Sel`` and property ``sel=1`` on every tenth message):
  ``PullConsumer.poll`` with TAG ``Sel`` and with SQL92 ``sel = 1``, and ``SimpleConsumer.receive`` +
  ``ack_many`` and ``receive(ack=last batch)`` (one AckAndReceive call per batch) with TAG ``Sel``.
  The consumers subscribe before the sends and the sends start once the broker trusts the SQL92
  subscription's bloom bits (``REGISTRATION_MARGIN_MS`` later);
* the official ``rocketmq-python-client`` against the same broker: send from 8 threads, and a TAG
  ``Sel`` SimpleConsumer acking each message (``--official 0`` skips it).

Every line gives the broker's and the client's CPU time per message, so a rate can be read as "who was
busy". Run: ``.venv/bin/python benchmarks/bench_client.py [--messages N] [--batch B] [--official N]``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import threading
import time
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path
from typing import Any

from siftmq.client import FilterExpression, OutgoingMessage, Producer, PullConsumer, SimpleConsumer
from siftmq.filter.registrations import REGISTRATION_MARGIN_MS
from siftmq.testing import running_broker

BODY = os.urandom(1024)
TOPIC = "ClientBench"
CLK_TCK = os.sysconf("SC_CLK_TCK")


def run_threads(target: Callable[[int], None], count: int) -> float:
    """``target(i)`` for i in ``range(count)``, each in its own thread, all at once; the seconds
    until the last finished."""
    workers = [threading.Thread(target=target, args=(i,)) for i in range(count)]
    start = time.perf_counter()
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    return time.perf_counter() - start


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


class Meter:
    """Wall time and the CPU time of the broker and of this process over one case."""

    def __init__(self, broker_pid: int) -> None:
        self.broker_pid = broker_pid

    async def run(self, label: str, count_of: Callable[[], Awaitable[tuple[int, str]]]) -> float:
        cpu_b, cpu_c = cpu_seconds(self.broker_pid), cpu_seconds(os.getpid())
        start = time.perf_counter()
        count, detail = await count_of()
        elapsed = time.perf_counter() - start
        per_b = (cpu_seconds(self.broker_pid) - cpu_b) / max(count, 1) * 1e6
        per_c = (cpu_seconds(os.getpid()) - cpu_c) / max(count, 1) * 1e6
        print(
            f"{label}: {count / elapsed:,.0f} msg/s{detail}  "
            f"[CPU per message: broker {per_b:.0f} us, client {per_c:.0f} us]",
            flush=True,
        )
        return count / elapsed


def batch_of(producer: Producer, first: int, count: int) -> list[OutgoingMessage]:
    return [
        producer.message(
            TOPIC,
            BODY,
            tag="Sel" if i % 10 == 0 else "Other",
            properties={"sel": "1" if i % 10 == 0 else "0"},
        )
        for i in range(first, first + count)
    ]


async def send_windowed(producer: Producer, batches: Iterable[list[OutgoingMessage]], window: int) -> None:
    """``send_many`` of each batch with up to ``window`` requests in flight; the first failure raises."""
    in_flight: set[asyncio.Future[object]] = set()
    for msgs in batches:
        in_flight.add(asyncio.ensure_future(producer.send_many(msgs)))
        if len(in_flight) >= window:
            done, in_flight = await asyncio.wait(in_flight, return_when=asyncio.FIRST_COMPLETED)
            for d in done:
                d.result()
    for d in asyncio.as_completed(in_flight):
        await d


async def send_cases(meter: Meter, endpoint: str, total: int, batch: int) -> int:
    """Runs the send cases; returns how many messages were stored (each 10% selected)."""
    sent = 0
    async with Producer(endpoint) as producer:
        for window in (1, 4):

            async def send_window(window: int = window) -> tuple[int, str]:
                batches = (
                    batch_of(producer, first, min(batch, total - first)) for first in range(0, total, batch)
                )
                await send_windowed(producer, batches, window)
                return total, ""

            await meter.run(f"send_many x{batch}, {window} request(s) in flight", send_window)
            sent += total
        single = min(total // 10, 2000)

        async def one_by_one() -> tuple[int, str]:
            for _ in range(0, single, 10):  # keeps the 10% selection: one Sel, nine Other
                for j in range(10):
                    await producer.send(TOPIC, BODY, tag="Sel" if j == 0 else "Other",
                                        properties={"sel": "1" if j == 0 else "0"})  # fmt: skip
            return single, ""

        await meter.run("send one at a time", one_by_one)
        sent += single
    return sent


def consumers(endpoint: str) -> dict[str, PullConsumer | SimpleConsumer]:
    """The consumers of the consume cases, started before the sends as in production: a SQL92
    subscription registered before its messages arrive gets its bloom bits computed at dispatch."""
    return {
        "PullConsumer.poll(512), TAG Sel": PullConsumer(
            endpoint, "bench-pull-tag", TOPIC, FilterExpression.tag("Sel")
        ),
        "PullConsumer.poll(512), SQL92 sel = 1": PullConsumer(
            endpoint, "bench-pull-sql", TOPIC, FilterExpression.sql92("sel = 1")
        ),
        "PullConsumer.poll(512) + commit() after each, TAG Sel": PullConsumer(
            endpoint, "bench-pull-commit", TOPIC, FilterExpression.tag("Sel")
        ),
        "PullConsumer.poll(512) + commit() after each by the standard calls, TAG Sel": _standard_commit(
            PullConsumer(endpoint, "bench-pull-commit-std", TOPIC, FilterExpression.tag("Sel"))
        ),
        "SimpleConsumer.receive(64) + ack_many, TAG Sel": SimpleConsumer(
            endpoint, "bench-simple", {TOPIC: FilterExpression.tag("Sel")}, await_duration=1
        ),
        "SimpleConsumer.receive(64, ack=last batch), TAG Sel": SimpleConsumer(
            endpoint, "bench-simple-along", {TOPIC: FilterExpression.tag("Sel")}, await_duration=1
        ),
    }


def _standard_commit(consumer: PullConsumer) -> PullConsumer:
    """The consumer committing as before the batched UpdateOffsets (QueryAssignment, then
    UpdateOffset per queue), for the A/B in the same run."""

    async def not_offered(*args: object) -> None:
        return None

    consumer.connection.update_offsets = not_offered  # type: ignore[method-assign]
    return consumer


async def consume_cases(meter: Meter, started: dict[str, PullConsumer | SimpleConsumer], stored: int) -> None:
    expected = stored // 10
    for label, consumer in started.items():

        async def drain(consumer: PullConsumer | SimpleConsumer = consumer) -> tuple[int, str]:
            got = 0
            msgs: list[Any] = []
            while got < expected:
                if isinstance(consumer, PullConsumer):
                    msgs = await consumer.poll(512, timeout=1.0)
                    if "commit" in consumer.group:
                        await consumer.commit()
                elif consumer.group.endswith("along"):  # acks in the call that receives the next
                    msgs = await consumer.receive(64, 60, ack=msgs)
                else:
                    msgs = await consumer.receive(64, 60)
                    if msgs:
                        await consumer.ack_many(msgs)
                if not msgs:
                    break
                got += len(msgs)
            if isinstance(consumer, SimpleConsumer) and consumer.group.endswith("along") and msgs:
                await consumer.ack_many(msgs)
            return got, f" matched ({got:,} of {expected:,}; {stored:,} entries)"

        try:
            await meter.run(label, drain)
        finally:
            await consumer.stop()


def official_cases(broker_pid: int, endpoint: str, total: int) -> None:
    """The official client on the same broker (bench_broker.py's phases, on their own topic)."""
    from rocketmq import FilterExpression as OfficialFilter

    import bench_broker  # type: ignore[import-not-found]  # beside this file

    cpu_b, cpu_c = cpu_seconds(broker_pid), cpu_seconds(os.getpid())
    elapsed, _ = bench_broker.send_phase(endpoint, "OfficialBench", total, 8)
    print(
        f"official client: send, 8 threads: {total / elapsed:,.0f} msg/s  [CPU per message: broker "
        f"{(cpu_seconds(broker_pid) - cpu_b) / total * 1e6:.0f} us, client "
        f"{(cpu_seconds(os.getpid()) - cpu_c) / total * 1e6:.0f} us]",
        flush=True,
    )
    expected = (total + 9) // 10
    cpu_b, cpu_c = cpu_seconds(broker_pid), cpu_seconds(os.getpid())
    elapsed, _, got, _ = bench_broker.receive_phase(
        endpoint, "OfficialBench", "bench-official", OfficialFilter("Sel"), expected
    )
    print(
        f"official client: SimpleConsumer receive(32) + ack each, TAG Sel: "
        f"{got / elapsed:,.0f} msg/s matched "
        f"({got:,} of {expected:,})  [CPU per message: broker "
        f"{(cpu_seconds(broker_pid) - cpu_b) / max(got, 1) * 1e6:.0f} us, client "
        f"{(cpu_seconds(os.getpid()) - cpu_c) / max(got, 1) * 1e6:.0f} us]",
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--messages",
        type=int,
        default=200_000,
        help="messages per send case; the reads drain them all (10%% match), so 200,000 gives them"
        " 40,200 messages to measure where 50,000 gave 10,200 (a fraction of a second, start-up included)",
    )
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument(
        "--official", type=int, default=3000, help="messages for the official client; 0 skips"
    )
    args = parser.parse_args()
    with running_broker() as broker:
        assert broker.proc is not None
        meter = Meter(broker.proc.pid)

        async def scenario() -> None:
            started = consumers(broker.endpoint)
            for consumer in started.values():
                await consumer.start()
            # The broker trusts a new SQL92 registration's bloom bits for messages stored more than
            # REGISTRATION_MARGIN_MS after it (a safety margin); wait that out, as a
            # long-lived subscription would have, or the first second of sends is evaluated exactly.
            await asyncio.sleep(REGISTRATION_MARGIN_MS / 1000 + 0.2)
            stored = await send_cases(meter, broker.endpoint, args.messages, args.batch)
            await consume_cases(meter, started, stored)

        asyncio.run(scenario())
        if args.official:
            official_cases(broker.proc.pid, broker.endpoint, args.official)


if __name__ == "__main__":
    main()
