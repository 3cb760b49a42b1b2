"""The ``siftmq`` command: one typer app, each command family in its own module."""

from __future__ import annotations

import typer

from siftmq.cli.admin import admin_app
from siftmq.cli.admin_users import acl_app, init_auth, token, user_app
from siftmq.cli.broker import broker
from siftmq.cli.client import consume, produce
from siftmq.cli.demo import demo_app
from siftmq.cli.filter import filter_app
from siftmq.cli.programs import program_app, test_program
from siftmq.cli.spark import spark_app
from siftmq.cli.store import store_app

app = typer.Typer(
    no_args_is_help=True, add_completion=False, help="siftmq: RocketMQ-style message filtering."
)
admin_app.add_typer(user_app, name="user")
admin_app.add_typer(acl_app, name="acl")
admin_app.add_typer(program_app, name="program")
admin_app.command("token")(token)
admin_app.command("init-auth")(init_auth)
filter_app.command("test-program")(test_program)
app.add_typer(filter_app, name="filter")
app.add_typer(admin_app, name="admin")
app.add_typer(demo_app, name="demo")
app.add_typer(spark_app, name="spark")
app.add_typer(store_app, name="store")
app.command("broker")(broker)
app.command("produce")(produce)
app.command("consume")(consume)


def main() -> None:
    app()
