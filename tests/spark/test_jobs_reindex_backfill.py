"""The offline ``reindex`` and ``backfill`` Spark jobs on stores written by a real broker process.

Each scenario: a broker (tiny CommitLog segments, so the log spans several files) gets SQL92 and
TAG subscribers and messages, is stopped, the job runs, the broker is started again, and the same
groups consume everything again: the results must be the same sets, and exact (the client's own
re-check never has to drop a message).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from siftmq.broker.filter_registry import FilterRegistry
from siftmq.broker.message_filters import SqlMessageFilter
from siftmq.client import FilterExpression, blocking
from siftmq.errors import ConfigError, NotFoundError, StoreError, StoreLockedError
from siftmq.filter import BloomFilter, compile_filter
from siftmq.spark.jobs.backfill import run_backfill
from siftmq.spark.jobs.common import plan_commitlog
from siftmq.spark.jobs.registrations import RegistrationFile, RegistrationSpec
from siftmq.spark.jobs.reindex import run_reindex, store_layout, write_queues
from siftmq.store import CqExtUnit, Message, MessageStore, StoreConfig, tags_code_of
from siftmq.store import store as store_module
from siftmq.store.bulk import iter_records, plan_scan
from siftmq.store.consumequeue import CQ_STORE_UNIT_SIZE, encode_entry_columns
from siftmq.store.consumequeue_ext import CHECK_MARKER
from siftmq.store.offline import (
    JOURNAL_FILE,
    STAGING_DIR,
    IndexLayout,
    IndexStaging,
    finish_pending_install,
    install,
    open_queue,
    open_queue_ext,
    stored_queues,
)
from siftmq.store.recovery import Checkpoint
from siftmq.store.statefile import read_json, write_json
from siftmq.testing import BrokerProcess
from store_helpers import flip_log_byte

pytestmark = pytest.mark.integration

BROKER_CONFIG: dict[str, object] = {
    "commit_log_segment_size": 64 * 1024,  # a few hundred records per segment file
    "max_body_size": 1024,
    "default_queue_nums": 4,
    "min_invisible_time_s": 0.05,
}
ORDERS = "Orders"
AUDIT = "Audit"
SQL_EU = "region = 'eu' AND price > 30"
SQL_BIG = "price BETWEEN 80 AND 100 OR TAGS = 'C'"
REGIONS = ("eu", "us", "apac")
TAGS = ("A", "B", "C")


def order_rows(n: int, start: int = 0) -> list[tuple[bytes, str, dict[str, str]]]:
    rows = []
    for i in range(start, start + n):
        props = {"region": REGIONS[i % 3], "price": str((i * 7) % 101)}
        if i % 17 == 0:
            props["price"] = "n/a"  # a value the numeric comparison rejects
        if i % 23 == 0:
            del props["region"]
        rows.append((f"{ORDERS}-{i}".encode(), TAGS[i % 3], props))
    return rows


def expected(rows: list[tuple[bytes, str, dict[str, str]]], kind: str, expression: str) -> set[bytes]:
    flt = compile_filter(kind, expression)
    return {body for body, tag, props in rows if flt.matches({**props, "TAGS": tag})}


def produce(endpoint: str, topic: str, rows: list[tuple[bytes, str, dict[str, str]]]) -> None:
    with blocking.Producer(endpoint) as producer:
        for i in range(0, len(rows), 100):
            batch = [producer.message(topic, b, tag=t, properties=p) for b, t, p in rows[i : i + 100]]
            producer.send_many(batch)


def consume_all(endpoint: str, group: str, topic: str, expression: FilterExpression) -> set[bytes]:
    """Every message of ``topic`` the broker delivers to ``group`` from offset 0 (offsets not committed)."""
    got: list[bytes] = []
    with blocking.PullConsumer(endpoint, group, topic, expression) as consumer:
        queues = consumer.assignment()
        assert len(queues) == 4
        for qid in queues:
            consumer.seek(qid, 0)
        still = 0
        while still < 2:
            before = dict(consumer._offsets)
            batch = consumer.poll(64, 0.0)
            got += [m.body for m in batch]
            still = still + 1 if not batch and consumer._offsets == before else 0
        assert consumer.dropped == 0  # the broker never sent what the client's re-check rejects
    assert len(got) == len(set(got))
    return set(got)


def filter_stats(broker: BrokerProcess, group: str, topic: str) -> dict[str, Any]:
    report = httpx.get(f"{broker.admin_url}/groups/{group}", timeout=30).json()
    [sub] = [s for s in report["subscriptions"] if s["topic"] == topic]
    return {
        **sub["filter_stats"],
        "lag": sum(r["lag"] for r in sub["lag"]),
        "matching_lag": sum(r["matching_lag"] for r in sub["lag"]),
    }


def register(endpoint: str, group: str, topic: str, expression: FilterExpression) -> None:
    """Subscribe ``group`` (a pull registers a SQL92 expression for the bitmap), then wait out the
    margin after which the registration's bitmaps are trusted."""
    with blocking.PullConsumer(endpoint, group, topic, expression) as consumer:
        consumer.poll(1, 0.0)
    time.sleep(1.2)


def tree_files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture
def broker_dir(tmp_path: Path) -> Iterator[Path]:
    yield tmp_path / "data"


def start(data_dir: Path) -> BrokerProcess:
    return BrokerProcess(data_dir, config=BROKER_CONFIG).start()


# ------------------------------------------------------------------------------------------- reindex


def test_reindex_rebuilds_lost_indexes_the_broker_serves_unchanged(spark: Any, broker_dir: Path) -> None:
    broker = start(broker_dir)
    try:
        register(broker.endpoint, "g-eu", ORDERS, FilterExpression.sql92(SQL_EU))
        register(broker.endpoint, "g-big", ORDERS, FilterExpression.sql92(SQL_BIG))
        rows = order_rows(1200)
        produce(broker.endpoint, ORDERS, rows)
        audit = [(f"{AUDIT}-{i}".encode(), TAGS[i % 2], {"n": str(i)}) for i in range(200)]
        produce(broker.endpoint, AUDIT, audit)
        subs = {
            "g-eu": FilterExpression.sql92(SQL_EU),
            "g-big": FilterExpression.sql92(SQL_BIG),
            "g-tag": FilterExpression.tag("A||C"),
        }
        before = {g: consume_all(broker.endpoint, g, ORDERS, e) for g, e in subs.items()}
        assert before["g-eu"] == expected(rows, "SQL92", SQL_EU)
        assert before["g-big"] == expected(rows, "SQL92", SQL_BIG)
        assert before["g-tag"] == expected(rows, "TAG", "A||C")
        assert filter_stats(broker, "g-eu", ORDERS)["skipped_by_bitmap"] > 0

        # a running broker holds the store: the job refuses and names the data dir
        with pytest.raises(StoreLockedError, match=str(broker_dir)):
            run_reindex(spark, broker_dir)
        cli = subprocess.run(
            [sys.executable, "-m", "siftmq", "spark", "reindex", "--data-dir", str(broker_dir)],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert cli.returncode == 1 and str(broker_dir) in cli.stderr and "stop it" in cli.stderr
    finally:
        assert broker.stop() == 0

    store = broker_dir / "store"
    assert len(list((store / "commitlog").iterdir())) >= 4
    original = store.parent / "original"
    for name in ("consumequeue", "consumequeue_ext"):
        shutil.copytree(store / name, original / name)
    # lose every ext unit, damage a consume queue file
    shutil.rmtree(store / "consumequeue_ext")
    damaged = next((store / "consumequeue" / ORDERS / "1").iterdir())
    with open(damaged, "r+b") as f:
        f.seek(40)
        f.write(b"\xff" * 60)

    (store / "abort").touch()  # as after a crash: the broker's recovery must settle the log first
    with pytest.raises(StoreError, match="not closed cleanly"):
        run_reindex(spark, broker_dir)
    (store / "abort").unlink()

    plan = plan_commitlog(spark, store, target_bytes=48 * 1024)  # as the CLI does, before the job's lock
    result = run_reindex(spark, broker_dir, plan=plan)
    assert result.records == 1400 and result.ranges > 4
    assert result.queues + result.carried_over == len(stored_queues(original))
    assert result.registrations == 2 and 0 < result.matched < result.bitmaps == len(rows)
    assert not (store / STAGING_DIR).exists() and not (store / JOURNAL_FILE).exists()

    # the consume queues are byte-for-byte what dispatch wrote; so are the ext units here, as both
    # registrations existed before the first message (compare_ext checks what holds in general)
    assert tree_files(store / "consumequeue") == tree_files(original / "consumequeue")
    assert tree_files(store / "consumequeue_ext") == tree_files(original / "consumequeue_ext")
    compare_ext(store, original)

    broker = start(broker_dir)
    try:
        for group, expression in subs.items():
            assert consume_all(broker.endpoint, group, ORDERS, expression) == before[group], group
        stats = filter_stats(broker, "g-eu", ORDERS)
        assert stats["skipped_by_bitmap"] > 0  # the rebuilt bitmaps are used
        assert "rebuilding them all" not in broker.log()  # the broker used the rebuilt files as they are
    finally:
        assert broker.stop() == 0


def compare_ext(store: Path, original: Path) -> None:
    """Rebuilt ext units against the ones dispatch wrote, where a registration reads them: same store
    times and tags codes everywhere, and every registration decides every entry the same way."""
    layout = store_layout(store)
    registrations = FilterRegistry(store.parent / "config", BloomFilter(), expire_s=3600).all()
    assert registrations
    for topic, queue_id in stored_queues(original):
        old = open_queue(original, topic, queue_id, layout)
        new = open_queue(store, topic, queue_id, layout)
        try:
            assert (new.min_offset, new.max_offset) == (old.min_offset, old.max_offset)
            n = old.max_offset
            assert old.ext is not None and new.ext is not None
            a = old.ext.read_block(0, n)
            b = new.ext.read_block(0, n)
            assert a is not None and b is not None and b.present.all()
            assert np.array_equal(a.store_timestamps, b.store_timestamps)
            assert np.array_equal(a.tags_codes, b.tags_codes)
            codes = old.read_block(0, n)
            assert codes is not None
            for reg in registrations:
                if reg.topic != topic:
                    continue
                flt = reg.message_filter()
                assert np.array_equal(
                    flt.match_consume_queue_block(codes["tags_code"].astype(np.int64), a),
                    flt.match_consume_queue_block(codes["tags_code"].astype(np.int64), b),
                )
        finally:
            old.close()
            new.close()


# ------------------------------------------------------------------------------------------ backfill


def test_backfill_makes_the_bitmap_skip_cover_history(
    spark: Any, broker_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    early, late = FilterExpression.sql92(SQL_BIG), FilterExpression.sql92(SQL_EU)
    bloom = BloomFilter()
    # with g-late's bits not among g-early's, a bitmap hits g-late exactly where its filter matched,
    # so the index-only counts below are exact
    assert not set(bloom.bit_positions(f"g-late#{ORDERS}")) <= set(bloom.bit_positions(f"g-early#{ORDERS}"))
    phase1, phase2, phase3 = order_rows(400), order_rows(400, 400), order_rows(400, 800)
    rows = phase1 + phase2 + phase3
    late_all = expected(rows, "SQL92", SQL_EU)
    broker = start(broker_dir)
    try:
        produce(broker.endpoint, ORDERS, phase1)  # no SQL92 registration yet: no bitmaps
        register(broker.endpoint, "g-early", ORDERS, early)
        produce(broker.endpoint, ORDERS, phase2)  # g-early's bits
        register(broker.endpoint, "g-late", ORDERS, late)
        produce(broker.endpoint, ORDERS, phase3)  # both groups' bits
        early_before = consume_all(broker.endpoint, "g-early", ORDERS, early)
        assert consume_all(broker.endpoint, "g-late", ORDERS, late) == late_all
        stats = filter_stats(broker, "g-late", ORDERS)
        # the history before g-late's registration may match as far as the index knows
        assert stats["matching_lag"] == 800 + len(expected(phase3, "SQL92", SQL_EU))
        early_lag = filter_stats(broker, "g-early", ORDERS)["matching_lag"]
    finally:
        assert broker.stop() == 0

    with pytest.raises(NotFoundError, match=r"g-early#Orders .*g-late#Orders"):
        run_backfill(spark, broker_dir, "nobody", ORDERS)

    # a crash after the new ext files are built: nothing changes
    def crash(staging: IndexStaging) -> None:
        assert (staging.root / "consumequeue_ext" / ORDERS).is_dir()
        raise KeyboardInterrupt

    cq_before = tree_files(broker_dir / "store" / "consumequeue")
    ext_before = tree_files(broker_dir / "store" / "consumequeue_ext")
    with pytest.raises(KeyboardInterrupt):
        run_backfill(spark, broker_dir, "g-late", ORDERS, before_install=crash)
    assert tree_files(broker_dir / "store" / "consumequeue_ext") == ext_before
    assert not (broker_dir / "store" / STAGING_DIR).exists()
    assert RegistrationFile(broker_dir / "config").get("g-late", ORDERS).backfilled_until_ms is None  # type: ignore[union-attr]

    result = run_backfill(spark, broker_dir, "g-late", ORDERS, target_bytes=48 * 1024)
    assert (result.records, result.queues, result.version) == (1200, 4, 1)
    assert result.matched == len(late_all)
    # phase 3 had g-late's bits; phase 1 had no bitmaps; phase 2 records dispatched after g-late was
    # registered (but stored before its born time, so not trusted) may have had them already
    history = len(expected(phase1 + phase2, "SQL92", SQL_EU))
    assert len(expected(phase1, "SQL92", SQL_EU)) <= result.bits_set <= history
    assert result.created == 400  # phase 1 had no bitmaps
    saved = {(e["group"], e["topic"]): e for e in read_json(broker_dir / "config/filters.json", [])}
    assert saved[("g-late", ORDERS)]["backfill"] == {"version": 1, "until_ms": result.backfilled_until_ms}
    assert "backfill" not in saved[("g-early", ORDERS)]
    assert tree_files(broker_dir / "store" / "consumequeue") == cq_before  # only ext units change

    broker = start(broker_dir)
    try:
        assert consume_all(broker.endpoint, "g-late", ORDERS, late) == late_all
        stats = filter_stats(broker, "g-late", ORDERS)
        assert stats["matching_lag"] == len(late_all)  # the index now rules out the history too
        assert stats["skipped_by_bitmap"] >= 1200 - len(late_all)
        # the other registration's bits and rules are untouched
        assert consume_all(broker.endpoint, "g-early", ORDERS, early) == early_before
        assert filter_stats(broker, "g-early", ORDERS)["matching_lag"] == early_lag
        # a new expression is a new version: the coverage does not carry over
        changed = httpx.put(
            f"{broker.admin_url}/groups/g-late/subscriptions/{ORDERS}",
            json={"type": "SQL92", "expression": "price > 90"},
            timeout=30,
        )
        assert changed.status_code == 200, changed.text
        assert filter_stats(broker, "g-late", ORDERS)["matching_lag"] == 1200
        [entry] = [e for e in read_json(broker_dir / "config/filters.json", []) if e["group"] == "g-late"]
        assert entry["version"] == 2 and "backfill" not in entry
    finally:
        assert broker.stop() == 0


# --------------------------------------------------------------------------------- pieces, no broker


@pytest.mark.parametrize("ext_checked", [True, False])  # a store's units with bitmap checks, or one older
def test_queue_writer_fills_gaps_refuses_duplicates_and_writes_consecutive_queues(
    tmp_path: Path, ext_checked: bool
) -> None:
    layout = IndexLayout(entries_per_file=4, bitmap_size=14, ext_checked=ext_checked)

    def entry(i: int) -> tuple[int, int, int, int, bytes | None]:
        return (1000 + 100 * i, 100, 7, 1_700_000_000_000 + i, None if i % 2 else bytes(14))

    good = [(("T", 0, i), entry(i)) for i in range(3, 10)]  # starts past 0 (retention), spans segments
    broken = [(("T", 1, i), entry(i)) for i in (0, 1, 1, 2, 5, 6)]
    damaged = [(("T", 2, i), entry(i)) for i in (0, 1, 4, 5)]  # 2 and 3 lost to damage
    reports = list(write_queues(good + broken + damaged, staging_root=str(tmp_path), layout=layout))
    assert [(r.queue_id, r.ok, r.records, r.gaps, r.duplicates, r.filled) for r in reports] == [
        (0, True, 7, 0, 0, 0),
        (1, False, 5, 0, 1, 2),
        (2, True, 4, 0, 0, 2),
    ]
    assert reports[1].problems is not None and "offset 1 is stored twice" in reports[1].problems[0]
    cq = open_queue(tmp_path, "T", 2, layout)
    try:  # the fillers keep offsets 4 and 5 where they were, as the broker's recovery does
        assert (cq.min_offset, cq.max_offset) == (0, 6)
        assert [cq.get_entry(q) for q in range(6)] == [
            (1000, 100, 7),
            (1100, 100, 7),
            (1400, 0, 0),
            (1400, 0, 0),
            (1400, 100, 7),
            (1500, 100, 7),
        ]
    finally:
        cq.close()
    cq = open_queue(tmp_path, "T", 0, layout)
    try:
        assert (cq.min_offset, cq.max_offset) == (3, 10)
        assert cq.get_entry(9) == (1900, 100, 7)
        assert cq.ext is not None and cq.ext.get(4) == CqExtUnit(1_700_000_000_004, 7, bytes(14))
        assert cq.ext.get(5) == CqExtUnit(1_700_000_000_005, 7, None)
    finally:
        cq.close()


def test_an_install_interrupted_by_a_crash_is_finished_when_the_store_opens(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store_dir = tmp_path / "store"
    MessageStore.open(StoreConfig(data_dir=store_dir)).close()
    for q in (0, 1):
        (store_dir / "consumequeue_ext" / "T" / str(q)).mkdir(parents=True)
        (store_dir / "consumequeue_ext" / "T" / str(q) / "old.tmp").write_text("old")
    staging = IndexStaging(store_dir)
    paths = [f"consumequeue_ext/T/{q}" for q in (0, 1)]
    for path in paths:
        (staging.root / path).mkdir(parents=True)
        (staging.root / path / "new.tmp").write_text("new")
    renames: list[tuple[str, str]] = []
    real_rename = os.rename

    def rename(src: str, dst: str) -> None:
        if len(renames) == 3:  # queue 0 swapped, queue 1 moved aside: the process dies here
            raise KeyboardInterrupt
        renames.append((str(src), str(dst)))
        real_rename(src, dst)

    monkeypatch.setattr(os, "rename", rename)
    with pytest.raises(KeyboardInterrupt):
        install(staging, paths, checkpoint=Checkpoint(123, 123))
    monkeypatch.setattr(os, "rename", real_rename)
    assert (store_dir / JOURNAL_FILE).exists()
    assert not (store_dir / paths[0] / "old.tmp").exists() and not (store_dir / paths[1]).exists()

    store = MessageStore.open(StoreConfig(data_dir=store_dir))  # finishes the install first
    store.close()
    for path in paths:
        assert [p.name for p in (store_dir / path).iterdir()] == ["new.tmp"]
    assert not (store_dir / JOURNAL_FILE).exists() and not (store_dir / STAGING_DIR).exists()
    assert finish_pending_install(store_dir) is False


def test_backfill_coverage_belongs_to_one_registration_version(tmp_path: Path) -> None:
    registry = FilterRegistry(tmp_path, BloomFilter(), expire_s=3600)
    v1 = registry.register("g", "T", compile_filter("SQL92", "a > 1"))
    covered = registry.record_backfill("g", "T", version=1, until_ms=v1.born_time_ms)
    flt = covered.message_filter()
    assert isinstance(flt, SqlMessageFilter) and flt.backfilled_until_ms == v1.born_time_ms
    # trusted: stored before the registration (backfilled) and well after it; not in the margin between
    assert flt._bitmap_trusted(v1.born_time_ms - 5000) and flt._bitmap_trusted(v1.born_time_ms + 5000)
    assert not flt._bitmap_trusted(v1.born_time_ms + 500)
    reloaded = FilterRegistry(tmp_path, BloomFilter(), expire_s=3600).get("g", "T")
    assert reloaded is not None and reloaded.backfilled_until_ms == v1.born_time_ms
    with pytest.raises(ConfigError, match="version 1, not 2"):
        registry.record_backfill("g", "T", version=2, until_ms=1)
    v2 = registry.register("g", "T", compile_filter("SQL92", "a > 2"))
    assert v2.version == 2 and v2.backfilled_until_ms is None
    assert FilterRegistry(tmp_path, BloomFilter(), expire_s=3600).get("g", "T") == v2
    # a file whose coverage names another version loads without it
    saved = read_json(tmp_path / "filters.json", [])
    saved[0]["backfill"] = {"version": 1, "until_ms": 99}
    write_json(tmp_path / "filters.json", saved)
    assert FilterRegistry(tmp_path, BloomFilter(), expire_s=3600).get("g", "T").backfilled_until_ms is None  # type: ignore[union-attr]
    with pytest.raises(NotFoundError):
        registry.record_backfill("nobody", "T", version=1, until_ms=1)


def test_the_jobs_and_the_broker_read_and_write_one_registration_format(tmp_path: Path) -> None:
    registry = FilterRegistry(tmp_path, BloomFilter(), expire_s=3600)
    reg = registry.register("g", "T", compile_filter("SQL92", "a > 1"))
    registry.save()  # as the broker's sweep or stop does (a new registration is not written at once)
    jobs = RegistrationFile(tmp_path)
    [seen] = jobs.all()
    assert (seen.bloom_key, seen.version, seen.expression, seen.born_time_ms) == (
        "g#T",
        1,
        reg.expression,
        reg.born_time_ms,
    )
    until = reg.born_time_ms - 10
    assert jobs.record_backfill("g", "T", version=1, until_ms=until).backfilled_until_ms == until
    with pytest.raises(ConfigError, match="version 1, not 2"):
        jobs.record_backfill("g", "T", version=2, until_ms=until)
    loaded = FilterRegistry(tmp_path, BloomFilter(), expire_s=3600).get("g", "T")
    assert loaded is not None and loaded.backfilled_until_ms == until
    assert loaded.positions == RegistrationSpec.of(seen).positions


def test_reindex_passes_over_damaged_records_and_keeps_the_queue_offsets(spark: Any, tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    cfg = StoreConfig(data_dir=data_dir / "store", commit_log_segment_size=8 * 1024 * 1024)
    with MessageStore.open(cfg) as store:
        placed = [
            store.put_message(Message("T", f"m{i}".encode() * 50, queue_id=i % 2, properties={"TAGS": "t"}))
            for i in range(300)
        ]
        expected = {(r.queue_id, r.queue_offset): f"m{i}".encode() * 50 for i, r in enumerate(placed)}
    segment = data_dir / "store" / "commitlog" / f"{0:020d}"
    with open(segment, "r+b") as f:
        for at in (placed[100].commit_log_offset + 120, placed[201].commit_log_offset + 5):  # body, magic
            f.seek(at)
            byte = f.read(1)[0]
            f.seek(at)
            f.write(bytes([byte ^ 0x5A]))
    for kind in ("consumequeue", "consumequeue_ext"):
        shutil.rmtree(data_dir / "store" / kind)
    result = run_reindex(spark, data_dir)
    assert result.filled == 2 and result.records == 298
    assert [offset for offset, _ in result.damaged] == [placed[201].commit_log_offset]  # seen by the plan
    lost = {(placed[i].queue_id, placed[i].queue_offset) for i in (100, 201)}
    with MessageStore.open(cfg) as store:
        got: dict[tuple[int, int], bytes] = {}
        for queue_id in (0, 1):
            offset = 0
            while True:
                res = store.get_messages("g", "T", queue_id, offset, 64)
                got.update({(m.queue_id, m.queue_offset): m.body for m in res.messages})
                if res.next_begin_offset == offset or offset >= store.get_max_offset_in_queue("T", queue_id):
                    break
                offset = res.next_begin_offset
        assert got == {k: v for k, v in expected.items() if k not in lost}  # every other offset unchanged
        assert store.damaged_reads == 2  # the two fillers, passed over and counted


def test_reindex_gives_a_store_made_before_the_bitmap_check_checked_units(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A store made before the bitmap check: reindex rebuilds its units with checks and gives the
    tree the marker, and the broker reads them so. A queue it carries over (every record of it lost
    to damage) keeps its index; its old units, which describe no record, go with the old tree. In a
    store with checked units, a queue carried over keeps its units byte for byte."""
    data_dir = tmp_path / "data"
    store_dir = data_dir / "store"
    cfg = StoreConfig(data_dir=store_dir)
    ext_root = store_dir / "consumequeue_ext"
    with monkeypatch.context() as old_version:
        old_version.setattr(store_module, "units_checked", lambda root, mark_new: False)
        with MessageStore.open(cfg) as store:
            u = [Message("U", b"u%d" % i * 50, properties={"TAGS": "u"}) for i in range(4)]
            lost = [store.put_message(m) for m in u]
            for i in range(40):
                store.put_message(Message("T", f"m{i}".encode(), queue_id=i % 2, properties={"TAGS": "t"}))
    assert not (ext_root / CHECK_MARKER).exists() and (ext_root / "U" / "0").is_dir()
    for r in lost:
        flip_log_byte(store_dir, r.commit_log_offset + 120)  # the body: the CRC fails

    def reads_as_before() -> None:
        with MessageStore.open(cfg) as store:
            cq = store.find_consume_queue("T", 1)
            assert cq is not None and cq.ext is not None and cq.ext.checked
            unit = cq.ext.get(19)
            assert unit is not None and unit.tags_code == tags_code_of("t")
            assert [m.body for m in store.get_messages("g", "T", 1, 0, 64).messages] == [
                f"m{i}".encode() for i in range(1, 40, 2)
            ]
            carried = store.find_consume_queue("U", 0)
            assert carried is not None and carried.max_offset == 4
            assert carried.ext is not None and carried.ext.get(0) is None
            assert store.get_messages("g", "U", 0, 0, 64).messages == []

    result = run_reindex(spark, data_dir)
    assert (result.records, result.carried_over) == (40, 1)
    assert (ext_root / CHECK_MARKER).exists() and not (ext_root / "U").exists()
    reads_as_before()

    with MessageStore.open(cfg) as store:  # the store's units are checked now
        gone = [store.put_message(Message("V", b"v%d" % i * 50, properties={"TAGS": "v"})) for i in range(3)]
    units = tree_files(ext_root / "V")
    assert units
    for r in gone:
        flip_log_byte(store_dir, r.commit_log_offset + 120)
    result = run_reindex(spark, data_dir)
    assert (result.records, result.carried_over) == (40, 2)
    assert (ext_root / CHECK_MARKER).exists() and tree_files(ext_root / "V") == units
    reads_as_before()


def test_reindex_keeps_the_offsets_the_groups_progress_went_past(spark: Any, tmp_path: Path) -> None:
    """With a queue's index files lost, the groups' progress tells how far its offsets went: a queue
    whose last records were lost, and one whose records were all lost, keep them; the stale
    progress of a deleted topic makes no queue."""
    data_dir = tmp_path / "data"
    cfg = StoreConfig(data_dir=data_dir / "store", commit_log_segment_size=8 * 1024 * 1024)
    with MessageStore.open(cfg) as store:
        placed = [store.put_message(Message("T", b"m%d" % i * 50, queue_id=i % 3)) for i in range(30)]
    store_dir = data_dir / "store"
    # queue 0 loses its last two records, queue 1 all ten; queue 2 (the log's last record) none
    lost = [r for r in placed if r.queue_id == 1 or (r.queue_id == 0 and r.queue_offset >= 8)]
    for r in lost:
        flip_log_byte(store_dir, r.commit_log_offset + 120)  # the body: the CRC fails
    for kind in ("consumequeue", "consumequeue_ext"):
        for queue_id in (0, 1):
            shutil.rmtree(store_dir / kind / "T" / str(queue_id))
    config = data_dir / "config"
    write_json(
        config / "consumer_state.json",
        {"g\tT\t0": {"pop": 7, "inflight": [[6, 0, 0, 1, 0, 1]]}, "g\tT\t1": {"pop": 10, "inflight": []}},
    )
    write_json(config / "consumer_offsets.json", {"p\tT\t0": 10, "p\tGone\t0": 5})
    write_json(store_dir / "tombstones.json", {"Gone": 0})

    result = run_reindex(spark, data_dir)
    assert (result.records, result.filled, result.tail_filled) == (18, 0, 2 + 10)
    assert not (store_dir / "consumequeue" / "Gone").exists()
    with MessageStore.open(cfg) as store:
        assert [store.get_max_offset_in_queue("T", q) for q in range(3)] == [10, 10, 10]
        assert store.get_min_offset_in_queue("T", 1) == 10  # nothing left to read below
        got = store.get_messages("g", "T", 0, 0, 64)
        assert [m.body for m in got.messages] == [b"m%d" % (3 * i) * 50 for i in range(8)]
        again = [store.put_message(Message("T", b"new", queue_id=q)).queue_offset for q in range(3)]
        assert again == [10, 10, 10]


# --------------------------------------------------------------------------- backfill over damage


def ext_units(store: Path, spots: list[tuple[int, int]]) -> list[bytes]:
    layout = store_layout(store)
    units = []
    for queue_id, queue_offset in spots:
        ext = open_queue_ext(store, ORDERS, queue_id, layout)
        try:
            units.append(ext.read_units(queue_offset, 1).tobytes())
        finally:
            ext.log.close()
    return units


@pytest.fixture(scope="module")
def damaged_history(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    """A stopped broker's data dir: 400 messages of Orders before g-late registered, 200 after, and
    one record lost to damage in the middle of a queue, at the start of one, at the end of one (not
    the log's last record) and in the middle of the last, half with a flipped magic code (the plan
    passes over them), half with a flipped byte of a property (the CRC fails: the reads pass over)."""
    data_dir = tmp_path_factory.mktemp("damaged") / "data"
    history, recent = order_rows(400), order_rows(200, 400)
    broker = start(data_dir)
    try:
        produce(broker.endpoint, ORDERS, history)  # no SQL92 registration yet: no bitmaps
        register(broker.endpoint, "g-late", ORDERS, FilterExpression.sql92(SQL_EU))
        produce(broker.endpoint, ORDERS, recent)
    finally:
        assert broker.stop() == 0
    store = data_dir / "store"
    records = list(iter_records(store, topics=(ORDERS,)))
    assert len(records) == 600
    by_queue = {
        q: sorted((r for r in records if r.queue_id == q), key=lambda r: r.queue_offset) for q in range(4)
    }
    last_q = records[-1].queue_id
    end_q, start_q, mid_q, mid2_q = [q for q in range(4) if q != last_q] + [last_q]
    history_bodies = {body for body, _tag, _props in history}
    mid = [r for r in by_queue[mid_q] if r.body in history_bodies][40]
    mid2 = [r for r in by_queue[mid2_q] if r.body in history_bodies][70]
    damaged = {
        "start": (by_queue[start_q][0], 5),  # magic
        "middle": (mid, mid.store_size - 3),  # a property: CRC
        "end": (by_queue[end_q][-1], by_queue[end_q][-1].store_size - 3),
        "middle2": (mid2, 5),
    }
    for record, at in damaged.values():
        flip_log_byte(store, record.commit_log_offset + at)
    lost = {r.body for r, _ in damaged.values()}
    return data_dir, {
        "rows": [row for row in history + recent if row[0] not in lost],
        "spots": {name: (r.queue_id, r.queue_offset) for name, (r, _) in damaged.items()},
        "records": records,
    }


def copy_data(template: Path, tmp_path: Path) -> Path:
    data_dir = tmp_path / "data"
    shutil.copytree(template, data_dir)
    return data_dir


def check_served_after_backfill(
    data_dir: Path, rows: list[tuple[bytes, str, dict[str, str]]], lost: int
) -> None:
    """The broker serves g-late exactly the intact messages it matches, and skips the rest of the
    history by bitmap (the damaged offsets keep their units: at most ``lost`` more may match)."""
    late = FilterExpression.sql92(SQL_EU)
    wanted = expected(rows, "SQL92", SQL_EU)
    broker = start(data_dir)
    try:
        assert consume_all(broker.endpoint, "g-late", ORDERS, late) == wanted
        stats = filter_stats(broker, "g-late", ORDERS)
        assert len(wanted) <= stats["matching_lag"] <= len(wanted) + lost
        assert stats["skipped_by_bitmap"] >= len(rows) - len(wanted)
    finally:
        assert broker.stop() == 0


def test_backfill_passes_over_records_lost_to_damage(
    spark: Any, damaged_history: tuple[Path, dict[str, Any]], tmp_path: Path
) -> None:
    data_dir = copy_data(damaged_history[0], tmp_path)
    info = damaged_history[1]
    store = data_dir / "store"
    spots = list(info["spots"].values())
    units_before = ext_units(store, spots)
    cq_before = tree_files(store / "consumequeue")
    result = run_backfill(spark, data_dir, "g-late", ORDERS, target_bytes=16 * 1024)
    assert (result.records, result.queues, result.lost_to_damage) == (596, 4, 4)
    assert result.matched == len(expected(info["rows"], "SQL92", SQL_EU))
    assert result.created >= 400 - 3  # the history had no bitmaps (its damaged records get none)
    assert ext_units(store, spots) == units_before  # no new bits where a record was lost
    assert tree_files(store / "consumequeue") == cq_before
    assert RegistrationFile(data_dir / "config").get("g-late", ORDERS).backfilled_until_ms  # type: ignore[union-attr]
    check_served_after_backfill(data_dir, info["rows"], lost=4)


def test_backfill_after_a_reindex_passes_over_its_filler_entries(
    spark: Any, damaged_history: tuple[Path, dict[str, Any]], tmp_path: Path
) -> None:
    data_dir = copy_data(damaged_history[0], tmp_path)
    info = damaged_history[1]
    reindexed = run_reindex(spark, data_dir)
    # fillers for the two records lost between records of their queue and for the last record of
    # one (its offset was handed out); the queue that lost its first record now starts after it
    assert (reindexed.filled, reindexed.tail_filled, len(reindexed.damaged)) == (2, 1, 2)
    start_q, _ = info["spots"]["start"]
    cq = open_queue(data_dir / "store", ORDERS, start_q, store_layout(data_dir / "store"), ext=False)
    try:
        assert cq.min_offset == 1
    finally:
        cq.close()
    result = run_backfill(spark, data_dir, "g-late", ORDERS)
    assert (result.records, result.queues, result.lost_to_damage) == (596, 4, 3)
    check_served_after_backfill(data_dir, info["rows"], lost=3)


def put_entry(store: Path, queue_id: int, queue_offset: int, entry: tuple[int, int, int]) -> None:
    [segment] = (store / "consumequeue" / ORDERS / str(queue_id)).iterdir()  # one file holds the queue
    with open(segment, "r+b") as f:
        f.seek(queue_offset * CQ_STORE_UNIT_SIZE)
        f.write(encode_entry_columns(*([value] for value in entry)))


def test_backfill_refuses_a_consume_queue_entry_for_an_intact_record_it_did_not_read(
    spark: Any, damaged_history: tuple[Path, dict[str, Any]], tmp_path: Path
) -> None:
    data_dir = copy_data(damaged_history[0], tmp_path)
    info = damaged_history[1]
    store = data_dir / "store"
    spots = info["spots"]
    original = tree_files(store / "consumequeue")
    ext_before = tree_files(store / "consumequeue_ext")
    layout = store_layout(store)

    def max_offset(queue_id: int) -> int:
        cq = open_queue(store, ORDERS, queue_id, layout, ext=False)
        try:
            return cq.max_offset
        finally:
            cq.close()

    # the entry of a lost record (middle, start, end of a queue) made to point at an intact record;
    # and one more entry past a queue's last, pointing at an intact record of the queue itself
    cases = [spots[name] for name in ("middle", "start", "end")]
    mid_q = spots["middle"][0]
    cases.append((mid_q, max_offset(mid_q)))
    for queue_id, queue_offset in cases:
        if queue_offset < max_offset(queue_id):
            other = next(r for r in reversed(info["records"]) if r.queue_id != queue_id)
        else:
            other = next(r for r in info["records"] if r.queue_id == queue_id)
        put_entry(store, queue_id, queue_offset, (other.commit_log_offset, other.store_size, 0))
        with pytest.raises(
            StoreError, match=rf"(?s)run reindex first.*{ORDERS}:{queue_id}: .*offset {queue_offset}"
        ):
            run_backfill(spark, data_dir, "g-late", ORDERS)
        assert tree_files(store / "consumequeue_ext") == ext_before  # nothing installed
        assert not (store / STAGING_DIR).exists()
        assert RegistrationFile(data_dir / "config").get("g-late", ORDERS).backfilled_until_ms is None  # type: ignore[union-attr]
        for name, data in original.items():  # undo
            (store / "consumequeue" / name).write_bytes(data)


def test_backfill_after_retention_starts_each_queue_at_its_first_record_kept(
    spark: Any, tmp_path: Path
) -> None:
    """Every broker running long enough has had segments removed by retention, leaving index entries
    that point below the CommitLog's start: backfill took them for entries of records it did not read
    and refused every such store."""
    data_dir = tmp_path / "data"
    cfg = StoreConfig(data_dir=data_dir / "store", commit_log_segment_size=64 * 1024, max_message_size=4096)
    with MessageStore.open(cfg) as store:
        for i in range(600):
            store.put_message(Message("T", b"x" * 200, queue_id=i % 4, properties={"TAGS": "t", "a": str(i)}))
        store.flush()
        removed = store.delete_expired_files(now_ms=int(time.time() * 1000) + 10 * 24 * 3600 * 1000)
        assert removed.commit_log_segments >= 1
        kept = [int(m.properties["a"]) for m in iter_records(cfg.data_dir) if m.topic == "T"]
    assert 0 < len(kept) < 600
    registry = FilterRegistry(data_dir / "config", BloomFilter(), expire_s=3600)
    registry.register("g", "T", compile_filter("SQL92", "a > 500"))
    registry.save()
    result = run_backfill(spark, data_dir, "g", "T")
    assert (result.records, result.queues, result.lost_to_damage) == (len(kept), 4, 0)
    assert result.matched == sum(1 for a in kept if a > 500)


# ---------------------------------------------------------------------- a queue's last record lost

TAIL = "Tail"


def receive_acking(endpoint: str, group: str, want: int) -> list[Any]:
    """What ``group`` receives of ``TAIL`` (each acknowledged), until ``want`` came or none comes."""
    got: list[Any] = []
    idle = 0
    with blocking.SimpleConsumer(endpoint, group, {TAIL: FilterExpression.tag()}, await_duration=0.5) as c:
        while len(got) < want and idle < 3:
            batch = c.receive(32, 30)
            for m in batch:
                c.ack(m)
            got += batch
            idle = 0 if batch else idle + 1
    return got


def pull_broadcast(endpoint: str, offset_dir: Path, want: int) -> list[Any]:
    """What a broadcasting pull consumer (its positions kept in ``offset_dir``, as a client keeps
    them) reads of ``TAIL`` from where it left off, until ``want`` came or none comes; committed."""
    got: list[Any] = []
    idle = 0
    with blocking.PullConsumer(endpoint, "g-bcast", TAIL, mode="BROADCASTING", offset_dir=offset_dir) as c:
        while len(got) < want and idle < 3:
            batch = c.poll(64, 0.5)
            got += batch
            idle = 0 if batch else idle + 1
        c.commit()
    return got


@pytest.mark.parametrize("index_files", ["kept", "lost"])
def test_reindex_keeps_the_offsets_of_a_queue_whose_last_record_was_lost(
    spark: Any, tmp_path: Path, index_files: str
) -> None:
    """A queue's last record is lost to damage after every group consumed past it (the log goes on
    with other queues' records). The rebuilt queue keeps its offset with a filler, told by its old
    index files or, with those lost too, by the groups' progress: new messages get new offsets, and
    neither the receiving group nor a client that keeps its own position misses one."""
    data_dir = tmp_path / "data"
    offset_dir = tmp_path / "client-offsets"
    broker = start(data_dir)
    try:
        with blocking.Producer(broker.endpoint) as producer:
            first = [producer.send(TAIL, b"old-%d" % i) for i in range(40)]  # one queue a send
        assert len(receive_acking(broker.endpoint, "g-ack", 40)) == 40
        assert len(pull_broadcast(broker.endpoint, offset_dir, 40)) == 40
    finally:
        assert broker.stop() == 0

    store = data_dir / "store"
    records = list(iter_records(store, topics=(TAIL,)))
    assert len(records) == 40
    queue_id = next(
        q for q in range(4) if q != records[-1].queue_id and any(r.queue_id == q for r in records)
    )
    last = max((r for r in records if r.queue_id == queue_id), key=lambda r: r.queue_offset)
    handed_out = last.queue_offset + 1
    assert handed_out == 1 + max(r.queue_offset for r in first if r.queue_id == queue_id)
    flip_log_byte(store, last.commit_log_offset + last.store_size - 3)  # a property: the CRC fails
    if index_files == "lost":  # only the groups' progress tells how far the queue went
        for kind in ("consumequeue", "consumequeue_ext"):
            shutil.rmtree(store / kind / TAIL / str(queue_id))

    result = run_reindex(spark, data_dir)
    assert (result.records, result.filled, result.tail_filled) == (39, 0, 1)
    layout = store_layout(store)
    cq = open_queue(store, TAIL, queue_id, layout)
    try:  # a filler as the broker's recovery writes one at a queue's end: the log's end, no store time
        assert cq.max_offset == handed_out
        assert cq.get_entry(handed_out - 1) == (result.end_offset, 0, 0)
        assert cq.ext is not None
        assert cq.ext.read_units(handed_out - 1, 1).tobytes() == cq.ext.encode(0, 0, None)
    finally:
        cq.close()

    broker = start(data_dir)
    try:
        with blocking.Producer(broker.endpoint) as producer:
            new = [producer.send(TAIL, b"new-%d" % i) for i in range(20)]
        mine = sorted(r.queue_offset for r in new if r.queue_id == queue_id)
        assert mine and mine[0] == handed_out  # the lost record's offset stays taken
        fresh = {b"new-%d" % i for i in range(20)}
        assert {m.body for m in receive_acking(broker.endpoint, "g-ack", 20)} == fresh
        assert {m.body for m in pull_broadcast(broker.endpoint, offset_dir, 20)} == fresh
        assert "rebuilding them all" not in broker.log()
    finally:
        assert broker.stop() == 0


def zeroed_store(tmp_path: Path, segment_size: int = 8 * 1024 * 1024) -> tuple[Path, list[Any]]:
    """A cleanly stopped store of 60 messages of T (queue 0) whose record 20 starts with a zeroed
    512-byte sector: zeros where a record should start, with intact records after them."""
    data_dir = tmp_path / "data"
    cfg = StoreConfig(data_dir=data_dir / "store", commit_log_segment_size=segment_size)
    with MessageStore.open(cfg) as store:
        placed = [
            store.put_message(Message("T", b"m%04d" % i * 50, queue_id=0, properties={"a": str(i)}))
            for i in range(60)
        ]
    start = max(s for s in (int(p.name) for p in (data_dir / "store" / "commitlog").iterdir()))
    with open(data_dir / "store" / "commitlog" / f"{start:020d}", "r+b") as f:
        f.seek(placed[20].commit_log_offset - start)
        f.write(bytes(512))
    return data_dir, placed


def register_sql(data_dir: Path) -> None:
    registry = FilterRegistry(data_dir / "config", BloomFilter(), expire_s=3600)
    registry.register("g", "T", compile_filter("SQL92", "a > 1"))
    registry.save()


def readable(cfg: StoreConfig, queues: int = 1) -> dict[tuple[int, int], bytes]:
    """What the broker's store serves of topic T: (queue, queue offset) -> body."""
    got: dict[tuple[int, int], bytes] = {}
    with MessageStore.open(cfg) as store:
        for queue_id in range(queues):
            offset, end = 0, store.get_max_offset_in_queue("T", queue_id)
            while offset < end:
                res = store.get_messages("g", "T", queue_id, offset, 64)
                got.update({(m.queue_id, m.queue_offset): m.body for m in res.messages})
                if res.next_begin_offset <= offset:
                    break
                offset = res.next_begin_offset
    return got


def test_reindex_and_backfill_pass_over_zeros_with_intact_records_after_them(
    spark: Any, tmp_path: Path
) -> None:
    """Zeros where a record should start in a cleanly stopped store are damage to the jobs, as to
    the broker: the records they hit get fillers, and the intact records after them keep their
    queue offsets (the plan used to end at the zeros, and reindex then filled those offsets)."""
    data_dir, placed = zeroed_store(tmp_path)
    register_sql(data_dir)
    cfg = StoreConfig(data_dir=data_dir / "store", commit_log_segment_size=8 * 1024 * 1024)
    victim = placed[20].commit_log_offset
    lost = [r for r in placed if victim <= r.commit_log_offset < victim + 512]
    before = readable(cfg)  # the broker passes over the zeros, and keeps them
    assert len(before) == len(placed) - len(lost) and len(lost) >= 1
    result = run_reindex(spark, data_dir)
    assert (result.records, result.filled, result.tail_filled) == (len(before), len(lost), 0)
    assert [offset for offset, _ in result.damaged] == [victim]
    assert readable(cfg) == before
    done = run_backfill(spark, data_dir, "g", "T")
    assert (done.records, done.lost_to_damage) == (len(before), len(lost))
    assert readable(cfg) == before


def test_reindex_and_backfill_pass_over_a_missing_segment_file(spark: Any, tmp_path: Path) -> None:
    """The broker serves the segments after a missing file; the jobs read them too, and the records
    of the missing file get fillers (the plan used to end at the gap, and the jobs refused)."""
    data_dir = tmp_path / "data"
    cfg = StoreConfig(
        data_dir=data_dir / "store", commit_log_segment_size=64 * 1024, max_message_size=16 * 1024
    )
    with MessageStore.open(cfg) as store:
        placed = [
            store.put_message(Message("T", b"m%04d" % i * 50, queue_id=i % 2, properties={"a": str(i)}))
            for i in range(400)
        ]
    register_sql(data_dir)
    segments = sorted((data_dir / "store" / "commitlog").iterdir())
    assert len(segments) >= 3
    segments[1].unlink()
    missing = range(int(segments[1].name), int(segments[2].name))
    lost = [r for r in placed if r.commit_log_offset in missing]
    before = readable(cfg, queues=2)
    assert len(before) == len(placed) - len(lost) and lost
    result = run_reindex(spark, data_dir)
    assert (result.records, result.filled, result.tail_filled) == (len(before), len(lost), 0)
    assert result.damaged == ((missing.start, missing.stop - missing.start),)
    assert readable(cfg, queues=2) == before
    done = run_backfill(spark, data_dir, "g", "T")
    assert (done.records, done.lost_to_damage) == (len(before), len(lost))
    assert readable(cfg, queues=2) == before


def test_a_plan_that_ends_before_the_data_does_is_refused(spark: Any, tmp_path: Path) -> None:
    """A plan handed to a job that ends at zeros with data after them leaves records out: refused."""
    data_dir, placed = zeroed_store(tmp_path)
    store = data_dir / "store"
    short = plan_scan(store, end_offset=placed[20].commit_log_offset, stopped_cleanly=True)
    assert short.stop_reason is None
    with pytest.raises(StoreError, match="store check") as caught:
        run_reindex(spark, data_dir, plan=short)
    assert str(placed[20].commit_log_offset) in str(caught.value)
