"""kill -9 a writer at random moments; every acknowledged record must survive.

The writer appends one message per call from one thread and batches (``put_batch``) from another.
In sync flush mode an append is acknowledged once fsynced; in async mode once it is in the page
cache (written through the segment's shared map), which a killed process cannot lose either.
"""

from __future__ import annotations

import random
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from crash_writer import body_of
from siftmq.store import GetMessageStatus, MessageStore, StoreConfig

ROUNDS = {"sync": 20, "async": 10}
_BODY = re.compile(rb"^r(\d+)-t(\d)-i(\d+)-")


def _config(data_dir: Path, mode: str) -> StoreConfig:
    return StoreConfig(
        data_dir,
        commit_log_segment_size=256 * 1024,
        max_message_size=16 * 1024,
        consume_queue_entries_per_file=32,
        flush_mode=mode,  # type: ignore[arg-type]
    )


def _check_body(body: bytes) -> None:
    m = _BODY.match(body)
    assert m is not None, body[:40]
    assert body == body_of(int(m[1]), int(m[2]), int(m[3]))


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["sync", "async"])
def test_kill_9_loses_no_acknowledged_record(tmp_path: Path, mode: str) -> None:
    rng = random.Random(20240607)
    data_dir = tmp_path / "data"
    writer = Path(__file__).parents[1] / "crash_writer.py"
    acked: dict[
        int, tuple[int, int, int, int, int]
    ] = {}  # commit log offset -> (round, thread, i, queue, qoff)
    for round_no in range(ROUNDS[mode]):
        proc = subprocess.Popen(
            [sys.executable, str(writer), str(data_dir), str(round_no), mode],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        assert proc.stdout is not None
        ready = proc.stdout.readline()
        assert ready == b"ready\n", proc.stderr.read() if proc.stderr else b""
        time.sleep(rng.uniform(0.0, 0.25))
        proc.send_signal(signal.SIGKILL)
        out, err = proc.communicate()
        assert proc.returncode == -signal.SIGKILL, err.decode()
        for line in out.decode().splitlines():
            parts = line.split()
            if len(parts) == 7 and parts[0] == "ack":  # a line cut by the kill is not an ack
                r, t, i, off, q, qoff = map(int, parts[1:])
                acked[off] = (r, t, i, q, qoff)
    assert len(acked) > ROUNDS[mode]  # the writer did get work done
    assert {v[1] for v in acked.values()} == {0, 1}  # both put_message and put_batch were acknowledged

    with MessageStore.open(_config(data_dir, mode)) as store:
        # every acknowledged record is present and intact, at its offsets
        for off, (r, t, i, q, qoff) in acked.items():
            m = store.look_message_by_offset(off)
            assert m is not None, off
            assert m.body == body_of(r, t, i)
            assert (m.queue_id, m.queue_offset) == (q, qoff)
        # the index agrees with the CommitLog: every record is indexed once, in order
        from_log = {(m.queue_id, m.queue_offset): m.commit_log_offset for m in store.commit_log.scan(0)}
        assert store.commit_log.scan_error is None
        from_index: dict[tuple[int, int], int] = {}
        for topic, q in store.queues():
            assert topic == "Crash"
            offset = 0
            while True:
                res = store.get_messages("g", topic, q, offset, 32)
                for m in res.messages:
                    _check_body(m.body)  # no partial or foreign record is visible
                    from_index[(q, m.queue_offset)] = m.commit_log_offset
                if res.status is not GetMessageStatus.FOUND:
                    break
                offset = res.next_begin_offset
            assert store.get_max_offset_in_queue(topic, q) == sum(1 for k in from_log if k[0] == q)
        assert from_index == from_log
        for (q, qoff), off in acked_keys(acked).items():
            assert from_index[(q, qoff)] == off


def acked_keys(acked: dict[int, tuple[int, int, int, int, int]]) -> dict[tuple[int, int], int]:
    return {(v[3], v[4]): off for off, v in acked.items()}
