"""``MessageStore.put_batch``: the broker's one-queue batch append agrees with ``put_messages``."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from siftmq.errors import MessageTooLargeError
from siftmq.store import Message, MessageStore, codec, decoding
from store_helpers import small_config

Opener = Callable[..., MessageStore]
HOST = codec.encode_host("10.1.2.3", 4567)

_names = st.text(
    st.characters(blacklist_characters="\x01\x02", blacklist_categories=("Cs",)), min_size=1, max_size=8
)
_entries = st.lists(
    st.tuples(
        st.binary(max_size=3000),
        st.dictionaries(
            _names,
            st.text(
                st.characters(blacklist_characters="\x01\x02", blacklist_categories=("Cs",)), max_size=12
            ),
            max_size=4,
        ),
        st.integers(0, 2**62),
    ),
    min_size=1,
    max_size=40,
)


def _records(store: MessageStore) -> list[bytes]:
    """Every record in the CommitLog with its store timestamp and record CRC zeroed."""
    out = []
    for seg in store.commit_log.segments():
        data = os.pread(seg.fd, seg.length, 0)
        pos = 0
        while pos < len(data):
            size, magic = decoding.peek_header(data, pos)
            if magic == codec.BLANK_MAGIC_CODE:
                break
            record = bytearray(data[pos : pos + size])
            record[8:12] = bytes(4)
            record[60:68] = bytes(8)
            out.append(bytes(record))
            pos += size
    return out


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(batches=st.lists(_entries, min_size=1, max_size=4), queue_id=st.integers(0, 3))
def test_put_batch_writes_what_put_messages_writes(
    tmp_path_factory: pytest.TempPathFactory, batches: list, queue_id: int
) -> None:
    root = tmp_path_factory.mktemp("differential")
    by_batch = MessageStore.open(
        small_config(root / "batch", commit_log_segment_size=64 * 1024, max_message_size=16 * 1024)
    )
    by_message = MessageStore.open(
        small_config(root / "messages", commit_log_segment_size=64 * 1024, max_message_size=16 * 1024)
    )
    try:
        offsets = []
        for entries in batches:
            got = by_batch.put_batch(
                "T", queue_id, [(body, dict(props), born, HOST) for body, props, born in entries]
            )
            want = by_message.put_messages(
                [
                    Message("T", body, queue_id, dict(props), born_timestamp=born, born_host=HOST)
                    for body, props, born in entries
                ]
            )
            assert [(r.queue_id, r.queue_offset, r.commit_log_offset, r.size) for r in got] == [
                (r.queue_id, r.queue_offset, r.commit_log_offset, r.size) for r in want
            ]
            offsets += got
        assert _records(by_batch) == _records(by_message)
        stored = [by_batch.look_message_by_offset(r.commit_log_offset) for r in offsets]
        assert [m.body for m in stored] == [body for entries in batches for body, _, _ in entries]
        assert [m.properties for m in stored] == [props for entries in batches for _, props, _ in entries]
        assert all(m.born_host == HOST for m in stored)
        assert [m.queue_offset for m in stored] == list(range(len(stored)))
        assert by_batch.get_max_offset_in_queue("T", queue_id) == len(stored)
    finally:
        by_batch.close()
        by_message.close()


def test_a_put_batch_that_does_not_fit_goes_whole_to_the_next_segment(open_store: Opener) -> None:
    """As RocketMQ's batch append: none of it is left in the old segment should the write in the
    next one fail."""
    store = open_store()  # 1 MiB segments
    for _ in range(15):
        store.put_message(Message("T", b"x" * 60_000))
    body = b"y" * 30_000
    results = store.put_batch("T", 0, [(body, {"TAGS": "A"}, 1, HOST) for _ in range(10)])
    assert [r.queue_offset for r in results] == list(range(15, 25))
    segments = {r.commit_log_offset >> 20 for r in results}
    assert segments == {1}
    for r in results:  # no record spans two segments, and each reads back
        assert r.commit_log_offset >> 20 == (r.commit_log_offset + r.size - 1) >> 20
        m = store.look_message_by_offset(r.commit_log_offset)
        assert m is not None and m.body == body and m.tags == "A" and m.queue_offset == r.queue_offset
    store.close()
    store = open_store()  # and recovery agrees
    assert store.get_max_offset_in_queue("T", 0) == 25


def test_bad_batches_change_nothing(open_store: Opener) -> None:
    store = open_store()
    store.put_batch("T", 0, [(b"ok", {}, 0, HOST)])
    before = store.max_commit_log_offset
    ok = (b"ok", {}, 0, HOST)
    cases: list[tuple[type[Exception], str, Callable[[], object]]] = [
        (
            MessageTooLargeError,
            "body",
            lambda: store.put_batch("T", 0, [ok, (b"x" * (64 * 1024 + 1), {}, 0, HOST)]),
        ),
        (
            MessageTooLargeError,
            "properties",
            lambda: store.put_batch("T", 0, [ok, (b"a", {"p": "v" * 40_000}, 0, HOST)]),
        ),
        (ValueError, "separator", lambda: store.put_batch("T", 0, [ok, (b"a", {"bad": "a\x02b"}, 0, HOST)])),
        (ValueError, "born_host", lambda: store.put_batch("T", 0, [ok, (b"a", {}, 0, b"short")])),
        (ValueError, "must be bytes", lambda: store.put_batch("T", 0, [ok, ("text", {}, 0, HOST)])),
        (ValueError, "queue id", lambda: store.put_batch("T", -1, [ok])),
        (ValueError, "illegal topic", lambda: store.put_batch("bad topic", 0, [ok])),
    ]
    for error, match, call in cases:
        with pytest.raises(error, match=match):
            call()
    assert store.max_commit_log_offset == before
    assert store.get_max_offset_in_queue("T", 0) == 1
    assert store.put_batch("T", 0, []) == []


def test_put_batch_bodies_may_be_any_bytes_like(open_store: Opener, tmp_path: Path) -> None:
    store = open_store()
    results = store.put_batch(
        "T", 2, [(bytearray(b"ab"), {}, 5, HOST), (memoryview(b"cd"), {"K": "v"}, 6, HOST)]
    )
    got = [store.look_message_by_offset(r.commit_log_offset) for r in results]
    assert [(m.body, m.properties, m.born_timestamp) for m in got if m is not None] == [
        (b"ab", {}, 5),
        (b"cd", {"K": "v"}, 6),
    ]
