"""``df.write.format("siftmq")`` through a real broker: round trips and refusals."""

from __future__ import annotations

from typing import Any

import pytest
from pyspark.sql import Row


def read(spark: Any, endpoint: str, topic: str, **options: str) -> Any:
    r = spark.read.format("siftmq").option("endpoints", endpoint).option("topic", topic)
    for k, v in options.items():
        r = r.option(k, v)
    return r.load()


def write(df: Any, endpoint: str, mode: str = "append", **options: str) -> None:
    w = df.write.format("siftmq").option("endpoints", endpoint).mode(mode)
    for k, v in options.items():
        w = w.option(k, v)
    w.save()


def test_write_round_trip(spark: Any, start_broker: Any) -> None:
    broker = start_broker()
    rows = [
        Row(
            body=f"payload {i}".encode(),
            tag=None if i % 5 == 0 else f"T{i % 3}",
            keys=[f"k{i}", "shared"],
            properties={"n": str(i), "drop": None} if i % 2 else {"n": str(i)},
            region="eu" if i % 4 else None,
        )
        for i in range(300)
    ]
    df = spark.createDataFrame(
        rows, "body binary, tag string, keys array<string>, properties map<string,string>, region string"
    )
    write(df.repartition(3), broker.endpoint, topic="Sink", properties="region", maxBatchMessages="40")
    back = {
        int(r.properties["n"]): r for r in read(spark, broker.endpoint, "Sink", properties="region").collect()
    }
    assert sorted(back) == list(range(300))
    for i, want in enumerate(rows):
        got = back[i]
        assert got.body == want.body and got.tag == want.tag and list(got.keys) == want.keys
        assert got.region == want.region
        assert dict(got.properties) == {"n": str(i), **({"region": want.region} if want.region else {})}
    assert len({r.message_id for r in back.values()}) == 300

    # a DataFrame read from one topic writes to another as it is: the read-side columns are ignored
    copy = read(spark, broker.endpoint, "Sink").drop("topic")
    write(copy, broker.endpoint, topic="Copy")
    assert read(spark, broker.endpoint, "Copy").count() == 300
    # the topic can come from a column; strings are UTF-8 bodies and keys split on whitespace
    routed = spark.createDataFrame(
        [("A1", "x", "k1 k2"), ("A2", "y", None), ("A1", "z", "k3")], "topic string, body string, keys string"
    )
    write(routed, broker.endpoint)
    a1 = read(spark, broker.endpoint, "A1").orderBy("queue_offset").collect()
    assert sorted(r.body for r in a1) == [b"x", b"z"]
    assert sorted(tuple(r.keys) for r in a1) == [("k1", "k2"), ("k3",)]
    assert [r.body for r in read(spark, broker.endpoint, "A2").collect()] == [b"y"]


def test_write_refusals(spark: Any, start_broker: Any) -> None:
    broker = start_broker()
    df = spark.createDataFrame([(b"x", "A")], "body binary, tag string")
    with pytest.raises(Exception, match="'overwrite' is not supported: a topic cannot be truncated"):
        write(df, broker.endpoint, mode="overwrite", topic="T")
    with pytest.raises(Exception, match="needs a 'body' column"):
        write(df.selectExpr("tag"), broker.endpoint, topic="T")
    with pytest.raises(Exception, match=r"column\(s\) \['extra'\] are not message fields"):
        write(df.selectExpr("body", "1 AS extra"), broker.endpoint, topic="T")
    with pytest.raises(Exception, match="give option 'topic' or a 'topic' column"):
        write(df, broker.endpoint)
    with pytest.raises(Exception, match="row 0 has a NULL or empty body"):
        write(spark.createDataFrame([(b"",)], "body binary"), broker.endpoint, topic="T")
    with pytest.raises(Exception, match="unknown option 'filter'"):
        write(df, broker.endpoint, topic="T", filter="a = 1")
    with pytest.raises(Exception, match="ILLEGAL_MESSAGE_TAG"):
        write(spark.createDataFrame([(b"x", "a|b")], "body binary, tag string"), broker.endpoint, topic="T")
    # an empty tag went out as no tag at all; NULL is the way to say none
    with pytest.raises(Exception, match="has an empty tag; a message without a tag has a NULL one"):
        write(
            spark.createDataFrame([(b"x", "A"), (b"y", "")], "body binary, tag string"),
            broker.endpoint,
            topic="E",
        )
    with pytest.raises(Exception, match=r"'maxBatchBytes': must be in 1\.\.8388608"):
        write(df, broker.endpoint, topic="T", maxBatchBytes=str(64 << 20))
