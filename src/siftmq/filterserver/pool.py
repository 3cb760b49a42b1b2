"""The broker's side of the filter server: worker processes started, fed, timed and replaced.

A worker runs one program version; programs never share one, and a program busy in several read
threads gets several. At most ``max_workers`` run at once: a program whose worker was taken for
another gets a new one when it next needs it. A batch goes in chunks a
quarter of the batch deadline long at the program's recent pace, and each has a deadline (per
message, capped); a worker that misses it, dies or breaks the protocol is killed and
the batch is run again in a fresh one, halved until the message that kills it is alone — that one
gets an error outcome with the reason, the others their real results. Kills of a program are
counted: past ``max_failures`` within a minute :meth:`FilterServer.evaluate` raises
:class:`ProgramSuspended` until the program is replaced (a new version). Restarts back off.
"""

from __future__ import annotations

import collections
import fcntl
import logging
import marshal
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from siftmq.filterserver import wire
from siftmq.filterserver.message import Row

_log = logging.getLogger(__name__)

LOAD_TIMEOUT_S: Final = 10.0  # a worker's start: interpreter, allowed modules, the program's module code
#: CPU seconds a worker may use between batches (its result written, waiting for the next): more
#: is a program spinning outside its deadlines; the worker is killed and that counts as a failure.
IDLE_CPU_S: Final = 0.5
ROOM_WAIT_S: Final = 2.0  # a program without a worker waits this long for room in the pool
CLOCK_TICKS: Final = os.sysconf("SC_CLK_TCK")
FAILURE_WINDOW_S: Final = 60.0
RECURSION_LIMIT: Final = 400
F_SETPIPE_SZ: Final = getattr(fcntl, "F_SETPIPE_SZ", 1031)
PIPE_BYTES: Final = 1024 * 1024  # Linux's default bound for an unprivileged process
# A large batch goes to the worker in chunks sized so that one takes, at the program's recent pace,
# a quarter of the batch deadline: a program slow on every message is not killed for a long batch.
FIRST_CHUNK: Final = 64
BISECTION_KILLS_PER_FAILURE: Final = 8
CHUNK_SHARE_OF_DEADLINE: Final = 0.25


@dataclass(frozen=True, slots=True)
class Limits:
    memory_mb: int = 256
    timeout_ms: float = 50.0  # per message of a batch
    batch_timeout_ms: float = 500.0  # at most, per batch
    max_failures: int = 16  # kills within a minute before the program is suspended


@dataclass(frozen=True, slots=True)
class ProgramKey:
    group: str
    topic: str
    version: int


@dataclass(frozen=True, slots=True)
class Verdict:
    """One code per message (:data:`wire.MATCH`, ``REJECT`` or ``ERROR``) and the errors' reasons."""

    codes: bytes
    errors: dict[int, str]


class ProgramLoadError(Exception):
    """The program's module code failed in the sandbox (or it has no ``match``)."""


class ProgramSuspended(Exception):
    """The program killed its workers too often; it runs no more until replaced."""


class ProgramForgotten(Exception):
    """The program was replaced or removed while a read ran through it: the read stops (no new
    worker is started for it)."""


class WorkerDied(Exception):
    def __init__(self, reason: str, *, timed_out: bool = False) -> None:
        super().__init__(reason)
        self.reason = reason
        self.timed_out = timed_out


class NoWorkerFree(WorkerDied):
    """Every worker the pool may run was busy for longer than :data:`ROOM_WAIT_S`: try again."""


@dataclass
class Counters:
    evaluated: int = 0
    matched: int = 0
    errors: int = 0
    timeouts: int = 0
    restarts: int = 0
    kills: collections.deque[float] = field(default_factory=collections.deque)  # on single messages
    all_kills: collections.deque[float] = field(default_factory=collections.deque)
    last_error: str = ""
    seconds_per_message: float = 0.0  # lately, batches' wall time included; 0 until one ran

    def as_dict(self) -> dict[str, int]:
        return {"evaluated": self.evaluated, "matched": self.matched, "errors": self.errors,
                "timeouts": self.timeouts, "worker_restarts": self.restarts}  # fmt: skip


def _widen(fd: int) -> None:
    """Let a pipe hold a whole batch (Linux: 64 KiB by default), so a batch is one write and one
    read rather than a hand-over per 64 KiB; where it cannot be widened, it works as it is."""
    try:
        fcntl.fcntl(fd, F_SETPIPE_SZ, PIPE_BYTES)
    except OSError:
        pass


class Worker:
    """One sandboxed worker process running one program."""

    def __init__(self, source: str, limits: Limits, workdir: str) -> None:
        self.limits = limits
        worker_r, self._to_worker = os.pipe()
        self._from_worker, from_worker_w = os.pipe()
        _widen(self._to_worker)
        try:
            self.process = subprocess.Popen(
                [sys.executable, "-I", "-m", "siftmq.filterserver.worker", str(worker_r), str(from_worker_w)],
                env={},
                cwd=workdir,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                pass_fds=(worker_r, from_worker_w),
                start_new_session=True,
            )
        finally:
            os.close(worker_r)
            os.close(from_worker_w)
        os.set_blocking(self._to_worker, False)
        os.set_blocking(self._from_worker, False)
        payload = marshal.dumps((source, limits.memory_mb * 1024 * 1024, RECURSION_LIMIT))
        try:
            deadline = time.monotonic() + LOAD_TIMEOUT_S
            wire.send(self._to_worker, wire.frame(wire.LOAD, payload), deadline)
            kind, answer = wire.receive(self._from_worker, deadline, 64 * 1024)
        except wire.WireError as exc:
            raise WorkerDied(self._death(exc)) from exc
        if kind == wire.LOAD_FAILED:
            self.kill()
            raise ProgramLoadError(wire.printable(answer.decode("utf-8", "replace")[: wire.MAX_ERROR_TEXT]))
        if kind != wire.LOADED:
            self.kill()
            raise WorkerDied("the worker answered its load with something else")
        self._pause()
        self._cpu_after_last = self._cpu_seconds()  # its start is not idle time

    def evaluate(self, rows: Sequence[Row]) -> wire.Result:
        budget = min(self.limits.timeout_ms * len(rows), self.limits.batch_timeout_ms) / 1000
        deadline = time.monotonic() + max(budget, 0.01)
        try:
            self._signal(signal.SIGCONT)
            wire.send(self._to_worker, wire.frame(wire.BATCH, marshal.dumps(list(rows))), deadline)
            kind, payload = wire.receive(self._from_worker, deadline)
            self._pause()
            if kind != wire.RESULT:
                raise wire.WireError("the worker answered a batch with something else")
            result = wire.parse_result(payload, len(rows))
        except wire.WireError as exc:
            raise WorkerDied(self._death(exc), timed_out=exc.timed_out) from exc
        self._cpu_after_last = self._cpu_seconds()
        return result

    def _pause(self) -> None:
        """Stop the worker until its next batch: a program that answered (it may write the answer
        itself) and went on computing would otherwise burn a core for as long as no batch comes
        (seen only at the next one, by :attr:`spun_idle`). SIGCONT lets it go on."""
        self._signal(signal.SIGSTOP)

    def _signal(self, sig: signal.Signals) -> None:
        # send_signal polls first: a worker reaped already is not signalled (its pid may be reused)
        try:
            self.process.send_signal(sig)
        except ProcessLookupError:  # dead, not yet reaped: the pipes say so next
            pass

    @property
    def spun_idle(self) -> bool:
        """Whether it used more than :data:`IDLE_CPU_S` of CPU since its last batch ended."""
        return self._cpu_seconds() > self._cpu_after_last + IDLE_CPU_S

    def _cpu_seconds(self) -> float:
        """The worker's CPU time so far (0 when it cannot be read: then nothing is compared)."""
        try:
            fields = Path(f"/proc/{self.process.pid}/stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            return 0.0
        return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS

    def _death(self, exc: wire.WireError) -> str:
        """Kill the worker; why it failed, in words."""
        self.kill()
        code = self.process.returncode
        if exc.timed_out:
            return f"the program ran past its deadline ({self.limits.timeout_ms:g} ms a message)"
        if code is not None and code < 0:
            name = signal.Signals(-code).name if -code in signal.Signals.__members__.values() else str(-code)
            return f"the worker was killed by {name}"
        if code is not None:
            return f"the worker exited with code {code} ({exc})"
        return str(exc)

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        try:
            self.process.wait(5)
        except subprocess.TimeoutExpired:
            _log.error("filter worker %d did not die", self.process.pid)
        for fd in (self._to_worker, self._from_worker):
            try:
                os.close(fd)
            except OSError:
                pass
        self._to_worker = self._from_worker = -1

    @property
    def alive(self) -> bool:
        return self.process.poll() is None and self._to_worker >= 0


@dataclass(eq=False)
class _Slot:
    """A place for one worker of a program; held (``lock``) while a batch runs in it."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    worker: Worker | None = None


class FilterServer:
    """The worker processes of every program. Thread-safe: read threads call :meth:`evaluate`.

    A program busy in several read threads at once gets several workers (each runs the same
    program version), up to ``max_workers`` in all."""

    def __init__(self, limits: Limits, max_workers: int) -> None:
        self.limits = limits
        self.max_workers = max(1, max_workers)
        self._workdir = tempfile.mkdtemp(prefix="siftmq-filter-")  # empty; the workers' cwd
        os.chmod(self._workdir, 0o555)
        self._lock = threading.Lock()
        self._room = threading.Condition(self._lock)  # waited on for a worker's room (see _checkout)
        self._workers: collections.OrderedDict[ProgramKey, list[_Slot]] = collections.OrderedDict()
        self._counters: dict[ProgramKey, Counters] = {}
        self._suspended: dict[ProgramKey, str] = {}
        self._closed = False

    def counters(self, key: ProgramKey) -> Counters:
        with self._lock:
            return self._counters.setdefault(key, Counters())

    def evaluate(
        self,
        key: ProgramKey,
        source: str,
        rows: Sequence[Row],
        *,
        budget_s: float | None = None,
        current: Callable[[], bool] | None = None,
    ) -> Verdict:
        """Each message's outcome; with ``budget_s``, chunks and the halves of a bisection stop
        being sent once that many seconds have passed, and the verdict covers only the first rows
        (always at least one). ``current`` says whether the program is still the one in force: once
        it is not, no slot or worker is made for it (its removal's :meth:`forget` may already have
        run). Raises :class:`ProgramSuspended`, :class:`ProgramLoadError` (the program's module code
        failed), :class:`ProgramForgotten`, or :class:`WorkerDied` when no worker could be started
        (the batch may be tried again later)."""
        if not rows:
            return Verdict(b"", {})
        why = self._suspended.get(key)
        if why is not None:
            raise ProgramSuspended(why)
        counters = self.counters(key)
        codes, errors = b"", {}
        start = 0
        stop_at = None if budget_s is None else time.monotonic() + budget_s
        while start < len(rows) and (stop_at is None or start == 0 or time.monotonic() < stop_at):
            pace = counters.seconds_per_message
            size = (
                FIRST_CHUNK
                if pace <= 0
                else int(self.limits.batch_timeout_ms / 1000 * CHUNK_SHARE_OF_DEADLINE / pace)
            )
            chunk = list(rows[start : start + max(size, 1)])
            began = time.monotonic()
            more_codes, more_errors = self._run(
                key, source, chunk, start, counters, stop_at=stop_at, current=current
            )
            took = (time.monotonic() - began) / len(more_codes)
            counters.seconds_per_message = took if pace <= 0 else (pace + took) / 2
            codes += more_codes
            errors.update(more_errors)
            start += len(more_codes)
            if len(more_codes) < len(chunk):  # a bisection out of time
                break
        with self._lock:
            counters.evaluated += len(codes)
            counters.matched += codes.count(wire.MATCH)
            counters.errors += len(errors)
        return Verdict(codes, errors)

    def _run(
        self,
        key: ProgramKey,
        source: str,
        rows: list[Row],
        first: int,
        counters: Counters,
        *,
        stop_at: float | None,
        current: Callable[[], bool] | None,
    ) -> tuple[bytes, dict[int, str]]:
        """The outcomes of ``rows`` (the first of them only, when ``stop_at`` passes during a
        bisection: at least one)."""
        slot = self._checkout(key, current)
        try:
            worker = slot.worker
            if worker is None or not worker.alive or worker.spun_idle:
                if worker is not None:  # died, or worked, between batches: the program's doing
                    why = (
                        "the worker died between batches"
                        if not worker.alive
                        else "the worker spun between batches"
                    )
                    worker.kill()
                    self._set(key, slot, None)
                    self._killed(key, WorkerDied(why), counters)
                worker = self._start(key, source, counters)
                if not self._set(key, slot, worker):
                    raise ProgramForgotten(f"{key} was replaced or removed")
            try:
                result = worker.evaluate(rows)
                return result.codes, {first + i: text for i, text in result.errors.items()}
            except WorkerDied as died:
                self._set(key, slot, None)
                self._killed(key, died, counters, alone=len(rows) == 1)
                if len(rows) == 1:
                    return bytes([wire.ERROR]), {first: died.reason}
        finally:
            slot.lock.release()
        half = len(rows) // 2  # bisect to the message that kills it; the others keep their results
        left = self._run(key, source, rows[:half], first, counters, stop_at=stop_at, current=current)
        if len(left[0]) < half or (stop_at is not None and time.monotonic() >= stop_at):
            return left  # each kill costs a worker's start: the rest waits for the next read
        right = self._run(key, source, rows[half:], first + half, counters, stop_at=stop_at, current=current)
        return left[0] + right[0], {**left[1], **right[1]}

    def _start(self, key: ProgramKey, source: str, counters: Counters) -> Worker:
        recent = len(counters.kills)
        if recent > 2:  # back off a program that keeps killing its workers
            time.sleep(min(0.05 * 2 ** (recent - 3), 2.0))
        if self._closed:
            raise ProgramSuspended("the broker is stopping")
        counters.restarts += 1
        try:
            return Worker(source, self.limits, self._workdir)
        except WorkerDied as died:  # did not start (overloaded host, a crash): counted, not fatal
            self._killed(key, died, counters)
            raise

    def _killed(self, key: ProgramKey, died: WorkerDied, counters: Counters, *, alone: bool = True) -> None:
        """Count a worker's death. Toward suspension count the deaths on one message (``alone``: a
        message the bisection isolated, or a worker that did not start), so that one poisoned
        message costs one, however large its batch; the bisection's own kills count too, but only
        :data:`BISECTION_KILLS_PER_FAILURE` of them make one (a program that only dies on batches)."""
        now = time.monotonic()
        for kills, counted in ((counters.kills, alone), (counters.all_kills, True)):
            if counted:
                kills.append(now)
            while kills and kills[0] < now - FAILURE_WINDOW_S:
                kills.popleft()
        counters.timeouts += died.timed_out
        counters.last_error = died.reason
        _log.warning("filter program of %s on %s (v%d): %s", key.group, key.topic, key.version, died.reason)
        failures = max(len(counters.kills), len(counters.all_kills) // BISECTION_KILLS_PER_FAILURE)
        if failures >= self.limits.max_failures:
            why = (
                f"suspended after {len(counters.all_kills)} worker kills within a minute "
                f"({len(counters.kills)} on single messages); the last: {died.reason}"
            )
            self._suspended[key] = why
            _log.error("filter program of %s on %s (v%d) %s", key.group, key.topic, key.version, why)
            raise ProgramSuspended(why)

    def _checkout(self, key: ProgramKey, current: Callable[[], bool] | None) -> _Slot:
        """A slot of the program, locked: an idle one; else a new one while there is room (idle
        workers of the least recently used other programs make room); else its first, once free;
        a program with none waits up to :data:`ROOM_WAIT_S` for room (``max_workers`` holds, trial
        runs of new programs included), then :class:`WorkerDied` (the batch is tried again later).
        :class:`ProgramForgotten` when ``current`` says the program is no longer in force."""
        deadline = time.monotonic() + ROOM_WAIT_S
        with self._room:
            while True:
                if current is not None and not current():
                    raise ProgramForgotten(f"{key} was replaced or removed")
                slots = self._workers.setdefault(key, [])
                self._workers.move_to_end(key)
                for slot in slots:
                    if slot.lock.acquire(blocking=False):
                        return slot
                if self._make_room(key):
                    slot = _Slot()
                    slot.lock.acquire()
                    slots.append(slot)
                    return slot
                if slots:
                    waited = slots[0]
                    break
                left = deadline - time.monotonic()
                if left <= 0 or self._closed:
                    if not slots:
                        self._workers.pop(key, None)
                    raise NoWorkerFree(f"no filter worker free: all {self.max_workers} are busy")
                self._room.wait(min(left, 0.05))  # the lock is let go meanwhile
        waited.lock.acquire()
        return waited

    def _make_room(self, key: ProgramKey) -> bool:
        """With the pool lock held: whether one more worker fits, after stopping, if needed, an
        idle worker of another program (least recently used first)."""
        if sum(len(slots) for slots in self._workers.values()) < self.max_workers:
            return True
        for other, slots in list(self._workers.items()):
            if other == key:
                continue
            for slot in slots:
                if slot.lock.acquire(blocking=False):
                    try:
                        if slot.worker is not None:
                            slot.worker.kill()
                        slots.remove(slot)
                    finally:
                        slot.lock.release()
                    if not slots:
                        del self._workers[other]
                    return True
        return False

    def _set(self, key: ProgramKey, slot: _Slot, worker: Worker | None) -> bool:
        """Put ``worker`` in ``slot``; a program forgotten meanwhile does not get its slot back
        (its new worker is stopped: False)."""
        with self._lock:
            if slot in self._workers.get(key, ()):
                slot.worker = worker
                return True
        if worker is not None:
            worker.kill()
        return False

    def forget(self, key: ProgramKey) -> None:
        """A program replaced or removed: its workers go, its suspension and counters with it."""
        with self._lock:
            slots = self._workers.pop(key, [])
            self._suspended.pop(key, None)
            self._counters.pop(key, None)
        self._stop(slots)

    def close(self) -> None:
        self._closed = True
        with self._lock:
            slots = [slot for program in self._workers.values() for slot in program]
            self._workers.clear()
        self._stop(slots)
        try:
            os.chmod(self._workdir, 0o700)
            os.rmdir(self._workdir)
        except OSError:
            pass

    @staticmethod
    def _stop(slots: list[_Slot]) -> None:
        for slot in slots:
            with slot.lock:  # after the batch in it, if one is running
                if slot.worker is not None:
                    slot.worker.kill()
