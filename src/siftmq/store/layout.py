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

A store written before this file existed gets one at its next open; its segment size is then
checked against the spacing of its segment files when there are three or more. A damaged file is
refused at open, naming it and the remedy, and nothing is changed: the record limit it held may be
larger than any setting or older generation of the file says (the limit grows, so the previous
generation can hold a lower one), and a lower limit would turn the larger records into damage.
Only a file missing beside its previous generation (a crash between the renames of a write) is
read from that generation: the write is made at open, before any record under its limit.
"""

from __future__ import annotations

import itertools
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from siftmq.errors import ConfigError
from siftmq.store import codec
from siftmq.store.segment import list_segment_starts
from siftmq.store.statefile import DamagedStateError, peek_json, previous_of, read_generation, write_json

_log = logging.getLogger(__name__)

LAYOUT_FILE: Final = "layout.json"


@dataclass(frozen=True, slots=True)
class Layout:
    segment_size: int
    max_record_size: int  # the largest ever in force: every stored record is within it


def settle(data_dir: Path, segment_size: int, max_record_size: int) -> Layout:
    """The layout the store at ``data_dir`` is opened with (saved when new or grown); raises
    :class:`ConfigError` when ``segment_size`` is not the one its files were written with."""
    path = data_dir / LAYOUT_FILE
    saved = _saved(path, segment_size)
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


def _saved(path: Path, segment_size: int) -> dict[str, Any]:
    """What ``layout.json`` holds ({} for a store without one); :class:`ConfigError` with the
    remedy when it cannot be believed."""
    previous = previous_of(path)
    try:
        try:
            saved = read_generation(path)
        except FileNotFoundError:
            if not previous.exists():
                return {}
            saved = read_generation(previous)
            _log.warning("%s is missing (a crash while it was being replaced); using %s", path, previous.name)
        if not _well_formed(saved):
            raise DamagedStateError(f"{path} does not hold a segment size and a record limit")
    except DamagedStateError as exc:
        raise ConfigError(
            f"{exc}. It keeps the largest record size the store's records were written under; "
            "opened with a lower one, the larger records would read as damage, so nothing was "
            "changed. Restore it from a backup; or remove it (and its .prev) and start once with "
            "max_body_size at least the largest it has ever been for this store (it can be lowered "
            "again after that start); or, when that is not known, write "
            f'{{"commit_log_segment_size": {segment_size}, "max_record_size": '
            f"{segment_size - codec.BLANK_MARKER_SIZE}}} into it (the largest record a segment can "
            "hold: every record is within it)"
        ) from exc
    return dict(saved)


def _well_formed(saved: Any) -> bool:
    return isinstance(saved, dict) and all(
        type(saved.get(key, 1)) is int and saved.get(key, 1) > 0
        for key in ("commit_log_segment_size", "max_record_size")
    )


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
