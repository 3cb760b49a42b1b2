"""Crash-safe JSON files for the broker's own state (topics, filter registrations, consumer progress).

A write goes to a temporary file that is fsynced and renamed over the old one, then the directory
is fsynced: a reader (or a restart after kill -9) sees the old file or the new one, never a torn one.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

from siftmq.errors import ConfigError

_log = logging.getLogger(__name__)


def write_json(path: Path, data: Any) -> None:
    """Atomically replace ``path`` with ``data`` as JSON."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    payload = json.dumps(data, separators=(",", ":"), sort_keys=True).encode()
    with open(tmp, "wb") as f:
        f.write(payload)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def read_json(path: Path, default: Any, *, strict: bool = False) -> Any:
    """The JSON in ``path``; ``default`` when it does not exist.

    A corrupt file is kept aside and logged, or with ``strict`` (consumer progress, where starting
    from nothing could skip messages) a :class:`ConfigError` that stops the broker from starting.
    """
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return default
    try:
        return json.loads(raw)
    except ValueError as exc:
        if strict:
            raise ConfigError(
                f"{path} is not valid JSON ({exc}); restore it from a backup, or remove it to let every "
                "group start again from the queue rules (messages may be skipped or delivered twice)"
            ) from exc
        aside = path.with_name(path.name + ".corrupt")
        os.replace(path, aside)
        _log.error("%s is not valid JSON; moved to %s and starting from defaults", path, aside)
        return default
