"""Helpers for tests, demos and benchmarks: real brokers, in a subprocess or in-process.

``BrokerProcess(tmp_path / "data").start()`` runs ``siftmq broker`` on port 0 and waits for the
ready line; ``endpoint`` and ``admin_url`` are then set; ``stop()`` sends SIGTERM, ``kill()``
SIGKILL. ``running_broker()`` does the same in a temporary directory for a ``with`` block;
``open_broker()`` starts an in-process :class:`~siftmq.broker.Broker` for unit tests.
``SteppedClock`` stands in for a module's ``time`` to step its wall clock (the real one cannot be).
``record_calls(client)`` lists the RPCs a siftmq client makes from then on, by name.
"""

from __future__ import annotations

import contextlib
import os
import resource
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

READY_TIMEOUT_S = 60
WORKERS_ENV = "SIFTMQ_TEST_WORKERS"


def record_calls(client: Any) -> list[str]:
    """The names of the RPCs ``client`` (a siftmq Producer or consumer) makes from now on, in order."""
    calls: list[str] = []
    original = client.connection._method

    def recording(rpc: Any, request: Any) -> Any:
        calls.append(rpc.name)
        return original(rpc, request)

    client.connection._method = recording
    return calls


class SteppedClock:
    """A module's ``time`` whose ``time_ns`` runs ``offset_ns`` ahead of the real clock and whose
    ``monotonic`` runs ``monotonic_offset_s`` ahead (everything else is the real module's).

    Set ``offset_ns`` back to step the wall clock back, or :meth:`advance` both to let time pass
    without waiting (``monkeypatch.setattr(store_module, "time", clock)``).
    """

    def __init__(self, offset_ns: int = 0) -> None:
        self.offset_ns = offset_ns
        self.monotonic_offset_s = 0.0

    def time_ns(self) -> int:
        return time.time_ns() + self.offset_ns

    def time(self) -> float:
        return self.time_ns() / 1e9

    def monotonic(self) -> float:
        return time.monotonic() + self.monotonic_offset_s

    def advance(self, seconds: float) -> None:
        """Let ``seconds`` pass on both clocks, at once."""
        self.offset_ns += int(seconds * 1e9)
        self.monotonic_offset_s += seconds

    def __getattr__(self, name: str) -> Any:  # sleep, perf_counter, ...: the real ones
        return getattr(time, name)


def toml_value(value: object) -> str:
    """A Python value as a TOML value (bool, str, number, list)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, list | tuple):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    return str(value)


class BrokerProcess:
    """``python -m siftmq broker`` in a subprocess; ``endpoint`` is ``127.0.0.1:<port>`` once ready."""

    def __init__(
        self,
        data_dir: Path,
        *,
        flush: str = "async",
        config: dict[str, object] | None = None,
        listen: str = "127.0.0.1:0",
        open_files: int | None = None,
        workers: int | None = None,
        admin_listen: str = "127.0.0.1:0",
    ) -> None:
        self.data_dir = data_dir
        self.admin_listen = admin_listen
        #: gRPC front-end processes; by default 1 (the broker serves gRPC itself) unless the
        #: environment's SIFTMQ_TEST_WORKERS says otherwise (to run a suite through front-ends)
        if workers is None:
            workers = int(str((config or {}).get("workers", os.environ.get(WORKERS_ENV, "1"))))
        self.workers = workers
        #: the process's RLIMIT_NOFILE (soft and hard), when given
        self.open_files = open_files
        self.flush = flush
        self.listen = listen
        self.config_path: Path | None = None
        if config:
            self.config_path = data_dir.parent / f"{data_dir.name}.toml"
            self.config_path.write_text("".join(f"{k} = {toml_value(v)}\n" for k, v in config.items()))
        self.proc: subprocess.Popen[str] | None = None
        self.endpoint = ""
        self.port = 0
        self.admin_url = ""
        self.output: list[str] = []

    def start(self) -> BrokerProcess:
        cmd = [
            sys.executable,
            "-m",
            "siftmq",
            "broker",
            "--data-dir",
            str(self.data_dir),
            "--listen",
            self.listen,
            "--flush",
            self.flush,
            "--admin-listen",
            self.admin_listen,
            "--workers",
            str(self.workers),
        ]
        if self.config_path is not None:
            cmd += ["--config", str(self.config_path)]
        self.proc = subprocess.Popen(
            cmd,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
            preexec_fn=self._limit_open_files if self.open_files is not None else None,  # noqa: PLW1509
        )
        ready = threading.Event()

        def pump() -> None:
            assert self.proc is not None and self.proc.stdout is not None
            for line in self.proc.stdout:
                self.output.append(line.rstrip("\n"))
                if "ready on" in line and not ready.is_set():
                    self.endpoint = line.split("ready on ", 1)[1].split()[0]
                    self.port = int(self.endpoint.rsplit(":", 1)[1])
                    for scheme in ("http://", "https://"):
                        if f"admin {scheme}" in line:
                            self.admin_url = scheme + line.split(f"admin {scheme}", 1)[1].split(",")[0]
                    ready.set()

        self._pump = threading.Thread(target=pump, daemon=True)
        self._pump.start()
        deadline = time.monotonic() + READY_TIMEOUT_S
        while not ready.wait(0.05):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.kill()
                raise RuntimeError("broker did not become ready:\n" + "\n".join(self.output[-50:]))
        return self

    def _limit_open_files(self) -> None:
        assert self.open_files is not None
        resource.setrlimit(resource.RLIMIT_NOFILE, (self.open_files, self.open_files))

    def stop(self, timeout: float = 30) -> int:
        """SIGTERM and wait; returns the exit code."""
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        code = self.proc.wait(timeout)
        self._close_pipe()
        return code

    def kill(self) -> None:
        """SIGKILL (a crash)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(30)
        self._close_pipe()

    def _close_pipe(self) -> None:
        if self.proc is not None and self.proc.stdout is not None:
            self._pump.join(10)
            self.proc.stdout.close()

    def log(self) -> str:
        return "\n".join(self.output)

    def metrics_with(self, *wanted: str, auth: Any = None, timeout: float = 10) -> str:
        """The admin API's ``/metrics`` once it holds every ``wanted`` text (or ``timeout`` passed:
        the caller asserts). With ``--workers`` the front-ends report refusals every 0.1 s."""
        import httpx

        deadline = time.monotonic() + timeout
        while True:
            text = httpx.get(f"{self.admin_url}/metrics", auth=auth, timeout=10).text
            if all(w in text for w in wanted) or time.monotonic() > deadline:
                return text
            time.sleep(0.05)


def broker_starter(tmp_path: Path) -> Iterator[object]:
    """``start_broker(**kw)`` starts a broker (stopped at the end of the test)."""
    started: list[BrokerProcess] = []

    def start(name: str = "data", **kwargs: object) -> BrokerProcess:
        broker = BrokerProcess(tmp_path / name, **kwargs)  # type: ignore[arg-type]
        started.append(broker)
        return broker.start()

    yield start
    for broker in started:
        try:
            broker.stop(30)
        except subprocess.TimeoutExpired:
            broker.kill()


@contextlib.contextmanager
def running_broker(
    config: dict[str, object] | None = None, *, flush: str = "async"
) -> Iterator[BrokerProcess]:
    """A started :class:`BrokerProcess` on a temporary data directory, stopped and removed afterwards."""
    with tempfile.TemporaryDirectory(prefix="siftmq-") as tmp:
        broker = BrokerProcess(Path(tmp) / "data", flush=flush, config=config).start()
        try:
            yield broker
        finally:
            try:
                broker.stop(30)
            except subprocess.TimeoutExpired:
                broker.kill()


def open_broker(data_dir: Path, **overrides: Any) -> Any:
    """A started in-process :class:`~siftmq.broker.Broker` with test-friendly defaults.

    The minimum invisible time is 50 ms and topics get 4 queues unless ``overrides`` say otherwise.
    """
    from siftmq.broker import Broker, BrokerConfig

    settings: dict[str, Any] = {"min_invisible_time_s": 0.05, "default_queue_nums": 4, **overrides}
    broker = Broker(BrokerConfig(data_dir=data_dir, **settings))
    broker.start()
    return broker
