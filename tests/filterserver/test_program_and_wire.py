"""A program's static checks, and the broker's parsing of what a worker says (untrusted input)."""

from __future__ import annotations

import json
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from siftmq.filterserver import wire
from siftmq.filterserver.message import message_of, row
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
    m = message_of(
        row(
            topic="T", tag="a", keys=("k", "l"), properties={"p": "1"}, body=b"x", message_id="id",
            queue_id=3, queue_offset=7, born_timestamp=5, store_timestamp=6,
        )
    )  # fmt: skip
    assert (m.topic, m.tag, m.keys, dict(m.properties), m.body, m.message_id) == (
        "T", "a", ("k", "l"), {"p": "1"}, b"x", "id",
    )  # fmt: skip
    assert (m.queue_id, m.queue_offset, m.born_timestamp, m.store_timestamp) == (3, 7, 5, 6)
    with pytest.raises(TypeError):
        m.properties["p"] = "2"  # type: ignore[index]
    with pytest.raises(AttributeError):
        m.topic = "U"  # type: ignore[misc]


def test_the_view_of_a_stored_record() -> None:
    """The worker decodes the record's properties as the broker does for a consumer: the tag, keys
    and id are fields, broker-internal (``__``) properties are not shown, and a record without a
    UNIQ_KEY gets the offset message id the broker sent."""
    stored = "\x02".join(
        ["TAGS\x01t", "__BORN_HOST\x01127.0.0.1", "MY_UNIQ_KEY\x01no", "KEYS\x01 a  b ", "c\x01"]
    )
    m = message_of(("T", 0, 1, stored.encode(), b"", "0A00", 0, 0))
    assert (m.tag, m.keys, m.message_id, dict(m.properties)) == (
        "t",
        ("a", "b"),
        "0A00",
        {"MY_UNIQ_KEY": "no", "c": ""},
    )
    empty = message_of(("T", 0, 1, b"", b"", "0A00", 0, 0))
    assert (empty.tag, empty.keys, dict(empty.properties), empty.body, empty.message_id) == (
        None, (), {}, b"", "0A00",
    )  # fmt: skip


_names = st.text(st.characters(blacklist_characters="\x01\x02", blacklist_categories=("Cs",)), max_size=6)


@given(
    props=st.dictionaries(_names, _names, max_size=6),
    tag=st.none() | _names,
    keys=st.lists(_names.filter(lambda k: " " not in k and k != ""), max_size=3),
    asked=st.lists(_names | st.sampled_from(["TAGS", "KEYS", "UNIQ_KEY", "__BORN_HOST"]), max_size=6),
)
def test_a_property_lookup_agrees_with_decoding_them_all(
    props: dict[str, str], tag: str | None, keys: list[str], asked: list[str]
) -> None:
    """Looking one property up in the stored form gives what the whole decode gives (the one a
    consumer would be delivered), in any order of lookups and listings."""
    m = message_of(row(topic="T", tag=tag, keys=tuple(keys), properties=props, message_id="id"))
    user = {k: v for k, v in props.items() if k not in {"TAGS", "KEYS", "UNIQ_KEY"} and k[:2] != "__"}
    for name in [*asked, *props]:
        assert m.properties.get(name) == user.get(name)
        assert (name in m.properties) == (name in user)
    assert dict(m.properties) == user and len(m.properties) == len(user)
    for name in [*asked, *props]:  # after the listing, from the decoded ones
        assert m.properties.get(name, "-") == user.get(name, "-")
    if "TAGS" not in props:
        assert m.tag == tag


@pytest.mark.parametrize("bad", [{"a\x01": "v"}, {"a": "v\x02w"}])
def test_a_sample_cannot_smuggle_separators(bad: dict[str, str]) -> None:
    with pytest.raises(ValueError, match="control character"):
        row(topic="T", properties=bad)


def test_a_result_round_trips() -> None:
    payload = wire.encode_result(bytes([wire.MATCH, wire.ERROR, wire.REJECT]), {1: "ValueError: x"})
    result = wire.parse_result(payload, 3)
    assert result.codes == bytes([1, 2, 0]) and result.errors == {1: "ValueError: x"}


def test_error_texts_keep_printable_characters_only() -> None:
    """A text becomes a property of the message's dead-letter copy, which may not hold control
    characters or lone surrogates (a stored property refused: the group's reads failed)."""
    payload = _result(b"\x02", [[0, "ValueError: \x02a\nb\ud800c"]])
    assert wire.parse_result(payload, 1).errors == {0: "ValueError: ?a?b?c"}


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
        _result(b"\x01\x02\x01", [[True, "x"]]),  # a bool is no index (True == 1)
        struct.pack(">I", 3) + b"\x01\x01\x01" + b"\xff\xfe",
        struct.pack(">I", 3) + b"\x01\x02\x01" + b"[" * 5000,  # nested past the parser's recursion
        _result(b"\x01\x02\x01", [[1, "x" * 500]] + [[1, "y"]] * 2000),  # longer than one error may be
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
