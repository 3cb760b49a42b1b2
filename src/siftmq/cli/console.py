"""The consoles every ``siftmq`` command prints to, and its one way of reporting an error.

Results go to stdout (``out``), everything else — errors, notes, progress — to stderr (``err``), so
a command's output can be piped. User text is escaped: a ``[`` in a filter or a message is printed,
never taken as markup.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import NoReturn

import typer
from rich.console import Console
from rich.markup import escape

out = Console(highlight=False, soft_wrap=True)
err = Console(stderr=True, highlight=False, soft_wrap=True)


def error(message: object, *, label: str = "error") -> None:
    """Print ``label: message`` to stderr, the label in bold red."""
    err.print(f"[bold red]{escape(label)}:[/] {escape(str(message))}", markup=True)


def note(message: object) -> None:
    err.print(f"[yellow]note:[/] {escape(str(message))}", markup=True)


def fail(message: object, code: int = 1) -> NoReturn:
    """Report ``message`` as an error and exit with ``code``."""
    error(message)
    raise typer.Exit(code)


def key_values(pairs: Iterable[str] | None) -> dict[str, str]:
    """``key=value`` arguments (message properties) as a dict; a ValueError names the first that is
    not one."""
    values: dict[str, str] = {}
    for pair in pairs or ():
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ValueError(f"properties are key=value, not {pair!r}")
        values[key] = value
    return values
