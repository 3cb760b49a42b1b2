"""Disk pressure: the store refuses new messages before its disk fills, and never deletes to make room.

A full disk is the one failure a broker can see coming. Appending until ``ENOSPC`` would leave no
room for what must still be written after an acknowledged message (ConsumeQueue entries, the
checkpoint, consumer progress) and invites deleting messages nobody has consumed yet. So the
store checks the file system holding it before each append and refuses with
:class:`~siftmq.errors.DiskFullError` while it is used above ``disk_high_water_ratio`` or has less
than ``disk_reserve_bytes`` free. Reads, acks and progress go on; appends are accepted again as
soon as the disk is below both marks, with nothing for the operator to reset.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final, NamedTuple

from siftmq.errors import DiskFullError

MIB: Final = 1024**2
#: how long one reading of the file system's usage is reused: a statvfs per append would cost
#: more than the rest of a small append, and the disk cannot fill by much in this time
CHECK_INTERVAL_S: Final = 0.05


class DiskUsage(NamedTuple):
    total: int
    used: int
    free: int


@dataclass(frozen=True, slots=True)
class DiskState:
    """One reading of the disk holding the store, judged against the marks."""

    path: str
    used_ratio: float
    free_bytes: int
    high_water_ratio: float
    reserve_bytes: int
    deletes_oldest: bool = False  # disk_full_policy = "delete_oldest"

    @property
    def full(self) -> bool:
        return self.used_ratio >= self.high_water_ratio or self.free_bytes < self.reserve_bytes

    def refusal(self) -> str:
        """Why appends are refused, naming the disk and the figures (no OS error text)."""
        if self.used_ratio >= self.high_water_ratio:
            why = f"is {self.used_ratio:.1%} full, past the high-water mark {self.high_water_ratio:.0%}"
        else:
            free, reserve = self.free_bytes / MIB, self.reserve_bytes / MIB
            why = f"has {free:.1f} MiB free, less than the reserve of {reserve:.0f} MiB"
        refused = "new messages are refused until it is below"
        return f"the disk holding {self.path} {why}: {refused} {self.meanwhile}"

    @property
    def meanwhile(self) -> str:
        """What goes on while appends are refused (what the operator's policy does about it)."""
        if self.deletes_oldest:
            return "(reads and acks go on; the oldest segments are deleted to make room: delete_oldest)"
        return "(reads and acks go on; nothing stored is deleted to make room)"


class DiskGuard:
    """Checks the disk holding ``path`` before appends (readings reused for :data:`CHECK_INTERVAL_S`)."""

    def __init__(
        self,
        path: os.PathLike[str] | str,
        *,
        high_water_ratio: float,
        reserve_bytes: int,
        deletes_oldest: bool = False,
        usage: Callable[[str], DiskUsage] | None = None,
    ) -> None:
        self.path = os.fspath(path)
        self.high_water_ratio = high_water_ratio
        self.reserve_bytes = reserve_bytes
        self.deletes_oldest = deletes_oldest
        self._usage = usage or _disk_usage
        self._checked_at = -1.0
        self._state: DiskState | None = None

    def state(self, *, fresh: bool = False) -> DiskState:
        now = time.monotonic()
        if fresh or self._state is None or now - self._checked_at >= CHECK_INTERVAL_S:
            u = self._usage(self.path)
            self._state = DiskState(
                self.path,
                u.used / u.total if u.total else 0.0,
                u.free,
                self.high_water_ratio,
                self.reserve_bytes,
                self.deletes_oldest,
            )
            self._checked_at = now
        return self._state

    def check(self) -> None:
        """Raise :class:`DiskFullError` when the disk is past a mark."""
        state = self.state()
        if state.full:
            raise DiskFullError(state.refusal())

    def refused_by_os(self) -> DiskFullError:
        """The error for an append the OS refused with ENOSPC (between two readings)."""
        state = self.state(fresh=True)
        if state.full:
            return DiskFullError(state.refusal())
        return DiskFullError(
            f"the disk holding {self.path} had no room for the message: new messages are refused "
            f"until there is {state.meanwhile}"
        )


def _disk_usage(path: str) -> DiskUsage:
    u = shutil.disk_usage(path)
    return DiskUsage(u.total, u.used, u.free)
