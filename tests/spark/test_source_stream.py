"""Streaming through a real broker: micro-batches, offsets, group commits, exactly-once writes.

The replay test is the real thing: a query's last micro-batch is made to run again (its commit
file is deleted from the checkpoint, as after a crash between the sink's write and Spark's
commit), and the sink must not store its messages twice.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx

from siftmq.client import blocking

TOPIC = "Events"


def produce(endpoint: str, first: int, n: int, topic: str = TOPIC) -> None:
    """Messages ``first..first+n-1``: tag A on odd numbers, B on even, 4 per request (spread over queues)."""
    with blocking.Producer(endpoint) as producer:
        for start in range(first, first + n, 4):
            producer.send_many(
                [
                    producer.message(
                        topic, f"e{i}".encode(), tag="A" if i % 2 else "B", properties={"n": str(i)}
                    )
                    for i in range(start, min(start + 4, first + n))
                ]
            )


def stream(spark: Any, endpoint: str, **options: str) -> Any:
    r = spark.readStream.format("siftmq").option("endpoints", endpoint).option("topic", TOPIC)
    for k, v in options.items():
        r = r.option(k, v)
    return r.load()


def run_available_now(df: Any, checkpoint: Path, **sink: Any) -> Any:
    fmt = sink.pop("format", "parquet")
    w = df.writeStream.format(fmt).option("checkpointLocation", str(checkpoint)).trigger(availableNow=True)
    for k, v in sink.items():
        w = w.option(k, v)
    query = w.start()
    query.awaitTermination(300)
    assert query.exception() is None
    return query


def numbers(spark: Any, path: Path) -> list[int]:
    return sorted(int(r.n) for r in spark.read.parquet(str(path)).select("n").collect())


def test_micro_batches_offsets_and_group_commits(spark: Any, start_broker: Any, tmp_path: Path) -> None:
    broker = start_broker()
    produce(broker.endpoint, 0, 120)
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    events = stream(
        spark, broker.endpoint, startingOffsets="earliest", maxMessagesPerTrigger="50", tags="A", group="etl"
    ).selectExpr("properties['n'] AS n", "queue_id", "queue_offset")
    query = run_available_now(events, checkpoint, path=str(out))
    sizes = [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]
    # 50 queue entries per trigger, half of them tagged A (the broker sends only those)
    assert sum(sizes) == 60 and len(sizes) == 3 and max(sizes) <= 50
    assert numbers(spark, out) == list(range(1, 120, 2))
    offsets = (checkpoint / "offsets" / "2").read_text().splitlines()[-1]
    assert offsets == json.dumps(json.loads(offsets), sort_keys=True)  # one key order, always
    assert sum(json.loads(offsets).values()) == 120

    # the broker keeps the group's offsets, committed when the next batch is planned: a run behind
    lag = httpx.get(f"{broker.admin_url}/groups/etl/lag/{TOPIC}", timeout=30).json()
    committed = sum(row["committed_offset"] or 0 for row in lag)
    assert 0 < committed < 120

    produce(broker.endpoint, 120, 40)
    query = run_available_now(events, checkpoint, path=str(out))
    assert numbers(spark, out) == list(range(1, 160, 2))  # continued from the checkpoint, no repeats
    lag = httpx.get(f"{broker.admin_url}/groups/etl/lag/{TOPIC}", timeout=30).json()
    assert sum(row["committed_offset"] for row in lag) >= 120  # the first run's last batch, now committed

    # a new query of the same group (fresh checkpoint) starts at the group's committed offsets
    fresh = stream(spark, broker.endpoint, startingOffsets="earliest", tags="A", group="etl")
    fresh_out = tmp_path / "fresh"
    run_available_now(
        fresh.selectExpr("properties['n'] AS n"), tmp_path / "fresh-checkpoint", path=str(fresh_out)
    )
    got = numbers(spark, fresh_out)
    assert got and got == [n for n in range(1, 160, 2) if n >= got[0]] and got[0] > 1


def test_a_replayed_batch_sends_no_duplicates(spark: Any, start_broker: Any, tmp_path: Path) -> None:
    broker = start_broker()
    produce(broker.endpoint, 0, 60)
    checkpoint = tmp_path / "checkpoint"
    copy = stream(spark, broker.endpoint, startingOffsets="earliest", maxMessagesPerTrigger="25").select(
        "body", "tag", "keys", "properties"
    )
    sink = {"format": "siftmq", "endpoints": broker.endpoint, "topic": "Copy"}
    run_available_now(copy, checkpoint, **sink)

    def copied() -> list[int]:
        df = spark.read.format("siftmq").option("endpoints", broker.endpoint).option("topic", "Copy").load()
        return sorted(int(r.n) for r in df.selectExpr("properties['n'] AS n").collect())

    assert copied() == list(range(60))
    commits = sorted(int(p.name) for p in (checkpoint / "commits").iterdir() if p.name.isdigit())
    last = commits[-1]
    (checkpoint / "commits" / str(last)).unlink()  # as if the driver died before committing the batch
    (checkpoint / "commits" / f".{last}.crc").unlink(missing_ok=True)
    query = run_available_now(copy, checkpoint, **sink)
    replayed = [p for p in query.recentProgress if p["numInputRows"]]
    assert replayed and replayed[0]["batchId"] == last  # the same batch ran again
    assert copied() == list(range(60))  # ... and the broker kept one copy of each message
    metrics = httpx.get(f"{broker.admin_url}/metrics", timeout=30).text
    assert f'siftmq_duplicate_sends_total{{topic="Copy"}} {float(replayed[0]["numInputRows"])}' in metrics


def test_a_new_checkpoint_with_the_same_producer_id_loses_nothing(
    spark: Any, start_broker: Any, tmp_path: Path
) -> None:
    """A new checkpoint starts again at batch 0 with other rows in its batches than the old one's:
    with one producerId for both, its messages took the ids of the old run's and the broker
    dropped them as retries (29 of 40 in the reviewer's run). Continuing a group's committed
    offsets, the new run may send the old one's last batch again, never lose a message."""
    broker = start_broker()
    produce(broker.endpoint, 0, 40)
    sink = {"format": "siftmq", "endpoints": broker.endpoint, "topic": "Dst", "producerId": "etl-sink"}

    def run(checkpoint: Path) -> None:
        source = stream(
            spark, broker.endpoint, startingOffsets="earliest", group="etl", maxMessagesPerTrigger="10"
        )
        run_available_now(source.select("body", "properties"), checkpoint, **sink)

    run(tmp_path / "first")
    produce(broker.endpoint, 40, 40)
    run(tmp_path / "second")
    dst = spark.read.format("siftmq").option("endpoints", broker.endpoint).option("topic", "Dst").load()
    assert {int(r.n) for r in dst.selectExpr("properties['n'] AS n").collect()} == set(range(80))
