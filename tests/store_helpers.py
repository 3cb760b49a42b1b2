"""Helpers of the store tests: small segments so roll-overs happen with few messages."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from siftmq.store import Message, StoreConfig

SMALL: dict[str, Any] = {
    "commit_log_segment_size": 1 << 20,
    "max_message_size": 64 * 1024,
    "consume_queue_entries_per_file": 16,
    "flush_interval_ms": 50,
}


def small_config(data_dir: Path, **overrides: Any) -> StoreConfig:
    """A StoreConfig with tiny segments."""
    return StoreConfig(data_dir, **{**SMALL, **overrides})


def msg(topic: str = "T", body: bytes = b"hello", queue_id: int = 0, **props: str) -> Message:
    """A message with ``props`` as properties (TAGS=..., KEYS=..., UNIQ_KEY=...)."""
    return Message(topic=topic, body=body, queue_id=queue_id, properties=props)


def flip_byte(path: Path, at: int, mask: int = 0x5A) -> None:
    """Damage a file in place, as a disk would: the byte at ``at`` XORed with ``mask``."""
    with path.open("r+b") as f:
        f.seek(at)
        byte = f.read(1)[0]
        f.seek(at)
        f.write(bytes([byte ^ mask]))


def flip_log_byte(store_dir: Path, commit_log_offset: int, mask: int = 0x5A) -> None:
    """:func:`flip_byte` at a CommitLog offset of the store at ``store_dir``, in the segment file that
    holds it (whatever the segment size)."""
    directory = store_dir / "commitlog"
    start = max(s for s in (int(p.name) for p in directory.iterdir()) if s <= commit_log_offset)
    flip_byte(directory / f"{start:020d}", commit_log_offset - start, mask)
