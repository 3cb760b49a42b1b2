"""``siftmq demo ...``: the seeds' scenarios, run against a fresh embedded broker."""

from __future__ import annotations

import asyncio

import typer
from rich.console import Console
from rich.table import Table

demo_app = typer.Typer(no_args_is_help=True, help="Run the seeds' scenarios against an embedded broker.")
_out = Console(highlight=False, soft_wrap=True)


@demo_app.command("consistency")
def consistency() -> None:
    """Seed 004: one group, consumers subscribing tagA and tagB — strict refuses, compat loses messages."""
    from siftmq.demos.consistency import GROUP, SUBSCRIPTIONS, TOPIC, run

    _out.print(
        f"topic {TOPIC} (4 queues), group {GROUP}: ConsumerForTagA subscribes 'tagA', then "
        "ConsumerForTagB subscribes 'tagB'; 8 messages, MsgStr0-3 tagged tagA, MsgStr4-7 tagB",
        markup=False,
    )
    with _out.status("running the experiment in strict and in compat mode..."):
        outcomes = asyncio.run(run())
    for outcome in outcomes:
        table = Table(title=f"{outcome.policy} mode")
        for col in ("consumer", "queues", "consumed", "refused"):
            table.add_column(col, overflow="fold")
        for name in SUBSCRIPTIONS:
            table.add_row(
                name,
                str(outcome.queues.get(name, "-")),
                ", ".join(outcome.consumed.get(name, [])) or "-",
                outcome.refused.get(name, ""),
            )
        _out.print(table)
        if outcome.policy == "strict":
            why = "nothing lost: the inconsistent consumer was refused and the group kept its subscription"
        else:
            why = (
                "the group's newest subscription (tagB) filtered every queue; ConsumerForTagA dropped the "
                "tagB messages of its queues and nobody was left to take the tagA ones"
            )
        lost = ", ".join(outcome.lost) or "none"
        unwanted = [m for m in outcome.sent if m not in outcome.wanted]
        _out.print(f"lost: {lost} — {why}", markup=False)
        if unwanted:
            _out.print(
                f"subscribed by no accepted consumer (kept out of this group): {', '.join(unwanted)}",
                markup=False,
            )
        _out.print("")
