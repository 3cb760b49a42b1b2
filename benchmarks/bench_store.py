"""Store benchmark: append throughput vs raw disk bandwidth, filtered index scans.

Run: ``.venv/bin/python benchmarks/bench_store.py [--dir DIR] [--messages N] [--repeat R]``.
Not collected by pytest. Every figure is the median of ``R`` runs; the raw disk bandwidth is
measured in the same process, and the page cache is written back (``sync``) before each timed
run so one case's writeback does not slow the next. An append run ends with ``flush()``, which
also waits for the background dispatch (the ConsumeQueues are written) and fsyncs everything.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import numpy.typing as npt

from siftmq.store import (
    CqExtBlock,
    CqExtUnit,
    DispatchRequest,
    GetMessageStatus,
    Message,
    MessageStore,
    StoreConfig,
    tags_code_of,
)

MIB = 1024 * 1024
BODY = os.urandom(1024)


def raw_write_bandwidth(directory: Path, total: int = 512 * MIB, chunk: int = 4 * MIB) -> float:
    """Sequential write of ``total`` bytes plus one fsync, in bytes/s."""
    path = directory / "raw.bin"
    data = os.urandom(chunk)
    os.sync()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    start = time.perf_counter()
    for _ in range(total // chunk):
        os.write(fd, data)
    os.fsync(fd)
    elapsed = time.perf_counter() - start
    os.close(fd)
    path.unlink()
    return total / elapsed


def append_rate(  # noqa: PLR0917 - the cases' parameters
    directory: Path, mode: str, count: int, batch: int, threads: int = 1, one_queue: bool = False
) -> tuple[float, float]:
    """(messages/s, bytes/s) appending ``count`` 1 KiB messages.

    ``one_queue``: batches go through ``put_batch`` (one topic and queue, plain tuples), as the
    broker appends a SendMessage request; otherwise ``put_messages`` spreads them over 4 queues.
    """
    data_dir = directory / f"append-{mode}-{batch}-{threads}-{one_queue}"
    cfg = StoreConfig(data_dir, flush_mode=mode, commit_log_segment_size=256 * MIB)  # type: ignore[arg-type]
    store = MessageStore.open(cfg)
    per_thread = count // threads
    msgs = [Message("Bench", BODY, queue_id=i % 4, properties={"TAGS": "A"}) for i in range(batch)]
    host = bytes(8)
    os.sync()

    def run() -> None:
        for _ in range(per_thread // batch):
            if one_queue:  # fresh properties dicts: put_batch keeps them
                store.put_batch("Bench", 0, [(BODY, {"TAGS": "A"}, 0, host) for _ in range(batch)])
            elif batch == 1:
                store.put_message(msgs[0])
            else:
                store.put_messages(msgs)

    start = time.perf_counter()
    workers = [threading.Thread(target=run) for _ in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    store.flush()
    elapsed = time.perf_counter() - start
    written = store.max_commit_log_offset
    store.close()
    shutil.rmtree(data_dir)
    return per_thread * threads / elapsed, written / elapsed


class TagFilter:
    def __init__(self, tag: str) -> None:
        self.tag = tag
        self.codes = np.array([tags_code_of(tag)], dtype=np.int64)

    def is_matched_by_consume_queue(self, tags_code: int | None, ext: CqExtUnit | None) -> bool:
        return tags_code is None or tags_code in self.codes

    def is_matched_by_commit_log(self, properties: Mapping[str, str]) -> bool:
        return properties.get("TAGS") == self.tag

    def match_consume_queue_block(
        self, tags_codes: npt.NDArray[np.int64], ext: CqExtBlock | None
    ) -> npt.NDArray[np.bool_]:
        return tags_codes == self.codes[0]


class BitFilter:
    """Index stage on bit 5 of the ext bitmap; exact stage on property ``p``."""

    def is_matched_by_consume_queue(self, tags_code: int | None, ext: CqExtUnit | None) -> bool:
        return ext is None or ext.filter_bitmap is None or bool(ext.filter_bitmap[0] & 0x20)

    def is_matched_by_commit_log(self, properties: Mapping[str, str]) -> bool:
        return properties.get("p") == "1"

    def match_consume_queue_block(
        self, tags_codes: npt.NDArray[np.int64], ext: CqExtBlock | None
    ) -> npt.NDArray[np.bool_]:
        if ext is None:
            return np.ones(len(tags_codes), dtype=bool)
        return (ext.bitmaps[:, 0] & 0x20) != 0


class BitmapMaker:
    def compute_bitmaps(self, requests: Sequence[DispatchRequest]) -> list[bytes | None]:
        return [(b"\x20" if r.properties.get("p") == "1" else b"\x00") + bytes(13) for r in requests]


def filtered_reads(directory: Path, entries: int, repeat: int) -> dict[str, float]:
    """Index-scan rates for a 1%-selective tag and a bitmap filter (one queue); medians of ``repeat``."""
    data_dir = directory / "reads"
    cfg = StoreConfig(data_dir, commit_log_segment_size=256 * MIB, build_key_index=False)
    store = MessageStore.open(cfg, bitmap_dispatcher=BitmapMaker())
    small = b"x" * 16
    batch = []
    for i in range(entries):
        hit = i % 100 == 37
        props = {"TAGS": "B" if hit else "A", "p": "1" if hit else "0"}
        batch.append(Message("Reads", small, properties=props))
        if len(batch) == 4096:
            store.put_messages(batch)
            batch = []
    store.put_messages(batch)
    store.flush()
    runs: dict[str, list[float]] = {}
    for _ in range(repeat):
        for name, flt in (("tag", TagFilter("B")), ("bitmap", BitFilter())):
            offset, delivered, scanned = 0, 0, 0
            start = time.perf_counter()
            while True:
                res = store.get_messages("g", "Reads", 0, offset, 32, flt)
                delivered += len(res.messages)
                scanned += res.scanned
                if res.status not in (GetMessageStatus.FOUND, GetMessageStatus.NO_MATCHED_MESSAGE):
                    break
                offset = res.next_begin_offset
            elapsed = time.perf_counter() - start
            assert delivered == entries // 100, delivered
            runs.setdefault(f"{name}_entries_per_s", []).append(scanned / elapsed)
            runs.setdefault(f"{name}_messages_per_s", []).append(delivered / elapsed)
        # the vectorized index pass alone over whole ConsumeQueue segments
        cq = store.find_consume_queue("Reads", 0)
        assert cq is not None
        code = tags_code_of("B")
        start = time.perf_counter()
        found = 0
        offset = 0
        while offset < cq.max_offset:
            block = cq.read_block(offset, cfg.consume_queue_entries_per_file)
            assert block is not None
            found += int(np.count_nonzero(block["tags_code"] == code))
            offset += len(block)
        runs.setdefault("raw_index_entries_per_s", []).append(cq.max_offset / (time.perf_counter() - start))
    store.close()
    shutil.rmtree(data_dir)
    return {key: statistics.median(values) for key, values in runs.items()}


def interpreter_probe() -> float:
    """Milliseconds for 2 million dict stores: how fast this host runs Python right now.

    The append rates are mostly Python time, the raw bandwidth is not, so the ratios move with
    the host's speed (it varied about 3x between days on the shared VM of the README's figures).
    """
    table: dict[int, int] = {}
    start = time.perf_counter()
    for i in range(2_000_000):
        table[i & 1023] = i
    return (time.perf_counter() - start) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--dir", type=Path, default=None, help="directory on the disk to measure")
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--entries", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=3, help="runs per case; medians are printed")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="siftmq-bench-", dir=args.dir))
    try:
        # The first raw run writes into page-cache memory the VM never touched, which is what
        # the appends below mostly get too; a second run reuses the memory the first one freed
        # and can be several times faster. Ratios are against the first (as in earlier reports).
        raw = raw_write_bandwidth(root)
        warm = raw_write_bandwidth(root)
        rows = [
            ("raw sequential write + fsync", "-", raw / MIB, 1.0, raw / warm),
            ("raw again (page cache reused)", "-", warm / MIB, warm / raw, 1.0),
        ]
        for label, mode, count, batch, threads, one_queue in (
            ("async put_message", "async", args.messages, 1, 1, False),
            ("async put_batch x1 (broker, 1 msg)", "async", args.messages, 1, 1, True),
            ("async put_messages x64", "async", args.messages, 64, 1, False),
            ("async put_batch x64, one queue", "async", args.messages, 64, 1, True),
            ("sync put_message, 1 thread", "sync", args.messages // 20, 1, 1, False),
            ("sync put_message, 8 threads", "sync", args.messages // 10, 1, 8, False),
            ("sync put_messages x64", "sync", args.messages, 64, 1, False),
            ("sync put_batch x64, one queue", "sync", args.messages, 64, 1, True),
        ):
            results = [append_rate(root, mode, count, batch, threads, one_queue) for _ in range(args.repeat)]
            msgs = statistics.median(r[0] for r in results)
            bw = statistics.median(r[1] for r in results)
            rows.append((label, f"{msgs:,.0f}", bw / MIB, bw / raw, bw / warm))
        print(f"\nappend of 1 KiB messages ({os.cpu_count()} cores, dir {root}, median of {args.repeat})")
        print(f"interpreter probe: {interpreter_probe():.0f} ms (2 million dict stores; lower: faster host)")
        print(f"{'case':34} {'msg/s':>12} {'MiB/s':>10} {'vs raw':>8} {'vs again':>9}")
        for label, msgs_s, mib, ratio, ratio_warm in rows:
            print(f"{label:34} {msgs_s:>12} {mib:>10.1f} {ratio:>8.2f} {ratio_warm:>9.2f}")
        reads = filtered_reads(root, args.entries, args.repeat)
        index = reads["raw_index_entries_per_s"]
        print(
            f"\nfiltered reads, 1% selective, {args.entries:,} entries in one queue (median of {args.repeat})"
        )
        print(f"{'case':40} {'rate':>16} {'vs index':>9}")
        for label, key in (
            ("tag filter, get_messages (entries/s)", "tag_entries_per_s"),
            ("tag filter, get_messages (messages/s)", "tag_messages_per_s"),
            ("bitmap filter, get_messages (entries/s)", "bitmap_entries_per_s"),
            ("bitmap filter, get_messages (messages/s)", "bitmap_messages_per_s"),
            ("index pass alone, per CQ segment", "raw_index_entries_per_s"),
        ):
            ratio = f"{reads[key] / index:>9.2f}" if key.endswith("entries_per_s") else ""
            print(f"{label:40} {reads[key]:>16,.0f} {ratio}")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
