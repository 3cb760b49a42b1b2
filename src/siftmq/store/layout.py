"""The settings a store's files were written under, kept beside them (``layout.json``).

Two settings shape the files: ``commit_log_segment_size`` (the spacing of the segment files, and
where a segment's blank marker must be) and the largest record a message could make
(``max_message_size`` plus headers), which recovery and reads use to tell a record from damage.
Opened with another segment size, recovery would take the later segments for misplaced ones and
the first one's end for a torn tail; with a lower record limit, the larger records already stored
would read as damage. Neither is the operator asking for messages to go, so:

- a different segment size is refused at open, naming both sizes;
- the record limit the store reads with is the largest it was ever written under: lowering
  ``max_message_size`` limits new messages only.

A store written before this file existed, or whose file is damaged, gets one at its next open; its
segment size is then checked against the spacing of its segment files when there are three or more.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from siftmq.errors import ConfigError
from siftmq.store.segment import list_segment_starts
from siftmq.store.statefile import peek_json, read_json, write_json

LAYOUT_FILE: Final = "layout.json"


@dataclass(frozen=True, slots=True)
class Layout:
    segment_size: int
    max_record_size: int  # the largest ever in force: every stored record is within it


def settle(data_dir: Path, segment_size: int, max_record_size: int) -> Layout:
    """The layout the store at ``data_dir`` is opened with (saved when new or grown); raises
    :class:`ConfigError` when ``segment_size`` is not the one its files were written with."""
    path = data_dir / LAYOUT_FILE
    # damaged past its previous generation: put aside (logged) and found again from the files
    saved: dict[str, Any] = read_json(path, {})
    if not isinstance(saved, dict):
        saved = {}
    written_with = saved.get("commit_log_segment_size") or _spacing(data_dir / "commitlog")
    if written_with is not None and written_with != segment_size:
        raise ConfigError(
            f"commit_log_segment_size is {segment_size}, but the store in {data_dir} was written with "
            f"{written_with}: a store's segment size cannot change; set commit_log_segment_size = "
            f"{written_with} (or use another data dir)"
        )
    largest = max(int(saved.get("max_record_size", 0)), max_record_size)
    layout = Layout(segment_size, largest)
    if saved != {"commit_log_segment_size": segment_size, "max_record_size": largest}:
        write_json(path, {"commit_log_segment_size": segment_size, "max_record_size": largest})
    return layout


def saved_segment_size(data_dir: Path) -> int | None:
    """The segment size ``layout.json`` keeps for the store at ``data_dir`` (None without one),
    read without writing anything: for the offline tools, which must not change a stopped store.
    A damaged file counts as none (the broker's next open finds the size again from the files)."""
    try:
        saved = peek_json(data_dir / LAYOUT_FILE, {})
    except ConfigError:
        return None
    size = saved.get("commit_log_segment_size") if isinstance(saved, dict) else None
    return size if isinstance(size, int) and size > 0 else None


def _spacing(log_dir: Path) -> int | None:
    """The segment size the files show: the common spacing of three or more (two may be one
    segment and a stray file, which recovery quarantines; None when they show none)."""
    starts = list_segment_starts(log_dir)
    steps = {b - a for a, b in itertools.pairwise(starts)}
    return steps.pop() if len(starts) >= 3 and len(steps) == 1 else None
