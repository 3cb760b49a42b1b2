"""Client sessions: who is connected, as which kind of client, in which group, subscribing what.

Sessions are keyed by the client id every RocketMQ 5 client sends (``x-mq-client-id``). They are
refreshed by Telemetry settings, heartbeats and data calls, and expire ``expire_s`` after the last
sign of life or at once on NotifyClientTermination.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

from siftmq.broker.model import Subscription


@dataclass(slots=True)
class ClientSession:
    client_id: str
    client_type: str = "UNSPECIFIED"
    group: str | None = None
    address: str = ""
    refused: str | None = None  # why its declared subscription was refused (strict groups)
    # the group and topics of its last declared settings, refused or not: a refusal for the set of
    # topics or the way of consuming holds for its receives and pulls until the group accepts them
    declared: tuple[str, frozenset[str]] | None = None
    subscriptions: dict[str, Subscription] = field(default_factory=dict)
    last_seen: float = field(default_factory=time.monotonic)


class ClientRegistry:
    """Live client sessions. Thread-safe.

    Sessions are also kept by group: every receive and pull asks for its group's live members, which
    must not cost a pass over every client of the broker.
    """

    def __init__(self, expire_s: float) -> None:
        self._expire_s = expire_s
        self._lock = threading.Lock()
        self._sessions: dict[str, ClientSession] = {}
        self._by_group: dict[str, dict[str, ClientSession]] = {}

    def touch(
        self,
        client_id: str,
        *,
        client_type: str | None = None,
        group: str | None = None,
        subscriptions: list[Subscription] | None = None,
        address: str | None = None,
    ) -> ClientSession:
        with self._lock:
            session = self._sessions.get(client_id)
            if session is None:
                session = self._sessions[client_id] = ClientSession(client_id)
            session.last_seen = time.monotonic()
            if client_type:
                session.client_type = client_type
            if group and group != session.group:
                self._leave_group_locked(session)
                session.group = group
                self._by_group.setdefault(group, {})[client_id] = session
            if subscriptions is not None:
                session.subscriptions = {s.topic: s for s in subscriptions}
            if address:
                session.address = address
            return session

    def remove(self, client_id: str) -> None:
        with self._lock:
            session = self._sessions.pop(client_id, None)
            if session is not None:
                self._leave_group_locked(session)

    def _leave_group_locked(self, session: ClientSession) -> None:
        members = self._by_group.get(session.group or "")
        if members is not None and members.get(session.client_id) is session:
            del members[session.client_id]
            if not members:
                del self._by_group[session.group or ""]

    def expire(self) -> list[ClientSession]:
        cutoff = time.monotonic() - self._expire_s
        with self._lock:
            gone = [s for s in self._sessions.values() if s.last_seen < cutoff]
            for s in gone:
                del self._sessions[s.client_id]
                self._leave_group_locked(s)
        return gone

    def get(self, client_id: str) -> ClientSession | None:
        return self._sessions.get(client_id)

    def members(self, group: str) -> list[ClientSession]:
        """The group's live sessions (seen within ``expire_s``), by client id."""
        cutoff = time.monotonic() - self._expire_s
        with self._lock:
            live = [s for s in self._by_group.get(group, {}).values() if s.last_seen >= cutoff]
        return sorted(live, key=lambda s: s.client_id)

    def live_ids(self, group: str) -> set[str]:
        cutoff = time.monotonic() - self._expire_s
        with self._lock:
            return {c for c, s in self._by_group.get(group, {}).items() if s.last_seen >= cutoff}

    def live_groups(self) -> set[str]:
        with self._lock:
            return set(self._by_group)

    def sessions(self) -> list[ClientSession]:
        with self._lock:
            return list(self._sessions.values())
