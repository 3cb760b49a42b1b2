"""Fixtures every test directory shares, and the markers that keep ``pytest -m "not integration"``
a fast unit run: a test that uses a real broker process or a SparkSession is marked by the fixtures
it asks for, so no test file has to remember to."""

from __future__ import annotations

import os

# Test workers use gRPC in-process and then start the JVM of a SparkSession (fork, then exec). gRPC's
# fork handlers are for a child that goes on using gRPC; with other threads inside gRPC at the
# fork they leave the child broken and the JVM launch fails ("Java gateway process exited"). A
# child that execs at once needs none of them. Set before grpc is first imported.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")

from collections.abc import Iterator
from pathlib import Path

import pytest

from siftmq.testing import broker_starter

# fixture name -> the markers a test using it gets
_MARKED_BY_FIXTURE = {
    "start_broker": ("integration",),
    "spark": ("spark", "integration"),
}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        for fixture in getattr(item, "fixturenames", ()):
            for marker in _MARKED_BY_FIXTURE.get(fixture, ()):
                item.add_marker(marker)


@pytest.fixture
def start_broker(tmp_path: Path) -> Iterator[object]:
    """``start_broker(name, flush=..., config={...})`` starts a real broker process on port 0 with
    its data under ``tmp_path/name`` and waits for its ready line; all are stopped at teardown."""
    yield from broker_starter(tmp_path)
