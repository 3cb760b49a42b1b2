"""Bounds on the admin HTTP server's connections: a slow client cannot hold them for ever, nor a
large one fill the broker's memory.

uvicorn times out idle keep-alive connections but not a request that arrives slowly: its
keep-alive timer restarts on every byte, so a client trickling a header a byte at a time (or
connecting and sending nothing) holds a connection as long as it likes (Slowloris). The protocol
here gives every request a deadline, from its first byte (or the connection's opening) until its
body is complete; a request not received by then is dropped with one log line. A request larger
than :data:`MAX_REQUEST_BYTES` (head and body) is answered 413 and its connection closed as its
bytes arrive, before anything buffers it. Responses, however long, are not limited.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

_log = logging.getLogger(__name__)

_RECEIVED = (h11.DONE, h11.MUST_CLOSE, h11.CLOSED, h11.ERROR, h11.SWITCHED_PROTOCOL)
#: The largest admin request (its largest real one, a user's ACL of 10,000 entries, is ~1 MB).
MAX_REQUEST_BYTES = 2 * 1024 * 1024
_TOO_LARGE = (
    b"HTTP/1.1 413 Content Too Large\r\ncontent-type: application/json\r\nconnection: close\r\n"
    b"content-length: %d\r\n\r\n%s"
)


def deadline_protocol(receive_timeout_s: float) -> type[H11Protocol]:
    """uvicorn's h11 protocol with a ``receive_timeout_s`` deadline on receiving each request."""

    class DeadlineH11Protocol(H11Protocol):
        _deadline: asyncio.TimerHandle | None = None
        _request_bytes = 0  # of the request being received

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            self._arm()

        def data_received(self, data: bytes) -> None:
            if self._deadline is None and self.conn.their_state is h11.IDLE:
                self._arm()  # the first byte of the next request on a kept-alive connection
                self._request_bytes = 0
            self._request_bytes += len(data)
            if self._request_bytes > MAX_REQUEST_BYTES:
                self._too_large()
                return
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

        def _too_large(self) -> None:
            self._disarm()
            if not self.transport.is_closing():
                body = json.dumps(
                    {"error": "REQUEST_TOO_LARGE", "message": f"a request may have {MAX_REQUEST_BYTES} bytes"}
                ).encode()
                self.transport.write(_TOO_LARGE % (len(body), body))
                self.transport.close()

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
