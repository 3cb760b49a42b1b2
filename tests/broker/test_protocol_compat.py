"""Our own proto subset against the official client's generated modules: field for field on the wire."""

from __future__ import annotations

import filecmp
from pathlib import Path

import pytest
from google.protobuf.descriptor import Descriptor, EnumDescriptor

from siftmq.protocol import generate
from siftmq.protocol import rocketmq_v2_pb2 as ours
from siftmq.protocol.service import RPCS, SERVICE_NAME

official = pytest.importorskip("rocketmq.grpc_protocol.service_pb2")
official_definition = pytest.importorskip("rocketmq.grpc_protocol.definition_pb2")


def _official_message(name: str) -> Descriptor | None:
    for module in (official, official_definition):
        found = module.DESCRIPTOR.message_types_by_name.get(name)
        if found is not None:
            return found
    return None


def _field_facts(desc: Descriptor) -> dict[int, tuple[str, int, bool, bool, str]]:
    facts = {}
    for f in desc.fields:
        type_name = f.message_type.name if f.message_type else f.enum_type.name if f.enum_type else ""
        facts[f.number] = (f.name, f.type, f.is_repeated, f.has_presence, type_name)
    return facts


def test_every_message_matches_the_official_definition_on_the_wire() -> None:
    compared = 0
    for name, desc in ours.DESCRIPTOR.message_types_by_name.items():
        if name == "StatusOnlyResponse":
            continue  # siftmq's own reply to calls it does not serve (status is field 1 everywhere)
        theirs = _official_message(name)
        assert theirs is not None, name
        mine = _field_facts(desc)
        reference = _field_facts(theirs)
        for number, fact in mine.items():
            assert reference.get(number) == fact, f"{name}.{fact[0]} (#{number})"
        compared += len(mine)
    assert compared > 150


def test_enum_values_match() -> None:
    for name, enum in ours.DESCRIPTOR.enum_types_by_name.items():
        theirs: EnumDescriptor | None = None
        for module in (official, official_definition):
            theirs = module.DESCRIPTOR.enum_types_by_name.get(name) or theirs
        assert theirs is not None, name
        reference = {v.name: v.number for v in theirs.values}
        for v in enum.values:
            assert reference.get(v.name) == v.number, f"{name}.{v.name}"


def test_rpc_table_matches_the_official_service() -> None:
    service = official.DESCRIPTOR.services_by_name["MessagingService"]
    assert service.full_name == SERVICE_NAME
    methods = {m.name: m for m in service.methods}
    assert {r.name for r in RPCS} == set(methods)
    for rpc in RPCS:
        m = methods[rpc.name]
        shape = {(False, False): "unary_unary", (False, True): "unary_stream", (True, True): "stream_stream"}[
            (m.client_streaming, m.server_streaming)
        ]
        assert rpc.shape == shape, rpc.name
        if rpc.request is not None:
            assert rpc.request.DESCRIPTOR.name == m.input_type.name
        assert rpc.response.DESCRIPTOR.name in (m.output_type.name, "StatusOnlyResponse")


def test_committed_stubs_match_the_proto(tmp_path: Path) -> None:
    pytest.importorskip("grpc_tools")
    generate.generate(tmp_path)
    here = Path(ours.__file__).parent
    for name in ("rocketmq_v2_pb2", "siftmq_batch_pb2"):
        for suffix in (".py", ".pyi"):
            fresh = tmp_path / "siftmq" / "protocol" / f"{name}{suffix}"
            assert filecmp.cmp(fresh, here / f"{name}{suffix}", shallow=False), (
                f"{name}{suffix} is stale: run python -m siftmq.protocol.generate"
            )
