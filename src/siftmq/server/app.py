"""Running the broker: the grpc.aio server, the ready line, clean shutdown on SIGTERM/SIGINT."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket
import sys
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Final

import grpc

from siftmq.broker.broker import Broker
from siftmq.broker.config import BrokerConfig, parse_listen
from siftmq.broker.long_polling import ArrivalNotifier
from siftmq.errors import ConfigError, SiftError
from siftmq.frontend.edge import tls_credentials
from siftmq.frontend.limits import connection_limit, server_options, streams_per_connection
from siftmq.process_tuning import tune_gc
from siftmq.protocol.service import BATCH_RPCS, BATCH_SERVICE_NAME, RPCS, SERVICE_NAME, Rpc
from siftmq.server import auth, decoding
from siftmq.server.auth import Gate
from siftmq.server.core_link import Behaviour, behaviour_table
from siftmq.server.front_ends import BindError, FrontEnds, StoppedWhileStarting, check_port_free
from siftmq.server.service import MessagingService
from siftmq.store.filepool import raise_open_file_limit

_log = logging.getLogger(__name__)
RPC_THREADS = 64
SHUTDOWN_GRACE_S = 3.0
FRAME_OVERHEAD = 4 * 1024 * 1024  # properties, keys and framing around the bodies of one gRPC message


def _served(batch_extension: bool) -> list[tuple[str, tuple[Rpc, ...]]]:
    """RocketMQ's MessagingService, and siftmq's batch extension unless it is turned off."""
    return [(SERVICE_NAME, RPCS)] + ([(BATCH_SERVICE_NAME, BATCH_RPCS)] if batch_extension else [])


def behaviours(
    service: MessagingService, *, batch_extension: bool, gate: Gate | None = None
) -> dict[str, Behaviour]:
    """Every served RPC's handler stack by path: the same whether gRPC calls it in this process or a
    front-end passes the call on (:mod:`siftmq.server.core_link`)."""
    return {rpc.path: _behaviour(service, rpc, gate) for _, rpcs in _served(batch_extension) for rpc in rpcs}


def _behaviour(service: MessagingService, rpc: Rpc, gate: Gate | None) -> Behaviour:
    run: Any = getattr(service, rpc.name, None)
    if run is None or rpc.request is None:
        run = service.unsupported(rpc.name, rpc.response, rpc.shape != "unary_unary")
    if gate is not None:
        run = auth.guard(run, rpc, gate)  # inside the decoding guard: requests are decoded
    deserialize: Any = bytes
    if rpc.request is not None:
        deserialize = decoding.tolerant(rpc.request)
        run = decoding.guard(run, rpc.shape, rpc.name, rpc.request.DESCRIPTOR.name)
    return Behaviour(rpc, run, deserialize, rpc.response.SerializeToString)


def _handlers(table: dict[str, Behaviour]) -> tuple[grpc.GenericRpcHandler, ...]:
    make = {
        "unary_unary": grpc.unary_unary_rpc_method_handler,
        "unary_stream": grpc.unary_stream_rpc_method_handler,
        "stream_stream": grpc.stream_stream_rpc_method_handler,
    }
    by_service: dict[str, dict[str, grpc.RpcMethodHandler]] = {}
    for b in table.values():
        deserializer = None if b.rpc.request is None else b.deserialize
        by_service.setdefault(b.rpc.service, {})[b.rpc.name] = make[b.rpc.shape](
            b.run, request_deserializer=deserializer, response_serializer=b.serialize
        )
    return tuple(grpc.method_handlers_generic_handler(name, methods) for name, methods in by_service.items())


def _tls_credentials(config: BrokerConfig) -> grpc.ServerCredentials | None:
    """The server's TLS credentials (None: plaintext); unreadable files refuse the start."""
    if not config.tls_cert_file:
        return None
    try:
        return tls_credentials(config.tls_cert_file, config.tls_key_file, config.tls_client_ca_file)
    except OSError as exc:
        raise ConfigError(f"cannot read a TLS file: {exc.filename}: {exc.strerror}") from exc


LOOPBACK_HOSTS: Final = ("127.0.0.1", "localhost", "::1", "[::1]")


AUTH_FILE_CHECK_S: Final = 2.0  # how often the auth file is looked at for a change


async def _watch_auth_file(gate: Gate, stop: asyncio.Event) -> None:
    """Reload the users and policies when the auth file changes (SIGHUP reloads at once)."""
    while not stop.is_set():
        await asyncio.sleep(AUTH_FILE_CHECK_S)
        gate.reload(if_changed=True)


def _loopback(host: str) -> bool:
    return host in LOOPBACK_HOSTS or host.startswith("127.")


def _check_protected_mode(config: BrokerConfig, host: str) -> list[str]:
    """Without authentication the broker serves loopback only, unless told otherwise (Redis's
    protected mode): anyone who can reach the port could publish, consume and delete. The admin API
    likewise: with authentication on it asks for a login (see :mod:`siftmq.server.admin_auth`).
    Returns the warnings an ``--allow-anonymous`` start earns (logged here, and shown by the admin
    API's ``/healthz``)."""
    if config.authentication_enabled:
        admin_host = parse_listen(config.admin_listen)[0] if config.admin_listen else "127.0.0.1"
        if config.tls_cert_file or _loopback(admin_host):
            return []
        warning = (
            f"the admin API listens on {config.admin_listen} without TLS: its logins (passwords, "
            "tokens) cross the network in clear; set tls_cert_file and tls_key_file"
        )
        _log.warning("%s", warning)
        return [warning]
    listening = [("gRPC", config.listen, host)]
    if config.admin_listen:
        listening.append(("the admin API", config.admin_listen, parse_listen(config.admin_listen)[0]))
    exposed = [(what, listen) for what, listen, on in listening if not _loopback(on)]
    if exposed and not config.allow_anonymous:
        what, listen = exposed[0]
        raise ConfigError(
            f"refusing to serve {what} on {listen} without authentication (protected mode): set "
            "authentication_enabled with an auth_file, keep it on loopback, or start with "
            "--allow-anonymous to accept anyone who can reach the port"
        )
    warnings = [
        f"{what} listens on {listen} with authentication off (--allow-anonymous): anyone who can "
        "reach the port may publish, consume and change the broker"
        for what, listen in exposed
    ]
    for warning in warnings:
        _log.warning("%s", warning)
    return warnings


class _Signals:
    """SIGTERM/SIGINT stop the broker, SIGHUP reloads the auth file; installed before anything
    is served or started, so that no signal meets the default action (which ends the process
    without a clean stop). A stop asked for during start-up takes effect once the broker is up."""

    def __init__(self, loop: asyncio.AbstractEventLoop, authentication: bool) -> None:
        self.stop = asyncio.Event()
        self.gate: Gate | None = None
        self.on_stop: list[Callable[[], None]] = []
        self._authentication = authentication
        self._loop = loop
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._stopping)
        loop.add_signal_handler(signal.SIGHUP, self._hangup)

    def stop_now(self) -> None:
        """Stop the broker as SIGTERM does."""
        self._stopping()

    def _stopping(self) -> None:
        self.stop.set()
        for hook in self.on_stop:
            hook()

    def _hangup(self) -> None:
        if self.gate is not None:
            self.gate.reload()
        elif not self._authentication:
            _log.info("SIGHUP: authentication is off, there is no auth file to reload")
        else:
            _log.info("SIGHUP during start-up: the auth file is being read")

    def remove(self) -> None:
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            self._loop.remove_signal_handler(sig)


async def serve(config: BrokerConfig, *, ready: Any = None) -> None:
    """Run a broker until SIGTERM/SIGINT; prints the ready line once it accepts calls."""
    loop = asyncio.get_running_loop()
    signals = _Signals(loop, config.authentication_enabled)
    try:
        await _serve(config, signals, ready)
    finally:
        signals.remove()


async def _serve(config: BrokerConfig, signals: _Signals, ready: Any) -> None:
    loop = asyncio.get_running_loop()
    loop.set_default_executor(ThreadPoolExecutor(RPC_THREADS, thread_name_prefix="siftmq-rpc"))
    reads = ThreadPoolExecutor(config.read_threads, thread_name_prefix="siftmq-read")
    send_threads = config.send_threads or (1 if config.flush == "async" else RPC_THREADS)
    sends = ThreadPoolExecutor(send_threads, thread_name_prefix="siftmq-send")
    program_reads = ThreadPoolExecutor(max(1, config.filter_server_nums), thread_name_prefix="siftmq-program")
    # what refuses the start is checked before the store is opened: a refused start writes nothing
    host, listen_port = parse_listen(config.listen)
    warnings = _check_protected_mode(config, host)
    credentials = _tls_credentials(config)  # unreadable files refuse the start either way
    gate = None
    if config.authentication_enabled:
        gate = auth.Gate.load(
            auth.auth_file(config.data_dir / "config", config.auth_file),
            authenticate=True,
            authorize=config.authorization_enabled,
            skew_s=config.auth_clock_skew_s,
            local_time=config.auth_local_time_stamps,
        )
    broker = Broker(config)
    broker.start()
    try:
        notifier = ArrivalNotifier(loop)
        broker.add_arrival_listener(notifier.on_arrival)
        # one bound both ways: the largest message, or the largest pull answer, plus room for the rest
        frame_limit = max(config.max_body_size, config.max_pull_bytes) + FRAME_OVERHEAD
        service = MessagingService(
            broker, notifier, reads, sends, program_reads, share_receives=config.workers > 1
        )
        if gate is not None and config.auto_create_topics:  # a call on a topic that does not exist creates it
            gate.missing_topic = lambda name: broker.topics.get(name) is None
        signals.gate = gate
        table = behaviours(service, batch_extension=config.batch_extension, gate=gate)
        # from the open-file limit the store works with (a fresh store raises it only at its first
        # index file), which the front-ends inherit
        raise_open_file_limit()
        connections = connection_limit(config.max_connections)
        # a topic can hold more queues than max_queue_nums allows now (made before it was lowered)
        largest = max([config.max_queue_nums, *(t.queue_nums for t in broker.topics.all())])
        streams = streams_per_connection(largest)
        edge: _InProcessEdge | FrontEnds
        if config.workers > 1:
            edge = FrontEnds(
                config,
                config.workers,
                behaviour_table(table),
                frame_limit,
                gate,
                max_connections=connections,
                max_streams=streams,
            )
        else:
            edge = _InProcessEdge(table, frame_limit, credentials, connections, streams)
        signals.on_stop.append(edge.stopping)
        if isinstance(edge, FrontEnds):
            edge.on_give_up = signals.stop_now
        try:
            try:
                port = await edge.start(host, listen_port)
            except StoppedWhileStarting:
                _log.info("asked to stop while the front-ends were starting")
            else:
                await _serve_until_stopped(
                    config,
                    broker,
                    gate,
                    warnings,
                    host=host,
                    port=port,
                    ready=ready,
                    stop=signals.stop,
                    front_ends=edge.counts if isinstance(edge, FrontEnds) else None,
                )
        finally:
            await edge.stop()
        if isinstance(edge, FrontEnds) and edge.failure is not None:
            raise edge.failure  # the broker stopped as it could not serve: the CLI exits with it
    finally:
        reads.shutdown(cancel_futures=True)
        program_reads.shutdown(cancel_futures=True)
        sends.shutdown()
        broker.close()
    print("siftmq broker stopped", flush=True)


async def _serve_until_stopped(
    config: BrokerConfig,
    broker: Broker,
    gate: Gate | None,
    warnings: list[str],
    *,
    host: str,
    port: int,
    ready: Any,
    stop: asyncio.Event,
    front_ends: Callable[[], dict[str, int]] | None = None,
) -> None:
    """The admin API, the ready line, and the wait for ``stop`` (SIGTERM/SIGINT: see :class:`_Signals`)."""
    admin = None
    if config.admin_listen:
        admin = _AdminServer(broker, config.admin_listen, gate, warnings, front_ends)
    admin_text = ""
    if admin is not None:
        await admin.start()
        scheme = "https" if config.tls_cert_file else "http"
        admin_text = f"admin {scheme}://{admin.address}, "
    watcher = None
    if gate is not None:
        watcher = asyncio.create_task(_watch_auth_file(gate, stop))
    security = ("tls, " if config.tls_cert_file else "") + (
        "authentication on" if config.authentication_enabled else "anonymous"
    )
    processes = f", {config.workers} front-end processes" if config.workers > 1 else ""
    details = f"{admin_text}data in {config.data_dir}, flush {config.flush}, {security}{processes}"
    print(f"siftmq broker ready on {host}:{port} ({details})", flush=True)
    if ready is not None:
        ready(host, port)
    await stop.wait()
    if watcher is not None:
        watcher.cancel()
    _log.info("stopping: finishing calls in flight (up to %.0f s)", SHUTDOWN_GRACE_S)
    if admin is not None:
        await admin.stop()


class _InProcessEdge:
    """gRPC served by this process (``--workers 1``, and brokers embedded in another program)."""

    def __init__(
        self,
        table: dict[str, Behaviour],
        frame_limit: int,
        credentials: grpc.ServerCredentials | None,
        max_connections: int,
        max_streams: int,
    ) -> None:
        options = server_options(frame_limit, max_connections, max_streams, reuse_port=False)
        self._server = grpc.aio.server(options=options)
        self._server.add_generic_rpc_handlers(_handlers(table))
        self._credentials = credentials
        self._started = False

    async def start(self, host: str, port: int) -> int:
        listen = f"{host}:{port}"
        if port:
            # every address gRPC would listen on: finding [::] taken by an IPv6-only socket, gRPC
            # would listen on IPv4 alone and leave that socket the IPv6 clients
            check_port_free(host, port)
        try:
            if self._credentials is None:
                bound = self._server.add_insecure_port(listen)
            else:
                bound = self._server.add_secure_port(listen, self._credentials)
        except RuntimeError as exc:
            raise BindError(f"cannot listen on {listen}: {exc} (is another broker running there?)") from exc
        if bound == 0:
            raise BindError(f"cannot listen on {listen} (is another broker running there?)")
        await self._server.start()
        self._started = True
        return int(bound)

    def stopping(self) -> None:
        """Nothing to do before :meth:`stop` (the front-ends' edge stops restarting them here)."""

    async def stop(self) -> None:
        if self._started:
            await self._server.stop(SHUTDOWN_GRACE_S)


class _AdminServer:
    """uvicorn serving the admin API on the broker's event loop (signals stay the broker's)."""

    def __init__(
        self,
        broker: Broker,
        listen: str,
        gate: Gate | None = None,
        warnings: list[str] | None = None,
        front_ends: Callable[[], dict[str, int]] | None = None,
    ) -> None:
        import uvicorn

        from siftmq.server.admin_http import create_app
        from siftmq.server.http_limits import deadline_protocol

        class _Quiet(uvicorn.Server):
            @contextlib.contextmanager
            def capture_signals(self) -> Iterator[None]:  # the broker handles SIGTERM/SIGINT
                yield

        host, port = parse_listen(listen)
        host = host.removeprefix("[").removesuffix("]")  # "[::1]:0", as gRPC's listen takes it
        self._sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
        try:
            self._sock.bind((host, port))
        except OSError as exc:
            self._sock.close()
            raise BindError(f"cannot listen on {listen} for the admin API: {exc}") from exc
        shown = f"[{host}]" if ":" in host else host  # a URL's form of an IPv6 address
        self.address = f"{shown}:{self._sock.getsockname()[1]}"
        app = create_app(broker, gate, warnings or [], front_ends)
        self._history = app.state.history
        self._server = _Quiet(
            uvicorn.Config(
                app,
                log_level="warning",
                lifespan="off",
                http=deadline_protocol(broker.config.admin_request_timeout_s),
                limit_concurrency=broker.config.admin_max_connections,
                # HTTPS with the gRPC side's certificate (the logins are HTTP Basic)
                ssl_certfile=broker.config.tls_cert_file or None,
                ssl_keyfile=broker.config.tls_key_file or None,
            )
        )
        self._task: asyncio.Task[None] | None = None
        self._sampler: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._task = asyncio.create_task(self._server.serve(sockets=[self._sock]))
        self._sampler = asyncio.create_task(self._history.run())  # the console's sparklines
        while not self._server.started and not self._task.done():
            await asyncio.sleep(0.01)
        if self._task.done():
            self._task.result()

    async def stop(self) -> None:
        if self._sampler is not None:
            self._sampler.cancel()
        self._server.should_exit = True
        if self._task is not None:
            await self._task
        self._sock.close()


def run(config: BrokerConfig) -> int:
    """Blocking entry point for the CLI; returns the process exit code."""
    logging.basicConfig(
        level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    logging.getLogger("grpc").setLevel(logging.WARNING)
    tune_gc()  # the CLI's process only: an embedded broker leaves its host's collector alone
    try:
        asyncio.run(serve(config))
    except SiftError as exc:
        print(f"siftmq broker: {exc}", file=sys.stderr, flush=True)
        return 1
    return 0
