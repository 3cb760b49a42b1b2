"""``--workers N``: the official client's aggregate throughput through N front-end processes.

8 client processes (rocketmq-python-client 5.1.2, one message per call, 1 KiB) send at once to a
broker (async flush) started with ``--workers 1`` (gRPC in the core process) and ``--workers 2``,
in alternating rounds (``--load consume``: 8 SimpleConsumer processes of one group receive the
messages one per call and acknowledge each). Reported per round: msg/s, the scaling N=2 / N=1,
and the CPU per message of the core process and of the front-ends together. With ``--core`` it
first measures the core process alone, sent calls straight on its socket with 1, 16 and 64 in
flight (sends, then one-message receives, then acks; ``--core-only``: that alone): the lowest CPU
per message there (the core busy, so concurrent calls share their work) sets the ceiling one
core process can carry. The projection for 8 and 16 cores is the lower of that ceiling and what
the other cores' front-ends can pass at their CPU per message measured here, the clients running
elsewhere.

Run: ``.venv/bin/python benchmarks/bench_workers.py [--messages N] [--rounds R] [--clients C]
[--load client|stub|consume] [--core | --core-only]``.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from siftmq.testing import BrokerProcess

CLK_TCK = os.sysconf("SC_CLK_TCK")
TOPIC = "WorkersBench"
GROUP = "workers-bench"


def cpu_seconds(pid: int) -> float:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                found.append(int(entry.name))
    return found


def client(endpoint: str, count: int) -> None:
    """One client process: start, say ready, wait for go, send ``count`` messages one per call."""
    from rocketmq import ClientConfiguration, Credentials, Message, Producer

    producer = Producer(ClientConfiguration(endpoint, Credentials(), request_timeout=10), (TOPIC,))
    producer.startup()
    body = os.urandom(1024)
    print("ready", flush=True)
    sys.stdin.readline()
    for i in range(count):
        msg = Message()
        msg.topic = TOPIC
        msg.body = body
        msg.tag = "A" if i % 2 else "B"
        producer.send(msg)
    print("done", flush=True)
    producer.shutdown()


def consumer(endpoint: str, count: int) -> None:
    """One consumer process (the official client's SimpleConsumer, one group): receive one message
    per call and acknowledge it, until ``count`` were acknowledged."""
    from rocketmq import ClientConfiguration, Credentials, FilterExpression, SimpleConsumer

    simple = SimpleConsumer(
        ClientConfiguration(endpoint, Credentials(), request_timeout=10),
        GROUP,
        {TOPIC: FilterExpression("*")},
        2,
    )
    simple.startup()
    print("ready", flush=True)
    sys.stdin.readline()
    acked = 0
    while acked < count:
        for message in simple.receive(1, 60):
            simple.ack(message)
            acked += 1
    print("done", flush=True)
    simple.shutdown()


def preload(endpoint: str, total: int) -> None:
    """``total`` messages of 1 KiB for the consumers, in batches (siftmq's own client)."""
    import asyncio

    from siftmq.client import Producer

    async def run() -> None:
        async with Producer(endpoint) as producer:
            body = os.urandom(1024)
            for at in range(0, total, 256):
                await producer.send_many(
                    [producer.message(TOPIC, body, tag="A") for _ in range(min(256, total - at))]
                )

    asyncio.run(run())


def stub_client(endpoint: str, count: int) -> None:
    """A lighter client process: 4 threads of sync gRPC stubs in the official client's shape (its
    metadata, one message per call), so more of the CPU is left to the broker (bench_floor.py)."""
    sys.path.insert(0, str(Path(__file__).parent))
    from bench_floor import calls

    print("ready", flush=True)
    sys.stdin.readline()
    calls(endpoint, "send", count, threads=4)
    print("done", flush=True)


def core_capacity(
    total: int, windows: tuple[int, ...] = (1, 16, 64), kinds: tuple[str, ...] = ("send",)
) -> float:
    """The core process alone: single-message calls of 8 clients sent to its socket as a front-end
    sends them, ``window`` in flight, so no gRPC front-end limits the rate. ``kinds``: SendMessage always
    (the messages the others read), then ReceiveMessage (one message per call, as the floor
    bench receives) and AckMessage (one entry per call, the handles the receives got). The
    front-ends' token and socket are read from a front-end's /proc entry (same user): this is a
    measurement only. Returns the lowest core CPU per call of each kind."""
    import asyncio

    sys.path.insert(0, str(Path(__file__).parent))
    from bench_floor import ack_request, metadata, receive_request, send_request
    from siftmq.frontend import frames
    from siftmq.frontend.edge import ALL_RPCS, TOKEN_ENV
    from siftmq.protocol import rocketmq_v2_pb2 as pb

    group = "core-capacity"
    with tempfile.TemporaryDirectory(prefix="siftmq-bench-") as tmp:
        broker = BrokerProcess(Path(tmp) / "data", workers=2).start()
        try:
            assert broker.proc is not None
            core = broker.proc.pid
            front = children(core)[0]
            environ = Path(f"/proc/{front}/environ").read_bytes().split(b"\0")
            token = dict(kv.split(b"=", 1) for kv in environ if b"=" in kv)[TOKEN_ENV.encode()]
            argv = Path(f"/proc/{front}/cmdline").read_bytes().split(b"\0")
            socket_path = argv[argv.index(b"--socket") + 1].decode()
            methods = [r.name for r in ALL_RPCS]
            body = os.urandom(1024)
            handles: list[tuple[str, str]] = []  # what receives got, for the acks

            def request_of(kind: str) -> bytes:
                if kind == "send":
                    return send_request(TOPIC, body).SerializeToString()
                if kind == "receive":
                    return receive_request(group, TOPIC, 300).SerializeToString()
                return ack_request(group, TOPIC, *handles.pop()).SerializeToString()

            async def run(window: int, kind: str, calls: int) -> float:
                loop = asyncio.get_running_loop()
                finished = loop.create_future()
                counts = {"sent": 0, "answered": 0, "ok": 0}
                # 8 clients, as 8 client processes would be: each call carries one's id in turn
                headers = [list(metadata(f"core-capacity-{n}")) for n in range(8)]
                method = methods.index(
                    {"send": "SendMessage", "receive": "ReceiveMessage"}.get(kind, "AckMessage")
                )

                def fire() -> None:
                    if counts["sent"] >= calls:
                        return
                    counts["sent"] += 1
                    call = frames.encode_call(
                        method,
                        int((time.monotonic() + 10) * 1000),
                        "ipv4:127.0.0.1:1",
                        headers[counts["sent"] % len(headers)],
                        request_of(kind),
                    )
                    link.send(frames.CALL, counts["sent"], call)

                def on_frame(frame: int, call_id: int, payload: bytes) -> None:
                    if frame == frames.REPLY and kind == "receive":
                        answer = pb.ReceiveMessageResponse.FromString(payload)
                        if answer.WhichOneof("content") == "message":
                            props = answer.message.system_properties
                            handles.append((props.message_id, props.receipt_handle))
                            counts["ok"] += 1
                        return
                    if frame == frames.REPLY:
                        if kind == "send":
                            ok = pb.SendMessageResponse.FromString(payload).status.code == pb.Code.OK
                        else:
                            ok = pb.AckMessageResponse.FromString(payload).status.code == pb.Code.OK
                        counts["ok"] += ok
                    elif frame != frames.END:
                        return  # a CREDIT or TAKEN-like frame: not an answer's end
                    counts["answered"] += 1
                    if counts["answered"] == calls:
                        finished.set_result(None)
                    else:
                        fire()

                _, link = await loop.create_unix_connection(
                    lambda: frames.FrameProtocol(on_frame, lambda exc: None, 1 << 26), socket_path
                )
                link.send(frames.HELLO, 0, token)
                cpu = cpu_seconds(core)
                start = time.perf_counter()
                for _ in range(window):
                    fire()
                await finished
                elapsed = time.perf_counter() - start
                if link.transport is not None:
                    link.transport.close()
                cost = (cpu_seconds(core) - cpu) / calls * 1e6
                print(
                    f"core alone, {kind:<7} {window:>2} calls in flight: {calls / elapsed:,.0f} calls/s, "
                    f"core CPU {cost:.0f} us/call ({counts['ok']:,} OK)",
                    flush=True,
                )
                return cost

            costs: dict[str, list[float]] = {}
            per_window = {w: total // len(windows) for w in windows}
            for window in windows:
                costs.setdefault("send", []).append(asyncio.run(run(window, "send", total)))
            for kind in kinds[1:] if kinds[0] == "send" else kinds:
                for window in windows:
                    calls = per_window[window] if kind == "receive" else min(per_window[window], len(handles))
                    costs.setdefault(kind, []).append(asyncio.run(run(window, kind, calls)))
        finally:
            broker.stop()
    return {kind: min(found) for kind, found in costs.items()}


def round_of(workers: int, clients: int, per_client: int, load: str) -> tuple[float, float, float]:
    """msg/s, core CPU us/msg, front-ends CPU us/msg."""
    with tempfile.TemporaryDirectory(prefix="siftmq-bench-") as tmp:
        broker = BrokerProcess(Path(tmp) / "data", workers=workers).start()
        try:
            assert broker.proc is not None
            core = broker.proc.pid
            if load == "consume":
                preload(broker.endpoint, clients * per_client)
            procs = [
                subprocess.Popen(
                    [sys.executable, __file__, f"--{load}", broker.endpoint, str(per_client)],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    text=True,
                )
                for _ in range(clients)
            ]
            for p in procs:
                assert p.stdout is not None and p.stdout.readline().strip() == "ready"
            front = [pid for pid in children(core)]
            cpu_core = cpu_seconds(core)
            cpu_front = sum(cpu_seconds(pid) for pid in front)
            start = time.perf_counter()
            for p in procs:
                assert p.stdin is not None
                p.stdin.write("go\n")
                p.stdin.flush()
            for p in procs:
                assert p.stdout is not None and p.stdout.readline().strip() == "done"
            elapsed = time.perf_counter() - start
            total = clients * per_client
            core_us = (cpu_seconds(core) - cpu_core) / total * 1e6
            front_us = (sum(cpu_seconds(pid) for pid in front) - cpu_front) / total * 1e6
            for p in procs:
                p.wait(30)
            return total / elapsed, core_us, front_us
        finally:
            broker.stop()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--messages", type=int, default=16_000, help="messages per round, all clients")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument(
        "--load",
        choices=("client", "stub", "consume"),
        default="client",
        help="official client's sends, gRPC stubs' sends, or its receives (one message each) and acks",
    )
    parser.add_argument(
        "--core", action="store_true", help="also measure the core process alone (send, receive, ack)"
    )
    parser.add_argument("--core-only", action="store_true", help="measure the core process alone, no rounds")
    parser.add_argument("--client", nargs=2, metavar=("ENDPOINT", "COUNT"), help=argparse.SUPPRESS)
    parser.add_argument("--stub", nargs=2, metavar=("ENDPOINT", "COUNT"), help=argparse.SUPPRESS)
    parser.add_argument("--consume", nargs=2, metavar=("ENDPOINT", "COUNT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.consume:
        consumer(args.consume[0], int(args.consume[1]))
        return
    if args.client:
        client(args.client[0], int(args.client[1]))
        return
    if args.stub:
        stub_client(args.stub[0], int(args.stub[1]))
        return
    measure_core = args.core or args.core_only
    busy = core_capacity(args.messages, kinds=("send", "receive", "ack")) if measure_core else {}
    # the busy core's CPU per message of the rounds' load: a send; or a receive of one and its ack
    consume = args.load == "consume" and busy
    saturated_core_us = busy["receive"] + busy["ack"] if consume else busy.get("send", 0.0)
    if args.core_only:
        return
    per_client = args.messages // args.clients
    who, what = {
        "client": ("official-client processes", "sends"),
        "stub": ("processes of 4 gRPC stub threads", "sends"),
        "consume": ("official-client consumer processes", "one-message receives and acks"),
    }[args.load]
    print(
        f"{args.clients} {who} x {per_client:,} {what} of 1 KiB, async flush; cores: "
        f"{len(os.sched_getaffinity(0))}",
        flush=True,
    )
    for r in range(args.rounds):
        rates = {}
        for workers in (1, 2) if r % 2 == 0 else (2, 1):
            rate, core_us, front_us = round_of(workers, args.clients, per_client, args.load)
            rates[workers] = rate
            core_cost = saturated_core_us or core_us  # the busy core's, when measured
            ceiling = 1e6 / core_cost if core_cost else float("inf")
            projected = {
                cores: min(ceiling, (cores - 1) / front_us * 1e6) if front_us else ceiling
                for cores in (8, 16)
            }
            print(
                f"round {r + 1}, --workers {workers}: {rate:,.0f} msg/s; CPU per message: "
                f"core {core_us:.0f} us, front-ends {front_us:.0f} us"
                + (
                    f"; core ceiling {ceiling:,.0f} msg/s, projected 8 cores {projected[8]:,.0f}, "
                    f"16 cores {projected[16]:,.0f}"
                    if workers > 1
                    else ""
                ),
                flush=True,
            )
        print(f"round {r + 1}: scaling N=2 / N=1 = {rates[2] / rates[1]:.2f} (target >= 1.4)", flush=True)


if __name__ == "__main__":
    main()
