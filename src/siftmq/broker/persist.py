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


def read_json(path: Path, default: Any) -> Any:
    """The JSON in ``path``; ``default`` when it does not exist. A corrupt file is kept aside and logged."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return default
    try:
        return json.loads(raw)
    except ValueError:
        aside = path.with_name(path.name + ".corrupt")
        os.replace(path, aside)
        _log.error("%s is not valid JSON; moved to %s and starting from defaults", path, aside)
        return default
