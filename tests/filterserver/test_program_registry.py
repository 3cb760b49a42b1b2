"""The broker's registry of filter programs against real sandboxed workers (no broker process):
registrations do not take reads' workers, and verdicts a read leaves over belong to the version
that made them and stay bounded."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from siftmq.broker.model import filter_error_text
from siftmq.broker.programs import MAX_LEFT_OVER_TEXT, ProgramRegistry
from siftmq.errors import BadRequestError, StatusCode
from siftmq.filterserver.message import row
from siftmq.filterserver.pool import Limits
from siftmq.filterserver.sandbox import SandboxUnavailable, check_supported
from siftmq.filterserver.wire import ERROR, MATCH, REJECT
from siftmq.store import RawRecord
from siftmq.store.codec import encode_host

ACCEPT = "def match(m):\n    return True\n"
REFUSE = "def match(m):\n    return False\n"
SLOW_LOAD = (  # module code busy for 4 s: a registration that holds its worker that long
    "import datetime\nEND = datetime.datetime.now() + datetime.timedelta(seconds=4)\n"
    "while datetime.datetime.now() < END:\n    pass\n" + ACCEPT
)


@pytest.fixture
def registry(tmp_path: Path) -> ProgramRegistry:
    try:
        check_supported()
    except SandboxUnavailable as exc:
        pytest.skip(str(exc))
    reg = ProgramRegistry(tmp_path, Limits(), workers=1)
    yield reg
    reg.close()


def records(*offsets: int) -> list[RawRecord]:
    host = encode_host("127.0.0.1", 1)
    return [RawRecord(b"", 100 * o, o, b"", b"{}", 0, 0, host) for o in offsets]


def test_a_registration_takes_no_worker_of_the_reads(registry: ProgramRegistry) -> None:
    """One worker for reads; a program registering with slow module code (another tenant's) holds
    a trial worker of its own. Before, it held the only one: the read waited 2 s for room and its
    group delivered nothing."""
    registry.register("g1", "T", ACCEPT, [row(topic="T")])
    assert registry.apply("g1", "T", 0, records(0)).codes == bytes([MATCH])  # g1 has the worker
    slow = threading.Thread(target=registry.register, args=("g2", "T", SLOW_LOAD, [row(topic="T")]))
    slow.start()
    try:
        time.sleep(0.5)  # its trial worker is loading
        filtered = registry.apply("g1", "T", 0, records(1, 2))
        assert not filtered.held and filtered.codes == bytes([MATCH, MATCH])
        with pytest.raises(BadRequestError, match="is being registered") as refused:
            registry.register("g2", "T", ACCEPT, [row(topic="T")])  # the same pair, meanwhile
        assert refused.value.status is StatusCode.PRECONDITION_FAILED
    finally:
        slow.join(60)
    assert registry.holds("g2", "T")


def test_verdicts_left_over_by_a_replaced_version_are_not_used(registry: ProgramRegistry) -> None:
    """A read through version 1 leaves verdicts over after version 2 took effect: before, they were
    kept as version 2's, and messages version 2 refuses were delivered."""
    registry.register("g", "T", ACCEPT, [row(topic="T")])
    registry.register("g", "T", REFUSE, [row(topic="T")])
    registry.leave("g", "T", 0, 1, {5: (MATCH, ""), 6: (MATCH, "")})  # the old read ends now
    assert registry.apply("g", "T", 0, records(5, 6)).codes == bytes([REJECT, REJECT])


def test_verdicts_left_over_keep_bounded_error_texts(registry: ProgramRegistry) -> None:
    registry.register("g", "T", REFUSE, [row(topic="T")])
    program = registry.all()[0]
    long_error = "ValueError: " + "é" * 5000  # 10 KB of UTF-8
    registry.leave("g", "T", 0, program.version, {0: (ERROR, long_error)})
    filtered = registry.apply("g", "T", 0, records(0))
    assert filtered.codes == bytes([ERROR]) and len(filtered.errors[0].encode()) <= 700
    assert registry.counters(program)["evaluated"] == 0  # the verdict was used, not asked again

    # more queues of such verdicts than the bound holds: the oldest go (asked of the worker again)
    per_queue = {o: (ERROR, long_error) for o in range(1024)}
    queues = MAX_LEFT_OVER_TEXT // (1024 * len(filter_error_text(long_error))) + 2
    for q in range(queues):
        registry.leave("g", "T", q, program.version, per_queue)
    assert registry.apply("g", "T", 0, records(0)).codes == bytes([REJECT])  # evicted: asked again
    assert registry.apply("g", "T", queues - 1, records(0)).codes == bytes([ERROR])  # the newest kept


def test_a_program_registered_again_after_its_removal_dead_letters_its_failures(
    registry: ProgramRegistry,
) -> None:
    """Versions start at 1 again after a removal (and offsets at 0 after a topic's): before, the
    removed program's mark of what it had dead-lettered hid the new one's failures below it, which
    were then neither delivered nor dead-lettered."""
    registry.register("g", "T", REFUSE, [row(topic="T")])
    registry.note_dead_lettered("g", "T", 0, 1, range(0, 10))
    assert registry.dead_lettered("g", "T", 0, 1) == range(0, 10)
    registry.remove("g", "T")
    registry.register("g", "T", REFUSE, [row(topic="T")])
    assert registry.all()[0].version == 1 and not registry.dead_lettered("g", "T", 0, 1)


def test_dead_letter_runs_join_only_where_reads_met(registry: ProgramRegistry) -> None:
    """A pull that seeks forward past unread messages, then back: the failures it skipped were
    never dead-lettered. Before, one mark (the highest offset dead-lettered) covered them too, and
    they were neither delivered nor dead-lettered."""
    registry.register("g", "T", REFUSE, [row(topic="T")])
    registry.note_dead_lettered("g", "T", 0, 1, range(0, 10))
    registry.note_dead_lettered("g", "T", 0, 1, range(10, 20))  # the next read: one run
    assert registry.dead_lettered("g", "T", 0, 1) == range(0, 20)
    registry.note_dead_lettered("g", "T", 0, 1, range(50, 60))  # sought forward: 20..49 unread
    assert registry.dead_lettered("g", "T", 0, 1) == range(50, 60)
    assert 30 not in registry.dead_lettered("g", "T", 0, 1)  # read later: dead-lettered then
    registry.note_dead_lettered("g", "T", 0, 1, range(5, 5))  # an empty read changes nothing
    assert registry.dead_lettered("g", "T", 0, 1) == range(50, 60)


def test_registrations_beyond_the_trial_workers_are_told_to_retry(registry: ProgramRegistry) -> None:
    """Before, a third registration while two loaded slow module code was refused as a bad
    program (400, "the program's worker did not start")."""
    slow = [
        threading.Thread(target=registry.register, args=(f"slow{i}", "T", SLOW_LOAD, [row(topic="T")]))
        for i in range(2)
    ]
    for thread in slow:
        thread.start()
    try:
        time.sleep(0.5)
        with pytest.raises(BadRequestError, match="try again") as busy:
            registry.register("g3", "T", ACCEPT, [row(topic="T")])
        assert busy.value.status is StatusCode.TOO_MANY_REQUESTS
    finally:
        for thread in slow:
            thread.join(60)
