"""``siftmq spark scan`` and ``stats`` on a store written by a real broker (through the client)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from siftmq.cli.spark import spark_app
from siftmq.client import FilterExpression, blocking
from siftmq.filter import compile_filter
from siftmq.spark.jobs import common
from siftmq.spark.jobs.scan import run_scan, scan_dataframe
from siftmq.spark.jobs.stats import read_subscriptions, run_stats
from siftmq.store import Message, MessageStore, StoreConfig, bulk
from siftmq.store.segment import list_segment_starts, segment_name
from siftmq.store.statefile import read_json, write_json
from siftmq.testing import BrokerProcess

TOPIC = "Orders"
OTHER = "Audit"
SQL = "price > 50 AND region = 'eu'"
TAGS = "Tag0 || Tag1"
GROUPS = {  # group -> (topic, filter)
    "g_tags": (TOPIC, FilterExpression.tag(TAGS)),
    "g_sql": (TOPIC, FilterExpression.sql92(SQL)),
    "g_all": (TOPIC, FilterExpression.tag("*")),
    "g_none": (TOPIC, FilterExpression.tag("NoSuchTag")),
    "g_us": (TOPIC, FilterExpression.sql92("region = 'us'")),
    "g_audit": (OTHER, FilterExpression.tag("Tag0")),
}


@dataclass(frozen=True)
class Sent:
    key: str
    topic: str
    tag: str | None
    properties: dict[str, str]
    body: bytes


def price_of(i: int) -> str | None:
    """Mostly integers; some float strings and garbage (no SQL92 match) and some missing."""
    if i % 17 == 0:
        return None
    if i % 23 == 0:
        return f"{i % 100}.5"
    if i % 29 == 0:
        return "n/a"
    return str(i % 100)


def sent_messages() -> list[Sent]:
    out = []
    for i in range(1600):
        topic = OTHER if i % 4 == 3 else TOPIC
        props = {"region": ("eu", "us", "apac")[i % 3]}
        price = price_of(i)
        if price is not None:
            props["price"] = price
        tag = None if i % 10 == 9 else f"Tag{i % 4}"
        out.append(Sent(f"k{i:05d}", topic, tag, props, bytes([i % 256]) * (1 + (i * 7) % 900)))
    return out


def sql_matches(m: Sent) -> bool:
    """SQL independently: price an integer > 50 (RocketMQ's Long.valueOf) and region 'eu'."""
    price = m.properties.get("price")
    return (
        price is not None
        and re.fullmatch(r"-?\d+", price) is not None
        and int(price) > 50
        and (m.properties.get("region") == "eu")
    )


EXPECTED = {  # group -> which sent messages of its topic the filter delivers
    "g_tags": lambda m: m.tag in ("Tag0", "Tag1"),
    "g_sql": sql_matches,
    "g_all": lambda m: True,
    "g_none": lambda m: False,
    "g_us": lambda m: m.properties.get("region") == "us",
    "g_audit": lambda m: m.tag == "Tag0",
}


@pytest.fixture(scope="module")
def broker_data(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, list[Sent]]]:
    """A broker data dir written through the client by a real broker process, which is then stopped."""
    data_dir = tmp_path_factory.mktemp("broker") / "data"
    broker = BrokerProcess(data_dir).start()
    messages = sent_messages()
    try:
        with blocking.Producer(broker.endpoint) as producer:
            for topic in (TOPIC, OTHER):
                batch = []
                for m in (m for m in messages if m.topic == topic):
                    batch.append(
                        producer.message(topic, m.body, tag=m.tag, keys=[m.key], properties=m.properties)
                    )
                for k in range(0, len(batch), 200):
                    producer.send_many(batch[k : k + 200])
        for group, (topic, expression) in GROUPS.items():
            with blocking.SimpleConsumer(broker.endpoint, group, {topic: expression}):
                pass
    finally:
        assert broker.stop() == 0, broker.log()
    yield data_dir, messages


def stored_by_key(store_dir: Path) -> dict[str, bulk.codec.StoredMessage]:
    """The reference decoding of every stored record, by its KEYS."""
    return {m.properties["KEYS"]: m for m in bulk.iter_records(store_dir)}


def test_commitlog_dataframe_equals_the_reference_decoder(
    spark: Any, broker_data: tuple[Path, list[Sent]]
) -> None:
    data_dir, messages = broker_data
    store_dir = data_dir / "store"
    df = common.commitlog_dataframe(spark, store_dir, target_bytes=64 * 1024)
    assert df.rdd.getNumPartitions() > 4
    rows = df.orderBy("physical_offset").collect()
    reference = list(bulk.iter_records(store_dir))
    assert len(rows) == len(reference) == len(messages)
    for row, ref in zip(rows, reference, strict=True):
        assert (row.topic, row.queue_id, row.queue_offset, row.physical_offset, row.store_size) == (
            ref.topic, ref.queue_id, ref.queue_offset, ref.commit_log_offset, ref.store_size,
        )  # fmt: skip
        assert (row.body, row.properties, row.tags, row.keys) == (
            ref.body,
            ref.properties,
            ref.tags,
            ref.properties["KEYS"],
        )
        assert row.message_id == ref.uniq_key and row.message_id
        assert (row.born_timestamp, row.store_timestamp) == (ref.born_timestamp, ref.store_timestamp)
    only = common.commitlog_dataframe(spark, store_dir, topics=[OTHER], with_body=False)
    got = only.select("topic", "body").collect()
    assert len(got) == sum(m.topic == OTHER for m in messages)
    assert {(r.topic, r.body) for r in got} == {(OTHER, b"")}


def read_keys(out: Path) -> list[str]:
    table = pq.read_table(out)
    return sorted(table.column("keys").to_pylist())


@pytest.mark.parametrize(("group", "kind", "text"), [("g_sql", "SQL92", SQL), ("g_tags", "TAG", TAGS)])
def test_scan_writes_exactly_the_matching_messages(  # noqa: PLR0917 - fixtures and parameters
    spark: Any, broker_data: tuple[Path, list[Sent]], tmp_path: Path, group: str, kind: str, text: str
) -> None:
    data_dir, messages = broker_data
    out = tmp_path / "out"
    result = run_scan(spark, data_dir / "store", TOPIC, out, compiled=compile_filter(kind, text))
    expected = [m for m in messages if m.topic == TOPIC and EXPECTED[group](m)]
    assert 0 < len(expected) < sum(m.topic == TOPIC for m in messages)
    assert read_keys(out) == sorted(m.key for m in expected)
    assert result.messages == len(expected)
    reference = stored_by_key(data_dir / "store")
    assert result.bytes == sum(reference[m.key].store_size for m in expected)
    table = pq.read_table(out)
    assert table.schema.names == bulk.RECORD_SCHEMA.names
    for row in table.to_pylist():
        ref = reference[row["keys"]]
        assert (row["topic"], row["body"], dict(row["properties"])) == (TOPIC, ref.body, ref.properties)
        assert row["physical_offset"] == ref.commit_log_offset


def test_prefilter_in_the_reader_changes_nothing_but_the_rows_spark_sees(
    spark: Any, broker_data: tuple[Path, list[Sent]]
) -> None:
    data_dir, messages = broker_data
    compiled = compile_filter("SQL92", SQL)
    keys = {}
    for prefilter in (True, False):
        df = scan_dataframe(spark, data_dir / "store", TOPIC, compiled, prefilter=prefilter)
        keys[prefilter] = sorted(r.keys for r in df.select("keys").collect())
    assert keys[True] == keys[False] == sorted(m.key for m in messages if m.topic == TOPIC and sql_matches(m))
    # the reader alone (no Spark filter) already keeps exactly the matching rows
    pushed = common.commitlog_dataframe(spark, data_dir / "store", topics=[TOPIC], prefilter=compiled)
    assert sorted(r.keys for r in pushed.select("keys").collect()) == keys[True]


def test_scan_without_filter_keeps_the_whole_topic(
    spark: Any, broker_data: tuple[Path, list[Sent]], tmp_path: Path
) -> None:
    data_dir, messages = broker_data
    result = run_scan(spark, data_dir / "store", OTHER, tmp_path / "all")
    assert read_keys(tmp_path / "all") == sorted(m.key for m in messages if m.topic == OTHER)
    assert result.plan.records == len(messages)
    with pytest.raises(Exception, match="already exists"):
        run_scan(spark, data_dir / "store", OTHER, tmp_path / "all")
    again = run_scan(spark, data_dir / "store", "NoSuchTopic", tmp_path / "all", overwrite=True)
    assert again.messages == 0 and pq.read_table(tmp_path / "all").num_rows == 0


def test_stats_match_independent_counts(
    spark: Any, broker_data: tuple[Path, list[Sent]], tmp_path: Path
) -> None:
    data_dir, messages = broker_data
    result = run_stats(spark, data_dir, TOPIC, tmp_path / "stats")
    reference = stored_by_key(data_dir / "store")
    topic_messages = [m for m in messages if m.topic == TOPIC]
    total_bytes = sum(reference[m.key].store_size for m in topic_messages)
    assert (result.messages, result.bytes) == (len(topic_messages), total_bytes)
    by_group = {r.group: r for r in result.rows}
    assert set(by_group) == {g for g, (t, _) in GROUPS.items() if t == TOPIC}
    for group, row in by_group.items():
        matched = [m for m in topic_messages if EXPECTED[group](m)]
        matched_bytes = sum(reference[m.key].store_size for m in matched)
        assert (row.matched, row.matched_bytes) == (len(matched), matched_bytes), group
        assert row.selectivity == pytest.approx(len(matched) / len(topic_messages))
        assert row.bytes_saved == total_bytes - matched_bytes
        assert row.error is None
    assert by_group["g_all"].bytes_saved == 0 and by_group["g_none"].matched == 0
    table = pq.read_table(result.parquet).to_pylist()
    assert {r["group"]: (r["matched"], r["bytes_saved"]) for r in table} == {
        g: (r.matched, r.bytes_saved) for g, r in by_group.items()
    }
    assert result.plot is not None and result.plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_stats_reports_a_bad_stored_expression_and_counts_the_rest(
    spark: Any, broker_data: tuple[Path, list[Sent]], tmp_path: Path
) -> None:
    data_dir, _ = broker_data
    copy = tmp_path / "data"
    (copy / "config").mkdir(parents=True)
    (copy / "store").symlink_to(data_dir / "store")
    groups = read_json(data_dir / "config" / "groups.json", {})
    groups["g_bad"] = {"subscriptions": {TOPIC: {"kind": "SQL92", "expression": "price >", "version": 1}}}
    write_json(copy / "config" / "groups.json", groups)
    subs = read_subscriptions(copy, TOPIC)
    assert [s.group for s in subs] == sorted(["g_bad", *(g for g, (t, _) in GROUPS.items() if t == TOPIC)])
    result = run_stats(spark, copy, TOPIC, None)
    rows = {r.group: r for r in result.rows}
    assert rows["g_bad"].error is not None and "FilterSyntaxError" in rows["g_bad"].error
    assert rows["g_bad"].matched is None
    assert rows["g_all"].matched == result.messages > 0


def test_a_damaged_record_costs_the_scan_that_record_only(
    spark: Any, broker_data: tuple[Path, list[Sent]], tmp_path: Path
) -> None:
    data_dir, _ = broker_data
    store = tmp_path / "store"
    shutil.copytree(data_dir / "store", store)
    records = list(bulk.iter_records(store))
    victim = records[300]
    seg = max(s for s in list_segment_starts(store / "commitlog") if s <= victim.commit_log_offset)
    path = store / "commitlog" / segment_name(seg)
    raw = bytearray(path.read_bytes())
    raw[victim.commit_log_offset - seg + 100] ^= 0xFF  # in the body: the CRC fails
    path.write_bytes(bytes(raw))
    result = run_scan(spark, store, victim.topic, tmp_path / "out")
    survivors = [
        m for m in records if m.topic == victim.topic and m.commit_log_offset != victim.commit_log_offset
    ]
    assert result.messages == len(survivors)  # the job goes on, as the broker's reads do
    assert read_keys(tmp_path / "out") == sorted(m.properties.get("KEYS", "") for m in survivors)


# --------------------------------------------------------------------------------------------- CLI

runner = CliRunner()


def test_cli_rejects_bad_options_before_starting_spark(
    broker_data: tuple[Path, list[Sent]], tmp_path: Path
) -> None:
    data_dir, _ = broker_data
    base = ["scan", "--data-dir", str(data_dir), "--topic", TOPIC, "--out", str(tmp_path / "o")]
    both = runner.invoke(spark_app, [*base, "--filter", SQL, "--tags", TAGS])
    assert both.exit_code == 1 and "mutually exclusive" in both.output
    bad_sql = runner.invoke(spark_app, [*base, "--filter", "price >> 3"])
    assert bad_sql.exit_code == 1 and "--filter is not a valid SQL92 filter" in bad_sql.output
    bad_tag = runner.invoke(spark_app, [*base, "--tags", "||"])
    assert bad_tag.exit_code == 1 and "--tags is not a valid TAG filter" in bad_tag.output
    (tmp_path / "o").mkdir()
    exists = runner.invoke(spark_app, [*base, "--tags", TAGS])
    assert exists.exit_code == 1 and "--overwrite" in exists.output
    missing = runner.invoke(spark_app, ["stats", "--data-dir", str(tmp_path / "nope"), "--topic", TOPIC])
    assert missing.exit_code == 1 and "no broker store" in missing.output
    store_only = runner.invoke(spark_app, ["stats", "--data-dir", str(data_dir / "store"), "--topic", TOPIC])
    assert store_only.exit_code == 1 and "pass its parent" in store_only.output


def test_cli_stats_prints_a_table(spark: Any, broker_data: tuple[Path, list[Sent]], tmp_path: Path) -> None:
    data_dir, messages = broker_data
    out = tmp_path / "stats"
    result = runner.invoke(
        spark_app, ["stats", "--data-dir", str(data_dir), "--topic", TOPIC, "--out", str(out)]
    )
    assert result.exit_code == 0, result.output
    n = sum(m.topic == TOPIC for m in messages)
    assert f"{n} messages" in result.output
    assert "100.0%" in result.output  # g_all
    assert (out / "stats.parquet").exists() and (out / "selectivity.png").exists()
    broken = tmp_path / "broken"
    (broken / "config").mkdir(parents=True)
    (broken / "store").symlink_to(data_dir / "store")
    (broken / "config" / "groups.json").write_text("{not json")
    bad = runner.invoke(spark_app, ["stats", "--data-dir", str(broken), "--topic", TOPIC, "--out", str(out)])
    assert bad.exit_code == 1 and "groups.json cannot be read" in bad.output
    assert (broken / "config" / "groups.json").read_text() == "{not json"  # a reader moves nothing


def test_cli_scan_of_a_store_a_broker_has_open(spark: Any, start_broker: Any, tmp_path: Path) -> None:
    broker = start_broker()
    with blocking.Producer(broker.endpoint) as producer:
        producer.send_many(
            [producer.message(TOPIC, b"live", tag="Tag0", keys=[f"live{i}"]) for i in range(30)]
        )
    assert common.store_in_use(broker.data_dir / "store")
    out = tmp_path / "live"
    result = runner.invoke(
        spark_app,
        ["scan", "--data-dir", str(broker.data_dir), "--topic", TOPIC, "--tags", "Tag0", "--out", str(out)],
    )
    assert result.exit_code == 0, result.output
    assert "a broker has" in result.output
    assert read_keys(out) == sorted(f"live{i}" for i in range(30))
    broker.stop()
    assert not common.store_in_use(broker.data_dir / "store")


@pytest.mark.integration  # a Spark job in a subprocess
def test_cli_scan_end_to_end_in_a_subprocess(broker_data: tuple[Path, list[Sent]], tmp_path: Path) -> None:
    data_dir, messages = broker_data
    out = tmp_path / "scan"
    proc = subprocess.run(
        [sys.executable, "-m", "siftmq", "spark", "scan", "--data-dir", str(data_dir), "--topic", TOPIC,
         "--filter", SQL, "--out", str(out), "--master", "local[2]"],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    expected = sorted(m.key for m in messages if m.topic == TOPIC and sql_matches(m))
    assert read_keys(out) == expected
    assert "messages written" in proc.stdout and str(len(expected)) in proc.stdout


def test_cli_startup_does_not_import_pyspark() -> None:
    code = "import sys, siftmq.cli.app; print(sorted(m for m in sys.modules if m.startswith('pyspark')))"
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert proc.stdout.strip() == "[]"


def test_automatic_ranges_follow_the_data_of_a_store_that_is_open(spark: Any, tmp_path: Path) -> None:
    """A broker's open store has a preallocated last segment: ranges are sized from its records,
    not from the file's size (3 MiB of records in a 64 MiB file still make several ranges)."""
    store_dir = tmp_path / "store"
    with MessageStore.open(StoreConfig(store_dir, commit_log_segment_size=64 << 20)) as store:
        store.put_messages([Message("Auto", bytes(1024), properties={"KEYS": f"k{i}"}) for i in range(3000)])
        store.flush()
        assert (store_dir / "commitlog" / segment_name(0)).stat().st_size == 64 << 20
        plan = common.plan_commitlog(spark, store_dir)
    assert plan.stop_reason is None and plan.records == 3000
    assert len(plan.ranges) >= 3
    assert all(r.size <= common.MIN_TARGET_BYTES + 2048 for r in plan.ranges)
