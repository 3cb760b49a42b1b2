"""``siftmq store check DATA_DIR``: report damaged bytes of a stopped broker's store, changing nothing.

Exit codes: 0 when every record is intact, 1 when something is damaged (the report says what and
which messages it cost), 2 when the check could not run (no store there, or a broker has it open).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.markup import escape
from rich.table import Table

from siftmq.cli.console import err, fail, note, out

if TYPE_CHECKING:
    from siftmq.store.check import LostEntry

store_app = typer.Typer(no_args_is_help=True, help="Check a stopped broker's store.")


def _store_dir(data_dir: Path) -> Path:
    """The store of a broker data dir (``<data-dir>/store``), or ``data_dir`` if it is a store itself."""
    if (data_dir / "store" / "commitlog").is_dir():
        return data_dir / "store"
    if (data_dir / "commitlog").is_dir():
        return data_dir
    fail(f"no siftmq store under {data_dir} (expected {data_dir / 'store' / 'commitlog'})", code=2)


def _entry_fields(e: LostEntry) -> dict[str, object]:
    offsets = list(e.queue_offsets)
    return {"topic": e.topic, "queue_id": e.queue_id, "count": e.count, "queue_offsets": offsets}


def _entries_table(title: str, entries: list[LostEntry]) -> Table:
    table = Table(title=title)
    for column in ("topic", "queue", "count", "queue offsets"):
        table.add_column(column)
    for e in entries:
        shown = ", ".join(map(str, e.queue_offsets)) + (" ..." if e.count > len(e.queue_offsets) else "")
        table.add_row(escape(e.topic), str(e.queue_id), str(e.count), shown)
    return table


@store_app.command("check")
def check(
    data_dir: Annotated[Path, typer.Argument(help="The broker's data directory (or its store directory).")],
    segment_size: Annotated[
        int | None,
        typer.Option(
            "--segment-size", help="commit_log_segment_size, for a store with no layout.json and one segment."
        ),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print a JSON object.")] = False,
) -> None:
    """Verify every record (magic, size, CRC, offset) without changing a byte; exit 1 on damage."""
    from siftmq.errors import StoreError
    from siftmq.store.check import check_store

    store_dir = _store_dir(data_dir)
    try:
        with err.status(f"reading every record of {escape(str(store_dir))} ...") as status:

            def progress(done: int, total: int) -> None:
                status.update(
                    f"reading every record of {escape(str(store_dir))}: {done * 100 // max(total, 1)}%"
                )

            report = check_store(store_dir, segment_size=segment_size, on_progress=progress)
    except StoreError as exc:
        fail(exc, code=2)
    lost, bad_entries = ([_entry_fields(e) for e in entries] for entries in (report.lost, report.bad_entries))
    damaged = [
        {
            "offset": d.offset,
            "length": d.length,
            "segment": d.segment,
            "position": d.position,
            "reason": d.reason,
        }
        for d in [*report.damaged, *([report.torn_tail] if report.torn_tail else [])]
    ]
    if as_json:
        out.print(
            json.dumps(
                {
                    "store": str(store_dir),
                    "ok": report.ok,
                    "segments": report.segments,
                    "records": report.records,
                    "damaged": damaged,
                    "torn_tail": report.torn_tail is not None,
                    "misplaced_segments": report.misplaced_segments,
                    "missing_segments": report.missing_segments,
                    "lost": lost,
                    "bad_index_entries": bad_entries,
                    "fillers": report.fillers,
                    "quarantined": report.quarantined,
                    "crashed": report.crashed,
                }
            ),
            markup=False,
        )
        raise typer.Exit(0 if report.ok else 1)
    out.print(f"{store_dir}: {report.records:,} intact records in {report.segments} segment(s)", markup=False)
    if report.crashed:
        note("the broker did not stop cleanly: a torn tail is expected, and the broker's recovery cuts it")
    if damaged:
        table = Table(title="damaged bytes")
        for column in ("segment", "position", "commit log offset", "bytes", "reason"):
            table.add_column(column)
        for d in damaged:
            table.add_row(
                str(d["segment"]),
                str(d["position"]),
                str(d["offset"]),
                str(d["length"]),
                escape(str(d["reason"])),
            )
        out.print(table)
    if report.lost:
        out.print(_entries_table("messages in damaged bytes", report.lost))
    if report.bad_entries:
        title = "damaged index entries (pointing outside the commit log; reads pass over them)"
        out.print(_entries_table(title, report.bad_entries))
    for name in report.misplaced_segments:
        out.print(
            f"segment file {name} is not a segment of the log (misnamed, or after a missing file and "
            "holding no intact record): the broker moves it to quarantine",
            markup=False,
        )
    for name in report.missing_segments:
        out.print(
            f"segment file {name} is missing: the broker serves the segments after it and passes over "
            "its records; put it back while the broker is stopped to make them readable again",
            markup=False,
        )
    if report.fillers:
        out.print(f"{report.fillers} index entries stand for records lost to damage earlier", markup=False)
    if report.quarantined:
        out.print(f"quarantined copies: {', '.join(report.quarantined)}", markup=False)
    out.print("OK: nothing is damaged" if report.ok else "DAMAGED (see above)", markup=False)
    raise typer.Exit(0 if report.ok else 1)
