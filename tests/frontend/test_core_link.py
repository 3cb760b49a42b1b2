"""The core's side of a front-end's link, driven over a real socket pair with the front-end's own
frames: a stream's answers wait for the front-end to let earlier ones go, a call's deadline is the
instant the client set (not the time left when the core read it), and a call its handler cancelled
from inside is answered CANCELLED (the front-end would wait on it for ever)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import socket
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import grpc
import pytest

from siftmq.auth.acl import parse_auth_file
from siftmq.broker.config import BrokerConfig
from siftmq.frontend import frames
from siftmq.frontend.edge import ALL_RPCS, EXIT_CANNOT_LISTEN
from siftmq.server import front_ends
from siftmq.server.auth import Gate
from siftmq.server.core_link import Behaviour, CoreLink, FrontEndConnection

TOKEN = b"token"
INDEX = {rpc.name: i for i, rpc in enumerate(ALL_RPCS)}
Frame = tuple[int, int, bytes]


def _table(**runs: Callable[..., Any]) -> list[Behaviour | None]:
    table: list[Behaviour | None] = [None] * len(ALL_RPCS)
    for name, run in runs.items():
        table[INDEX[name]] = Behaviour(ALL_RPCS[INDEX[name]], run, bytes, bytes)
    return table


@contextlib.asynccontextmanager
async def _front_end(
    table: list[Behaviour | None],
) -> AsyncIterator[tuple[frames.FrameProtocol, asyncio.Queue[Frame]]]:
    """A core connection on one end of a socket pair; the front-end's frame protocol on the other."""
    loop = asyncio.get_running_loop()
    core_end, front_end = socket.socketpair()
    links = CoreLink(table, TOKEN, 1 << 20)
    connection = FrontEndConnection(table, TOKEN, 1 << 20, links)
    core_transport, _ = await loop.connect_accepted_socket(lambda: connection.protocol, core_end)
    got: asyncio.Queue[Frame] = asyncio.Queue()
    front_transport, protocol = await loop.connect_accepted_socket(
        lambda: frames.FrameProtocol(lambda *frame: got.put_nowait(frame), lambda exc: None, 1 << 20),
        front_end,
    )
    protocol.send(frames.HELLO, 0, TOKEN)
    try:
        yield protocol, got
    finally:
        front_transport.close()
        core_transport.close()
        await asyncio.sleep(0.05)  # the connection's calls end with it


def _call(name: str, deadline_ms: int = -1) -> bytes:
    return frames.encode_call(INDEX[name], deadline_ms, "ipv4:127.0.0.1:1", [("x-mq-client-id", "c")], b"")


async def _frames_within(got: asyncio.Queue[Frame], seconds: float) -> list[Frame]:
    out: list[Frame] = []
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        try:
            out.append(await asyncio.wait_for(got.get(), left))
        except TimeoutError:
            break
    return out


def test_a_streams_answers_wait_for_the_front_end_to_let_earlier_ones_go() -> None:
    async def scenario() -> None:
        async def many(request: bytes, context: Any) -> AsyncIterator[bytes]:
            for i in range(40):
                yield b"answer %d" % i

        async with _front_end(_table(ReceiveMessage=many)) as (front, got):
            front.send(frames.CALL, 7, _call("ReceiveMessage"))
            first = await _frames_within(got, 0.5)
            assert [kind for kind, _, _ in first] == [frames.REPLY] * frames.ANSWER_CREDIT  # and no more
            for _ in range(5):
                front.send(frames.TAKEN, 7)
            more = await _frames_within(got, 0.5)
            assert [p for _, _, p in first + more] == [
                b"answer %d" % i for i in range(frames.ANSWER_CREDIT + 5)
            ]
            for _ in range(len(more)):  # from now on every answer is let go as it comes
                front.send(frames.TAKEN, 7)
            rest: list[Frame] = []
            while not rest or rest[-1][0] == frames.REPLY:
                rest.append(await asyncio.wait_for(got.get(), 5))
                front.send(frames.TAKEN, 7)
            answers = [p for _, _, p in first + more + rest[:-1]]
            assert answers == [b"answer %d" % i for i in range(40)] and rest[-1][0] == frames.END

    asyncio.run(scenario())


def test_a_stream_cancelled_tells_its_handler_how_many_answers_the_front_end_never_let_go() -> None:
    """A receive cut short gives back what its client never got: with front-ends, that includes
    the answers the front-end still held (sent, never TAKEN), not only those never sent."""

    async def scenario() -> None:
        seen: list[int] = []

        async def many(request: bytes, context: Any) -> AsyncIterator[bytes]:
            try:
                for i in range(40):
                    yield b"answer %d" % i
            finally:
                seen.append(context.answers_not_taken())

        async with _front_end(_table(ReceiveMessage=many)) as (front, got):
            front.send(frames.CALL, 7, _call("ReceiveMessage"))
            first = await _frames_within(got, 0.5)
            assert len(first) == frames.ANSWER_CREDIT
            for _ in range(5):  # five handed to the client: five more sent, 16 held again
                front.send(frames.TAKEN, 7)
            assert len(await _frames_within(got, 0.5)) == 5
            front.send(frames.CANCEL, 7)
            for _ in range(50):
                if seen:
                    break
                await asyncio.sleep(0.01)
        assert seen == [frames.ANSWER_CREDIT]

    asyncio.run(scenario())


def test_a_front_end_that_does_not_read_gets_the_users_table_in_force_not_every_one(tmp_path: Path) -> None:
    """Each change of the users sent a whole table (up to ~20 MB) to every front-end: one stopped
    (or its loop blocked) had them pile up in the core's memory, one per change."""
    names = [f"user{i:04d}" for i in range(400)]

    def table(version: int) -> dict[str, Any]:
        users = [{"username": n, "password": f"{version}-" + "p" * 200, "userType": "Normal"} for n in names]
        return {"users": users, "acls": []}

    auth_file = tmp_path / "auth.json"
    auth_file.write_text(json.dumps(table(0)))
    auth_file.chmod(0o600)

    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        gate = Gate.load(auth_file, authenticate=True, authorize=False, skew_s=900.0)
        links = CoreLink(_table(), TOKEN, 1 << 26, gate)
        connection = FrontEndConnection(_table(), TOKEN, 1 << 26, links)
        core_end, front_end = socket.socketpair()
        core_transport, _ = await loop.connect_accepted_socket(lambda: connection.protocol, core_end)
        got: asyncio.Queue[Frame] = asyncio.Queue()
        front_transport, front = await loop.connect_accepted_socket(
            lambda: frames.FrameProtocol(lambda *frame: got.put_nowait(frame), lambda exc: None, 1 << 26),
            front_end,
        )
        try:
            front.send(frames.HELLO, 0, TOKEN)
            await asyncio.sleep(0.1)
            front_transport.pause_reading()  # the front-end stops reading
            one = len(links._users())
            for version in range(1, 21):
                gate.change(parse_auth_file(json.dumps(table(version))))
                await asyncio.sleep(0)
            assert core_transport.get_write_buffer_size() < 3 * one  # not 20 tables
            front_transport.resume_reading()
            tables = []
            while not tables or tables[-1][0] != gate.generation:
                kind, _, payload = await asyncio.wait_for(got.get(), 10)
                if kind == frames.USERS:
                    users = frames.decode_users(payload)
                    tables.append((users.generation, users.secrets["user0000"]))
            assert tables[-1] == (gate.generation, "20-" + "p" * 200)  # the one in force, at last
            assert len(tables) < 10  # (the first; those the socket took before it was full; the last)
        finally:
            front_transport.close()
            core_transport.close()
            await asyncio.sleep(0.05)

    asyncio.run(scenario())


def test_the_deadline_is_the_clients_instant_however_late_the_core_reads_the_call() -> None:
    async def scenario() -> None:
        async def time_left(request: bytes, context: Any) -> bytes:
            return b"%.3f" % context.time_remaining()

        async with _front_end(_table(QueryRoute=time_left)) as (front, got):
            call = _call("QueryRoute", deadline_ms=int((time.monotonic() + 5) * 1000))
            await asyncio.sleep(1.0)  # the call waits this long before the core reads it
            front.send(frames.CALL, 3, call)
            kind, call_id, payload = await asyncio.wait_for(got.get(), 5)
            assert (kind, call_id) == (frames.REPLY, 3)
            assert 3.5 < float(payload) <= 4.0

    asyncio.run(scenario())


def test_a_call_cancelled_inside_its_handler_is_answered_cancelled() -> None:
    async def scenario() -> None:
        async def cancelled_inside(request: bytes, context: Any) -> bytes:
            gone = asyncio.get_running_loop().create_future()
            gone.cancel()
            await gone  # raises CancelledError: nobody cancelled the call
            return b"never"

        async def stream_cancelled_inside(request: bytes, context: Any) -> AsyncIterator[bytes]:
            yield b"first"
            await cancelled_inside(request, context)

        async with _front_end(
            _table(QueryRoute=cancelled_inside, ReceiveMessage=stream_cancelled_inside)
        ) as (front, got):
            front.send(frames.CALL, 1, _call("QueryRoute"))
            front.send(frames.CALL, 2, _call("ReceiveMessage"))
            answers = await _frames_within(got, 1.0)
            by_call = {call_id: (kind, payload) for kind, call_id, payload in answers if kind == frames.ABORT}
            for call_id in (1, 2):
                _, payload = by_call[call_id]
                assert frames.decode_abort(payload)[0] == grpc.StatusCode.CANCELLED.value[0]

    asyncio.run(scenario())


def test_a_cancel_from_the_front_end_sends_nothing_back() -> None:
    async def scenario() -> None:
        started = asyncio.Event()

        async def waits(request: bytes, context: Any) -> bytes:
            started.set()
            await asyncio.sleep(60)
            return b"late"

        async with _front_end(_table(QueryRoute=waits)) as (front, got):
            front.send(frames.CALL, 4, _call("QueryRoute"))
            await asyncio.wait_for(started.wait(), 5)
            front.send(frames.CANCEL, 4)
            assert await _frames_within(got, 0.5) == []

    asyncio.run(scenario())


class _NoBind:
    """A front-end process that exits at once, unable to listen."""

    returncode = EXIT_CANNOT_LISTEN

    async def wait(self) -> int:
        await asyncio.sleep(0.01)
        return EXIT_CANNOT_LISTEN


def test_front_ends_that_cannot_listen_stop_the_broker_once_none_has_listened_long_enough(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Each failure is an error naming the address; none listening past the bound stops the broker
    (not started again every 5 s for ever while the core reports serving)."""
    monkeypatch.setattr(front_ends, "RESTART_BACKOFF_S", (0.01,))
    monkeypatch.setattr(front_ends, "UNSERVED_GIVE_UP_S", 0.3)

    async def scenario() -> None:
        edges = front_ends.FrontEnds(BrokerConfig(), 2, [], 1 << 20, max_connections=64, max_streams=1100)
        edges.listen = "127.0.0.1:1"
        stopped: list[bool] = []
        edges.on_give_up = lambda: stopped.append(True)

        async def spawn(index: int) -> Any:
            return _NoBind()

        monkeypatch.setattr(edges, "_spawn", spawn)
        monkeypatch.setattr(edges, "_socket_in_place", lambda: asyncio.sleep(0))
        edges._procs = [_NoBind(), _NoBind()]  # type: ignore[list-item]
        edges._link.listening.add(1)  # one listens: the other's failures never stop the broker
        watching = asyncio.create_task(edges._watch(0))
        await asyncio.sleep(0.6)
        assert not stopped and edges.failure is None and not watching.done()
        edges._link.listening.discard(1)  # now none does
        await asyncio.wait_for(watching, 5)
        assert stopped and edges.failure is not None
        assert "cannot listen on 127.0.0.1:1" in str(edges.failure)
        await edges.stop()

    with caplog.at_level(logging.ERROR, logger="siftmq.server.front_ends"):
        asyncio.run(scenario())
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert sum("front-end 0 cannot listen on 127.0.0.1:1" in m for m in errors) >= 3, errors
    assert "stopping the broker" in errors[-1], errors
