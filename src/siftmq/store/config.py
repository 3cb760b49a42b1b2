"""StoreConfig: every tunable of the message store, validated once."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Final, Literal

from siftmq.errors import ConfigError
from siftmq.store import codec

GIB: Final = 1024**3
MIB: Final = 1024**2


@dataclass(frozen=True, slots=True)
class StoreConfig:
    """Configuration of a :class:`~siftmq.store.store.MessageStore`.

    Durability (``flush_mode``):

    * ``"sync"`` — ``put_message`` returns after the record is fdatasync'ed; appends from
      several threads share one fdatasync (group commit). Messages become visible to readers
      only once durable.
    * ``"async"`` — a background thread flushes every ``flush_interval_ms``. A process crash
      (kill -9) loses nothing (the page cache survives); an OS crash or power loss may lose the
      messages acknowledged in the last ``flush_interval_ms`` plus the duration of one flush.

    In both modes the indexes are written by a background reput thread; every read that starts
    after ``put_message`` returned sees the message all the same (see ``store.py``).

    Disk space: the CommitLog segment being written is preallocated to ``commit_log_segment_size``
    bytes when it is created (see ``segment.py``), so a running store holds that much more than
    its data. Appends are refused (:class:`~siftmq.errors.DiskFullError`) while the disk is used
    at or above ``disk_high_water_ratio`` or has less than ``disk_reserve_bytes`` free (see
    ``disk.py``). Retention deletes segments older than ``file_reserved_time_ms``; it deletes
    younger ones for space only with ``disk_full_policy = "delete_oldest"`` (oldest first, while
    the disk is fuller than ``disk_max_used_space_ratio``).
    """

    data_dir: Path
    commit_log_segment_size: int = GIB
    consume_queue_entries_per_file: int = 300_000
    max_message_size: int = 4 * MIB
    flush_mode: Literal["sync", "async"] = "async"
    flush_interval_ms: int = 500
    enable_consume_queue_ext: bool = True
    bitmap_size: int = 14
    max_transfer_bytes: int = 256 * 1024
    max_transfer_count: int = 32
    file_reserved_time_ms: int = 72 * 3600 * 1000
    disk_max_used_space_ratio: float = 0.75
    disk_full_policy: Literal["refuse", "delete_oldest"] = "refuse"
    disk_high_water_ratio: float = 0.90
    disk_reserve_bytes: int = 64 * MIB
    build_key_index: bool = True
    #: ids the in-memory key index holds at most (the oldest go at the next retention pass):
    #: ~150-200 bytes each, so ~2 GB at the default; a retry is found as long as its id is held
    key_index_max_messages: int = 10_000_000

    def __post_init__(self) -> None:
        object.__setattr__(self, "data_dir", Path(self.data_dir))
        if self.flush_mode not in ("sync", "async"):
            raise ConfigError(f"flush_mode must be 'sync' or 'async', not {self.flush_mode!r}")
        if self.max_message_size < 1:
            raise ConfigError("max_message_size must be positive")
        if self.commit_log_segment_size < smallest_segment(self.max_message_size):
            raise ConfigError(
                f"commit_log_segment_size {self.commit_log_segment_size} cannot hold a record of "
                f"{self.max_record_size} bytes (max_message_size plus headers)"
            )
        if self.consume_queue_entries_per_file < 1:
            raise ConfigError("consume_queue_entries_per_file must be positive")
        if not 1 <= self.bitmap_size <= 4096:
            raise ConfigError("bitmap_size must be in 1..4096 bytes")
        if self.key_index_max_messages < 1:
            raise ConfigError("key_index_max_messages must be positive")
        if self.flush_interval_ms < 1:
            raise ConfigError("flush_interval_ms must be positive")
        if self.max_transfer_bytes < 1 or self.max_transfer_count < 1:
            raise ConfigError("max_transfer_bytes and max_transfer_count must be positive")
        if not 0.0 < self.disk_max_used_space_ratio <= 1.0:
            raise ConfigError("disk_max_used_space_ratio must be in (0, 1]")
        if self.disk_full_policy not in ("refuse", "delete_oldest"):
            raise ConfigError(
                f"disk_full_policy must be 'refuse' or 'delete_oldest', not {self.disk_full_policy!r}"
            )
        if not 0.0 < self.disk_high_water_ratio <= 1.0:
            raise ConfigError("disk_high_water_ratio must be in (0, 1]")
        if self.disk_reserve_bytes < 0:
            raise ConfigError("disk_reserve_bytes must not be negative")

    @property
    def max_record_size(self) -> int:
        """The largest CommitLog record a message within the limits can produce."""
        return max_record_size(self.max_message_size)


def max_record_size(max_message_size: int) -> int:
    """The largest CommitLog record a body of ``max_message_size`` bytes can produce."""
    return codec.HEADER_SIZE + max_message_size + 1 + codec.MAX_TOPIC_LENGTH + 2 + codec.MAX_PROPERTIES_LENGTH


def smallest_segment(max_message_size: int) -> int:
    """The smallest ``commit_log_segment_size`` that holds such a record and its blank marker."""
    return max_record_size(max_message_size) + codec.BLANK_MARKER_SIZE
