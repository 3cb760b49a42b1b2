"""``siftmq broker --workers N``: gRPC front-end processes in front of the core process.

The official client is the judge: it is served through the front-ends as by a single process; a
front-end killed with -9 is started again and its clients carry on; the core killed with -9 takes
the front-ends with it and loses nothing acknowledged; one port, one broker.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import grpc
import pytest

pytest.importorskip("rocketmq")
from rocketmq import ClientConfiguration, Credentials, FilterExpression, Message, Producer, SimpleConsumer

from client_helpers import rpc_stub
from siftmq.protocol import rocketmq_v2_pb2 as pb
from siftmq.testing import BrokerProcess

pytestmark = [pytest.mark.integration, pytest.mark.slow]
TOPIC = "FrontTopic"


def front_end_pids(core_pid: int) -> list[int]:
    """The core's live front-end children, from /proc."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        state, ppid = fields[0], int(fields[1])
        if ppid == core_pid and state != "Z" and b"siftmq.frontend" in cmdline:
            pids.append(int(entry.name))
    return sorted(pids)


def wait_for(predicate: Any, timeout: float = 30.0, what: str = "") -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what or predicate}")


def _message(i: int, worker: int) -> Message:
    msg = Message()
    msg.topic = TOPIC
    msg.body = f"w{worker}-m{i}".encode() * 8
    msg.tag = "Even" if i % 2 == 0 else "Odd"
    msg.add_property("n", str(i))
    return msg


def _send_until(
    endpoint: str, worker: int, acked: list[str], stop: threading.Event, errors: list[str]
) -> None:
    """Send until told to stop; a failed send (its front-end was killed) is not an ack: go on."""
    producer = Producer(ClientConfiguration(endpoint, Credentials(), request_timeout=3), (TOPIC,))
    producer.startup()
    try:
        i = 0
        while not stop.is_set():
            try:
                acked.append(producer.send(_message(i, worker)).message_id)
            except Exception as exc:
                errors.append(type(exc).__name__)
                time.sleep(0.05)
            i += 1
    finally:
        producer.shutdown()


def _receive_all(endpoint: str, want: set[str], group: str, expression: str = "*") -> set[str]:
    consumer = SimpleConsumer(
        ClientConfiguration(endpoint, Credentials(), request_timeout=5),
        group,
        {TOPIC: FilterExpression(expression)},
        20,
    )
    consumer.startup()
    got: set[str] = set()
    try:
        deadline = time.monotonic() + 90
        while not want <= got and time.monotonic() < deadline:
            for m in consumer.receive(32, 20):
                got.add(m.message_id)
                consumer.ack(m)
    finally:
        consumer.shutdown()
    return got


@pytest.fixture
def broker_of(tmp_path: Path) -> Any:
    started: list[BrokerProcess] = []

    def start(name: str = "data", **kwargs: Any) -> BrokerProcess:
        broker = BrokerProcess(tmp_path / name, **kwargs).start()
        started.append(broker)
        return broker

    yield start
    for broker in started:
        if broker.proc is not None and broker.proc.poll() is None:
            broker.kill()


def test_the_official_client_through_two_front_ends(broker_of: Any) -> None:
    broker = broker_of(workers=2)
    assert "2 front-end processes" in broker.output[0]
    assert broker.proc is not None
    wait_for(lambda: len(front_end_pids(broker.proc.pid)) == 2, what="2 front-ends")
    acked: list[str] = []
    producers = [Producer(ClientConfiguration(broker.endpoint, Credentials()), (TOPIC,)) for _ in range(3)]
    for p in producers:
        p.startup()
    try:
        for i in range(60):
            acked.append(producers[i % 3].send(_message(i, i % 3)).message_id)
    finally:
        for p in producers:
            p.shutdown()
    # the TAG filter is the core's: through the front-ends a group gets exactly its share
    even = {mid for i, mid in enumerate(acked) if i % 2 == 0}
    assert _receive_all(broker.endpoint, even, "g-even", "Even") == even
    assert _receive_all(broker.endpoint, set(acked), "g-all") == set(acked)


def _connections_served(pid: int, port: int) -> int:
    """TCP connections to ``port`` that process ``pid`` holds, established (from /proc)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(OSError):
            target = os.readlink(fd)
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    served = 0
    for table in ("tcp", "tcp6"):
        for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            local_port, state, inode = int(fields[1].rsplit(":", 1)[1], 16), fields[3], fields[9]
            served += local_port == port and state == "01" and inode in inodes
    return served


def test_the_kernel_spreads_connections_over_both_front_ends(broker_of: Any) -> None:
    import grpc

    from siftmq.protocol import rocketmq_v2_pb2 as pb
    from siftmq.protocol.service import RPCS

    broker = broker_of(workers=2)
    assert broker.proc is not None
    pids = wait_for(
        lambda: front_end_pids(broker.proc.pid) if len(front_end_pids(broker.proc.pid)) == 2 else None
    )
    path = next(r for r in RPCS if r.name == "Heartbeat").path
    # 16 connections held open: all on one front-end by chance once in 2**15 runs
    own = [("grpc.use_local_subchannel_pool", 1)]  # a connection each (channels share them otherwise)
    channels = [grpc.insecure_channel(broker.endpoint, options=own) for _ in range(16)]
    try:
        for n, channel in enumerate(channels):
            heartbeat = channel.unary_unary(
                path, pb.HeartbeatRequest.SerializeToString, pb.HeartbeatResponse.FromString
            )
            answer = heartbeat(
                pb.HeartbeatRequest(client_type=pb.ClientType.PRODUCER),
                metadata=(("x-mq-client-id", f"spread-{n}"),),
                timeout=10,
            )
            assert answer.status.code == pb.Code.OK
        served = {pid: _connections_served(pid, broker.port) for pid in pids}
        assert sum(served.values()) == 16 and all(served.values()), served
    finally:
        for channel in channels:
            channel.close()


def test_sigterm_stops_the_core_and_every_front_end(broker_of: Any) -> None:
    broker = broker_of(workers=2)
    assert broker.proc is not None
    pids = wait_for(
        lambda: front_end_pids(broker.proc.pid) if len(front_end_pids(broker.proc.pid)) == 2 else None
    )
    assert broker.stop() == 0
    for pid in pids:
        wait_for(
            lambda pid=pid: not Path(f"/proc/{pid}").exists() or _zombie(pid), 10, f"front-end {pid} to end"
        )
    assert broker.output[-1] == "siftmq broker stopped"


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def _in_a_process_group_of_its_own(tmp_path: Path) -> subprocess.Popen[str]:
    """A ``--workers 2`` broker, its front-ends in its process group, as systemd runs a service."""
    cmd = [
        sys.executable, "-m", "siftmq", "broker", "--data-dir", str(tmp_path / "data"),
        "--listen", "127.0.0.1:0", "--admin-listen", "", "--workers", "2",
    ]  # fmt: skip
    return subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )


def test_sigterm_to_the_whole_process_group_stops_everything_once(tmp_path: Path) -> None:
    """As systemd stops a service: every process gets SIGTERM at once. The core must not start the
    front-ends again that stop before it has stopped them."""
    proc = _in_a_process_group_of_its_own(tmp_path)
    try:
        assert proc.stdout is not None
        lines = []
        for line in proc.stdout:
            lines.append(line)
            if "ready on" in line:
                break
        pids = wait_for(lambda: front_end_pids(proc.pid) if len(front_end_pids(proc.pid)) == 2 else None)
        time.sleep(0.5)
        os.killpg(proc.pid, signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    text = "".join(lines) + out
    assert proc.returncode == 0, text
    assert "starting it again" not in text
    assert text.rstrip().endswith("siftmq broker stopped")
    for pid in pids:
        assert not Path(f"/proc/{pid}").exists() or _zombie(pid)


def test_sigterm_to_the_process_group_while_the_front_ends_start_is_a_clean_stop(tmp_path: Path) -> None:
    """The front-ends take SIGTERM as a stop only once they listen: those still starting die of it,
    which the core took for a failure to listen (exit 1, "exited (-15) before listening")."""
    proc = _in_a_process_group_of_its_own(tmp_path)
    try:
        pids = wait_for(lambda: front_end_pids(proc.pid), what="a front-end started")  # (not yet listening)
        os.killpg(proc.pid, signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 0, out
    assert "ready on" not in out and "before listening" not in out
    assert out.rstrip().endswith("siftmq broker stopped"), out
    for pid in pids:
        assert not Path(f"/proc/{pid}").exists() or _zombie(pid)


def test_a_second_broker_on_the_same_port_fails_loudly(broker_of: Any, tmp_path: Path) -> None:
    first = broker_of(workers=2)
    for workers in (2, 1):
        cmd = [
            sys.executable,
            "-m",
            "siftmq",
            "broker",
            "--data-dir",
            str(tmp_path / f"other{workers}"),
            "--listen",
            first.endpoint,
            "--admin-listen",
            "",
            "--workers",
            str(workers),
        ]
        done = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=60)
        assert done.returncode != 0
        assert f"cannot listen on {first.endpoint}" in done.stderr, done.stderr
        assert "ready on" not in done.stdout
    # the first one still serves
    producer = Producer(ClientConfiguration(first.endpoint, Credentials()), (TOPIC,))
    producer.startup()
    try:
        producer.send(_message(0, 0))
    finally:
        producer.shutdown()


def _workers_broker(data_dir: Path, listen: str) -> list[str]:
    return [
        sys.executable, "-m", "siftmq", "broker", "--data-dir", str(data_dir), "--listen", listen,
        "--admin-listen", "", "--workers", "2",
    ]  # fmt: skip


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_a_port_another_core_claims_is_refused(tmp_path: Path) -> None:
    """The claim, not the port check, refuses it: the port itself is free here."""
    port = _free_port()
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as claim:
        claim.bind(f"\0siftmq-workers-port-{port}")
        cmd = _workers_broker(tmp_path / "claimed", f"127.0.0.1:{port}")
        done = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=60)
    assert done.returncode != 0
    assert f"another siftmq broker with --workers holds port {port}" in done.stderr, done.stderr
    assert "ready on" not in done.stdout


def test_two_brokers_started_in_the_same_instant_on_one_port_one_serves(tmp_path: Path) -> None:
    """Both find the port free (their front-ends bind it a second or so later, with SO_REUSEPORT):
    without the claim both would serve it, each with its own data."""
    listen = f"127.0.0.1:{_free_port()}"
    procs = [
        subprocess.Popen(
            _workers_broker(tmp_path / f"twin{i}", listen),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        for i in range(2)
    ]
    try:
        deadline = time.monotonic() + 60
        while all(p.poll() is None for p in procs) and time.monotonic() < deadline:
            time.sleep(0.1)
        exited = [i for i, p in enumerate(procs) if p.poll() is not None]
        assert len(exited) == 1, f"{len(exited)} of the two exited (none: both serve the port)"
        loser, winner = procs[exited[0]], procs[1 - exited[0]]
        assert loser.returncode != 0 and loser.stderr is not None and winner.stdout is not None
        assert "cannot listen on" in loser.stderr.read()
        ready = ""
        while "ready on" not in ready:
            ready = winner.stdout.readline()
            assert ready, "the other one exited too"
        assert winner.poll() is None
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
            p.communicate(timeout=30)  # and its pipes closed


def test_a_front_end_killed_is_started_again_and_nothing_acknowledged_is_lost(broker_of: Any) -> None:
    broker = broker_of(workers=2)
    assert broker.proc is not None
    core = broker.proc.pid
    acked: list[str] = []
    errors: list[str] = []
    stop = threading.Event()
    senders = [
        threading.Thread(target=_send_until, args=(broker.endpoint, w, acked, stop, errors)) for w in range(4)
    ]
    for t in senders:
        t.start()
    try:
        killed: set[int] = set()
        for _ in range(3):
            before = len(acked)
            wait_for(lambda before=before: len(acked) > before + 30, 60, "sends to be acknowledged")
            pids = wait_for(lambda: front_end_pids(core) if len(front_end_pids(core)) == 2 else None, 30)
            victim = pids[len(killed) % 2]
            os.kill(victim, signal.SIGKILL)
            killed.add(victim)
            # the core starts a new one in its place
            wait_for(
                lambda: len(front_end_pids(core)) == 2 and not set(front_end_pids(core)) & killed,
                30,
                "a new front-end",
            )
        before = len(acked)
        wait_for(lambda: len(acked) > before + 30, 60, "sends after the last restart")
    finally:
        stop.set()
        for t in senders:
            t.join(60)
    assert broker.proc.poll() is None  # the core never went down
    assert any("restarting" in line or "starting it again" in line for line in broker.output)
    wanted = ('siftmq_front_ends{state="configured"} 2.0', 'siftmq_front_ends{state="connected"} 2.0')
    metrics = broker.metrics_with(*wanted)
    assert all(w in metrics for w in wanted) and "siftmq_front_end_restarts_total 3.0" in metrics
    got = _receive_all(broker.endpoint, set(acked), "g-after-kills")
    missing = set(acked) - got
    assert not missing, f"{len(missing)} of {len(acked)} acknowledged sends lost ({len(errors)} failed sends)"


def test_the_core_killed_takes_the_front_ends_and_loses_nothing_acknowledged(broker_of: Any) -> None:
    broker = broker_of(workers=2, flush="sync")
    assert broker.proc is not None
    pids = wait_for(
        lambda: front_end_pids(broker.proc.pid) if len(front_end_pids(broker.proc.pid)) == 2 else None
    )
    acked: list[str] = []
    errors: list[str] = []
    stop = threading.Event()
    senders = [
        threading.Thread(target=_send_until, args=(broker.endpoint, w, acked, stop, errors)) for w in range(3)
    ]
    for t in senders:
        t.start()
    try:
        wait_for(lambda: len(acked) > 60, 60, "sends to be acknowledged")
        broker.kill()  # SIGKILL to the core in the middle of sends
        for pid in pids:  # the front-ends follow it (the kernel tells them; the socket closes)
            wait_for(
                lambda pid=pid: not Path(f"/proc/{pid}").exists() or _zombie(pid), 15, f"front-end {pid}"
            )
    finally:
        stop.set()
        for t in senders:
            t.join(60)
    again = broker_of(workers=2, flush="sync")  # the same data dir: it was given up with the core
    assert again.data_dir == broker.data_dir
    got = _receive_all(again.endpoint, set(acked), "g-after-core-kill")
    missing = set(acked) - got
    assert not missing, f"{len(missing)} of {len(acked)} acknowledged sends lost"


def test_a_long_poll_answers_before_the_clients_deadline_though_the_core_read_it_late(broker_of: Any) -> None:
    """The core is stopped for 1.5 s while a receive with a 5 s deadline reaches a front-end: the
    long poll still answers (empty) before the client gives up, as in one process."""
    broker = broker_of(workers=2)
    assert broker.proc is not None
    wait_for(lambda: len(front_end_pids(broker.proc.pid)) == 2, what="2 front-ends")
    with grpc.insecure_channel(broker.endpoint) as channel:
        rpc_stub(channel, "QueryRoute")(pb.QueryRouteRequest(topic=pb.Resource(name=TOPIC)), timeout=10)
        request = pb.ReceiveMessageRequest(
            group=pb.Resource(name="g-late"),
            message_queue=pb.MessageQueue(topic=pb.Resource(name=TOPIC), id=-1),
            filter_expression=pb.FilterExpression(type=pb.FilterType.TAG, expression="*"),
            batch_size=1,
        )
        request.invisible_duration.FromSeconds(30)
        request.long_polling_timeout.FromSeconds(30)
        outcome: list[Any] = []

        def receive() -> None:
            try:
                outcome.extend(a.status.code for a in rpc_stub(channel, "ReceiveMessage")(request, timeout=5))
            except grpc.RpcError as exc:
                outcome.append(exc.code())

        os.kill(broker.proc.pid, signal.SIGSTOP)
        try:
            receiving = threading.Thread(target=receive)
            receiving.start()
            time.sleep(1.5)
        finally:
            os.kill(broker.proc.pid, signal.SIGCONT)
        receiving.join(15)
    assert outcome[:1] == [pb.Code.MESSAGE_NOT_FOUND], outcome


def test_a_telemetry_client_that_does_not_read_holds_up_its_own_call(broker_of: Any) -> None:
    """A client writes large Telemetry commands and never reads the answers (each repeats the
    settings): as in one process, its writes stall after a few, instead of a front-end queueing
    every answer in memory."""
    broker = broker_of(workers=2)
    assert broker.proc is not None
    wait_for(lambda: len(front_end_pids(broker.proc.pid)) == 2, what="2 front-ends")
    topics = [pb.Resource(name="t" * 200) for _ in range(1300)]
    command = pb.TelemetryCommand(
        settings=pb.Settings(client_type=pb.ClientType.PRODUCER, publishing=pb.Publishing(topics=topics))
    )
    assert command.ByteSize() > 256 * 1024
    written = [0]
    stop = threading.Event()

    def commands() -> Any:
        for _ in range(300):
            if stop.is_set():
                return
            written[0] += 1
            yield command
        stop.wait(30)

    with grpc.insecure_channel(
        broker.endpoint, options=[("grpc.max_receive_message_length", 64 << 20)]
    ) as ch:
        call = rpc_stub(ch, "Telemetry")(
            commands(), timeout=60, metadata=(("x-mq-client-id", "never-reads"),)
        )
        try:
            deadline = time.monotonic() + 6
            last = -1
            while time.monotonic() < deadline and written[0] != last:  # until the writes stall
                last = written[0]
                time.sleep(1.0)
            stalled_at = written[0]
        finally:
            stop.set()
            call.cancel()
    assert stalled_at < 120, f"{stalled_at} of 300 commands written without an answer read"


def test_a_front_end_started_after_the_socket_was_cleaned_away_still_connects(broker_of: Any) -> None:
    """A cleaner of old files in the temporary directory removes the core's socket directory; a
    front-end that dies afterwards is started again and connects (the core listens anew)."""
    broker = broker_of(workers=2)
    assert broker.proc is not None
    core = broker.proc.pid
    pids = wait_for(lambda: front_end_pids(core) if len(front_end_pids(core)) == 2 else None)
    (directory,) = Path(tempfile.gettempdir()).glob(f"siftmq-core-{core}-*")
    shutil.rmtree(directory)
    os.kill(pids[0], signal.SIGKILL)
    wanted = ('siftmq_front_ends{state="connected"} 2.0', "siftmq_front_end_restarts_total 1.0")
    metrics = broker.metrics_with(*wanted, timeout=20)
    assert all(w in metrics for w in wanted), metrics
    time.sleep(1.0)  # and it stays: not dying again for want of the socket
    assert "siftmq_front_end_restarts_total 1.0" in broker.metrics_with(*wanted)
    assert any("socket under" in line and "was removed" in line for line in broker.output)
    producer = Producer(ClientConfiguration(broker.endpoint, Credentials()), (TOPIC,))
    producer.startup()
    try:
        sent = {producer.send(_message(i, 0)).message_id for i in range(10)}
    finally:
        producer.shutdown()
    assert _receive_all(broker.endpoint, sent, "g-after-clean") == sent
