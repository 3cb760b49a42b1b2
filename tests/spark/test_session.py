from __future__ import annotations

from typing import Any


def test_session_runs_python_workers_with_pushdown_on(spark: Any) -> None:
    assert spark.conf.get("spark.sql.python.filterPushdown.enabled") == "true"
    # a Python worker job: the workers must run this interpreter (pyarrow importable)
    doubled = spark.sparkContext.parallelize(range(10), 2).map(lambda x: x * 2).sum()
    assert doubled == 90
