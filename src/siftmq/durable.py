"""Files replaced durably: what survives a crash or a power loss is the old file or the new one
(any layer may import this module: the store's state files, the broker's auth file, a client's
offsets file)."""

from __future__ import annotations

import os
from pathlib import Path


def fsync_dir(directory: Path) -> None:
    """Make a file creation, deletion or rename in ``directory`` durable."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomically(path: Path, payload: bytes, *, mode: int = 0o644) -> None:
    """Replace ``path`` with ``payload`` durably: write a temporary file, fsync it, rename, fsync the dir.
    The file gets ``mode`` (a temporary file left over from a crash may have had another)."""
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        os.fchmod(fd, mode)
        view = memoryview(payload)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    fsync_dir(path.parent)
