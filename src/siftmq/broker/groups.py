"""Consumer groups: message model, subscription-consistency policy and the group's subscription table.

RocketMQ keeps one subscription per group and topic; the newest heartbeat wins, and the messages
only the other members' expressions would match are lost (seed 004). siftmq keeps the table too,
with the clients holding each entry, and a policy per group:

* ``strict`` (default): a client whose subscription of a topic differs from what the group's live
  members hold (another expression, another type, or another set of topics) is refused with
  ``PRECONDITION_FAILED`` naming the group, the topic, both expressions and the holders. Once the
  holders are gone, the new subscription is accepted.
* ``compat``: RocketMQ's newest-wins. The group's entry is replaced, every member is then served by
  it, and each such override is logged and counted (``inconsistencies``).

A group's message model is ``clustering`` (members share the queues and the progress) or
``broadcasting`` (every member gets every message; progress is per client). Both, and the policy,
are kept in ``config/groups.json`` with the table's versioned entries.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from siftmq.errors import BadRequestError, BrokerError, FilterError, StatusCode
from siftmq.filter import compile_filter
from siftmq.store.statefile import read_json, write_json

_log = logging.getLogger(__name__)

MODES: Final = ("clustering", "broadcasting")
#: Called with (group, old mode, new mode) before a group's switch takes effect.
ModeSwitch = Callable[[str, str, str], None]
POLICIES: Final = ("strict", "compat")


#: How each kind of consumer takes messages: receives (the group's progress) or pulls (its offsets).
_CONSUMING: Final = {"SIMPLE_CONSUMER": "receive", "PUSH_CONSUMER": "receive", "PULL_CONSUMER": "pull"}


class SubscriptionConflictError(BrokerError):
    """A client's subscription differs from the one its group's live members hold (strict groups)."""

    code = "PRECONDITION_FAILED"


@dataclass(slots=True)
class GroupSubscription:
    """The group's entry for one topic: filter kind, normalized expression, version, live holders."""

    topic: str
    kind: str
    expression: str
    version: int
    holders: set[str] = field(default_factory=set)
    pinned: bool = False  # set through the admin API: members cannot replace it
    # an entry loaded at start-up counts as held until its members had time to come back
    restored_until: float = 0.0

    def describe(self) -> str:
        return f"{self.kind} {self.expression!r}"


@dataclass(slots=True)
class GroupInfo:
    name: str
    mode: str = "clustering"
    consistency: str = "strict"
    subscriptions: dict[str, GroupSubscription] = field(default_factory=dict)
    inconsistencies: int = 0
    last_inconsistency: str | None = None
    last_inconsistency_topic: str | None = None  # the topic it concerns: who may read it is asked
    dropped: int = 0  # messages a compat group's members lost to the group's subscription


class GroupManager:
    """All groups. Thread-safe; persisted on change."""

    def __init__(
        self,
        config_dir: Path,
        *,
        compat_groups: Iterable[str] = (),
        broadcasting_groups: Iterable[str] = (),
        restore_grace_s: float = 30.0,
        max_groups: int = 10_000,
    ) -> None:
        self._path = config_dir / "groups.json"
        self._max_groups = max_groups
        self._lock = threading.Lock()
        self._groups: dict[str, GroupInfo] = {}
        for name, item in read_json(self._path, {}).items():
            info = GroupInfo(name, item.get("mode", "clustering"), item.get("consistency", "strict"))
            for topic, sub in item.get("subscriptions", {}).items():
                info.subscriptions[topic] = GroupSubscription(
                    topic,
                    sub["kind"],
                    _renormalized(sub["kind"], sub["expression"]),
                    int(sub["version"]),
                    pinned=bool(sub.get("pinned")),
                    restored_until=time.monotonic() + restore_grace_s,
                )
            self._groups[name] = info
        for name in compat_groups:  # the operator's own: whatever max_groups says
            self._groups.setdefault(name, GroupInfo(name)).consistency = "compat"
        for name in broadcasting_groups:
            self._groups.setdefault(name, GroupInfo(name)).mode = "broadcasting"

    def _ensure(self, group: str) -> GroupInfo:
        """The group's entry, made if new. Every group costs memory and its share of each write of
        the groups and progress files (a new group's first read writes both whole): one more than
        ``max_groups`` is refused."""
        info = self._groups.get(group)
        if info is None:
            if len(self._groups) >= self._max_groups:
                raise BadRequestError(
                    f"cannot create consumer group {group!r}: the broker holds {len(self._groups)} groups, "
                    "its max_groups; delete groups that are no longer used or raise max_groups",
                    status=StatusCode.PRECONDITION_FAILED,
                )
            info = self._groups[group] = GroupInfo(group)
        return info

    def register(self, group: str) -> None:
        """Make ``group`` known, as its first read would, for state other than a subscription that
        is kept under its name (a pull consumer's committed offsets): that state costs what a
        group's does, so it counts toward ``max_groups`` and one more group is refused alike."""
        if group in self._groups:
            return
        with self._lock:
            if group not in self._groups:
                self._ensure(group)
                try:
                    self._save_locked()  # its offsets outlive a restart: so must its place in the count
                except BaseException:
                    # not written, not made: the commit is refused and the next one tries again
                    del self._groups[group]
                    raise

    def adopt(self, names: Iterable[str]) -> None:
        """Know the groups whose progress or offsets the broker loaded though the groups file lacks
        them (a group made by a declared message model alone is not written; a data directory may
        hold commits of groups that were never read): their state is a group's, so they count
        toward ``max_groups`` and are never refused a commit of their own. Loaded state, like the
        file's: whatever max_groups says."""
        with self._lock:
            for name in names:
                self._groups.setdefault(name, GroupInfo(name))

    def get(self, group: str) -> GroupInfo | None:
        return self._groups.get(group)

    def all(self) -> list[GroupInfo]:
        with self._lock:
            return sorted(self._groups.values(), key=lambda g: g.name)

    def mode(self, group: str) -> str:
        info = self._groups.get(group)
        return info.mode if info is not None else "clustering"

    # ------------------------------------------------------------------------------- subscriptions

    def claim(
        self,
        group: str,
        client_id: str,
        topic: str,
        *,
        kind: str,
        expression: str,
        live: set[str],
        from_settings: bool,
    ) -> GroupSubscription:
        """``client_id`` subscribes ``topic`` with ``kind``/``expression`` (normalized): check and record.

        ``live`` is the set of the group's live client ids; ``from_settings`` tells a client's
        declared subscription (Telemetry settings) from the filter of one request. Raises
        :class:`SubscriptionConflictError` in a strict group whose live members hold another
        expression. Returns the entry that filters the group's messages: in compat groups the newest
        declared one (a request with another filter does not replace it, as RocketMQ's table is only
        written by heartbeats).
        """
        with self._lock:
            return self._claim_locked(
                group,
                client_id,
                topic,
                kind=kind,
                expression=expression,
                live=live,
                from_settings=from_settings,
            )

    def claim_held(
        self, group: str, client_id: str, topic: str, *, kind: str, expression: str, live: set[str]
    ) -> GroupSubscription | None:
        """A request's :meth:`claim` of the subscription the group holds on ``topic`` already, or
        None (nothing done) when it holds another or none: such a claim records nothing, so it
        writes no file; nor does it wait for the lock, which a change holds while it saves the
        groups (None then too): what an event loop may call."""
        if not self._lock.acquire(blocking=False):
            return None
        try:
            info = self._groups.get(group)
            held = info.subscriptions.get(topic) if info is not None else None
            if held is None or (held.kind, held.expression) != (kind, expression):
                return None
            return self._claim_locked(
                group, client_id, topic, kind=kind, expression=expression, live=live, from_settings=False
            )
        finally:
            self._lock.release()

    def _claim_locked(
        self,
        group: str,
        client_id: str,
        topic: str,
        *,
        kind: str,
        expression: str,
        live: set[str],
        from_settings: bool,
    ) -> GroupSubscription:
        info = self._ensure(group)
        current = info.subscriptions.get(topic)
        if current is not None:
            current.holders &= live | {client_id}
        same = current is not None and (current.kind, current.expression) == (kind, expression)
        restored = current is not None and current.restored_until > time.monotonic()
        unheld = (
            current is not None
            and not current.pinned
            and not restored
            and not (current.holders - {client_id})
        )
        if current is None or same or unheld:
            if not same:
                version = current.version + 1 if current is not None else 1
                current = info.subscriptions[topic] = GroupSubscription(topic, kind, expression, version)
                self._save_locked()
            assert current is not None
            current.holders.add(client_id)
            return current
        others = sorted(current.holders - {client_id})
        if current.pinned:
            holder_text = "set through the admin API"
        elif others:
            holder_text = f"held by {', '.join(others)}"
        else:
            holder_text = "held by its members from before the broker restarted, who have not come back yet"
        what = (
            f"group {group!r} subscribes topic {topic!r} with {current.describe()} ({holder_text}), "
            f"but client {client_id or '<anonymous>'} asks for {kind} {expression!r}"
        )
        if info.consistency == "strict":
            raise SubscriptionConflictError(
                f"inconsistent subscription: {what}. Members of one group must subscribe alike; "
                "use another group, stop the other members, or set the group to compat"
            )
        if info.last_inconsistency != what:
            info.inconsistencies += 1
            info.last_inconsistency, info.last_inconsistency_topic = what, topic
            _log.warning("compat group %s: one subscription per group, messages may be lost: %s", group, what)
        if from_settings and not current.pinned:  # RocketMQ: the newest heartbeat wins
            holders = current.holders | {client_id}
            current = info.subscriptions[topic] = GroupSubscription(
                topic, kind, expression, current.version + 1, holders
            )
            self._save_locked()
        return current

    def check_topics(
        self, group: str, client_id: str, topics: set[str], members: dict[str, set[str]]
    ) -> None:
        """Strict groups: the client's set of topics must equal every other live member's."""
        info = self._groups.get(group)
        if info is None or info.consistency != "strict":
            return
        for other, their_topics in sorted(members.items()):
            if other != client_id and their_topics and their_topics != topics:
                raise SubscriptionConflictError(
                    f"inconsistent subscription: group {group!r} member {other} subscribes topics "
                    f"{sorted(their_topics)}, but client {client_id or '<anonymous>'} subscribes "
                    f"{sorted(topics)}. Members of one group must subscribe the same topics"
                )

    def check_kinds(self, group: str, client_id: str, client_type: str, members: dict[str, str]) -> None:
        """Strict clustering groups: a pull consumer and a receiving (simple or push) consumer are not
        live members at once. Receives keep the group's progress and pulls its committed offsets, each
        moving on its own, so both kinds would be handed every message. ``members``: the live
        members' client types by client id."""
        info = self._groups.get(group)
        if info is None or info.consistency != "strict" or info.mode != "clustering":
            return
        way = _CONSUMING.get(client_type)
        if way is None:
            return
        for other, their_type in sorted(members.items()):
            theirs = _CONSUMING.get(their_type)
            if other != client_id and theirs is not None and theirs != way:
                raise SubscriptionConflictError(
                    f"inconsistent subscription: group {group!r} member {other} consumes by {theirs} "
                    f"({their_type}), but client {client_id or '<anonymous>'} consumes by {way} "
                    f"({client_type}). Members of one clustering group must consume the same way; "
                    "use another group for the other way"
                )

    def release(self, group: str, client_id: str) -> None:
        """Forget ``client_id`` as a holder of the group's entries (after a refused subscription)."""
        with self._lock:
            info = self._groups.get(group)
            for entry in info.subscriptions.values() if info is not None else ():
                entry.holders.discard(client_id)

    def note_dropped(self, group: str, count: int) -> None:
        with self._lock:
            self._ensure(group).dropped += count

    def subscription(self, group: str, topic: str) -> GroupSubscription | None:
        info = self._groups.get(group)
        return None if info is None else info.subscriptions.get(topic)

    # --------------------------------------------------------------------------------------- admin

    def configure(
        self,
        group: str,
        *,
        mode: str | None = None,
        consistency: str | None = None,
        live_clients: int = 0,
        on_switch: ModeSwitch | None = None,
    ) -> GroupInfo:
        """Change a group's message model or consistency policy. ``on_switch(group, old, new)``
        runs before a change of model takes effect (under the table's lock: no other switch meets it)."""
        if mode is not None and mode not in MODES:
            raise BadRequestError(f"mode must be one of {', '.join(MODES)}, not {mode!r}")
        if consistency is not None and consistency not in POLICIES:
            raise BadRequestError(f"consistency must be one of {', '.join(POLICIES)}, not {consistency!r}")
        with self._lock:
            info = self._ensure(group)
            if mode is not None and mode != info.mode and live_clients:
                raise BadRequestError(
                    f"group {group!r} has {live_clients} live client(s); stop them before switching it "
                    f"from {info.mode} to {mode}",
                    status=StatusCode.PRECONDITION_FAILED,
                )
            if mode is not None:
                if on_switch is not None and mode != info.mode:
                    on_switch(group, info.mode, mode)
                info.mode = mode
            if consistency is not None:
                info.consistency = consistency
            self._save_locked()
            return info

    def declare_mode(
        self, group: str, mode: str, client_id: str, *, live: set[str], on_switch: ModeSwitch | None = None
    ) -> None:
        """A consumer declares the message model it consumes with (RocketMQ's heartbeat does too).

        All members of a group share one model: a declaration that differs from the group's is
        refused while other members are live, and switches the (persisted) model when none is.
        """
        if mode not in MODES:
            raise BadRequestError(f"message model must be one of {', '.join(MODES)}, not {mode!r}")
        with self._lock:
            info = self._ensure(group)
            if info.mode == mode:
                return
            others = sorted(live - {client_id})
            if others:
                raise SubscriptionConflictError(
                    f"group {group!r} consumes in {info.mode} mode with {len(others)} live member(s) "
                    f"({', '.join(others[:5])}); client {client_id!r} declared {mode}: all members of a "
                    "group must use one message model"
                )
            _log.info("group %s switched from %s to %s by client %s", group, info.mode, mode, client_id)
            if on_switch is not None:
                on_switch(group, info.mode, mode)
            info.mode = mode
            self._save_locked()

    def set_subscription(self, group: str, topic: str, kind: str, expression: str) -> GroupSubscription:
        """Set the group's subscription of ``topic`` deliberately (a new version, for every member)."""
        with self._lock:
            info = self._ensure(group)
            current = info.subscriptions.get(topic)
            version = current.version + 1 if current is not None else 1
            entry = info.subscriptions[topic] = GroupSubscription(
                topic, kind, expression, version, pinned=True
            )
            self._save_locked()
            return entry

    def delete(self, group: str) -> bool:
        """Forget ``group`` (its mode, policy and subscriptions); False if it was not known."""
        with self._lock:
            if self._groups.pop(group, None) is None:
                return False
            self._save_locked()
            return True

    def drop_topic(self, topic: str) -> list[str]:
        """Forget every group's subscription of a deleted ``topic``; returns the groups that had one."""
        with self._lock:
            had = [g.name for g in self._groups.values() if g.subscriptions.pop(topic, None) is not None]
            if had:
                self._save_locked()
            return had

    def _save_locked(self) -> None:
        write_json(
            self._path,
            {
                g.name: {
                    "mode": g.mode,
                    "consistency": g.consistency,
                    "subscriptions": {
                        t: {
                            "kind": s.kind,
                            "expression": s.expression,
                            "version": s.version,
                            "pinned": s.pinned,
                        }
                        for t, s in g.subscriptions.items()
                    },
                }
                for g in self._groups.values()
            },
        )


def _renormalized(kind: str, expression: str) -> str:
    """A stored expression in today's normalized form: a release that renders a filter differently
    (prefix chains lost their parentheses) must not see a returning member's unchanged
    subscription as a different one."""
    try:
        return compile_filter(kind, expression).normalized
    except FilterError:
        return expression  # kept as it is: compared as text, as before
