"""SQL92 filter registrations as they are kept in ``config/filters.json``, and which bitmaps cover one.

When a group subscribes a topic with SQL92, the broker registers the expression under the bloom key
``group#topic`` and live dispatch sets the registration's bloom bits in the bitmap of every record
it matches. The broker (:mod:`siftmq.broker.filter_registry`) and the offline Spark jobs
(``reindex``, ``backfill``) both read and write the same file and must agree on which bitmaps hold a
registration's bits, so the file format and that rule live here, below both of them. Pure: the
callers do the file I/O.

A stored entry::

    {"group": "g", "topic": "T", "expression": "(a > 1)", "version": 2,
     "born_time_ms": 1700000000000, "last_seen_ms": 1700000100000,
     "backfill": {"version": 2, "until_ms": 1699999999000}}

``backfill`` is present once the backfill job computed this version's bits for the stored history;
it belongs to one version, so an entry whose ``backfill.version`` is not its ``version`` has none.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, TypeVar

import numpy as np
import numpy.typing as npt

from siftmq.errors import ConfigError, FilterError, NotFoundError, StatusCode
from siftmq.filter.compiler import compile_filter

#: Messages stored within this many ms after a registration's born time are evaluated exactly
#: rather than trusted to their bitmap: a safety margin around the registration (a born time is
#: never earlier than an older message's store time, so a clock that steps back is covered anyway).
REGISTRATION_MARGIN_MS = 1000

_R = TypeVar("_R", bound="Registration")


@dataclass(frozen=True, slots=True)
class Registration:
    """One ``group#topic`` SQL92 registration, as persisted."""

    group: str
    topic: str
    expression: str
    version: int
    born_time_ms: int
    last_seen_ms: int
    #: Records stored up to this time have this version's bits (set by the backfill job); None: never.
    backfilled_until_ms: int | None = None

    @property
    def bloom_key(self) -> str:
        return f"{self.group}#{self.topic}"

    def to_entry(self) -> dict[str, object]:
        entry: dict[str, object] = {
            "group": self.group,
            "topic": self.topic,
            "expression": self.expression,
            "version": self.version,
            "born_time_ms": self.born_time_ms,
            "last_seen_ms": self.last_seen_ms,
        }
        if self.backfilled_until_ms is not None:
            entry["backfill"] = {"version": self.version, "until_ms": self.backfilled_until_ms}
        return entry


def read_entries(items: object) -> tuple[list[Registration], list[str]]:
    """The registrations of a loaded ``filters.json``, and one problem per entry that was left out.

    An entry is left out when a field is missing or of the wrong type, or its expression does not
    compile (a file from a newer or older siftmq); unreadable backfill coverage is dropped alone,
    since without it the registration is only evaluated more exactly.
    """
    if not isinstance(items, list):
        return [], [f"expected a list of registrations, found {type(items).__name__}"]
    found: list[Registration] = []
    problems: list[str] = []
    for item in items:
        try:
            reg = Registration(
                str(item["group"]),
                str(item["topic"]),
                str(item["expression"]),
                int(item["version"]),
                int(item["born_time_ms"]),
                int(item["last_seen_ms"]),
            )
            compile_filter("SQL92", reg.expression)
        except (KeyError, TypeError, ValueError, FilterError) as exc:
            problems.append(f"dropping unreadable filter registration {item!r}: {exc}")
            continue
        until, problem = _backfill_of(item, reg.version)
        if problem:
            problems.append(problem)
        found.append(replace(reg, backfilled_until_ms=until))
    return found, problems


def with_backfill(current: _R | None, group: str, topic: str, *, version: int, until_ms: int) -> _R:
    """``current`` recorded as holding version ``version``'s bits up to ``until_ms``.

    Raises :class:`NotFoundError` if the registration is gone, and :class:`ConfigError` if its
    version is no longer ``version`` (the expression changed meanwhile: the bits are not its).
    Coverage only grows: an earlier, later ``until_ms`` is kept.
    """
    if current is None:
        raise NotFoundError(
            f"no SQL92 filter registration {group}#{topic}", status=StatusCode.CONSUMER_GROUP_NOT_FOUND
        )
    if current.version != version:
        raise ConfigError(
            f"the registration {group}#{topic} is at version {current.version}, not {version}: "
            "its expression changed since the backfill read it; run the backfill again"
        )
    if current.backfilled_until_ms is not None:
        until_ms = max(until_ms, current.backfilled_until_ms)
    return replace(current, backfilled_until_ms=until_ms)


def bitmap_covers(store_timestamp: int, born_time_ms: int, backfilled_until_ms: int | None) -> bool:
    """Whether the bitmap of a message stored at ``store_timestamp`` holds a registration's bits
    wherever the registration matches it (one message; :func:`bitmap_trusted` for many)."""
    if store_timestamp > born_time_ms + REGISTRATION_MARGIN_MS:
        return True
    return backfilled_until_ms is not None and store_timestamp <= backfilled_until_ms


def bitmap_trusted(
    store_timestamps: npt.NDArray[np.int64], born_time_ms: int, backfilled_until_ms: int | None
) -> npt.NDArray[np.bool_]:
    """Which of these messages have bitmaps that hold a registration's bits wherever it matches.

    True for messages stored more than :data:`REGISTRATION_MARGIN_MS` after ``born_time_ms``, and
    for messages stored at or before ``backfilled_until_ms`` (None: never backfilled).
    """
    ts = np.asarray(store_timestamps, dtype=np.int64)
    trusted = ts > born_time_ms + REGISTRATION_MARGIN_MS
    if backfilled_until_ms is not None:
        trusted |= ts <= backfilled_until_ms
    return trusted


def _backfill_of(item: Any, version: int) -> tuple[int | None, str]:
    """The backfill coverage of a stored entry if it belongs to ``version``, and a problem if unreadable."""
    backfill = item.get("backfill")
    if not isinstance(backfill, dict):
        return None, ""
    try:
        if int(backfill["version"]) != version:
            return None, ""
        return int(backfill["until_ms"]), ""
    except (KeyError, TypeError, ValueError):
        return None, f"ignoring unreadable backfill coverage {backfill!r}"
