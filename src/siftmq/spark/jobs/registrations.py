"""The broker's SQL92 registrations as the offline jobs read and update them (``config/filters.json``).

The jobs run on a stopped broker's data dir (:func:`~siftmq.store.offline.open_offline` holds its
lock), so they own the file while they run. The format and the rule of which bitmaps a registration
covers are the broker's own, from :mod:`siftmq.filter.registrations`.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from siftmq.filter import BloomFilter, CompiledFilter, compile_filter
from siftmq.filter.registrations import Registration, read_entries, with_backfill
from siftmq.store.statefile import read_json, write_json

_log = logging.getLogger(__name__)

FILTERS_FILE = "filters.json"


class RegistrationFile:
    """The registrations of one data dir, read once; :meth:`record_backfill` writes the file back."""

    def __init__(self, config_dir: Path) -> None:
        self.path = config_dir / FILTERS_FILE
        records, problems = read_entries(read_json(self.path, []))
        for problem in problems:
            _log.error("%s: %s", self.path, problem)
        self._by_key = {(r.group, r.topic): r for r in records}

    def all(self) -> list[Registration]:
        return sorted(self._by_key.values(), key=lambda r: (r.group, r.topic))

    def get(self, group: str, topic: str) -> Registration | None:
        return self._by_key.get((group, topic))

    def record_backfill(self, group: str, topic: str, *, version: int, until_ms: int) -> Registration:
        """Record the backfill coverage of ``group#topic`` (as the broker's registry would) and save."""
        reg = with_backfill(self.get(group, topic), group, topic, version=version, until_ms=until_ms)
        self._by_key[(group, topic)] = reg
        write_json(self.path, [r.to_entry() for r in self._by_key.values()])
        _log.info("recorded backfill of %s v%d up to %d", reg.bloom_key, version, reg.backfilled_until_ms)
        return reg


@dataclass(frozen=True, slots=True)
class RegistrationSpec:
    """A registration as the executors need it (picklable; compiled where it is used)."""

    group: str
    topic: str
    expression: str
    version: int
    born_time_ms: int
    backfilled_until_ms: int | None
    positions: tuple[int, ...]

    @classmethod
    def of(cls, reg: Registration) -> RegistrationSpec:
        # The broker's bloom filter has the default parameters too, so these are the bits it reads.
        positions = tuple(BloomFilter().bit_positions(reg.bloom_key))
        return cls(
            reg.group,
            reg.topic,
            reg.expression,
            reg.version,
            reg.born_time_ms,
            reg.backfilled_until_ms,
            positions,
        )

    @property
    def bloom_key(self) -> str:
        return f"{self.group}#{self.topic}"

    def compiled(self) -> CompiledFilter:
        return compile_filter("SQL92", self.expression)


def specs_by_topic(registrations: Iterable[Registration]) -> dict[str, tuple[RegistrationSpec, ...]]:
    by_topic: dict[str, list[RegistrationSpec]] = {}
    for reg in registrations:
        by_topic.setdefault(reg.topic, []).append(RegistrationSpec.of(reg))
    return {topic: tuple(specs) for topic, specs in by_topic.items()}
