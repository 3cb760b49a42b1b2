"""Frames between the broker and a filter worker, over two pipes.

A frame is a 4-byte big-endian length, a 1-byte kind and the payload. The broker sends ``L``
(load: the program) and ``B`` (a batch of message rows, ``marshal``-encoded: the worker trusts the
broker). A worker answers ``K`` (loaded), ``E`` (could not load: why, UTF-8) or ``R`` (a result:
one code per message, then the error texts as JSON). The broker trusts nothing a worker says:
:func:`parse_result` checks every length, code and index, and a frame past its bound is an error.
"""

from __future__ import annotations

import json
import os
import select
import struct
import time
from dataclasses import dataclass
from typing import Final

LOAD, BATCH = b"L", b"B"
LOADED, LOAD_FAILED, RESULT = b"K", b"E", b"R"
REJECT, MATCH, ERROR = 0, 1, 2
MAX_ERROR_TEXT: Final = 500  # characters of one error a worker may report
#: Bytes of one error in a result, at most: its index and text, every character JSON-escaped.
MAX_ERROR_TEXT_BYTES: Final = MAX_ERROR_TEXT * 12 + 32
MAX_WORKER_FRAME: Final = 8 * 1024 * 1024
HEADER: Final = struct.Struct(">IB")  # length (kind and payload), kind


class WireError(Exception):
    """The other side broke the protocol, closed its pipe, or missed the deadline."""

    def __init__(self, message: str, *, timed_out: bool = False) -> None:
        super().__init__(message)
        self.timed_out = timed_out


def frame(kind: bytes, payload: bytes) -> bytes:
    return HEADER.pack(len(payload) + 1, kind[0]) + payload


def send(fd: int, data: bytes, deadline: float) -> None:
    """Write all of ``data`` to a non-blocking ``fd`` by ``deadline`` (monotonic seconds)."""
    view = memoryview(data)
    while view:
        _wait(fd, select.POLLOUT, deadline)
        try:
            view = view[os.write(fd, view) :]
        except BlockingIOError:
            continue
        except (BrokenPipeError, OSError) as exc:
            raise WireError(f"the worker's pipe is closed ({exc.strerror})") from exc


def receive(fd: int, deadline: float, max_bytes: int = MAX_WORKER_FRAME) -> tuple[bytes, bytes]:
    """One frame from a non-blocking ``fd``: (kind, payload)."""
    header = _read_exactly(fd, HEADER.size, deadline)
    length, kind = HEADER.unpack(header)
    if not 1 <= length <= max_bytes:
        raise WireError(f"a frame of {length:,} bytes (at most {max_bytes:,})")
    return bytes([kind]), _read_exactly(fd, length - 1, deadline)


def _read_exactly(fd: int, n: int, deadline: float) -> bytes:
    parts: list[bytes] = []
    while n > 0:
        _wait(fd, select.POLLIN, deadline)
        try:
            chunk = os.read(fd, min(n, 1 << 20))
        except BlockingIOError:
            continue
        if not chunk:
            raise WireError("the worker closed its pipe")
        parts.append(chunk)
        n -= len(chunk)
    return b"".join(parts)


def _wait(fd: int, event: int, deadline: float) -> None:
    left = deadline - time.monotonic()
    if left <= 0:
        raise WireError("the worker missed its deadline", timed_out=True)
    poller = select.poll()
    poller.register(fd, event | select.POLLERR | select.POLLHUP)
    if not poller.poll(left * 1000):
        raise WireError("the worker missed its deadline", timed_out=True)


@dataclass(frozen=True, slots=True)
class Result:
    codes: bytes  # one of REJECT, MATCH, ERROR per message
    errors: dict[int, str]  # index -> "Type: message" for the ERROR ones


def encode_result(codes: bytes, errors: dict[int, str]) -> bytes:
    texts = json.dumps([[i, t[:MAX_ERROR_TEXT]] for i, t in errors.items()]).encode()
    return struct.pack(">I", len(codes)) + codes + texts


def printable(text: str) -> str:
    """``text`` with control characters and lone surrogates as ``?``: an error text becomes a
    property of the dead-letter copy, which a stored property may not hold."""
    return "".join(c if c.isprintable() and not 0xD800 <= ord(c) <= 0xDFFF else "?" for c in text)


def parse_result(payload: bytes, expected: int) -> Result:
    """A worker's result for a batch of ``expected`` messages; raises :class:`WireError` for anything
    else (wrong count, unknown code, an error without its text or out of range)."""
    if len(payload) < 4:
        raise WireError("a result frame too short to hold its count")
    (n,) = struct.unpack_from(">I", payload)
    if n != expected or len(payload) < 4 + n:
        raise WireError(f"a result for {n} messages; {expected} were sent")
    codes = payload[4 : 4 + n]
    if codes.translate(None, b"\x00\x01\x02"):
        raise WireError("a result code that is not reject, match or error")
    texts = payload[4 + n :]
    if len(texts) > codes.count(ERROR) * MAX_ERROR_TEXT_BYTES + 2:  # parsed by the broker: bounded
        raise WireError("error texts longer than the failed messages may have")
    try:
        listed = json.loads(texts.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise WireError("error texts that are not JSON") from exc
    errors: dict[int, str] = {}
    if not isinstance(listed, list):
        raise WireError("error texts that are not a list")
    for item in listed:
        if (
            not isinstance(item, list) or len(item) != 2 or type(item[0]) is not int  # (not a bool)
            or not isinstance(item[1], str) or not 0 <= item[0] < n or codes[item[0]] != ERROR
        ):  # fmt: skip
            raise WireError("an error text for a message that did not fail")
        errors[item[0]] = printable(item[1][:MAX_ERROR_TEXT])
    if sum(1 for c in codes if c == ERROR) != len(errors):
        raise WireError("a failed message without its error text")
    return Result(codes, errors)
