"""Broker benchmark with the official ``rocketmq-python-client``: send and filtered-receive throughput.

Starts ``siftmq broker`` as a subprocess (port 0, temporary data dir), then

* sends ``--messages`` 1 KiB messages from ``--threads`` producer threads (10% tagged ``Sel`` with
  property ``sel=1``) and reports messages/s, send latency p50/p99 and broker CPU seconds per
  million messages;
* drains the topic with a TAG consumer (``Sel``) and a SQL92 consumer (``sel = 1 AND size > 0``) —
  10% selectivity — and reports matched messages/s, receive-call latency p50/p99, broker CPU
  seconds per million messages scanned, and bytes delivered per matched message byte (1.0 means
  nothing that does not match is ever sent).

Run: ``.venv/bin/python benchmarks/bench_broker.py [--messages N] [--threads T] [--flush async|sync]``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import threading
import time
from pathlib import Path

from rocketmq import ClientConfiguration, Credentials, FilterExpression, Message, Producer, SimpleConsumer
from rocketmq.grpc_protocol import FilterType

from bench_client import run_threads  # beside this file
from siftmq.testing import running_broker

BODY = os.urandom(1024)
CLK_TCK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def percentile(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100)[int(q) - 1] if len(values) > 1 else values[0]


def send_phase(
    endpoint: str, topic: str, total: int, threads: int, credentials: Credentials | None = None
) -> tuple[float, list[float]]:
    latencies: list[float] = []
    lock = threading.Lock()
    counter = iter(range(total))

    def worker() -> None:
        config = ClientConfiguration(endpoint, credentials or Credentials(), request_timeout=10)
        producer = Producer(config, (topic,))
        producer.startup()
        mine = []
        try:
            for i in counter:
                msg = Message()
                msg.topic = topic
                msg.body = BODY
                selected = i % 10 == 0
                msg.tag = "Sel" if selected else "Other"
                msg.add_property("sel", "1" if selected else "0")
                msg.add_property("size", "1024")
                t0 = time.perf_counter()
                producer.send(msg)
                mine.append(time.perf_counter() - t0)
        finally:
            producer.shutdown()
            with lock:
                latencies.extend(mine)

    return run_threads(lambda _: worker(), threads), latencies


def receive_phase(
    endpoint: str, topic: str, group: str, expr: FilterExpression, expected: int
) -> tuple[float, list[float], int, int]:
    consumer = SimpleConsumer(
        ClientConfiguration(endpoint, Credentials(), request_timeout=10), group, {topic: expr}, 2
    )
    consumer.startup()
    latencies: list[float] = []
    got = 0
    body_bytes = 0
    try:
        start = time.perf_counter()
        while got < expected:
            t0 = time.perf_counter()
            msgs = consumer.receive(32, 60)
            latencies.append(time.perf_counter() - t0)
            if not msgs:
                break
            for m in msgs:
                got += 1
                body_bytes += len(m.body)
                consumer.ack(m)
        elapsed = time.perf_counter() - start
    finally:
        consumer.shutdown()
    return elapsed, latencies, got, body_bytes


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--messages", type=int, default=5000)
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--flush", choices=("async", "sync"), default="async")
    args = parser.parse_args()
    with running_broker(flush=args.flush) as broker:
        assert broker.proc is not None
        proc, endpoint = broker.proc, broker.endpoint
        topic = "BenchTopic"
        cpu0, client0 = cpu_seconds(proc.pid), cpu_seconds(os.getpid())
        elapsed, lat = send_phase(endpoint, topic, args.messages, args.threads)
        cpu_send = cpu_seconds(proc.pid) - cpu0
        client_send = cpu_seconds(os.getpid()) - client0
        print(
            f"send ({args.flush}, {args.threads} producer threads, 1 KiB): "
            f"{args.messages / elapsed:,.0f} msg/s, p50 {percentile(lat, 50) * 1000:.2f} ms, "
            f"p99 {percentile(lat, 99) * 1000:.2f} ms, broker CPU {cpu_send / args.messages * 1e6:,.0f} "
            f"s per million (client CPU {client_send / args.messages * 1e6:,.0f})"
        )
        expected = (args.messages + 9) // 10
        for name, expr in (
            ("TAG Sel", FilterExpression("Sel")),
            ("SQL92 sel = 1 AND size > 0", FilterExpression("sel = 1 AND size > 0", FilterType.SQL)),
        ):
            cpu0 = cpu_seconds(proc.pid)
            elapsed, lat, got, body_bytes = receive_phase(
                endpoint, topic, f"bench-{len(name)}", expr, expected
            )
            cpu = cpu_seconds(proc.pid) - cpu0
            print(
                f"receive {name} (10% selective): {got:,} of {expected:,} matched, "
                f"{got / elapsed:,.0f} matched msg/s, "
                f"receive call p50 {percentile(lat, 50) * 1000:.1f} ms, "
                f"p99 {percentile(lat, 99) * 1000:.1f} ms, broker CPU {cpu / args.messages * 1e6:,.0f} s "
                f"per million scanned, delivered bytes per matched byte "
                f"{body_bytes / (expected * len(BODY)):.2f}"
            )


if __name__ == "__main__":
    main()
