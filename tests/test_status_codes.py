"""Every typed status name is a RocketMQ v2 wire code, and the edge keeps it (never INTERNAL_ERROR)."""

from __future__ import annotations

import pytest

from siftmq.errors import StatusCode
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
