"""The broker's port checks cover every address gRPC would listen on: a port taken on one of them
(an IPv6-only socket on [::] under a wildcard listen, a socket on ::1 under ``localhost``) is taken.
Checked on IPv4 alone, such a port passed; gRPC then listened on IPv4 alone, and the other socket
got every IPv6 client's connection (signed headers, bodies)."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from siftmq.server.front_ends import BindError, check_port_free, hold_address, hold_port


def _has_ipv6() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as probe:
            probe.bind(("::1", 0))
    except OSError:
        return False
    return True


pytestmark = pytest.mark.skipif(not _has_ipv6(), reason="the host has no IPv6")


@contextlib.contextmanager
def _listening(address: str, *, v6_only: bool = True) -> Iterator[int]:
    """Another program's IPv6 socket listening on ``address`` (a port free on IPv4 too)."""
    while True:
        with socket.socket() as v4:  # a port free on IPv4, so only the IPv6 socket takes it
            v4.bind(("0.0.0.0", 0))
            port = int(v4.getsockname()[1])
        other = socket.socket(socket.AF_INET6)
        other.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1 if v6_only else 0)
        try:
            other.bind((address, port))
        except OSError:
            other.close()
            continue
        other.listen()
        break
    try:
        yield port
    finally:
        other.close()


@pytest.mark.parametrize(("listen", "taken"), [("0.0.0.0", "::"), ("::", "::"), ("localhost", "::1")])
def test_a_port_taken_on_one_address_is_taken(listen: str, taken: str) -> None:
    with _listening(taken) as port:
        with pytest.raises(BindError, match=f"cannot listen on {listen}:{port}: Address already in use"):
            check_port_free(listen, port)
        with pytest.raises(BindError, match="Address already in use"):
            hold_port(listen, port)


def test_a_free_port_is_held_on_every_address_and_port_0_picks_one_free_on_all() -> None:
    port = check_port_free("localhost", 0)
    held = hold_port("localhost", port)
    try:
        assert sorted(s.family for s in held) == sorted([socket.AF_INET, socket.AF_INET6])
        assert {s.getsockname()[1] for s in held} == {port}
        with pytest.raises(BindError):  # held: nobody else binds it
            check_port_free("localhost", port)
    finally:
        for sock in held:
            sock.close()
    wildcard = hold_port("0.0.0.0", check_port_free("0.0.0.0", 0))
    for sock in wildcard:
        sock.close()
    assert wildcard[0].family == socket.AF_INET6  # [::], dual stack, held first


def _closing_connections_on(host: str) -> int:
    """A port an earlier server without SO_REUSEPORT served: it closed a connection first, which
    stays in TIME_WAIT for a minute. A listener may share the port (SO_REUSEADDR), a hold not."""
    with socket.socket() as server:
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind((host, 0))
        server.listen()
        port = int(server.getsockname()[1])
        with socket.create_connection((host, port)) as client:
            accepted, _ = server.accept()
            accepted.close()  # the server closes first
            client.recv(1)
    return port


def test_a_port_an_earlier_server_still_closes_connections_on_is_held_later() -> None:
    """Refused before: a broker with --workers could not start for a minute after a one-process
    broker on the same port ("Address already in use (is another broker running there?)")."""
    port = _closing_connections_on("127.0.0.1")
    assert check_port_free("127.0.0.1", port) == port  # a listener can have it
    with pytest.raises(BindError, match="Address already in use"):
        hold_port("127.0.0.1", port)
    later: list[tuple[int, Any]] = []
    assert hold_port("127.0.0.1", port, later=later) == []
    assert later == [(socket.AF_INET, ("127.0.0.1", port))]
    assert hold_address(*later[0]) is None  # not yet
    free = check_port_free("127.0.0.1", 0)
    hold = hold_address(socket.AF_INET, ("127.0.0.1", free))
    assert hold is not None
    hold.close()
    with _listening("::1") as taken, pytest.raises(BindError):  # a listener is never put aside
        hold_port("localhost", taken, later=later)


def test_an_address_the_host_does_not_have_is_named() -> None:
    with pytest.raises(BindError, match="no such local address"):
        check_port_free("192.0.2.1", 0)  # TEST-NET-1: never a local address


@pytest.mark.integration
@pytest.mark.parametrize("workers", [1, 2])
def test_a_broker_does_not_start_where_another_program_listens_for_ipv6(tmp_path: Path, workers: int) -> None:
    with _listening("::") as port:
        cmd = [sys.executable, "-m", "siftmq", "broker", "--data-dir", str(tmp_path / "data"),
               "--listen", f"0.0.0.0:{port}", "--admin-listen", "", "--workers", str(workers),
               "--allow-anonymous"]  # fmt: skip
        done = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=120)
    assert done.returncode != 0, done.stdout
    assert f"cannot listen on 0.0.0.0:{port}: Address already in use" in done.stderr, done.stderr
    assert "ready on" not in done.stdout


@pytest.mark.integration
def test_front_ends_start_where_an_earlier_server_still_closes_connections(tmp_path: Path) -> None:
    port = _closing_connections_on("127.0.0.1")
    cmd = [sys.executable, "-m", "siftmq", "broker", "--data-dir", str(tmp_path / "data"),
           "--listen", f"127.0.0.1:{port}", "--admin-listen", "", "--workers", "2"]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        ready = proc.stdout.readline()
        assert "ready on" in ready, ready
        with socket.create_connection(("127.0.0.1", port), timeout=10):
            pass  # served
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert "still closing on port" in err
