"""``siftmq spark stats``: per subscription of a topic, what a broker-side filter matches and saves.

The subscriptions are the consumer groups' entries for the topic in ``<data-dir>/config/groups.json``
(group × filter kind × expression). The topic's records are read once (bodies skipped) and every
distinct filter becomes one boolean column (:func:`siftmq.spark.jobs.scan.filter_column`), so all
subscriptions are counted in a single aggregation. For each subscription:

* ``messages``/``bytes``: the topic's stored messages and their record bytes (``store_size``);
* ``matched``/``matched_bytes``: those the filter delivers;
* ``selectivity``: ``matched / messages`` (None for an empty topic);
* ``bytes_saved``: ``bytes - matched_bytes``, the records a client-side filter would have received
  and dropped, which a broker-side filter never sends.

An expression that no longer compiles (or cannot be translated) is reported in ``error`` instead of
failing the whole job. Read-only, like the scan: a store a broker has open may be read.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Final

import pyarrow as pa
from pyspark.sql import Column, SparkSession
from pyspark.sql import functions as F

from siftmq.errors import ConfigError, FilterError
from siftmq.filter import CompiledFilter, compile_filter
from siftmq.spark.jobs.common import ProgressCallback, commitlog_dataframe, plan_commitlog, run_tracked
from siftmq.spark.jobs.scan import filter_column
from siftmq.store.bulk import ScanPlan
from siftmq.store.statefile import peek_json

GROUPS_FILE: Final = Path("config") / "groups.json"
PARQUET_NAME: Final = "stats.parquet"
PLOT_NAME: Final = "selectivity.png"

STATS_SCHEMA: Final = pa.schema(
    [
        pa.field("group", pa.string(), nullable=False),
        pa.field("topic", pa.string(), nullable=False),
        pa.field("kind", pa.string(), nullable=False),
        pa.field("expression", pa.string(), nullable=False),
        pa.field("messages", pa.int64(), nullable=False),
        pa.field("bytes", pa.int64(), nullable=False),
        pa.field("matched", pa.int64()),
        pa.field("matched_bytes", pa.int64()),
        pa.field("selectivity", pa.float64()),
        pa.field("bytes_saved", pa.int64()),
        pa.field("error", pa.string()),
    ]
)


@dataclass(frozen=True, slots=True)
class Subscription:
    """One consumer group's subscription of one topic."""

    group: str
    topic: str
    kind: str
    expression: str


@dataclass(frozen=True, slots=True)
class SubscriptionStats:
    """One row of the stats table (see the module doc); ``matched`` etc. are None with ``error``."""

    group: str
    topic: str
    kind: str
    expression: str
    messages: int
    bytes: int
    matched: int | None
    matched_bytes: int | None
    selectivity: float | None
    bytes_saved: int | None
    error: str | None = None


@dataclass(frozen=True, slots=True)
class StatsResult:
    topic: str
    messages: int
    bytes: int
    rows: list[SubscriptionStats]
    plan: ScanPlan
    parquet: Path | None
    plot: Path | None
    seconds: float


def read_subscriptions(data_dir: Path, topic: str | None = None) -> list[Subscription]:
    """The groups' subscriptions in ``<data_dir>/config/groups.json`` (of ``topic`` when given).

    A missing file means no subscriptions; an unreadable or malformed one raises
    :class:`ConfigError`. The file is only read (the broker owns it).
    """
    path = Path(data_dir) / GROUPS_FILE
    try:
        groups = peek_json(path, {})
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc}") from exc
    try:
        subs = [
            Subscription(str(group), str(sub_topic), str(sub["kind"]), str(sub["expression"]))
            for group, info in groups.items()
            for sub_topic, sub in info.get("subscriptions", {}).items()
        ]
    except (ValueError, AttributeError, KeyError, TypeError) as exc:
        raise ConfigError(f"{path} is not a groups file the broker wrote ({exc!r})") from exc
    return sorted(
        (s for s in subs if topic is None or s.topic == topic), key=lambda s: (s.group, s.kind, s.expression)
    )


def _compile(sub: Subscription) -> tuple[CompiledFilter | None, Column | None, str | None]:
    try:
        compiled = compile_filter(sub.kind, sub.expression)
        return compiled, filter_column(compiled), None
    except FilterError as exc:
        return None, None, f"{type(exc).__name__}: {exc}"


def compute_stats(
    spark: SparkSession,
    store_dir: Path,
    topic: str,
    subscriptions: list[Subscription],
    *,
    plan: ScanPlan | None = None,
    target_bytes: int | None = None,
    on_progress: ProgressCallback | None = None,
) -> tuple[int, int, list[SubscriptionStats]]:
    """``(messages, bytes, rows)`` of ``topic``: one pass over its records for every subscription."""
    if plan is None:
        plan = plan_commitlog(spark, store_dir, target_bytes=target_bytes)
    columns: dict[tuple[str, str], int] = {}  # (kind, normalized expression) -> column index
    compiled: list[tuple[Subscription, int | None, str | None]] = []
    aggregates = [
        F.count(F.lit(1)).alias("messages"),
        F.coalesce(F.sum("store_size"), F.lit(0)).alias("bytes"),
    ]
    for sub in subscriptions:
        flt, column, error = _compile(sub)
        if flt is None or column is None:
            compiled.append((sub, None, error))
            continue
        key = (flt.kind, flt.normalized)
        index = columns.get(key)
        if index is None:
            index = columns[key] = len(columns)
            hit = F.when(column, 1).otherwise(0)
            aggregates.append(F.coalesce(F.sum(hit), F.lit(0)).alias(f"m{index}"))
            aggregates.append(
                F.coalesce(F.sum(F.when(column, F.col("store_size")).otherwise(0)), F.lit(0)).alias(
                    f"b{index}"
                )
            )
        compiled.append((sub, index, None))
    df = commitlog_dataframe(spark, store_dir, topics=[topic], with_body=False, plan=plan)
    totals: Any = run_tracked(
        spark, lambda: df.agg(*aggregates).first(), on_progress, description=f"siftmq stats {topic}"
    )
    messages, size = int(totals["messages"]), int(totals["bytes"])
    rows = []
    for sub, index, error in compiled:
        if index is None:
            rows.append(SubscriptionStats(*_identity(sub), messages, size, None, None, None, None, error))
            continue
        matched, matched_bytes = int(totals[f"m{index}"]), int(totals[f"b{index}"])
        rows.append(
            SubscriptionStats(
                *_identity(sub),
                messages,
                size,
                matched,
                matched_bytes,
                matched / messages if messages else None,
                size - matched_bytes,
            )
        )
    return messages, size, rows


def _identity(sub: Subscription) -> tuple[str, str, str, str]:
    return sub.group, sub.topic, sub.kind, sub.expression


def write_parquet(rows: list[SubscriptionStats], path: Path) -> None:
    """The stats rows as one Parquet file of :data:`STATS_SCHEMA`."""
    import pyarrow.parquet as pq

    table = pa.Table.from_pylist([asdict(r) for r in rows], schema=STATS_SCHEMA)
    pq.write_table(table, path)


def plot_selectivity(rows: list[SubscriptionStats], path: Path, *, topic: str, messages: int) -> None:
    """A horizontal bar chart of selectivity per subscription, as PNG (no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    shown = [r for r in rows if r.selectivity is not None]
    labels = [f"{r.group}\n{r.kind} {_shorten(r.expression)}" for r in shown]
    values = [100 * (r.selectivity or 0.0) for r in shown]
    fig, ax = plt.subplots(figsize=(9, 1.2 + 0.6 * max(1, len(shown))))
    try:
        bars = ax.barh(range(len(shown)), values, color="#3b7dd8")
        ax.set_yticks(range(len(shown)), labels, fontsize=8)
        ax.invert_yaxis()
        ax.set_xlim(0, 105)
        ax.set_xlabel("selectivity (% of the topic's messages delivered)")
        ax.set_title(f"topic {topic}: {messages} messages")
        for bar, value in zip(bars, values, strict=True):
            ax.text(value + 1, bar.get_y() + bar.get_height() / 2, f"{value:.1f}%", va="center", fontsize=8)
        if not shown:
            ax.text(50, 0, "no subscription to show", ha="center", va="center")
        fig.tight_layout()
        fig.savefig(path, dpi=100)
    finally:
        plt.close(fig)


def _shorten(text: str, width: int = 48) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def run_stats(
    spark: SparkSession,
    data_dir: Path,
    topic: str,
    out_dir: Path | None,
    *,
    plan: ScanPlan | None = None,
    target_bytes: int | None = None,
    on_progress: ProgressCallback | None = None,
) -> StatsResult:
    """Stats of ``topic`` for the broker data directory ``data_dir``; with ``out_dir``, also
    ``stats.parquet`` and ``selectivity.png`` written there."""
    started = time.monotonic()
    store_dir = Path(data_dir) / "store"
    subscriptions = read_subscriptions(data_dir, topic)
    if plan is None:
        plan = plan_commitlog(spark, store_dir, target_bytes=target_bytes)
    messages, size, rows = compute_stats(
        spark, store_dir, topic, subscriptions, plan=plan, on_progress=on_progress
    )
    parquet = plot = None
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
        parquet, plot = out_dir / PARQUET_NAME, out_dir / PLOT_NAME
        write_parquet(rows, parquet)
        plot_selectivity(rows, plot, topic=topic, messages=messages)
    return StatsResult(topic, messages, size, rows, plan, parquet, plot, time.monotonic() - started)
