"""``siftmq spark scan``: the messages of one topic that match a TAG or SQL92 filter, to Parquet.

The store's CommitLog is read in parallel byte ranges (:mod:`siftmq.spark.jobs.common`); records of
other topics are dropped in the reader, and the filter is translated to a Spark column
(:func:`siftmq.filter.backends.spark.to_spark_column`), so Spark's engine evaluates it — TRUE
exactly where the broker would deliver the message. By default the reader also pre-filters with
the vectorized pyarrow evaluator (pushdown), so non-matching messages never cross into the JVM.
The Parquet rows have the columns of :data:`siftmq.store.bulk.RECORD_SCHEMA` (``properties`` holds
TAGS, KEYS and UNIQ_KEY too).

Read-only: the job may run while a broker has the store open and then scans the records complete
when it planned (later appends are not included). Retention deleting a segment during the scan
fails the job with a StoreError.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from siftmq.filter import CompiledFilter
from siftmq.spark.jobs.common import ProgressCallback, commitlog_dataframe, plan_commitlog, run_tracked
from siftmq.store.bulk import ScanPlan


@dataclass(frozen=True, slots=True)
class ScanResult:
    """What a scan wrote: ``messages`` rows (``bytes`` of records) out of ``plan.records`` scanned."""

    out: str
    topic: str
    filter_kind: str | None
    expression: str | None
    messages: int
    bytes: int
    plan: ScanPlan
    seconds: float


def filter_column(compiled: CompiledFilter, properties: str | Column = "properties") -> Column:
    """A boolean column, TRUE exactly where ``compiled.matches(properties)`` (never NULL)."""
    from siftmq.filter.backends.spark import to_spark_column

    return to_spark_column(compiled, properties)


def scan_dataframe(
    spark: SparkSession,
    store_dir: Path,
    topic: str,
    compiled: CompiledFilter | None = None,
    *,
    plan: ScanPlan | None = None,
    target_bytes: int | None = None,
    prefilter: bool = True,
) -> DataFrame:
    """The messages of ``topic`` in ``store_dir`` (a MessageStore directory) matching ``compiled``.

    Spark evaluates the filter (:func:`filter_column`). With ``prefilter`` the reader also drops
    the rows the vectorized pyarrow evaluator does not match before they reach the JVM, as a source
    that supports filter pushdown does; both evaluators give RocketMQ's result, so the rows are the
    same, only fewer cross from Python into Spark.
    """
    df = commitlog_dataframe(
        spark,
        store_dir,
        topics=[topic],
        plan=plan,
        target_bytes=target_bytes,
        prefilter=compiled if prefilter else None,
    )
    if compiled is not None:
        df = df.where(filter_column(compiled))
    return df


def run_scan(
    spark: SparkSession,
    store_dir: Path,
    topic: str,
    out: str | Path,
    *,
    compiled: CompiledFilter | None = None,
    overwrite: bool = False,
    plan: ScanPlan | None = None,
    target_bytes: int | None = None,
    prefilter: bool = True,
    on_progress: ProgressCallback | None = None,
) -> ScanResult:
    """Write the matching messages of ``topic`` to Parquet at ``out`` and count them.

    Without ``overwrite`` an existing ``out`` fails the job (Spark's ``errorifexists``).
    """
    started = time.monotonic()
    if plan is None:
        plan = plan_commitlog(spark, store_dir, target_bytes=target_bytes)
    df = scan_dataframe(spark, store_dir, topic, compiled, plan=plan, prefilter=prefilter)
    target = str(out)

    def action() -> Any:
        df.write.mode("overwrite" if overwrite else "errorifexists").parquet(target)
        return (
            spark.read.parquet(target)
            .agg(F.count(F.lit(1)).alias("n"), F.coalesce(F.sum("store_size"), F.lit(0)).alias("bytes"))
            .first()
        )

    totals = run_tracked(spark, action, on_progress, description=f"siftmq scan {topic}")
    return ScanResult(
        out=target,
        topic=topic,
        filter_kind=None if compiled is None else compiled.kind,
        expression=None if compiled is None else compiled.text,
        messages=int(totals["n"]),
        bytes=int(totals["bytes"]),
        plan=plan,
        seconds=time.monotonic() - started,
    )
