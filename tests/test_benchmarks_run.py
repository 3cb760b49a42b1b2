"""The benchmarks that reach into internals (the gate, the front-ends' frames) still run: a figure
nobody can reproduce is worth nothing. Tiny loads; what they print is not judged here."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).parent.parent / "benchmarks"


def run(*args: str) -> str:
    done = subprocess.run(
        [sys.executable, *args], cwd=BENCHMARKS, capture_output=True, text=True, timeout=240, check=False
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    return done.stdout


def test_every_benchmark_compiles() -> None:
    for path in sorted(BENCHMARKS.glob("*.py")):
        compile(path.read_text(), str(path), "exec")


def test_the_gate_benchmark_runs() -> None:
    assert "authentication + authorization, allowed" in run("bench_auth.py")


@pytest.mark.integration
def test_the_front_end_flood_benchmark_runs() -> None:
    out = run("bench_auth_e2e.py", "--flood-only", "--bad", "200")
    assert out.count("--workers 2: 200 bad signatures") == 2


@pytest.mark.integration
def test_the_core_capacity_benchmark_runs() -> None:
    """It speaks the front-ends' frames to the core itself: every call answered OK."""
    out = run("bench_workers.py", "--core-only", "--messages", "300")
    for kind in ("send", "receive", "ack"):
        lines = [line for line in out.splitlines() if line.startswith(f"core alone, {kind} ")]
        assert len(lines) == 3, out
        assert all("(100 OK)" in line or "(300 OK)" in line for line in lines), out
