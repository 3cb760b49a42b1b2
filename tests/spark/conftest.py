"""One SparkSession per test process (local[2], the fast settings).

Every test here is marked ``spark``; the session starts on first use, so collecting is cheap.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyspark")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.spark)


@pytest.fixture(scope="session")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from siftmq.spark.session import build_session

    session = build_session(
        "local[2]", app_name="siftmq-tests", work_dir=tmp_path_factory.mktemp("spark"), fast_start=True
    )
    yield session
    session.stop()
