"""Topics: queue counts and permissions, created on first use when allowed, kept in ``config/topics.json``."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path

from siftmq.broker.validation import check_topic
from siftmq.errors import BadRequestError, NotFoundError, StatusCode
from siftmq.store.statefile import read_json, write_json

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
        for name, item in read_json(self._path, {}).items():
            self._topics[name] = TopicConfig(name, int(item["queue_nums"]), int(item.get("perm", 6)))

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
