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
    StatusCode,
    StoreClosedError,
    caused_by_full_disk,
)
from siftmq.protocol import rocketmq_v2_pb2 as pb

_log = logging.getLogger(__name__)
MAX_STATUS_MESSAGE = 4096


_OK = pb.Code.OK  # enum attribute lookups are slow in the Python protobuf wrapper: look up once


#: :func:`ok` as constructor arguments, for answers built from dicts (faster per entry)
OK_FIELDS: Final[dict[str, Any]] = {"code": _OK, "message": "OK"}


def ok(message: str = "OK") -> pb.Status:
    return pb.Status(code=_OK, message=message)


def status(code: StatusCode, message: str) -> pb.Status:
    """A status of the protocol (every :class:`StatusCode` is one of its codes; a test checks)."""
    return pb.Status(code=code.value, message=message[:MAX_STATUS_MESSAGE])


def status_of(exc: BaseException, *, call: str) -> pb.Status:
    """The status a failed call answers with; unexpected errors are logged with their traceback."""
    if isinstance(exc, BrokerError):
        return status(exc.status, exc.message)
    if isinstance(exc, FilterSyntaxError):
        return status(
            StatusCode.ILLEGAL_FILTER_EXPRESSION,
            f"invalid filter expression at {exc.start}..{exc.end}: {exc.message}",
        )
    if isinstance(exc, FilterError):
        return status(StatusCode.ILLEGAL_FILTER_EXPRESSION, f"invalid filter expression: {exc.message}")
    if isinstance(exc, MessageTooLargeError):
        return status(StatusCode.MESSAGE_BODY_TOO_LARGE, exc.message)
    if isinstance(exc, DiskFullError):
        return status(StatusCode.INTERNAL_SERVER_ERROR, exc.message)
    if caused_by_full_disk(exc):  # a state file the call writes (groups, topics, offsets)
        _log.warning("%s failed: the disk is full (%s)", call, exc)
        return status(
            StatusCode.INTERNAL_SERVER_ERROR,
            f"the broker's disk is full: {call} could not write its state; retry once there is room",
        )
    if isinstance(exc, StoreClosedError):
        return status(
            StatusCode.INTERNAL_SERVER_ERROR, "the broker is shutting down; retry on another broker"
        )
    if isinstance(exc, SiftError):
        _log.error("%s failed: %s", call, exc)
        return status(StatusCode.INTERNAL_ERROR, f"{type(exc).__name__}: {exc.message}")
    _log.exception("%s failed unexpectedly", call, exc_info=exc)
    return status(
        StatusCode.INTERNAL_ERROR, f"internal error in {call} ({type(exc).__name__}); see the broker log"
    )
