"""``siftmq produce`` and ``siftmq consume``: quick manual use of a broker with siftmq's client."""

from __future__ import annotations

import asyncio
import json
from typing import Annotated

import typer

from siftmq.cli.console import err, error, key_values, out

DEFAULT_ENDPOINT = "127.0.0.1:8081"  # where `siftmq broker` listens by default
EndpointOption = Annotated[
    str, typer.Option("--endpoint", envvar="SIFTMQ_ENDPOINT", help="The broker's host:port.")
]


def _props(pairs: list[str] | None) -> dict[str, str]:
    try:
        return key_values(pairs)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None


def produce(  # noqa: PLR0917 - typer maps options to parameters
    topic: str,
    body: Annotated[
        str, typer.Option("--body", help="Message body (text); {i} is replaced by the index.")
    ] = "{i}",
    count: Annotated[int, typer.Option("--count", min=1, max=10_000_000)] = 1,
    tag: Annotated[str | None, typer.Option("--tag")] = None,
    prop: Annotated[
        list[str] | None, typer.Option("--prop", help="A user property key=value (repeatable).")
    ] = None,
    batch: Annotated[int, typer.Option("--batch", min=1, max=1024, help="Messages per request.")] = 64,
    endpoint: EndpointOption = DEFAULT_ENDPOINT,
) -> None:
    """Send COUNT messages to TOPIC and print their ids."""
    from siftmq.client import Producer
    from siftmq.errors import RemoteError

    properties = _props(prop)

    async def go() -> None:
        async with Producer(endpoint) as producer:
            for first in range(0, count, batch):
                msgs = [
                    producer.message(
                        topic, body.replace("{i}", str(i)).encode(), tag=tag, properties=properties
                    )
                    for i in range(first, min(first + batch, count))
                ]
                for receipt in await producer.send_many(msgs):
                    out.print(receipt.message_id, markup=False)

    try:
        asyncio.run(go())
    except RemoteError as exc:
        error(exc)
        raise typer.Exit(1) from None


def consume(  # noqa: PLR0917 - typer maps options to parameters
    topic: str,
    group: Annotated[str, typer.Option("--group", help="Consumer group.")] = "siftmq-cli",
    tag: Annotated[str | None, typer.Option("--tag", help="TAG filter, e.g. 'Pay||Order' [*].")] = None,
    sql: Annotated[str | None, typer.Option("--sql", help="SQL92 filter over the properties.")] = None,
    count: Annotated[int, typer.Option("--count", min=1, help="Stop after this many messages.")] = 10,
    wait: Annotated[
        float, typer.Option("--wait", help="Stop after this many seconds with nothing new.")
    ] = 3.0,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per message.")] = False,
    endpoint: EndpointOption = DEFAULT_ENDPOINT,
) -> None:
    """Receive and acknowledge up to COUNT messages of TOPIC that match the filter."""
    from siftmq.client import FilterExpression, SimpleConsumer
    from siftmq.errors import FilterError, RemoteError

    if tag and sql:
        raise typer.BadParameter("give --tag or --sql, not both")
    try:
        expression = FilterExpression.sql92(sql) if sql else FilterExpression.tag(tag or "*")
    except FilterError as exc:
        error(exc)
        raise typer.Exit(1) from None

    async def go() -> int:
        got = 0
        async with SimpleConsumer(endpoint, group, {topic: expression}, await_duration=wait) as consumer:
            while got < count:
                batch = await consumer.receive(min(32, count - got), 30)
                if not batch:
                    break
                for m in batch:
                    await consumer.ack(m)
                    got += 1
                    if as_json:
                        record = {
                            "message_id": m.message_id,
                            "tag": m.tag,
                            "keys": list(m.keys),
                            "properties": dict(m.properties),
                            "body": m.body.decode("utf-8", "replace"),
                            "queue_id": m.queue_id,
                            "queue_offset": m.queue_offset,
                        }
                        out.print(json.dumps(record, ensure_ascii=False), markup=False)
                    else:
                        out.print(
                            f"{m.message_id} {m.tag or '-'} {dict(m.properties)} "
                            f"{m.body.decode('utf-8', 'replace')[:200]}",
                            markup=False,
                        )
        return got

    try:
        got = asyncio.run(go())
    except RemoteError as exc:
        error(exc)
        raise typer.Exit(1) from None
    err.print(f"{got} message(s)", markup=False)
