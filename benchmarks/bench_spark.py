"""Spark bulk-job benchmark: ``siftmq spark scan`` over a large store vs a single-process Python scan.

Run: ``.venv/bin/python benchmarks/bench_spark.py [--size-gib 1.0] [--dir DIR] [--master local[*]]``.
Not collected by pytest.

A store of at least ``--size-gib`` is written directly with ``MessageStore.put_messages`` (1 KiB
bodies; topics Orders 50 %, Payments 30 %, Audit 20 %; tags TagA..TagD and region eu/us/apac/latam
uniform, price = i % 100), so the filters have known selectivities on Orders:

* SQL92 ``region = 'eu' AND price > 50``: about 12 % (1/4 of the regions × 49/100 of the prices);
* TAG ``TagA || TagB``: 50 %.

Every measurement reads the same store in the same run and reports records scanned per second
(every record of the log is read and verified), MiB/s of log, and the matches, which must agree
between all paths:

* ``python``: :func:`siftmq.store.bulk.iter_records` (``decoding.decode_record`` per record) plus
  ``CompiledFilter.matches`` — the plain single-process reference;
* ``bulk reader``: :func:`siftmq.store.bulk.read_range` over every range in one process, filter
  evaluated with ``CompiledFilter.matches_batch`` (pyarrow);
* ``spark count``: the scan job's DataFrame counted on ``--master``, with the reader's prefilter
  (only matching rows reach the JVM, where Spark evaluates the translated filter again) and
  without it (every row of the topic goes to Spark, which alone filters);
* ``spark scan``: the whole job (:func:`siftmq.spark.jobs.scan.run_scan`, Parquet written).

With ``--dir`` the store is kept and reused by later runs of the same size.

The data-source half (``--source-messages N``, 0 skips it) runs a real broker, sends N messages of
1 KiB whose hot property ``sel1`` is ``y`` on 1 % and ``sel10`` on 10 % of them, and reads each
selection through ``spark.read.format("siftmq")`` twice: with the ``filter`` option (the broker
filters) and with a Spark ``filter`` (every message crosses the network, Spark filters; Spark 4.3
pushes no narrowing predicate into the source, ``docs/spark-source.md``). It reports matched rows/s
and the body bytes the broker delivered, from its ``siftmq_message_bytes_delivered`` metric.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from siftmq.filter import CompiledFilter, compile_filter
from siftmq.store import Message, MessageStore, StoreConfig, bulk

MIB = 1024 * 1024
GIB = 1024 * MIB
TOPIC = "Orders"
TOPICS = ("Orders",) * 5 + ("Payments",) * 3 + ("Audit",) * 2
REGIONS = ("eu", "us", "apac", "latam")
FILTERS = (("SQL92", "region = 'eu' AND price > 50"), ("TAG", "TagA || TagB"))
BATCH = 4096


@dataclass(frozen=True)
class Measurement:
    path: str
    filter: str
    seconds: float
    records: int
    log_bytes: int
    matched: int

    @property
    def records_per_s(self) -> float:
        return self.records / self.seconds

    @property
    def mib_per_s(self) -> float:
        return self.log_bytes / MIB / self.seconds


def build_store(store_dir: Path, size_gib: float) -> None:
    """Write 1 KiB messages until the CommitLog holds ``size_gib``; reuse a store already that big."""
    marker = store_dir / "bench-size"
    if marker.exists() and float(marker.read_text()) >= size_gib:
        return
    if store_dir.exists():
        shutil.rmtree(store_dir)
    target = int(size_gib * GIB)
    started = time.perf_counter()
    with MessageStore.open(StoreConfig(store_dir, build_key_index=False)) as store:
        i = 0
        while store.max_commit_log_offset < target:
            body = os.urandom(1024)
            batch = []
            for _ in range(BATCH):
                props = {
                    "TAGS": f"Tag{'ABCD'[i % 4]}",
                    "KEYS": f"order-{i}",
                    "UNIQ_KEY": f"ID{i:012d}",
                    "region": REGIONS[(i // 4) % 4],
                    "price": str(i % 100),
                }
                batch.append(Message(TOPICS[i % 10], body, queue_id=i % 8, properties=props))
                i += 1
            store.put_messages(batch)
        size = store.max_commit_log_offset
    marker.write_text(str(size_gib))
    elapsed = time.perf_counter() - started
    print(f"wrote {i} messages, {size / GIB:.2f} GiB in {elapsed:.1f} s", flush=True)


def timed(fn: Callable[[], Any], repeat: int) -> tuple[float, Any]:
    """Median seconds of ``repeat`` runs and the last result."""
    times = []
    result = None
    for _ in range(repeat):
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), result


def measure_python(
    store_dir: Path, compiled: CompiledFilter, plan: bulk.ScanPlan, repeat: int
) -> Measurement:
    """The single-process reference: decoding.decode_record per record, then the scalar filter."""

    def run() -> int:
        return sum(1 for m in bulk.iter_records(store_dir, topics=[TOPIC]) if compiled.matches(m.properties))

    seconds, matched = timed(run, repeat)
    return Measurement(
        "python (decode_record + matches)", compiled.text, seconds, plan.records, plan.bytes, matched
    )


def measure_bulk_reader(compiled: CompiledFilter, plan: bulk.ScanPlan, repeat: int) -> Measurement:
    """The bulk reader in one process: read_range over every range, the filter vectorized."""
    from siftmq.spark.jobs.common import properties_row_filter

    where = properties_row_filter(compiled)

    def run() -> int:
        return sum(b.num_rows for r in plan.ranges for b in bulk.read_range(r, topics=[TOPIC], where=where))

    seconds, matched = timed(run, repeat)
    return Measurement(
        "bulk reader, 1 process (arrow)", compiled.text, seconds, plan.records, plan.bytes, matched
    )


def measure_spark_count(
    spark: Any,
    store_dir: Path,
    compiled: CompiledFilter,
    plan: bulk.ScanPlan,
    *,
    prefilter: bool,
    repeat: int,
) -> Measurement:
    """The scan job's DataFrame (read, topic pruning, filter on Spark) counted; ``prefilter`` as in
    :func:`siftmq.spark.jobs.scan.scan_dataframe` (False: every row of the topic goes to the JVM)."""
    from siftmq.spark.jobs.scan import scan_dataframe

    def run() -> int:
        return int(scan_dataframe(spark, store_dir, TOPIC, compiled, plan=plan, prefilter=prefilter).count())

    seconds, matched = timed(run, repeat)
    path = "spark count" + ("" if prefilter else ", no prefilter")
    return Measurement(path, compiled.text, seconds, plan.records, plan.bytes, matched)


def measure_spark_scan(
    spark: Any, store_dir: Path, compiled: CompiledFilter, plan: bulk.ScanPlan, *, out: Path, repeat: int
) -> Measurement:
    """The whole ``scan`` job: matching messages written to Parquet."""
    from siftmq.spark.jobs.scan import run_scan

    def run() -> int:
        return run_scan(spark, store_dir, TOPIC, out, compiled=compiled, overwrite=True, plan=plan).messages

    seconds, matched = timed(run, repeat)
    return Measurement("spark scan -> Parquet", compiled.text, seconds, plan.records, plan.bytes, matched)


SOURCE_TOPIC = "SparkBench"


def _delivered_bytes(admin_url: str) -> float:
    import httpx

    text = httpx.get(f"{admin_url}/metrics", timeout=30).text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("siftmq_message_bytes_delivered_total{")
    )


def measure_source(spark: Any, messages: int) -> list[tuple[str, float, int, float]]:
    """(case, seconds, matched rows, body bytes delivered) for reads through the broker."""
    from siftmq.client import blocking
    from siftmq.testing import running_broker

    body = os.urandom(1024)
    out = []
    with running_broker(config={"default_queue_nums": 4}) as broker:
        with blocking.Producer(broker.endpoint) as producer:
            for first in range(0, messages, 512):
                producer.send_many(
                    [
                        producer.message(
                            SOURCE_TOPIC,
                            body,
                            tag="T",
                            properties={
                                "sel1": "y" if i % 100 == 0 else "n",
                                "sel10": "y" if i % 10 == 0 else "n",
                            },
                        )
                        for i in range(first, min(first + 512, messages))
                    ]
                )
        for column, share in (("sel1", "1%"), ("sel10", "10%")):
            for on_broker in (True, False):
                before = _delivered_bytes(broker.admin_url)
                start = time.perf_counter()
                read = (
                    spark.read.format("siftmq")
                    .option("endpoints", broker.endpoint)
                    .option("topic", SOURCE_TOPIC)
                    .option("properties", "sel1,sel10")
                )
                predicate = f"{column} = 'y'"
                df = read.option("filter", predicate).load() if on_broker else read.load().filter(predicate)
                matched = int(df.count())
                seconds = time.perf_counter() - start
                delivered = _delivered_bytes(broker.admin_url) - before
                case = f"{share} selective, {'broker' if on_broker else 'Spark'} filters"
                out.append((case, seconds, matched, delivered))
    return out


def print_source_table(messages: int, rows: list[tuple[str, float, int, float]]) -> None:
    print(f"\nspark.read.format('siftmq') through a broker, {messages:,} messages of 1 KiB")
    header = f"{'case':32} {'seconds':>8} {'matched':>8} {'matched/s':>10} {'MiB delivered':>14}"
    print(header)
    print("-" * len(header))
    for case, seconds, matched, delivered in rows:
        print(f"{case:32} {seconds:8.2f} {matched:8,d} {matched / seconds:10,.0f} {delivered / MIB:14.1f}")


def machine() -> str:
    cpu = platform.processor() or "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / GIB
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    return (
        f"{os.cpu_count()} cores ({cpu}), {mem:.0f} GiB RAM, load {load}, Python {platform.python_version()}"
    )


def print_table(rows: list[Measurement]) -> None:
    header = (
        f"{'path':34} {'filter':30} {'seconds':>8} {'records/s':>11} {'MiB/s':>8} {'matched':>9} "
        f"{'× python':>9}"
    )
    print(header)
    print("-" * len(header))
    base = {r.filter: r.records_per_s for r in rows if r.path.startswith("python")}
    for r in rows:
        ratio = r.records_per_s / base[r.filter] if r.filter in base else float("nan")
        print(
            f"{r.path:34} {r.filter[:30]:30} {r.seconds:8.2f} {r.records_per_s:11,.0f} {r.mib_per_s:8.1f} "
            f"{r.matched:9,d} {ratio:9.2f}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size-gib", type=float, default=1.0, help="CommitLog size to build [1.0]")
    parser.add_argument("--dir", type=Path, default=None, help="keep (and reuse) the store here")
    parser.add_argument("--master", default="local[*]")
    parser.add_argument("--repeat", type=int, default=1, help="runs per measurement (median) [1]")
    parser.add_argument("--skip-python", action="store_true", help="skip the slow single-process paths")
    parser.add_argument(
        "--source-messages", type=int, default=20_000, help="data-source half: messages (0 skips)"
    )
    args = parser.parse_args()

    tmp = None
    if args.dir is None:
        tmp = tempfile.mkdtemp(prefix="siftmq-bench-spark-")
        root = Path(tmp)
    else:
        root = args.dir
        root.mkdir(parents=True, exist_ok=True)
    try:
        store_dir = root / "store"
        build_store(store_dir, args.size_gib)
        plan = bulk.plan_scan(store_dir)
        print(f"{datetime.date.today()}  {machine()}")
        print(f"store: {plan.records:,} records, {plan.bytes / GIB:.2f} GiB of CommitLog")
        rows: list[Measurement] = []
        compiled = [compile_filter(kind, text) for kind, text in FILTERS]
        if not args.skip_python:
            for flt in compiled:
                rows.append(measure_python(store_dir, flt, plan, args.repeat))
                rows.append(measure_bulk_reader(flt, plan, args.repeat))
        from siftmq.spark.jobs.common import plan_commitlog
        from siftmq.spark.session import build_session

        spark = build_session(
            args.master, app_name="siftmq bench", driver_memory="2g", work_dir=root / "spark"
        )
        try:
            spark_plan = plan_commitlog(spark, store_dir)
            warm = compile_filter("TAG", "*")
            measure_spark_count(spark, store_dir, warm, spark_plan, prefilter=True, repeat=1)  # warm-up
            for flt in compiled:
                for prefilter in (False, True):
                    rows.append(
                        measure_spark_count(
                            spark, store_dir, flt, spark_plan, prefilter=prefilter, repeat=args.repeat
                        )
                    )
                rows.append(
                    measure_spark_scan(
                        spark, store_dir, flt, spark_plan, out=root / "out", repeat=args.repeat
                    )
                )
            source_rows = measure_source(spark, args.source_messages) if args.source_messages else []
        finally:
            spark.stop()
        print(f"spark: {args.master}, {len(spark_plan.ranges)} ranges")
        print_table(rows)
        for flt in compiled:
            counts = {r.matched for r in rows if r.filter == flt.text}
            status = "agree" if len(counts) == 1 else "DISAGREE"
            print(f"matches for {flt.kind} {flt.text!r}: {status} {sorted(counts)}")
        if source_rows:
            print_source_table(args.source_messages, source_rows)
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
