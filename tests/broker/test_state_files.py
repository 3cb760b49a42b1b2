"""The broker's state files: atomic, checksummed, with the previous generation to fall back on."""

from __future__ import annotations

import hashlib
import itertools
import json
import logging
import threading
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from siftmq.errors import ConfigError
from siftmq.store.statefile import FORMAT, _canonical, previous_of, read_json, write_json


def _tamper(path: Path, key: str, value: object) -> None:
    """Change a value and leave the file valid JSON, as a hand edit would."""
    content = json.loads(path.read_bytes())
    content["data"][key] = value
    path.write_text(json.dumps(content))


def test_a_round_trip_keeps_the_previous_generation(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    write_json(path, {"offset": 1})
    write_json(path, {"offset": 2, "name": "中文"})
    assert read_json(path, None) == {"offset": 2, "name": "中文"}
    assert read_json(previous_of(path), None) == {"offset": 1}
    assert not path.with_name("state.json.tmp").exists()


_json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=5),
    max_leaves=20,
)


@given(data=_json_values | st.dictionaries(st.text(max_size=6), _json_values, max_size=6))
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_a_written_file_is_byte_for_byte_the_canonical_envelope(tmp_path: Path, data: object) -> None:
    """The envelope is put together around the data's encoding (made once, an object a member at a
    time); the bytes are exactly what encoding the whole envelope in one call gives."""
    path = tmp_path / "state.json"
    write_json(path, data)
    envelope = {"format": FORMAT, "sha256": hashlib.sha256(_canonical(data)).hexdigest(), "data": data}
    assert path.read_bytes() == _canonical(envelope)
    assert read_json(path, "missing") == json.loads(_canonical(data))


@given(
    sizes=st.lists(st.integers(0, 700), min_size=2, max_size=900),
    names=st.sampled_from(["g\t{}\tT", "é{}", "{}"]),
)
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_a_large_object_written_a_few_members_at_a_time_is_still_the_canonical_encoding(
    tmp_path: Path, sizes: list[int], names: str
) -> None:
    """Objects the size of a broker's progress and groups files (hundreds of members, lists of
    hundreds of items) are encoded in chunks; the bytes are those of one call all the same."""
    data = {names.format(n): {"pop": n, "inflight": [[n, 1, 2]] * size} for n, size in enumerate(sizes)}
    path = tmp_path / "state.json"
    write_json(path, data)
    envelope = {"format": FORMAT, "sha256": hashlib.sha256(_canonical(data)).hexdigest(), "data": data}
    assert path.read_bytes() == _canonical(envelope)


def test_an_edit_that_stays_valid_json_falls_back_to_the_previous_generation(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "consumer_state.json"
    write_json(path, {"offset": 10})
    write_json(path, {"offset": 12})
    _tamper(path, "offset", 500)
    with caplog.at_level(logging.ERROR):
        assert read_json(path, {}, strict=True) == {"offset": 10}
    assert path.with_name("consumer_state.json.corrupt").exists()
    write_json(path, {"offset": 11})  # the damaged file is not rotated into .prev
    assert read_json(previous_of(path), None) == {"offset": 10}
    assert any(
        "consumer_state.json" in r.getMessage() and "checksum" in r.getMessage() for r in caplog.records
    )


def test_a_crash_between_the_two_renames_reads_the_previous_generation(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    write_json(path, {"offset": 1})
    write_json(path, {"offset": 2})
    path.unlink()  # what a crash after "current -> .prev" and before ".tmp -> current" leaves
    assert read_json(path, {}, strict=True) == {"offset": 1}


def test_no_good_generation_stops_a_strict_file_and_names_the_remedy(tmp_path: Path) -> None:
    path = tmp_path / "consumer_offsets.json"
    write_json(path, {"a": 1})
    write_json(path, {"a": 2})
    _tamper(path, "a", 3)
    _tamper(previous_of(path), "a", 4)
    with pytest.raises(ConfigError) as exc:
        read_json(path, {}, strict=True)
    assert "consumer_offsets.json" in exc.value.message and "restore it from a backup" in exc.value.message
    assert path.exists()  # nothing moved: the operator decides


def test_no_good_generation_of_another_file_starts_from_defaults(tmp_path: Path) -> None:
    path = tmp_path / "topics.json"
    path.write_text("{not json")
    assert read_json(path, {"default": True}) == {"default": True}
    assert path.with_name("topics.json.corrupt").exists() and not path.exists()


def test_files_from_before_checksums_are_read_as_they_are(tmp_path: Path) -> None:
    path = tmp_path / "groups.json"
    path.write_text(json.dumps({"g": {"mode": "clustering"}}))
    assert read_json(path, {}) == {"g": {"mode": "clustering"}}
    write_json(path, read_json(path, {}))
    assert json.loads(path.read_bytes())["format"] == "siftmq-state-1"


def test_no_flipped_bit_makes_a_file_pass_for_one_written_before_checksums(tmp_path: Path) -> None:
    """Every single-bit flip of a written file is caught: in the format string or a key of the
    envelope too (it was then read as a file from before checksums and believed unchecked)."""
    path = tmp_path / "layout.json"
    data = {"commit_log_segment_size": 1 << 20, "max_record_size": 98_525}
    write_json(path, data)
    written = path.read_bytes()
    for i, bit in itertools.product(range(len(written)), range(8)):
        flipped = bytearray(written)
        flipped[i] ^= 1 << bit
        path.write_bytes(bytes(flipped))
        with pytest.raises(ConfigError, match=r"layout\.json"):
            read_json(path, None, strict=True)  # no previous generation to fall back on


def test_subscriptions_stored_in_an_older_normal_form_load_in_todays(tmp_path: Path) -> None:
    """Prefix chains lost their parentheses in the normalized text: a member that comes back with the
    same expression after an upgrade still holds the same subscription."""
    from siftmq.broker.groups import GroupManager

    old = {"kind": "SQL92", "expression": "(NOT a) = 'x'", "version": 3}
    write_json(tmp_path / "groups.json", {"g": {"subscriptions": {"T": old}}})
    info = GroupManager(tmp_path).get("g")
    assert info is not None and info.subscriptions["T"].expression == "NOT a = 'x'"
    assert info.subscriptions["T"].version == 3


def test_a_slow_progress_write_is_made_less_often(tmp_path: Path) -> None:
    """The housekeeping writes consumer progress at most once per SAVE_SPACING times the last write
    took: with writes of ~50 ms and a flush every 10 ms it writes about once a second, not 20 times."""
    from siftmq.broker import ProducedMessage, Subscription
    from siftmq.broker.broker import SAVE_SPACING
    from siftmq.testing import open_broker

    broker = open_broker(tmp_path / "data", consumer_state_flush_ms=10)
    try:
        real_save = broker.consumers.save
        saves: list[float] = []

        def slow_save() -> None:
            time.sleep(0.05)  # as a progress file with ~40,000 messages in flight takes
            real_save()
            saves.append(time.monotonic())

        broker.consumers.save = slow_save  # type: ignore[method-assign]
        broker.send_many([ProducedMessage("T", b"x", f"01SLOWSAVE{n:06d}") for n in range(1000)])
        deadline = time.monotonic() + 2.5
        while time.monotonic() < deadline:  # progress keeps changing: a receive every 10 ms
            assert broker.receive("g", Subscription("T", "TAG", "*"), batch_size=1)
            time.sleep(0.01)
        gaps = [b - a for a, b in itertools.pairwise(saves)]
        assert 1 <= len(saves) <= 4, saves
        assert all(gap >= SAVE_SPACING * 0.05 * 0.9 for gap in gaps), gaps
    finally:
        broker.close()


def test_progress_removed_is_written_at_the_next_pass_whatever_the_spacing(tmp_path: Path) -> None:
    """A deleted topic's progress leaves the file at the next housekeeping pass, though the last
    (slow) write put the next periodic one off: a crash must not bring the deleted progress back."""
    from siftmq.broker import ProducedMessage, Subscription
    from siftmq.broker.deletion import delete_topic
    from siftmq.testing import open_broker

    broker = open_broker(tmp_path / "data", consumer_state_flush_ms=10)
    path = tmp_path / "data" / "config" / "consumer_state.json"
    try:
        real_save = broker.consumers.save

        def slow_save() -> None:
            time.sleep(0.2)  # the next periodic write no sooner than 4 s later
            real_save()

        broker.send(ProducedMessage("Doomed", b"x", "01DOOMED"))
        assert broker.receive("g", Subscription("Doomed", "TAG", "*"), batch_size=1)
        broker.consumers.save = slow_save  # type: ignore[method-assign]
        time.sleep(0.5)  # one slow write with the Doomed progress in it
        assert any(key.split("\t")[1] == "Doomed" for key in read_json(path, {}))
        delete_topic(broker, "Doomed")
        deadline = time.monotonic() + 2.0
        while any(key.split("\t")[1] == "Doomed" for key in read_json(path, {})):
            assert time.monotonic() < deadline, "the removal waited for the spacing"
            time.sleep(0.05)
    finally:
        broker.close()


def test_saves_from_two_threads_never_interleave(tmp_path: Path) -> None:
    """A receive thread saves a new queue's start while the housekeeping may be saving: the file
    is always one whole snapshot (both writers used one temporary file)."""
    from siftmq.broker.consumer_state import ConsumerStateTable, InFlight

    table = ConsumerStateTable(tmp_path)
    for qid in range(8):  # ~1.5 MB: a write takes long enough for two to overlap
        prog = table.get_or_create(("g", "T", qid), 0)
        for offset in range(4000):
            prog.put(InFlight(offset, offset * 1024, 1024, 1, 2**40 + offset, 2**47 + offset))
    errors: list[BaseException] = []

    def saver() -> None:
        try:
            for _ in range(15):
                table.save()
        except BaseException as exc:  # reported by the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=saver) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    data = read_json(tmp_path / "consumer_state.json", {}, strict=True)
    assert len(data) == 8 and all(len(item["inflight"]) == 4000 for item in data.values())


def test_a_failed_progress_write_keeps_a_removal_urgent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A full disk refuses the write that was to drop a deleted topic's progress: the next pass
    tries again at once (not after the spacing), and the file keeps the last good snapshot."""
    from siftmq.broker import consumer_state
    from siftmq.broker.consumer_state import ConsumerStateTable

    table = ConsumerStateTable(tmp_path)
    table.get_or_create(("g", "Doomed", 0), 7)
    table.save()
    table.remove_where(lambda key: key[1] == "Doomed")
    assert table.urgent

    def disk_full(path: Path, data: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(consumer_state, "write_json", disk_full)
    with pytest.raises(OSError):
        table.save()
    assert table.dirty and table.urgent
    assert "g\tDoomed\t0" in read_json(tmp_path / "consumer_state.json", {}, strict=True)
    monkeypatch.undo()
    table.save()
    assert not table.urgent and read_json(tmp_path / "consumer_state.json", {}, strict=True) == {}


def test_pull_offsets_saved_from_two_threads_at_once(tmp_path: Path) -> None:
    """The housekeeping and a mode switch save the offsets table at once: before, they shared the
    file's temporary name and one failed (FileNotFoundError, 251 of 600 saves)."""
    from siftmq.broker.offsets import OffsetTable

    table = OffsetTable(tmp_path)
    failures: list[BaseException] = []

    def save_often(queue: int) -> None:
        for offset in range(1, 301):
            table.set(("g", "T", queue), offset)
            try:
                table.save()
            except Exception as exc:
                failures.append(exc)

    threads = [threading.Thread(target=save_often, args=(q,)) for q in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert failures == []
    table.save()
    again = OffsetTable(tmp_path)
    assert again.get(("g", "T", 0)) == 300 and again.get(("g", "T", 1)) == 300


def test_progress_put_back_wins_over_progress_made_meanwhile(tmp_path: Path) -> None:
    """A group deletion that fails puts back what it took. A read in between (a client that had not
    been seen yet) made progress by the rule for a new group; before, that stayed, and the group's
    position and its messages in flight were lost."""
    from siftmq.broker.consumer_state import ConsumerStateTable
    from siftmq.broker.offsets import OffsetTable

    consumers = ConsumerStateTable(tmp_path)
    consumers.get_or_create(("g", "T", 0), 6)
    taken = consumers.take_where(lambda key: key[0] == "g")
    consumers.get_or_create(("g", "T", 0), 0)  # the read meanwhile
    consumers.put_back(taken)
    prog = consumers.get(("g", "T", 0))
    assert prog is not None and prog.pop_offset == 6

    offsets = OffsetTable(tmp_path)
    offsets.set(("g", "T", 0), 6)
    taken_offsets = offsets.take_where(lambda key: key[0] == "g")
    offsets.set(("g", "T", 0), 0)
    offsets.put_back(taken_offsets)
    assert offsets.get(("g", "T", 0)) == 6


def test_progress_past_its_queues_end_is_brought_back_keeping_what_is_in_flight_below(tmp_path: Path) -> None:
    """At start, progress past its queue's end (a topic deletion cut short, or a power loss that
    took a queue's unflushed tail) goes back to the end; messages in flight below it stay."""
    from siftmq.broker.consumer_state import ConsumerStateTable, InFlight

    table = ConsumerStateTable(tmp_path)
    prog = table.get_or_create(("g", "T", 0), 10)
    for offset in (3, 4, 8):
        prog.put(InFlight(offset, 100 * offset, 50, 1, 0, 7))
    table.clamp(("g", "T", 0), 6)
    clamped = table.get(("g", "T", 0))
    assert clamped is not None
    assert (clamped.pop_offset, sorted(clamped.inflight)) == (6, [3, 4])
    assert [i.queue_offset for i in clamped.pop_due(10**15, 10)] == [3, 4]  # still delivered again
