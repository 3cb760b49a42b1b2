"""Writer process for the kill -9 test (not a test module).

Usage: python crash_writer.py DATA_DIR ROUND [MODE]. Appends in MODE (``sync``, the default, or
``async``) flush mode from two threads (one message per ``put_message``; batches through
``put_batch``, as the broker appends) and prints
``ack ROUND THREAD I COMMIT_LOG_OFFSET QUEUE_ID QUEUE_OFFSET`` for each record of each
acknowledged append, until killed.
"""

from __future__ import annotations

import hashlib
import sys
import threading
from pathlib import Path

from siftmq.store import Message, MessageStore, StoreConfig, codec

HOST = codec.encode_host("127.0.0.1", 1)


def body_of(round_no: int, thread: int, i: int) -> bytes:
    """A self-describing body: header plus a hash-derived filler of varying length."""
    head = f"r{round_no}-t{thread}-i{i}-".encode()
    filler = hashlib.sha256(head).digest() * (1 + (i * 7919 + thread) % 200)
    return head + filler


def main() -> None:
    data_dir, round_no = Path(sys.argv[1]), int(sys.argv[2])
    mode = sys.argv[3] if len(sys.argv) > 3 else "sync"
    cfg = StoreConfig(
        data_dir,
        commit_log_segment_size=256 * 1024,
        max_message_size=16 * 1024,
        consume_queue_entries_per_file=32,
        flush_mode=mode,  # type: ignore[arg-type]
        flush_interval_ms=20,
        disk_reserve_bytes=0,  # it also writes on a small tmpfs (the full-disk tests)
    )
    store = MessageStore.open(cfg)
    out_lock = threading.Lock()
    print("ready", flush=True)

    def props(thread: int, i: int) -> dict[str, str]:
        return {"TAGS": f"t{thread}", "UNIQ_KEY": f"r{round_no}t{thread}i{i}"}

    def run(thread: int) -> None:
        i = 0
        while True:
            queue_id = (i + thread) % 3
            if thread == 0:  # one message per call
                results = [
                    store.put_message(Message("Crash", body_of(round_no, 0, i), queue_id, props(0, i)))
                ]
            else:  # the broker's path: batches of 1..5 on one queue
                entries = [(body_of(round_no, 1, j), props(1, j), 0, HOST) for j in range(i, i + 1 + i % 5)]
                results = store.put_batch("Crash", queue_id, entries)
            with out_lock:
                for k, r in enumerate(results):
                    where = f"{r.commit_log_offset} {r.queue_id} {r.queue_offset}"
                    sys.stdout.write(f"ack {round_no} {thread} {i + k} {where}\n")
                sys.stdout.flush()
            i += len(results)

    threads = [threading.Thread(target=run, args=(t,), daemon=True) for t in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


if __name__ == "__main__":
    main()
