"""A program's static checks, and the broker's parsing of what a worker says (untrusted input)."""

from __future__ import annotations

import json
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from siftmq.filterserver import wire
from siftmq.filterserver.message import Message, row
from siftmq.filterserver.program import MAX_SOURCE_BYTES, ProgramError, check_program


def test_a_good_program_passes_with_its_digest() -> None:
    checked = check_program(
        "import json\nfrom collections import Counter\ndef match(message):\n    return True\n"
    )
    assert len(checked.sha256) == 64


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ("def match(m)\n    return True\n", "syntax error at line 1, column 13: expected .:."),
        ("def other(m):\n    return True\n", "defines no function match"),
        ("def match():\n    return True\n", "exactly one argument"),
        ("def match(a, b):\n    return True\n", "exactly one argument"),
        ("import os\ndef match(m):\n    return True\n", "line 1: module 'os' is not allowed"),
        ("def match(m):\n    import subprocess\n    return True\n", "line 2: module 'subprocess'"),
        ("from ctypes import CDLL\ndef match(m):\n    return True\n", "module 'ctypes' is not allowed"),
        ("from . import x\ndef match(m):\n    return True\n", "relative imports"),
        ("x = 1\x00\ndef match(m):\n    return True\n", "NUL"),
        ("#" * (MAX_SOURCE_BYTES + 1), "at most"),
        ("x = " + "-" * 60_000 + "1\ndef match(m):\n    return True\n", "nested too deeply"),
        ("(" * 1000 + ")" * 1000 + "\ndef match(m):\n    return True\n", "too many nested parentheses"),
    ],
)
def test_bad_programs_are_refused_saying_what_is_wrong(source: str, message: str) -> None:
    with pytest.raises(ProgramError, match=message):
        check_program(source)


def test_the_message_view() -> None:
    m = Message(
        row(
            topic="T", tag="a", keys=("k",), properties={"p": "1"}, body=b"x", message_id="id", queue_offset=7
        )
    )
    assert (m.topic, m.tag, m.keys, dict(m.properties), m.body, m.message_id, m.queue_offset) == (
        "T", "a", ("k",), {"p": "1"}, b"x", "id", 7,
    )  # fmt: skip
    with pytest.raises(TypeError):
        m.properties["p"] = "2"  # type: ignore[index]
    with pytest.raises(AttributeError):
        m.topic = "U"  # type: ignore[misc]


def test_a_result_round_trips() -> None:
    payload = wire.encode_result(bytes([wire.MATCH, wire.ERROR, wire.REJECT]), {1: "ValueError: x"})
    result = wire.parse_result(payload, 3)
    assert result.codes == bytes([1, 2, 0]) and result.errors == {1: "ValueError: x"}


def _result(codes: bytes, errors: object, count: int | None = None) -> bytes:
    return struct.pack(">I", len(codes) if count is None else count) + codes + json.dumps(errors).encode()


@pytest.mark.parametrize(
    "payload",
    [
        b"",
        b"\x00\x00",
        _result(b"\x01\x01", [], count=3),  # fewer codes than it says
        _result(b"\x01\x01\x01", [], count=4),
        _result(b"\x01\x07\x01", []),  # an unknown code
        _result(b"\x01\x02\x01", []),  # an error without its text
        _result(b"\x01\x02\x01", [[0, "x"]]),  # a text for a message that did not fail
        _result(b"\x01\x02\x01", [[9, "x"]]),
        _result(b"\x01\x02\x01", {"1": "x"}),
        _result(b"\x01\x02\x01", [[1, 5]]),
        struct.pack(">I", 3) + b"\x01\x01\x01" + b"\xff\xfe",
    ],
)
def test_a_broken_result_is_refused(payload: bytes) -> None:
    with pytest.raises(wire.WireError):
        wire.parse_result(payload, 3)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=64), st.integers(0, 8))
def test_any_bytes_parse_or_are_refused_cleanly(payload: bytes, expected: int) -> None:
    try:
        result = wire.parse_result(payload, expected)
    except wire.WireError:
        return
    assert len(result.codes) == expected and set(result.codes) <= {0, 1, 2}
    assert set(result.errors) == {i for i, c in enumerate(result.codes) if c == wire.ERROR}
