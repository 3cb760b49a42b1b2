"""SQL92 filter registrations and the bitmap dispatcher (RocketMQ's ConsumerFilterManager + CalcBitMap).

When a group subscribes a topic with SQL92 the broker registers the expression under the bloom key
``group#topic``. At dispatch, every registration of a record's topic is evaluated — all records of a
batch at once with ``matches_batch`` — and each matching registration's bloom bits are OR-ed into
the record's bitmap (stored in its ConsumeQueueExt unit).

A registration has a version (bumped when the group's expression changes) and a born time, no
earlier than the store timestamp of any record stored before it (the store keeps the largest across
restarts, so a wall clock that stepped back cannot move a born time before older records): bitmaps
of records stored before it say nothing about it, so those records are evaluated exactly (see
:class:`~siftmq.broker.message_filters.SqlMessageFilter`). Registrations are kept in
``config/filters.json`` and dropped ``expire_s`` after the group was last seen alive.

The offline ``backfill`` Spark job (``siftmq spark backfill``) computes a registration's bits for the
records stored before its born time and records ``backfilled_until_ms`` in ``filters.json``; its
bitmaps are then trusted for records stored up to that time too. The file format and the trust rule
are in :mod:`siftmq.filter.registrations`, which the jobs share.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Final

import numpy as np

from siftmq.broker.message_filters import SqlMessageFilter
from siftmq.broker.stats import FilterStats
from siftmq.errors import BadRequestError, StatusCode
from siftmq.filter import BloomFilter, CompiledFilter, compile_filter
from siftmq.filter.registrations import Registration, read_entries, with_backfill
from siftmq.store import DispatchRequest
from siftmq.store.statefile import read_json, write_json

_log = logging.getLogger(__name__)
_NEVER = 1 << 62
#: SQL92 registrations a topic holds at most: every one is evaluated on each record the topic
#: stores (its bloom bits), so new group names without end (a registration stays 24 h after its
#: group was last seen) must not slow every send of the topic without end
MAX_REGISTRATIONS_PER_TOPIC: Final = 512
MAX_REGISTRATIONS: Final = 10_000  # all topics together
_LOGGED_EXPRESSION: Final = 200  # characters of an expression in the log line
_RECORD_FIELDS = tuple(f.name for f in fields(Registration))


@dataclass(frozen=True, slots=True, kw_only=True)
class FilterRegistration(Registration):
    """One ``group#topic`` SQL92 registration, with its bloom bit positions and compiled expression."""

    positions: tuple[int, ...]
    compiled: CompiledFilter

    def message_filter(self, stats: FilterStats | None = None) -> SqlMessageFilter:
        return SqlMessageFilter(
            self.compiled,
            self.positions,
            self.born_time_ms,
            stats,
            backfilled_until_ms=self.backfilled_until_ms,
        )


class FilterRegistry:
    """The broker's SQL92 registrations; implements the store's ``BitmapDispatcher``. Thread-safe."""

    def __init__(
        self,
        config_dir: Path,
        bloom: BloomFilter,
        *,
        expire_s: float,
        latest_store_time: Callable[[], int] = lambda: 0,
    ) -> None:
        self.bloom = bloom
        #: the largest store timestamp any record has had (the store's ``max_store_timestamp``)
        self.latest_store_time = latest_store_time
        self._path = config_dir / "filters.json"
        self._expire_ms = int(expire_s * 1000)
        self._lock = threading.Lock()
        self._by_key: dict[tuple[str, str], FilterRegistration] = {}
        self._by_topic: dict[str, tuple[FilterRegistration, ...]] = {}
        self._dirty = False
        self._removal_unsaved = False  # a removal the file may not show yet (its write failed)
        records, problems = read_entries(read_json(self._path, []))
        for problem in problems:
            _log.error("%s: %s", self._path, problem)
        for record in records:
            reg = self._make(record)
            self._by_key[(reg.group, reg.topic)] = reg
        self._reindex_locked()

    # ------------------------------------------------------------------------------------ registering

    def _make(self, record: Registration) -> FilterRegistration:
        return FilterRegistration(
            **{f: getattr(record, f) for f in _RECORD_FIELDS},
            positions=tuple(self.bloom.bit_positions(record.bloom_key)),
            compiled=compile_filter("SQL92", record.expression),
        )

    def register(self, group: str, topic: str, compiled: CompiledFilter) -> FilterRegistration:
        """Register (or refresh) ``group``'s SQL92 expression on ``topic``; returns the registration."""
        now = _now_ms()
        key = (group, topic)
        with self._lock:
            current = self._by_key.get(key)
            if current is not None and current.expression == compiled.normalized:
                if now - current.last_seen_ms > 1000:
                    self._by_key[key] = replace(current, last_seen_ms=now)
                    self._dirty = True
                return self._by_key[key]
            if current is None:
                self._check_room_locked(group, topic)
            version = current.version + 1 if current is not None else 1
            # Until its born time is set below, no bitmap is trusted for this registration.
            reg = FilterRegistration(
                group=group,
                topic=topic,
                expression=compiled.normalized,
                version=version,
                born_time_ms=_NEVER,
                last_seen_ms=now,
                positions=tuple(self.bloom.bit_positions(f"{group}#{topic}")),
                compiled=compiled,
            )
            self._put_locked(reg)
            # The born time is read after the registration is visible to the dispatcher, so every
            # record stored later gets this registration's bits; and it is no earlier than any
            # record stored so far, so a record that did not get them is never trusted to have
            # them, even when the wall clock has stepped back since it was stored.
            reg = replace(reg, born_time_ms=max(_now_ms(), self.latest_store_time()))
            self._put_locked(reg)
            if current is None and not self._removal_unsaved:
                # a new group's registration is written with the next sweep (every 10 s) or the
                # stop: lost to a crash, it is made again at the group's next heartbeat, with a
                # later born time (nothing is trusted that should not be); writing the whole file
                # for each made a churn of new groups quadratic. Not while the file may still hold
                # a removed registration of the key: reloaded, its old born time would be trusted
                self._dirty = True
            else:
                self._save_locked()
        shown = (
            reg.expression
            if len(reg.expression) <= _LOGGED_EXPRESSION
            else reg.expression[:_LOGGED_EXPRESSION] + "..."
        )
        _log.info("registered SQL92 filter v%d for %s#%s: %s", reg.version, group, topic, shown)
        return reg

    def _check_room_locked(self, group: str, topic: str) -> None:
        on_topic = len(self._by_topic.get(topic, ()))
        if on_topic >= MAX_REGISTRATIONS_PER_TOPIC or len(self._by_key) >= MAX_REGISTRATIONS:
            where = (
                f"topic {topic!r} holds {on_topic} SQL92 filter registrations, its limit"
                if on_topic >= MAX_REGISTRATIONS_PER_TOPIC
                else f"the broker holds {len(self._by_key)} SQL92 filter registrations, its limit"
            )
            raise BadRequestError(
                f"cannot register group {group!r}'s SQL92 filter: {where} (a registration goes "
                "filter_registration_expire_s after its group was last seen; delete groups no longer "
                "used, or subscribe by TAG)",
                status=StatusCode.PRECONDITION_FAILED,
            )

    def get(self, group: str, topic: str) -> FilterRegistration | None:
        return self._by_key.get((group, topic))

    def record_backfill(self, group: str, topic: str, *, version: int, until_ms: int) -> FilterRegistration:
        """Record that every record of ``topic`` stored up to ``until_ms`` has the bits of version
        ``version`` of ``group``'s registration (the backfill job calls this once they are installed).

        Raises as :func:`~siftmq.filter.registrations.with_backfill` does.
        """
        with self._lock:
            reg = with_backfill(
                self._by_key.get((group, topic)), group, topic, version=version, until_ms=until_ms
            )
            self._by_key[(group, topic)] = reg
            self._reindex_locked()
            self._save_locked()
        _log.info("recorded backfill of %s#%s v%d up to %d", group, topic, version, until_ms)
        return reg

    def all(self) -> list[FilterRegistration]:
        with self._lock:
            return sorted(self._by_key.values(), key=lambda r: (r.group, r.topic))

    def touch_group(self, group: str, now_ms: int | None = None) -> None:
        """Record that ``group`` has a live consumer (keeps its registrations from expiring)."""
        self.touch_groups({group}, now_ms)

    def touch_groups(self, groups: set[str], now_ms: int | None = None) -> None:
        """:meth:`touch_group` for each of ``groups``, in one pass over the registrations."""
        now = now_ms if now_ms is not None else _now_ms()
        with self._lock:
            touched = False
            for key, reg in list(self._by_key.items()):
                if reg.group in groups and now - reg.last_seen_ms > 1000:
                    self._by_key[key] = replace(reg, last_seen_ms=now)
                    touched = True
            if touched:
                self._dirty = True
                self._reindex_locked()

    def expire(self, now_ms: int | None = None) -> list[FilterRegistration]:
        """Drop registrations whose group was last seen more than ``expire_s`` ago; returns them."""
        now = now_ms if now_ms is not None else _now_ms()
        with self._lock:
            gone = [r for r in self._by_key.values() if now - r.last_seen_ms > self._expire_ms]
            for reg in gone:
                del self._by_key[(reg.group, reg.topic)]
                _log.info(
                    "dropped SQL92 filter of %s#%s (no consumer for %d s)",
                    reg.group,
                    reg.topic,
                    (now - reg.last_seen_ms) // 1000,
                )
            if gone:
                self._reindex_locked()
                self._removal_unsaved = self._dirty = True  # written again until a write works
                self._save_locked()
            elif self._dirty:
                self._save_locked()
        return gone

    def remove_where(self, doomed: Callable[[FilterRegistration], bool]) -> list[FilterRegistration]:
        """Drop the registrations ``doomed`` accepts (a deleted topic's or group's); returns them."""
        with self._lock:
            gone = [reg for reg in self._by_key.values() if doomed(reg)]
            for reg in gone:
                del self._by_key[(reg.group, reg.topic)]
            if gone:
                self._reindex_locked()
                self._removal_unsaved = self._dirty = True  # written again until a write works
                self._save_locked()
        return gone

    @property
    def path(self) -> Path:
        """The file it is kept in."""
        return self._path

    def save(self) -> None:
        with self._lock:
            self._save_locked()

    def _put_locked(self, reg: FilterRegistration) -> None:
        """Set one registration, and its topic's in the dispatcher's index (not every topic's)."""
        key = (reg.group, reg.topic)
        self._by_key[key] = reg
        others = tuple(r for r in self._by_topic.get(reg.topic, ()) if (r.group, r.topic) != key)
        self._by_topic[reg.topic] = (*others, reg)

    def _reindex_locked(self) -> None:
        by_topic: dict[str, list[FilterRegistration]] = {}
        for reg in self._by_key.values():
            by_topic.setdefault(reg.topic, []).append(reg)
        self._by_topic = {t: tuple(regs) for t, regs in by_topic.items()}

    def _save_locked(self) -> None:
        write_json(self._path, [r.to_entry() for r in self._by_key.values()])
        self._dirty = self._removal_unsaved = False

    # ----------------------------------------------------------------------------------- dispatching

    def compute_bitmaps(self, requests: Sequence[DispatchRequest]) -> list[bytes | None]:
        """One bitmap per request: the bits of every registration of its topic that matches it."""
        out: list[bytes | None] = [None] * len(requests)
        by_topic = self._by_topic
        if not by_topic:
            return out
        rows_by_topic: dict[str, list[int]] = {}
        for i, req in enumerate(requests):
            if req.topic in by_topic:
                rows_by_topic.setdefault(req.topic, []).append(i)
        size = self.bloom.bitmap_size
        for topic, rows in rows_by_topic.items():
            regs = by_topic[topic]
            props = [requests[i].properties for i in rows]
            # a vectorized call costs ~60 us however few its rows: small batches go row by row
            bitmaps = (_bitmaps_by_row if len(rows) < VECTOR_MIN_ROWS else _bitmaps_vectorized)(
                regs, props, size
            )
            for i, bitmap in zip(rows, bitmaps, strict=True):
                out[i] = bitmap
        return out


#: Dispatch batches with fewer rows of a topic are evaluated row by row (the scalar backend, ~0.3 us a
#: row) instead of through pyarrow (a fixed ~60 us a call); both backends agree (tests/filter).
VECTOR_MIN_ROWS = 128


def _failed(reg: FilterRegistration) -> None:
    """A filter bug must not stop dispatch: the caller sets the bits, so reads evaluate exactly."""
    _log.exception("evaluating %s#%s at dispatch failed", reg.group, reg.topic)


def _bitmaps_by_row(
    regs: Sequence[FilterRegistration], rows: Sequence[Mapping[str, str]], size: int
) -> list[bytes]:
    """Bitmaps of a few rows through the scalar backend."""
    out = []
    for props in rows:
        bitmap = bytearray(size)
        for reg in regs:
            try:
                hit = reg.compiled.matches(props)
            except Exception:
                _failed(reg)
                hit = True
            if hit:
                for p in reg.positions:
                    bitmap[p >> 3] |= 1 << (p & 7)
        out.append(bytes(bitmap))
    return out


def _bitmaps_vectorized(
    regs: Sequence[FilterRegistration], rows: Sequence[Mapping[str, str]], size: int
) -> list[bytes]:
    """Bitmaps of many rows: one pyarrow evaluation per registration."""
    names = set().union(*(r.compiled.properties for r in regs))
    batch = {name: [props.get(name) for props in rows] for name in names}
    bits = np.zeros((len(rows), size), dtype=np.uint8)
    for reg in regs:
        try:
            if reg.compiled.properties:
                matched = reg.compiled.matches_batch(batch)
            else:
                # reads no property (TRUE, 1 = 1): one answer for every row. Through the batch it
                # would meet no column, hence no row, and its rows would get no bit: lost to it
                matched = np.full(len(rows), bool(reg.compiled.matches({})), dtype=np.bool_)
            if len(matched) != len(rows):
                raise ValueError(f"{len(matched)} results for {len(rows)} rows")
        except Exception:
            _failed(reg)
            matched = np.ones(len(rows), dtype=np.bool_)
        if not matched.any():
            continue
        for p in reg.positions:
            bits[matched, p >> 3] |= np.uint8(1 << (p & 7))
    flat = bits.tobytes()  # one copy, then a bytes slice per row (cheaper than a numpy row each)
    return [flat[j * size : (j + 1) * size] for j in range(len(rows))]


def _now_ms() -> int:
    return time.time_ns() // 1_000_000
