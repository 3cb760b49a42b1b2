"""Signals to a real broker process: SIGHUP never ends it, SIGTERM stops it cleanly.

Before, SIGHUP was handled only with authentication on: without it the default action killed
the broker (exit -1, no clean stop).
"""

from __future__ import annotations

import asyncio
import signal
import time
from typing import Any

import pytest

from siftmq.client import Producer

pytestmark = pytest.mark.integration


def _send(endpoint: str) -> str:
    async def go() -> str:
        async with Producer(endpoint, max_attempts=1, request_timeout=10) as producer:
            return (await producer.send("Signals", b"x")).message_id

    return asyncio.run(go())


@pytest.mark.parametrize("workers", [1, 2])
def test_sighup_without_authentication_keeps_the_broker_serving(start_broker: Any, workers: int) -> None:
    broker = start_broker(workers=workers)
    assert _send(broker.endpoint)
    broker.proc.send_signal(signal.SIGHUP)
    deadline = time.monotonic() + 10
    while "no auth file to reload" not in broker.log() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert "SIGHUP: authentication is off, there is no auth file to reload" in broker.log()
    assert broker.proc.poll() is None
    assert _send(broker.endpoint)  # still serving
    assert broker.stop() == 0
    assert "siftmq broker stopped" in broker.log() and "Traceback" not in broker.log()
