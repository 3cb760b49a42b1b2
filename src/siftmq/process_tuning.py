"""Settings for siftmq's own server processes (a broker's core, its front-ends), not for a broker
embedded in someone else's process (any layer may import this module)."""

from __future__ import annotations

import gc
from typing import Final

#: Allocations (net of frees) between young-generation collections in a server process.
GC_YOUNG_THRESHOLD: Final = 20_000


def tune_gc() -> None:
    """Collect less often.

    A request of 256 messages keeps a few thousand short-lived objects alive at once, and every
    gRPC call makes a few hundred, so with Python's default threshold (700) the young generation
    would be collected every few calls, and older generations after it, for nothing: freed objects
    are released by reference counting anyway, and the collector only looks for cycles, which these
    processes rarely make. Objects alive after start-up are frozen out of the scans.
    """
    gc.collect()
    gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(GC_YOUNG_THRESHOLD, older, oldest)
