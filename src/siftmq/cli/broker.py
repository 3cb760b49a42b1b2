"""``siftmq broker``: run the broker on embedded storage."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from siftmq.cli.console import fail


def broker(  # noqa: PLR0917 - typer maps each parameter to an option
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
    workers: Annotated[
        int | None,
        typer.Option(
            "--workers",
            help="gRPC front-end processes before the core process (default: one per core; 1 = one process).",
        ),
    ] = None,
    allow_anonymous: Annotated[
        bool,
        typer.Option(
            "--allow-anonymous",
            help="Serve a non-loopback address without authentication (protected mode off).",
        ),
    ] = False,
) -> None:
    """Run the broker (RocketMQ 5 gRPC) on embedded storage; prints a line with 'ready' once it serves."""
    from siftmq.broker.config import BrokerConfig
    from siftmq.errors import ConfigError

    try:
        cfg = BrokerConfig.load(
            config,
            data_dir=data_dir,
            listen=listen,
            flush=flush,
            admin_listen=admin_listen,
            allow_anonymous=allow_anonymous or None,
            workers=workers if workers is not None else _default_workers(config),
        )
    except ConfigError as exc:
        fail(exc, code=2)
    from siftmq.server.app import run

    raise typer.Exit(run(cfg))


def _default_workers(config: Path | None) -> int | None:
    """One front-end per core, unless the config file says how many (None: the file's value)."""
    import os
    import tomllib

    if config is not None:
        try:
            with open(config, "rb") as f:
                if "workers" in tomllib.load(f):
                    return None
        except (OSError, tomllib.TOMLDecodeError):
            return None  # BrokerConfig.load reports the file's problem
    from siftmq.broker.config import MAX_WORKERS

    return max(1, min(MAX_WORKERS, len(os.sched_getaffinity(0))))
