"""The nesting bound the README promises (512) holds on every path, in every process, whatever ran
before: 512 levels of parentheses and prefix operators are accepted, 513 are refused with an error
that names the limit — never a RecursionError deciding either way."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from typing import Any

import httpx
import pytest

from siftmq.client import FilterExpression, SimpleConsumer
from siftmq.errors import FilterLimitError, RemoteError
from siftmq.filter import compile_filter
from siftmq.filter.parser import MAX_DEPTH


def shapes(depth: int) -> list[str]:
    """Filters nested ``depth`` deep: parentheses, NOT, minus, and a mix of the two."""
    half = depth // 2
    return [
        "(" * depth + "a = 1" + ")" * depth,
        "NOT " * depth + "a = 1",
        "-" * depth + "a = 1",
        "(" * half + "NOT " * (depth - half) + "a = 1" + ")" * half,
    ]


def test_compile_and_evaluate_at_the_bound() -> None:
    for text in shapes(MAX_DEPTH):
        compiled = compile_filter("SQL92", text)
        compiled.evaluate({"a": "1"})
        compiled.matches_batch({"a": ["1", "2", None]})
    for text in shapes(MAX_DEPTH + 1):
        with pytest.raises(FilterLimitError, match="512"):
            compile_filter("SQL92", text)


def test_a_fresh_process_accepts_the_bound_first_thing() -> None:
    """The first filter a process compiles may be the deepest (nothing raised the stack before)."""
    for depth, code in ((MAX_DEPTH, 0), (MAX_DEPTH + 1, 1)):
        done = subprocess.run(
            [sys.executable, "-m", "siftmq", "filter", "check", shapes(depth)[0]],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == code, done.stderr
        if code:
            assert "512" in done.stderr and "Traceback" not in done.stderr


@pytest.mark.integration
def test_receive_and_the_admin_api_at_the_bound(start_broker: Any) -> None:
    broker = start_broker()

    async def receive(text: str, *, check_locally: bool = True) -> None:
        # a client that skips its own check sends the text as it is, for the broker to judge
        expression = (
            FilterExpression.sql92(text)
            if check_locally
            else FilterExpression("SQL92", text, compile_filter("SQL92", "TRUE"))
        )
        subscription = {"Deep": expression}
        async with SimpleConsumer(broker.endpoint, "deep", subscription, await_duration=0.1) as consumer:
            await consumer.receive(1, invisible_duration=30)

    for text in shapes(MAX_DEPTH):
        asyncio.run(receive(text))
    for text in shapes(MAX_DEPTH + 1):
        with pytest.raises(FilterLimitError, match="512"):
            asyncio.run(receive(text))
        with pytest.raises(RemoteError) as refused:
            asyncio.run(receive(text, check_locally=False))
        assert refused.value.status == "ILLEGAL_FILTER_EXPRESSION" and "512" in str(refused.value)

    with httpx.Client(base_url=broker.admin_url, timeout=30) as http:
        ok = http.put(
            "/groups/deep2/subscriptions/Deep", json={"type": "SQL92", "expression": shapes(MAX_DEPTH)[1]}
        )
        assert ok.status_code == 200, ok.text
        bad = http.put(
            "/groups/deep3/subscriptions/Deep", json={"type": "SQL92", "expression": shapes(MAX_DEPTH + 1)[1]}
        )
        assert bad.status_code == 400 and "512" in bad.text
    assert "Traceback" not in broker.log()
