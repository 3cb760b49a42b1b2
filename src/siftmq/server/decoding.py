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
from google.protobuf.descriptor import FieldDescriptor

_log = logging.getLogger(__name__)

LOG_INTERVAL_S: Final = 10.0
_MAX_PEERS: Final = 4096  # the rate limiter's memory is bounded too


class Undecodable:
    """What the deserializer gives for bytes that are not the request type."""

    __slots__ = ("error",)

    def __init__(self, error: str) -> None:
        self.error = error


#: Requests from this size on are counted (:func:`wire_elements`) before they are decoded: below
#: it, a request holds at most half as many elements as bytes, ~20 MiB once decoded at the worst.
COUNT_FROM_BYTES: Final = 512 * 1024
#: The elements (fields, repeated items, map entries, packed bytes) a request may hold, nested ones
#: included: the largest batch (1,024 messages of 32 keys and 128 properties each) holds ~175,000.
#: A decoded element costs ~80 bytes, so 12 MiB of empty repeated entries grew to ~500 MiB in the
#: decoder before any count of the handler's was checked.
MAX_ELEMENTS: Final = 320_000
_MAX_DEPTH: Final = 32  # deeper nesting is left to the decoder, which refuses it
_LENGTH_TYPES: Final = frozenset({FieldDescriptor.TYPE_STRING, FieldDescriptor.TYPE_BYTES})


class _Refused(Exception):
    """A request refused on its wire form, before it is decoded (the text says why)."""


class _TooMany(_Refused):
    pass


def tolerant(request_type: Any) -> Callable[[bytes], Any]:
    parse = request_type.FromString
    descriptor = request_type.DESCRIPTOR

    def deserialize(data: bytes) -> Any:
        try:
            if len(data) >= COUNT_FROM_BYTES:
                wire_elements(descriptor, data, MAX_ELEMENTS)
            return parse(data)
        except _TooMany:
            return Undecodable(
                f"the request holds more than {MAX_ELEMENTS:,} fields and repeated items in "
                f"{len(data):,} bytes (a full batch holds fewer)"
            )
        except _Refused as exc:
            return Undecodable(str(exc))
        except (
            Exception
        ) as exc:  # protobuf raises DecodeError, and RuntimeWarning-like errors for some inputs
            return Undecodable(f"{type(exc).__name__}: {exc}"[:300])

    return deserialize


def wire_elements(descriptor: Any, data: bytes, limit: int) -> int:
    """How many elements the protobuf encoding ``data`` of a ``descriptor`` message holds, nested
    messages included; raises ``_TooMany`` as soon as there are more than ``limit``. Reads the
    wire format only (tags and lengths, no values), so the count costs no memory; bytes that are
    not a valid encoding are left for the decoder to refuse."""
    with memoryview(data) as view:
        return limit - _count(view, 0, len(data), descriptor, limit, 0)


def _varint(data: memoryview, pos: int, end: int) -> tuple[int, int]:
    value = shift = 0
    while pos < end:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7
        if shift > 63:
            break
    raise ValueError("not a varint")


_PACKED: Final = object()  # a repeated number field, whose length-delimited form is a packed run
# one element, not looked into: a map entry (a key and a value, decoded as one node), or a message
# with no repeated field at any depth (a field given twice is decoded once: the last wins, or the
# two are merged), which decodes to as much memory however long its encoding
_ONE: Final = object()
_plans: dict[str, dict[int, Any]] = {}


def _plan(descriptor: Any) -> dict[int, Any]:
    """By field number, what a length-delimited field of ``descriptor`` holds: a message (its
    descriptor) or a packed run (:data:`_PACKED`); strings and bytes are left out."""
    plan = _plans.get(descriptor.full_name)
    if plan is None:
        plan = {}
        for number, field in descriptor.fields_by_number.items():
            if field.message_type is not None and (
                field.message_type.GetOptions().map_entry or _flat(field.message_type, frozenset())
            ):
                plan[number] = _ONE
            elif field.message_type is not None:
                plan[number] = field.message_type
            elif field.is_repeated and field.type not in _LENGTH_TYPES:
                plan[number] = _PACKED
        _plans[descriptor.full_name] = plan
    return plan


def _flat(descriptor: Any, within: frozenset[str]) -> bool:
    """Whether ``descriptor`` has no repeated field (nor map) at any depth; ``within``: the types
    on the way to it (a type met again there is recursive, its depth unbounded)."""
    if descriptor.full_name in within:
        return False
    inner = within | {descriptor.full_name}
    return not any(
        field.is_repeated or (field.message_type is not None and not _flat(field.message_type, inner))
        for field in descriptor.fields
    )


def _count(  # noqa: PLR0917 - positional on purpose: it recurses once per nested message
    data: memoryview, pos: int, end: int, descriptor: Any, budget: int, depth: int
) -> int:
    """What is left of ``budget`` after the elements of data[pos:end]."""
    fields = _plan(descriptor)
    try:
        while pos < end:
            key = data[pos]  # one byte for fields 1-15, which are all there are but for a few
            if key < 0x80:
                pos += 1
            else:
                key, pos = _varint(data, pos, end)
            budget -= 1
            if budget < 0:
                raise _TooMany
            wire_type = key & 7
            if wire_type == 0:
                _, pos = _varint(data, pos, end)
            elif wire_type == 1:
                pos += 8
            elif wire_type == 5:
                pos += 4
            elif wire_type == 2:
                size = data[pos] if pos < end else 0x80
                if size < 0x80:
                    pos += 1
                else:
                    size, pos = _varint(data, pos, end)
                held = fields.get(key >> 3)
                if held is _ONE:
                    pass
                elif held is _PACKED:
                    budget -= size  # an element per byte at most
                    if budget < 0:
                        raise _TooMany
                elif held is not None and depth < _MAX_DEPTH and pos + size <= end:
                    budget = _count(data, pos, pos + size, held, budget, depth + 1)
                pos += size
            elif wire_type in (3, 4):  # the decoder would keep them as unknown fields, uncounted
                raise _Refused("the request holds a group field (wire type 3 or 4); proto3 never writes one")
            else:  # garbage: for the decoder to refuse
                return budget
    except ValueError:
        return budget
    return budget


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
