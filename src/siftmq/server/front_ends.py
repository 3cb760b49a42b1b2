"""``--workers N``: the core process starts N gRPC front-end processes on the broker's port, keeps
them running (one that dies is started again), and stops them first on shutdown.

The port is checked free by the core before any front-end binds it: the front-ends share it with
``SO_REUSEPORT``, which would otherwise let a second broker of the same user bind it too. Two cores
started in the same instant could both find it free, so a core also claims the port for as long as
it runs: a Unix socket in the abstract namespace named after the port, which only one process can
hold and which goes with the process however it ends (kill -9 included).

While no front-end listens (they all crashed, or are being started again) the port would be free for
any local user to bind, and with it every client's next connection: the core holds, for as long as
it runs, a socket bound to the port with ``SO_REUSEPORT`` that never listens. The kernel lets only
sockets of the same user with ``SO_REUSEPORT`` share it (the front-ends), and gives connections
only to listening ones. A front-end that cannot listen even so (the address went away) is logged
each time it fails; when none has listened for :data:`UNSERVED_GIVE_UP_S` and the last one to try
failed to bind, the broker stops with that error rather than report itself serving.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import secrets
import shutil
import signal
import socket
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Final

from siftmq.broker.config import BrokerConfig
from siftmq.errors import SiftError
from siftmq.frontend import frames
from siftmq.frontend.edge import EXIT_CANNOT_LISTEN, TOKEN_ENV
from siftmq.server.auth import Gate
from siftmq.server.core_link import Behaviour, CoreLink

_log = logging.getLogger(__name__)

READY_TIMEOUT_S: Final = 60.0
STOP_TIMEOUT_S: Final = 5.0
#: Pauses before starting a dead front-end again, growing while they keep dying young.
RESTART_BACKOFF_S: Final = (0.2, 1.0, 5.0)
#: A front-end that ran this long before dying counts as healthy: the backoff starts over.
HEALTHY_AFTER_S: Final = 30.0
#: The broker stops when no front-end has listened for this long and one has just failed to bind.
UNSERVED_GIVE_UP_S: Final = 30.0
#: The core's socket directory: ``siftmq-core-{pid}-{random}`` under the temporary directory.
DIR_PREFIX: Final = "siftmq-core-"
#: The port's claim: an abstract Unix socket ``\0siftmq-workers-port-{port}`` (one per network
#: namespace, whatever the address listened on).
CLAIM_PREFIX: Final = "siftmq-workers-port-"


class BindError(SiftError):
    """The listen address cannot be bound (in use, or not a local address)."""

    code = "BIND_FAILED"


class StoppedWhileStarting(Exception):
    """The broker was asked to stop before every front-end listened (SIGTERM to the process group,
    as ``systemctl stop`` sends it, also ends front-ends not yet ready): a clean stop, not a failed
    start."""


#: Listen hosts that mean every address of the machine.
_WILDCARDS: Final = frozenset({"0.0.0.0", "::"})
#: Bind errors meaning the host has no such address or family (IPv6 off): nothing can listen there,
#: a front-end included, so there is nothing to check or hold. Any other error means taken.
_ABSENT: Final = frozenset({errno.EADDRNOTAVAIL, errno.EAFNOSUPPORT})
#: Ports picked for port 0 before giving up, when the one picked is taken on another address.
PICK_TRIES: Final = 8
#: Seconds between tries to hold an address another server's closing connections still use.
HOLD_RETRY_S: Final = 2.0
#: Seconds a front-end ended by SIGTERM during the start waits for the core's own stop to show.
SIGTERM_GRACE_S: Final = 1.0


def _addresses(host: str, port: int) -> list[tuple[int, Any]]:
    """The (family, address) pairs gRPC listens on for ``host:port``."""
    bare = host.strip("[]")
    if bare in _WILDCARDS:
        # gRPC listens on a wildcard address as [::] taking IPv4 too (dual stack) wherever the host
        # has IPv6: checked or held as 0.0.0.0 alone, [::] would be free for an IPv6-only socket of
        # anyone's, and gRPC, finding it taken, would listen on IPv4 alone and leave it the IPv6 clients
        return [(socket.AF_INET6, ("::", port, 0, 0)), (socket.AF_INET, ("0.0.0.0", port))]  # (no IPv6)
    if bare == "localhost":  # gRPC listens on both loopbacks, whatever the hosts file says
        return [(socket.AF_INET, ("127.0.0.1", port)), (socket.AF_INET6, ("::1", port, 0, 0))]
    return [
        (family, address)
        for family, _, _, _, address in socket.getaddrinfo(
            bare, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )
    ]


def _bind(family: int, address: Any, *, reuse_port: bool) -> socket.socket | None:
    """A socket bound to ``address`` (dual stack for [::]); None when the host has no such address.
    Raises OSError when it is taken."""
    try:
        sock = socket.socket(family, socket.SOCK_STREAM)
    except OSError as exc:
        if exc.errno in _ABSENT:
            return None
        raise
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT if reuse_port else socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6 and address[0] == "::":
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        sock.bind(address)
    except OSError as exc:
        sock.close()
        if exc.errno in _ABSENT:
            return None
        raise
    return sock


def _bind_all(
    host: str, port: int, *, reuse_port: bool, later: list[tuple[int, Any]] | None = None
) -> list[socket.socket]:
    """A socket bound to each address of ``host`` on ``port`` (one port free on all of them when
    ``port`` is 0); BindError when one is taken or the host has none of them. With ``later``, an
    address whose port only another server's closing connections still use is added to it instead."""
    for _ in range(PICK_TRIES):
        bound: list[socket.socket] = []
        chosen = port
        if later is not None:
            later.clear()  # (a port picked again: what the last one put aside is not this one's)
        try:
            for family, address in _addresses(host, port):
                at = (address[0], chosen, *address[2:])
                try:
                    sock = _bind(family, at, reuse_port=reuse_port)
                except OSError as exc:
                    if later is None or exc.errno != errno.EADDRINUSE or not _only_closing(family, at):
                        raise
                    later.append((family, at))
                    continue
                if sock is not None:
                    bound.append(sock)
                    chosen = int(sock.getsockname()[1])
        except OSError as exc:
            for sock in bound:
                sock.close()
            if port == 0 and exc.errno == errno.EADDRINUSE:
                continue  # the port picked on the first address is taken on another: pick again
            hint = " (is another broker running there?)" if exc.errno == errno.EADDRINUSE else ""
            raise BindError(f"cannot listen on {host}:{chosen}: {exc.strerror}{hint}") from exc
        if not bound and not later:
            raise BindError(f"cannot listen on {host}:{port}: no such local address")
        return bound
    raise BindError(f"cannot listen on {host}:0: no port was free on every address in {PICK_TRIES} tries")


def check_port_free(host: str, port: int) -> int:
    """Bind every address ``host`` names on ``port`` without ``SO_REUSEPORT`` and let go: fails while
    anything listens on any of them (another broker's front-ends included). Returns the port (one
    free on every address when ``port`` is 0)."""
    probes = _bind_all(host, port, reuse_port=False)
    chosen = int(probes[0].getsockname()[1])
    for probe in probes:
        probe.close()
    return chosen


def hold_port(host: str, port: int, later: list[tuple[int, Any]] | None = None) -> list[socket.socket]:
    """Bind every address ``host`` names on ``port`` with ``SO_REUSEPORT`` (and not ``SO_REUSEADDR``)
    and never listen: while these are open only this user's ``SO_REUSEPORT`` sockets (the
    front-ends) can bind the port, whether or not a front-end listens (see the module's note).

    A port whose earlier server (one without ``SO_REUSEPORT``: a one-process broker) closed
    connections keeps them in TIME_WAIT for up to a minute, which a listener may share
    (``SO_REUSEADDR``) and the hold may not: with ``later``, such an address is put there for
    :func:`hold_address` to take once they are gone, instead of refusing the start."""
    return _bind_all(host, port, reuse_port=True, later=later)


def hold_address(family: int, address: Any) -> socket.socket | None:
    """The hold of one address put aside by :func:`hold_port`; None while it cannot be had yet."""
    try:
        return _bind(family, address, reuse_port=True)
    except OSError:
        return None


def _only_closing(family: int, address: Any) -> bool:
    """Whether nothing listens on ``address`` though a hold cannot bind it: only sockets a listener
    may share (TIME_WAIT) are there, as a bind with ``SO_REUSEADDR`` succeeds."""
    try:
        probe = _bind(family, address, reuse_port=False)
    except OSError:
        return False
    if probe is not None:
        probe.close()
    return True


def claim_port(host: str, port: int) -> socket.socket:
    """Hold ``port`` for this core (see the module's note); close the socket to let it go."""
    claim = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        claim.bind(f"\0{CLAIM_PREFIX}{port}")
    except OSError as exc:
        claim.close()
        raise BindError(
            f"cannot listen on {host}:{port}: another siftmq broker with --workers holds port {port} "
            f"({exc.strerror})"
        ) from exc
    return claim


class FrontEnds:
    """The front-end processes and the socket they reach the core on."""

    def __init__(
        self,
        config: BrokerConfig,
        count: int,
        behaviours: Sequence[Behaviour | None],
        frame_limit: int,
        gate: Gate | None = None,
        *,
        max_connections: int,
        max_streams: int,
    ) -> None:
        self._config = config
        self._count = count
        self._frame_limit = frame_limit
        self._max_connections = max_connections  # each front-end's
        self._max_streams = max_streams  # calls at once on one of its connections
        self._token = secrets.token_hex(32)
        self._link = CoreLink(behaviours, self._token.encode(), frame_limit + frames.CALL_ROOM, gate)
        _remove_stale_dirs()
        self._dir = _socket_dir()
        self._socket = str(self._dir / "core.sock")
        self._procs: list[asyncio.subprocess.Process | None] = [None] * count
        self._watchers: list[asyncio.Task[None]] = []
        self._stopping = False
        self.listen = ""
        self.restarts = 0  # front-ends started again after they died
        self._claim: socket.socket | None = None
        self._holds: list[socket.socket] = []
        self._to_hold: list[tuple[int, Any]] = []  # addresses the port could not be held on yet
        self._holding: asyncio.Task[None] | None = None
        # since when no front-end has listened, and the count of READY frames then
        self._unserved: tuple[float, int] | None = None
        #: why the broker stops on its own (set before it asks to stop: see on_give_up)
        self.failure: BindError | None = None
        #: asks the broker to stop (the app sets it)
        self.on_give_up: Callable[[], None] | None = None

    async def start(self, host: str, port: int) -> int:
        """Start the front-ends on ``host:port``; returns the port once every one listens."""
        port = check_port_free(host, port)
        self._claim = claim_port(host, port)
        port = check_port_free(host, port)  # taken by anything else meanwhile
        self._holds = hold_port(host, port, later=self._to_hold)
        self.listen = f"{host}:{port}"
        if self._to_hold:
            _log.warning(
                "%s: connections an earlier server closed are still closing on port %d; the port is "
                "held for the front-ends once they are gone (about a minute at most)",
                ", ".join(str(address[0]) for _, address in self._to_hold),
                port,
            )
            self._holding = asyncio.get_running_loop().create_task(self._hold_later())
        try:
            await self._link.start(self._socket)
        except OSError as exc:  # e.g. a TMPDIR so long that the socket's path does not fit
            raise BindError(f"cannot open the front-ends' socket {self._socket}: {exc}") from exc
        for index in range(self._count):
            self._procs[index] = await self._spawn(index)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + READY_TIMEOUT_S
        terminated_at: float | None = None  # when a front-end was first seen ended by SIGTERM
        while self._link.ready_count < self._count:
            for index, proc in enumerate(self._procs):
                if proc is not None and proc.returncode is not None and proc.returncode != -signal.SIGTERM:
                    raise BindError(
                        f"front-end {index} exited ({proc.returncode}) before listening on {self.listen}; "
                        "its error is above"
                    )
            if self._stopping:  # (a front-end that died of the same SIGTERM is no failure)
                raise StoppedWhileStarting
            if any(proc is not None and proc.returncode is not None for proc in self._procs):
                # SIGTERM to the process group reaches this process too: a moment for it to tell
                terminated_at = loop.time() if terminated_at is None else terminated_at
                if loop.time() - terminated_at > SIGTERM_GRACE_S:
                    raise BindError(f"a front-end was stopped (SIGTERM) before listening on {self.listen}")
            if loop.time() > deadline:
                raise BindError(f"the front-ends did not listen on {self.listen} in {READY_TIMEOUT_S:.0f} s")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._link.wait_ready(self._count), 0.1)
        self._watchers = [loop.create_task(self._watch(index)) for index in range(self._count)]
        return port

    async def _spawn(self, index: int) -> asyncio.subprocess.Process:
        config = self._config
        args = [
            "-m",
            "siftmq.frontend",
            "--socket",
            self._socket,
            "--listen",
            self.listen,
            "--index",
            str(index),
            "--frame-limit",
            str(self._frame_limit),
            "--max-connections",
            str(self._max_connections),
            "--max-streams",
            str(self._max_streams),
            "--batch-extension" if config.batch_extension else "--no-batch-extension",
        ]
        if config.tls_cert_file:
            args += ["--tls-cert", config.tls_cert_file, "--tls-key", config.tls_key_file]
            if config.tls_client_ca_file:
                args += ["--tls-client-ca", config.tls_client_ca_file]
        env = {**os.environ, TOKEN_ENV: self._token}
        return await asyncio.create_subprocess_exec(
            sys.executable,
            *args,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL,
            env=env,
        )

    async def _watch(self, index: int) -> None:
        """Start front-end ``index`` again whenever it dies, until the broker stops."""
        loop = asyncio.get_running_loop()
        failures = 0
        while not self._stopping:
            proc = self._procs[index]
            assert proc is not None
            started = loop.time()
            code = await proc.wait()
            self._link.listening.discard(index)
            if self._stopping:
                return
            failures = 1 if loop.time() - started > HEALTHY_AFTER_S else failures + 1
            self.restarts += 1
            pause = RESTART_BACKOFF_S[min(failures, len(RESTART_BACKOFF_S)) - 1]
            unserved = self._unserved_for(loop.time())
            if code == EXIT_CANNOT_LISTEN:
                if unserved >= UNSERVED_GIVE_UP_S:
                    self._give_up(unserved)
                    return
                _log.error(
                    "front-end %d cannot listen on %s (its error is above; no front-end has listened "
                    "for %.0f s: the broker stops at %.0f s); starting it again in %.1f s",
                    index,
                    self.listen,
                    unserved,
                    UNSERVED_GIVE_UP_S,
                    pause,
                )
            else:
                _log.warning("front-end %d exited (%s); starting it again in %.1f s", index, code, pause)
            while True:
                await asyncio.sleep(pause)
                if self._stopping:
                    return
                try:
                    await self._socket_in_place()
                    spawning = asyncio.ensure_future(self._spawn(index))
                    try:
                        self._procs[index] = await asyncio.shield(spawning)
                    except asyncio.CancelledError:  # stop(): a process started is stopped with the others
                        self._procs[index] = await spawning
                        raise
                    break
                except OSError as exc:  # out of processes or files: try again, later
                    pause = RESTART_BACKOFF_S[-1]
                    _log.error(
                        "front-end %d cannot be started: %s; trying again in %.1f s", index, exc, pause
                    )

    def _unserved_for(self, now: float) -> float:
        """How long no front-end has listened (0 while one does); a front-end that listened in
        between, however briefly, starts the count again."""
        ready = self._link.ready_count
        if self._link.listening:
            self._unserved = None
            return 0.0
        if self._unserved is None or self._unserved[1] != ready:
            self._unserved = (now, ready)
        return now - self._unserved[0]

    def _give_up(self, unserved: float) -> None:
        self.failure = BindError(
            f"cannot listen on {self.listen}: no front-end has listened for {unserved:.0f} s and the last "
            "one to try could not bind the address (its error is above)"
        )
        _log.error("%s; stopping the broker", self.failure)
        if self.on_give_up is not None:
            self.on_give_up()

    async def _socket_in_place(self) -> None:
        """Listen again, in a new directory, if the socket's file is gone (a cleaner of old files
        in the temporary directory removed it): a front-end started now could not connect to the
        old one. The front-ends connected already keep their connections."""
        if os.path.exists(self._socket):
            return
        old = self._dir
        self._dir = _socket_dir()
        self._socket = str(self._dir / "core.sock")
        _log.warning("the front-ends' socket under %s was removed; listening on %s", old, self._socket)
        await self._link.start(self._socket)
        shutil.rmtree(old, ignore_errors=True)

    def counts(self) -> dict[str, int]:
        """For the metrics: front-ends configured, connected to the core now, and started again."""
        return {"configured": self._count, "connected": self._link.connected, "restarts": self.restarts}

    def stopping(self) -> None:
        """The broker is stopping: front-ends that exit from now on are not started again (a
        SIGTERM to the whole process group reaches them before the core stops them)."""
        self._stopping = True

    async def _hold_later(self) -> None:
        """Hold the addresses put aside at the start, once the connections closing there are gone."""
        while self._to_hold and not self._stopping:
            await asyncio.sleep(HOLD_RETRY_S)
            for family, address in list(self._to_hold):
                hold = hold_address(family, address)
                if hold is not None:
                    self._holds.append(hold)
                    self._to_hold.remove((family, address))
        if not self._to_hold:
            _log.info("port %s held for the front-ends on every address", self.listen)

    async def stop(self) -> None:
        """SIGTERM to every front-end (they finish their calls in flight), then SIGKILL to the late."""
        self._stopping = True
        if self._holding is not None:
            self._holding.cancel()
        for watcher in self._watchers:
            watcher.cancel()
        if self._watchers:  # one starting a front-end records the process first
            await asyncio.wait(self._watchers)
        running = [p for p in self._procs if p is not None and p.returncode is None]
        for proc in running:
            with contextlib.suppress(ProcessLookupError):
                proc.terminate()
        if running:
            _, late = await asyncio.wait(
                [asyncio.create_task(p.wait()) for p in running], timeout=STOP_TIMEOUT_S
            )
            if late:
                for proc in running:
                    with contextlib.suppress(ProcessLookupError):
                        proc.kill()
                await asyncio.wait(late)
        await self._link.stop()
        shutil.rmtree(self._dir, ignore_errors=True)
        if self._claim is not None:
            self._claim.close()
        for hold in self._holds:
            hold.close()


def _socket_dir() -> Path:
    """A new directory for the core's socket: 0700, so only this user connects; named after this
    process, so a later core can tell one left by a core killed with -9."""
    return Path(tempfile.mkdtemp(prefix=f"{DIR_PREFIX}{os.getpid()}-"))


def _remove_stale_dirs() -> None:
    """Remove the socket directories of cores that are gone (killed with -9: nothing else is left)."""
    for path in Path(tempfile.gettempdir()).glob(f"{DIR_PREFIX}*-*"):
        pid_text = path.name[len(DIR_PREFIX) :].split("-", 1)[0]
        if not pid_text.isdigit() or not path.is_dir() or path.stat().st_uid != os.getuid():
            continue
        try:
            os.kill(int(pid_text), 0)
        except ProcessLookupError:
            shutil.rmtree(path, ignore_errors=True)
        except OSError:
            continue  # alive, or not ours to ask about
