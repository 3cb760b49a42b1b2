"""Hostile filter programs against real sandboxed workers (no broker): each gets a clear outcome,
nothing escapes, and the worker pool stays usable."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from siftmq.filterserver import wire
from siftmq.filterserver.message import row
from siftmq.filterserver.pool import FilterServer, Limits, ProgramKey, ProgramLoadError, ProgramSuspended
from siftmq.filterserver.sandbox import check_supported

pytestmark = pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="Linux only")

ROWS = [
    row(topic="T", body=b'{"total": %d}' % i, properties={"region": "eu" if i % 2 else "us"})
    for i in range(6)
]
OS = (
    "def _os():\n"
    "    for c in ().__class__.__base__.__subclasses__():\n"
    "        if c.__name__ == '_wrap_close':\n"
    "            return c.__init__.__globals__\n"
)  # the classic escape from a Python-level sandbox: reaches the os module's functions


@pytest.fixture(scope="module")
def server() -> FilterServer:
    check_supported()
    fs = FilterServer(Limits(timeout_ms=100, max_failures=100), 2)
    yield fs
    fs.close()


def run(server: FilterServer, source: str, rows: list = ROWS) -> tuple[list[int], dict[int, str]]:  # type: ignore[type-arg]
    run.version += 1  # type: ignore[attr-defined]
    verdict = server.evaluate(ProgramKey("g", "t", run.version), source, rows)  # type: ignore[attr-defined]
    return list(verdict.codes), verdict.errors


run.version = 0  # type: ignore[attr-defined]


def test_good_programs_filter_on_properties_and_bodies(server: FilterServer) -> None:
    codes, _ = run(server, "def match(m):\n    return m.properties.get('region') == 'eu'\n")
    assert codes == [0, 1, 0, 1, 0, 1]
    codes, _ = run(server, "import json\ndef match(m):\n    return json.loads(m.body)['total'] >= 4\n")
    assert codes == [0, 0, 0, 0, 1, 1]
    every = (
        "import json, re, math, datetime, decimal, statistics, string, itertools, functools\n"
        "import collections, hashlib, base64, struct, unicodedata, zlib\n"
        "from collections import Counter\nSEEN = Counter()\n"
        "def match(m):\n    SEEN[m.topic] += 1\n    datetime.datetime.now(); decimal.Decimal('1.5') * 2\n"
        "    statistics.mean([1, 2]); hashlib.sha256(m.body).hexdigest(); zlib.compress(m.body)\n"
        "    base64.b64encode(m.body); struct.pack('>I', 1); unicodedata.name('a'); math.sqrt(2)\n"
        "    return bool(re.search(rb'total', m.body)) and SEEN['T'] > 0\n"
    )
    assert run(server, every)[0] == [1] * 6


def test_the_message_is_read_only(server: FilterServer) -> None:
    codes, errors = run(server, "def match(m):\n    m.properties['x'] = '1'\n    return True\n", ROWS[:1])
    assert codes == [wire.ERROR] and "does not support item assignment" in errors[0]
    codes, errors = run(server, "def match(m):\n    m.topic = 'x'\n    return True\n", ROWS[:1])
    assert codes == [wire.ERROR] and "AttributeError" in errors[0]


def prog(*lines: str, prelude: str = "") -> str:
    """A program whose match runs ``lines`` and then accepts the message."""
    return prelude + "def match(m):\n" + "".join(f"    {line}\n" for line in lines) + "    return True\n"


DENIED = "Operation not permitted"
HOSTILE = {
    "open a file": (prog("open('/etc/passwd')"), "NameError"),
    "read /proc/self/environ": (prog("_os()['open']('/proc/self/environ', 0)", prelude=OS), DENIED),
    "write into a directory": (prog("_os()['mkdir']('/tmp/siftmq-sandbox-probe')", prelude=OS), DENIED),
    "os.system": (prog("_os()['system']('touch /tmp/siftmq-sandbox-probe')", prelude=OS), None),
    "fork": (prog("_os()['fork']()", prelude=OS), DENIED),
    "exec": (prog("_os()['execv']('/bin/sh', ['sh'])", prelude=OS), DENIED),
    "kill the broker": (prog("o = _os()", "o['kill'](o['getppid'](), 9)", prelude=OS), DENIED),
    "import os": (prog("import os"), "not allowed"),
    "import ctypes": (prog("import ctypes"), "not allowed"),
    "import threading": (prog("import threading"), "not allowed"),
    "a memory bomb": (prog("x = bytearray(10**11)"), "MemoryError"),
    "unbounded recursion": (prog("f(0)", prelude="def f(n):\n    return f(n + 1)\n"), "RecursionError"),
    "sys.exit in match": (prog("raise SystemExit(3)"), "SystemExit"),
    "a non-bool": ("def match(m):\n    return 1\n", "match returned int, not bool"),
    "a raising __bool__": (
        "class X:\n    def __bool__(self):\n        raise ValueError('no')\ndef match(m):\n    return X()\n",
        "match returned X, not bool",
    ),
    "a hostile __str__": (
        prog("raise E()", prelude="class E(Exception):\n    def __str__(self):\n        raise ValueError\n"),
        "E: <unprintable>",
    ),
    "10 MB to stdout": (prog("print('x' * 10_000_000)"), None),
    "a socket to the broker": (
        prog(
            "socket = _os()['sys'].modules['builtins'].__import__('socket')",
            "socket.create_connection(('127.0.0.1', 8081), timeout=1)",
            prelude=OS,
        ),
        "Error",
    ),
    "start a thread": (
        prog(
            "t = _os()['sys'].modules['builtins'].__import__('_thread')",
            "t.start_new_thread(print, ())",
            prelude=OS,
        ),
        "can't start new thread",
    ),
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_a_hostile_program_gets_a_clear_outcome(server: FilterServer, name: str) -> None:
    source, error = HOSTILE[name]
    codes, errors = run(server, source, ROWS[:2])
    if error is None:  # harmless: stdout is /dev/null, system() cannot fork
        assert codes == [wire.MATCH] * 2
    else:
        assert codes == [wire.ERROR] * 2 and error in errors[0]
    assert not Path("/tmp/siftmq-sandbox-probe").exists()


def test_the_worker_runs_as_nobody_with_an_empty_environment(server: FilterServer) -> None:
    source = (
        OS + "def match(m):\n    o = _os()\n    raise ValueError(repr((o['getuid'](), dict(o['environ']))))\n"
    )
    _, errors = run(server, source, ROWS[:1])
    uid, env = eval(errors[0].removeprefix("ValueError: "))
    assert uid == (65534 if os.geteuid() == 0 else os.geteuid())
    assert set(env) <= {"LC_CTYPE"}  # Python's own locale coercion; nothing of the broker's


@pytest.mark.parametrize(
    ("name", "source", "reason"),
    [
        ("an endless loop", "def match(m):\n    while True:\n        pass\n", "deadline"),
        ("os._exit", OS + "def match(m):\n    _os()['_exit'](0)\n", "exited with code 0"),
        (
            "sleeping past the deadline",
            OS + "def match(m):\n    _os()['sys'].modules['time'].sleep(5)\n",
            "deadline",
        ),
    ],
)
def test_a_program_that_kills_its_worker_fails_only_the_message_that_did(
    server: FilterServer, name: str, source: str, reason: str
) -> None:
    poisoned = source.replace(
        "def match(m):\n", "def match(m):\n    if m.properties['region'] == 'eu':\n        return True\n"
    )
    codes, errors = run(server, poisoned, ROWS[:4])  # the 'us' ones (0, 2) kill it; the others match
    assert codes == [wire.ERROR, wire.MATCH, wire.ERROR, wire.MATCH]
    assert reason in errors[0] and reason in errors[2]


def test_load_failures_are_reported() -> None:
    fs = FilterServer(Limits(), 1)
    try:
        with pytest.raises(ProgramLoadError, match="ZeroDivisionError"):
            fs.evaluate(ProgramKey("g", "t", 1), "x = 1 / 0\ndef match(m):\n    return True\n", ROWS[:1])
        with pytest.raises(ProgramLoadError, match="not allowed"):
            fs.evaluate(
                ProgramKey("g", "t", 2), "import sys\nsys.exit(1)\ndef match(m):\n    return True\n", ROWS[:1]
            )
    finally:
        fs.close()


def test_a_program_that_keeps_killing_its_workers_is_suspended() -> None:
    fs = FilterServer(Limits(timeout_ms=20, max_failures=3), 1)
    key = ProgramKey("g", "t", 1)
    try:
        with pytest.raises(ProgramSuspended, match=r"\(3 on single messages\)"):
            fs.evaluate(key, "def match(m):\n    while True:\n        pass\n", ROWS[:4])
        with pytest.raises(ProgramSuspended):  # and stays so
            fs.evaluate(key, "def match(m):\n    return True\n", ROWS[:1])
        assert list(
            fs.evaluate(ProgramKey("g", "t", 2), "def match(m):\n    return True\n", ROWS[:1]).codes
        ) == [1]
    finally:
        fs.close()


def test_a_program_that_works_once_then_crashes_forever_is_suspended() -> None:
    fs = FilterServer(Limits(max_failures=4), 1)
    source = prog(
        "CALLS.append(1)", "if len(CALLS) > 1:", "    _os()['_exit'](1)", prelude=OS + "CALLS = []\n"
    )
    try:
        assert list(fs.evaluate(ProgramKey("g", "t", 1), source, ROWS[:1]).codes) == [wire.MATCH]
        with pytest.raises(ProgramSuspended, match="exited with code 1"):
            for _ in range(10):  # each fresh worker gets past its first call only
                fs.evaluate(ProgramKey("g", "t", 1), source, ROWS[:2])
    finally:
        fs.close()


def test_more_programs_than_workers_take_turns() -> None:
    fs = FilterServer(Limits(), 1)
    try:
        for round_ in range(2):
            for v in range(3):
                source = f"def match(m):\n    return m.properties['region'] == {'eu' if v % 2 else 'us'!r}\n"
                codes = list(fs.evaluate(ProgramKey("g", f"t{v}", 1), source, ROWS).codes)
                assert codes == ([0, 1] * 3 if v % 2 else [1, 0] * 3), (round_, v)
        live = [s for slots in fs._workers.values() for s in slots if s.worker is not None and s.worker.alive]
        assert len(live) == 1
    finally:
        fs.close()


def test_a_program_busy_in_two_threads_gets_two_workers() -> None:
    import threading

    fs = FilterServer(Limits(timeout_ms=2000), 2)
    key = ProgramKey("g", "t", 1)
    source = (
        "import math\ndef match(m):\n    for i in range(300_000):\n        math.sqrt(i)\n    return True\n"
    )
    start = threading.Barrier(2)
    codes: list[list[int]] = []

    def evaluate() -> None:
        start.wait()
        codes.append(list(fs.evaluate(key, source, ROWS[:2]).codes))

    try:
        threads = [threading.Thread(target=evaluate) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert codes == [[wire.MATCH] * 2] * 2
        assert len(fs._workers[key]) == 2  # the second call did not wait for the first one's worker
        assert fs.counters(key).evaluated == 4
    finally:
        fs.close()


def test_a_long_batch_of_a_slow_program_is_cut_to_fit_the_batch_deadline() -> None:
    """A program that takes a few ms a message, well within its per-message deadline, given a
    batch whose total would overrun the batch deadline: the batch goes in chunks sized by the
    program's pace, so no worker is killed and every message gets its real outcome."""
    server = FilterServer(Limits(timeout_ms=100, batch_timeout_ms=1000, max_failures=2), 1)
    slow = "def match(m):\n    for _ in range(100000):\n        pass\n    return m.queue_offset % 2 == 0\n"
    rows = [row(topic="T", queue_offset=i) for i in range(600)]
    try:
        key = ProgramKey("g", "slow", 1)
        verdict = server.evaluate(key, slow, rows)
        counters = server.counters(key)
        assert list(verdict.codes) == [wire.MATCH if i % 2 == 0 else wire.REJECT for i in range(600)]
        assert (counters.timeouts, counters.restarts, len(counters.kills)) == (0, 1, 0)
    finally:
        server.close()


def test_one_poisoned_message_in_a_large_batch_counts_once_toward_suspension() -> None:
    """The bisection kills a worker about log2(batch) times to isolate the message that kills it;
    only that message counts as a failure, so a large batch costs a program no more than a small one."""
    fs = FilterServer(Limits(timeout_ms=50, batch_timeout_ms=500, max_failures=3), 1)
    key = ProgramKey("g", "poisoned", 1)
    source = "def match(m):\n    while m.queue_offset in (17, 300):\n        pass\n    return True\n"
    try:
        for first, poisoned in ((0, 17), (256, 300)):  # two poisoned messages, each in a batch of 256
            rows = [row(topic="T", queue_offset=i) for i in range(first, first + 256)]
            verdict = fs.evaluate(key, source, rows)
            assert [first + i for i, c in enumerate(verdict.codes) if c == wire.ERROR] == [poisoned]
            assert "deadline" in verdict.errors[poisoned - first]
        counters = fs.counters(key)
        assert len(counters.kills) == 2 and len(counters.all_kills) > 2
    finally:
        fs.close()


def test_a_budget_stops_a_long_batch_between_chunks() -> None:
    """With a time budget the pool stops sending chunks once it has passed: the verdict covers the
    first messages (at least one chunk), which the broker delivers, and the rest wait for the next read."""
    server = FilterServer(Limits(timeout_ms=100, batch_timeout_ms=1000), 1)
    slow = "def match(m):\n    for _ in range(30000):\n        pass\n    return m.queue_offset % 2 == 0\n"
    rows = [row(topic="T", queue_offset=i) for i in range(600)]
    try:
        key = ProgramKey("g", "budget", 1)
        verdict = server.evaluate(key, slow, rows, budget_s=0.05)
        done = len(verdict.codes)
        assert 1 <= done < 600
        assert list(verdict.codes) == [wire.MATCH if i % 2 == 0 else wire.REJECT for i in range(done)]
        assert server.counters(key).evaluated == done
        assert len(server.evaluate(key, slow, rows[:10], budget_s=0.0).codes) == 10  # one chunk at least
    finally:
        server.close()


def test_a_budget_stops_a_bisection_too() -> None:
    """A program that kills its worker on any batch of more than one message: each half of the
    bisection costs a worker's start. With a budget the verdict stops once it has passed (before,
    64 messages took 64 worker restarts in one read, past the client's deadline)."""
    source = (
        "COUNT = [0]\n"
        + PATCH_WRITE.replace("AFTER()", "COUNT[0] = 0")
        + (
            "def match(m):\n    COUNT[0] += 1\n"
            "    if COUNT[0] > 1:\n        _os()['_exit'](3)\n    return True\n"
        )
    )  # COUNT: the messages of the batch under way (reset as each answer is written)
    rows = [row(topic="T", queue_offset=i) for i in range(64)]
    server = FilterServer(Limits(max_failures=1000), 1)
    try:
        verdict = server.evaluate(ProgramKey("g", "bisect", 1), source, rows, budget_s=0.01)
        assert 1 <= len(verdict.codes) < 64
        assert set(verdict.codes) == {wire.MATCH} and not verdict.errors  # alone, each one passes
        everything = server.evaluate(ProgramKey("g", "bisect", 2), source, rows[:8])  # no budget: all
        assert list(everything.codes) == [wire.MATCH] * 8
    finally:
        server.close()


def test_a_program_no_longer_in_force_gets_no_new_worker() -> None:
    """A read in flight through a program replaced or removed meanwhile: before, its next chunk or
    bisection step made a slot and a worker for it again, which lived on unused."""
    from siftmq.filterserver.pool import ProgramForgotten

    server = FilterServer(Limits(), 2)
    key = ProgramKey("g", "gone", 1)
    try:
        assert list(server.evaluate(key, "def match(m):\n    return True\n", ROWS[:1]).codes) == [wire.MATCH]
        server.forget(key)
        with pytest.raises(ProgramForgotten):
            server.evaluate(key, "def match(m):\n    return True\n", ROWS[:1], current=lambda: False)
        assert key not in server._workers  # no slot, no worker
    finally:
        server.close()


PATCH_WRITE = OS + (
    "MAIN = _os()['sys'].modules['__main__']\n"
    "WRITE = MAIN._write\n"
    "WRITES = []\n"
    "def _after(fd, data):\n"
    "    WRITE(fd, data)\n"
    "    WRITES.append(1)\n"
    "    AFTER()\n"
    "MAIN._write = _after\n"
)  # the program replaces the worker's own result writer: it runs after each answer it sends


def test_a_worker_that_dies_between_batches_counts_toward_suspension() -> None:
    """The program ends its worker right after each answer: every batch needs a new worker (each
    start costing a read thread its load time) — counted, so it is suspended. Its worker exits
    before the broker stops it (seen dead before the next batch, which a new worker then runs) or
    once the next batch lets it go on (that batch fails): a kill either way."""
    import time

    after_result = "if len(WRITES) >= 2:\n        _os()['_exit'](0)"  # (the first write: it loaded)
    source = PATCH_WRITE.replace("AFTER()", after_result) + "def match(m):\n    return True\n"
    fs = FilterServer(Limits(max_failures=3), 1)
    key = ProgramKey("g", "t", 1)
    try:
        with pytest.raises(ProgramSuspended, match=r"died between batches|exited with code 0"):
            for _ in range(10):
                assert list(fs.evaluate(key, source, ROWS[:1]).codes) in ([wire.MATCH], [wire.ERROR])
                time.sleep(0.2)
    finally:
        fs.close()


def test_a_worker_that_spins_after_answering_is_stopped_until_its_next_batch() -> None:
    """A program that answers (the worker's writer runs it after each answer; a program can also
    write its answer itself) and goes on computing: stopped between batches, it takes no CPU while
    no batch comes. Before, it burned a core until the next batch, which a group reading rarely
    could put off for ever, under the suspension's count. Its next batch finds it still busy: it
    misses its deadline, is killed, and that counts."""
    import time

    spin = "if len(WRITES) == 2:\n        while True:\n            pass"  # after its first result
    source = PATCH_WRITE.replace("AFTER()", spin) + "def match(m):\n    return True\n"
    fs = FilterServer(Limits(timeout_ms=200, max_failures=100), 1)
    key = ProgramKey("g", "t", 1)
    try:
        assert list(fs.evaluate(key, source, ROWS[:2]).codes) == [wire.MATCH] * 2
        worker = fs._workers[key][0].worker
        assert worker is not None
        time.sleep(0.2)  # (the moment it ran before it was stopped)
        before = worker._cpu_seconds()
        time.sleep(1.5)
        assert worker._cpu_seconds() - before < 0.2  # stopped: ~1.5 s of a core before
        assert not worker.spun_idle
        verdict = fs.evaluate(key, source, ROWS[:1])
        assert list(verdict.codes) == [wire.ERROR] and "deadline" in verdict.errors[0]
        assert fs.counters(key).timeouts >= 1 and not worker.alive
    finally:
        fs.close()


def test_a_program_new_to_a_full_pool_waits_for_room_and_the_bound_holds() -> None:
    """One worker allowed, taken by a long batch: another program (a trial run at registration,
    say) waits for room instead of starting a second worker."""
    import threading

    fs = FilterServer(Limits(timeout_ms=2000, batch_timeout_ms=4000), 1)
    slow = "import math\ndef match(m):\n    for i in range(400_000):\n        math.sqrt(i)\n    return True\n"
    most = [0]
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            live = sum(1 for slots in list(fs._workers.values()) for s in list(slots) if s.worker is not None)
            most[0] = max(most[0], live)
            done.wait(0.005)

    watcher = threading.Thread(target=watch)
    busy = threading.Thread(target=lambda: fs.evaluate(ProgramKey("g", "slow", 1), slow, ROWS[:4]))
    try:
        watcher.start()
        busy.start()
        while not fs._workers.get(ProgramKey("g", "slow", 1)):
            pass
        codes = fs.evaluate(ProgramKey("g", "other", 1), "def match(m):\n    return True\n", ROWS[:1]).codes
        assert list(codes) == [wire.MATCH]
        busy.join(30)
    finally:
        done.set()
        watcher.join(10)
        fs.close()
    assert most[0] == 1


_ORPHAN_SCRIPT = """
import os, threading, time
from siftmq.filterserver.message import row
from siftmq.filterserver.pool import FilterServer, Limits, ProgramKey
fs = FilterServer(Limits(timeout_ms=600_000, batch_timeout_ms=600_000), 1)
spin = "def match(m):\\n    while True:\\n        pass\\n"
args = (ProgramKey("g", "t", 1), spin, [row(topic="t")])
threading.Thread(target=fs.evaluate, args=args, daemon=True).start()
me = str(os.getpid())
def parent(p):
    try:
        with open(f"/proc/{p}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[1]
    except OSError:  # the process ended between the listing and the read
        return None
while True:
    time.sleep(0.2)
    children = [p for p in os.listdir("/proc") if p.isdigit() and parent(p) == me]
    if children:
        break
time.sleep(1.0)  # its program is running
print(" ".join(children), flush=True)
os._exit(0)  # the broker gone without stopping its workers
"""


def test_a_worker_dies_with_the_broker_even_running_as_another_user() -> None:
    """Before, the parent-death signal was asked before the worker's change of user, which clears
    it: a worker busy in its program outlived a killed broker, spinning as nobody for good."""
    import subprocess
    import sys
    import time

    check_supported()
    done = subprocess.run(
        [sys.executable, "-c", _ORPHAN_SCRIPT], check=False, capture_output=True, text=True, timeout=120
    )
    pids = [int(p) for p in done.stdout.split()]
    assert pids, done.stderr
    deadline = time.monotonic() + 10
    alive = pids
    while alive and time.monotonic() < deadline:
        time.sleep(0.1)
        alive = [p for p in pids if os.path.exists(f"/proc/{p}") and _state(p) != "Z"]
    for p in alive:  # not to leave it spinning when the test fails
        os.kill(p, 9)
    assert not alive


def _state(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "gone"
