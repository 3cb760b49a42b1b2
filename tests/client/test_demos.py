"""``siftmq demo consistency``: seed 004 end to end (embedded broker, siftmq client)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys

import pytest

from siftmq.demos import consistency

pytestmark = pytest.mark.integration


def run_demo(*args: str) -> subprocess.CompletedProcess[str]:
    """``siftmq demo ARGS`` in a subprocess, its tables printed 200 columns wide."""
    return subprocess.run(
        [sys.executable, "-m", "siftmq", "demo", *args],
        check=False,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "COLUMNS": "200"},
    )


def test_consistency_demo_outcomes() -> None:
    strict, compat = asyncio.run(consistency.run())
    assert strict.policy == "strict" and strict.lost == []
    assert sorted(strict.consumed["ConsumerForTagA"]) == [f"MsgStr{i}" for i in range(4)]
    assert "inconsistent subscription" in strict.refused["ConsumerForTagB"]
    # compat: RocketMQ's outcome in seed 004 — A consumes nothing, B only the tagB messages of its
    # queues (MsgStr6 and MsgStr7 when the sends start at queue 0; a send retried under load moves
    # them), every other message is lost
    assert compat.policy == "compat" and compat.refused == {}
    assert compat.consumed["ConsumerForTagA"] == []
    b_queues = set(compat.queues["ConsumerForTagB"])
    tag_b = [f"MsgStr{i}" for i in range(4, 8)]
    expected_b = sorted(m for m in tag_b if compat.placed[m] in b_queues)
    assert len(expected_b) == 2 and sorted(compat.consumed["ConsumerForTagB"]) == expected_b
    assert compat.lost == [m for m in compat.sent if m not in expected_b]


def test_consistency_demo_command() -> None:
    proc = run_demo("consistency")
    assert proc.returncode == 0, proc.stderr
    assert "strict mode" in proc.stdout and "compat mode" in proc.stdout and "lost: none" in proc.stdout


def test_trade_demo_every_system_gets_exactly_its_messages() -> None:
    from siftmq.demos.embedded import embedded_broker
    from siftmq.demos.trade import SYSTEMS, run

    with embedded_broker() as endpoint:
        reports = asyncio.run(run(endpoint, 600))
    assert [r.system for r in reports] == list(SYSTEMS)
    for r in reports:
        assert r.received == r.expected and r.wrong == 0, r.system.name
        assert r.body_bytes == r.expected * 256
    assert reports[3].expected == 600  # real-time computing takes everything


def test_trade_demo_command() -> None:
    proc = run_demo("trade", "--count", "300")
    assert proc.returncode == 0, proc.stderr
    assert "order tracking" in proc.stdout and "bytes on the wire" in proc.stdout


def test_security_demo_command() -> None:
    """The official client's calls, as the demo prints them: refused, refused, allowed."""
    pytest.importorskip("rocketmq")
    proc = run_demo("security")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    row = {(w, c): line for line in lines for w in ("anonymous", "alice", "mallory")
           for c in ("send", "receive") if f" {w} " in line and f" {c} " in line}  # fmt: skip
    assert "UNAUTHORIZED" in row[("anonymous", "send")]
    assert "may not Pub Topic:Orders" in row[("mallory", "send")]
    assert "FORBIDDEN" in row[("mallory", "receive")] and "Group:alice-app" in row[("mallory", "receive")]
    assert "received ['order #1']" in row[("alice", "receive")]
    assert "expected" not in proc.stdout


def test_filter_server_demo_command() -> None:
    """The program keeps exactly the big A orders; the hostile one is suspended while big-a receives."""
    proc = run_demo("filter-server", "--count", "400")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "hostile (spins on every real order): suspended" in proc.stdout
    assert "│ 0     │ 0       │" in proc.stdout  # nothing wrong, nothing missing
