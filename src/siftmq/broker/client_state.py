"""Per-client progress of broadcasting groups, dropped once its client is gone for good.

In a broadcasting group every client has its own progress (``group@client_id`` in the consumer
state and the pull offsets). Clients come and go — a redeployed service gets new client ids — so
without an end that state grows for ever. :class:`ClientStateSweeper` drops a client's progress
when no session of it has been seen for ``broadcast_client_expire_s``. A client that comes back
later starts again like a new member. Clustering groups' progress is the group's and never expires.

Last-seen times live in memory: after a restart every client's clock starts again, so state is
kept at least ``broadcast_client_expire_s`` after the broker last saw or started with it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Final

from siftmq.broker.clients import ClientRegistry
from siftmq.broker.consumer_state import ConsumerStateTable
from siftmq.broker.offsets import OffsetTable

_log = logging.getLogger(__name__)

#: joins a group and a client id into the name of the client's own progress (no name may hold it)
CLIENT_SEPARATOR: Final = "@"


def client_progress_group(group: str, client_id: str) -> str:
    return f"{group}{CLIENT_SEPARATOR}{client_id}"


class ClientStateSweeper:
    """Drops broadcasting clients' progress after ``expire_s`` without a session."""

    def __init__(
        self,
        consumers: ConsumerStateTable,
        offsets: OffsetTable,
        clients: ClientRegistry,
        expire_s: float,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._consumers = consumers
        self._offsets = offsets
        self._clients = clients
        self._expire_s = expire_s
        self._monotonic = monotonic
        self._seen: dict[str, float] = {}

    def sweep(self) -> list[str]:
        """Forget the per-client progress of clients unseen for ``expire_s``; returns their names."""
        now = self._monotonic()
        live = {client_progress_group(s.group, s.client_id) for s in self._clients.sessions() if s.group}
        held = {k[0] for k, _ in self._consumers.items() if CLIENT_SEPARATOR in k[0]}
        held |= {k[0] for k, _ in self._offsets.items() if CLIENT_SEPARATOR in k[0]}
        for name in held:
            if name in live or name not in self._seen:
                self._seen[name] = now
        expired = sorted(name for name in held if now - self._seen[name] > self._expire_s)
        if expired:
            gone = set(expired)
            queues = self._consumers.remove_where(lambda key: key[0] in gone)
            queues += self._offsets.remove_where(lambda key: key[0] in gone)
            for name in expired:
                del self._seen[name]
            _log.info(
                "dropped the progress of %d broadcasting client(s) unseen for %.0f s (%d queue entries): %s",
                len(expired),
                self._expire_s,
                queues,
                ", ".join(expired[:10]) + (" ..." if len(expired) > 10 else ""),
            )
        for name in set(self._seen) - held:
            del self._seen[name]
        return expired
