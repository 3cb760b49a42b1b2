"""The one error hierarchy of siftmq.

Every error raised on purpose by siftmq derives from :class:`SiftError`. Each class carries two
class-level facts that the edges (gRPC server, client, CLI) use without guessing:

* ``code`` — a stable, upper-case name for the failure (mapped to wire status codes in one place,
  ``siftmq.server.status``);
* ``retriable`` — whether repeating the same request later can succeed.

The tree::

    SiftError
    ├── FilterError                  a filter expression was rejected (user input, never retriable)
    │   ├── FilterSyntaxError        lexical or grammar error; has .start/.end offsets and a caret message
    │   ├── FilterTypeError          the expression parses but RocketMQ's compile-time checks reject it
    │   ├── FilterLimitError         too long, too deep or too many nodes
    │   ├── FilterEvaluationError    evaluation threw where RocketMQ's evaluator throws (message filtered out)
    │   └── UnsupportedFilterError   a backend cannot express a node exactly (raise, never approximate)
    ├── StoreError                   the message store
    │   ├── CorruptRecordError       magic/CRC/length check failed at a CommitLog offset
    │   ├── MessageTooLargeError     a record would not fit the configured limits
    │   ├── StoreClosedError         the store was used after close()
    │   ├── DiskFullError            the disk is past its high-water mark: appends refused (retriable)
    │   └── StoreLockedError         another process holds the data directory
    ├── BrokerError                  a broker request was refused (``code`` is the wire status name)
    │   ├── BadRequestError          malformed or illegal input (topic, group, tag, key, handle, ...)
    │   ├── NotFoundError            an unknown topic or group
    │   └── UnsupportedError         a call or feature this broker does not serve, or turned off
    ├── RemoteError                  siftmq.client: a broker answered with a failure status, or is unreachable
    │   ├── RemoteBadRequest         4xx: the request is wrong (illegal names, filters, handles, sizes)
    │   ├── RemoteUnauthorized       401          RemoteForbidden            403
    │   ├── RemoteNotFound           404          RemotePreconditionFailed   428
    │   ├── RemoteTooManyRequests    429 (retriable)
    │   ├── RemoteTimeout            408, 504 (retriable)
    │   ├── RemoteUnavailable        unreachable, disk full, HA (retriable)
    │   ├── RemoteServerError        500          RemoteUnsupported          501, 505
    └── ConfigError                  invalid configuration value

Each layer raises its own errors; the edges translate them (``raise X from exc``).
"""

from __future__ import annotations

import enum
import errno
import logging
import time
from collections.abc import Callable
from typing import ClassVar


class StatusCode(enum.StrEnum):
    """The RocketMQ v2 status names a broker answers with (``apache.rocketmq.v2.Code``), typed so a
    misspelled name fails where it is written rather than becoming ``INTERNAL_ERROR`` on the wire.
    A member is its own name, so it compares equal to the plain string."""

    OK = "OK"
    MULTIPLE_RESULTS = "MULTIPLE_RESULTS"
    BAD_REQUEST = "BAD_REQUEST"
    ILLEGAL_ACCESS_POINT = "ILLEGAL_ACCESS_POINT"
    ILLEGAL_TOPIC = "ILLEGAL_TOPIC"
    ILLEGAL_CONSUMER_GROUP = "ILLEGAL_CONSUMER_GROUP"
    ILLEGAL_MESSAGE_TAG = "ILLEGAL_MESSAGE_TAG"
    ILLEGAL_MESSAGE_KEY = "ILLEGAL_MESSAGE_KEY"
    ILLEGAL_MESSAGE_GROUP = "ILLEGAL_MESSAGE_GROUP"
    ILLEGAL_MESSAGE_PROPERTY_KEY = "ILLEGAL_MESSAGE_PROPERTY_KEY"
    INVALID_TRANSACTION_ID = "INVALID_TRANSACTION_ID"
    ILLEGAL_MESSAGE_ID = "ILLEGAL_MESSAGE_ID"
    ILLEGAL_FILTER_EXPRESSION = "ILLEGAL_FILTER_EXPRESSION"
    ILLEGAL_INVISIBLE_TIME = "ILLEGAL_INVISIBLE_TIME"
    ILLEGAL_DELIVERY_TIME = "ILLEGAL_DELIVERY_TIME"
    INVALID_RECEIPT_HANDLE = "INVALID_RECEIPT_HANDLE"
    MESSAGE_PROPERTY_CONFLICT_WITH_TYPE = "MESSAGE_PROPERTY_CONFLICT_WITH_TYPE"
    UNRECOGNIZED_CLIENT_TYPE = "UNRECOGNIZED_CLIENT_TYPE"
    MESSAGE_CORRUPTED = "MESSAGE_CORRUPTED"
    CLIENT_ID_REQUIRED = "CLIENT_ID_REQUIRED"
    ILLEGAL_POLLING_TIME = "ILLEGAL_POLLING_TIME"
    ILLEGAL_OFFSET = "ILLEGAL_OFFSET"
    UNAUTHORIZED = "UNAUTHORIZED"
    FORBIDDEN = "FORBIDDEN"
    NOT_FOUND = "NOT_FOUND"
    MESSAGE_NOT_FOUND = "MESSAGE_NOT_FOUND"
    TOPIC_NOT_FOUND = "TOPIC_NOT_FOUND"
    CONSUMER_GROUP_NOT_FOUND = "CONSUMER_GROUP_NOT_FOUND"
    OFFSET_NOT_FOUND = "OFFSET_NOT_FOUND"
    REQUEST_TIMEOUT = "REQUEST_TIMEOUT"
    PAYLOAD_TOO_LARGE = "PAYLOAD_TOO_LARGE"
    MESSAGE_BODY_TOO_LARGE = "MESSAGE_BODY_TOO_LARGE"
    MESSAGE_BODY_EMPTY = "MESSAGE_BODY_EMPTY"
    PRECONDITION_FAILED = "PRECONDITION_FAILED"
    TOO_MANY_REQUESTS = "TOO_MANY_REQUESTS"
    REQUEST_HEADER_FIELDS_TOO_LARGE = "REQUEST_HEADER_FIELDS_TOO_LARGE"
    MESSAGE_PROPERTIES_TOO_LARGE = "MESSAGE_PROPERTIES_TOO_LARGE"
    INTERNAL_ERROR = "INTERNAL_ERROR"
    INTERNAL_SERVER_ERROR = "INTERNAL_SERVER_ERROR"
    HA_NOT_AVAILABLE = "HA_NOT_AVAILABLE"
    NOT_IMPLEMENTED = "NOT_IMPLEMENTED"
    PROXY_TIMEOUT = "PROXY_TIMEOUT"
    MASTER_PERSISTENCE_TIMEOUT = "MASTER_PERSISTENCE_TIMEOUT"
    SLAVE_PERSISTENCE_TIMEOUT = "SLAVE_PERSISTENCE_TIMEOUT"
    UNSUPPORTED = "UNSUPPORTED"
    VERSION_UNSUPPORTED = "VERSION_UNSUPPORTED"
    VERIFY_FIFO_MESSAGE_UNSUPPORTED = "VERIFY_FIFO_MESSAGE_UNSUPPORTED"
    FAILED_TO_CONSUME_MESSAGE = "FAILED_TO_CONSUME_MESSAGE"


class SiftError(Exception):
    """Base class of every error siftmq raises on purpose."""

    code: ClassVar[str] = "INTERNAL_ERROR"
    retriable: ClassVar[bool] = False

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class ConfigError(SiftError):
    """A configuration value is invalid."""

    code = "BAD_CONFIG"


class StateWriteError(SiftError):
    """The broker stopped without writing some of its state files (each failure is logged)."""


# --------------------------------------------------------------------------------------------- filter


class FilterError(SiftError):
    """A filter expression was rejected or could not be evaluated."""

    code = "ILLEGAL_FILTER_EXPRESSION"

    def __init__(self, message: str, *, expression: str | None = None) -> None:
        super().__init__(message)
        self.expression = expression


class FilterSyntaxError(FilterError):
    """The expression text does not lex or parse.

    ``start`` and ``end`` are 0-based character offsets into the text (``end`` exclusive); the
    message shows the offending line with a caret under the span.
    """

    def __init__(
        self,
        description: str,
        *,
        expression: str,
        start: int,
        end: int,
    ) -> None:
        self.description = description
        self.start = start
        self.end = max(end, start)
        self.line, self.column = _line_col(expression, start)
        super().__init__(_caret_message(description, expression, start, self.end), expression=expression)


class FilterTypeError(FilterError):
    """The expression parses but is rejected by RocketMQ's compile-time checks.

    ``start``/``end`` locate the offending sub-expression when known.
    """

    def __init__(
        self,
        description: str,
        *,
        expression: str | None = None,
        start: int | None = None,
        end: int | None = None,
    ) -> None:
        self.description = description
        self.start = start
        self.end = end
        if expression is not None and start is not None:
            message = _caret_message(description, expression, start, end if end is not None else start + 1)
        else:
            message = description
        super().__init__(message, expression=expression)


class FilterLimitError(FilterError):
    """The expression exceeds a bound (length, nesting depth, node count)."""


class FilterEvaluationError(FilterError):
    """Evaluation raised an error where RocketMQ's evaluator throws; the message does not match."""

    code = "FILTER_EVALUATION_FAILED"


class UnsupportedFilterError(FilterError):
    """A backend cannot express an expression exactly."""

    code = "UNSUPPORTED_FILTER"

    def __init__(self, message: str, *, backend: str) -> None:
        super().__init__(message)
        self.backend = backend


# ---------------------------------------------------------------------------------------------- store


class StoreError(SiftError):
    """The message store failed."""

    code = "STORE_ERROR"


class CorruptRecordError(StoreError):
    """A CommitLog record failed its magic, length or CRC check."""

    code = "CORRUPT_RECORD"

    def __init__(self, message: str, *, offset: int) -> None:
        super().__init__(f"{message} (commit log offset {offset})")
        self.offset = offset


class MessageTooLargeError(StoreError):
    """A message would not fit the configured size limits."""

    code = "MESSAGE_BODY_TOO_LARGE"


class DiskFullError(StoreError):
    """The disk holding the store is past its high-water mark or reserve: appends are refused
    until it is below again (nothing stored is deleted to make room, unless the operator's
    ``disk_full_policy`` says so)."""

    code = "DISK_FULL"
    retriable = True


class StoreClosedError(StoreError):
    """The store was used after it was closed."""

    code = "STORE_CLOSED"
    retriable = True


class StoreLockedError(StoreError):
    """Another process holds the store's data directory."""

    code = "STORE_LOCKED"


# --------------------------------------------------------------------------------------------- broker


class BrokerError(SiftError):
    """The broker refused a request.

    ``status`` is the RocketMQ v2 status name the edge answers with (``apache.rocketmq.v2.Code``):
    the class's ``code`` unless a more specific one (``ILLEGAL_TOPIC``, ...) is given.
    """

    code = "INTERNAL_ERROR"

    def __init__(self, message: str, *, status: StatusCode | None = None) -> None:
        super().__init__(message)
        self.status: StatusCode = status or StatusCode(type(self).code)


class BadRequestError(BrokerError):
    """Malformed or illegal input; the specific status (ILLEGAL_TOPIC, ...) is given per instance."""

    code = "BAD_REQUEST"


class NotFoundError(BrokerError):
    """An unknown topic, group or message."""

    code = "NOT_FOUND"


class UnsupportedError(BrokerError):
    """A call or feature this broker does not serve (or that its configuration turned off)."""

    code = "UNSUPPORTED"


# --------------------------------------------------------------------------------------------- client


class RemoteError(SiftError):
    """A broker answered a client call with a failure status, or could not be reached.

    ``status`` is the wire status name (``ILLEGAL_TOPIC``, ``UNAVAILABLE`` for transport failures, ...)
    and ``status_code`` its number. The client raises the subclass of the status's family
    (:meth:`for_status`), whose class-level ``retriable`` says whether the same call may succeed
    later; the gRPC error, for a transport failure, is its ``__cause__``.
    """

    code = "REMOTE_ERROR"

    def __init__(self, message: str, *, status: str, status_code: int = 0, call: str = "") -> None:
        super().__init__(f"{call + ': ' if call else ''}{status} ({status_code}): {message}")
        self.status = status
        self.status_code = status_code
        self.call = call

    @property
    def is_retriable(self) -> bool:
        return self.retriable

    @classmethod
    def for_status(cls, message: str, *, status: str, status_code: int = 0, call: str = "") -> RemoteError:
        """The error of ``status``'s family (a plain RemoteError for a status outside them)."""
        family = _REMOTE_FAMILIES.get(status, RemoteError)
        return family(message, status=status, status_code=status_code, call=call)


class RemoteBadRequest(RemoteError):
    """The request is wrong (4xx: illegal topic, group, tag, filter, handle, too large, ...)."""


class RemoteUnauthorized(RemoteError):
    """The call was not authenticated (401)."""


class RemoteForbidden(RemoteError):
    """The caller may not do this (403)."""


class RemoteNotFound(RemoteError):
    """The topic, group, message or offset does not exist (404)."""


class RemotePreconditionFailed(RemoteError):
    """The broker's state refuses the call now (428), e.g. a group's conflicting subscription."""


class RemoteTooManyRequests(RemoteError):
    """The broker is busy (429): retry later."""

    retriable = True


class RemoteTimeout(RemoteError):
    """The broker (or its storage) did not finish in time (408, 504): retry."""

    retriable = True


class RemoteUnavailable(RemoteError):
    """The broker cannot serve now (unreachable, disk full, HA): retry."""

    retriable = True


class RemoteServerError(RemoteError):
    """The broker failed on its side (500) in a way a retry does not fix."""


class RemoteUnsupported(RemoteError):
    """The broker does not serve this call or feature (501, 505)."""


_S = StatusCode
_REMOTE_FAMILIES: dict[str, type[RemoteError]] = {
    **{str(s): RemoteBadRequest for s in (
        _S.BAD_REQUEST, _S.ILLEGAL_ACCESS_POINT, _S.ILLEGAL_TOPIC, _S.ILLEGAL_CONSUMER_GROUP,
        _S.ILLEGAL_MESSAGE_TAG, _S.ILLEGAL_MESSAGE_KEY, _S.ILLEGAL_MESSAGE_GROUP,
        _S.ILLEGAL_MESSAGE_PROPERTY_KEY, _S.INVALID_TRANSACTION_ID, _S.ILLEGAL_MESSAGE_ID,
        _S.ILLEGAL_FILTER_EXPRESSION, _S.ILLEGAL_INVISIBLE_TIME, _S.ILLEGAL_DELIVERY_TIME,
        _S.INVALID_RECEIPT_HANDLE, _S.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE, _S.UNRECOGNIZED_CLIENT_TYPE,
        _S.MESSAGE_CORRUPTED, _S.CLIENT_ID_REQUIRED, _S.ILLEGAL_POLLING_TIME, _S.ILLEGAL_OFFSET,
        _S.PAYLOAD_TOO_LARGE, _S.MESSAGE_BODY_TOO_LARGE, _S.MESSAGE_BODY_EMPTY,
        _S.REQUEST_HEADER_FIELDS_TOO_LARGE, _S.MESSAGE_PROPERTIES_TOO_LARGE,
    )},
    str(_S.UNAUTHORIZED): RemoteUnauthorized,
    str(_S.FORBIDDEN): RemoteForbidden,
    **{str(s): RemoteNotFound for s in (
        _S.NOT_FOUND, _S.MESSAGE_NOT_FOUND, _S.TOPIC_NOT_FOUND, _S.CONSUMER_GROUP_NOT_FOUND,
        _S.OFFSET_NOT_FOUND,
    )},
    str(_S.PRECONDITION_FAILED): RemotePreconditionFailed,
    str(_S.TOO_MANY_REQUESTS): RemoteTooManyRequests,
    **{str(s): RemoteTimeout for s in (
        _S.REQUEST_TIMEOUT, _S.PROXY_TIMEOUT, _S.MASTER_PERSISTENCE_TIMEOUT, _S.SLAVE_PERSISTENCE_TIMEOUT,
    )},
    **{str(s): RemoteUnavailable for s in (_S.INTERNAL_SERVER_ERROR, _S.HA_NOT_AVAILABLE)},
    "UNAVAILABLE": RemoteUnavailable,  # not a wire status: the client could not reach the broker
    str(_S.INTERNAL_ERROR): RemoteServerError,
    **{str(s): RemoteUnsupported for s in (
        _S.NOT_IMPLEMENTED, _S.UNSUPPORTED, _S.VERSION_UNSUPPORTED, _S.VERIFY_FIFO_MESSAGE_UNSUPPORTED,
    )},
}  # fmt: skip
#: Statuses that are not failures of a call (never raised as errors; a plain RemoteError if they are).
NOT_FAILURES: frozenset[str] = frozenset({_S.OK, _S.MULTIPLE_RESULTS, _S.FAILED_TO_CONSUME_MESSAGE})


# -------------------------------------------------------------------------------------------- helpers


def _line_col(text: str, offset: int) -> tuple[int, int]:
    """1-based line and column of ``offset`` in ``text`` (LF, CR and CRLF end lines)."""
    offset = max(0, min(offset, len(text)))
    line = 1
    line_start = 0
    i = 0
    while i < offset:
        ch = text[i]
        if ch == "\n" or ch == "\r":
            if ch == "\r" and i + 1 < len(text) and text[i + 1] == "\n":
                i += 1
            line += 1
            line_start = i + 1
        i += 1
    return line, offset - line_start + 1


_SNIPPET_WIDTH = 100


def _caret_message(description: str, text: str, start: int, end: int) -> str:
    """``description`` followed by the line of ``text`` holding ``start`` and a caret under the span."""
    start = max(0, min(start, len(text)))
    end = max(start, min(end, len(text)))
    line, col = _line_col(text, start)
    line_start = start - (col - 1)
    line_end = line_start
    while line_end < len(text) and text[line_end] not in "\r\n":
        line_end += 1
    snippet = text[line_start:line_end]
    rel_start = start - line_start
    rel_end = min(end, line_end) - line_start
    # keep long lines readable: a window around the error
    left = 0
    if len(snippet) > _SNIPPET_WIDTH:
        left = max(0, rel_start - _SNIPPET_WIDTH // 2)
        snippet = snippet[left : left + _SNIPPET_WIDTH]
        rel_start -= left
        rel_end = min(rel_end - left, len(snippet))
    shown = "".join(ch if ch.isprintable() or ch == "\t" else "\N{REPLACEMENT CHARACTER}" for ch in snippet)
    prefix = "..." if left else ""
    caret = " " * (len(prefix) + rel_start) + "^" * max(1, rel_end - rel_start)
    where = f"line {line}, column {col}"
    return f"{description} at {where}:\n  {prefix}{shown}\n  {caret}"


def caused_by_full_disk(exc: BaseException) -> bool:
    """Whether ``exc``, or an error it was raised from, is the OS saying the disk (or the quota)
    is full: the documented, retriable :class:`DiskFullError`, not an internal error."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, OSError) and current.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return False


class RepeatingFailure:
    """How a background loop reports a step that may fail on every pass (a full disk fails each
    one): the failure when it starts, then at most once per ``every_s`` while it goes on, with its
    traceback unless the disk is full; and one line when the step works again."""

    def __init__(self, log: logging.Logger, what: str, every_s: float = 60.0) -> None:
        self._log, self.what, self._every_s = log, what, every_s
        self._logged: float | None = None  # when the failure going on was last logged

    def failed(self, exc: BaseException) -> None:
        now = time.monotonic()
        if self._logged is None or now - self._logged >= self._every_s:
            self._logged = now
            self._log.error("%s failed; retrying: %s", self.what, exc, exc_info=not caused_by_full_disk(exc))

    def worked(self) -> None:
        if self._logged is not None:
            self._logged = None
            self._log.info("%s works again", self.what)

    def run(self, step: Callable[[], object]) -> None:
        """Run ``step``, reporting how it went (an exception is reported, not raised)."""
        try:
            step()
        except Exception as exc:
            self.failed(exc)
        else:
            self.worked()


def as_store_error(exc: BaseException) -> StoreError:
    """``exc`` as a :class:`StoreError` that keeps it as its cause (a full disk stays one)."""
    if isinstance(exc, StoreError):
        return exc
    wrapped = StoreError(str(exc))
    wrapped.__cause__ = exc
    return wrapped
