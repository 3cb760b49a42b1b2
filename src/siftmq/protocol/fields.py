"""Small helpers for reading protobuf fields fast (they run once per message sent or delivered)."""

from __future__ import annotations

from collections.abc import Mapping


def map_to_dict(field: Mapping[str, str]) -> dict[str, str]:
    """A protobuf map field as a dict, twice as fast as ``dict(field)`` (which goes through keys())."""
    return {k: field[k] for k in field} if len(field) else {}
