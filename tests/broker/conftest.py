"""The ``start_broker`` fixture: ``start_broker(name, flush=..., config={...})`` gives a running broker."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Iterator
from pathlib import Path

import pytest

from siftmq.testing import broker_starter


@pytest.fixture
def start_broker(tmp_path: Path) -> Iterator[object]:
    yield from broker_starter(tmp_path)


@pytest.fixture(autouse=True)
def _close_loops_left_by_the_official_client() -> Iterator[None]:
    """Close event loops that threads of ``rocketmq-python-client`` leave behind.

    The official client's worker threads make gRPC calls without an event loop of their own; grpc
    then creates one for the thread and never closes it. Left alone, that loop is garbage-collected
    during some later test, whose unraisable-warning check then fails on its ``ResourceWarning``.
    Seen once each in two clean CI runs (2026-11-22); the loop is idle here, so closing it is safe.
    """
    yield
    gc.collect()
    for obj in gc.get_objects():
        if isinstance(obj, asyncio.AbstractEventLoop) and not obj.is_running() and not obj.is_closed():
            obj.close()
