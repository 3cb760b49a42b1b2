"""Authentication and authorization end to end, against two broker subprocesses in the same minutes:
one with both off, one with both on (a Normal user whose ACL allows the topics).

* siftmq's batched send (``send_many`` of ``--batch``, 4 requests in flight), in alternating rounds
  (off, on, on, off, ...), with the broker's CPU time per message;
* the official client's send (8 threads, signing every call), on each broker;
* a good client's send latency (one message at a time) alone, then while other threads send
  ``--bad`` calls with wrong signatures as fast as they can;
* with ``--workers N`` (default 2; 0 skips it), a broker of N gRPC front-ends: what a flood of bad
  signatures, and of well-signed calls, costs the core process and the front-ends per call (the
  front-ends refuse a bad signature themselves and report it to the core).

Run: ``.venv/bin/python benchmarks/bench_auth_e2e.py [--messages N] [--rounds R] [--bad N]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import grpc

from siftmq.auth.signature import DATE_HEADER, SCHEME, sign
from siftmq.client import Producer
from siftmq.protocol import rocketmq_v2_pb2 as pb
from siftmq.protocol.service import RPCS
from siftmq.testing import BrokerProcess

sys.path.insert(0, str(Path(__file__).parent))
from bench_client import BODY, cpu_seconds, run_threads, send_windowed

USER, SECRET = "bench", "B3nch-s3cret-pw"
AUTH = {
    "users": [{"username": USER, "password": SECRET, "userType": "Normal"}],
    "acls": [{"subject": f"User:{USER}", "policies": [{"entries": [
        {"resource": ["Topic:Bench*", "Topic:OfficialBench"], "actions": ["Pub", "Sub", "Create"]},
        {"resource": ["Group:bench-*"], "actions": ["Sub"]},
    ]}]}],
}  # fmt: skip


def credentials(on: bool) -> dict[str, str]:
    return {"access_key": USER, "secret_key": SECRET} if on else {}


async def batched(endpoint: str, on: bool, total: int, batch: int) -> float:
    async with Producer(endpoint, **credentials(on)) as producer:
        await producer.send_many([producer.message("BenchBatch", BODY, tag="t")])  # route, topic
        start = time.perf_counter()
        batches = (
            [producer.message("BenchBatch", BODY, tag="t") for _ in range(min(batch, total - first))]
            for first in range(0, total, batch)
        )
        await send_windowed(producer, batches, 4)
        return time.perf_counter() - start


async def latencies(endpoint: str, count: int, until: Callable[[], bool] | None = None) -> list[float]:
    """Send latencies (ms) of ``count`` sends, or of the sends made until ``until()`` is true."""
    out: list[float] = []
    async with Producer(endpoint, **credentials(True)) as producer:
        await producer.send("BenchLatency", BODY, tag="t")
        while len(out) < count if until is None else not until():
            t0 = time.perf_counter()
            await producer.send("BenchLatency", BODY, tag="t")
            out.append((time.perf_counter() - t0) * 1e3)
    return out


def flood(endpoint: str, total: int, threads: int, bad: bool = True) -> float:
    """``total`` QueryRoute calls signed with a wrong secret (or the right one, to compare);
    returns the seconds they took."""
    rpc = next(r for r in RPCS if r.name == "QueryRoute")
    counter = iter(range(total))
    refused = 0
    lock = threading.Lock()

    def worker() -> None:
        nonlocal refused
        with grpc.insecure_channel(endpoint) as channel:
            call = channel.unary_unary(rpc.path, request_serializer=pb.QueryRouteRequest.SerializeToString,
                                       response_deserializer=pb.QueryRouteResponse.FromString)  # fmt: skip
            request = pb.QueryRouteRequest(topic=pb.Resource(name="BenchBatch"))
            for i in counter:
                stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
                signature = sign(f"wrong{i}" if bad else SECRET, stamp)
                # (the flood signs as another credential: past 10 wrong ones a minute from here, the
                # broker refuses that credential unchecked, and the good calls' user would be refused)
                who = "intruder" if bad else USER
                header = f"{SCHEME} Credential={who}, SignedHeaders={DATE_HEADER}, Signature={signature}"
                answer = call(request, timeout=10, metadata=((DATE_HEADER, stamp), ("authorization", header)))
                if answer.status.code == (pb.Code.UNAUTHORIZED if bad else pb.Code.ILLEGAL_ACCESS_POINT):
                    with lock:
                        refused += 1

    elapsed = run_threads(lambda _: worker(), threads)
    assert refused == total, f"only {refused} of {total} calls were answered as expected"
    return elapsed


def front_end_flood(tmp: Path, secured: dict[str, object], workers: int, total: int) -> None:
    """CPU per call of the core and of the front-ends while calls arrive from 4 threads."""
    from bench_workers import children

    broker = BrokerProcess(tmp / "workers", config={**secured, "workers": workers}).start()
    try:
        assert broker.proc is not None
        core = broker.proc.pid
        fronts = children(core)
        for bad in (True, False, True, False):
            before = cpu_seconds(core), sum(cpu_seconds(p) for p in fronts)
            with multiprocessing.get_context("spawn").Pool(1) as pool:
                took = pool.apply(flood, (broker.endpoint, total, 4, bad))
            core_us = (cpu_seconds(core) - before[0]) * 1e6 / total
            front_us = (sum(cpu_seconds(p) for p in fronts) - before[1]) * 1e6 / total
            kind = "bad signatures" if bad else "well-signed route lookups"
            rate = f"{total:,} {kind} in {took:.2f} s ({total / took:,.0f}/s) from 4 threads"
            print(f"--workers {workers}: {rate}: core CPU {core_us:.1f} us per call, "
                  f"front-ends {front_us:.0f} us", flush=True)  # fmt: skip
    finally:
        broker.stop()


def summary(values: list[float]) -> str:
    q = statistics.quantiles(values, n=100)
    return f"p50 {q[49]:.2f} ms, p99 {q[98]:.2f} ms"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--messages", type=int, default=50_000)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--official", type=int, default=4_000)
    parser.add_argument("--bad", type=int, default=1_000)
    parser.add_argument(
        "--workers", type=int, default=2, help="front-ends of the flood's last part (0: skip)"
    )
    parser.add_argument("--flood-only", action="store_true", help="only the --workers flood")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="siftmq-bench-") as tmp:
        auth_file = Path(tmp) / "auth.json"
        auth_file.write_text(json.dumps(AUTH))
        auth_file.chmod(0o600)
        secured = {"authentication_enabled": True, "authorization_enabled": True, "auth_file": str(auth_file)}
        if args.flood_only:
            front_end_flood(Path(tmp), secured, args.workers or 2, args.bad)
            return
        brokers = {
            False: BrokerProcess(Path(tmp) / "off").start(),
            True: BrokerProcess(Path(tmp) / "on", config=secured).start(),
        }
        try:
            rates: dict[bool, list[float]] = {False: [], True: []}
            for r in range(args.rounds):
                for on in (False, True) if r % 2 == 0 else (True, False):
                    b = brokers[on]
                    assert b.proc is not None
                    cpu = cpu_seconds(b.proc.pid)
                    elapsed = asyncio.run(batched(b.endpoint, on, args.messages, args.batch))
                    per = (cpu_seconds(b.proc.pid) - cpu) / args.messages * 1e6
                    rates[on].append(args.messages / elapsed)
                    label = "on " if on else "off"
                    rate = f"{args.messages / elapsed:,.0f} msg/s  [broker CPU {per:.1f} us/msg]"
                    print(
                        f"round {r + 1}, auth {label}: send_many x{args.batch}, 4 in flight: {rate}",
                        flush=True,
                    )
            best_off, best_on = max(rates[False]), max(rates[True])
            print(f"batched send, best of {args.rounds}: off {best_off:,.0f} msg/s, on {best_on:,.0f} msg/s "
                  f"({(best_on / best_off - 1) * 100:+.1f}%)", flush=True)  # fmt: skip

            if args.official:
                from rocketmq import Credentials

                import bench_broker  # type: ignore[import-not-found]  # beside this file

                for on in (False, True):
                    b = brokers[on]
                    assert b.proc is not None
                    cpu = cpu_seconds(b.proc.pid)
                    creds = Credentials(USER, SECRET) if on else None
                    elapsed, lat = bench_broker.send_phase(
                        b.endpoint, "OfficialBench", args.official, 8, creds
                    )
                    per = (cpu_seconds(b.proc.pid) - cpu) / args.official * 1e6
                    print(f"official client send, 8 threads, auth {'on ' if on else 'off'}: "
                          f"{args.official / elapsed:,.0f} msg/s, {summary([x * 1e3 for x in lat])}  "
                          f"[broker CPU {per:.0f} us/msg]", flush=True)  # fmt: skip

            endpoint = brokers[True].endpoint
            pid = brokers[True].proc.pid  # type: ignore[union-attr]
            alone = asyncio.run(latencies(endpoint, 2000))
            print(f"good client, send one at a time, alone: {summary(alone)}", flush=True)
            # the calls come from another process, so that they do not share this one's GIL; good
            # ones (a route without endpoints: answered at once) show what any call costs
            for bad in (True, False):
                cpu = cpu_seconds(pid)
                with multiprocessing.get_context("spawn").Pool(1) as pool:
                    flooding = pool.apply_async(flood, (endpoint, args.bad, 4, bad))
                    during = asyncio.run(latencies(endpoint, 2000, until=flooding.ready))
                    took = flooding.get()
                per = (cpu_seconds(pid) - cpu) * 1e6 / args.bad
                kind = "bad signatures" if bad else "well-signed route lookups"
                print(f"good client, while {args.bad:,} {kind} arrived in {took:.2f} s from 4 threads "
                      f"of another process: {summary(during)} over {len(during)} sends  "
                      f"[broker CPU {per:.0f} us per call, good sends included]", flush=True)  # fmt: skip
        finally:
            for b in brokers.values():
                b.stop()
        if args.workers:
            front_end_flood(Path(tmp), secured, args.workers, args.bad)


if __name__ == "__main__":
    main()
