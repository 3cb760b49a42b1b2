"""What a filter program may be, checked without running it.

A program is Python source defining ``match(message) -> bool`` at module level. It may import only
:data:`ALLOWED_MODULES` (the worker imports them before the program loads; the seccomp filter would
stop the file reads any other import needs anyway). These checks give a clear answer at
registration; the sandbox, not these checks, is what keeps a hostile program in.
"""

from __future__ import annotations

import ast
import hashlib
from dataclasses import dataclass
from typing import Final

from siftmq.errors import BadRequestError, StatusCode

ALLOWED_MODULES: Final = frozenset({
    "json", "re", "math", "datetime", "decimal", "statistics", "string", "itertools", "functools",
    "collections", "hashlib", "base64", "struct", "unicodedata", "zlib",
})  # fmt: skip
MAX_SOURCE_BYTES: Final = 64 * 1024
MAX_AST_NODES: Final = 20_000


class ProgramError(BadRequestError):
    """A program that cannot be registered: the message says what is wrong (and where)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, status=StatusCode.BAD_REQUEST)


@dataclass(frozen=True, slots=True)
class ProgramSource:
    source: str
    sha256: str


def check_program(source: str) -> ProgramSource:
    """The program if it parses, defines ``match(message)`` and imports only allowed modules."""
    encoded = source.encode("utf-8", "surrogatepass")
    if len(encoded) > MAX_SOURCE_BYTES:
        raise ProgramError(f"the program is {len(encoded):,} bytes; at most {MAX_SOURCE_BYTES:,}")
    if "\x00" in source:
        raise ProgramError("the program contains a NUL character")
    try:
        tree = ast.parse(source, filename="<program>")
    except SyntaxError as exc:
        raise ProgramError(f"syntax error at line {exc.lineno}, column {exc.offset}: {exc.msg}") from exc
    except (RecursionError, MemoryError) as exc:
        raise ProgramError("the program is nested too deeply to parse") from exc
    if sum(1 for _ in ast.walk(tree)) > MAX_AST_NODES:
        raise ProgramError(f"the program has more than {MAX_AST_NODES:,} syntax nodes")
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                raise ProgramError(f"line {node.lineno}: relative imports are not allowed")
            names = [node.module or ""]
        else:
            continue
        for name in names:
            if name.split(".")[0] not in ALLOWED_MODULES:
                raise ProgramError(
                    f"line {node.lineno}: module {name!r} is not allowed; a program may import "
                    + ", ".join(sorted(ALLOWED_MODULES))
                )
    match = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "match"]
    if not match:
        raise ProgramError("the program defines no function match(message) at module level")
    args = match[-1].args
    if len(args.posonlyargs) + len(args.args) != 1 or args.vararg or args.kwonlyargs or args.kwarg:
        raise ProgramError(f"line {match[-1].lineno}: match must take exactly one argument, the message")
    return ProgramSource(source, hashlib.sha256(encoded).hexdigest())
