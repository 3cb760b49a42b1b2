"""The broker's state files: atomic, checksummed, with the previous generation to fall back on."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from siftmq.errors import ConfigError
from siftmq.store.statefile import previous_of, read_json, write_json


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


def test_subscriptions_stored_in_an_older_normal_form_load_in_todays(tmp_path: Path) -> None:
    """Prefix chains lost their parentheses in the normalized text: a member that comes back with the
    same expression after an upgrade still holds the same subscription."""
    from siftmq.broker.groups import GroupManager

    old = {"kind": "SQL92", "expression": "(NOT a) = 'x'", "version": 3}
    write_json(tmp_path / "groups.json", {"g": {"subscriptions": {"T": old}}})
    info = GroupManager(tmp_path).get("g")
    assert info is not None and info.subscriptions["T"].expression == "NOT a = 'x'"
    assert info.subscriptions["T"].version == 3
