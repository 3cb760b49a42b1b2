"""Receipt handles: ``v1:<queue id>:<queue offset>:<nonce hex>:<topic>``.

A handle names one delivery of one message. Every redelivery or change of invisible time issues a
new nonce, so an older handle of the same message is recognisably stale.
"""

from __future__ import annotations

import re
from typing import NamedTuple

from siftmq.errors import BadRequestError, StatusCode

_VERSION = "v1"
MAX_HANDLE_LENGTH = 512
_NUMBER = "(0|[1-9][0-9]*)"
_HANDLE = re.compile(rf"{_VERSION}:{_NUMBER}:{_NUMBER}:(0|[1-9a-f][0-9a-f]{{0,15}}):(.+)", re.DOTALL)


class ReceiptHandle(NamedTuple):
    """A decoded handle. A named tuple: one is built per message received and per message
    acknowledged, and a frozen dataclass costs twice as much to build (~0.5 against ~0.2 µs)."""

    topic: str
    queue_id: int
    queue_offset: int
    nonce: int

    def encode(self) -> str:
        return encode_handle(self.topic, self.queue_id, self.queue_offset, self.nonce)

    @classmethod
    def decode(cls, text: str) -> ReceiptHandle:
        """Parse a handle; anything malformed is ``INVALID_RECEIPT_HANDLE``."""
        if not text or len(text) > MAX_HANDLE_LENGTH:
            raise BadRequestError(
                "receipt handle is empty or too long", status=StatusCode.INVALID_RECEIPT_HANDLE
            )
        # exactly as encode() spells them: int() would also take signs, spaces, "_" and "0x", and
        # one delivery would have many handles
        found = _HANDLE.fullmatch(text)
        if found is None:
            raise BadRequestError(
                f"malformed receipt handle {text[:100]!r}", status=StatusCode.INVALID_RECEIPT_HANDLE
            )
        qid, offset, nonce, topic = found.groups()
        return cls(topic, int(qid), int(offset), int(nonce, 16))


def encode_handle(topic: str, queue_id: int, queue_offset: int, nonce: int) -> str:
    """``ReceiptHandle(...).encode()`` without building the handle (once per message received)."""
    return f"{_VERSION}:{queue_id}:{queue_offset}:{nonce:x}:{topic}"
