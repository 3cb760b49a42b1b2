"""Record codec: round trips, CRC/magic checks, property encoding, limits."""

from __future__ import annotations

import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from siftmq.errors import CorruptRecordError, MessageTooLargeError
from siftmq.store import codec, decoding
from siftmq.store.codec import Message

_prop_text = st.text(
    alphabet=st.characters(blacklist_characters="\x01\x02", blacklist_categories=("Cs",)), max_size=20
)
_messages = st.builds(
    Message,
    topic=st.text(alphabet="abcXYZ019_-%|", min_size=1, max_size=127),
    body=st.binary(max_size=2000),
    queue_id=st.integers(0, 2**31 - 1),
    properties=st.dictionaries(_prop_text.filter(bool), _prop_text, max_size=8),
    flag=st.integers(-(2**31), 2**31 - 1),
    sys_flag=st.integers(0, 2**31 - 1),
    born_timestamp=st.integers(0, 2**62),
    born_host=st.binary(min_size=8, max_size=8),
    store_host=st.binary(min_size=8, max_size=8),
    reconsume_times=st.integers(0, 16),
)


@settings(max_examples=200, deadline=None)
@given(m=_messages, queue_offset=st.integers(0, 2**62), physical=st.integers(0, 2**62))
def test_round_trip(m: Message, queue_offset: int, physical: int) -> None:
    parts = codec.prepare(m, max_body_size=4096)
    raw = codec.encode_record(parts, queue_offset=queue_offset, physical_offset=physical, store_timestamp=7)
    assert len(raw) == parts.size
    out = decoding.decode_record(raw, 0, physical, max_record_size=1 << 20)
    assert (out.topic, out.body, out.queue_id, out.properties) == (
        m.topic,
        m.body,
        m.queue_id,
        dict(m.properties),
    )
    assert (out.flag, out.sys_flag, out.born_timestamp, out.reconsume_times) == (
        m.flag,
        m.sys_flag,
        m.born_timestamp,
        m.reconsume_times,
    )
    assert (out.born_host, out.store_host) == (m.born_host, m.store_host)
    assert (out.queue_offset, out.commit_log_offset, out.store_timestamp) == (queue_offset, physical, 7)
    assert out.body_crc == zlib.crc32(m.body)


@settings(max_examples=300, deadline=None)
@given(m=_messages, data=st.data())
def test_any_flipped_byte_is_detected(m: Message, data: st.DataObject) -> None:
    raw = bytearray(
        codec.encode_record(
            codec.prepare(m, max_body_size=4096), queue_offset=1, physical_offset=100, store_timestamp=7
        )
    )
    i = data.draw(st.integers(0, len(raw) - 1))
    raw[i] ^= data.draw(st.integers(1, 255))
    with pytest.raises(CorruptRecordError) as err:
        decoding.decode_record(bytes(raw), 0, 100, max_record_size=1 << 20)
    assert err.value.offset == 100


def test_truncated_record_is_detected() -> None:
    raw = codec.encode_record(
        codec.prepare(Message("T", b"abc"), max_body_size=10),
        queue_offset=0,
        physical_offset=0,
        store_timestamp=1,
    )
    for cut in range(len(raw)):
        with pytest.raises(CorruptRecordError):
            decoding.decode_record(raw[:cut], 0, 0, max_record_size=1 << 20)
        with pytest.raises(CorruptRecordError):
            decoding.decode_record(raw[:cut] + b"\xff" * 8, 0, 0, max_record_size=1 << 20)


def test_record_at_wrong_offset_is_rejected() -> None:
    raw = codec.encode_record(
        codec.prepare(Message("T", b"abc"), max_body_size=10),
        queue_offset=0,
        physical_offset=64,
        store_timestamp=1,
    )
    with pytest.raises(CorruptRecordError, match="physical offset 64"):
        decoding.decode_record(raw, 0, 0, max_record_size=1 << 20)


@pytest.mark.parametrize(("name", "value"), [("a\x01b", "v"), ("a", "v\x02"), ("k", "\x01"), ("", "v")])
def test_property_separators_are_rejected(name: str, value: str) -> None:
    with pytest.raises(ValueError, match=r"separator|empty"):
        codec.prepare(Message("T", b"", properties={name: value}), max_body_size=10)


def test_properties_round_trip_text() -> None:
    props = {"TAGS": "TagA", "KEYS": "k1 k2", "UNIQ_KEY": "ABC", "Region": "杭州"}
    assert codec.decode_properties(codec.encode_properties(props)) == props
    assert codec.encode_properties({"a": "1"}) == b"a\x011\x02"


def test_limits() -> None:
    with pytest.raises(MessageTooLargeError, match="body"):
        codec.prepare(Message("T", b"x" * 11), max_body_size=10)
    with pytest.raises(MessageTooLargeError, match="topic"):
        codec.prepare(Message("T" * 128, b""), max_body_size=10)
    with pytest.raises(ValueError, match="illegal topic"):
        codec.prepare(Message("a/b", b""), max_body_size=10)
    with pytest.raises(ValueError, match="illegal topic"):
        codec.prepare(Message("", b""), max_body_size=10)
    with pytest.raises(MessageTooLargeError, match="properties"):
        codec.prepare(Message("T", b"", properties={"p": "v" * 40000}), max_body_size=10)
    with pytest.raises(ValueError, match="queue id"):
        codec.prepare(Message("T", b"", queue_id=-1), max_body_size=10)


@pytest.mark.parametrize(
    ("text", "expected"),
    [("", 0), ("hello", 99162322), ("TagA", 2598919), ("a" * 40, None), ("杭州", 0x676D * 31 + 0x5DDE)],
)
def test_java_string_hash(text: str, expected: int | None) -> None:
    h = codec.java_string_hash(text)
    assert -(2**31) <= h < 2**31
    if expected is not None:
        assert h == expected
    if text:
        # Java semantics: s[0]*31^(n-1) + ... over UTF-16 units, wrapped to int32
        units = text.encode("utf-16-be")
        ref = 0
        for i in range(0, len(units), 2):
            ref = (ref * 31 + int.from_bytes(units[i : i + 2], "big")) % 2**32
        assert h == (ref - 2**32 if ref >= 2**31 else ref)


def test_tags_code_and_hosts() -> None:
    assert codec.tags_code_of(None) == 0
    assert codec.tags_code_of("") == 0
    assert codec.tags_code_of("TagA") == codec.java_string_hash("TagA")
    raw = codec.encode_host("10.1.2.3", 10911)
    assert codec.decode_host(raw) == ("10.1.2.3", 10911)
    with pytest.raises(ValueError):
        codec.encode_host("::1", 1)
