"""The single mapping from siftmq errors to RocketMQ v2 status codes."""

from __future__ import annotations

import logging
from typing import Any, Final

from siftmq.errors import (
    BrokerError,
    DiskFullError,
    FilterError,
    FilterSyntaxError,
    MessageTooLargeError,
    SiftError,
    StoreClosedError,
)
from siftmq.protocol import rocketmq_v2_pb2 as pb

_log = logging.getLogger(__name__)
MAX_STATUS_MESSAGE = 4096


_OK = pb.Code.OK  # enum attribute lookups are slow in the Python protobuf wrapper: look up once


#: :func:`ok` as constructor arguments, for answers built from dicts (faster per entry)
OK_FIELDS: Final[dict[str, Any]] = {"code": _OK, "message": "OK"}


def ok(message: str = "OK") -> pb.Status:
    return pb.Status(code=_OK, message=message)


def status(code_name: str, message: str) -> pb.Status:
    if code_name not in pb.Code.DESCRIPTOR.values_by_name:
        code_name = "INTERNAL_ERROR"
    return pb.Status(code=code_name, message=message[:MAX_STATUS_MESSAGE])


def status_of(exc: BaseException, *, call: str) -> pb.Status:
    """The status a failed call answers with; unexpected errors are logged with their traceback."""
    if isinstance(exc, BrokerError):
        return status(exc.status, exc.message)
    if isinstance(exc, FilterSyntaxError):
        return status(
            "ILLEGAL_FILTER_EXPRESSION", f"invalid filter expression at {exc.start}..{exc.end}: {exc.message}"
        )
    if isinstance(exc, FilterError):
        return status("ILLEGAL_FILTER_EXPRESSION", f"invalid filter expression: {exc.message}")
    if isinstance(exc, MessageTooLargeError):
        return status("MESSAGE_BODY_TOO_LARGE", exc.message)
    if isinstance(exc, DiskFullError):
        return status("INTERNAL_SERVER_ERROR", exc.message)
    if isinstance(exc, StoreClosedError):
        return status("INTERNAL_SERVER_ERROR", "the broker is shutting down; retry on another broker")
    if isinstance(exc, SiftError):
        _log.error("%s failed: %s", call, exc)
        return status("INTERNAL_ERROR", f"{type(exc).__name__}: {exc.message}")
    _log.exception("%s failed unexpectedly", call, exc_info=exc)
    return status("INTERNAL_ERROR", f"internal error in {call} ({type(exc).__name__}); see the broker log")
