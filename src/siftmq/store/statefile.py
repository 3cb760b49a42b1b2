"""Crash- and tamper-evident JSON files for the broker's own state (topics, groups, filter
registrations, consumer progress and offsets).

A write goes to a temporary file that is fsynced; the current file becomes the previous generation
(``NAME.prev``) and the temporary file is renamed over it, then the directory is fsynced. A reader
(or a restart after kill -9) finds a whole file, never a torn one.

Each file carries a SHA-256 of its content, so damage or an edit that still parses as JSON is found:
the reader falls back to the previous generation with an ERROR line naming the file. For consumer
progress an older generation means some messages are delivered again, never that any is skipped.
When no generation is good, a ``strict`` file (progress) stops the broker with the remedy; any other
file is moved aside and the broker starts from its defaults for it. Files written before checksums
were added are read as they are and get one at their next write.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path
from typing import Any, Final, Literal

from siftmq.durable import fsync_dir
from siftmq.errors import ConfigError

_log = logging.getLogger(__name__)

FORMAT: Final = "siftmq-state-1"
PREVIOUS_SUFFIX: Final = ".prev"
_ENVELOPE_KEYS: Final = frozenset({"data", "format", "sha256"})


class _Damaged(ValueError):
    """A state file that cannot be believed (not JSON, or its checksum does not match)."""


def _canonical(data: Any) -> bytes:
    return json.dumps(data, separators=(",", ":"), sort_keys=True, ensure_ascii=False).encode()


#: Members of a top-level object encoded by one ``json.dumps`` call (see :func:`_canonical_in_chunks`),
#: and how many items their lists and objects may hold in all.
_CHUNK_MEMBERS: Final = 256
_CHUNK_ITEMS: Final = 1024


def _canonical_in_chunks(data: Any) -> bytes:
    """:func:`_canonical`, a top-level object encoded a few members at a time: one ``json.dumps``
    holds the GIL for the whole call (~90 ms for consumer progress with 100,000 messages in
    flight), and between calls the event loop gets it back. Small members go together (a call per
    member cost 40 ms for the groups file of 6,000 groups, 13 ms in one call)."""
    if not isinstance(data, dict) or len(data) < 2 or not all(isinstance(k, str) for k in data):
        return _canonical(data)
    parts: list[bytes] = []
    chunk: dict[str, Any] = {}
    items = 0
    for key, value in sorted(data.items()):  # in sort_keys order: the keys are unique strings
        chunk[key] = value
        if isinstance(value, dict):
            items += sum(len(v) for v in value.values() if isinstance(v, (list, dict)))
        if len(chunk) >= _CHUNK_MEMBERS or items >= _CHUNK_ITEMS:
            parts.append(_canonical(chunk)[1:-1])
            chunk, items = {}, 0
    if chunk:
        parts.append(_canonical(chunk)[1:-1])
    return b"{" + b",".join(parts) + b"}"


def write_json(path: Path, data: Any) -> None:
    """Atomically replace ``path`` with ``data``, keeping the file it replaces as ``NAME.prev``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    body = _canonical_in_chunks(data)
    # _canonical({"data": data, "format": FORMAT, "sha256": ...}) without encoding ``data`` again
    envelope = b'{"data":%s,"format":%s,"sha256":"%s"}' % (
        body,
        json.dumps(FORMAT).encode(),
        hashlib.sha256(body).hexdigest().encode(),
    )
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(envelope)
        f.flush()
        os.fsync(f.fileno())
    if path.exists():
        os.replace(path, previous_of(path))  # a crash right here leaves .prev and .tmp: read_json takes .prev
    os.replace(tmp, path)
    fsync_dir(path.parent)


def previous_of(path: Path) -> Path:
    return path.with_name(path.name + PREVIOUS_SUFFIX)


#: Where :func:`read_state`'s data came from: the file; its previous generation (the file was
#: damaged or missing); ``default`` as neither exists (nothing was ever written); or ``default``
#: as no generation could be read (``lost``).
Source = Literal["file", "previous", "none", "lost"]


def read_json(path: Path, default: Any, *, strict: bool = False) -> Any:
    """The data last written to ``path``; ``default`` when neither it nor a previous generation exists.

    A damaged or edited file falls back to the previous generation (logged at ERROR). With no good
    generation: ``strict`` raises :class:`ConfigError` naming the file and the remedy; otherwise the
    file is moved aside (``NAME.corrupt``), logged, and ``default`` returned.
    """
    return read_state(path, default, strict=strict)[0]


def read_state(path: Path, default: Any, *, strict: bool = False) -> tuple[Any, Source]:
    """:func:`read_json`, and where the data came from: a reader whose file can be checked against
    other state (the topic table against the store's queues) knows when the data is not the last
    written, and so may lack what was last written."""
    previous = previous_of(path)
    try:
        return _load(path), "file"
    except FileNotFoundError:
        if not previous.exists():
            return default, "none"
        problem = "is missing (a crash while it was being replaced)"
    except _Damaged as exc:
        problem = str(exc)
    try:
        data = _load(previous)
    except (FileNotFoundError, _Damaged) as exc:
        fallback = (
            "no previous generation" if isinstance(exc, FileNotFoundError) else f"{previous.name} {exc}"
        )
        return _no_good_generation(path, problem, fallback, default, strict=strict), "lost"
    if path.exists():  # kept for a look, and out of the way: the next write must not rotate it into .prev
        os.replace(path, path.with_name(path.name + ".corrupt"))
    _log.error(
        "%s %s (kept as %s.corrupt); using the previous generation %s (consumer progress from it may "
        "deliver some messages again)",
        path,
        problem,
        path.name,
        previous.name,
    )
    return data, "previous"


class DamagedStateError(ConfigError):
    """A state file that cannot be believed (not JSON, or not matching its checksum); the message
    names the file and says which."""


def read_generation(path: Path) -> Any:
    """The data of ``path`` itself, never its previous generation: for a file whose older
    generation is no stand-in for it. Raises FileNotFoundError when it is missing and
    :class:`DamagedStateError` when it cannot be believed; nothing is moved or logged."""
    try:
        return _load(path)
    except _Damaged as exc:
        raise DamagedStateError(f"{path} {exc}") from exc


def peek_json(path: Path, default: Any) -> Any:
    """What :func:`read_json` would give, for a reader that does not own the file (an offline job
    beside a running broker): nothing is moved or logged; no good generation raises ConfigError."""
    for candidate in (path, previous_of(path)):
        try:
            return _load(candidate)
        except FileNotFoundError:
            continue
        except _Damaged as exc:
            if candidate == path:
                continue
            raise ConfigError(f"{path} and its previous generation cannot be read: {exc}") from exc
    if path.exists():
        raise ConfigError(
            f"{path} cannot be read (damaged, or edited by hand) and has no previous generation"
        )
    return default


def _load(path: Path) -> Any:
    raw = path.read_bytes()
    try:
        content = json.loads(raw)
    except ValueError as exc:
        raise _Damaged(f"is not valid JSON ({exc})") from exc
    # an envelope is told by its keys, not by its format alone: one flipped bit in the format
    # string must not make a checksummed file pass for one written before checksums (believed unchecked)
    if not (isinstance(content, dict) and len(_ENVELOPE_KEYS & content.keys()) >= 2):
        return content  # written before checksums: believed as it is, given one at the next write
    if content.keys() != _ENVELOPE_KEYS or content["format"] != FORMAT:
        raise _Damaged(f"is not a whole {FORMAT} envelope (damaged, or edited by hand)")
    data = content.get("data")
    if hashlib.sha256(_canonical(data)).hexdigest() != content.get("sha256"):
        raise _Damaged("does not match its checksum (damaged, or edited by hand)")
    return data


def _no_good_generation(path: Path, problem: str, fallback: str, default: Any, *, strict: bool) -> Any:
    if strict:
        raise ConfigError(
            f"{path} {problem}, and {fallback}: restore it from a backup, or remove it (and "
            f"{previous_of(path).name}) to let every group start again from the queue rules (messages may be "
            "skipped or delivered twice)"
        )
    where = ""
    if path.exists():
        aside = path.with_name(path.name + ".corrupt")
        os.replace(path, aside)
        where = f"; moved to {aside.name}"
    _log.error("%s %s, and %s%s; starting from defaults", path, problem, fallback, where)
    return default
