"""The admin HTTP server drops clients that send a request too slowly (Slowloris), keeps serving
everyone else, and answers 503 beyond its connection limit."""

from __future__ import annotations

import socket
import time
import urllib.error
import urllib.request
from typing import Any

import pytest

pytestmark = [pytest.mark.integration]


def _address(admin_url: str) -> tuple[str, int]:
    host, port = admin_url.removeprefix("http://").rsplit(":", 1)
    return host, int(port)


def _closed_after(sock: socket.socket, limit_s: float) -> float:
    """Seconds until the server closes ``sock`` (reading returns b""), at most ``limit_s``."""
    start = time.monotonic()
    sock.settimeout(limit_s)
    try:
        while sock.recv(4096):
            pass
    except TimeoutError:
        return limit_s
    except ConnectionResetError:
        pass
    return time.monotonic() - start


def _health(admin_url: str) -> int:
    with urllib.request.urlopen(f"{admin_url}/healthz", timeout=5) as response:
        return int(response.status)


def test_slow_and_silent_clients_are_dropped_and_others_served(start_broker: Any) -> None:
    broker = start_broker("data", config={"admin_request_timeout_s": 1.0})
    address = _address(broker.admin_url)
    silent = socket.create_connection(address)  # connects and sends nothing
    slow = socket.create_connection(address)
    slow.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")  # never ends its headers
    assert _health(broker.admin_url) == 200  # served meanwhile
    for sock in (silent, slow):
        assert _closed_after(sock, 10) < 5
        sock.close()
    # a request trickled a byte at a time cannot keep its connection either
    trickle = socket.create_connection(address)
    start = time.monotonic()
    dropped = False
    for byte in b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Pad: " + b"a" * 100:
        try:
            trickle.send(bytes([byte]))
        except OSError:  # reset or broken pipe: the server closed it
            dropped = True
            break
        time.sleep(0.1)
    trickle.close()
    assert dropped and time.monotonic() - start < 5
    assert _health(broker.admin_url) == 200
    assert "did not send a whole request within 1 s" in broker.log()
    assert broker.stop() == 0


def test_connections_beyond_the_limit_get_503(start_broker: Any) -> None:
    broker = start_broker("data", config={"admin_max_connections": 2, "admin_request_timeout_s": 30.0})
    address = _address(broker.admin_url)
    held = [socket.create_connection(address) for _ in range(2)]
    time.sleep(0.2)
    with pytest.raises(urllib.error.HTTPError) as refused:
        _health(broker.admin_url)
    assert refused.value.code == 503
    refused.value.close()
    for sock in held:
        sock.close()
    time.sleep(0.2)
    assert _health(broker.admin_url) == 200
    assert broker.stop() == 0
