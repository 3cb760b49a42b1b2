"""Failed password checks bounded per key: past :data:`FAILURES` within :data:`WINDOW_S`, a key
waits until its oldest failure leaves the window, so a password cannot be guessed at the server's
speed. The admin API keys its logins by the client's address; a gRPC signature, whose secret key is
the same password, by the address and the access key. A success does not clear the failures, or a
valid login would let its holder try on another user's password.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Hashable
from typing import Final

FAILURES: Final = 10  # failures of one key within the window, at most
WINDOW_S: Final = 60.0
MAX_KEYS: Final = 4096  # keys followed (forgotten all when full: a flood from many keys cannot grow it)


class FailureThrottle:
    """The recent failures of each key."""

    def __init__(self) -> None:
        self._failed: dict[Hashable, collections.deque[float]] = {}

    def wait_s(self, key: Hashable, now: float | None = None) -> float:
        """Seconds ``key`` must wait before it is checked again (0: it may be)."""
        failures = self._failed.get(key)
        if failures is None:
            return 0.0
        now = time.monotonic() if now is None else now
        while failures and failures[0] <= now - WINDOW_S:
            failures.popleft()
        if len(failures) < FAILURES:
            return 0.0
        return failures[0] + WINDOW_S - now

    def failed(self, key: Hashable, now: float | None = None) -> None:
        if len(self._failed) >= MAX_KEYS and key not in self._failed:
            self._failed.clear()
        now = time.monotonic() if now is None else now
        self._failed.setdefault(key, collections.deque(maxlen=FAILURES)).append(now)
