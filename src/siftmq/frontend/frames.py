"""The framed protocol between the gRPC front-ends and the core process, over a Unix socket.

A frame is a 9-byte header — payload length (u32), kind (u8), call id (u32), little-endian — and
the payload. Request and response bodies cross as the protobuf bytes the client sent and the core
answers, so neither side encodes a message twice. Both sides queue the frames they make during one
turn of their event loop and write them together: concurrent clients' calls reach the core as one
read and their answers leave it as one write (the coalescing that makes a front-end cheaper than a
socket per call).
"""

from __future__ import annotations

import asyncio
import json
import logging
import struct
from collections.abc import Callable, Mapping, Sequence
from typing import Final, NamedTuple

_log = logging.getLogger(__name__)

HEADER: Final = struct.Struct("<IBI")

# front-end -> core
HELLO: Final = 1  # payload: the token the core gave the front-end (who may speak on the socket)
READY: Final = 2  # the front-end listens: the core counts these before its ready line
CALL: Final = 3  # a call opens: see encode_call
MESSAGE: Final = 4  # one more request of a client stream
HALF_CLOSE: Final = 5  # the client sends no more requests
CANCEL: Final = 6  # the client went away (or its deadline passed): stop the call
REFUSED: Final = 7  # calls the front-end refused unauthenticated (for the core's metrics and audit log)
USERS_TAKEN: Final = 8  # the front-end checks signatures against the users of this generation (the call id)
TAKEN: Final = 14  # the front-end handed one of a stream's answers to its client: the core may send one more
# core -> front-end
CREDIT: Final = 9  # the core took one request of a client stream: the front-end may send one more
REPLY: Final = 10  # a response (unary: the answer; streams: one item)
END: Final = 11  # a stream's last frame
ABORT: Final = 12  # payload: status code (u8) and details: the call ends with that gRPC status
USERS: Final = 13  # the users' secrets in force (see encode_users): the front-end checks signatures

MAX_CALL_ID: Final = 2**32 - 1
#: Requests of one client stream sent to the core before it has taken them (then one per CREDIT).
STREAM_CREDIT: Final = 4
#: Answers of one stream the core sends before the front-end handed them to its client (then one
#: per TAKEN): gRPC's flow control, carried over, so a client that does not read holds up its own
#: call instead of filling a front-end's memory.
ANSWER_CREDIT: Final = 16
#: ... and at most this many bytes of them (one answer at least, however large): 16 of the largest
#: Telemetry settings answers would be ~9 MB per stream.
ANSWER_CREDIT_BYTES: Final = 1024 * 1024
#: Bytes a CALL frame may add to the largest gRPC message (metadata, address, header).
CALL_ROOM: Final = 64 * 1024
#: The largest frame a front-end takes from the core: a USERS frame of the most users of the
#: longest names and passwords, each character escaped (6 bytes), each password replaced by the
#: last change (~40 MB), fits.
MAX_FROM_CORE: Final = 64 * 1024 * 1024

# method, deadline (ms on CLOCK_MONOTONIC, which every process of the host shares; -1: none),
# peer length, headers, users' generation, signer's name length, the headers' bytes (so that the
# core reads them only when a handler asks: a send never does)
_CALL_HEAD: Final = struct.Struct("<HqHHIHI")
#: in the headers count: the pairs are length-prefixed (binary values), not NUL-joined text
_LENGTH_PREFIXED: Final = 0x8000
MAX_HEADERS: Final = _LENGTH_PREFIXED - 1
_HEADER_LENGTHS: Final = struct.Struct("<HI")
#: The longest metadata key a length-prefixed pair holds (gRPC's own bound is 16 KiB, but holds
#: only once the client has acknowledged the server's settings).
MAX_KEY_BYTES: Final = 0xFFFF
_ABORT_HEAD: Final = struct.Struct("<B")
#: Characters of a refused call's address, client id and reason a REFUSED frame carries at most.
MAX_REFUSED_FIELD: Final = 512
#: Kinds of refusal one REFUSED frame reports at most.
MAX_REFUSED_ENTRIES: Final = 64


class FrameError(Exception):
    """A frame that breaks the protocol (too long, cut short): the connection is closed. A CALL's
    metadata is read later (:func:`decode_headers`): when that fails, the call alone fails."""


class Call(NamedTuple):
    method: int
    #: when the client's deadline passes, in ms of ``time.monotonic()`` (-1: none): absolute, so
    #: that the time a call waits to be read by the core is not added to the client's deadline
    deadline_ms: int
    peer: str
    #: the metadata, still encoded: :func:`decode_headers` reads it
    headers: bytes
    header_count: int
    request: bytes
    #: who signed the call, checked by the front-end against the users of ``generation`` ("": not checked)
    signed_by: str
    generation: int


def encode_call(
    method: int,
    deadline_ms: int,
    peer: str,
    metadata: Sequence[tuple[str, str | bytes]],
    request: bytes,
    *,
    signed_by: str = "",
    generation: int = 0,
) -> bytes:
    """A CALL payload: the method's index, the client's deadline, its address and metadata, who
    signed it (when the front-end checked), and the request as the client sent it (empty for a
    client stream; its requests follow as MESSAGEs)."""
    peer_bytes = peer.encode()
    signer = signed_by.encode()
    count = len(metadata)
    if count > MAX_HEADERS:
        raise FrameError(f"{count} metadata entries exceed {MAX_HEADERS}")
    headers = _text_headers(metadata)
    if headers is None:  # binary values (or a NUL in a text one): each pair with its lengths
        parts: list[bytes] = []
        for key, value in metadata:
            key_bytes = key.encode()
            if len(key_bytes) > MAX_KEY_BYTES:  # a client that sent its headers before the settings
                raise FrameError(f"a metadata key of {len(key_bytes)} bytes exceeds {MAX_KEY_BYTES}")
            value_bytes = value if isinstance(value, bytes) else value.encode()
            parts += [_HEADER_LENGTHS.pack(len(key_bytes), len(value_bytes)), key_bytes, value_bytes]
        headers = b"".join(parts)
        count |= _LENGTH_PREFIXED
    head = _CALL_HEAD.pack(method, deadline_ms, len(peer_bytes), count, generation, len(signer), len(headers))
    return b"".join((head, peer_bytes, signer, headers, request))


def _text_headers(metadata: Sequence[tuple[str, str | bytes]]) -> bytes | None:
    """Text metadata as keys and values joined by NULs (which HTTP/2 header text cannot hold):
    one join to make and one split to read, several times cheaper than a pair at a time."""
    if not metadata:
        return b""
    texts: list[str] = []
    for key, value in metadata:
        if type(value) is not str:
            return None
        texts += (key, value)
    joined = "\x00".join(texts)
    return joined.encode() if joined.count("\x00") == len(texts) - 1 else None


def decode_call(payload: bytes) -> Call:
    """The parts of a CALL payload (raises FrameError when it is cut short); the metadata stays
    encoded until :func:`decode_headers`."""
    try:
        method, deadline_ms, peer_length, count, generation, signer_length, headers_length = (
            _CALL_HEAD.unpack_from(payload)
        )
        at = _CALL_HEAD.size
        peer = payload[at : at + peer_length].decode()
        at += peer_length
        signed_by = payload[at : at + signer_length].decode()
        at += signer_length
        headers = payload[at : at + headers_length]
        at += headers_length
        if at > len(payload):
            raise FrameError("a CALL frame is cut short")
    except (struct.error, UnicodeDecodeError) as exc:
        raise FrameError(f"a CALL frame is malformed: {exc}") from exc
    return Call(method, deadline_ms, peer, headers, count, payload[at:], signed_by, generation)


def decode_headers(block: bytes, count: int) -> tuple[tuple[str, str | bytes], ...]:
    """A CALL's metadata: ``count`` (key, value) pairs (raises FrameError when malformed)."""
    if not count & _LENGTH_PREFIXED:
        try:
            texts = block.decode().split("\x00") if block else []
        except UnicodeDecodeError as exc:
            raise FrameError(f"a CALL frame's metadata is malformed: {exc}") from exc
        if len(texts) != 2 * count:
            raise FrameError(f"a CALL frame's metadata holds {len(texts)} texts for {count} pairs")
        pairs = iter(texts)
        return tuple(zip(pairs, pairs, strict=True))
    count &= ~_LENGTH_PREFIXED
    metadata: list[tuple[str, str | bytes]] = []
    at = 0
    try:
        for _ in range(count):
            key_length, value_length = _HEADER_LENGTHS.unpack_from(block, at)
            at += _HEADER_LENGTHS.size
            key = block[at : at + key_length].decode()
            at += key_length
            raw = block[at : at + value_length]
            at += value_length
            # gRPC's binary headers end in -bin and stay bytes; the others are text
            metadata.append((key, raw if key.endswith("-bin") else raw.decode()))
    except (struct.error, UnicodeDecodeError) as exc:
        raise FrameError(f"a CALL frame's metadata is malformed: {exc}") from exc
    if at != len(block):
        raise FrameError("a CALL frame's metadata does not fill its length")
    return tuple(metadata)


def encode_users(
    generation: int,
    skew_s: float,
    secrets: Mapping[str, str],
    *,
    local_time: bool = False,
    stale: Mapping[str, str] | None = None,
) -> bytes:
    """A USERS payload: what a front-end needs to check signatures, and the secrets the last change
    replaced (a client still signing with one is not guessing). The socket is the core's own, in a
    directory only its user can enter; the payload is never logged."""
    users = {
        "generation": generation,
        "skew_s": skew_s,
        "local_time": local_time,
        "secrets": dict(secrets),
        "stale": dict(stale or {}),
    }
    # UTF-8, not ASCII escapes: a character past the BMP escapes as a 12-byte surrogate pair, and the
    # largest table of such names then exceeded MAX_FROM_CORE (a lone surrogate, which a JSON auth
    # file can hold, passes through)
    return json.dumps(users, ensure_ascii=False).encode("utf-8", "surrogatepass")


class Users(NamedTuple):
    generation: int
    skew_s: float
    local_time: bool
    secrets: dict[str, str]
    stale: dict[str, str]


def decode_users(payload: bytes) -> Users:
    try:
        data = json.loads(payload.decode("utf-8", "surrogatepass"))
        return Users(
            int(data["generation"]),
            float(data["skew_s"]),
            bool(data["local_time"]),
            {str(k): str(v) for k, v in data["secrets"].items()},
            {str(k): str(v) for k, v in data["stale"].items()},
        )
    except (ValueError, KeyError, TypeError, AttributeError, ArithmeticError) as exc:
        raise FrameError(f"a USERS frame is malformed: {type(exc).__name__}") from exc


Refusal = tuple[int, str, str, str, str, int]
"""Calls refused alike: the method's index, the reason, the first one's address, the client id,
what the client was told, and how many."""


def encode_refused(refusals: Sequence[Refusal]) -> bytes:
    """A REFUSED payload: the front-end's refusals since its last report."""
    entries = [
        [method, *(text[:MAX_REFUSED_FIELD] for text in (reason, peer, client, message)), count]
        for method, reason, peer, client, message, count in refusals[:MAX_REFUSED_ENTRIES]
    ]
    return json.dumps(entries).encode()


def decode_refused(payload: bytes) -> list[Refusal]:
    try:
        entries = json.loads(payload)
        if not isinstance(entries, list) or len(entries) > MAX_REFUSED_ENTRIES:
            raise ValueError("not a list of at most MAX_REFUSED_ENTRIES")
        return [
            (int(method), str(reason), str(peer), str(client), str(message), max(1, int(count)))
            for method, reason, peer, client, message, count in entries
        ]
    except (ValueError, TypeError, ArithmeticError) as exc:
        raise FrameError(f"a REFUSED frame is malformed: {type(exc).__name__}") from exc


def encode_abort(code: int, details: str) -> bytes:
    return _ABORT_HEAD.pack(code) + details.encode()


def decode_abort(payload: bytes) -> tuple[int, str]:
    return payload[0], payload[1:].decode(errors="replace")


class FrameProtocol(asyncio.Protocol):
    """Frames in both directions on one stream socket; ``on_frame(kind, call_id, payload)`` gets
    each whole frame, ``on_lost()`` the end of the connection."""

    def __init__(
        self,
        on_frame: Callable[[int, int, bytes], None],
        on_lost: Callable[[Exception | None], None],
        max_frame: int,
    ) -> None:
        self._on_frame = on_frame
        self._on_lost = on_lost
        self._max_frame = max_frame
        self._in = bytearray()
        self._out: list[bytes] = []
        self._flush_scheduled = False
        self.transport: asyncio.Transport | None = None
        self._loop = asyncio.get_running_loop()
        #: the other side reads slower than this side writes (the transport's buffer is full)
        self.writing_paused = False
        #: called once the transport takes writes again
        self.on_resumed: Callable[[], None] | None = None

    def pause_writing(self) -> None:
        self.writing_paused = True

    def resume_writing(self) -> None:
        self.writing_paused = False
        if self.on_resumed is not None:
            self.on_resumed()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        self._on_lost(exc)

    def data_received(self, data: bytes) -> None:
        buf = self._in
        buf += data
        at = 0
        size = HEADER.size
        try:
            while len(buf) - at >= size:
                length, kind, call_id = HEADER.unpack_from(buf, at)
                if length > self._max_frame:
                    raise FrameError(f"a frame of {length} bytes exceeds the limit {self._max_frame}")
                end = at + size + length
                if len(buf) < end:
                    break
                payload = bytes(buf[at + size : end])
                at = end
                self._on_frame(kind, call_id, payload)
        except FrameError as exc:
            _log.error("closing the front-end link: %s", exc)
            if self.transport is not None:
                self.transport.abort()
            return
        del buf[:at]

    def send(self, kind: int, call_id: int, payload: bytes = b"") -> None:
        """Queue a frame; the frames of one loop turn leave in one write."""
        if self.transport is None:
            return  # the other side is gone: its calls end with the connection
        self._out.append(HEADER.pack(len(payload), kind, call_id))
        self._out.append(payload)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self._loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        out, self._out = self._out, []
        if self.transport is not None and out:
            self.transport.write(b"".join(out))
