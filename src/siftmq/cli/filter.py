"""``siftmq filter check|eval``: validate and evaluate TAG and SQL92 expressions locally."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Annotated

import typer

from siftmq.cli.console import fail, key_values, out
from siftmq.errors import FilterError, FilterEvaluationError

if TYPE_CHECKING:
    from siftmq.filter import CompiledFilter

filter_app = typer.Typer(no_args_is_help=True, help="Check and evaluate TAG and SQL92 filter expressions.")

KindOption = Annotated[
    str, typer.Option("--type", "-t", help="Filter type: SQL92 or TAG.", case_sensitive=False)
]


def _compile(kind: str, expression: str) -> CompiledFilter:
    from siftmq.filter import compile_filter

    try:
        return compile_filter(kind, expression)
    except FilterError as exc:
        fail(exc)


@filter_app.command("check")
def filter_check(
    expression: Annotated[str, typer.Argument(help="The filter expression.")],
    kind: KindOption = "SQL92",
    as_json: Annotated[bool, typer.Option("--json", help="Print a JSON object.")] = False,
) -> None:
    """Validate EXPRESSION and print its normalized form (exit 1 with the error and a caret)."""
    compiled = _compile(kind, expression)
    if as_json:
        info = {
            "type": compiled.kind,
            "normalized": compiled.normalized,
            "properties": sorted(compiled.properties),
        }
        out.print(json.dumps(info, ensure_ascii=False), markup=False)
    else:
        out.print(compiled.normalized, markup=False)


@filter_app.command("eval")
def filter_eval(
    expression: Annotated[str, typer.Argument(help="The filter expression.")],
    props: Annotated[
        list[str] | None, typer.Argument(help="Message properties as key=value (values are strings).")
    ] = None,
    kind: KindOption = "SQL92",
) -> None:
    """Evaluate EXPRESSION against properties: prints TRUE, FALSE, NULL or the evaluation error.

    The exit code is 0 when the message would be delivered (TRUE), 2 when not, 1 on a bad expression.
    """
    try:
        values = key_values(props)
    except ValueError as exc:
        fail(exc)
    compiled = _compile(kind, expression)
    try:
        result = compiled.evaluate(values)
    except FilterEvaluationError as exc:
        out.print(f"EVALUATION ERROR: {exc}", markup=False)
        raise typer.Exit(2) from None
    out.print({True: "TRUE", False: "FALSE", None: "NULL"}[result], markup=False)
    raise typer.Exit(0 if result is True else 2)
