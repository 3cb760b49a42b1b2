"""Batch reads through a real broker: rows, partitions, offsets, filters (results, explain, metrics).

The rows with ``pushdown=true`` equal what Spark itself keeps (the same query with
``pushdown=false``), ``explain("formatted")`` shows that Spark still applies every predicate that
would narrow the read, and the broker's per-group filter statistics show that the broker evaluated
the ``filter``/``tags`` options and sent only the matching messages.
"""

from __future__ import annotations

import contextlib
import io
import math
from typing import Any

import httpx
import pytest
from pyspark.sql import functions as F

from siftmq.client import FilterExpression, blocking
from siftmq.spark.pushdown import BrokerFilter
from siftmq.spark.source import default_group

TOPIC = "Orders"
REGIONS = ["eu", "us", None, "it's", "", "EU", " eu", "eu-west"]
TAGS = ["A", "B", None, "C"]


def produce(endpoint: str, topic: str = TOPIC, n: int = 240, per_request: int = 8) -> list[dict[str, Any]]:
    """``n`` messages in requests of ``per_request`` (each request lands on the next queue)."""
    sent: list[dict[str, Any]] = []
    with blocking.Producer(endpoint) as producer:
        for first in range(0, n, per_request):
            batch, meta = [], []
            for i in range(first, min(first + per_request, n)):
                props = {"price": str(i % 50), "n": str(i)}
                region = REGIONS[i % len(REGIONS)]
                if region is not None:
                    props["region"] = region
                tag = TAGS[i % len(TAGS)]
                keys = [f"k{i}", f"order-{i % 7}"]
                batch.append(
                    producer.message(topic, f"body-{i}".encode(), tag=tag, keys=keys, properties=props)
                )
                meta.append({"i": i, "tag": tag, "keys": keys, "properties": props})
            for receipt, m in zip(producer.send_many(batch), meta, strict=True):
                sent.append({**m, "message_id": receipt.message_id})
    return sent


def reader(spark: Any, endpoint: str, **options: str) -> Any:
    r = spark.read.format("siftmq").option("endpoints", endpoint).option("topic", TOPIC)
    for k, v in options.items():
        r = r.option(k, v)
    return r.load()


def explain(df: Any) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        df.explain("formatted")
    return out.getvalue()


def numbers(df: Any) -> list[int]:
    return sorted(int(r[0]) for r in df.select(F.col("properties")["n"]).collect())


def group_stats(admin_url: str, group: str) -> dict[str, Any]:
    report = httpx.get(f"{admin_url}/groups/{group}", timeout=30).json()
    (sub,) = report["subscriptions"]
    return dict(sub)


def test_batch_read_rows_partitions_and_offsets(spark: Any, start_broker: Any) -> None:
    broker = start_broker()
    sent = produce(broker.endpoint)
    df = reader(
        spark, broker.endpoint, properties="region,price", maxMessagesPerPartition="7", rowsPerBatch="5"
    )
    assert df.columns[-2:] == ["region", "price"]
    rows = df.collect()
    assert len(rows) == len(sent)
    by_id = {r.message_id: r for r in rows}
    for m in sent:
        r = by_id[m["message_id"]]
        assert r.topic == TOPIC and r.tag == m["tag"] and list(r.keys) == m["keys"]
        assert r.body == f"body-{m['i']}".encode()
        assert dict(r.properties) == m["properties"]  # user properties only: no TAGS/KEYS/UNIQ_KEY
        assert r.region == m["properties"].get("region") and r.price == m["properties"]["price"]
        assert r.store_timestamp >= r.born_timestamp.replace(microsecond=0)
    per_queue: dict[int, list[int]] = {}
    for r in rows:
        per_queue.setdefault(r.queue_id, []).append(r.queue_offset)
    assert len(per_queue) == 8
    assert all(sorted(offs) == list(range(len(offs))) for offs in per_queue.values())
    assert df.rdd.getNumPartitions() == sum(math.ceil(len(o) / 7) for o in per_queue.values())

    narrowed = reader(
        spark, broker.endpoint, startingOffsets='{"0": 10, "1": -1}', endingOffsets='{"0": 20, "2": 5}'
    )
    got = {(r.queue_id, r.queue_offset) for r in narrowed.select("queue_id", "queue_offset").collect()}
    want = {(q, o) for q, offs in per_queue.items() for o in offs}
    want = {(q, o) for q, o in want if q != 1 and (q != 0 or 10 <= o < 20) and (q != 2 or o < 5)}
    assert got == want


# Spark predicate over the Orders rows -> taken by the source (its filter vanishes from Spark's plan)?
# Only what holds for every row read is: a narrowing one would narrow every scan of the relation.
PREDICATES = [
    ("region = 'eu'", False),
    ("region <> 'eu'", False),
    ("region <=> 'eu'", False),
    ("NOT (region <=> 'eu')", False),
    ("region IN ('eu', 'us', NULL)", False),
    ("region NOT IN ('eu', 'us')", False),
    ("region IS NULL", False),
    ("region = ''", False),
    ("region = 'it''s'", False),
    ("startswith(region, 'e')", False),
    ("endswith(region, 'u')", False),
    ("contains(region, '')", False),
    ("NOT contains(region, 'eu')", False),
    ("region > 'eu'", False),
    ("tag = 'A' AND region = 'eu'", False),
    ("tag IN ('A', 'B') AND price = '10'", False),
    ("tag IS NULL", False),
    ("tag = 'A' OR region = 'us'", False),  # an OR is never offered to the source
    ("queue_id IN (1, 3) AND queue_offset >= 5 AND queue_offset < 25", False),
    ("topic = 'Orders'", True),
    ("topic = 'Orders' AND queue_id >= 0", True),
    ("topic = 'Other'", False),
]


def test_pushdown_gives_spark_results_and_takes_only_what_every_row_satisfies(
    spark: Any, start_broker: Any
) -> None:
    broker = start_broker()
    produce(broker.endpoint)
    base = reader(spark, broker.endpoint, properties="region,price", pushdown="false")
    truth = base.select(
        F.col("properties")["n"].cast("int").alias("n"),
        *[F.coalesce(F.expr(p), F.lit(False)).alias(f"p{i}") for i, (p, _) in enumerate(PREDICATES)],
    ).collect()
    for i, (predicate, fully_pushed) in enumerate(PREDICATES):
        want = sorted(r.n for r in truth if r[f"p{i}"])
        query = reader(spark, broker.endpoint, properties="region,price", pushdown="true").filter(predicate)
        assert numbers(query) == want, predicate
        plan = explain(query)
        if fully_pushed:
            assert "Condition" not in plan, (predicate, plan)  # no Filter node left in Spark
            assert "PushedFilters: [" in plan and "PushedFilters: []" not in plan, (predicate, plan)
        else:
            assert "Condition" in plan, (predicate, plan)


def test_broker_evaluates_the_filter_options(spark: Any, start_broker: Any) -> None:
    broker = start_broker()
    produce(broker.endpoint)
    df = reader(spark, broker.endpoint, properties="region", filter="region = 'eu'")
    rows = df.collect()
    assert len(rows) == 30 and {r.region for r in rows} == {"eu"}
    group = default_group(TOPIC, BrokerFilter("SQL92", "region = 'eu'"))
    stats = group_stats(broker.admin_url, group)
    assert (stats["type"], stats["expression"]) == ("SQL92", "region = 'eu'")
    # the broker evaluated every message and sent only the 30 that match
    assert stats["filter_stats"]["evaluated"] == 240 and stats["filter_stats"]["matched"] == 30
    metrics = httpx.get(f"{broker.admin_url}/metrics", timeout=30).text
    assert f'siftmq_filter_work_total{{group="{group}",stage="matched",topic="{TOPIC}"}} 30.0' in metrics
    # only the matching messages crossed the network
    assert f'siftmq_messages_delivered_total{{group="{group}",topic="{TOPIC}"}} 30.0' in metrics
    body_bytes = float(sum(len(r.body) for r in rows))
    assert f'siftmq_message_bytes_delivered_total{{group="{group}",topic="{TOPIC}"}} {body_bytes}' in metrics

    tagged = reader(spark, broker.endpoint, tags="A||C")
    assert tagged.count() == 120
    tag_group = default_group(TOPIC, BrokerFilter("TAG", "A||C"))
    stats = group_stats(broker.admin_url, tag_group)
    assert (stats["type"], stats["expression"]) == ("TAG", "A||C")
    # a TAG filter skips by the tag hash in the index, without reading the other messages
    assert stats["filter_stats"]["matched"] == 120 and stats["filter_stats"]["skipped_by_tags_code"] == 120


def test_works_with_pushdown_turned_off(spark: Any, start_broker: Any) -> None:
    broker = start_broker()
    produce(broker.endpoint)
    query = "region = 'eu' AND tag = 'A'"  # region 'eu' is i % 8 == 0: 30 messages, all tagged A
    spark.conf.set("spark.sql.python.filterPushdown.enabled", "false")
    try:
        df = reader(spark, broker.endpoint, properties="region", pushdown="true").filter(query)
        plan = explain(df)
        assert "PushedFilters" not in plan and "Condition" in plan
        assert df.count() == 30
    finally:
        spark.conf.set("spark.sql.python.filterPushdown.enabled", "true")
    df = reader(spark, broker.endpoint, properties="region").filter(query)  # option pushdown off
    assert "PushedFilters" not in explain(df) and df.count() == 30
    everything = default_group(TOPIC, BrokerFilter("TAG", "*"))
    assert group_stats(broker.admin_url, everything)["expression"] == "*"


def test_every_scan_of_one_loaded_dataframe_gets_its_own_rows(spark: Any, start_broker: Any) -> None:
    """Spark 4.3 gives every scan of a loaded relation the read plan of the pushdown planned last:
    the pushed source accepts nothing that would narrow that plan (see ``siftmq.spark.source``)."""
    broker = start_broker()
    produce(broker.endpoint, n=48)
    df = reader(spark, broker.endpoint, properties="region", pushdown="true")
    eu = df.filter("region = 'eu'").select("queue_id", F.col("region").alias("left"))
    us = df.filter("region = 'us'").select("queue_id", F.col("region").alias("right"))
    pairs = eu.join(us, "queue_id").select("left", "right").distinct().collect()
    assert sorted(tuple(r) for r in pairs) == [("eu", "us")]
    df = reader(spark, broker.endpoint, properties="region", pushdown="true")
    right = df.filter("region = 'eu'").select(F.col("message_id").alias("m2"))
    assert df.join(right, F.col("message_id") == F.col("m2"), "left").count() == 48
    df = reader(spark, broker.endpoint, properties="region", pushdown="true")
    assert df.filter("region = 'eu'").count() == 6
    assert df.count() == 48  # a later query with nothing to push


def test_filter_and_tags_options(spark: Any, start_broker: Any) -> None:
    broker = start_broker()
    produce(broker.endpoint)
    sql = reader(spark, broker.endpoint, filter="price >= 40 AND region IS NOT NULL")
    assert numbers(sql) == [i for i in range(240) if i % 50 >= 40 and REGIONS[i % 8] is not None]
    tags = reader(spark, broker.endpoint, tags="A || B")
    assert numbers(tags) == [i for i in range(240) if TAGS[i % 4] in ("A", "B")]
    both = reader(spark, broker.endpoint, tags="A||B", filter="price < 10", pushdown="true").filter(
        "tag = 'B'"
    )
    assert numbers(both) == [i for i in range(240) if TAGS[i % 4] == "B" and i % 50 < 10]
    group = default_group(TOPIC, BrokerFilter("SQL92", "(price < 10) AND TAGS IN ('A', 'B')"))
    matched = [i for i in range(240) if TAGS[i % 4] in ("A", "B") and i % 50 < 10]
    assert group_stats(broker.admin_url, group)["filter_stats"]["matched"] == len(matched)
    contradiction = reader(spark, broker.endpoint, tags="A", pushdown="true").filter("tag = 'B'")
    assert contradiction.count() == 0


def test_sql92_turned_off_on_the_broker(spark: Any, start_broker: Any) -> None:
    broker = start_broker(config={"enable_property_filter": False})
    produce(broker.endpoint)
    df = reader(spark, broker.endpoint, properties="region", pushdown="true").filter(
        "tag = 'A' AND region = 'eu'"
    )
    plan = explain(df)
    assert "Condition" in plan
    assert numbers(df) == [i for i in range(240) if TAGS[i % 4] == "A" and REGIONS[i % 8] == "eu"]
    with pytest.raises(Exception, match="enable_property_filter"):
        reader(spark, broker.endpoint, filter="price > 3").count()


def test_planning_errors_name_the_option(spark: Any, start_broker: Any) -> None:
    broker = start_broker()
    produce(broker.endpoint, n=16)
    with pytest.raises(
        Exception, match=r"'startingOffsets': names queue 8, but topic 'Orders' has queues 0\.\.7"
    ):
        reader(spark, broker.endpoint, startingOffsets='{"8": 0}').count()
    with pytest.raises(Exception, match="'endingOffsets': offset 99 of queue 0 is past the end"):
        reader(spark, broker.endpoint, endingOffsets='{"0": 99}').count()
    with pytest.raises(Exception, match="'startingOffsets': expected"):
        reader(spark, broker.endpoint, startingOffsets="{nope")
    with pytest.raises(Exception, match="'filter': invalid SQL92 filter"):
        reader(spark, broker.endpoint, filter="price >")
    with pytest.raises(Exception, match="'endpoints': cannot reach a broker"):
        spark.read.format("siftmq").option("endpoints", "127.0.0.1:1").option("topic", TOPIC).option(
            "requestTimeout", "2"
        ).load().count()
    with pytest.raises(Exception, match="user-specified schema is not supported"):
        spark.read.format("siftmq").schema("body binary").option("endpoints", broker.endpoint).option(
            "topic", TOPIC
        ).load().count()


def test_a_group_with_a_filter_program_is_honoured(spark: Any, start_broker: Any) -> None:
    """The filter server sits on the pull path, so a batch read with a group that has a program
    gets only what the program keeps (here on the body, which no filter can reach), with the TAG
    filter of option 'tags' as well."""
    broker = start_broker(config={"filter_server_nums": 1})
    produce(broker.endpoint)
    program = "def match(message):\n    return int(message.body.split(b'-')[1]) % 3 == 0\n"
    put = httpx.put(
        f"{broker.admin_url}/groups/spark-prog/programs/{TOPIC}", json={"source": program}, timeout=30
    )
    assert put.status_code == 200, put.text
    df = reader(spark, broker.endpoint, group="spark-prog", tags="A")
    assert numbers(df) == [i for i in range(240) if i % 3 == 0 and TAGS[i % len(TAGS)] == "A"]
    counters = httpx.get(f"{broker.admin_url}/groups/spark-prog/programs/{TOPIC}", timeout=30).json()[
        "counters"
    ]
    # only tag A reached the program (a read may evaluate what it reads past its batch again)
    assert 60 <= counters["evaluated"] < 240 and counters["matched"] >= 20


def consumer_bodies(endpoint: str, topic: str, expression: FilterExpression) -> set[bytes]:
    """What a pull consumer subscribed with ``expression`` gets of ``topic`` from offset 0."""
    got: set[bytes] = set()
    with blocking.PullConsumer(endpoint, "tag-truth", topic, expression) as consumer:
        for qid in consumer.assignment():
            consumer.seek(qid, 0)
        idle = 0
        while idle < 2:
            batch = consumer.poll(64, 0.0)
            got |= {m.body for m in batch}
            idle = 0 if batch else idle + 1
    return got


@pytest.mark.parametrize("tags", ["*||", " "])
def test_tags_option_reads_what_a_consumer_of_that_subscription_gets(
    spark: Any, start_broker: Any, tags: str
) -> None:
    """``*||`` is the tag ``*`` alone and ``" "`` no tag at all, for RocketMQ: neither is every message."""
    broker = start_broker()
    topic = "Starred"
    with blocking.Producer(broker.endpoint) as producer:
        batch = [
            producer.message(
                topic,
                f"b{i}".encode(),
                tag=["*", "A", None][i % 3],
                properties={"region": "eu" if i % 2 else "us"},
            )
            for i in range(24)
        ]
        producer.send_many(batch)
    want = consumer_bodies(broker.endpoint, topic, FilterExpression.tag(tags))
    assert want == {f"b{i}".encode() for i in range(24) if tags == "*||" and i % 3 == 0}
    for pushdown in ("false", "true"):
        df = reader(spark, broker.endpoint, topic=topic, tags=tags, properties="region", pushdown=pushdown)
        assert {r.body for r in df.collect()} == want, pushdown
        df = reader(spark, broker.endpoint, topic=topic, tags=tags, properties="region", pushdown=pushdown)
        eu = {r.body for r in df.filter("region = 'eu'").collect()}
        assert eu == {b for b in want if int(b[1:]) % 2}, pushdown
