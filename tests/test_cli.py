"""The ``siftmq`` command line, run as a user would run it."""

from __future__ import annotations

import subprocess
import sys


def _siftmq(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "siftmq.cli", *args], capture_output=True, text=True, timeout=60, check=False
    )


def test_filter_check_prints_the_normalized_form() -> None:
    out = _siftmq("filter", "check", "Region = 'Hangzhou' AND price > 30")
    assert out.returncode == 0
    assert out.stdout.strip() == "(Region = 'Hangzhou') AND (price > 30)"


def test_filter_check_shows_the_error_with_a_caret() -> None:
    out = _siftmq("filter", "check", "a = 1 AND b ! 2")
    assert out.returncode == 1
    assert "lexical error" in out.stderr
    lines = out.stderr.rstrip("\n").splitlines()
    assert lines[-2].strip() == "a = 1 AND b ! 2"
    assert lines[-1].index("^") == lines[-2].index("!")


def test_filter_check_tag() -> None:
    out = _siftmq("filter", "check", "--type", "TAG", "Pay || Order")
    assert (out.returncode, out.stdout.strip()) == (0, "Order||Pay")
    assert _siftmq("filter", "check", "--type", "TAG", "||").returncode == 1


def test_filter_eval_results() -> None:
    expr = "region = 'Hangzhou' AND price > 30"
    ok = _siftmq("filter", "eval", expr, "region=Hangzhou", "price=45")
    assert (ok.returncode, ok.stdout.strip()) == (0, "TRUE")
    no = _siftmq("filter", "eval", expr, "region=Shanghai", "price=45")
    assert (no.returncode, no.stdout.strip()) == (2, "FALSE")
    null = _siftmq("filter", "eval", expr, "price=45")
    assert (null.returncode, null.stdout.strip()) == (2, "NULL")
    err = _siftmq("filter", "eval", "price > 30", "price=3.5")
    assert err.returncode == 2
    assert err.stdout.startswith("EVALUATION ERROR") and "3.5" in err.stdout
    bad = _siftmq("filter", "eval", "price > 30", "novalue")
    assert bad.returncode == 1 and "key=value" in bad.stderr
