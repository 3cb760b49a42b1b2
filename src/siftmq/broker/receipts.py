"""Receipt handles: ``v1:<queue id>:<queue offset>:<nonce hex>:<topic>``.

A handle names one delivery of one message. Every redelivery or change of invisible time issues a
new nonce, so an older handle of the same message is recognisably stale.
"""

from __future__ import annotations

from typing import NamedTuple

from siftmq.errors import BadRequestError, StatusCode

_VERSION = "v1"
MAX_HANDLE_LENGTH = 512


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
        parts = text.split(":", 4)
        try:
            if len(parts) != 5 or parts[0] != _VERSION or not parts[4]:
                raise ValueError
            qid, offset, nonce = int(parts[1]), int(parts[2]), int(parts[3], 16)
            if qid < 0 or offset < 0 or nonce < 0:
                raise ValueError
        except ValueError:
            raise BadRequestError(
                f"malformed receipt handle {text[:100]!r}", status=StatusCode.INVALID_RECEIPT_HANDLE
            ) from None
        return cls(parts[4], qid, offset, nonce)


def encode_handle(topic: str, queue_id: int, queue_offset: int, nonce: int) -> str:
    """``ReceiptHandle(...).encode()`` without building the handle (once per message received)."""
    return f"{_VERSION}:{queue_id}:{queue_offset}:{nonce:x}:{topic}"
