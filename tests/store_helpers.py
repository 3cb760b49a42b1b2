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
