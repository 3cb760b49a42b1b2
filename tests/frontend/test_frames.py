"""The front-ends' frame protocol: calls round-trip (text and binary metadata), frames survive any
split of the byte stream, bad frames close the link, call ids wrap past open calls, and a client
stream's requests are bounded by the credit the core gives."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from siftmq.auth.acl import MAX_PASSWORD, MAX_USER_NAME, MAX_USERS
from siftmq.frontend import frames
from siftmq.frontend.edge import Link
from siftmq.server.core_link import _Requests

header_key = st.text("abcdefghijklmnopqrstuvwxyz-", min_size=1, max_size=20)
text_value = st.text(max_size=60)
metadata = st.lists(
    st.one_of(
        st.tuples(header_key.map(lambda k: k + "-bin"), st.binary(max_size=40)),
        st.tuples(header_key.filter(lambda k: not k.endswith("-bin")), text_value),
    ),
    max_size=12,
)


@given(
    method=st.integers(0, 2**16 - 1),
    deadline_ms=st.integers(-1, 2**63 - 1),
    peer=st.text(max_size=80),
    headers=metadata,
    request=st.binary(max_size=300),
    signed_by=st.text(max_size=40),
    generation=st.integers(0, 2**32 - 1),
)
def test_a_call_round_trips(
    method: int, deadline_ms: int, peer: str, headers: Any, request: bytes, *, signed_by: str, generation: int
) -> None:
    payload = frames.encode_call(
        method, deadline_ms, peer, headers, request, signed_by=signed_by, generation=generation
    )
    call = frames.decode_call(payload)
    assert (call.method, call.deadline_ms, call.peer, call.request) == (method, deadline_ms, peer, request)
    assert (call.signed_by, call.generation) == (signed_by, generation)
    assert frames.decode_headers(call.headers, call.header_count) == tuple(headers)


def test_users_and_refusals_round_trip_and_bad_ones_are_frame_errors() -> None:
    secrets, stale = {"alice": "s3cret", "bob": "x"}, {"bob": "y"}
    payload = frames.encode_users(7, 900.0, secrets, local_time=True, stale=stale)
    assert frames.decode_users(payload) == (7, 900.0, True, secrets, stale)
    many = [(4, "invalid", "ipv4:1.2.3.4:5", f"client-{i}", "x" * 5000, 3) for i in range(100)]
    refused = frames.decode_refused(frames.encode_refused(many))
    assert len(refused) == frames.MAX_REFUSED_ENTRIES  # bounded: the caller sends the rest apart
    assert refused[0] == (4, "invalid", "ipv4:1.2.3.4:5", "client-0", "x" * frames.MAX_REFUSED_FIELD, 3)
    for bad in (
        b"",
        b"{",
        b"[]",
        b'{"generation": 1}',
        b'{"generation": "a", "skew_s": 1, "secrets": {}}',
        b'{"generation": 1e999, "skew_s": 1, "secrets": {}}',
    ):
        with pytest.raises(frames.FrameError):
            frames.decode_users(bad)
    too_many = json.dumps([[0, "invalid", "", "", "", 1]] * (frames.MAX_REFUSED_ENTRIES + 1)).encode()
    overflow = b'[[0, "invalid", "", "", "", 1e999]]'
    for bad in (
        b"",
        b"[1, 2]",
        b'{"a": 1}',
        b'[["x", "a", "b", "c", "d", 1]]',
        b"[[1, 2]]",
        too_many,
        overflow,
    ):
        with pytest.raises(frames.FrameError):
            frames.decode_refused(bad)


def test_a_call_cut_short_is_a_frame_error() -> None:
    payload = frames.encode_call(3, 100, "ipv4:127.0.0.1:1", [("x-mq-client-id", "abc")], b"")
    for cut in (1, 8, len(payload) - 1):
        with pytest.raises(frames.FrameError):
            frames.decode_call(payload[:cut])
    text = frames.decode_call(payload)  # text metadata: NUL-joined
    binary = frames.decode_call(frames.encode_call(3, 100, "", [("x-id-bin", b"\x00\x01")], b""))
    for block, count in (
        (text.headers, 2),  # fewer pairs than said
        (text.headers + b"\x00x", 1),  # more
        (b"\xff\x00x", 1),  # not UTF-8
        (binary.headers[:-1], binary.header_count),  # cut short
        (binary.headers + b"x", binary.header_count),  # bytes left over
    ):
        with pytest.raises(frames.FrameError):
            frames.decode_headers(block, count)
    assert frames.decode_headers(binary.headers, binary.header_count) == (("x-id-bin", b"\x00\x01"),)
    with pytest.raises(frames.FrameError):
        frames.encode_call(3, 100, "", [("k", "v")] * (frames.MAX_HEADERS + 1), b"")
    with pytest.raises(frames.FrameError, match="a metadata key of 70000 bytes"):  # (not struct.error)
        frames.encode_call(3, 100, "", [("k" * 70_000, "v"), ("x-bin", b"\x00")], b"")


class _Transport(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.written = bytearray()
        self.aborted = False

    def write(self, data: Any) -> None:
        self.written += data

    def abort(self) -> None:
        self.aborted = True


def _protocol(
    max_frame: int = 1 << 20,
) -> tuple[frames.FrameProtocol, list[tuple[int, int, bytes]], _Transport]:
    got: list[tuple[int, int, bytes]] = []
    protocol = frames.FrameProtocol(lambda k, c, p: got.append((k, c, p)), lambda exc: None, max_frame)
    transport = _Transport()
    protocol.connection_made(transport)
    return protocol, got, transport


@settings(max_examples=60)
@given(
    sent=st.lists(
        st.tuples(st.sampled_from([frames.CALL, frames.REPLY, frames.END]), st.binary(max_size=200)),
        max_size=8,
    ),
    cuts=st.lists(st.integers(0, 2000), max_size=10),
)
def test_frames_arrive_whole_however_the_stream_is_split(
    sent: list[tuple[int, bytes]], cuts: list[int]
) -> None:
    async def run() -> None:
        sender, _, wire = _protocol()
        for i, (kind, payload) in enumerate(sent):
            sender.send(kind, i + 1, payload)
        await asyncio.sleep(0)  # the frames of one turn leave in one write
        stream = bytes(wire.written)
        receiver, got, _ = _protocol()
        at = 0
        for cut in [*sorted(c % (len(stream) + 1) for c in cuts), len(stream)]:
            receiver.data_received(stream[at:cut])
            at = max(at, cut)
        assert got == [(kind, i + 1, payload) for i, (kind, payload) in enumerate(sent)]

    asyncio.run(run())


def test_the_frames_of_one_turn_leave_in_one_write() -> None:
    async def run() -> None:
        sender, _, wire = _protocol()
        writes: list[bytes] = []
        wire.write = lambda data: writes.append(bytes(data))  # type: ignore[method-assign]
        for i in range(10):
            sender.send(frames.CALL, i + 1, b"x" * i)
        await asyncio.sleep(0)
        assert len(writes) == 1
        sender.send(frames.CALL, 11, b"")
        await asyncio.sleep(0)
        assert len(writes) == 2

    asyncio.run(run())


def test_a_frame_over_the_limit_closes_the_link() -> None:
    async def run() -> None:
        receiver, got, transport = _protocol(max_frame=100)
        receiver.data_received(frames.HEADER.pack(101, frames.CALL, 1) + b"x" * 101)
        assert transport.aborted and got == []

    asyncio.run(run())


class _Context:
    def time_remaining(self) -> float | None:
        return 5.0

    def invocation_metadata(self) -> tuple[Any, ...]:
        return ()

    def peer(self) -> str:
        return "ipv4:127.0.0.1:5"


def test_call_ids_wrap_at_32_bits_and_skip_open_calls() -> None:
    async def run() -> None:
        link = Link(1 << 20, 1 << 20)
        link.protocol, _, wire = _protocol()
        link._next_id = frames.MAX_CALL_ID - 2
        first, _ = link.open_unary(0, _Context(), b"", ([], ""))  # type: ignore[arg-type]
        assert first == frames.MAX_CALL_ID - 1
        link._next_id = frames.MAX_CALL_ID - 2  # the next would be the open call's id: skipped
        ids = [link.open_unary(0, _Context(), b"", ([], ""))[0] for _ in range(3)]  # type: ignore[arg-type]
        assert ids == [frames.MAX_CALL_ID, 1, 2]
        await asyncio.sleep(0)
        assert len(wire.written) > 0  # every id fitted its frame header

    asyncio.run(run())


def test_a_client_stream_is_bounded_by_its_credit() -> None:
    async def run() -> None:
        taken: list[int] = []
        requests = _Requests(bytes, lambda: taken.append(1))
        for i in range(frames.STREAM_CREDIT + 1):
            requests.put(bytes([i]))
        with pytest.raises(frames.FrameError):
            requests.put(b"one too many")
        iterator = aiter(requests)
        assert await anext(iterator) == b"\x00"
        assert taken == [1]  # one taken: one more credit for the front-end
        requests.put(b"now there is room")
        requests.put(None)
        rest = [r async for r in iterator]
        assert rest[-1] == b"now there is room" and len(taken) == 1 + len(rest)

    asyncio.run(run())


def test_the_largest_users_table_fits_in_a_frame_a_front_end_takes() -> None:
    """The most users a file may hold, each name and password of the most characters, each
    character one JSON escapes: the USERS frame stays under what a front-end reads from the core."""
    for char in ("\x01", "\U0001f600", "\ud800"):  # escaped; past the BMP; a lone surrogate
        secrets = {f"{i:05d}" + char * (MAX_USER_NAME - 5): char * MAX_PASSWORD for i in range(MAX_USERS)}
        # every password just changed: the replaced ones cross too
        stale = {name: secret[:-1] + "x" for name, secret in secrets.items()}
        payload = frames.encode_users(7, 300.0, secrets, stale=stale)
        assert len(payload) + frames.HEADER.size <= frames.MAX_FROM_CORE, (repr(char), len(payload))
        assert frames.decode_users(payload) == (7, 300.0, False, secrets, stale)
