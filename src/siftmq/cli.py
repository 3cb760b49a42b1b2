"""The ``siftmq`` command line."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from siftmq.admin_cli import admin_app
from siftmq.client_cli import consume, produce
from siftmq.demo_cli import demo_app
from siftmq.errors import FilterError, FilterEvaluationError
from siftmq.spark_cli import spark_app

app = typer.Typer(
    no_args_is_help=True, add_completion=False, help="siftmq: RocketMQ-style message filtering."
)
filter_app = typer.Typer(no_args_is_help=True, help="Check and evaluate TAG and SQL92 filter expressions.")
app.add_typer(filter_app, name="filter")
app.add_typer(admin_app, name="admin")
app.add_typer(demo_app, name="demo")
app.add_typer(spark_app, name="spark")
app.command("produce")(produce)
app.command("consume")(consume)

_out = Console(highlight=False, soft_wrap=True)
_err = Console(stderr=True, highlight=False, soft_wrap=True)

KindOption = Annotated[
    str, typer.Option("--type", "-t", help="Filter type: SQL92 or TAG.", case_sensitive=False)
]


def _compile(kind: str, expression: str):  # type: ignore[no-untyped-def]
    from siftmq.filter import compile_filter

    try:
        return compile_filter(kind, expression)
    except FilterError as exc:
        _err.print(f"[bold red]error:[/] {exc}", markup=True)
        raise typer.Exit(1) from None


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
        _out.print(json.dumps(info, ensure_ascii=False), markup=False)
    else:
        _out.print(compiled.normalized, markup=False)


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
    values: dict[str, str] = {}
    for item in props or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            _err.print(f"[bold red]error:[/] property {item!r} is not key=value", markup=True)
            raise typer.Exit(1)
        values[key] = value
    compiled = _compile(kind, expression)
    try:
        result = compiled.evaluate(values)
    except FilterEvaluationError as exc:
        _out.print(f"EVALUATION ERROR: {exc}", markup=False)
        raise typer.Exit(2) from None
    _out.print({True: "TRUE", False: "FALSE", None: "NULL"}[result], markup=False)
    raise typer.Exit(0 if result is True else 2)


@app.command("broker")
def broker(
    data_dir: Annotated[
        Path | None, typer.Option("--data-dir", help="Where the broker keeps its data [./data].")
    ] = None,
    listen: Annotated[
        str | None, typer.Option("--listen", help="host:port; port 0 picks a free port [127.0.0.1:8081].")
    ] = None,
    flush: Annotated[
        str | None, typer.Option("--flush", help="sync: a send returns once on disk; async: every 500 ms.")
    ] = None,
    config: Annotated[Path | None, typer.Option("--config", help="A TOML file of broker settings.")] = None,
    admin_listen: Annotated[
        str | None,
        typer.Option("--admin-listen", help="host:port of the admin HTTP API [127.0.0.1:8082]; '' = off."),
    ] = None,
) -> None:
    """Run the broker (RocketMQ 5 gRPC) on embedded storage; prints a line with 'ready' once it serves."""
    from siftmq.broker.config import BrokerConfig
    from siftmq.errors import ConfigError

    try:
        cfg = BrokerConfig.load(
            config, data_dir=data_dir, listen=listen, flush=flush, admin_listen=admin_listen
        )
    except ConfigError as exc:
        _err.print(f"[bold red]error:[/] {exc}", markup=True)
        raise typer.Exit(2) from None
    from siftmq.server.app import run

    raise typer.Exit(run(cfg))


def main() -> None:
    app()


if __name__ == "__main__":
    main()
