"""Start a throw-away ``siftmq broker`` subprocess for a demo (port 0, temporary data directory)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from siftmq.testing import running_broker


@contextlib.contextmanager
def embedded_broker(settings: dict[str, object] | None = None) -> Iterator[str]:
    """Yield the endpoint of a fresh broker; it is stopped (SIGTERM) and its data removed afterwards."""
    with running_broker(settings) as broker:
        yield broker.endpoint
