"""Filter evaluation speed: scalar and batch, the five workloads of the semantics page.

Run: ``.venv/bin/python benchmarks/bench_filter.py [--rows N] [--seconds S] [--batch-only]``

Scalar: ``CompiledFilter.matches`` on one message map of 8 string properties shaped like a
broker's (KEYS, TAGS, UNIQ_KEY, WAIT, a, price, region, vip; workload v uses ``k``), as in the
RocketMQ measurement. Batch: ``matches_batch`` over a pyarrow table of N rows whose columns vary
like broker traffic (unique KEYS/UNIQ_KEY, 10 tags, 1,000 prices, 5 regions…), plain string
columns, dictionary encoding included in the time. Each figure is the median of 5 runs,
single thread. RocketMQ's figures are its Java evaluator on this machine kind (single thread).
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections.abc import Callable

import pyarrow as pa
from rich.console import Console
from rich.table import Table

from siftmq.filter import compile_filter
from siftmq.filter.compiler import _compile_cached

V_OR = " OR ".join(f"k = 'v{i}'" for i in range(20))
BASE = {
    "KEYS": "order-10001",
    "TAGS": "TagA",
    "UNIQ_KEY": "7F00000115C818B4AAC21A2B3C4D0000",
    "WAIT": "true",
    "a": "abc",
    "price": "50",
    "region": "Hangzhou",
    "vip": "true",
}
# (name, expression, scalar props, RocketMQ Java evals/s, RocketMQ uncached parse+compile µs)
WORKLOADS: list[tuple[str, str, dict[str, str], float, float]] = [
    ("(i) a = 'abc'", "a = 'abc'", BASE, 84.2e6, 6.8),
    ("(ii) a IS NOT NULL AND a > 100", "a IS NOT NULL AND a > 100", {**BASE, "a": "150"}, 35.9e6, 8.3),
    ("(iii) region = 'Hangzhou' AND price > 30", "region = 'Hangzhou' AND price > 30", BASE, 29.6e6, 7.3),
    (
        "(iv) TAGS IN (..) AND (price BETWEEN .. OR vip = ..)",
        "TAGS IN ('TagA', 'TagB', 'TagC') AND (price BETWEEN 10 AND 100 OR vip = 'true')",
        BASE,
        15.6e6,
        8.6,
    ),
    ("(v) 20-clause OR, last matches", V_OR, {**BASE, "k": "v19"}, 2.95e6, 14.0),
    ("(v) 20-clause OR, no match", V_OR, {**BASE, "k": "none"}, 3.24e6, 14.4),
]


def _median_rate(run: Callable[[], int], seconds: float, repeats: int = 5) -> float:
    rates = []
    for _ in range(repeats):
        count = 0
        start = time.perf_counter()
        while True:
            count += run()
            elapsed = time.perf_counter() - start
            if elapsed >= seconds:
                break
        rates.append(count / elapsed)
    return statistics.median(rates)


def _batch(rows: int, seed: int = 7) -> pa.Table:
    rnd = random.Random(seed)
    tags = [f"Tag{c}" for c in "ABCDEFGHIJ"]
    regions = ["Hangzhou", "Shanghai", "Beijing", "Shenzhen", "Chengdu"]
    return pa.table(
        {
            "KEYS": [f"order-{i}" for i in range(rows)],
            "TAGS": [rnd.choice(tags) for _ in range(rows)],
            "UNIQ_KEY": [f"7F00000115C818B4AAC2{i:012X}" for i in range(rows)],
            "WAIT": ["true"] * rows,
            "a": [rnd.choice(["abc", "abd", str(rnd.randrange(200))]) for _ in range(rows)],
            "price": [str(rnd.randrange(1000)) for _ in range(rows)],
            "region": [rnd.choice(regions) for _ in range(rows)],
            "vip": [rnd.choice(["true", "false"]) for _ in range(rows)],
            "k": [f"v{rnd.randrange(40)}" for _ in range(rows)],
        }
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000, help="rows per batch")
    parser.add_argument("--seconds", type=float, default=1.0, help="time per measurement")
    parser.add_argument(
        "--batch-only", action="store_true", help="measure matches_batch only (skip scalar and compile)"
    )
    args = parser.parse_args()
    console = Console()
    console.print(f"building a batch of {args.rows:,} rows …")
    batch = _batch(args.rows)

    table = Table(title="siftmq filter evaluation, single thread (evals/s, median of 5)")
    for col in ("workload", "scalar", "vs Java", "batch", "vs Java", "compile µs", "Java µs"):
        table.add_column(col, justify="right" if col != "workload" else "left")
    for name, expr, props, java_rate, java_compile in WORKLOADS:
        compiled = compile_filter("SQL92", expr)
        assert compiled.matches(props) is (not name.endswith("no match")), name
        matches = compiled.matches

        def scalar(matches: Callable[[dict[str, str]], bool] = matches, props: dict[str, str] = props) -> int:
            for _ in range(1000):
                matches(props)
            return 1000

        def batch_run(compiled=compiled) -> int:  # type: ignore[no-untyped-def]
            compiled.matches_batch(batch)
            return args.rows

        def compile_once(expr: str = expr) -> int:
            _compile_cached.__wrapped__("SQL92", expr)
            return 1

        batch_rate = _median_rate(batch_run, args.seconds)
        if args.batch_only:
            ratio = f"{batch_rate / java_rate:.2f}×"
            table.add_row(name, "-", "-", f"{batch_rate / 1e6:.1f} M", ratio, "-", "-")
            console.print(f"  {name}: batch {batch_rate / 1e6:.1f} M/s")
            continue
        scalar_rate = _median_rate(scalar, args.seconds)
        compile_us = 1e6 / _median_rate(compile_once, min(args.seconds, 0.5))
        table.add_row(
            name,
            f"{scalar_rate / 1e6:.2f} M",
            f"1/{java_rate / scalar_rate:.0f}",
            f"{batch_rate / 1e6:.1f} M",
            f"{batch_rate / java_rate:.2f}×",
            f"{compile_us:.0f}",
            f"{java_compile}",
        )
        console.print(f"  {name}: scalar {scalar_rate / 1e6:.2f} M/s, batch {batch_rate / 1e6:.1f} M/s")
    console.print(table)


if __name__ == "__main__":
    main()
