"""The ``start_broker`` fixture: ``start_broker(name, flush=..., config={...})`` gives a running broker."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from siftmq.testing import broker_starter


@pytest.fixture
def start_broker(tmp_path: Path) -> Iterator[object]:
    yield from broker_starter(tmp_path)
