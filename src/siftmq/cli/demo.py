"""``siftmq demo ...``: the seeds' scenarios, run against a fresh embedded broker."""

from __future__ import annotations

import asyncio
from typing import Annotated, Any

import typer
from rich.table import Table

from siftmq.cli.console import fail, out

demo_app = typer.Typer(no_args_is_help=True, help="Run the seeds' scenarios against an embedded broker.")


@demo_app.command("consistency")
def consistency() -> None:
    """Seed 004: one group, consumers subscribing tagA and tagB — strict refuses, compat loses messages."""
    from siftmq.demos.consistency import GROUP, SUBSCRIPTIONS, TOPIC, run

    out.print(
        f"topic {TOPIC} (4 queues), group {GROUP}: ConsumerForTagA subscribes 'tagA', then "
        "ConsumerForTagB subscribes 'tagB'; 8 messages, MsgStr0-3 tagged tagA, MsgStr4-7 tagB",
        markup=False,
    )
    with out.status("running the experiment in strict and in compat mode..."):
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
        out.print(table)
        if outcome.policy == "strict":
            why = "nothing lost: the inconsistent consumer was refused and the group kept its subscription"
        else:
            why = (
                "the group's newest subscription (tagB) filtered every queue; ConsumerForTagA dropped the "
                "tagB messages of its queues and nobody was left to take the tagA ones"
            )
        lost = ", ".join(outcome.lost) or "none"
        unwanted = [m for m in outcome.sent if m not in outcome.wanted]
        out.print(f"lost: {lost} — {why}", markup=False)
        if unwanted:
            out.print(
                f"subscribed by no accepted consumer (kept out of this group): {', '.join(unwanted)}",
                markup=False,
            )
        out.print("")


@demo_app.command("trade")
def trade(
    count: Annotated[int, typer.Option("--count", min=1, max=1_000_000, help="Messages to send.")] = 3000,
    endpoint: Annotated[
        str | None, typer.Option("--endpoint", help="host:port of a running broker [an embedded one].")
    ] = None,
) -> None:
    """Seed 002: Trade_Topic with order, payment and logistics messages and its downstream systems."""
    from rich.progress import Progress

    from siftmq.demos.embedded import embedded_broker
    from siftmq.demos.trade import SYSTEMS, TOPIC, run

    async def go(ep: str) -> list[Any]:
        with Progress(console=out, transient=True) as bar:
            sending = bar.add_task(f"sending {count:,} messages to {TOPIC}", total=count)
            draining = bar.add_task("draining the consumer groups", total=len(SYSTEMS))

            def step(stage: str, n: int) -> None:
                bar.advance(sending if stage == "send" else draining, n)

            return await run(ep, count, step)

    if endpoint:
        reports = asyncio.run(go(endpoint))
    else:
        with embedded_broker() as ep:
            reports = asyncio.run(go(ep))
    table = Table(title=f"{TOPIC}: {count:,} messages (Order / Pay / Logistics, Region, price)")
    for col in ("consumer", "filter", "expected", "received", "wrong", "bytes on the wire"):
        table.add_column(col)
    for r in reports:
        table.add_row(
            r.system.name,
            f"{r.system.expression.kind} {r.system.expression.expression}",
            f"{r.expected:,}",
            f"{r.received:,}",
            str(r.wrong),
            f"{r.body_bytes:,}",
        )
    out.print(table)
    all_bytes = max(r.body_bytes for r in reports)
    total = sum(r.body_bytes for r in reports)
    out.print(
        f"filtering on the broker sent {total:,} body bytes in all; without it every system would have "
        f"received every message ({all_bytes * len(reports):,} bytes)",
        markup=False,
    )
    if any(r.wrong or r.received != r.expected for r in reports):
        raise typer.Exit(1)


@demo_app.command("security")
def security() -> None:
    """Authentication and ACLs: the official client as an anonymous caller, with a wrong secret, as a
    user without a policy and as an allowed one — UNAUTHORIZED, FORBIDDEN, OK."""
    import importlib.util

    if importlib.util.find_spec("rocketmq") is None:
        fail("the security demo runs the official client: pip install 'siftmq[official]'")
    from siftmq.demos.security import TOPIC, run

    out.print(
        f"a broker with authentication and authorization on; users alice (Pub, Sub, Create on Topic:{TOPIC}, "
        "Sub on Group:alice-*) and mallory (Sub on Topic:Orders, no group)",
        markup=False,
    )
    with out.status("calling the broker with the official rocketmq-python-client..."):
        outcomes = run()
    table = Table(title="official client calls")
    for col in ("caller", "call", "answer", "detail"):
        table.add_column(col, overflow="fold")
    for o in outcomes:
        mark = "" if o.as_expected else f" (expected {o.expected})"
        table.add_row(o.who, o.call, o.got + mark, o.detail)
    out.print(table)
    if not all(o.as_expected for o in outcomes):
        raise typer.Exit(1)
