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
        str | None, typer.Option("--endpoint", help="host:port of a running broker (default: embedded).")
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


@demo_app.command("filter-server")
def filter_server(
    count: Annotated[int, typer.Option("--count", min=10, max=100_000, help="Orders to send.")] = 2000,
) -> None:
    """The filter server: a program on JSON bodies no SQL92 filter can express, then a hostile one
    suspended while the good group keeps receiving."""
    from siftmq.demos.filter_server import PROGRAM, TOPIC, run

    out.print(f"{count:,} orders with JSON bodies to {TOPIC}; group big-a registers:", markup=False)
    out.print(PROGRAM, markup=False)
    with out.status("sending, filtering on the broker in the sandbox, receiving..."):
        o = run(count)
    table = Table(title="group big-a, through its program")
    for col in ("orders", "expected", "received", "wrong", "missing", "body bytes received", "client-side"):
        table.add_column(col)
    table.add_row(
        f"{o.sent:,}", f"{len(o.expected):,}", f"{len(o.received):,}", str(len(o.received - o.expected)),
        str(len(o.expected - o.received)), f"{o.received_bytes:,}", f"{o.sent_bytes:,}",
    )  # fmt: skip
    out.print(table)
    saved = 1 - o.received_bytes / max(o.sent_bytes, 1)
    out.print(f"filtering on the broker saved {saved:.0%} of the body bytes client-side filtering would move",
              markup=False)  # fmt: skip
    status, why = o.hostile.get("status"), o.hostile.get("last_error")
    out.print(f"group hostile (spins on every real order): {status} — {why}", markup=False)
    out.print(
        f"meanwhile big-a received {len(o.later_received)} of the {len(o.later_expected)} matching orders "
        "sent after the hostile program was registered",
        markup=False,
    )
    good = o.received == o.expected and o.later_received == o.later_expected
    if not good or o.hostile.get("status") != "suspended":
        raise typer.Exit(1)
