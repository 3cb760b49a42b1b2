"""Fixtures for the store tests (helpers in ``store_helpers``)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from siftmq.store import MessageStore
from store_helpers import small_config


@pytest.fixture
def open_store(tmp_path: Path) -> Iterator[Callable[..., MessageStore]]:
    """Open stores on ``tmp_path/data`` (closed at teardown)."""
    opened: list[MessageStore] = []

    def _open(**overrides: Any) -> MessageStore:
        store = MessageStore.open(small_config(tmp_path / "data", **overrides))
        opened.append(store)
        return store

    yield _open
    for store in opened:
        store.close()
