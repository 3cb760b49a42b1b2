"""Topics: queue counts and permissions, created on first use when allowed, kept in ``config/topics.json``."""

from __future__ import annotations

import logging
import threading
from collections.abc import Collection, Mapping
from dataclasses import dataclass, replace
from pathlib import Path

from siftmq.broker.validation import check_topic
from siftmq.errors import BadRequestError, NotFoundError, StatusCode
from siftmq.store.statefile import read_state, write_json

_log = logging.getLogger(__name__)

PERM_READ = 4
PERM_WRITE = 2
PERM_READ_WRITE = PERM_READ | PERM_WRITE


@dataclass(frozen=True, slots=True)
class TopicConfig:
    """One topic: its queue count and RocketMQ permission bits (read 4, write 2)."""

    name: str
    queue_nums: int
    perm: int = PERM_READ_WRITE

    @property
    def readable(self) -> bool:
        return bool(self.perm & PERM_READ)

    @property
    def writable(self) -> bool:
        return bool(self.perm & PERM_WRITE)


class TopicManager:
    """The broker's topic table. Thread-safe."""

    def __init__(
        self,
        config_dir: Path,
        *,
        auto_create: bool,
        default_queue_nums: int,
        max_queue_nums: int,
        max_topics: int = 10_000,
    ) -> None:
        self._path = config_dir / "topics.json"
        self._auto_create = auto_create
        self._default_queue_nums = default_queue_nums
        self._max_queue_nums = max_queue_nums
        self._max_topics = max_topics
        self._lock = threading.Lock()
        self._topics: dict[str, TopicConfig] = {}
        saved, source = read_state(self._path, {})
        #: the table is not the one last written (the file was damaged): it may lack topics and
        #: queues added since, or hold topics deleted since (see :meth:`cover`)
        self._stale = source in {"previous", "lost"}
        for name, item in saved.items():
            self._topics[name] = TopicConfig(name, int(item["queue_nums"]), int(item.get("perm", 6)))

    def cover(self, stored: Mapping[str, int], deleted: Collection[str] = ()) -> None:
        """Make the table cover the queues the store holds: ``stored`` maps each topic to the queue
        count its stored queues need (1 + its highest queue id). A queue past its topic's count is
        never sent to nor served, so its acknowledged messages would wait unread for retention:
        the table read at start can be an older generation of the file, or the defaults, when the
        file was damaged. A topic missing gets the count, read-write (its permission was in the
        lost file); a topic with fewer queues gets the count. ``deleted``: topics deleted in the
        store (a tombstone) with no message stored since; an older generation of the table can hold
        them from before their deletion, and they are removed from it then (the file itself is
        believed: a topic created again after its deletion is in it). Each correction is logged and
        the corrected table written; it is in force even if the write fails (the next start finds
        the same from the store)."""
        with self._lock:
            changed = dict(self._topics)
            for name, needed in sorted(stored.items()):
                found = changed.get(name)
                if found is None:
                    changed[name] = TopicConfig(name, needed)
                    _log.error(
                        "%s has no topic %s, but the store holds its queues up to queue %d: restored with %d "
                        "queue(s), read-write (set its permission again if it had another)",
                        self._path,
                        name,
                        needed - 1,
                        needed,
                    )
                elif found.queue_nums < needed:
                    changed[name] = replace(found, queue_nums=needed)
                    _log.error(
                        "%s gives topic %s %d queue(s), but the store holds its queues up to queue %d: "
                        "set to %d, else the messages of queues %d..%d would not be served",
                        self._path,
                        name,
                        found.queue_nums,
                        needed - 1,
                        needed,
                        found.queue_nums,
                        needed - 1,
                    )
            for name in sorted(deleted):
                if self._stale and name in changed and name not in stored:
                    del changed[name]
                    _log.error(
                        "%s was read from an older generation that has topic %s, which was deleted "
                        "since (the store holds none of its messages): removed; create it again if it "
                        "was created again after its deletion",
                        self._path,
                        name,
                    )
            if changed == self._topics:
                return
            try:
                self._save_locked(changed)
            except OSError as exc:
                _log.error(
                    "%s: the corrected topic table could not be written (%s); it is in force, and the "
                    "next start corrects the file again",
                    self._path,
                    exc,
                )
            self._topics = changed

    def get(self, name: str) -> TopicConfig | None:
        """The topic's config, or None."""
        return self._topics.get(name)

    def existing(self, name: str) -> TopicConfig:
        """The topic's config; :class:`NotFoundError` (TOPIC_NOT_FOUND) when there is no such topic."""
        found = self._topics.get(name)
        if found is None:
            raise NotFoundError(f"topic {name!r} does not exist", status=StatusCode.TOPIC_NOT_FOUND)
        return found

    def all(self) -> list[TopicConfig]:
        """Every topic, by name."""
        with self._lock:
            return sorted(self._topics.values(), key=lambda t: t.name)

    def get_or_create(self, name: str, *, for_send: bool = False, system: bool = False) -> TopicConfig:
        """The topic's config; creates it (default queue count) when auto-creation is on or ``system``.

        ``system``: a topic the broker needs for its own work (a group's dead-letter topic, one per
        group at most), created with one queue whatever ``max_topics`` says: a limit that clients'
        topics reach must not stop a group's messages from being moved out of its way.
        """
        found = self._topics.get(name)
        if found is not None:
            return found
        check_topic(name, for_send=for_send)
        if not (self._auto_create or system):
            raise NotFoundError(
                f"topic {name!r} does not exist and auto-creation is off; create it first",
                status=StatusCode.TOPIC_NOT_FOUND,
            )
        if system:
            return self.create(name, 1, exist_ok=True, beyond_limit=True)
        return self.create(name, self._default_queue_nums, exist_ok=True)

    def create(
        self,
        name: str,
        queue_nums: int,
        *,
        perm: int = PERM_READ_WRITE,
        exist_ok: bool = False,
        beyond_limit: bool = False,
    ) -> TopicConfig:
        """Create (or with ``exist_ok`` return) a topic; past ``max_topics`` only ``beyond_limit``
        (the broker's own topics, see :meth:`get_or_create`)."""
        check_topic(name)
        if not 1 <= queue_nums <= self._max_queue_nums:
            raise BadRequestError(f"queue_nums must be in 1..{self._max_queue_nums}, not {queue_nums}")
        with self._lock:
            found = self._topics.get(name)
            if found is not None:
                if exist_ok:
                    return found
                raise BadRequestError(f"topic {name!r} already exists", status=StatusCode.ILLEGAL_TOPIC)
            if len(self._topics) >= self._max_topics and not beyond_limit:
                raise BadRequestError(
                    f"cannot create topic {name!r}: the broker holds {len(self._topics)} topics, its "
                    "max_topics; delete topics or raise max_topics",
                    status=StatusCode.PRECONDITION_FAILED,
                )
            topic = TopicConfig(name, queue_nums, perm)
            self._put_locked(name, topic)
            return topic

    def update(self, name: str, *, queue_nums: int | None = None, perm: int | None = None) -> TopicConfig:
        """Grow a topic's queue count or change its permission (queues are never taken away)."""
        with self._lock:
            found = self._topics.get(name)
            if found is None:
                raise NotFoundError(f"topic {name!r} does not exist", status=StatusCode.TOPIC_NOT_FOUND)
            if queue_nums is not None and not found.queue_nums <= queue_nums <= self._max_queue_nums:
                raise BadRequestError(
                    f"queue_nums can grow from {found.queue_nums} up to {self._max_queue_nums}, not to "
                    f"{queue_nums} (removing queues would strand their messages)"
                )
            if perm is not None and not 0 <= perm <= 7:
                raise BadRequestError(f"perm must be RocketMQ permission bits 0..7, not {perm}")
            topic = TopicConfig(name, queue_nums or found.queue_nums, found.perm if perm is None else perm)
            self._put_locked(name, topic)
            return topic

    def delete(self, name: str) -> None:
        """Forget a topic (its stored messages go with CommitLog retention)."""
        with self._lock:
            if name not in self._topics:
                raise NotFoundError(f"topic {name!r} does not exist", status=StatusCode.TOPIC_NOT_FOUND)
            self._put_locked(name, None)

    def _put_locked(self, name: str, topic: TopicConfig | None) -> None:
        """Set (None: remove) one topic: the table with the change is written first and then put in
        force, so a change the file did not take (a full disk) is never seen (in force but not on
        disk, a grown topic's new queues took messages that a restart no longer served)."""
        changed = dict(self._topics)
        if topic is None:
            del changed[name]
        else:
            changed[name] = topic
        self._save_locked(changed)
        self._topics = changed  # readers look without the lock: one swap, never a half-made table

    def _save_locked(self, topics: dict[str, TopicConfig]) -> None:
        write_json(
            self._path, {t.name: {"queue_nums": t.queue_nums, "perm": t.perm} for t in topics.values()}
        )
