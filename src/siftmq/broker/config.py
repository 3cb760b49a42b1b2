"""Broker configuration: defaults, a TOML file (``--config siftmq.toml``) and command-line overrides.

Every knob has a production-minded default; the file uses the same names as :class:`BrokerConfig`
(unknown names are an error, so a typo never passes silently). A value is taken from the command
line's options, else from the file, else the default (no environment variable sets one). Every value
is checked against its field's type however it came (a file, an option, a direct construction):
``allow_anonymous = "false"`` is a string, not false, and must not turn protected mode off; and every
number against its range (a retention of 0 hours would delete every closed segment at once)::

    data_dir = "./data"
    listen = "127.0.0.1:8081"
    flush = "sync"
    auto_create_topics = true
    default_queue_nums = 8
    enable_property_filter = true
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import tomllib
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Literal

from siftmq.errors import ConfigError
from siftmq.store.config import smallest_segment

MIB = 1024 * 1024

#: RocketMQ's default retry schedule (messageDelayLevel from level 3 on), in seconds.
DEFAULT_RETRY_BACKOFF_S: tuple[float, ...] = (
    1,
    5,
    10,
    30,
    60,
    120,
    180,
    240,
    300,
    360,
    420,
    480,
    540,
    600,
    1200,
    1800,
    3600,
    7200,
)


@dataclass(frozen=True, slots=True)
class BrokerConfig:
    """What a broker process runs with."""

    data_dir: Path = Path("./data")
    listen: str = "127.0.0.1:8081"
    admin_listen: str = "127.0.0.1:8082"  # the admin HTTP API and /metrics; "" turns it off
    # security (RocketMQ's names): every gRPC call signed by a user of auth_file (MQv2-HMAC-SHA1),
    # and its topics and groups allowed by the user's ACL 2.0 policies; auth_file is JSON in
    # RocketMQ 5.3's shape, relative to <data_dir>/config unless absolute
    authentication_enabled: bool = False
    authorization_enabled: bool = False
    auth_file: str = "auth.json"
    auth_clock_skew_s: float = 900.0
    # also accept x-mq-date-time stamped in this host's local time (the official Python client's
    # habit); off: on a host not on UTC it lets a captured signature work again hours later
    auth_local_time_stamps: bool = False
    # gRPC over TLS with this certificate and key (PEM); with tls_client_ca_file, clients must show a
    # certificate that CA signed (mutual TLS)
    tls_cert_file: str = ""
    tls_key_file: str = ""
    tls_client_ca_file: str = ""
    # protected mode: without authentication the broker only listens on loopback, unless this is set
    allow_anonymous: bool = False
    # with authentication on, /metrics still answers without a login (for a local Prometheus)
    admin_metrics_open: bool = True
    # how long a bearer token from POST /tokens on the admin API lasts
    admin_token_ttl_s: float = 3600.0
    # a request (line, headers, body) not received within this time is dropped: slow clients cannot
    # hold the admin server's connections; beyond admin_max_connections it answers 503
    admin_request_timeout_s: float = 10.0
    admin_max_connections: int = 256
    # gRPC connections a process serving them holds at most (each is a file descriptor); 0: a quarter
    # of its open-file limit
    max_connections: int = 0
    flush: Literal["sync", "async"] = "async"
    flush_interval_ms: int = 500
    commit_log_segment_size: int = 1024 * MIB
    retention_hours: float = 72.0  # CommitLog segments older than this are deleted
    # a full disk refuses sends ("refuse") while used at or above disk_high_water_ratio or with less
    # than disk_reserve_bytes free; "delete_oldest" also deletes unexpired segments, oldest first,
    # while the disk is fuller than disk_max_used_space_ratio (messages not consumed yet are lost)
    disk_full_policy: Literal["refuse", "delete_oldest"] = "refuse"
    disk_high_water_ratio: float = 0.90
    disk_reserve_bytes: int = 64 * MIB
    disk_max_used_space_ratio: float = 0.75
    retention_check_interval_s: float = 60.0
    # message ids (and their keys) the in-memory index keeps for lookups and retries, ~150-200 bytes
    # each; the oldest go at the next retention check
    key_index_max_messages: int = 10_000_000
    broker_name: str = "siftmq-broker"
    # topics
    auto_create_topics: bool = True
    default_queue_nums: int = 8
    max_queue_nums: int = 1024  # the calls one gRPC connection may hold follow it (a pull of each queue)
    max_topics: int = 10_000  # every topic holds open files and memory: creating one more is refused
    # consumer groups (each costs memory and a share of every write of the groups and progress files)
    max_groups: int = 10_000
    # messages
    max_body_size: int = 4 * MIB
    max_user_properties: int = 128
    max_user_properties_bytes: int = 16 * 1024
    # filtering
    enable_property_filter: bool = True
    filter_registration_expire_s: float = 24 * 3600.0
    # the filter server: sandboxed worker processes running consumers' filter programs (one
    # program version per worker); a worker gets filter_program_timeout_ms per message of a batch
    # (at most filter_program_batch_timeout_ms) and filter_program_memory_mb of address space; a
    # program whose workers are killed filter_program_max_failures times in a minute is suspended
    filter_server_nums: int = 2
    filter_program_memory_mb: int = 256
    filter_program_timeout_ms: float = 50.0
    filter_program_batch_timeout_ms: float = 500.0
    filter_program_max_failures: int = 16
    # receive / ack
    min_invisible_time_s: float = 1.0
    max_invisible_time_s: float = 12 * 3600.0
    default_invisible_time_s: float = 60.0
    max_long_polling_s: float = 30.0
    push_long_polling_s: float = 20.0
    max_batch_size: int = 64  # messages per receive (each one is then in flight)
    max_pull_batch_size: int = 1024  # messages per offset pull
    max_pull_bytes: int = 8 * MIB  # bytes per offset pull and per receive's answer (one message at least)
    # siftmq's batch extension (one frame per pull/receive answer); siftmq clients fall back to the
    # standard one-message-per-frame calls when it is off
    batch_extension: bool = True
    # threads that serve pull and receive reads: CPU-bound reads spread over many threads lose time
    # to GIL hand-offs (the README's configuration section has the figures)
    read_threads: int = 1
    # threads that append sends; 0 = 1 with async flush (one appending thread costs the least CPU
    # per message), 64 with sync flush (concurrent sends then share one fsync)
    send_threads: int = 0
    # gRPC front-end processes in front of this one (the core): 1 serves gRPC in this process; N
    # spread the protocol's per-call work over N more cores (``siftmq broker --workers``)
    workers: int = 1
    max_delivery_attempts: int = 16
    retry_backoff_s: tuple[float, ...] = field(default=DEFAULT_RETRY_BACKOFF_S)
    consumer_state_flush_ms: int = 1000
    client_session_expire_s: float = 30.0
    # a broadcasting group's client keeps its own progress; it is dropped once the client has not
    # been seen for this long (a client back later starts again like a new member)
    broadcast_client_expire_s: float = 7 * 24 * 3600.0
    # consumer groups
    compat_groups: tuple[str, ...] = ()
    broadcasting_groups: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for name, value in _values(self).items():
            check_value(name, value)
        object.__setattr__(self, "data_dir", Path(self.data_dir))
        object.__setattr__(self, "retry_backoff_s", tuple(float(x) for x in self.retry_backoff_s))
        object.__setattr__(self, "compat_groups", tuple(self.compat_groups))
        object.__setattr__(self, "broadcasting_groups", tuple(self.broadcasting_groups))
        parse_listen(self.listen)
        if self.admin_listen:
            parse_listen(self.admin_listen)
        if self.workers > MAX_WORKERS:
            raise ConfigError(f"workers must be at most {MAX_WORKERS}, not {self.workers}")
        if self.max_queue_nums > MAX_QUEUE_NUMS:
            raise ConfigError(f"max_queue_nums must be at most {MAX_QUEUE_NUMS}, not {self.max_queue_nums}")
        for name in ("read_threads", "send_threads"):
            if getattr(self, name) > MAX_THREADS:
                raise ConfigError(f"{name} must be at most {MAX_THREADS}, not {getattr(self, name)}")
        if bool(self.tls_cert_file) != bool(self.tls_key_file):
            raise ConfigError("tls_cert_file and tls_key_file go together")
        if self.tls_client_ca_file and not self.tls_cert_file:
            raise ConfigError("tls_client_ca_file (mutual TLS) needs tls_cert_file and tls_key_file")
        if self.authorization_enabled and not self.authentication_enabled:
            raise ConfigError("authorization_enabled needs authentication_enabled (who is asking?)")
        if self.commit_log_segment_size < smallest_segment(self.max_body_size):
            raise ConfigError(
                f"max_body_size {self.max_body_size} needs commit_log_segment_size of at least "
                f"{smallest_segment(self.max_body_size)} (a record adds headers and properties), not "
                f"{self.commit_log_segment_size}: lower max_body_size or raise commit_log_segment_size"
            )
        if self.default_queue_nums > self.max_queue_nums:
            raise ConfigError("default_queue_nums must not exceed max_queue_nums")
        if not 0 < self.min_invisible_time_s <= self.default_invisible_time_s <= self.max_invisible_time_s:
            raise ConfigError(
                "need 0 < min_invisible_time_s <= default_invisible_time_s <= max_invisible_time_s"
            )

    @classmethod
    def load(cls, path: Path | None = None, **overrides: Any) -> BrokerConfig:
        """Defaults, then the TOML file at ``path`` (if any), then ``overrides`` that are not None.

        The file's values are checked even where an override replaces them: a broken file is
        reported the day it is written, not the day its option is dropped from the command line.
        """
        values: dict[str, Any] = {}
        known = {f.name for f in dataclasses.fields(cls)}
        if path is not None:
            try:
                with open(path, "rb") as f:
                    values.update(tomllib.load(f))
            except FileNotFoundError as exc:
                raise ConfigError(f"config file {path} does not exist") from exc
            except OSError as exc:
                raise ConfigError(f"cannot read config file {path}: {exc.strerror}") from exc
            except tomllib.TOMLDecodeError as exc:
                raise ConfigError(f"config file {path} is not valid TOML: {exc}") from exc
            for name in sorted(set(values) & known):
                try:
                    check_value(name, values[name])
                except ConfigError as exc:
                    raise ConfigError(f"config file {path}: {exc}") from None
        values.update({k: v for k, v in overrides.items() if v is not None})
        unknown = sorted(set(values) - known)
        if unknown:
            raise ConfigError(f"unknown configuration key(s): {', '.join(unknown)}")
        try:
            return cls(**values)
        except TypeError as exc:
            raise ConfigError(f"bad configuration: {exc}") from exc


#: Front-end processes at most: each holds its own gRPC server and connections to the core.
MAX_WORKERS = 64
#: Queues of one topic at most: each holds files and memory, and a connection may hold a pull of
#: each (gRPC's bounds, sized from it, are C ints).
MAX_QUEUE_NUMS: Final = 65_536
#: Read or send threads at most: more only add GIL hand-offs (and a thread's stack each).
MAX_THREADS: Final = 1024

#: Numbers for which 0 means something (no reserve; send threads chosen by the flush mode).
_ZERO_ALLOWED: Final = frozenset({"disk_reserve_bytes", "max_connections", "send_threads"})
#: Shares of the disk: in (0, 1].
_RATIOS: Final = frozenset({"disk_high_water_ratio", "disk_max_used_space_ratio"})


def _values(config: BrokerConfig) -> dict[str, Any]:
    return {f.name: getattr(config, f.name) for f in dataclasses.fields(config)}


@functools.cache
def _hints() -> dict[str, Any]:
    return typing.get_type_hints(BrokerConfig)


def check_value(name: str, value: Any) -> None:
    """Check one setting against its field's type and range; :class:`ConfigError` names the key,
    what it must be, and the value it got. Every number is positive unless 0 means something
    (:data:`_ZERO_ALLOWED`) or it is a share of the disk (:data:`_RATIOS`)."""
    hint = _hints()[name]
    _check_type(name, value, hint)
    if hint in (int, float):
        if name in _RATIOS:
            if not 0 < value <= 1:
                raise ConfigError(f"{name} must be in (0, 1], not {value!r}")
        elif name in _ZERO_ALLOWED:
            if value < 0:
                raise ConfigError(f"{name} must not be negative, not {value!r}")
        elif value <= 0:
            raise ConfigError(f"{name} must be positive, not {value!r}")
    elif (
        typing.get_origin(hint) is tuple
        and typing.get_args(hint)[0] is float
        and (not value or min(value) <= 0)
    ):
        raise ConfigError(f"{name} must be a non-empty list of positive numbers, not {value!r}")


def _check_type(name: str, value: Any, hint: Any) -> None:
    if hint is bool:
        ok, want = isinstance(value, bool), "true or false"
    elif hint is int:
        ok, want = isinstance(value, int) and not isinstance(value, bool), "an integer"
    elif hint is float:
        ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
        want = "a finite number"
    elif hint is str:
        ok, want = isinstance(value, str), "a string"
    elif hint is Path:
        ok, want = isinstance(value, str | os.PathLike) and str(value) != "", "a non-empty path"
    elif typing.get_origin(hint) is Literal:
        choices = typing.get_args(hint)
        ok, want = value in choices and isinstance(value, str), "one of " + ", ".join(map(repr, choices))
    elif typing.get_origin(hint) is tuple:
        item = typing.get_args(hint)[0]
        want = {float: "a list of numbers", str: "a list of strings"}[item]
        ok = isinstance(value, list | tuple)
        if ok:
            for i, element in enumerate(value):
                try:
                    _check_type(name, element, item)
                except ConfigError:
                    raise ConfigError(f"{name} must be {want}; item {i} is {element!r}") from None
    else:  # pragma: no cover - a field of a type this function does not know yet
        raise TypeError(f"BrokerConfig.{name}: no check for {hint!r}")
    if not ok:
        raise ConfigError(f"{name} must be {want}, not {value!r}")


def parse_listen(listen: str) -> tuple[str, int]:
    """Split ``host:port`` (port 0 picks a free port)."""
    host, sep, port_text = listen.rpartition(":")
    if not sep or not host or not port_text.isdigit() or not 0 <= int(port_text) <= 65535:
        raise ConfigError(f"listen must be host:port with a port in 0..65535, not {listen!r}")
    return host, int(port_text)
