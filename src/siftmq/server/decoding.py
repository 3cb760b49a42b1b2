"""Requests that cannot be decoded are answered, not crashed on.

grpc calls a method's deserializer before the handler runs; a ``DecodeError`` there (garbage
bytes, invalid UTF-8 in a string field) used to escape as ``UNKNOWN`` with a traceback in the log
per call. Here the deserializer never raises: it hands the handler an :class:`Undecodable`, and the
handler's wrapper answers ``INVALID_ARGUMENT`` saying what could not be decoded, logging one line
per client at most every :data:`LOG_INTERVAL_S` (a client sending garbage in a loop must not flood
the log).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import AsyncIterator, Callable
from typing import Any, Final

import grpc

_log = logging.getLogger(__name__)

LOG_INTERVAL_S: Final = 10.0
_MAX_PEERS: Final = 4096  # the rate limiter's memory is bounded too


class Undecodable:
    """What the deserializer gives for bytes that are not the request type."""

    __slots__ = ("error",)

    def __init__(self, error: str) -> None:
        self.error = error


def tolerant(parse: Callable[[bytes], Any]) -> Callable[[bytes], Any]:
    def deserialize(data: bytes) -> Any:
        try:
            return parse(data)
        except (
            Exception
        ) as exc:  # protobuf raises DecodeError, and RuntimeWarning-like errors for some inputs
            return Undecodable(f"{type(exc).__name__}: {exc}"[:300])

    return deserialize


class _LogLimiter:
    """One line per peer per interval; the lines in between are counted and reported with the next."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._last: dict[str, tuple[float, int]] = {}

    def refused(self, peer: str, method: str, error: str) -> None:
        now = time.monotonic()
        with self._lock:
            last, suppressed = self._last.get(peer, (-LOG_INTERVAL_S, 0))
            if now - last < LOG_INTERVAL_S:
                self._last[peer] = (last, suppressed + 1)
                return
            if len(self._last) >= _MAX_PEERS:
                self._last.clear()
            self._last[peer] = (now, 0)
        more = f" ({suppressed} more from this client since the last such line)" if suppressed else ""
        _log.warning(
            "%s from %s: undecodable request, answered INVALID_ARGUMENT: %s%s", method, peer, error, more
        )


_limiter = _LogLimiter()


async def _refuse(context: Any, method: str, request_type: str, error: str) -> None:
    _limiter.refused(str(context.peer() or "?"), method, error)
    await context.abort(
        grpc.StatusCode.INVALID_ARGUMENT, f"{method}: the request is not a valid {request_type} ({error})"
    )


def guard(behaviour: Any, shape: str, method: str, request_type: str) -> Any:
    """``behaviour`` with undecodable requests answered before it runs."""
    if shape == "unary_unary":

        async def unary(request: Any, context: Any) -> Any:
            if type(request) is Undecodable:
                await _refuse(context, method, request_type, request.error)
            return await behaviour(request, context)

        return unary
    if shape == "unary_stream":

        async def server_stream(request: Any, context: Any) -> AsyncIterator[Any]:
            if type(request) is Undecodable:
                await _refuse(context, method, request_type, request.error)
            async for answer in behaviour(request, context):
                yield answer

        return server_stream

    async def bidi(requests: AsyncIterator[Any], context: Any) -> AsyncIterator[Any]:
        async def checked() -> AsyncIterator[Any]:
            async for request in requests:
                if type(request) is Undecodable:
                    await _refuse(context, method, request_type, request.error)
                yield request

        async for answer in behaviour(checked(), context):
            yield answer

    return bidi
