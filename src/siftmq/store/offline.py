"""Offline maintenance of a closed store: exclusive access, staged index builds, crash-safe installs.

The offline jobs (``siftmq spark reindex``/``backfill``) write ConsumeQueue and ConsumeQueueExt files
of a store that no broker has open. This module gives them three things:

* :func:`open_offline` holds the store's ``lock`` file (the ``flock`` every open
  :class:`~siftmq.store.store.MessageStore` holds) for the whole job, so a broker cannot open the
  store meanwhile; it refuses a store that is in use, or one whose ``abort`` marker says the last
  run crashed (its CommitLog tail is only settled by the broker's recovery).
* :class:`IndexStaging` is a tree ``<store>/index-staging/new/`` with the store's own layout
  (``consumequeue/<topic>/<queue_id>/``, ``consumequeue_ext/<topic>/<queue_id>/``), where complete new
  queue directories are written with the store's own ConsumeQueue and ConsumeQueueExt writers
  (:func:`open_queue`), possibly by several processes at once.
* :func:`install` moves staged directories into the store with a redo journal:

  1. every staged file and directory is fsynced;
  2. ``<store>/index-install.json`` is written atomically, naming the store paths to replace and the
     checkpoint to write afterwards;
  3. for each path, the store's current directory is renamed into ``index-staging/old/`` and the
     staged one renamed into its place (renames within one filesystem);
  4. the checkpoint is written, the journal deleted, the staging tree removed.

  A crash before step 2 leaves the store as it was (the stale staging tree is deleted by the next
  job or the next store open). A crash after it is redone from where it stopped by
  :func:`finish_pending_install`, which :meth:`MessageStore.start` calls before loading the queues.
  Every rename is atomic, so a directory is always either its complete old or complete new version
  (between the two renames of one path it is briefly absent; the redo puts the new one there).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import shutil
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from siftmq.durable import fsync_dir, write_atomically
from siftmq.errors import StoreError, StoreLockedError
from siftmq.store.consumequeue import ConsumeQueue
from siftmq.store.consumequeue_ext import ConsumeQueueExt
from siftmq.store.recovery import TAKEN_FILE, Checkpoint

_log = logging.getLogger(__name__)

STAGING_DIR: Final = "index-staging"
JOURNAL_FILE: Final = "index-install.json"
CONSUME_QUEUE_DIR: Final = "consumequeue"
CONSUME_QUEUE_EXT_DIR: Final = "consumequeue_ext"


@dataclass(frozen=True, slots=True)
class IndexLayout:
    """The index file geometry of a store (must match the StoreConfig the broker opens it with)."""

    entries_per_file: int
    bitmap_size: int
    #: the extension units hold bitmap checks (see :func:`~siftmq.store.consumequeue_ext.units_checked`)
    ext_checked: bool


def queue_path(kind: str, topic: str, queue_id: int) -> str:
    """The store-relative directory of one queue's ConsumeQueue (``kind`` = :data:`CONSUME_QUEUE_DIR`)
    or ConsumeQueueExt (:data:`CONSUME_QUEUE_EXT_DIR`) files."""
    return f"{kind}/{topic}/{queue_id}"


def open_queue(
    root: Path, topic: str, queue_id: int, layout: IndexLayout, *, ext: bool = True
) -> ConsumeQueue:
    """The ConsumeQueue (with its extension when ``ext``) of one queue in the tree ``root``, loaded.

    ``root`` is a store directory or a staging tree; missing directories are an empty queue (its
    first :meth:`~ConsumeQueue.put_encoded` creates them). Loading a cleanly closed store's files
    changes nothing in them.
    """
    extension = None
    if ext:
        extension = ConsumeQueueExt(
            root / queue_path(CONSUME_QUEUE_EXT_DIR, topic, queue_id),
            layout.entries_per_file,
            layout.bitmap_size,
            checked=layout.ext_checked,
        )
    cq = ConsumeQueue(
        topic,
        queue_id,
        root / queue_path(CONSUME_QUEUE_DIR, topic, queue_id),
        layout.entries_per_file,
        extension,
    )
    cq.load()
    return cq


def open_queue_ext(root: Path, topic: str, queue_id: int, layout: IndexLayout) -> ConsumeQueueExt:
    """The ConsumeQueueExt of one queue in the tree ``root`` alone, loaded (see :func:`open_queue`)."""
    ext = ConsumeQueueExt(
        root / queue_path(CONSUME_QUEUE_EXT_DIR, topic, queue_id),
        layout.entries_per_file,
        layout.bitmap_size,
        checked=layout.ext_checked,
    )
    ext.log.load()
    return ext


def stored_queues(store_dir: Path) -> list[tuple[str, int]]:
    """Every (topic, queue_id) with a ConsumeQueue directory in the store."""
    root = store_dir / CONSUME_QUEUE_DIR
    found: list[tuple[str, int]] = []
    if not root.is_dir():
        return found
    for topic_dir in sorted(root.iterdir()):
        if topic_dir.is_dir():
            found += [
                (topic_dir.name, int(q.name)) for q in topic_dir.iterdir() if q.is_dir() and q.name.isdigit()
            ]
    return sorted(found)


class IndexStaging:
    """The staging tree of one install: build under :attr:`root`, then :func:`install`."""

    def __init__(self, store_dir: Path) -> None:
        self.store_dir = store_dir
        self.base = store_dir / STAGING_DIR
        self.root = self.base / "new"

    def discard(self) -> None:
        """Delete everything staged."""
        shutil.rmtree(self.base, ignore_errors=True)

    def copy_from_store(self, path: str) -> bool:
        """Stage an unchanged copy of the store's directory ``path``; False if the store has none."""
        source = self.store_dir / path
        if not source.is_dir():
            return False
        target = self.root / path
        shutil.rmtree(target, ignore_errors=True)
        shutil.copytree(source, target)
        return True


class OfflineStore:
    """Exclusive access to a closed store for the duration of an offline job (see :func:`open_offline`)."""

    def __init__(self, store_dir: Path, lock_fd: int) -> None:
        self.store_dir = store_dir
        self._lock_fd = lock_fd

    def new_staging(self) -> IndexStaging:
        """An empty staging tree (anything left by an earlier, unfinished job is deleted)."""
        staging = IndexStaging(self.store_dir)
        staging.discard()
        staging.root.mkdir(parents=True)
        return staging

    def release(self) -> None:
        if self._lock_fd >= 0:
            os.close(self._lock_fd)  # closing the descriptor drops the flock
            self._lock_fd = -1


@contextlib.contextmanager
def open_offline(store_dir: Path, *, what: str = "the store") -> Iterator[OfflineStore]:
    """Hold ``store_dir``'s lock for a ``with`` block; finish an interrupted install first.

    Raises :class:`StoreError` if ``store_dir`` holds no store or was not closed cleanly, and
    :class:`StoreLockedError` while a broker (or another job) has it open. ``what`` names the
    directory in those messages (e.g. the broker's data dir).
    """
    if not (store_dir / "commitlog").is_dir():
        raise StoreError(f"{what} holds no siftmq store ({store_dir / 'commitlog'} does not exist)")
    fd = os.open(store_dir / "lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError as exc:
        os.close(fd)
        raise StoreLockedError(
            f"{what} is in use: a broker (or another job) has {store_dir} open; stop it and run this again"
        ) from exc
    offline = OfflineStore(store_dir, fd)
    try:
        unfinished = [store_dir / name for name in ("abort", TAKEN_FILE) if (store_dir / name).exists()]
        if unfinished:  # (a recovery cut short leaves its note of taken offsets)
            raise StoreError(
                f"{what} was not closed cleanly ({unfinished[0]} exists): start the broker once so "
                "it recovers the CommitLog, stop it, then run this again"
            )
        finish_pending_install(store_dir)
        yield offline
    finally:
        offline.release()


# ------------------------------------------------------------------------------------------- install


def install(staging: IndexStaging, paths: Sequence[str], *, checkpoint: Checkpoint | None = None) -> None:
    """Replace the store directories ``paths`` (store-relative) with their staged versions.

    Every path must have been staged (an empty directory replaces a store directory by nothing).
    ``checkpoint`` (if given) is written once all are in place. See the module doc for the protocol.
    """
    store_dir = staging.store_dir
    for path in paths:
        staged = staging.root / path
        if not staged.is_dir():
            raise StoreError(f"nothing staged for {path} in {staging.root}")
    _fsync_tree(staging.root)
    fsync_dir(staging.base)
    journal = {
        "paths": list(paths),
        "checkpoint": None
        if checkpoint is None
        else {
            "commit_log_flushed_offset": checkpoint.commit_log_flushed_offset,
            "consume_queue_flushed_offset": checkpoint.consume_queue_flushed_offset,
        },
    }
    write_atomically(store_dir / JOURNAL_FILE, json.dumps(journal, sort_keys=True).encode())
    finish_pending_install(store_dir)


def finish_pending_install(store_dir: Path) -> bool:
    """Redo an install a crash interrupted (the caller holds the store's lock); True if there was one.

    Without a journal, a leftover staging tree is an unfinished build and is deleted.
    """
    journal_path = store_dir / JOURNAL_FILE
    staging = IndexStaging(store_dir)
    try:
        journal = json.loads(journal_path.read_bytes())
        paths = [str(p) for p in journal["paths"]]
        saved = journal.get("checkpoint")
        checkpoint = (
            None
            if saved is None
            else Checkpoint(
                int(saved["commit_log_flushed_offset"]), int(saved["consume_queue_flushed_offset"])
            )
        )
    except FileNotFoundError:
        if staging.base.exists():
            _log.warning("%s: deleting the unfinished index build %s", store_dir, staging.base)
            staging.discard()
        return False
    except (ValueError, KeyError, TypeError) as exc:
        raise StoreError(
            f"{journal_path} is damaged ({exc}); the index install it describes cannot be finished"
        ) from exc
    for path in paths:
        _swap_in(store_dir, staging, path)
    if checkpoint is not None:
        checkpoint.save(store_dir / "checkpoint")
    journal_path.unlink()
    fsync_dir(store_dir)
    staging.discard()
    _log.info("%s: installed rebuilt index directories %s", store_dir, ", ".join(paths))
    return True


def _swap_in(store_dir: Path, staging: IndexStaging, path: str) -> None:
    new = staging.root / path
    if not new.exists():
        return  # moved into place before a crash
    target = store_dir / path
    if target.exists():
        old = staging.base / "old" / path
        old.parent.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(old, ignore_errors=True)
        os.rename(target, old)
    target.parent.mkdir(parents=True, exist_ok=True)
    os.rename(new, target)
    fsync_dir(target.parent)


def _fsync_tree(root: Path) -> None:
    """fsync every file and directory under ``root`` (files written by other processes included)."""
    for dirpath, _dirs, files in os.walk(root, topdown=False):
        for name in files:
            fd = os.open(os.path.join(dirpath, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        fsync_dir(Path(dirpath))
