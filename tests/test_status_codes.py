"""Every typed status name is a RocketMQ v2 wire code, and the edge keeps it (never INTERNAL_ERROR)."""

from __future__ import annotations

import pytest

from siftmq.errors import (
    NOT_FAILURES,
    RemoteBadRequest,
    RemoteError,
    RemoteForbidden,
    RemoteNotFound,
    RemotePreconditionFailed,
    RemoteServerError,
    RemoteTimeout,
    RemoteTooManyRequests,
    RemoteUnauthorized,
    RemoteUnavailable,
    RemoteUnsupported,
    StatusCode,
)
from siftmq.protocol import rocketmq_v2_pb2 as pb
from siftmq.server.status import status


def test_every_wire_code_but_unspecified_is_a_member() -> None:
    wire = set(pb.Code.DESCRIPTOR.values_by_name) - {"CODE_UNSPECIFIED"}
    assert {member.value for member in StatusCode} == wire


@pytest.mark.parametrize("member", list(StatusCode))
def test_member_maps_to_its_own_code(member: StatusCode) -> None:
    answer = status(member, "why")
    assert answer.code == pb.Code.Value(member.value)
    assert answer.message == "why"


# ------------------------------------------------------------------------------ the client's families

_FAMILY_OF_CODE = {  # the hundreds of the wire code -> the client's error class
    400: RemoteBadRequest,
    401: RemoteUnauthorized,
    403: RemoteForbidden,
    404: RemoteNotFound,
    408: RemoteTimeout,
    413: RemoteBadRequest,
    428: RemotePreconditionFailed,
    429: RemoteTooManyRequests,
    431: RemoteBadRequest,
    501: RemoteUnsupported,
    504: RemoteTimeout,
    505: RemoteUnsupported,
}


@pytest.mark.parametrize("member", [m for m in StatusCode if m not in NOT_FAILURES])
def test_every_failure_status_raises_its_family_on_the_client(member: StatusCode) -> None:
    number = pb.Code.Value(member.value)
    error = RemoteError.for_status("why", status=member.value, status_code=number, call="SendMessage")
    assert type(error) is not RemoteError and isinstance(error, RemoteError)
    if number // 100 == 500:  # INTERNAL_ERROR is final; INTERNAL_SERVER_ERROR (a full disk) and HA are not
        expected: type[RemoteError] = (
            RemoteServerError if member is StatusCode.INTERNAL_ERROR else RemoteUnavailable
        )
    else:
        expected = _FAMILY_OF_CODE[number // 100]
    assert type(error) is expected
    assert error.is_retriable is expected.retriable
    assert str(error) == f"SendMessage: {member.value} ({number}): why"


def test_retriable_families_and_transport_failures() -> None:
    assert {c.__name__ for c in (RemoteTooManyRequests, RemoteTimeout, RemoteUnavailable) if c.retriable} == {
        "RemoteTooManyRequests",
        "RemoteTimeout",
        "RemoteUnavailable",
    }
    assert not RemoteBadRequest.retriable and not RemoteServerError.retriable
    assert type(RemoteError.for_status("down", status="UNAVAILABLE")) is RemoteUnavailable
    assert type(RemoteError.for_status("?", status="BAD_ANSWER")) is RemoteError
