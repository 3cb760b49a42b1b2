"""Broker tests: the official client's leftovers are cleaned up after each test."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Iterator

import pytest


@pytest.fixture(autouse=True)
def _close_loops_left_by_the_official_client() -> Iterator[None]:
    """Close event loops that threads of ``rocketmq-python-client`` leave behind.

    The official client's worker threads make gRPC calls without an event loop of their own; grpc
    then creates one for the thread and never closes it. Left alone, that loop is garbage-collected
    during some later test, whose unraisable-warning check then fails on its ``ResourceWarning``.
    The loop is idle by then, so closing it is safe.
    """
    yield
    gc.collect()
    for obj in gc.get_objects():
        if isinstance(obj, asyncio.AbstractEventLoop) and not obj.is_running() and not obj.is_closed():
            obj.close()
