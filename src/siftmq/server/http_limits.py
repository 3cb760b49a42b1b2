"""Bounds on the admin HTTP server's connections: a slow client cannot hold them for ever.

uvicorn times out idle keep-alive connections but not a request that arrives slowly: its
keep-alive timer restarts on every byte, so a client trickling a header a byte at a time (or
connecting and sending nothing) holds a connection as long as it likes (Slowloris). The protocol
here gives every request a deadline, from its first byte (or the connection's opening) until its
body is complete; a request not received by then is dropped with one log line. Responses, however
long, are not limited.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

_log = logging.getLogger(__name__)

_RECEIVED = (h11.DONE, h11.MUST_CLOSE, h11.CLOSED, h11.ERROR, h11.SWITCHED_PROTOCOL)


def deadline_protocol(receive_timeout_s: float) -> type[H11Protocol]:
    """uvicorn's h11 protocol with a ``receive_timeout_s`` deadline on receiving each request."""

    class DeadlineH11Protocol(H11Protocol):
        _deadline: asyncio.TimerHandle | None = None

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            self._arm()

        def data_received(self, data: bytes) -> None:
            if self._deadline is None and self.conn.their_state is h11.IDLE:
                self._arm()  # the first byte of the next request on a kept-alive connection
            super().data_received(data)
            if self.conn.their_state in _RECEIVED:
                self._disarm()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

        def _arm(self) -> None:
            self._disarm()
            self._deadline = self.loop.call_later(receive_timeout_s, self._expired)

        def _disarm(self) -> None:
            if self._deadline is not None:
                self._deadline.cancel()
                self._deadline = None

        def _expired(self) -> None:
            self._deadline = None
            if not self.transport.is_closing():
                client = f"{self.client[0]}:{self.client[1]}" if self.client else "a client"
                _log.warning(
                    "admin HTTP: %s did not send a whole request within %.0f s; connection closed",
                    client,
                    receive_timeout_s,
                )
                self.transport.close()

    return DeadlineH11Protocol
