"""A filter worker: ``python -I -m siftmq.filterserver.worker READ_FD WRITE_FD``.

Started by the broker with an empty environment in an empty directory. It reads the load frame
(the program and its limits), imports what a program may use, raises the sandbox's walls
(:mod:`~siftmq.filterserver.sandbox`), runs the program's module code, and answers ``K`` — or
``E`` with what went wrong. Then, batch by batch, it calls ``match`` on each message and answers
one code per message: match, reject, or error with the exception (a result that is not a bool is an
error too). It exits when the broker closes the pipe.
"""

from __future__ import annotations

import builtins
import importlib
import io
import marshal
import os
import sys
from collections.abc import Callable
from typing import Any

from siftmq.filterserver import sandbox, wire
from siftmq.filterserver.message import Message, Row, message_of
from siftmq.filterserver.program import ALLOWED_MODULES

_REMOVED_BUILTINS = ("open", "input", "breakpoint", "help", "exit", "quit", "copyright", "credits", "license")


def _read_frame(fd: int) -> tuple[bytes, bytes]:
    length, kind = wire.HEADER.unpack(_read(fd, wire.HEADER.size))
    return bytes([kind]), _read(fd, length - 1)


def _read(fd: int, n: int) -> bytes:
    parts = []
    while n:
        chunk = os.read(fd, min(n, 1 << 20))
        if not chunk:
            os._exit(0)  # the broker closed the pipe
        parts.append(chunk)
        n -= len(chunk)
    return b"".join(parts)


def _write(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _describe(exc: BaseException) -> str:
    try:
        text = str(exc)
    except BaseException:
        text = "<unprintable>"
    return f"{type(exc).__name__}: {text}"[: wire.MAX_ERROR_TEXT]


def _guarded_import(
    name: str, globals: Any = None, locals: Any = None, fromlist: Any = (), level: int = 0
) -> Any:
    """``import`` for a program: only the allowed modules, already loaded before the walls went up."""
    if level or name.split(".", maxsplit=1)[0] not in ALLOWED_MODULES:
        raise ImportError(f"module {name!r} is not allowed in a filter program")
    module = sys.modules.get(name)
    if module is None:
        raise ImportError(f"module {name!r} is not available in a filter program")
    return module if fromlist or "." not in name else sys.modules[name.split(".", maxsplit=1)[0]]


def load(source: str) -> Callable[[Message], Any]:
    """Run the program's module code; its ``match``."""
    safe = {k: v for k, v in vars(builtins).items() if k not in _REMOVED_BUILTINS}
    safe["__import__"] = _guarded_import
    namespace: dict[str, Any] = {"__name__": "filter_program", "__builtins__": safe}
    exec(compile(source, "<program>", "exec"), namespace)
    match = namespace.get("match")
    if not callable(match):
        raise TypeError("the program defines no callable match(message)")
    return match  # type: ignore[no-any-return]


def evaluate(match: Callable[[Message], Any], rows: list[Row]) -> bytes:
    codes = bytearray(len(rows))
    errors: dict[int, str] = {}
    for i, r in enumerate(rows):
        try:
            result = match(message_of(r))
        except BaseException as exc:
            codes[i] = wire.ERROR
            errors[i] = _describe(exc)
            continue
        if result is True:
            codes[i] = wire.MATCH
        elif result is not False:
            codes[i] = wire.ERROR
            errors[i] = f"TypeError: match returned {type(result).__name__}, not bool"
    return wire.encode_result(bytes(codes), errors)


def main() -> None:
    rfd, wfd = int(sys.argv[1]), int(sys.argv[2])
    kind, payload = _read_frame(rfd)
    if kind != wire.LOAD:
        os._exit(2)
    source, memory_bytes, recursion_limit = marshal.loads(payload)
    for name in sorted(ALLOWED_MODULES):
        importlib.import_module(name)
    importlib.import_module("encodings.idna")  # codecs looked up lazily would need a file read
    sys.stdout = sys.stderr = io.TextIOWrapper(io.BufferedWriter(io.FileIO(1, "w", closefd=False)))
    sandbox.enter(keep_fds=(rfd, wfd), memory_bytes=memory_bytes)
    sys.setrecursionlimit(recursion_limit)
    try:
        match = load(source)
    except BaseException as exc:
        _write(wfd, wire.frame(wire.LOAD_FAILED, _describe(exc).encode("utf-8", "replace")))
        return
    _write(wfd, wire.frame(wire.LOADED, b""))
    while True:
        kind, payload = _read_frame(rfd)
        if kind != wire.BATCH:
            os._exit(2)
        _write(wfd, wire.frame(wire.RESULT, evaluate(match, marshal.loads(payload))))


if __name__ == "__main__":
    main()
