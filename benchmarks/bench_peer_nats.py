"""The peer, side by side: siftmq against NATS JetStream on the same workload, in alternating rounds.

Needs Debian's ``nats-server`` on PATH and PyPI's ``nats-py`` (``pip install 'nats-py>=2,<3'``);
without them it says so and exits. Each server runs as its own process with its data in a
temporary directory; every row reports msg/s and the server's CPU per message.

* **publish with acks**: ``--messages`` × 1 KiB. siftmq: ``Producer.send_many`` of 256, four requests
  in flight. NATS: JetStream ``publish`` (each acknowledged by the server), 256 in flight.
* **10% filtered consume with acks**: the stream holds the messages of the publish row, every tenth
  selected (TAG ``Sel`` / subject ``bench.sel``). siftmq: ``SimpleConsumer.receive(64, ack=batch)``,
  each batch acknowledged (and confirmed) in the call that receives the next; NATS: a pull consumer
  filtered on ``bench.sel``, ``fetch(64)`` and an ``ack()`` per message (sent, not confirmed).
* **... prefetching**: the same, siftmq through ``SimpleConsumer.prefetching(64)`` (two calls in
  flight: the batch after next asked for, this one's acknowledgements riding along, before this one
  is handled; each acknowledgement confirmed, two calls later); NATS as in the row above, read again.
* **10% filtered pull with offset commits**: the same stream, read in the pull model. siftmq:
  ``PullConsumer.poll(512)`` and ``commit()`` after each poll (one confirmed UpdateOffsets call);
  NATS: a pull consumer with ``AckPolicy.ALL`` on ``bench.sel``, ``fetch(512)`` and the last message
  of each fetch acknowledged with ``ack_sync()`` (confirmed; it acknowledges everything before it).
* **single publish**: the official ``rocketmq-python-client`` (8 threads, one message per call)
  against nats-py awaiting each acknowledged publish (8 concurrent tasks).

A round runs both publishes, then each read row on both sides back to back (which side goes first
alternates), every read once both servers are idle (no publish's deferred work lands in a read's
figures): a row's two figures are taken seconds apart, so a slow spell of this host moves both.
Each round prints every row's ratio siftmq / NATS, and the run ends with their range and median.

Run: ``.venv/bin/python benchmarks/bench_peer_nats.py [--messages N] [--rounds R] [--single N]``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Final

from siftmq.client import FilterExpression, Producer, PullConsumer, ReceivedMessage, SimpleConsumer
from siftmq.testing import running_broker

sys.path.insert(0, str(Path(__file__).parent))
from bench_client import cpu_seconds, send_windowed

BODY = os.urandom(1024)
WINDOW = 256
PULL_BATCH = 512


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def settle(pid: int, window_s: float = 0.5, limit_s: float = 15.0) -> None:
    """Wait until the server is idle (at most one CPU tick in ``window_s``): a read row's figures
    must not carry the publish's deferred work (dispatch, page writeback), on either side."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        before = cpu_seconds(pid)
        time.sleep(window_s)
        if cpu_seconds(pid) - before <= 0.011:
            return


async def measure(pid: int, count_of: Callable[[], Awaitable[int]]) -> tuple[float, float]:
    """(msg/s, server CPU µs per message)."""
    cpu, start = cpu_seconds(pid), time.perf_counter()
    count = await count_of()
    elapsed = time.perf_counter() - start
    return count / elapsed, (cpu_seconds(pid) - cpu) / max(count, 1) * 1e6


# --------------------------------------------------------------------------------------- siftmq


async def siftmq_publish(endpoint: str, topic: str, total: int) -> int:
    async with Producer(endpoint) as producer:
        batches = (
            [producer.message(topic, BODY, tag="Sel" if i % 10 == 0 else "Other")
             for i in range(first, min(first + WINDOW, total))]
            for first in range(0, total, WINDOW)
        )  # fmt: skip
        await send_windowed(producer, batches, 4)
    return total


async def siftmq_consume(endpoint: str, topic: str, group: str, expected: int) -> int:
    """receive(64) with the last batch's acknowledgements riding along (one AckAndReceive call per
    batch, every ack confirmed; nats-py's ``ack()`` is not confirmed at all)."""
    got = 0
    batch: list[ReceivedMessage] = []
    async with SimpleConsumer(endpoint, group, {topic: FilterExpression.tag("Sel")}, await_duration=1) as c:
        while got < expected:
            batch = await c.receive(64, 60, ack=batch)
            if not batch:
                break
            got += len(batch)
        await c.ack_many(batch)
    return got


async def siftmq_consume_ahead(endpoint: str, topic: str, group: str, expected: int) -> int:
    """As :func:`siftmq_consume`, through ``prefetching``: the next batch's call (this batch's
    acknowledgements riding along, confirmed a call later) is made before the batch is handled."""
    got = 0
    batch: list[ReceivedMessage] = []
    async with SimpleConsumer(endpoint, group, {topic: FilterExpression.tag("Sel")}, await_duration=1) as c:
        async with c.prefetching(64, 60) as receiver:
            while got < expected:
                batch = await receiver.receive(ack=batch)
                if not batch:
                    break
                got += len(batch)
        await c.ack_many(batch)
    return got


async def siftmq_pull(endpoint: str, topic: str, group: str, expected: int) -> int:
    """poll(512), committing the offsets after each poll (one call, confirmed)."""
    got = 0
    async with PullConsumer(endpoint, group, topic, FilterExpression.tag("Sel")) as c:
        while got < expected:
            batch = await c.poll(PULL_BATCH, timeout=2.0)
            if not batch:
                break
            got += len(batch)
            await c.commit()
    return got


# ----------------------------------------------------------------------------------------- NATS


async def nats_publish(url: str, stream: str, total: int) -> int:
    import nats

    nc = await nats.connect(url)
    js = nc.jetstream()
    try:
        for first in range(0, total, WINDOW):
            await asyncio.gather(*(
                js.publish(f"{stream}.{'sel' if i % 10 == 0 else 'other'}", BODY)
                for i in range(first, min(first + WINDOW, total))
            ))  # fmt: skip
    finally:
        await nc.close()
    return total


async def nats_consume(url: str, stream: str, durable: str, expected: int) -> int:
    import nats
    from nats.errors import TimeoutError as NatsTimeout

    nc = await nats.connect(url)
    js = nc.jetstream()
    got = 0
    try:
        sub = await js.pull_subscribe(f"{stream}.sel", durable=durable, stream=stream)
        while got < expected:
            try:
                msgs = await sub.fetch(64, timeout=2)
            except NatsTimeout:
                break
            for m in msgs:
                await m.ack()
            got += len(msgs)
    finally:
        await nc.close()
    return got


async def nats_pull(url: str, stream: str, durable: str, expected: int) -> int:
    import nats
    from nats.errors import TimeoutError as NatsTimeout
    from nats.js.api import AckPolicy, ConsumerConfig

    nc = await nats.connect(url)
    js = nc.jetstream()
    got = 0
    try:
        sub = await js.pull_subscribe(
            f"{stream}.sel", durable=durable, stream=stream, config=ConsumerConfig(ack_policy=AckPolicy.ALL)
        )
        while got < expected:
            try:
                msgs = await sub.fetch(PULL_BATCH, timeout=2)
            except NatsTimeout:
                break
            await msgs[-1].ack_sync()  # with AckPolicy.ALL: this one and every one before it
            got += len(msgs)
    finally:
        await nc.close()
    return got


async def nats_single(url: str, stream: str, total: int, tasks: int = 8) -> int:
    import nats

    nc = await nats.connect(url)
    js = nc.jetstream()
    counter = iter(range(total))

    async def worker() -> None:
        for _ in counter:
            await js.publish(f"{stream}.other", BODY)

    try:
        await asyncio.gather(*(worker() for _ in range(tasks)))
    finally:
        await nc.close()
    return total


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--single", type=int, default=3000, help="single publishes per side (0: skip)")
    args = parser.parse_args()
    server = shutil.which("nats-server")
    try:
        import nats  # noqa: F401
    except ImportError:
        server = None
    if server is None:
        print("needs nats-server on PATH (apt install nats-server) and nats-py (pip install 'nats-py>=2,<3')")
        return
    with tempfile.TemporaryDirectory(prefix="siftmq-peer-") as tmp:
        port = free_port()
        nats_proc = subprocess.Popen([server, "-js", "-a", "127.0.0.1", "-p", str(port), "-sd", tmp],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
        url = f"nats://127.0.0.1:{port}"
        time.sleep(0.5)
        try:
            with running_broker() as broker:
                assert broker.proc is not None
                ratios: dict[str, list[float]] = {}
                for r in range(args.rounds):
                    got = run_round(r, endpoint=broker.endpoint, broker_pid=broker.proc.pid, url=url,
                                    nats_pid=nats_proc.pid, messages=args.messages)  # fmt: skip
                    for label, ratio in got.items():
                        ratios.setdefault(label, []).append(ratio)
                for label, per_round in ratios.items():
                    print(
                        f"{label}: siftmq / NATS {min(per_round):.2f}-{max(per_round):.2f}x over "
                        f"{len(per_round)} rounds, median {statistics.median(per_round):.2f}x",
                        flush=True,
                    )
                if args.single:
                    single_rows(broker.endpoint, broker.proc.pid, url, nats_proc.pid, args.single)
        finally:
            nats_proc.terminate()
            nats_proc.wait(10)


READS: Final = (  # (row, siftmq's reader, NATS's reader, the consumer's name)
    ("10% filtered consume with acks", siftmq_consume, nats_consume, "peer"),
    ("10% filtered consume with acks, prefetching", siftmq_consume_ahead, nats_consume, "peerahead"),
    ("10% filtered pull with offset commits", siftmq_pull, nats_pull, "peerpull"),
)


def run_round(
    r: int, *, endpoint: str, broker_pid: int, url: str, nats_pid: int, messages: int
) -> dict[str, float]:
    """One round: both publishes, then each read row on both sides back to back (each side first
    as often as the other), every read once both servers are idle. Prints the figures; returns
    each row's ratio siftmq / NATS in msg/s."""
    stream, topic = f"bench{r}", f"PeerBench{r}"

    async def setup() -> None:
        import nats

        nc = await nats.connect(url)
        await nc.jetstream().add_stream(name=stream, subjects=[f"{stream}.>"])
        await nc.close()

    asyncio.run(setup())
    expected = (messages + 9) // 10
    sides = [("siftmq", broker_pid), ("nats", nats_pid)]
    order = sides if r % 2 == 0 else sides[::-1]
    results: dict[str, dict[str, tuple[float, float]]] = {}
    for side, pid in order:
        settle(pid)
        publish = (siftmq_publish(endpoint, topic, messages) if side == "siftmq"
                   else nats_publish(url, stream, messages))  # fmt: skip
        results.setdefault("publish with acks", {})[side] = asyncio.run(measure(pid, lambda p=publish: p))
    for n, (label, ours, theirs, name) in enumerate(READS):
        for side, pid in order[::-1] if n % 2 == 0 else order:
            settle(broker_pid)
            settle(nats_pid)  # neither server's deferred work may land in the other's figures
            read = (ours(endpoint, topic, f"{name}-{r}", expected) if side == "siftmq"
                    else theirs(url, stream, f"{name}{r}", expected))  # fmt: skip
            results.setdefault(label, {})[side] = asyncio.run(measure(pid, lambda c=read: c))
    ratios: dict[str, float] = {}
    for label, by_side in results.items():
        for side in ("siftmq", "nats"):
            rate, cpu = by_side[side]
            print(
                f"round {r + 1}, {label}, {side}: {rate:,.0f} msg/s  [server CPU {cpu:.1f} us/msg]",
                flush=True,
            )
        ratios[label] = by_side["siftmq"][0] / by_side["nats"][0]
        print(f"round {r + 1}, {label}: siftmq / NATS {ratios[label]:.2f}x", flush=True)
    return ratios


def single_rows(endpoint: str, broker_pid: int, url: str, nats_pid: int, total: int) -> None:
    import bench_broker  # type: ignore[import-not-found]  # beside this file

    cpu = cpu_seconds(broker_pid)
    elapsed, _ = bench_broker.send_phase(endpoint, "PeerSingle", total, 8)
    official = (total / elapsed, (cpu_seconds(broker_pid) - cpu) / total * 1e6)

    async def setup() -> None:
        import nats

        nc = await nats.connect(url)
        await nc.jetstream().add_stream(name="single", subjects=["single.>"])
        await nc.close()

    asyncio.run(setup())
    peer = asyncio.run(measure(nats_pid, lambda: nats_single(url, "single", total)))
    print(f"single publish, official rocketmq client (8 threads): {official[0]:,.0f} msg/s  "
          f"[server CPU {official[1]:.0f} us/msg]", flush=True)  # fmt: skip
    print(
        f"single publish, nats-py (8 tasks): {peer[0]:,.0f} msg/s  [server CPU {peer[1]:.0f} us/msg]",
        flush=True,
    )
    print(f"official / nats-py: {official[0] / peer[0]:.2f}x", flush=True)


if __name__ == "__main__":
    main()
