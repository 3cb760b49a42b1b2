"""Pure tests of the source's planning pieces: pushdown translation, broker filter, options, offsets.

No broker and no SparkSession: the Filter classes are plain Python objects. The end-to-end checks
(results, explain, broker metrics) are in ``test_source_read.py``.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from pyspark.sql.datasource import (
    EqualNullSafe,
    EqualTo,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    IsNotNull,
    IsNull,
    LessThan,
    LessThanOrEqual,
    Not,
    StringContains,
    StringEndsWith,
    StringStartsWith,
)

from siftmq.errors import ConfigError
from siftmq.filter import compile_filter
from siftmq.spark.options import EARLIEST, LATEST, parse_read_options, parse_write_options
from siftmq.spark.pushdown import broker_filter, plan_pushdown, sql_string
from siftmq.spark.rows import message_schema
from siftmq.spark.sink import stream_message_ids
from siftmq.spark.source import BrokerFilter, SiftmqPushdownReader, default_group
from siftmq.spark.stream import offsets_json, share

HOT = ("region", "price", "odd-name")


def plan(*filters: Any, sql92: bool = True, base_tags: frozenset[str] | None = None) -> Any:
    return plan_pushdown(list(filters), topic="Orders", hot_properties=HOT, sql92=sql92, base_tags=base_tags)


R = ("region",)
T = ("tag",)

# filter -> the SQL92 term it becomes (None: returned to Spark)
SQL_CASES = [
    (EqualTo(R, "eu"), "region = 'eu'"),
    (Not(EqualTo(R, "eu")), "region <> 'eu'"),
    (EqualNullSafe(R, "eu"), "region = 'eu'"),
    (EqualNullSafe(R, None), "region IS NULL"),
    (Not(EqualNullSafe(R, "eu")), "(region IS NULL OR region <> 'eu')"),
    (Not(EqualNullSafe(R, None)), "region IS NOT NULL"),
    (In(R, ["us", "eu", "eu"]), "region IN ('eu', 'us')"),
    (In(R, ["eu", None]), "region IN ('eu')"),
    (Not(In(R, ["eu", "us"])), "region NOT IN ('eu', 'us')"),
    (Not(In(R, ["eu", None])), None),  # NOT IN with a NULL is never TRUE in Spark
    (In(R, [None]), None),
    (IsNull(R), "region IS NULL"),
    (IsNotNull(R), "region IS NOT NULL"),
    (Not(IsNull(R)), "region IS NOT NULL"),
    (Not(IsNotNull(R)), "region IS NULL"),
    (StringStartsWith(R, "e"), "region STARTSWITH 'e'"),
    (StringEndsWith(R, "u"), "region ENDSWITH 'u'"),
    (StringContains(R, "it's"), "region CONTAINS 'it''s'"),
    (Not(StringContains(R, "x")), "region NOT CONTAINS 'x'"),
    (StringStartsWith(R, ""), None),  # RocketMQ: FALSE; Spark: TRUE
    (GreaterThan(R, "eu"), None),  # RocketMQ orders numbers only
    (LessThanOrEqual(R, "eu"), None),
    (EqualTo(R, 5), None),  # not a string value: never guessed
    (EqualTo(("price",), "10"), "price = '10'"),
    (EqualTo(("odd-name",), "x"), None),  # not an SQL92 identifier
    (EqualTo(("REGION",), "eu"), "region = 'eu'"),  # Spark columns are case-insensitive
    (EqualTo(("body",), b"x"), None),
    (EqualTo(("message_id",), "x"), None),
    (EqualTo(("meta", "region"), "x"), None),
    (StringStartsWith(T, "Ta"), "TAGS STARTSWITH 'Ta'"),
    (Not(EqualTo(T, "A")), "TAGS <> 'A'"),
    (EqualTo(T, "A "), "TAGS = 'A '"),  # the TAG grammar would trim it
    (EqualTo(T, " A"), "TAGS = ' A'"),
]


@pytest.mark.parametrize(("f", "sql"), SQL_CASES, ids=[repr(c[0]) for c in SQL_CASES])
def test_each_filter_becomes_exact_sql92_or_goes_back_to_spark(f: Any, sql: str | None) -> None:
    p = plan(f)
    if sql is None:
        assert p.rejected == (f,) and p.accepted == () and p.sql_terms == ()
    else:
        assert p.accepted == (f,) and p.rejected == () and p.sql_terms == (sql,)
        compile_filter("SQL92", sql)  # the broker will take it


def test_is_not_null_beside_a_null_rejecting_term_is_accepted_but_not_sent() -> None:
    p = plan(IsNotNull(R), EqualTo(R, "eu"))
    assert len(p.accepted) == 2 and p.sql_terms == ("region = 'eu'",)
    p = plan(IsNotNull(R), Not(EqualNullSafe(R, "eu")))  # TRUE for NULL: the IS NOT NULL matters
    assert p.sql_terms == ("(region IS NULL OR region <> 'eu')", "region IS NOT NULL")
    p = plan(IsNotNull(T), StringStartsWith(T, "x"))
    assert len(p.accepted) == 2 and p.sql_terms == ("TAGS STARTSWITH 'x'",)


def test_rejected_filters_are_the_same_objects() -> None:
    f1, f2 = GreaterThan(R, "a"), EqualTo(R, "b")
    p = plan(f1, f2)
    assert p.rejected[0] is f1 and p.accepted[0] is f2


def test_tag_sets_become_a_tag_expression_and_is_not_null_comes_free() -> None:
    p = plan(IsNotNull(T), EqualTo(T, "A"), In(T, ["A", "B"]))
    assert p.rejected == () and p.sql_terms == () and p.tags == frozenset({"A"})
    assert broker_filter(sql_filter=None, base_tags=None, pushdown=p) == BrokerFilter("TAG", "A")
    both = plan(In(T, ["B", "A", None]))
    assert broker_filter(sql_filter=None, base_tags=None, pushdown=both) == BrokerFilter("TAG", "A||B")


def test_tag_constraints_that_contradict_each_other_match_nothing() -> None:
    assert plan(EqualTo(T, "A"), EqualTo(T, "B")).empty
    assert plan(EqualTo(T, "A"), base_tags=frozenset({"B"})).empty
    assert not plan(EqualTo(T, "A"), base_tags=frozenset({"A", "B"})).empty


def test_tag_is_not_null_alone_needs_sql92() -> None:
    assert plan(IsNotNull(T)).sql_terms == ("TAGS IS NOT NULL",)
    f = IsNotNull(T)
    assert plan(f, sql92=False).rejected == (f,)
    assert plan(f, sql92=False, base_tags=frozenset({"A"})).accepted == (f,)  # the option's tags imply it


def test_without_sql92_only_tag_sets_and_bounds_are_pushed() -> None:
    region, tag, not_tag, starts = (
        EqualTo(R, "eu"),
        EqualTo(T, "A"),
        Not(EqualTo(T, "B")),
        StringStartsWith(T, "x"),
    )
    p = plan(region, tag, not_tag, starts, GreaterThan(("queue_id",), 2), sql92=False)
    assert set(map(id, p.rejected)) == {id(region), id(not_tag), id(starts)}
    assert p.tags == frozenset({"A"}) and p.sql_terms == ()
    assert p.queues.lo == 3


def test_tags_that_a_tag_expression_cannot_say_go_through_sql92() -> None:
    p = plan(In(T, ["A", "x||y"]))
    assert p.tags is None and p.sql_terms == ("TAGS IN ('A', 'x||y')",)
    assert plan(EqualTo(T, "*")).sql_terms == ("TAGS = '*'",)  # "*" would mean every message
    assert plan(EqualTo(T, "*"), sql92=False).accepted == ()


def test_queue_and_offset_predicates_narrow_the_partitions() -> None:
    p = plan(
        IsNotNull(("queue_id",)),
        In(("queue_id",), [1, 2, 5]),
        Not(EqualTo(("queue_id",), 2)),
        GreaterThanOrEqual(("queue_offset",), 10),
        LessThan(("queue_offset",), 20),
        Not(GreaterThan(("queue_offset",), 15)),
    )
    assert p.rejected == () and not p.empty
    assert [q for q in range(8) if p.queues.contains(q)] == [1, 5]
    assert p.offsets.clip(0, 100) == (10, 16)
    assert p.offsets.clip(30, 40) == (30, 30)  # nothing left of that range
    assert plan(IsNull(("queue_offset",))).empty
    odd = In(("queue_offset",), [1, 3])  # not a contiguous range: Spark keeps it
    assert plan(odd).rejected == (odd,)
    assert plan(In(("queue_offset",), [4, 3, 5])).offsets.clip(0, 100) == (3, 6)


def test_topic_predicates_are_decided_here() -> None:
    assert not plan(EqualTo(("topic",), "Orders"), StringStartsWith(("topic",), "Ord")).empty
    assert plan(EqualTo(("topic",), "Other")).empty
    assert plan(Not(In(("topic",), ["Other", None]))).empty
    assert not plan(Not(In(("topic",), ["Other"]))).empty
    assert plan(GreaterThan(("topic",), "P")).empty


def test_string_values_are_quoted_safely() -> None:
    hostile = "x' OR TAGS IS NOT NULL OR region = '"
    p = plan(EqualTo(R, hostile))
    (term,) = p.sql_terms
    cf = compile_filter("SQL92", term)
    assert cf.properties == {"region"}
    assert cf.matches({"region": hostile}) and not cf.matches({"region": "x", "TAGS": "A"})
    assert sql_string("a'b''") == "'a''b'''''"


def test_broker_filter_combines_options_and_pushdown() -> None:
    p = plan(EqualTo(R, "eu"), EqualTo(T, "A"))
    flt = broker_filter(sql_filter="price > 10 OR price < 2", base_tags=frozenset({"A", "B"}), pushdown=p)
    assert flt.kind == "SQL92"
    assert flt.expression == "((price > 10) OR (price < 2)) AND region = 'eu' AND TAGS IN ('A')"
    assert broker_filter(sql_filter=None, base_tags=frozenset({"B", "A"})) == BrokerFilter("TAG", "A||B")
    assert broker_filter(sql_filter=None, base_tags=None) == BrokerFilter("TAG", "*")
    assert (
        broker_filter(sql_filter="a = 1", base_tags=frozenset({"A"})).expression
        == "(a = 1) AND TAGS IN ('A')"
    )


def test_default_group_depends_on_topic_and_filter_only() -> None:
    a = default_group("Orders", BrokerFilter("SQL92", "region = 'eu'"))
    assert a == default_group("Orders", BrokerFilter("SQL92", "region  =  'eu'"))  # normalized
    assert a != default_group("Orders", BrokerFilter("SQL92", "region = 'us'"))
    assert a != default_group("Other", BrokerFilter("SQL92", "region = 'eu'"))
    assert a.startswith("siftmq-spark-") and len(a) == len("siftmq-spark-") + 16


BASE = {"endpoints": "127.0.0.1:8081", "topic": "Orders"}
OPTION_ERRORS = [
    ({"topic": "Orders"}, "'endpoints': is required"),
    ({"endpoints": "a:1,b:2", "topic": "T"}, "'endpoints': give one broker"),
    ({"endpoints": "nohost", "topic": "T"}, "'endpoints': expected host:port"),
    ({"endpoints": "h:1"}, "'topic': is required"),
    ({**BASE, "topic": "bad topic"}, "'topic'"),
    ({**BASE, "startingoffsets": "{bad json"}, "'startingOffsets': expected"),
    ({**BASE, "startingoffsets": "[1, 2]"}, "'startingOffsets': the JSON must be an object"),
    ({**BASE, "startingoffsets": '{"0": -3}'}, "'startingOffsets': offset -3 of queue 0 is negative"),
    ({**BASE, "startingoffsets": '{"x": 1}'}, "'startingOffsets': queue id 'x'"),
    ({**BASE, "startingoffsets": '{"0": 1.5}'}, "'startingOffsets': offset of queue 0 must be an integer"),
    ({**BASE, "endingoffsets": "earliest"}, "'endingOffsets'"),
    ({**BASE, "filter": "price >"}, "'filter': invalid SQL92 filter"),
    ({**BASE, "filter": "  "}, "'filter': is empty"),
    ({**BASE, "filter": "a = 1", "sql92": "false"}, "'filter': is an SQL92 filter"),
    ({**BASE, "tags": "||"}, "'tags': invalid TAG expression"),
    ({**BASE, "properties": "region,TAGS"}, "'properties': 'TAGS' is a broker property"),
    ({**BASE, "properties": "Body"}, "'properties': 'Body' would clash"),
    ({**BASE, "properties": "a,A"}, "differ only in case"),
    ({**BASE, "maxmessagesperpartition": "0"}, "'maxMessagesPerPartition': must be in"),
    ({**BASE, "pullbatchsize": "2000"}, "'pullBatchSize': must be in 1..1024"),
    ({**BASE, "pushdown": "maybe"}, "'pushdown': expected true or false"),
    ({**BASE, "maxmessagespertrigger": "10"}, "'maxMessagesPerTrigger': applies to streaming"),
    ({**BASE, "statingoffsets": "earliest"}, "unknown option 'statingoffsets'"),
    ({**BASE, "producerid": "p"}, "unknown option 'producerid' (it is not a read option)"),
    ({**BASE, "group": "no spaces"}, "'group'"),
]


@pytest.mark.parametrize(("options", "message"), OPTION_ERRORS, ids=[m for _, m in OPTION_ERRORS])
def test_bad_read_options_name_the_option(options: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_read_options(options, streaming=False)
    assert message in str(err.value)


def test_read_options_parse() -> None:
    o = parse_read_options(
        {
            **BASE,
            "startingoffsets": ' {"3": 5, "1": -2} ',
            "endingoffsets": '{"3": -1}',
            "properties": " region , n ",
        },
        streaming=False,
    )
    assert o.starting.per_queue == ((1, EARLIEST), (3, 5)) and o.starting.default == EARLIEST
    assert (
        o.starting.for_queue(1) == EARLIEST
        and o.starting.for_queue(3) == 5
        and o.starting.for_queue(0) == EARLIEST
    )
    assert o.ending is not None and o.ending.default == LATEST
    assert o.hot_properties == ("region", "n")
    assert o.pushdown is False  # opt-in: see docs/spark-source.md
    s = parse_read_options({**BASE, "maxmessagespertrigger": "5", "checkpointlocation": "/x"}, streaming=True)
    assert s.starting.default == LATEST and s.ending is None and s.max_messages_per_trigger == 5
    with pytest.raises(ConfigError, match="'endingOffsets': applies to batch reads only"):
        parse_read_options({**BASE, "endingoffsets": "latest"}, streaming=True)


def test_write_options() -> None:
    w = parse_write_options({"endpoints": "h:1", "producerid": "p1", "maxbatchmessages": "10"})
    assert w.topic is None and w.producer_id == "p1" and w.max_batch_messages == 10
    with pytest.raises(ConfigError, match=r"'maxBatchMessages': must be in 1\.\.1024"):
        parse_write_options({"endpoints": "h:1", "maxbatchmessages": "5000"})
    with pytest.raises(ConfigError, match="unknown option 'filter' \\(it is not a write option\\)"):
        parse_write_options({"endpoints": "h:1", "filter": "a = 1"})


def test_offsets_json_has_one_key_order() -> None:
    a = offsets_json({10: 1, 2: 5, 0: 7, 1: 0})
    b = offsets_json({1: 0, 0: 7, 2: 5, 10: 1})
    assert json.dumps(a) == json.dumps(b) == json.dumps(a, sort_keys=True)
    assert json.dumps(json.loads(json.dumps(a))) == json.dumps(a)  # survives the checkpoint round trip


def test_share_splits_a_budget_fairly() -> None:
    assert share({0: 100, 1: 100, 2: 0, 3: 5}, 60) == {0: 28, 1: 27, 2: 0, 3: 5}
    assert share({0: 3, 1: 4}, 100) == {0: 3, 1: 4}
    assert sum(share({q: 1000 for q in range(8)}, 7).values()) == 7
    assert share({0: 10, 1: 10}, 0) == {0: 0, 1: 0}


def test_stream_message_ids_are_deterministic_and_distinct() -> None:
    a = stream_message_ids("sink", 3, 1)
    assert a(0) == stream_message_ids("sink", 3, 1)(0)
    assert len({a(0), a(1), stream_message_ids("sink", 4, 1)(0), stream_message_ids("sink", 3, 2)(0)}) == 4
    assert stream_message_ids("other", 3, 1)(0) != a(0)
    assert a(0).isascii() and a(0).isprintable() and len(a(0)) <= 128


def test_a_tag_set_reads_back_as_itself_on_the_broker() -> None:
    """The tag ``*`` alone is not subscribe-all, and no tag matches no message (RocketMQ)."""
    star, none = frozenset({"*"}), frozenset[str]()
    assert broker_filter(sql_filter=None, base_tags=star) == BrokerFilter("TAG", "*||")
    assert broker_filter(sql_filter=None, base_tags=none) == BrokerFilter("TAG", " ")
    assert broker_filter(sql_filter="a = 1", base_tags=star).expression == "(a = 1) AND TAGS IN ('*')"
    assert broker_filter(sql_filter="a = 1", base_tags=none).expression == "(a = 1) AND FALSE"


def test_the_source_takes_only_filters_that_keep_every_row() -> None:
    """A taken filter would narrow the read plan Spark shares between every scan of the relation."""
    o = parse_read_options(
        {**BASE, "properties": "region", "pushdown": "true", "tags": "A||B", "sql92": "false"},
        streaming=False,
    )
    reader = SiftmqPushdownReader(o, message_schema(o.hot_properties))
    keep = [
        EqualTo(("topic",), "Orders"),
        IsNotNull(T),
        IsNotNull(("queue_id",)),
        GreaterThanOrEqual(("queue_id",), 0),
    ]
    narrow = [
        EqualTo(R, "eu"),
        EqualTo(T, "A"),
        EqualTo(("topic",), "Other"),
        In(("queue_id",), (1, 2)),
        LessThan(("queue_offset",), 10),
    ]
    assert list(reader.pushFilters([*keep, *narrow])) == narrow
