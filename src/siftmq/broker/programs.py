"""Filter programs: consumers' own ``match(message)`` code, per (group, topic), run by the filter
server (:mod:`siftmq.filterserver`) on the messages a read is about to deliver.

A program is versioned and kept in ``<data_dir>/config/programs.json``. A read hands it the
messages that passed the group's TAG/SQL92 filter; it keeps those ``match`` accepts. A message on
which ``match`` fails (an exception, a result that is not a bool, a worker it kills) is not lost:
the reader moves it to ``%DLQ%<group>`` with a ``FILTER_ERROR`` property. A program that is
suspended (it killed its workers too often) or failed (it no longer loads) delivers nothing and
its group's progress stays where it is, until a new version is registered.
"""

from __future__ import annotations

import functools
import itertools
import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Final, Literal

from siftmq.broker.model import filter_error_text
from siftmq.errors import BadRequestError, ConfigError, NotFoundError, StatusCode, UnsupportedError
from siftmq.filterserver.message import NAME_VALUE, SEPARATOR, UNIQ_KEY, Row, row
from siftmq.filterserver.pool import (
    Counters,
    FilterServer,
    Limits,
    NoWorkerFree,
    ProgramForgotten,
    ProgramKey,
    ProgramLoadError,
    ProgramSuspended,
    Verdict,
    WorkerDied,
)
from siftmq.filterserver.program import ProgramError, check_program
from siftmq.filterserver.sandbox import SandboxUnavailable, check_supported
from siftmq.filterserver.wire import ERROR, MATCH
from siftmq.store import RawRecord
from siftmq.store.statefile import read_json, write_json

_log = logging.getLogger(__name__)

Status = Literal["active", "suspended", "failed"]
MAX_PROGRAMS: Final = 1000
# A read through a program asks the store for want / (the share it keeps) messages, with a margin,
# within these bounds: one evaluation batch instead of many shrinking ones for a selective program.
MAX_READ_AHEAD: Final = 1024
MAX_LEFT_OVER: Final = 4096  # queues whose read-ahead verdicts are kept for their next read
#: the error texts kept with them, all queues together (a failed message's text is also cut to
#: what its dead-letter copy keeps): past it the oldest queues' verdicts go (asked again)
MAX_LEFT_OVER_TEXT: Final = 16 * 1024 * 1024
#: trial runs of programs being registered have workers of their own, at most this many: a
#: registration (a program whose module code takes seconds, say) never takes a read's worker
MAX_TRIAL_WORKERS: Final = 2
# A read's time in its program, after which the rest of its records wait for the next read: a
# program slow on a batch (or bisected to a poisoned message) does not hold a consumer's call past
# its client's deadline. Checked between the chunks sent to the worker.
READ_BUDGET_S: Final = 1.0
READ_AHEAD_MARGIN: Final = 1.25
MIN_KEPT_SHARE: Final = 1 / 64
FIRST_KEPT_SHARE: Final = 0.25  # before the program's first batch: read 4x (at most 3x wasted, once)


@dataclass
class Program:
    group: str
    topic: str
    version: int
    sha256: str
    source: str
    registered_ms: int
    status: Status = "active"
    last_error: str = ""

    @property
    def key(self) -> ProgramKey:
        return ProgramKey(self.group, self.topic, self.version)


@dataclass(frozen=True, slots=True)
class Filtered:
    """What a program made of a read's records: one code per record (:data:`MATCH`, ``REJECT`` or
    ``ERROR``; the first records only, when the read's time ran out), and why for the errors, by
    index. ``held`` when the program runs no more: deliver nothing and keep the progress."""

    codes: bytes
    errors: dict[int, str]
    held: bool = False
    version: int = 0  # of the program that made them


#: what a read left over for a queue's next one: the program version, the verdicts by queue offset
#: (code, error text), and the characters of those texts
LeftOver = tuple[int, dict[int, tuple[int, str]], int]
_UNIQ_KEY_FIRST: Final = f"{UNIQ_KEY}{NAME_VALUE}".encode()
_UNIQ_KEY_LATER: Final = f"{SEPARATOR}{UNIQ_KEY}{NAME_VALUE}".encode()


def row_of(record: RawRecord, topic: str, queue_id: int) -> Row:
    """The wire row of a stored record (the worker decodes it)."""
    stored = record.properties
    has_id = stored.startswith(_UNIQ_KEY_FIRST) or _UNIQ_KEY_LATER in stored
    fallback_id = "" if has_id else record.offset_msg_id
    return (topic, queue_id, record.queue_offset, stored, record.body, fallback_id,
            record.born_timestamp, record.store_timestamp)  # fmt: skip


class ProgramRegistry:
    """The programs in force and the filter server that runs them. Thread-safe."""

    def __init__(self, config_dir: Path, limits: Limits, workers: int) -> None:
        self._path = config_dir / "programs.json"
        self._lock = threading.Lock()
        self._programs: dict[tuple[str, str], Program] = {}
        for item in read_json(self._path, []):
            try:
                program = Program(**item)
            except TypeError as exc:
                raise ConfigError(f"{self._path}: a filter program entry is not understood: {exc}") from exc
            self._programs[(program.group, program.topic)] = program
        self._limits, self._workers = limits, workers
        self._server: FilterServer | None = None
        self._trial_server: FilterServer | None = None
        self._trials = itertools.count(1)
        self._registering: set[tuple[str, str]] = set()
        self._kept_share: dict[tuple[str, str], float] = {}  # of the messages evaluated, lately
        # per (group, topic, queue): what a read got past its batch (see LeftOver)
        self._left_over: dict[tuple[str, str, int], LeftOver] = {}
        self._left_over_chars = 0  # of all their error texts
        # per (group, topic, queue): the program version and the run of queue offsets whose failures
        # are in the dead-letter topic already (a pull that seeks back reads them again)
        self._dead_lettered: dict[tuple[str, str, int], tuple[int, int, int]] = {}
        if self._programs and self.unavailable:
            _log.error("filter programs are registered but cannot run here: %s", self.unavailable)

    @functools.cached_property
    def unavailable(self) -> str:
        """Why programs cannot be sandboxed here ("" when they can). Asked only once a program
        exists: loading libseccomp costs a broker without programs ~50 ms of start-up."""
        try:
            check_supported()
        except SandboxUnavailable as exc:
            return str(exc)
        return ""

    def _filter_server(self, *, trial: bool = False) -> FilterServer:
        if self.unavailable:
            raise UnsupportedError(f"the filter server cannot run here: {self.unavailable}")
        with self._lock:
            if trial:
                if self._trial_server is None:
                    self._trial_server = FilterServer(self._limits, MAX_TRIAL_WORKERS)
                return self._trial_server
            if self._server is None:
                self._server = FilterServer(self._limits, self._workers)
            return self._server

    # ------------------------------------------------------------------------------- registration

    def register(self, group: str, topic: str, source: str, sample: list[Row]) -> Program:
        """Check ``source``, load it in the sandbox and run it on ``sample``; then it is the
        (group, topic)'s program, a version above the one it replaces."""
        checked = check_program(source)
        trials = self._filter_server(trial=True)  # UnsupportedError where programs cannot run
        with self._lock:
            if (group, topic) in self._registering:
                raise BadRequestError(
                    f"a filter program of {group!r} on {topic!r} is being registered; try again once it is",
                    status=StatusCode.PRECONDITION_FAILED,
                )
            self._registering.add((group, topic))
        try:
            return self._register(group, topic, source, sample, checked.sha256, trials=trials)
        finally:
            with self._lock:
                self._registering.discard((group, topic))

    def _register(
        self, group: str, topic: str, source: str, sample: list[Row], sha256: str, *, trials: FilterServer
    ) -> Program:
        old = self._programs.get((group, topic))
        version = (old.version if old else 0) + 1
        if old is None and len(self._programs) >= MAX_PROGRAMS:
            raise BadRequestError(f"the broker holds {MAX_PROGRAMS} filter programs, its limit")
        trial = ProgramKey(group, topic, -next(self._trials))  # never a key reads use
        try:
            verdict = trials.evaluate(trial, source, sample) if sample else None
            if verdict is None:
                # loads it; the result on an empty message is not looked at (it need not make sense of one)
                trials.evaluate(trial, source, [row(topic=topic)])
        except ProgramLoadError as exc:
            raise ProgramError(f"the program failed to load: {exc}") from exc
        except ProgramSuspended as exc:
            raise ProgramError(f"the program kept killing its worker: {exc}") from exc
        except NoWorkerFree as exc:  # other registrations hold the trial workers: not the program's fault
            raise BadRequestError(
                f"other filter programs are being registered ({exc.reason}); try again shortly",
                status=StatusCode.TOO_MANY_REQUESTS,
            ) from exc
        except WorkerDied as exc:
            raise ProgramError(f"the program's worker did not start: {exc.reason}") from exc
        finally:
            trials.forget(trial)
        if verdict is not None and verdict.errors:
            raise ProgramError(f"match failed on the sample message: {next(iter(verdict.errors.values()))}")
        program = Program(group, topic, version, sha256, source, int(time.time() * 1000))
        with self._lock:
            self._programs[(group, topic)] = program
            self._save_locked()
        if old is not None and self._server is not None:
            self._server.forget(old.key)
        _log.info("filter program of %s on %s: version %d (%s)", group, topic, version, sha256[:12])
        return program

    def remove(self, group: str, topic: str) -> None:
        if not self.remove_where(lambda p: (p.group, p.topic) == (group, topic)):
            raise NotFoundError(f"group {group!r} has no filter program on {topic!r}")

    def remove_where(self, predicate: Callable[[Program], bool]) -> list[Program]:
        """Remove every program ``predicate`` accepts (a deleted group's or topic's), with what
        reads kept of them: a program registered later starts at version 1 again, and must not
        take the verdicts the removed one left over. Returns those removed."""
        with self._lock:
            gone = [p for p in self._programs.values() if predicate(p)]
            if not gone:
                return []
            for program in gone:
                del self._programs[(program.group, program.topic)]
                self._kept_share.pop((program.group, program.topic), None)
            pairs = {(p.group, p.topic) for p in gone}
            for queue in [q for q in self._left_over if (q[0], q[1]) in pairs]:
                self._drop_left_over(queue)
            # a program registered again starts at version 1 again, over queue offsets from 0
            for queue in [q for q in self._dead_lettered if (q[0], q[1]) in pairs]:
                del self._dead_lettered[queue]
            self._save_locked()
        if self._server is not None:
            for program in gone:
                self._server.forget(program.key)
        return gone

    def counters(self, program: Program) -> dict[str, int]:
        """What the program's workers did since the broker started (or the version was registered)."""
        return (self._server.counters(program.key) if self._server else Counters()).as_dict()

    def report(self, group: str, topic: str) -> dict[str, Any]:
        program = self._programs.get((group, topic))
        if program is None:
            raise NotFoundError(f"group {group!r} has no filter program on {topic!r}")
        counters = self.counters(program)
        return {"group": group, "topic": topic, "version": program.version, "sha256": program.sha256,
                "status": program.status, "last_error": program.last_error,
                "registered_ms": program.registered_ms, "counters": counters,
                "source": program.source}  # fmt: skip

    def all(self) -> list[Program]:
        return list(self._programs.values())

    # ---------------------------------------------------------------------------------- reads

    def holds(self, group: str, topic: str) -> bool:
        """Whether ``group`` has a program on ``topic``."""
        return (group, topic) in self._programs

    def read_size(self, group: str, topic: str, want: int) -> int | None:
        """How many messages to read for ``want`` deliverable ones through the group's program:
        more, by the share it has been keeping (None: the group has no program on ``topic``)."""
        if (group, topic) not in self._programs:
            return None
        share = self._kept_share.get((group, topic), FIRST_KEPT_SHARE)
        return min(max(want, math.ceil(want / share * READ_AHEAD_MARGIN)), MAX_READ_AHEAD)

    def apply(self, group: str, topic: str, queue_id: int, records: list[RawRecord]) -> Filtered | None:
        """The program's verdict on records of ``topic``/``queue_id`` (None: the group has no
        program on the topic). Verdicts a read left over (:meth:`leave`) are used, not asked again:
        a message that kills its worker costs its kills once. The verdicts may stop short of the
        records (:data:`READ_BUDGET_S`): the first record without one ends what the read may pass."""
        program = self._programs.get((group, topic))
        if program is None:
            return None
        if program.status != "active" or self.unavailable:
            return Filtered(b"", {}, held=True)
        with self._lock:
            left = self._drop_left_over((group, topic, queue_id))
        known = left[1] if left is not None and left[0] == program.version else {}
        todo = [r for r in records if r.queue_offset not in known]
        fresh: dict[int, int] = {}  # queue offset -> index in the worker's answer
        verdict = Verdict(b"", {})
        if todo:
            try:
                verdict = self._filter_server().evaluate(
                    program.key,
                    program.source,
                    [row_of(r, topic, queue_id) for r in todo],
                    budget_s=READ_BUDGET_S,
                    current=lambda: self._programs.get((group, topic)) is program,
                )
            except ProgramForgotten:  # replaced or removed meanwhile: the next read uses what is in force
                return Filtered(b"", {}, held=True)
            except ProgramSuspended as exc:
                self._set_status(program, "suspended", str(exc))
                return Filtered(b"", {}, held=True)
            except ProgramLoadError as exc:
                self._set_status(program, "failed", f"the program no longer loads: {exc}")
                return Filtered(b"", {}, held=True)
            except WorkerDied as exc:  # no worker could start this time: held for now, tried again later
                _log.warning("filter program of %s on %s: %s; its group waits", group, topic, exc.reason)
                return Filtered(b"", {}, held=True)
            share = max(verdict.codes.count(MATCH) / len(verdict.codes), MIN_KEPT_SHARE)
            old = self._kept_share.get((group, topic), share)
            weight = len(verdict.codes) / (len(verdict.codes) + 256)
            self._kept_share[(group, topic)] = old + (share - old) * weight
            if not known:  # the usual read: the worker's answer, as it is
                return Filtered(verdict.codes, verdict.errors, version=program.version)
            fresh = {todo[i].queue_offset: i for i in range(len(verdict.codes))}
        codes = bytearray()
        errors: dict[int, str] = {}
        for r in records:  # after a read left verdicts over: those, then the worker's
            if r.queue_offset in known:
                code, why = known[r.queue_offset]
            elif r.queue_offset in fresh:
                i = fresh[r.queue_offset]
                code, why = verdict.codes[i], verdict.errors.get(i, "")
            else:  # not evaluated within the read's budget
                break
            if code == ERROR:
                errors[len(codes)] = why
            codes.append(code)
        return Filtered(bytes(codes), errors, version=program.version)

    def leave(
        self, group: str, topic: str, queue_id: int, version: int, verdicts: dict[int, tuple[int, str]]
    ) -> None:
        """Keep the verdicts a read got past its batch (by queue offset) from the program's
        ``version`` for the queue's next read (not when another version is in force by now)."""
        program = self._programs.get((group, topic))
        if program is None or program.version != version:
            return
        verdicts = {o: (code, filter_error_text(why)) for o, (code, why) in verdicts.items()}
        text = sum(len(why) for _code, why in verdicts.values())
        queue = (group, topic, queue_id)
        with self._lock:
            self._drop_left_over(queue)
            while self._left_over and (
                len(self._left_over) >= MAX_LEFT_OVER or self._left_over_chars + text > MAX_LEFT_OVER_TEXT
            ):
                self._drop_left_over(next(iter(self._left_over)))  # the oldest
            self._left_over[queue] = (version, verdicts, text)
            self._left_over_chars += text

    def dead_lettered(self, group: str, topic: str, queue_id: int, version: int) -> range:
        """The queue offsets whose failures under ``version`` are in the dead-letter topic already
        (one run of them, the one reads last extended)."""
        mark = self._dead_lettered.get((group, topic, queue_id))
        return range(mark[1], mark[2]) if mark is not None and mark[0] == version else range(0)

    def note_dead_lettered(self, group: str, topic: str, queue_id: int, version: int, read: range) -> None:
        """A read of ``read`` (queue offsets) dead-lettered every failure in it: it joins the run
        it meets, or starts a new one (a pull that sought elsewhere: what lies between was not read)."""
        if not read:
            return
        queue = (group, topic, queue_id)
        with self._lock:
            run = self.dead_lettered(*queue, version)
            start, stop = read.start, read.stop
            if run and start <= run.stop and run.start <= stop:
                start, stop = min(start, run.start), max(stop, run.stop)
            self._dead_lettered.pop(queue, None)
            if len(self._dead_lettered) >= MAX_LEFT_OVER:
                self._dead_lettered.pop(next(iter(self._dead_lettered)))  # the oldest
            self._dead_lettered[queue] = (version, start, stop)

    def _drop_left_over(
        self, queue: tuple[str, str, int]
    ) -> tuple[int, dict[int, tuple[int, str]], int] | None:
        """With the lock held: forget (and return) the verdicts ``queue``'s last read left over."""
        left = self._left_over.pop(queue, None)
        if left is not None:
            self._left_over_chars -= left[2]
        return left

    def _set_status(self, program: Program, status: Status, error: str) -> None:
        with self._lock:
            if self._programs.get((program.group, program.topic)) is not program:
                return  # replaced meanwhile
            program.status, program.last_error = status, error
            self._save_locked()
        _log.error("filter program of %s on %s (v%d) %s: %s", program.group, program.topic,
                   program.version, status, error)  # fmt: skip

    def _save_locked(self) -> None:
        write_json(self._path, [asdict(p) for p in self._programs.values()])

    def close(self) -> None:
        for server in (self._server, self._trial_server):
            if server is not None:
                server.close()


def check_sample(raw: Any) -> Row:
    """A sample message sent to the admin API: ``{"body", "tag", "keys", "properties"}``."""
    if not isinstance(raw, dict):
        raise BadRequestError("sample must be an object with body, tag, keys and properties")
    body, tag = raw.get("body", ""), raw.get("tag")
    properties, keys = raw.get("properties", {}), raw.get("keys", [])
    if not isinstance(body, str) or len(body) > 1 << 20:
        raise BadRequestError("sample.body must be a string of at most 1 MiB")
    if tag is not None and not isinstance(tag, str):
        raise BadRequestError("sample.tag must be a string")
    if not isinstance(properties, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in properties.items()
    ):
        raise BadRequestError("sample.properties must map strings to strings")
    if not isinstance(keys, list) or not all(isinstance(k, str) for k in keys):
        raise BadRequestError("sample.keys must be a list of strings")
    try:
        return row(
            topic="",
            body=body.encode(),
            tag=tag,
            keys=tuple(keys),
            properties=properties,
            message_id="sample",
        )
    except ValueError as exc:
        raise BadRequestError(f"sample: {exc}") from exc
