"""The ReputService (RocketMQ's ReputMessageService): appended records indexed in order, in batches.

The store appends under its append lock and hands each put's records here (:meth:`ReputService.add`);
a background thread dispatches them — ConsumeQueue and ext entries, bitmaps, the registered
dispatchers, via :class:`~siftmq.store.dispatch.Reput` — in CommitLog order, under :attr:`lock`
(the dispatch lock). A put that leaves a small backlog is dispatched by the appending thread itself
when the dispatch lock is free (:meth:`ReputService.dispatch_or_wake`): waking the thread and the
GIL hand-offs that follow cost more CPU than indexing a few records (~20-30 us per single send,
measured). Other puts wake the thread; it lets a small backlog grow for up to 1 ms into a
batch, since dispatching costs mostly per batch (a write per queue). Readers that must see every
record appended before they started call :meth:`catch_up`, which dispatches what the thread has
not yet (read-your-writes). In sync flush mode only durable records are dispatched (``limit``).
Arrival listeners are called after each batch, outside the lock, from whichever thread dispatched.
"""

from __future__ import annotations

import collections
import logging
import threading
from collections.abc import Callable, Sequence
from typing import Final

from siftmq.errors import RepeatingFailure, StoreError, as_store_error
from siftmq.store.commitlog import AppendedRecord
from siftmq.store.dispatch import QueueArrival, Reput

_log = logging.getLogger(__name__)

BATCH: Final = 8192  # most records one dispatch round takes
_IDLE_WAIT: Final = 0.5  # seconds the thread sleeps when nobody wakes it
_LINGER: Final = 0.001  # seconds the thread lets a small backlog grow into a batch (RocketMQ: 1 ms)
_SMALL_BACKLOG: Final = 64  # puts pending below which the thread lingers
#: CommitLog bytes pending at most for the appending thread to dispatch them itself (about 60
#: 1 KiB messages: well under a millisecond of indexing on the appender's thread)
INLINE_BACKLOG_BYTES: Final = 64 * 1024

MessageArrivingListener = Callable[[str, int, int], None]
"""Called with ``(topic, queue_id, max_offset)`` when entries were dispatched to that queue."""


class ReputService:
    """Pending appended records, the thread that dispatches them, and catching up on demand."""

    def __init__(self, reput: Reput, limit: Callable[[], int | None], retry_interval_s: float) -> None:
        self.reput = reput
        #: the dispatch lock: held while records are indexed (and by whoever needs the indexes still)
        self.lock = threading.Lock()
        self._limit = limit  # records ending at or before it may be dispatched (None: all)
        self._retry_interval_s = retry_interval_s
        # appended, not yet dispatched: (records, their properties) per put, in CommitLog order
        self._pending: collections.deque[tuple[list[AppendedRecord], list[dict[str, str]]]] = (
            collections.deque()
        )
        self.appended_offset = 0  # end of the last appended record
        self.dispatched_offset = 0  # end of the last dispatched record
        #: why the last dispatch round failed (None once one succeeds); appends refuse meanwhile
        self.error: StoreError | None = None
        self._listeners: list[MessageArrivingListener] = []
        self._stop = threading.Event()
        self._wake = threading.Lock()  # released to wake the thread
        self._thread: threading.Thread | None = None

    # ---------------------------------------------------------------------------------- lifecycle

    def start(self, offset: int) -> None:
        """Start dispatching records appended from CommitLog ``offset`` on (recovery did the rest)."""
        self._pending.clear()
        self.appended_offset = self.dispatched_offset = offset
        self.error = None
        self._stop.clear()
        self._wake.acquire(blocking=False)  # held while the thread may sleep
        self._thread = threading.Thread(target=self._loop, name="siftmq-store-reput", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop the thread (what is still pending stays, for :meth:`dispatch_all`)."""
        self._stop.set()
        self.wake()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    # ------------------------------------------------------------------------------------- appends

    def add(self, records: list[AppendedRecord], properties: list[dict[str, str]]) -> None:
        """Queue one put's records (the caller holds the store's append lock, so in CommitLog order;
        once it is released, :meth:`dispatch_or_wake` or :meth:`wake` has them dispatched)."""
        self._pending.append((records, properties))
        last = records[-1]
        self.appended_offset = last.commit_log_offset + last.size

    def dispatch_or_wake(self) -> None:
        """After a put (outside the append lock): dispatch the pending records on this thread when
        they are few and nobody holds the dispatch lock, else wake the dispatch thread. A failure
        here is left to the thread, which retries it and reports it (the put itself succeeded)."""
        end = self.appended_offset  # what is dispatched here: later puts see to their own records
        if (
            self.error is None
            and end - self.dispatched_offset <= INLINE_BACKLOG_BYTES
            and self.lock.acquire(blocking=False)
        ):
            try:
                limit = self._limit()
                arrivals, _ = self._dispatch_locked(end if limit is None else min(limit, end))
            except Exception:
                _log.debug("dispatch on the appending thread failed; left to the reput thread", exc_info=True)
                arrivals = None
            finally:
                self.lock.release()
            if arrivals is not None:
                if arrivals:
                    self._notify(arrivals)
                return
        self.wake()

    def wake(self) -> None:
        try:
            if self._wake.locked():
                self._wake.release()
        except RuntimeError:  # another thread released it first
            pass

    def behind_bytes(self) -> int:
        """CommitLog bytes appended but not yet dispatched."""
        return max(0, self.appended_offset - self.dispatched_offset)

    # ------------------------------------------------------------------------------------ listeners

    def add_listener(self, listener: MessageArrivingListener) -> None:
        with self.lock:
            self._listeners = [*self._listeners, listener]

    def remove_listener(self, listener: MessageArrivingListener) -> None:
        with self.lock:
            self._listeners = [x for x in self._listeners if x is not listener]

    # ------------------------------------------------------------------------------------ dispatch

    def _loop(self) -> None:
        failures = RepeatingFailure(_log, "dispatch")
        while not self._stop.is_set():
            self._wake.acquire(timeout=_IDLE_WAIT)
            if len(self._pending) < _SMALL_BACKLOG:
                self._stop.wait(_LINGER)
            try:
                while not self._stop.is_set() and self._dispatch_batch(self._limit()):
                    pass
                failures.worked()
                self.error = None
            except Exception as exc:  # keep the thread alive; readers and appenders see the error
                failures.failed(exc)
                self.error = as_store_error(exc)
                self._stop.wait(self._retry_interval_s)

    def _dispatch_batch(self, limit: int | None) -> bool:
        """Dispatch up to one batch ending at or before ``limit``; True if it was full (more may wait)."""
        with self.lock:
            arrivals, count = self._dispatch_locked(limit)
        if arrivals:
            self._notify(arrivals)
        return count >= BATCH

    def dispatch_all(self, limit: int | None, then: Callable[[], None] | None = None) -> None:
        """Dispatch every pending record ending at or before ``limit``; run ``then`` under the lock."""
        arrivals: list[QueueArrival] = []
        try:
            with self.lock:
                while True:
                    batch_arrivals, count = self._dispatch_locked(limit)
                    arrivals += batch_arrivals
                    if count < BATCH:
                        break
                if then is not None:
                    then()
        finally:  # what was indexed before a later batch failed is readable: its waiters are told
            if arrivals:
                self._notify(arrivals)

    def _dispatch_locked(self, limit: int | None) -> tuple[list[QueueArrival], int]:
        """Dispatch up to one batch (the caller holds the lock); returns the arrivals and how many
        records were dispatched. Pending records are removed only once indexed."""
        pending = self._pending
        records: list[AppendedRecord] = []
        properties: list[dict[str, str]] = []
        whole = 0  # leading pending entries taken whole
        part = 0  # records taken from the next one
        while whole < len(pending) and len(records) < BATCH:
            recs, props = pending[whole]
            last = recs[-1]
            if limit is not None and last.commit_log_offset + last.size > limit:
                part = sum(1 for r in recs if r.commit_log_offset + r.size <= limit)
                records += recs[:part]
                properties += props[:part]
                break
            records += recs
            properties += props
            whole += 1
        if not records:
            return [], 0
        try:
            arrivals = self.reput.dispatch_appended(records, properties)
        except OSError as exc:
            raise StoreError(f"writing the consume queue failed: {exc}") from exc
        for _ in range(whole):
            pending.popleft()
        if part:
            recs, props = pending[0]
            pending[0] = (recs[part:], props[part:])
        last = records[-1]
        self.dispatched_offset = last.commit_log_offset + last.size
        return arrivals, len(records)

    def _notify(self, arrivals: Sequence[QueueArrival]) -> None:
        for listener in self._listeners:
            for topic, queue_id, max_offset in arrivals:
                try:
                    listener(topic, queue_id, max_offset)
                except Exception:
                    _log.exception("message arriving listener %r failed", listener)

    def catch_up(self, timeout: float | None = None, *, most_bytes: int | None = None) -> bool:
        """Make every record appended before the call readable (the read-your-writes rule);
        False if ``timeout`` ran out waiting for the lock.

        With ``most_bytes`` (an event loop's call, with ``timeout`` 0): False, having done
        nothing, when more than that much CommitLog is left to index or indexing has been
        failing; it indexes nothing appended after the call, and a failure is left to the reput
        thread (False), as :meth:`dispatch_or_wake` leaves it.
        """
        target = self.appended_offset
        if self.dispatched_offset >= target:
            return True
        limit = self._limit()
        if limit is not None:
            target = min(target, limit)
            if self.dispatched_offset >= target:
                return True
        bounded = most_bytes is not None
        if bounded and (self.error is not None or target - self.dispatched_offset > (most_bytes or 0)):
            return False
        if not self.lock.acquire(timeout=-1 if timeout is None else timeout):
            return False
        arrivals: list[QueueArrival] = []
        try:
            while self.dispatched_offset < target:
                batch_arrivals, count = self._dispatch_locked(target if bounded else limit)
                arrivals += batch_arrivals
                if not count:
                    break
        except Exception:
            if not bounded:
                raise
            _log.debug("catching up on an event loop failed; left to the reput thread", exc_info=True)
            self.wake()
        finally:
            self.lock.release()
        if arrivals:
            self._notify(arrivals)
        return self.dispatched_offset >= target
