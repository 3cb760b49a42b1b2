"""Retention: delete whole CommitLog segments by age (or, when the operator chose it, for space),
then trim the ConsumeQueues.

A CommitLog segment is deleted when its file's last modification is older than
``file_reserved_time_ms`` (RocketMQ uses the file's mtime too). A younger segment holds messages
that may not be consumed yet, so it is deleted for space only under ``disk_full_policy =
"delete_oldest"`` — oldest first, one at a time, while the disk holding the store is fuller than
``disk_max_used_space_ratio`` — and ``before_forced_delete(start, end)`` is told each such
segment's CommitLog range first (the broker counts and logs what groups had not consumed). Under
the default policy, ``refuse``, a full disk refuses appends instead (``disk.py``). The segment
being written is never deleted. Afterwards every ConsumeQueue deletes its whole segments
whose entries all point below the new CommitLog minimum and advances its minimum offset;
readers still holding a deleted segment keep a valid descriptor until the next pass.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from siftmq.store.store import MessageStore


@dataclass(frozen=True, slots=True)
class RetentionResult:
    """What one retention pass removed."""

    commit_log_segments: int
    consume_queue_segments: int
    commit_log_min_offset: int
    #: of ``commit_log_segments``, those deleted for space before they expired
    forced_segments: int = 0


def disk_usage_ratio_of(path: os.PathLike[str] | str) -> Callable[[], float]:
    """A callable giving the used/total ratio of the file system holding ``path``."""

    def ratio() -> float:
        usage = shutil.disk_usage(path)
        return usage.used / usage.total if usage.total else 0.0

    return ratio


def delete_expired(
    store: MessageStore,
    *,
    now_ms: int | None = None,
    disk_usage_ratio: Callable[[], float] | None = None,
    before_forced_delete: Callable[[int, int], None] | None = None,
) -> RetentionResult:
    """One retention pass over ``store``."""
    cfg = store.config
    now = time.time_ns() // 1_000_000 if now_ms is None else now_ms
    usage = disk_usage_ratio or disk_usage_ratio_of(store.data_dir)
    append_lock, dispatch_lock = store._retention_locks()
    cl = store.commit_log
    cl.close_deleted()
    deleted = forced = 0
    while len(cl.segments()) > 1:
        first = cl.segments()[0]
        mtime_ms = os.stat(first.path).st_mtime_ns // 1_000_000
        if mtime_ms + cfg.file_reserved_time_ms > now:  # not expired
            if cfg.disk_full_policy != "delete_oldest" or usage() <= cfg.disk_max_used_space_ratio:
                break
            if before_forced_delete is not None:
                before_forced_delete(first.start_offset, first.start_offset + first.length)
            forced += 1
        with append_lock:
            cl.delete_first_segment()
        deleted += 1
    cq_deleted = 0
    with dispatch_lock:
        for cq in store._all_queues():
            cq.log.close_deleted()
            if cq.ext is not None:
                cq.ext.log.close_deleted()
            cq_deleted += cq.delete_expired(cl.min_offset)
    if store.key_index is not None:
        if deleted:
            store.key_index.prune(cl.min_offset)
        store.key_index.trim(cfg.key_index_max_messages)
    return RetentionResult(deleted, cq_deleted, cl.min_offset, forced)
