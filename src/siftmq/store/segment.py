"""Fixed-size segment files named by their 20-digit zero-padded start offset.

Segments are written with positional file I/O (``os.pwrite``), except the segment the CommitLog
is appending to: that one is preallocated to its full size (``posix_fallocate``, so the disk space
is reserved and a full disk is an error when the segment is created, never a fault mid-write) and
written through a shared writable map, as RocketMQ's MappedFile does: a memory copy instead of a
system call per write (writes of :data:`MAP_WRITE_LIMIT` or more still use ``pwrite``, which is
faster for them). Bytes written to a shared map are in the page cache at once, exactly like a
``pwrite``'s: a killed process loses nothing, and ``fdatasync`` makes them durable. While a
segment is mapped for writing, its file is longer than its data and the bytes past ``length`` are
zeros (or what a failed write left there); :meth:`Segment.trim` cuts the file back
to ``length`` when the log rolls to the next segment and at a clean close, so at rest a file's
length is the bytes written, or the bytes written plus a zero tail after a crash (recovery finds
the end where nothing but zeros follows, and cuts the tail). Both the CommitLog (byte offsets) and the
ConsumeQueue (byte offsets of 20-byte entries) are made of segments.

Reads use ``os.pread``; the CommitLog also reads through :meth:`Segment.read_mapped`, a read-only
map of the file's first bytes (made when enough was written, extended in steps), which slices a
record out without a system call. A read map only ever covers bytes below ``length``, and a file
is cut below ``length`` (:meth:`Segment.truncate`) only while nobody reads it (recovery), so a
map never covers a hole past the end of its file.
"""

from __future__ import annotations

import itertools
import logging
import mmap
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from siftmq.durable import fsync_dir

_log = logging.getLogger(__name__)

NAME_DIGITS: Final = 20
_NAME_RE: Final = re.compile(r"^\d{20}$")
MAP_STEP: Final = 4 * 1024 * 1024  # read_mapped maps again once this many more bytes were written
# writes at least this long go through pwrite even to a mapped segment: a memory copy into the map
# is faster for small writes (no system call), pwrite for larger ones (they cross near 16 KiB)
MAP_WRITE_LIMIT: Final = 16 * 1024


def segment_name(start_offset: int) -> str:
    """``00000000000001048576`` for a segment starting at 1 MiB."""
    return f"{start_offset:0{NAME_DIGITS}d}"


def list_segment_starts(directory: Path) -> list[int]:
    """Start offsets of the segment files in ``directory``, sorted; other files are ignored."""
    if not directory.is_dir():
        return []
    starts = []
    for entry in os.scandir(directory):
        if entry.is_file() and _NAME_RE.match(entry.name):
            starts.append(int(entry.name))
        elif not entry.name.endswith(".tmp"):
            _log.warning("ignoring unexpected file %s in %s", entry.name, directory)
    return sorted(starts)


def sequential_starts(starts: list[int], step: int) -> list[int]:
    """The leading run of ``starts`` that are multiples of ``step`` with no gap between them.

    A ConsumeQueue's files stop at the first gap or misnamed start. (The CommitLog keeps the
    segments after a missing one, whose records name their own offsets: see
    :func:`siftmq.store.commitlog.open_segments`.)
    """
    kept: list[int] = []
    for start in starts:
        if start % step != 0 or (kept and start != kept[-1] + step):
            break
        kept.append(start)
    return kept


def missing_starts(starts: list[int], step: int) -> list[int]:
    """The starts of the segments missing between the first and the last of ``starts`` (sorted
    multiples of ``step``)."""
    missing: list[int] = []
    for before, after in itertools.pairwise(starts):
        missing.extend(range(before + step, after, step))
    return missing


def _pwrite_all(fd: int, data: bytes | bytearray | memoryview, pos: int) -> None:
    """``os.pwrite`` until every byte is written."""
    written = os.pwrite(fd, data, pos)
    while written < len(data):
        written += os.pwrite(fd, memoryview(data)[written:], pos + written)


@dataclass(slots=True)
class Segment:
    """One open segment file: ``[start_offset, start_offset + capacity)`` in its log's offsets.

    ``length`` is how many bytes of the file are valid; writes happen at ``length``.
    """

    directory: Path
    start_offset: int
    capacity: int
    fd: int = -1
    length: int = 0
    dirty: bool = field(default=False)
    # (map, mapped length): a read-only map of the file's first bytes, replaced as a whole
    read_map: tuple[mmap.mmap, int] | None = None
    # a writable shared map of the whole preallocated file (see map_for_writing)
    write_map: mmap.mmap | None = None

    @property
    def path(self) -> Path:
        """The file's path."""
        return self.directory / segment_name(self.start_offset)

    @property
    def end_offset(self) -> int:
        """The log offset right after the last valid byte."""
        return self.start_offset + self.length

    @classmethod
    def open(
        cls, directory: Path, start_offset: int, capacity: int, *, create: bool = False, writable: bool = True
    ) -> Segment:
        """Open (or create) the segment file; ``length`` is the file's current size."""
        flags = (os.O_RDWR if writable else os.O_RDONLY) | (os.O_CREAT if create else 0)
        seg = cls(directory, start_offset, capacity)
        seg.fd = os.open(seg.path, flags, 0o644)
        seg.length = os.fstat(seg.fd).st_size
        if create:
            fsync_dir(directory)
        return seg

    def map_for_writing(self) -> None:
        """Preallocate the file to ``capacity`` and write through a shared map from now on.

        When that cannot be done (no room on the disk for the whole segment, or a file system
        that cannot preallocate or map), nothing changes and ``write_map`` stays None: writes
        stay ``pwrite``, which reports a full disk write by write.
        """
        if self.write_map is not None:
            return
        try:
            os.posix_fallocate(self.fd, 0, self.capacity)
            self.write_map = mmap.mmap(self.fd, self.capacity)
        except OSError as exc:
            _log.warning("%s: cannot preallocate and map it (%s); writing with pwrite", self.path, exc)
            try:
                os.ftruncate(self.fd, self.length)
            except OSError:
                _log.exception("could not cut %s back to %d bytes", self.path, self.length)

    def trim(self) -> None:
        """Stop writing through the map and cut the preallocated tail: the file's length is
        ``length`` again (durable at the next :meth:`flush`; a zero tail that a crash left
        before then is cut by recovery)."""
        if self._drop_write_map():
            os.ftruncate(self.fd, self.length)
            self.dirty = True  # the next flush makes the new length durable

    def _drop_write_map(self) -> bool:
        """Close the write map (writes use ``pwrite`` from now on); False if there was none."""
        mm = self.write_map
        if mm is None:
            return False
        self.write_map = None
        mm.close()
        return True

    def write(self, data: bytes | bytearray) -> None:
        """Append ``data`` at ``length``; the caller keeps ``length + len(data)`` within ``capacity``.

        On failure the error is re-raised and ``length`` stays; a file written with ``pwrite`` is
        cut back to it.
        """
        pos = self.length
        end = pos + len(data)
        if self.write_map is None:
            try:
                _pwrite_all(self.fd, data, pos)
            except OSError:
                try:
                    os.ftruncate(self.fd, pos)
                except OSError:
                    _log.exception("could not cut back %s after a failed write", self.path)
                raise
        else:
            # the first 8 bytes (a record's size and magic code) last: a reader of the file that
            # finds them finds the whole write (see siftmq.store.bulk). A crash in between can leave
            # the later records of the write complete after a first one without its magic code:
            # recovery cuts that as a torn tail (CommitLog.scan), not as damage to pass over.
            view = memoryview(data)
            if len(data) < MAP_WRITE_LIMIT:
                self.write_map[pos + 8 : end] = view[8:]
                self.write_map[pos : pos + 8] = view[:8]
            else:  # fills whole pages without the map's page faults
                _pwrite_all(self.fd, view[8:], pos + 8)
                _pwrite_all(self.fd, view[:8], pos)
        # dirty before the length grows: a flush in another thread that reads the new length (the
        # commit log's target) then finds the segment dirty and syncs it. The other way round, a
        # flush between the two lines synced nothing and counted the write as durable, and a sync
        # send was answered with nothing on disk.
        self.dirty = True
        self.length = end

    def overwrite(self, pos: int, data: bytes) -> None:
        """Write ``data`` over bytes already written at ``pos`` (recovery's repair of an index
        unit that disagrees with its record; nobody reads the file meanwhile)."""
        if pos < 0 or pos + len(data) > self.length:
            raise ValueError(f"{self.path}: overwrite of {pos}..{pos + len(data)} past {self.length}")
        if self.write_map is None:
            _pwrite_all(self.fd, data, pos)
        else:
            self.write_map[pos : pos + len(data)] = data
        self.dirty = True

    def unwrite(self, length: int) -> None:
        """Take back what was written past ``length`` (a write that must not stand): zeroed in the
        map, or cut from the file, so that neither recovery nor a reader takes it for records."""
        if self.write_map is not None:
            self.write_map[length : self.length] = bytes(self.length - length)
        else:
            os.ftruncate(self.fd, length)
        self.dirty = True
        self.length = length

    def read(self, pos: int, size: int) -> bytes:
        """Up to ``size`` bytes at file position ``pos`` (short only at the end of valid data)."""
        size = max(0, min(size, self.length - pos))
        if size == 0:
            return b""
        return os.pread(self.fd, size, pos)

    def read_mapped(self, pos: int, size: int) -> bytes | None:
        """``size`` bytes at ``pos`` sliced from the read map; None when they are not mapped.

        The map is made (or made again, larger) when at least :data:`MAP_STEP` bytes (an eighth
        of a smaller segment) that it does not cover were written; until then the caller reads
        with :meth:`read`. A page not in the page cache is read from disk holding the GIL.
        """
        mapped = self.read_map
        if mapped is not None and pos + size <= mapped[1]:
            return mapped[0][pos : pos + size]
        length = self.length
        unmapped = length - (0 if mapped is None else mapped[1])
        if unmapped < min(MAP_STEP, self.capacity >> 3) or unmapped <= 0 or pos + size > length:
            return None
        try:
            mm = mmap.mmap(self.fd, length, access=mmap.ACCESS_READ)
        except (OSError, ValueError):  # closed meanwhile (retention), or cannot map: read instead
            return None
        self.read_map = (mm, length)  # the old map goes when its last reader drops it
        return mm[pos : pos + size]

    def flush(self) -> None:
        """fdatasync the file if it was written since the last flush."""
        if self.dirty:
            self.dirty = False  # cleared first: a write during the sync sets it again
            try:
                os.fdatasync(self.fd)
            except BaseException:
                self.dirty = True  # the next flush syncs it again (it did not count as done)
                raise

    def truncate(self, length: int) -> None:
        """Cut the file to ``length`` bytes and make it durable (nobody may read it meanwhile).

        A write map is dropped first (writes go through ``pwrite`` until mapped again).
        """
        self.read_map = None
        self._drop_write_map()
        os.ftruncate(self.fd, length)
        os.fsync(self.fd)
        self.length = length

    def close(self) -> None:
        """Close the file descriptor (a read map goes when its last reader drops it); the
        preallocated tail of a segment mapped for writing stays (see :meth:`trim`)."""
        self.read_map = None
        self._drop_write_map()
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def destroy(self, *, defer_close: bool = False) -> None:
        """Delete the file; close it now, or later with ``defer_close`` (readers may still hold it)."""
        if not defer_close:
            self.close()
        try:
            self.path.unlink()
        except FileNotFoundError:
            pass
