"""``siftmq spark ...``: bulk Spark jobs over a broker's data directory, printed as tables.

Every job reads ``<data-dir>/store``'s CommitLog segment files directly, in parallel byte ranges
(not through a broker). ``scan`` and ``stats`` only read, so they may run while a broker has the
store open: they see the records complete when the job planned, and say that the store is in use.

A job is one function: it takes the shared options, opens a :func:`spark_job` (store checks, Spark
session, progress display, error reporting, session stop) and prints its result. Importing this
module does not import pyspark; the commands import it when they run.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table

from siftmq.cli.console import err as _err
from siftmq.cli.console import error, note
from siftmq.cli.console import out as _out

if TYPE_CHECKING:
    from siftmq.filter import CompiledFilter
    from siftmq.spark.jobs.common import JobProgress
    from siftmq.store.bulk import ScanPlan

spark_app = typer.Typer(
    no_args_is_help=True,
    help="Bulk Spark jobs over a broker's store (reads its segment files directly; needs the spark extra).",
)

DataDirOption = Annotated[
    Path, typer.Option("--data-dir", help="The broker's data directory (the store is <data-dir>/store).")
]
MasterOption = Annotated[str, typer.Option("--master", help="Spark master URL.")]
TopicOption = Annotated[str, typer.Option("--topic", help="The topic to read.")]
DEFAULT_MASTER = "local[*]"
MIB = 1024 * 1024


class JobFailed(Exception):
    """A job-level failure with a message for the user (exit code 1)."""


@dataclass
class JobContext:
    """What a running ``siftmq spark`` command gets from :func:`spark_job`."""

    data_dir: Path
    store_dir: Path
    spark: Any
    in_use: bool

    def plan(self, *, stopped_cleanly: bool = False) -> ScanPlan:
        """Plan the CommitLog's byte ranges (on this machine), reporting what was found.

        ``stopped_cleanly`` for the jobs that refuse a store not closed cleanly (reindex, backfill):
        the log is planned as the broker's recovery scans it (see :func:`siftmq.store.bulk.plan_scan`)."""
        from siftmq.spark.jobs.common import plan_commitlog, ranges_summary
        from siftmq.store.bulk import LOG_GAP

        with _err.status("planning byte ranges of the commit log ..."):
            plan = plan_commitlog(self.spark, self.store_dir, stopped_cleanly=stopped_cleanly)
        _err.print(f"planned {ranges_summary(plan.ranges)}: {plan.records} records", markup=False)
        if plan.stop_reason is not None:
            note(
                f"the commit log ends early ({plan.stop_reason}); "
                + (
                    "a broker is writing it"
                    if self.in_use
                    else "run `siftmq store check`: a missing segment file is not settled by the broker"
                    if plan.stop_reason.endswith(LOG_GAP)
                    else "a torn tail the broker's recovery will cut"
                )
            )
        return plan

    @contextlib.contextmanager
    def progress(self, description: str) -> Iterator[Callable[[JobProgress], None]]:
        """A progress bar of Spark tasks; yields the callback for ``run_tracked``."""
        with Progress(
            SpinnerColumn(),
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("tasks"),
            TimeElapsedColumn(),
            console=_err,
            transient=False,
        ) as bar:
            task = bar.add_task(description, total=None)

            def update(p: JobProgress) -> None:
                bar.update(task, total=max(p.total, 1) if p.total else None, completed=p.done)

            yield update
            bar.update(task, completed=bar.tasks[task].total or 0)


def _fail(message: str) -> typer.Exit:
    error(message)
    return typer.Exit(1)


@contextlib.contextmanager
def spark_job(
    data_dir: Path, master: str, name: str, *, allow_open_store: bool = True
) -> Iterator[JobContext]:
    """Check the store, start Spark, yield the job context, stop Spark; failures exit 1 with a message.

    A Spark session already active in this process is used (and left running) instead.

    ``allow_open_store=False`` refuses a store a broker has open (for jobs that write).
    """
    from siftmq.errors import SiftError

    try:
        from siftmq.spark.jobs.common import store_dir_of, store_in_use
    except ImportError as exc:
        raise _fail(
            f"the Spark jobs need PySpark and matplotlib: pip install 'siftmq[spark]' ({exc})"
        ) from None
    try:
        store_dir = store_dir_of(data_dir)
    except SiftError as exc:
        raise _fail(str(exc)) from None
    in_use = store_in_use(store_dir)
    if in_use and not allow_open_store:
        raise _fail(f"a broker has {store_dir} open; stop it before running {name}")
    if in_use:
        note(f"a broker has {store_dir} open; reading the records stored so far (not later appends)")
    from pyspark.sql import SparkSession

    from siftmq.spark.session import build_session

    owned = SparkSession.getActiveSession() is None  # else: embedded (a notebook, a test) — keep it
    if not owned:
        note("using the running Spark session; --master is not applied")
    with _err.status(f"starting Spark ({master}) ..."):
        try:
            spark = build_session(master, app_name=f"siftmq spark {name}")
        except SiftError as exc:
            raise _fail(str(exc)) from None
    try:
        yield JobContext(Path(data_dir), store_dir, spark, in_use)
    except (typer.Exit, KeyboardInterrupt):
        raise
    except JobFailed as exc:
        raise _fail(str(exc)) from None
    except SiftError as exc:
        raise _fail(f"{type(exc).__name__}: {exc}") from None
    except Exception as exc:
        from siftmq.spark.jobs.common import worker_error

        found = worker_error(exc)
        if found is None:
            raise
        raise _fail(f"the Spark job failed: {found}") from None
    finally:
        if owned:
            spark.stop()


def _compile_option(filter_expr: str | None, tags: str | None) -> CompiledFilter | None:
    """The ``--filter``/``--tags`` option compiled (exit 1 naming the problem)."""
    if filter_expr is not None and tags is not None:
        raise _fail("--filter and --tags are mutually exclusive: give one filter")
    if filter_expr is None and tags is None:
        return None
    from siftmq.errors import FilterError
    from siftmq.filter import compile_filter

    kind, text, option = (
        ("SQL92", filter_expr, "--filter") if filter_expr is not None else ("TAG", tags, "--tags")
    )
    try:
        return compile_filter(kind, text)
    except FilterError as exc:
        raise _fail(f"{option} is not a valid {kind} filter: {exc}") from None


def _mib(value: int) -> str:
    return f"{value / MIB:.2f}"


@spark_app.command("scan")
def scan(  # noqa: PLR0917 - typer options
    data_dir: DataDirOption,
    topic: TopicOption,
    out: Annotated[str, typer.Option("--out", help="Where to write the Parquet output (a directory).")],
    filter_expr: Annotated[
        str | None, typer.Option("--filter", help="An SQL92 filter over the message properties.")
    ] = None,
    tags: Annotated[str | None, typer.Option("--tags", help="A TAG filter such as 'TagA || TagB'.")] = None,
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Replace an existing --out.")] = False,
    master: MasterOption = DEFAULT_MASTER,
) -> None:
    """Write the messages of --topic matching --filter (SQL92) or --tags (TAG) to Parquet."""
    compiled = _compile_option(filter_expr, tags)
    if not overwrite and "://" not in out and Path(out).exists():
        raise _fail(f"--out {out} exists; pass --overwrite to replace it")
    with spark_job(data_dir, master, "scan") as job:
        if compiled is not None:
            from siftmq.errors import FilterError
            from siftmq.spark.jobs.scan import filter_column

            try:
                filter_column(compiled)
            except FilterError as exc:
                raise JobFailed(f"the filter cannot run on Spark: {exc}") from None
        from siftmq.spark.jobs.scan import run_scan

        plan = job.plan()
        with job.progress(f"scanning {topic}") as update:
            result = run_scan(
                job.spark, job.store_dir, topic, out, compiled=compiled, overwrite=overwrite, plan=plan,
                on_progress=update,
            )  # fmt: skip
    table = Table(title=f"scan of {escape(topic)}")
    table.add_column("")
    table.add_column("value", justify="right")
    what = "none (every message)" if compiled is None else f"{compiled.kind} {compiled.text}"
    for key, value in (
        ("filter", what),
        ("records scanned (all topics)", str(plan.records)),
        ("MiB scanned", _mib(plan.bytes)),
        ("messages written", str(result.messages)),
        ("MiB of records written", _mib(result.bytes)),
        ("seconds", f"{result.seconds:.1f}"),
        ("Parquet", result.out),
    ):
        table.add_row(key, escape(value))
    _out.print(table)


@spark_app.command("stats")
def stats(
    data_dir: DataDirOption,
    topic: TopicOption,
    out: Annotated[
        Path | None,
        typer.Option("--out", help="Directory for stats.parquet and selectivity.png [./siftmq-stats-TOPIC]."),
    ] = None,
    master: MasterOption = DEFAULT_MASTER,
) -> None:
    """Per subscription of --topic: matches, selectivity, and the bytes a broker-side filter saves."""
    out_dir = out if out is not None else Path(f"siftmq-stats-{topic}")
    with spark_job(data_dir, master, "stats") as job:
        from siftmq.spark.jobs.stats import read_subscriptions, run_stats

        if not read_subscriptions(data_dir, topic):
            note(f"no consumer group subscribes {topic}")
        plan = job.plan()
        with job.progress(f"counting {topic}") as update:
            result = run_stats(job.spark, data_dir, topic, out_dir, plan=plan, on_progress=update)
    table = Table(title=f"{escape(topic)}: {result.messages} messages, {_mib(result.bytes)} MiB of records")
    table.add_column("group", overflow="fold")
    table.add_column("type")
    table.add_column("expression", overflow="fold")
    for name in ("matched", "selectivity", "matched MiB", "saved MiB"):
        table.add_column(name, justify="right", no_wrap=True)
    failed = []
    for row in result.rows:
        if row.error is not None:
            failed.append(row)
            table.add_row(escape(row.group), row.kind, escape(row.expression), "[red]invalid[/]", "", "", "")
            continue
        table.add_row(
            escape(row.group),
            row.kind,
            escape(row.expression),
            str(row.matched),
            "" if row.selectivity is None else f"{100 * row.selectivity:.1f}%",
            _mib(row.matched_bytes or 0),
            _mib(row.bytes_saved or 0),
        )
    _out.print(table)
    for row in failed:
        _out.print(f"{row.group}: {row.error}", markup=False)
    _out.print(f"wrote {result.parquet} and {result.plot}", markup=False)


@spark_app.command("reindex")
def reindex(data_dir: DataDirOption, master: MasterOption = DEFAULT_MASTER) -> None:
    """Rebuild the ConsumeQueues and their ext units (tags codes, filter bitmaps) from the CommitLog.

    The broker must be stopped; it uses the rebuilt files when it starts again.
    """
    with spark_job(data_dir, master, "reindex", allow_open_store=False) as job:
        from siftmq.spark.jobs.reindex import run_reindex

        plan = job.plan(stopped_cleanly=True)
        with job.progress("rebuilding the consume queues") as update:
            result = run_reindex(job.spark, data_dir, plan=plan, on_progress=update)
    table = Table(title=f"reindex of {escape(str(data_dir))}")
    table.add_column("")
    table.add_column("value", justify="right")
    for key, value in (
        ("records scanned", str(result.records)),
        ("MiB scanned", _mib(result.bytes)),
        ("queues written", str(result.queues)),
        ("queues kept (no record left in the log)", str(result.carried_over)),
        ("SQL92 registrations", str(result.registrations)),
        ("entries with a bitmap", str(result.bitmaps)),
        ("entries with filter bits set", str(result.matched)),
        ("commit log end offset", str(result.end_offset)),
        ("damaged ranges passed over (siftmq store check lists them)", str(len(result.damaged))),
        ("queue offsets lost to damage (filler entries)", str(result.filled)),
        ("queue offsets kept past a queue's last record (filler entries)", str(result.tail_filled)),
    ):
        table.add_row(key, escape(value))
    _out.print(table)


@spark_app.command("backfill")
def backfill(
    data_dir: DataDirOption,
    group: Annotated[str, typer.Option("--group", help="The consumer group of the SQL92 registration.")],
    topic: TopicOption,
    master: MasterOption = DEFAULT_MASTER,
) -> None:
    """Compute a SQL92 registration's bloom bits for the messages stored before it was registered.

    Afterwards the broker skips non-matching history by bitmap too. The broker must be stopped.
    """
    with spark_job(data_dir, master, "backfill", allow_open_store=False) as job:
        from siftmq.spark.jobs.backfill import run_backfill

        plan = job.plan(stopped_cleanly=True)
        with job.progress(f"backfilling {group}#{topic}") as update:
            result = run_backfill(job.spark, data_dir, group, topic, plan=plan, on_progress=update)
    import datetime

    until = datetime.datetime.fromtimestamp(result.backfilled_until_ms / 1000, datetime.UTC)
    table = Table(title=f"backfill of {escape(group)}#{escape(topic)}")
    table.add_column("")
    table.add_column("value", justify="right")
    for key, value in (
        ("registration", f"{group}#{topic} v{result.version}"),
        ("expression", result.expression),
        (f"records of {topic} scanned", str(result.records)),
        ("queues written", str(result.queues)),
        ("records matching", str(result.matched)),
        ("records given the group's bits", str(result.bits_set)),
        ("bitmaps created", str(result.created)),
        ("records lost to damage, passed over (siftmq store check lists them)", str(result.lost_to_damage)),
        ("bitmaps trusted for records stored up to", until.isoformat(timespec="milliseconds")),
    ):
        table.add_row(key, escape(value))
    _out.print(table)
