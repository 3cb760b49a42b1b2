"""Broker settings are checked against their field's type and range however they come (a TOML file,
a command-line option, a direct construction), and a bad one is a ConfigError naming the key.

Before, ``retention_hours = 0`` deleted every closed segment at the first retention pass,
``allow_anonymous = "false"`` (a string) turned protected mode off, ``compat_groups = "g"`` became a
tuple of characters and ``listen = 8081`` ended in a traceback.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from siftmq.broker.config import BrokerConfig
from siftmq.errors import ConfigError
from siftmq.testing import toml_value

# key, bad value, what the error must say
BAD: list[tuple[str, Any, str]] = [
    ("retention_hours", -1, "must be positive"),
    ("retention_hours", 0, "must be positive"),
    ("retention_hours", float("nan"), "finite number"),
    ("retention_check_interval_s", 0, "must be positive"),
    ("client_session_expire_s", -1, "must be positive"),
    ("broadcast_client_expire_s", 0.0, "must be positive"),
    ("filter_registration_expire_s", -5, "must be positive"),
    ("commit_log_segment_size", -5, "must be positive"),
    ("disk_reserve_bytes", -1, "must not be negative"),
    ("disk_high_water_ratio", 0, "(0, 1]"),
    ("disk_max_used_space_ratio", 1.5, "(0, 1]"),
    ("send_threads", -1, "must not be negative"),
    ("read_threads", 100_000, "at most 1024"),
    ("max_queue_nums", 70_000, "at most 65536"),  # gRPC's bounds sized from it are C ints
    ("max_body_size", 1.5, "an integer"),
    ("workers", True, "an integer"),
    ("allow_anonymous", "false", "true or false"),
    ("authentication_enabled", 1, "true or false"),
    ("compat_groups", "mygroup", "a list of strings"),
    ("broadcasting_groups", ["g", 7], "item 1"),
    ("listen", 8081, "a string"),
    ("admin_listen", 8082, "a string"),
    ("retry_backoff_s", "abc", "a list of numbers"),
    ("retry_backoff_s", ["1", 2], "item 0"),
    ("retry_backoff_s", [], "non-empty"),
    ("retry_backoff_s", [1, -2], "positive"),
    ("flush", "fast", "'sync', 'async'"),
    ("disk_full_policy", True, "'refuse', 'delete_oldest'"),
    ("data_dir", "", "non-empty path"),
    ("broker_name", 3, "a string"),
]


@pytest.mark.parametrize(("key", "value", "why"), BAD, ids=[f"{k}={v!r}" for k, v, _ in BAD])
def test_a_bad_value_is_refused_naming_its_key(tmp_path: Path, key: str, value: Any, why: str) -> None:
    with pytest.raises(ConfigError) as direct:
        BrokerConfig(**{key: value})
    assert key in str(direct.value) and why in str(direct.value)

    with pytest.raises(ConfigError) as overridden:
        BrokerConfig.load(None, **{key: value})
    assert key in str(overridden.value) and why in str(overridden.value)

    path = tmp_path / "siftmq.toml"
    path.write_text(f"{key} = {toml_value(value)}\n")
    with pytest.raises(ConfigError) as filed:
        BrokerConfig.load(path)
    assert key in str(filed.value) and why in str(filed.value)


def test_every_numeric_field_is_range_checked() -> None:
    """A new number gets the positive check by default: none takes 0 or -1 unless 0 means something."""
    accepted_zero = set()
    for name, default in ((f, getattr(BrokerConfig(), f)) for f in BrokerConfig.__dataclass_fields__):
        if isinstance(default, bool) or not isinstance(default, int | float):
            continue
        with pytest.raises(ConfigError, match=name):
            BrokerConfig(**{name: -1})
        try:
            BrokerConfig(**{name: 0})
        except ConfigError:
            continue
        accepted_zero.add(name)
    assert accepted_zero == {"disk_reserve_bytes", "max_connections", "send_threads"}


def test_a_file_value_is_checked_even_when_an_option_replaces_it(tmp_path: Path) -> None:
    path = tmp_path / "siftmq.toml"
    path.write_text("listen = 8081\nallow_anonymous = true\nretention_hours = 1\n")
    with pytest.raises(ConfigError, match=r"siftmq.toml: listen must be a string, not 8081"):
        BrokerConfig.load(path, listen="127.0.0.1:0")
    path.write_text('listen = "127.0.0.1:0"\ncompat_groups = ["a", "b"]\nretry_backoff_s = [1, 2.5]\n')
    config = BrokerConfig.load(path, listen="127.0.0.1:9")  # options win over the file
    assert config.listen == "127.0.0.1:9"
    assert config.compat_groups == ("a", "b") and config.retry_backoff_s == (1.0, 2.5)


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("retention_hours = -1", "retention_hours must be positive, not -1"),
        ('allow_anonymous = "false"', "allow_anonymous must be true or false, not 'false'"),
        ('retry_backoff_s = "abc"', "retry_backoff_s must be a list of numbers, not 'abc'"),
        # before: named a key that does not exist (max_message_size), exited 1, made the data dir
        ("max_body_size = 2000000000", "max_body_size 2000000000 needs commit_log_segment_size of at least"),
    ],
)
def test_siftmq_broker_with_a_bad_config_exits_with_the_message(tmp_path: Path, text: str, why: str) -> None:
    """A real ``siftmq broker`` start: it exits non-zero naming the key, with no traceback and no data."""
    path = tmp_path / "bad.toml"
    path.write_text(text + "\n")
    command = [sys.executable, "-m", "siftmq", "broker", "--config", str(path)]
    command += [
        "--data-dir",
        str(tmp_path / "data"),
        "--listen",
        "127.0.0.1:0",
        "--admin-listen",
        "127.0.0.1:0",
    ]
    done = subprocess.run(
        [*command, "--workers", "1"], capture_output=True, text=True, timeout=60, check=False
    )
    output = done.stdout + done.stderr
    assert done.returncode == 2, output
    assert why in output and "Traceback" not in output and "ready on" not in output
    assert not (tmp_path / "data").exists()
